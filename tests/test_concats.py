"""Concat stitched into kernels (concats.py): operands computed in windows of its output, so
no Concat is left to ONNX Runtime; the stitched model reproduces an independent numpy
reference through its fallback on CPU; what cannot stitch says why."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import parser

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import candidates

from ._graphs import from_text, node, nodes
from .concat_models import concat_models, rope
from .stitching import assert_one_kernel_on_cpu, fresh_seed, single_kernel_attrs

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16) for cols in (2, 10, 64)
         for name, model, ref in concat_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
def test_concat_stitches_into_one_kernel_and_matches_numpy(name, model, ref, dtype) -> None:
    assert_one_kernel_on_cpu(model, ref, {"batch": [5], "seq": [3]}, {"batch": 4, "seq": 7}, name)


def test_rope_reads_two_windows_of_boxes_of_one_tensor() -> None:
    model, _ = rope(32, 128)
    res = onnxstitch.optimize(model, shapes={"batch": [2], "seq": [256]}, archs=("sm_90",), verify=False)
    a = single_kernel_attrs(res.model)
    # q bound three times: its first half read in the second window, its second half in the
    # first, and q whole (q·cos); cos and sin are [seq, 128] broadcasts.
    assert a["inputs"] == ["q", "q", "q", "cos", "sin"]
    assert a["input_boxes"] == [3, 0, 64, 3, 64, 128, -1, 0, 0, -1, 0, 0, -1, 0, 0]
    assert a["input_windows"] == [3, 64, 64, 128, 3, 0, 64, 128, -1, 0, 0, 0, -1, 0, 0, 0, -1, 0, 0, 0]
    assert a["input_kinds"] == [1, 1, 0, 1, 1]
    (k,) = res.report.to_json()["kernels"]
    assert k["windows"] == [{"input": "q1", "axis": 3, "origin": 64, "size": 64, "total": 128},
                            {"input": "q2", "axis": 3, "origin": 0, "size": 64, "total": 128}]


REFUSED = {
    "dynamic-size": ("""g (float[4,N] x, float[4,3] z) => (float[4,M] y) {
                  y = Concat<axis = 1>(x, z)
                }""", "y", "not fixed at optimize time"),
    "same-tensor-twice": ("""g (float[4,3] x) => (float[4,6] y) {
                  y = Concat<axis = 1>(x, x)
                }""", "y", "more than once"),
    "shape-building": ("""g (int64[1] a, int64[2] b) => (int64[3] y) {
                  y = Concat<axis = 0>(a, b)
                }""", "y", "builds a shape"),
    # DenseNet's dense layers: every thread would test and hold each of the operands.
    "five-operands": ("""g (float[2,4,7,7] a, float[2,4,7,7] b, float[2,4,7,7] c, float[2,4,7,7] d,
                          float[2,4,7,7] e) => (float[2,20,7,7] y) {
                  y = Concat<axis = 1>(a, b, c, d, e)
                }""", "y", "concatenates 5 tensors"),
}


def test_four_operands_still_stitch() -> None:
    g = from_text("""g (float[2,4,7,7] a, float[2,4,7,7] b, float[2,4,7,7] c, float[2,4,7,7] d) => (float[2,16,7,7] y) {
                  y = Concat<axis = 1>(a, b, c, d)
                }""")
    assert g.nodes[node(g, "y")].fusible


@pytest.mark.parametrize("case", REFUSED)
def test_concat_that_cannot_stitch_says_why(case: str) -> None:
    text, out, reason = REFUSED[case]
    g = from_text(text)
    n = g.nodes[node(g, out)]
    assert not n.fusible and reason in (n.reason or ""), n.reason


GROUP_REFUSED = {
    "two-concats": ("""g (float[4,3] a, float[4,5] b, float[4,8] c) => (float[4,16] y) {
                  x = Concat<axis = 1>(a, b)
                  r = Relu(x)
                  y = Concat<axis = 1>(r, c)
                }""", ["x", "r", "y"], "one Concat"),
    "row-kernel": ("""g (float[4,3] a, float[4,5] b) => (float[4,8] y) {
                  x = Concat<axis = 1>(a, b)
                  y = Softmax<axis = -1>(x)
                }""", ["x", "y"], "row kernel"),
    "window-value-escapes": ("""g (float[4,3] a, float[4,5] b) => (float[4,8] y, float[4,3] s) {
                  s = Sigmoid(a)
                  x = Concat<axis = 1>(s, b)
                  y = Relu(x)
                }""", ["s", "x", "y"], "needed outside the group"),
    "input-in-two-windows": ("""g (float[4,3] a) => (float[4,6] y) {
                  n = Neg(a)
                  y = Concat<axis = 1>(a, n)
                }""", ["n", "y"], "read in window 0, window 1"),
    "input-in-window-and-space": ("""g (float[4,3] a, float[4,3] b) => (float[4,6] y) {
                  x = Concat<axis = 1>(a, b)
                  r = Relu(x)
                  y = Add(r, a)
                }""", ["x", "r", "y"], "the Concat's space"),
    "expand-in-window": ("""g (float[1,1,4] c, float[2,3,4] p) => (float[2,4,4] y) <int64[3] s = {2, 1, 4}> {
                  e = Expand(c, s)
                  x = Concat<axis = 1>(e, p)
                  y = Relu(x)
                }""", ["e", "x", "y"], "Expand is not stitched in a window"),
}


@pytest.mark.parametrize("case", GROUP_REFUSED)
def test_group_with_a_concat_that_cannot_stitch_says_why(case: str) -> None:
    text, outputs, reason = GROUP_REFUSED[case]
    g = from_text(text)
    got = candidates.legality(g, set(nodes(g, *outputs)))
    assert got is not None and reason in got, got


def test_per_row_scale_stays_unshifted_inside_a_window() -> None:
    # s is [4, 1]: the same value in every window, so it is read as a plain broadcast.
    g = from_text("""g (float[4,3] a, float[4,5] b, float[4,1] s) => (float[4,8] y) {
                       m = Mul(a, s)
                       x = Concat<axis = 1>(m, b)
                       y = Mul(x, s)
                     }""")
    assert candidates.legality(g, set(nodes(g, "m", "x", "y"))) is None


def test_concat_of_a_shape_stays_with_onnx_runtime_and_still_matches() -> None:
    model = parser.parse_model('<ir_version: 10, opset_import: ["" : 17]>\n'
                               'g (float[N,6] x) => (float[M,3] y) {\n'
                               '  s = Shape(x)\n  i = Constant<value = int64[1] {0}>()\n  b = Gather<axis = 0>(s, i)\n'
                               '  t = Constant<value = int64[1] {-1}>()\n  shape = Concat<axis = 0>(t, b)\n'
                               '  r = Relu(x)\n  y = Reshape(r, shape)\n}')
    res = onnxstitch.optimize(model, shapes={"N": [4]}, archs=("sm_90",))
    assert "Concat" in [n.op_type for n in res.model.graph.node]
    feeds = {"x": np.random.default_rng(fresh_seed()).standard_normal((3, 6)).astype(np.float32)}
    (y,) = run_cpu(res.model, feeds)
    np.testing.assert_allclose(y, np.maximum(feeds["x"], 0).reshape(-1, 3))
