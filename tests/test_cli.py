"""The command line: optimize end to end on CPU, bad input as one line with exit status 2
and no output file, the report file, and the fallback equivalence of what it writes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP

from onnxstitch.cli.main import main
from models.elementwise import chain, random_graph
from onnxstitch.inputs import random_feeds

from .stitching import assert_close, fresh_seed


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _bad(tmp_path: Path, name: str, content: bytes | None) -> Path:
    p = tmp_path / name
    if content is not None:
        p.write_bytes(content)
    return p


def _truncated(tmp_path: Path) -> bytes:
    return chain(5, shape=(4, 8)).SerializeToString()[:-37]


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "truncated", "not_onnx", "dangling_input",
                                  "cycle", "duplicate_output"])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path: Path, case: str) -> None:
    if case == "missing":
        path = tmp_path / "nope.onnx"
    elif case == "directory":
        path = tmp_path / "dir.onnx"
        path.mkdir()
    elif case == "empty":
        path = _bad(tmp_path, "empty.onnx", b"")
    elif case == "truncated":
        path = _bad(tmp_path, "trunc.onnx", _truncated(tmp_path))
    elif case == "not_onnx":
        path = _bad(tmp_path, "text.onnx", b"this is not a model\n" * 10)
    elif case == "dangling_input":
        m = chain(3, shape=(4, 8))
        m.graph.node[1].input[0] = "nowhere"
        path = _bad(tmp_path, "dangling.onnx", m.SerializeToString())
    elif case == "cycle":
        m = chain(3, shape=(4, 8))
        m.graph.node[0].input[0] = m.graph.node[2].output[0]  # first node reads the last one's output
        path = _bad(tmp_path, "cycle.onnx", m.SerializeToString())
    else:
        m = chain(3, shape=(4, 8))
        m.graph.node[1].output[0] = m.graph.node[0].output[0]  # two nodes write one tensor
        path = _bad(tmp_path, "dup.onnx", m.SerializeToString())
    out = tmp_path / "out.onnx"
    res = _invoke("optimize", str(path), "-o", str(out))
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("onnxstitch: error:") and str(path) in lines[0], res.output
    assert "Traceback" not in res.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.onnx")]  # no temp left


@pytest.mark.parametrize("command", ["optimize", "bench"])
def test_missing_external_data_is_bad_input_for_every_command(tmp_path: Path, command: str) -> None:
    """A model whose weights file was not copied with it (seen: a model moved without its .data)
    is the user's to fix: one line naming the model, exit 2, not an internal error."""
    m = chain(3, shape=(64, 64))
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w"))
    m.graph.node[0].input[1:] = ["w"] if len(m.graph.node[0].input) > 1 else []
    src = tmp_path / "m.onnx"
    onnx.save(m, src, save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()
    args = {"optimize": ["-o", str(tmp_path / "o.onnx")], "bench": ["--stitched", str(src)]}[command]
    res = _invoke(command, str(src), *args)
    assert res.exit_code == 2, res.output
    assert "internal error" not in res.output and "Traceback" not in res.output
    assert str(src) in res.output and "external data" in res.output, res.output


def test_bad_shape_option(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(chain(3), src)
    res = _invoke("optimize", str(src), "--shape", "batch", "-o", str(tmp_path / "o.onnx"))
    assert res.exit_code == 2 and "--shape" in res.output


@pytest.mark.parametrize("arch", ["gfx90", "sm_", "compute_90"])
def test_bad_arch_option(tmp_path: Path, arch: str) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(chain(3), src)
    res = _invoke("optimize", str(src), "--arch", arch, "-o", str(tmp_path / "o.onnx"))
    assert res.exit_code == 2 and f"--arch {arch}: expected a value like sm_90" in res.output
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_optimize_chain_writes_one_kernel_and_same_outputs(tmp_path: Path, dtype: int) -> None:
    src, out, rep = tmp_path / "chain.onnx", tmp_path / "chain.stitched.onnx", tmp_path / "plan.json"
    model = chain(20, shape=("batch", 64), dtype=dtype)
    onnx.save(model, src)
    res = _invoke("optimize", str(src), "-o", str(out), "--report", str(rep), "--shape", "batch=8192")
    assert res.exit_code == 0, res.output
    assert "kernels" in res.output and "solver" in res.output
    stitched = onnx.load(str(out))
    onnx.checker.check_model(stitched, full_check=True)
    assert [n.op_type for n in stitched.graph.node] == ["FusedKernel"]
    report = json.loads(rep.read_text())
    assert report["plan"]["kernels_before"] == 20 and report["plan"]["kernels_after"] == 1
    assert report["symbolic_dims_for_cost"] == {"batch": 8192}
    for batch in (1, 5):  # dynamic dims still work
        feeds = random_feeds(model, seed=batch, dim_values={"batch": batch})
        ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
        got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert_close(got[0], ref[0], f"batch {batch}")


def test_optimize_random_model_with_opaque_nodes_keeps_outputs(tmp_path: Path) -> None:
    src, out = tmp_path / "r.onnx", tmp_path / "r.stitched.onnx"
    model = random_graph(60, seed=3, shape=("batch", 16), opaque_every=9)
    onnx.save(model, src)
    res = _invoke("optimize", str(src), "-o", str(out), "-q")
    assert res.exit_code == 0 and res.output.strip() == ""
    stitched = onnx.load(str(out))
    assert any(n.op_type == "FusedKernel" for n in stitched.graph.node)
    assert sum(n.op_type == "MatMul" for n in stitched.graph.node) == sum(n.op_type == "MatMul" for n in model.graph.node)
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3})
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_refuses_to_overwrite_input(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(chain(3), src)
    before = src.read_bytes()
    res = _invoke("optimize", str(src), "-o", str(src))
    assert res.exit_code == 2 and src.read_bytes() == before


def test_bench_without_gpu_says_so(tmp_path: Path) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CUDA EP")
    src = tmp_path / "m.onnx"
    onnx.save(chain(3, shape=(4, 8)), src)
    res = _invoke("bench", str(src))
    assert res.exit_code == 1 and "needs an NVIDIA GPU" in res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1


def test_bench_profile_on_the_cpu_side_by_side_json_and_quiet(tmp_path: Path) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "m.stitched.onnx"
    onnx.save(chain(6, shape=("batch", 64)), src)
    assert _invoke("optimize", str(src), "-o", str(out), "--shape", "batch=256", "-q").exit_code == 0
    common = ("bench", str(src), "--stitched", str(out), "--providers", "CPUExecutionProvider", "--shape", "batch=32",
              "--warmup", "1", "--iters", "3", "--profile")
    res = _invoke(*common, "--top", "4")
    assert res.exit_code == 0, res.output
    assert "where the time goes" in res.output and "FusedKernel (fallback)" in res.output
    assert "nodes/run" in res.output and "ORT CPU EP" in res.output
    res = _invoke(*common, "--top", "2", "--json")
    doc = json.loads(res.output)
    assert doc["schema"] == 4 and doc["device"] == "CPU"
    stock = doc["profiles"]["ORT CPU EP"]
    assert len(stock["by_op"]) == 2 and stock["nodes_per_run"] == 6
    assert [r["name"] for r in doc["profiles"]["onnxstitch"]["by_op"]] == ["FusedKernel (fallback)"]
    assert _invoke(*common, "-q").output == ""
    res = _invoke(*common, "--cuda-graph")
    assert res.exit_code == 2 and "--cuda-graph needs CUDAExecutionProvider" in res.output


def test_check_quiet_prints_only_what_failed(tmp_path: Path) -> None:
    src, base = tmp_path / "m.onnx", tmp_path / "base.json"
    onnx.save(random_graph(20, seed=5, shape=("batch", 16), opaque_every=11), src)
    assert _invoke("check", str(src), "--baseline", str(base), "--update-baseline", "-q").output == ""
    assert _invoke("check", str(src), "--baseline", str(base), "-q").output == ""
    data = json.loads(base.read_text())
    data["plan"]["kernels_after"] -= 1  # a baseline that fused better: today regressed
    base.write_text(json.dumps(data))
    res = _invoke("check", str(src), "--baseline", str(base), "-q")
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and lines and all(ln.startswith("onnxstitch: error: regression:") for ln in lines)


def test_optimize_says_what_it_packed_and_no_pack_keeps_groups_apart(tmp_path: Path) -> None:
    from .layout_models import attention_projections

    src = tmp_path / "qkv.onnx"
    onnx.save(attention_projections(4, 16)[0], src)
    res = _invoke("optimize", str(src), "-o", str(tmp_path / "a.onnx"), "--shape", "batch=8,seq=16", "--no-verify")
    assert res.exit_code == 0, res.output
    assert "1 (1 packed from 3 independent groups)" in " ".join(res.output.split())
    res = _invoke("optimize", str(src), "-o", str(tmp_path / "b.onnx"), "--shape", "batch=8,seq=16",
                  "--no-verify", "--no-pack")
    assert res.exit_code == 0 and "packed" not in res.output
    assert [n.op_type for n in onnx.load(tmp_path / "b.onnx").graph.node] == ["FusedKernel"] * 3


def test_optimize_says_how_many_group_norms_it_rewrote(tmp_path: Path) -> None:
    from .row_models import group_norm_models

    src = tmp_path / "gn.onnx"
    onnx.save(next(m for name, m, _ in group_norm_models(8, 4, (5, 6)) if name == "exported"), src)
    res = _invoke("optimize", str(src), "-o", str(tmp_path / "gn.stitched.onnx"), "--shape", "batch=2",
                  "--report", str(tmp_path / "report.json"), "--no-verify")
    assert res.exit_code == 0, res.output
    assert "1 rewritten into [N, G, C/G, P]" in " ".join(res.output.split())
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["normalize"]["rewrites"]) == 1 and report["normalize"]["refusals"] == []


