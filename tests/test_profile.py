"""ONNX Runtime profile traces (onnxstitch.profile): the reader on a synthetic trace written
here (warm-up runs, fences and setup left out; GPU kernels that trail their run's end kept),
and on real CPU traces checked against the trace's own events and the model; bench's
profiles of a stock and a stitched model on the CPU."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from models.elementwise import chain
from onnxstitch import bench, profile
from onnxstitch.errors import StitchError

CPU = "CPUExecutionProvider"


def _event(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"cat": cat, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "ph": "X", "name": name, "args": args}


def _synthetic(rng: random.Random, runs: int, warm: int) -> tuple[list[dict], dict[str, float], Counter]:
    """A trace of `warm` + `runs` runs of four nodes (one only in warm-up), with fences,
    session setup and Kernel events; returns it with the expected µs and calls per counted op."""
    ops = [("mm", "MatMul", "CUDAExecutionProvider"), ("add", "Add", "CUDAExecutionProvider"),
           ("shape", "Shape", CPU), ("mm2", "MatMul", "CUDAExecutionProvider")]
    events = [_event("Session", "session_initialization", 0, 500),
              _event("Node", "init_kernel_time", 10, 40, op_name="Init", provider=CPU)]  # before any run
    us: dict[str, float] = Counter()
    calls: Counter = Counter()
    ts = 1000.0
    for r in range(warm + runs):
        start = ts
        for name, op, prov in ops + ([("first", "WarmOnly", CPU)] if r == 0 else []):
            d = float(rng.randint(1, 300))
            events.append(_event("Node", f"{name}_fence_before", ts, 0, op_name=op))
            events.append(_event("Node", f"{name}_kernel_time", ts, d, op_name=op, provider=prov))
            if prov != CPU:  # its GPU kernel, stamped after the host event (and after the run's end)
                events.append(_event("Kernel", f"{op.lower()}_kernel", ts + d + 400, d / 2, op_name=op))
            ts += d + 1
            if r >= warm:
                us[op] += d
                calls[op] += 1
        events.append(_event("Session", "model_run", start, ts - start))
        ts += 1000
    rng.shuffle(events)  # ORT writes a run's model_run after its nodes: order must not matter
    return events, us, calls


def test_reader_counts_only_the_timed_runs_of_a_synthetic_trace(tmp_path: Path) -> None:
    rng = random.Random(7)
    events, us, calls = _synthetic(rng, runs=4, warm=2)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))
    prof = profile.read_trace(path, skip_runs=2)
    assert prof.runs == 4 and prof.skipped_runs == 2
    rows = {r.name: r for r in prof.by_op()}
    # Two providers ran nodes: op types are named with theirs.
    assert set(rows) == {"CUDA:MatMul", "CUDA:Add", "CPU:Shape"}
    for name, r in rows.items():
        op = name.split(":")[1]
        assert r.us_per_run == pytest.approx(us[op] / 4)
        assert r.calls_per_run == calls[op] / 4
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    assert [r.us_per_run for r in prof.by_op()] == sorted((r.us_per_run for r in rows.values()), reverse=True)
    assert prof.node_us_per_run == pytest.approx(sum(us.values()) / 4)
    assert prof.nodes_per_run() == 4 and prof.nodes_per_run("CUDAExecutionProvider") == 3
    kernels = {r.name: r for r in prof.by_kernel()}
    assert set(kernels) == {"matmul_kernel", "add_kernel"}
    assert kernels["matmul_kernel"].us_per_run == pytest.approx(us["MatMul"] / 2 / 4)
    assert kernels["matmul_kernel"].calls_per_run == 2 and prof.kernels_per_run == 3
    assert len(prof.by_op(top=2)) == 2
    # The same events given parsed, and as a Chrome-trace object, read the same.
    assert profile.read_trace(events, skip_runs=2) == prof
    path.write_text(json.dumps({"traceEvents": events}))
    assert profile.read_trace(path, skip_runs=2) == prof
    summary = profile.read_trace(events, skip_runs=2).summary(top=2)
    assert [r["name"] for r in summary["by_op"]] == [r.name for r in prof.by_op(2)]


def test_reader_without_enough_runs_says_so(tmp_path: Path) -> None:
    events, _, _ = _synthetic(random.Random(1), runs=1, warm=0)
    with pytest.raises(StitchError, match="1 runs"):
        profile.read_trace(events, skip_runs=1)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(StitchError, match="bad.json"):
        profile.read_trace(bad)


def _small_model() -> onnx.ModelProto:
    """x → Mul → Add → Sigmoid → Abs → MatMul → Relu, built with onnx.helper."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(1.5), "k"), numpy_helper.from_array(np.float32(0.25), "b"),
             numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w")]
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="mul"), helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("Sigmoid", ["c"], ["d"], name="sig"), helper.make_node("Abs", ["d"], ["e"], name="abs"),
             helper.make_node("MatMul", ["e", "w"], ["f"], name="mm"), helper.make_node("Relu", ["f"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 32])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_cpu_trace_counts_every_node_of_every_timed_run(tmp_path: Path) -> None:
    model = _small_model()
    path = tmp_path / "small.onnx"
    onnx.save(model, path)
    feeds = {"x": np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)}
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # one event per model node
    sess = ort.InferenceSession(str(path), so, providers=[CPU])
    warm, runs = 2, 5
    for _ in range(warm + runs):
        sess.run(None, feeds)
    trace = sess.end_profiling()
    prof = profile.read_trace(trace, skip_runs=warm)
    events = json.loads(Path(trace).read_text())
    starts = sorted(e["ts"] for e in events if e["name"] == "model_run")
    timed = [e for e in events if e["cat"] == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= starts[warm]]
    assert prof.runs == runs == len(starts) - warm
    assert prof.nodes_per_run() * runs == len(timed) == len(model.graph.node) * runs
    assert sum(e.total_us for e in prof.nodes) == pytest.approx(sum(e["dur"] for e in timed))
    assert {e.name for e in prof.nodes} == {n.name for n in model.graph.node}
    assert {r.name for r in prof.by_op()} == {n.op_type for n in model.graph.node}
    assert sum(r.share for r in prof.by_op()) == pytest.approx(1.0)
    assert not prof.kernels  # the CPU EP records no GPU kernels


