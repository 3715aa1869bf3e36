"""The normalize stage (normalize.py): group norms rewritten into [N, G, C/G, P] keep the
model's values (ORT CPU on the rewritten model against a float64 numpy reference on fresh
random inputs), plan as one rows kernel with their affine part and the SiLU after them, and
say why when they are left as they are."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.backend.test.case.node import collect_testcases

import onnxstitch
from onnxstitch import load, normalize, shapes
from onnxstitch.inputs import random_feeds
from onnxstitch.plan import make_plan

from .row_models import group_norm_models
from .stitching import assert_matches_reference, fresh_seed, prepared

SIZES = [(8, 4, (5, 6)), (6, 3, (7,)), (4, 2, (2, 3, 4)), (6, 6, (5, 5)), (4, 1, (9,))]
CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{c}g{g}-{'x'.join(map(str, s))}-{TP.DataType.Name(dt).lower()}")
         for c, g, s in SIZES for dt in (TP.FLOAT, TP.FLOAT16)
         for name, model, ref in group_norm_models(c, g, s, dt)]


def _normalized(model: onnx.ModelProto) -> normalize.Normalized:
    m = load.constants_to_initializers(load.load(model))
    _, infos = shapes.infer(m)
    return normalize.normalize(m, infos)


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
def test_rewritten_group_norm_keeps_the_values(name, model, ref, dtype) -> None:
    out = _normalized(model)
    assert len(out.rewrites) == 1 and not out.refusals, (out.rewrites, out.refusals)
    onnx.checker.check_model(out.model, full_check=True)
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3})
    for got, want in zip(_run(out.model, feeds), ref(feeds)):
        assert_matches_reference(got, want, dtype != TP.FLOAT, name)


@pytest.mark.parametrize("name,model,ref,dtype", [c for c in CASES if c.values[3] == TP.FLOAT])
def test_group_norm_and_silu_plan_as_one_rows_kernel(name, model, ref, dtype) -> None:
    m, g = prepared(model)
    plan = make_plan(g)
    rows = [grp for grp in plan.groups if any(g.nodes[i].op_type == "InstanceNormalization" for i in grp.nodes)]
    assert len(rows) == 1, [grp.labels for grp in plan.groups]
    ops = sorted(g.nodes[i].op_type for i in rows[0].nodes)
    # the affine part, the SiLU and the normalization: one kernel
    assert ops == sorted(["InstanceNormalization", "Mul", "Add", "Sigmoid", "Mul"]), ops
    # outside it, only views: Shape and Reshapes (ORT runs a Reshape without a copy)
    rest = {n.op_type for k, n in enumerate(g.nodes) if k not in rows[0].nodes} - {"Shape", "Reshape"}
    assert not rest, rest


def test_optimize_matches_the_model_as_given_on_cpu() -> None:
    _, model, ref = next(c for c in group_norm_models(8, 4, (5, 6)) if c[0] == "exported-two-outputs")
    res = onnxstitch.optimize(model, shapes={"batch": [2]}, verify=True)
    assert res.report.normalized and res.report.verification.tensors_checked > 0
    assert "FusedKernel" in [n.op_type for n in res.model.graph.node]
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 2})
    # (on the CPU the fused node runs its fallback function: this checks the rewrite's wiring)
    for got, want in zip(_run(res.model, feeds), ref(feeds)):
        assert_matches_reference(got, want, False, "optimize")


def _refusal(model: onnx.ModelProto) -> str:
    out = _normalized(model)
    assert not out.rewrites and len(out.refusals) == 1, (out.rewrites, out.refusals)
    return out.refusals[0]


def _native(channels: int, groups: int, scale_size: int, dims=None) -> onnx.ModelProto:
    dims = dims or ["batch", channels, 5]
    x = helper.make_tensor_value_info("x", TP.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TP.FLOAT, dims)
    inits = [numpy_helper.from_array(np.ones(scale_size, np.float32), k) for k in ("s", "b")]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups)
    return helper.make_model(helper.make_graph([node], "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_refusals_say_why() -> None:
    assert "6 channels do not split into 4 groups" in _refusal(_native(6, 4, 6))
    assert "scale/bias of 3/3 values for 6 channels" in _refusal(_native(6, 2, 3))
    assert "channel count is not fixed" in _refusal(_native(6, 2, 6, ["batch", "c", 5]))
    assert "rank >= 3" in _refusal(_native(6, 2, 6, ["batch", 6]))


def test_a_reshape_that_does_not_restore_the_shape_is_left_alone() -> None:
    _, model, _ = next(c for c in group_norm_models(8, 4, (5, 6)) if c[0] == "exported")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    back = next(n for n in m.graph.node if n.op_type == "Reshape" and n.input[1] == "xs")
    back.input[1] = "flat"
    m.graph.initializer.append(numpy_helper.from_array(np.array([0, 8, 30], np.int64), "flat"))
    m.graph.node.remove(next(n for n in m.graph.node if n.op_type == "Shape"))
    for n in m.graph.node:
        if n.op_type in ("Mul", "Add") and n.input[1] in ("gamma", "beta"):
            init = next(t for t in m.graph.initializer if t.name == n.input[1])
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).reshape(8, 1), init.name))
    m.graph.output[0].type.tensor_type.shape.ClearField("dim")
    assert "does not restore" in _refusal(m)


def test_sinking_stops_where_the_space_ends() -> None:
    """A Transpose after the group norm reads it in x's space: the Reshape back comes before it."""
    _, model, ref = next(c for c in group_norm_models(8, 4, (5, 6)) if c[0] == "exported")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.node.append(helper.make_node("Transpose", ["y"], ["t"], perm=[0, 2, 3, 1]))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("t", TP.FLOAT, ["batch", 5, 6, 8]))
    out = _normalized(m)
    assert out.rewrites
    ops_ = [n.op_type for n in out.model.graph.node]
    assert ops_[-2:] == ["Reshape", "Transpose"], ops_
    feeds = random_feeds(m, seed=fresh_seed(), dim_values={"batch": 2})
    (got,) = _run(out.model, feeds)
    assert_matches_reference(got, ref(feeds)[0].transpose(0, 2, 3, 1), False, "transposed")


