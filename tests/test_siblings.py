"""Sibling MatMuls merged into one GEMM (siblings.py): the merged model keeps the values (ORT
CPU against a float64 numpy reference on fresh random inputs), its Split folds into the kernel
after it, what is left apart says why, and a merge the plan cannot fold is undone."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto as TP

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import load, pipeline, shapes, siblings
from onnxstitch.inputs import random_feeds
from onnxstitch.plan import Plan

from .sibling_models import projections
from .stitching import assert_matches_reference, fresh_seed

RUN = {"batch": 3, "seq": 5}


def _merged(model: onnx.ModelProto) -> siblings.Merged:
    m = load.constants_to_initializers(load.load(model))
    _, infos = shapes.infer(m)
    return siblings.merge(m, infos)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _check_values(model: onnx.ModelProto, ref, dtype: int, what: str) -> None:
    feeds = random_feeds(model, seed=fresh_seed(), dim_values=RUN)
    for got, want in zip(run_cpu(model, feeds), ref(feeds)):
        assert_matches_reference(got, want, dtype == TP.FLOAT16, what)


@pytest.mark.parametrize("opset", [9, 18])  # Slice bounds as attributes, as inputs
@pytest.mark.parametrize("tail", ["bias-relu", "heads"])
@pytest.mark.parametrize("sizes", [(8, 8, 8), (4, 12), (6, 2, 10, 4)])
def test_merged_projections_keep_the_values(sizes, tail, opset) -> None:
    model, ref = projections(sizes, 16, tail=tail, opset=opset, seed=fresh_seed())
    out = _merged(model)
    assert len(out.merges) == 1 and not out.refusals, (out.merges, out.refusals)
    (x,) = out.merges
    assert x.activation == "x" and x.sizes == sizes and x.outputs == tuple(f"p{i}" for i in range(len(sizes)))
    assert _ops(out.model).count("MatMul") == 1 and _ops(out.model).count("Slice") == len(sizes)
    onnx.checker.check_model(out.model, full_check=True)
    # The originals' weights are gone.
    names = {t.name for t in out.model.graph.initializer}
    assert not names & {f"w{i}" for i in range(len(sizes))}
    _check_values(out.model, ref, TP.FLOAT, f"{sizes} {tail} opset {opset}")


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 24), min_size=2, max_size=5), k=st.integers(1, 40),
       dtype=st.sampled_from([TP.FLOAT, TP.DOUBLE]))
def test_any_sibling_set_keeps_the_values(sizes, k, dtype) -> None:
    model, ref = projections(sizes, k, dtype=dtype, seed=fresh_seed())
    out = _merged(model)
    assert [x.sizes for x in out.merges] == [tuple(sizes)]
    _check_values(out.model, ref, dtype, f"{sizes} k={k}")


def test_gated_mlp_merges_gate_and_up() -> None:
    model, ref = projections((12, 12), 16, tail="glu", seed=fresh_seed())
    out = _merged(model)
    assert [x.outputs for x in out.merges] == [("p0", "p1")]
    _check_values(out.model, ref, TP.FLOAT, "glu")


def test_product_feeding_a_gemm_stays_apart_and_says_why() -> None:
    model, _ = projections((8, 8), 16, tail="matmul")
    out = _merged(model)
    assert out.merges == () and _ops(out.model).count("MatMul") == 4
    assert len(out.refusals) == 2 and all("MatMul" in r and "the Slice would copy it" in r for r in out.refusals)


def test_reshape_then_gemm_stays_apart() -> None:
    """A Reshape reads without cost, so what it feeds decides: here another GEMM."""
    model, _ = projections((8, 8), 16, tail="matmul")
    g = model.graph
    shape = onnx.numpy_helper.from_array(np.array([0, 0, 2, 4], np.int64), "s")
    shape_back = onnx.numpy_helper.from_array(np.array([0, 0, 8], np.int64), "s_back")
    g.initializer.extend([shape, shape_back])
    for i in range(2):
        at = next(k for k, n in enumerate(g.node) if n.output[0] == f"y{i}")
        g.node[at].input[0] = f"back{i}"
        # (inserted before the MatMul that reads them: the node list stays in topological order)
        g.node.insert(at, onnx.helper.make_node("Reshape", [f"r{i}", "s_back"], [f"back{i}"]))
        g.node.insert(at, onnx.helper.make_node("Reshape", [f"p{i}", "s"], [f"r{i}"]))
    model = onnx.shape_inference.infer_shapes(model)
    out = _merged(model)
    assert out.merges == ()
    assert all("MatMul" in r for r in out.refusals), out.refusals


def test_one_sibling_left_out_the_others_merge() -> None:
    model, _ = projections((8, 8, 8), 16)
    g = model.graph
    # p2 also becomes a graph output: merging it would leave ORT a Slice copying it out.
    g.output.append(onnx.helper.make_tensor_value_info("p2", TP.FLOAT, ["batch", "seq", 8]))
    out = _merged(model)
    assert [x.outputs for x in out.merges] == [("p0", "p1")]
    assert len(out.refusals) == 1 and "graph output" in out.refusals[0]


def test_weights_that_are_graph_inputs_are_not_siblings() -> None:
    model, _ = projections((8, 8, 8), 16)
    g = model.graph
    # w0 overridable at run time (an initializer that is also a graph input): not a constant.
    g.input.append(onnx.helper.make_tensor_value_info("w0", TP.FLOAT, [16, 8]))
    out = _merged(model)
    assert [x.outputs for x in out.merges] == [("p1", "p2")]


@pytest.mark.parametrize("sizes,kernels", [((8, 8, 8), 1), ((8, 16, 8), 2)])
def test_the_slices_fold_into_the_kernels_and_the_stitched_model_matches(sizes, kernels) -> None:
    """Each Slice is a box of the merged product in the kernel reading it; tails of one shape
    are packed into one kernel, a wider one runs in its own."""
    model, ref = projections(sizes, 32, tail="heads", heads=4)
    res = onnxstitch.optimize(model, shapes={"batch": [2], "seq": [8]}, archs=("sm_90",))
    ops = _ops(res.model)
    assert ops.count("MatMul") == 1 and "Slice" not in ops and ops.count("FusedKernel") == kernels, ops
    bounds = sorted((b["start"], b["stop"]) for k in res.report.to_json()["kernels"] for b in k.get("boxes", []))
    assert bounds == [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(len(sizes))]
    report = res.report.to_json()["merge"]
    assert len(report["rewrites"]) == 1 and f"sliced {list(sizes)}" in report["rewrites"][0]
    _check_values(res.model, ref, TP.FLOAT, "stitched")


def test_no_merge_keeps_the_gemms_apart() -> None:
    model, _ = projections((8, 8, 8), 16, tail="heads")
    res = onnxstitch.optimize(model, shapes={"batch": [2], "seq": [8]}, archs=("sm_90",), merge=False, verify=False)
    assert _ops(res.model).count("MatMul") == 3
    assert res.report.to_json()["merge"] == {"rewrites": [], "refusals": []}


def test_merge_is_undone_when_the_plan_leaves_its_split(monkeypatch) -> None:
    """The solver found nothing to fuse (a time limit, say): the Split would be left to ONNX
    Runtime, copying the product apart again, so the GEMMs run apart as in the input."""
    def no_plan(g, cost, time_limit_s, proposed=()):
        return Plan((), "no plan", "the solver found no plan in time", 0.0, 0, 0.0, 0.0, 0, 0, 0, 0)

    monkeypatch.setattr(pipeline, "make_plan", no_plan)
    model, _ = projections((8, 8, 8), 16, tail="heads")
    res = onnxstitch.optimize(model, shapes={"batch": [2], "seq": [8]}, archs=("sm_90",), verify=False)
    assert _ops(res.model) == _ops(model)
    merge = res.report.to_json()["merge"]
    assert merge["rewrites"] == [] and any("left apart" in r for r in merge["refusals"])



def test_layers_sharing_their_weights_share_one_wide_weight() -> None:
    """ALBERT's layers (and TorchScript's aliases once simplify reads them as the constant) project
    two activations by the same Q/K/V weights: both merged products read one wide weight, the
    model stays valid (one name, one initializer), and its values match float64 numpy. A third
    set starting with the same weight gets a name of its own."""
    rng = np.random.default_rng(fresh_seed())
    k, n = 16, 8
    ws = {f"w{i}": (rng.standard_normal((k, n)) / 4).astype(np.float32) for i in range(4)}
    mk = onnx.helper.make_node
    sets = {"x": ("w0", "w1", "w2"), "x2": ("w0", "w1", "w2"), "x3": ("w0", "w3")}
    nodes = [mk("Relu", ["x"], ["x2"]), mk("Sigmoid", ["x"], ["x3"])]
    outs = []
    for a, names in sets.items():
        for j, w in enumerate(names):
            nodes += [mk("MatMul", [a, w], [f"{a}_p{j}"]), mk("Relu", [f"{a}_p{j}"], [f"{a}_y{j}"])]
            outs.append(onnx.helper.make_tensor_value_info(f"{a}_y{j}", TP.FLOAT, ["batch", "seq", n]))
    graph = onnx.helper.make_graph(nodes, "shared", [onnx.helper.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", k])],
                                   outs, [onnx.numpy_helper.from_array(v, name) for name, v in ws.items()])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=8)
    out = _merged(model)
    assert len(out.merges) == 3
    onnx.checker.check_model(out.model, full_check=True)
    wide = [t.name for t in out.model.graph.initializer if t.name.startswith("w0")]
    assert len(wide) == len(set(wide)) == 2, wide
    products = [n.input[1] for n in out.model.graph.node if n.op_type == "MatMul"]
    assert products.count(products[0]) == 2 and len(set(products)) == 2

    def ref(feeds: dict) -> list[np.ndarray]:
        x = feeds["x"].astype(np.float64)
        acts = {"x": x, "x2": np.maximum(x, 0), "x3": 1 / (1 + np.exp(-x))}
        return [np.maximum(acts[a] @ ws[w].astype(np.float64), 0) for a, names in sets.items() for w in names]

    _check_values(out.model, ref, TP.FLOAT, "shared weights")


def test_siblings_whose_merged_weight_is_large_merge_in_a_model_of_small_weights() -> None:
    """Each weight under the size weights.py detaches, their merged weight over it: the join is a
    stub of the model's own store, even where the store held nothing (an empty store is falsy:
    the join once went to a store of its own, and verification could not run the original)."""
    from onnxstitch.weights import DETACH_ABOVE

    k = 64
    n = DETACH_ABOVE // k  # each weight [k, n] at the limit, three of them over it
    model, ref = projections((n, n, n), k, seed=fresh_seed())
    res = onnxstitch.optimize(model, shapes=RUN)
    assert res.report.merged and res.report.verification.tensors_checked > 0, res.report.verification
    assert not res.report.verification.skipped
    _check_values(res.model, ref, TP.FLOAT, "merged over the detach size")