def test_bench_profiles_stock_and_stitched_on_the_cpu(tmp_path: Path) -> None:
    import onnxstitch

    src, out = tmp_path / "chain.onnx", tmp_path / "chain.stitched.onnx"
    model = chain(8, shape=("batch", 64))
    onnx.save(model, src)
    onnxstitch.optimize(src, shapes={"batch": [256]}).save(out)
    stitched = onnx.load(str(out))
    inner = {n.name for f in stitched.functions for n in f.node if n.op_type != "Constant"}
    config = bench.BenchConfig(warmup=1, iters=3, providers=(CPU,), profile=True, profile_runs=3)
    res = bench.run(src, out, config=config, shapes={"batch": 16})
    stock, fused = res.profiles[bench.STOCK_CPU], res.profiles[bench.STITCHED]
    assert res.stock is res.configs[bench.STOCK_CPU] and res.stitched.max_abs_err <= 1e-5
    assert stock.nodes_per_run() == res.stock.launches_per_run == len(model.graph.node)
    assert not stock.node_names(profile.FUSED_FALLBACK)
    # On the CPU the fused node runs its fallback function, inlined: every one of its nodes.
    assert {r.name for r in fused.by_op()} == {profile.FUSED_FALLBACK}
    assert {e.name.removeprefix(profile.INLINED_FUSED_PREFIX) for e in fused.nodes} <= inner
    doc = res.to_json(top=3)
    assert doc["schema"] == bench.SCHEMA_VERSION == 4
    assert set(doc["profiles"]) == {bench.STOCK_CPU, bench.STITCHED}
    assert len(doc["profiles"][bench.STOCK_CPU]["by_op"]) == 3
    json.dumps(doc)  # machine-readable as it is


def test_bench_runs_a_model_whose_declared_output_shape_is_wrong(tmp_path: Path) -> None:
    # ddddocr's old recognizer declares its output [1, seqlen] and computes [w/8, 1, 8210]:
    # stock ORT runs it with a warning, and so must the benchmark, run after run.
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["batch", "w"])
    y = helper.make_tensor_value_info("y", TP.FLOAT, [1, "n"])  # wrong: rank 3 comes out
    # The target shape's length is data (w - 4 ones after a -1): no shape inference knows the rank.
    consts = [helper.make_tensor("one", TP.INT64, [1], [1]), helper.make_tensor("two", TP.INT64, [1], [2]),
              helper.make_tensor("minus", TP.INT64, [1], [-1]), helper.make_tensor("four", TP.INT64, [1], [4])]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "two"], ["w"]), helper.make_node("Sub", ["w", "four"], ["k"]),
             helper.make_node("ConstantOfShape", ["k"], ["ones"], value=helper.make_tensor("v", TP.INT64, [1], [1])),
             helper.make_node("Concat", ["minus", "ones"], ["shape"], axis=0),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    g = helper.make_graph(nodes, "misdeclared", [x], [y], consts)
    src = tmp_path / "misdeclared.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    config = bench.BenchConfig(warmup=2, iters=3, providers=(CPU,), profile_runs=2)
    res = bench.run(src, src, config=config, shapes={"batch": 4, "w": 6})
    assert res.stitched.iters == 3 and res.stitched.max_abs_err == 0.0