BACKEND = [pytest.param(c, id=c.name) for c in collect_testcases()
           if c.name.startswith("test_group_normalization") and not c.name.endswith("_expanded")]


@pytest.mark.parametrize("case", BACKEND)
def test_backend_group_normalization_cases(case) -> None:
    """ONNX's own cases (scale and bias are graph inputs there: reshaped by a Reshape node)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.ir_version = 10
    out = _normalized(model)
    assert out.rewrites, out.refusals
    names = [i.name for i in model.graph.input]
    for inputs, expected in case.data_sets:
        feeds = {n: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)
                 for n, v in zip(names, inputs)}
        for got, want in zip(_run(out.model, feeds), expected):
            want = numpy_helper.to_array(want) if isinstance(want, onnx.TensorProto) else np.asarray(want)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_two_group_norms_in_a_row_and_a_shared_input() -> None:
    """x feeds a group norm and a residual Add; the first norm's SiLU feeds a second group norm
    of another group count: both rewrite, the values stay (ORT CPU against float64 numpy)."""
    c, eps = 8, 1e-5
    rng = np.random.default_rng()
    g1, b1, g2, b2 = (rng.standard_normal(c).astype(np.float32) for _ in range(4))
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["batch", c, 5, 3])
    y = helper.make_tensor_value_info("y", TP.FLOAT, ["batch", c, 5, 3])
    nodes = [helper.make_node("GroupNormalization", ["x", "g1", "b1"], ["n1"], num_groups=4, epsilon=eps),
             helper.make_node("Sigmoid", ["n1"], ["s1"]), helper.make_node("Mul", ["n1", "s1"], ["h"]),
             helper.make_node("GroupNormalization", ["h", "g2", "b2"], ["n2"], num_groups=2, epsilon=eps),
             helper.make_node("Add", ["n2", "x"], ["y"])]
    inits = [numpy_helper.from_array(v, k) for k, v in (("g1", g1), ("b1", b1), ("g2", g2), ("b2", b2))]
    model = helper.make_model(helper.make_graph(nodes, "gn2", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out = _normalized(model)
    assert len(out.rewrites) == 2, (out.rewrites, out.refusals)

    def gn(v, groups, gamma, beta):
        t = v.reshape(v.shape[0], groups, -1)
        t = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + eps)
        return t.reshape(v.shape) * gamma.reshape(c, 1, 1) + beta.reshape(c, 1, 1)

    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 2})
    v = feeds["x"].astype(np.float64)
    n1 = gn(v, 4, g1, b1)
    want = gn(n1 / (1 + np.exp(-n1)), 2, g2, b2) + v
    (got,) = _run(out.model, feeds)
    assert_matches_reference(got, want, False, "two group norms")
    m, g = prepared(model)
    rows = [grp for grp in make_plan(g).groups if any(g.nodes[i].op_type == "InstanceNormalization" for i in grp.nodes)]
    assert len(rows) == 2, [grp.labels for grp in make_plan(g).groups]


def test_verification_also_compares_against_the_model_as_given() -> None:
    """The stitched model's graph outputs are checked against the user's model, not only the
    normalized one: a source that computes something else is caught and named."""
    from onnxstitch import verify

    _, model, _ = next(c for c in group_norm_models(8, 4, (5, 6)) if c[0] == "exported")
    res = onnxstitch.optimize(model, shapes={"batch": [2]}, verify=False)
    m, g = prepared(model)
    verify.verify(m, res.model, g, res.report.plan.groups, source=model, device="cpu")  # passes as given
    other = onnx.ModelProto()
    other.CopyFrom(model)
    beta = next(t for t in other.graph.initializer if t.name == "beta")
    beta.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(beta) + 1, "beta"))
    with pytest.raises(verify.VerifyError, match="before normalization"):
        verify.verify(m, res.model, g, res.report.plan.groups, source=other, device="cpu")