def test_optimize_says_what_it_merged_and_no_merge_keeps_the_gemms_apart(tmp_path: Path) -> None:
    from .sibling_models import projections

    src = tmp_path / "qkv.onnx"
    onnx.save(projections((16, 16, 16), 32, tail="heads")[0], src)
    res = _invoke("optimize", str(src), "-o", str(tmp_path / "a.onnx"), "--shape", "batch=8,seq=16",
                  "--no-verify", "--report", str(tmp_path / "report.json"))
    assert res.exit_code == 0, res.output
    assert "merged GEMMs │ │ 1 (from sibling MatMuls)" in " ".join(res.output.split())
    assert [n.op_type for n in onnx.load(tmp_path / "a.onnx").graph.node] == ["MatMul", "FusedKernel"]
    assert len(json.loads((tmp_path / "report.json").read_text())["merge"]["rewrites"]) == 1
    res = _invoke("optimize", str(src), "-o", str(tmp_path / "b.onnx"), "--shape", "batch=8,seq=16",
                  "--no-verify", "--no-merge-matmuls")
    assert res.exit_code == 0 and "sibling" not in res.output
    assert [n.op_type for n in onnx.load(tmp_path / "b.onnx").graph.node].count("MatMul") == 3


def test_a_model_file_whose_graph_is_invalid_is_the_users_fault(tmp_path) -> None:
    """Checked after its weights are set aside (load.load_detached): still one line, exit 2."""
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((300, 300), np.float32), "w")  # large enough to detach
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    bad = helper.make_node("Relu", ["nowhere"], ["z"])  # reads a tensor nothing makes
    graph = helper.make_graph([node, bad], "g", [helper.make_tensor_value_info("x", 1, [2, 300])],
                              [helper.make_tensor_value_info("y", 1, [2, 300]),
                               helper.make_tensor_value_info("z", 1, [2, 300])], [w])
    path = tmp_path / "bad.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    res = CliRunner().invoke(main, ["optimize", str(path)])
    assert res.exit_code == 2, res.output
    assert "invalid graph" in res.output and str(path) in res.output


@pytest.mark.parametrize("module, says, not_says", [
    # A dependency missing from the environment (seen: mip on a machine where PYTHONPATH lacked
    # it) is named in one line, not reported as onnxstitch's own fault.
    ("mip", "'mip' is not installed", "is broken"),
    # A module of onnxstitch itself missing (a wheel that left a package out) is the
    # installation's fault, said so, not blamed on the user's environment.
    ("onnxstitch.schemes.conv", "installation of onnxstitch", "not installed in this environment"),
])
def test_a_missing_module_is_named_not_an_internal_error(monkeypatch: pytest.MonkeyPatch, tmp_path, module: str,
                                                          says: str, not_says: str) -> None:
    import onnxstitch

    def missing(*_args, **_kwargs):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    monkeypatch.setattr(onnxstitch, "optimize", missing)
    model = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) { a = Relu(x)  y = Sigmoid(a) }"""), str(model))
    res = CliRunner().invoke(main, ["optimize", str(model)])
    assert res.exit_code == 1, res.output
    assert says in res.output and not_says not in res.output and "internal error" not in res.output
