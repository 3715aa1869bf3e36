"""Layout folding (views.py): elementwise work that ends in Reshape/Flatten/Squeeze/Unsqueeze and
one Transpose plans into one kernel writing the chain's end; the stitched model reproduces an
independent numpy reference through its fallback on CPU; what cannot fold says why."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import candidates, cost
from onnxstitch.folds import views
from onnxstitch.inputs import random_feeds

from ._graphs import from_text, node, nodes
from .layout_models import attention_split, layout_models
from .stitching import assert_close, assert_one_kernel_on_cpu, fresh_seed

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16) for cols in (2, 10, 64)
         for name, model, ref in layout_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
def test_layout_tail_is_one_kernel_and_matches_numpy(name, model, ref, dtype) -> None:
    # The runtime shape computation feeding a folded Reshape goes with it.
    assert_one_kernel_on_cpu(model, ref, {"batch": [5], "seq": [3]}, {"batch": 4, "seq": 7}, name)


def test_attention_split_writes_through_its_view() -> None:
    model, _ = attention_split(12, 64, (0, 2, 3, 1))
    res = onnxstitch.optimize(model, shapes={"batch": [8], "seq": [128]}, archs=("sm_90",))
    (fused,) = res.model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    # [batch, seq, 768] split into [batch, seq, 12, 64] (copies of dims 0 and 1), permuted to
    # [batch, 12, 64, seq], kept as is (fixed sizes stay numbers).
    assert attrs["output_views"] == [4, views.copy_of(0), views.copy_of(1), 12, 64, 0, 2, 3, 1,
                                     4, views.copy_of(0), 12, 64, views.copy_of(3)]
    out = res.model.graph.value_info[0] if res.model.graph.value_info else None
    assert out is None or out.name != "y"  # the graph output keeps its own declaration
    assert [d.dim_param or d.dim_value for d in res.model.graph.output[0].type.tensor_type.shape.dim] == \
        ["batch", 12, 64, "seq"]
    # The report says how the kernel writes it: the innermost axis moves, so through the tile.
    (k,) = res.report.to_json()["kernels"]
    assert k["views"] == [{"output": "y", "perm": [0, 2, 3, 1], "stores": "tile"}]


def test_report_names_vector_stores_when_the_innermost_axis_stays() -> None:
    model, _ = attention_split(12, 64, (0, 2, 1, 3))
    (k,) = onnxstitch.optimize(model, shapes={"batch": [8], "seq": [128]}, archs=("sm_90",),
                               verify=False).report.to_json()["kernels"]
    assert k["scheme"] == "elementwise" and k["views"] == [{"output": "y", "perm": [0, 2, 1, 3], "stores": "vector"}]


REFUSED = {
    "head": ("""g (float[4,6] x) => (float[6,4] y) {
                  t = Transpose<perm = [1, 0]>(x)
                  y = Relu(t)
                }""", ["t", "y"], "folds only into a group's outputs"),
    "middle": ("""g (float[4,6] x) => (float[1,4,6] y) <int64[3] s = {1, 4, 6}> {
                  r = Relu(x)
                  f = Reshape(r, s)
                  y = Sigmoid(f)
                }""", ["r", "f", "y"], "folds only into a group's outputs"),
    "two-transposes": ("""g (float[4,6] x) => (float[4,6] y) {
                  r = Relu(x)
                  t = Transpose<perm = [1, 0]>(r)
                  y = Transpose<perm = [1, 0]>(t)
                }""", ["r", "t", "y"], "second Transpose"),
    "reshape-only": ("""g (float[4,6] x) => (float[24] y) <int64[1] s = {24}> {
                  r = Relu(x)
                  y = Reshape(r, s)
                }""", ["r", "y"], "gains nothing"),
    "after-rows": ("""g (float[4,6] x) => (float[6,4] y) {
                  r = Softmax<axis = -1>(x)
                  s = Neg(r)
                  y = Transpose<perm = [1, 0]>(s)
                }""", ["r", "s", "y"], "layout tails of row kernels"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_layout_that_cannot_fold_is_refused_with_a_reason(case: str) -> None:
    text, outputs, reason = REFUSED[case]
    g = from_text(text)
    got = candidates.legality(g, set(nodes(g, *outputs)))
    assert got is not None and reason in got, got


def test_reshape_costs_no_launch_alone_and_transpose_a_kernel() -> None:
    g = from_text("""g (float[64,64] x) => (float[4096] y, float[64,64] z) <int64[1] s = {4096}> {
                       y = Reshape(x, s)
                       z = Transpose<perm = [1, 0]>(x)
                     }""")
    model = cost.CostModel()
    assert cost.node_us(g, model, node(g, "y")) < model.launch_us / 4
    assert cost.node_us(g, model, node(g, "z")) > model.launch_us


def test_spec_states_sizes_relative_to_the_source() -> None:
    assert views.spec(("b", "s", 768), ("b", "s", 12, 64)) == (views.copy_of(0), views.copy_of(1), 12, 64)
    assert views.spec(("b", "s", 768), ("n", 768)) == (views.REST, 768)
    assert views.spec(("b", "s", 768), ("n", "m")) is None  # two sizes known to nothing
    assert views.onnx_shape((views.copy_of(0), views.REST, 64)) == [0, -1, 64]
    assert views.onnx_shape((views.copy_of(1), views.copy_of(0))) is None  # a dynamic dim moved


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(1, 5), min_size=2, max_size=4), split=st.integers(1, 3), data=st.data())
def test_random_split_and_permutation_match_numpy(dims: list[int], split: int, data) -> None:
    """Any split of the last axis and any permutation of the result, after an elementwise op,
    folds into one kernel whose fallback reproduces numpy."""
    last = dims[-1] * split
    shape = ["batch"] + dims[:-1] + [last]
    target = [0] * len(dims) + [split, dims[-1]]
    rank = len(target)
    perm = data.draw(st.permutations(range(rank)))
    assume(list(perm) != list(range(rank)))  # an identity Transpose only reshapes: left to ORT
    x = helper.make_tensor_value_info("x", TP.FLOAT, shape)
    out_shape = [(["batch"] + dims[:-1] + [split, dims[-1]])[p] for p in perm]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Reshape", ["e", "s"], ["r"]),
         helper.make_node("Transpose", ["r"], ["y"], perm=list(perm))],
        "g", [x], [helper.make_tensor_value_info("y", TP.FLOAT, out_shape)],
        [numpy_helper.from_array(np.array(target, np.int64), "s")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    res = onnxstitch.optimize(model, shapes={"batch": [3]}, archs=("sm_90",), verify=False)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 2})
    (got,) = run_cpu(res.model, feeds)
    xs = feeds["x"].astype(np.float64)
    want = np.exp(xs).reshape(xs.shape[:-1] + (split, dims[-1])).transpose(perm)
    assert_close(got, want.astype(np.float32))


def test_report_names_element_stores_for_a_second_moving_view() -> None:
    # flat moves the innermost axis and takes the tile; col moves it along another split, so
    # the kernel stores it element by element, and the report says so.
    _, model, _ = next(c for c in layout_models(64) if c[0] == "transpose-flatten-squeeze-unsqueeze")
    (k,) = onnxstitch.optimize(model, shapes={"batch": [5]}, archs=("sm_90",), verify=False).report.to_json()["kernels"]
    assert [(v["output"], v["stores"]) for v in k["views"]] == [("flat", "tile"), ("col", "element")]
