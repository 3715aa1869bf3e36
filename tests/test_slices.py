"""Slice and Split folded into kernels (slices.py): the kernel reads their outputs as boxes of
their input, so no Slice/Split is left to ONNX Runtime; the stitched model reproduces an
independent numpy reference through its fallback on CPU; what cannot fold says why."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import parser

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import candidates
from onnxstitch.folds import slices

from ._graphs import from_text, node, nodes
from .slice_models import qkv_split, slice_models
from .stitching import assert_one_kernel_on_cpu, fresh_seed, single_kernel_attrs

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16) for cols in (2, 10, 64)
         for name, model, ref in slice_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
def test_sliced_inputs_fold_into_one_kernel_and_match_numpy(name, model, ref, dtype) -> None:
    assert_one_kernel_on_cpu(model, ref, {"batch": [5], "seq": [3]}, {"batch": 4, "seq": 7}, name)


def test_qkv_split_reads_three_boxes_of_one_tensor() -> None:
    model, _ = qkv_split(12, 64)
    res = onnxstitch.optimize(model, shapes={"batch": [8], "seq": [128]}, archs=("sm_90",), verify=False)
    a = single_kernel_attrs(res.model)
    # One tensor bound three times, each read through its third of the last axis (strided).
    assert a["inputs"] == ["x", "x", "x"]
    assert a["input_boxes"] == [2, 0, 768, 2, 768, 1536, 2, 1536, 2304]
    assert a["input_kinds"] == [1, 1, 1]
    # The report says which box of which tensor each input is.
    (k,) = res.report.to_json()["kernels"]
    assert k["boxes"] == [{"input": t, "source": "x", "axis": 2, "start": j * 768, "stop": (j + 1) * 768}
                          for j, t in enumerate("qkv")]


def test_box_of_each_split_output_from_inferred_sizes() -> None:
    g = from_text("""g (float[3,10] x) => (float[3,5] y) <int64[2] s = {4, 6}> {
                       a, b = Split<axis = -1>(x, s)
                       y = Relu(a)
                     }""")
    split = g.nodes[node(g, "a")]
    assert split.fusible
    assert g.boxes["a"] == slices.Box("a", "x", 1, 0, 4) and g.boxes["b"] == slices.Box("b", "x", 1, 4, 10)


REFUSED = {
    "step": ("""g (float[4,8] x) => (float[4,4] y) <int64[1] s = {0}, int64[1] e = {8}, int64[1] a = {1},
                  int64[1] k = {2}> {
                  t = Slice(x, s, e, a, k)
                  y = Relu(t)
                }""", "t", "step other than 1"),
    "two-axes": ("""g (float[4,8] x) => (float[2,4] y) <int64[2] s = {1, 2}, int64[2] e = {3, 6}, int64[2] a = {0, 1}> {
                  t = Slice(x, s, e, a)
                  y = Relu(t)
                }""", "t", "slices 2 axes"),
    "dynamic-axis": ("""g (float[N,8] x) => (float[M,8] y) <int64[1] s = {1}, int64[1] e = {3}, int64[1] a = {0}> {
                  t = Slice(x, s, e, a)
                  y = Relu(t)
                }""", "t", "not fixed at optimize time"),
    "runtime-starts": ("""g (float[4,8] x, int64[1] s) => (float[4,M] y) <int64[1] e = {8}, int64[1] a = {1}> {
                  t = Slice(x, s, e, a)
                  y = Relu(t)
                }""", "t", "is not a constant"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_slice_that_cannot_fold_says_why(case: str) -> None:
    text, out, reason = REFUSED[case]
    g = from_text(text)
    n = g.nodes[node(g, out)]
    assert not n.fusible and reason in (n.reason or ""), n.reason


GROUP_REFUSED = {
    "output-escapes": ("""g (float[4,8] x) => (float[4,4] y, float[4,4] b) <int64[2] s = {4, 4}> {
                  a, b = Split<axis = 1>(x, s)
                  y = Relu(a)
                }""", ["a", "y"], "needed outside the group"),
    "sliced-inside": ("""g (float[4,8] x) => (float[4,4] y) <int64[2] s = {4, 4}> {
                  r = Relu(x)
                  a, b = Split<axis = 1>(r, s)
                  y = Add(a, b)
                }""", ["r", "a", "y"], "computed inside the group"),
    "row-kernel": ("""g (float[4,8] x) => (float[4,4] y) <int64[2] s = {4, 4}> {
                  a, b = Split<axis = 1>(x, s)
                  m = Mul(a, b)
                  y = Softmax<axis = -1>(m)
                }""", ["a", "m", "y"], "feeds a row kernel"),
    "unequal-split": ("""g (float[4,10] x) => (float[4,4] y, float[4,6] z) <int64[2] s = {4, 6}> {
                  a, b = Split<axis = 1>(x, s)
                  y = Relu(a)
                  z = Relu(b)
                }""", ["a", "y", "z"], "do not broadcast"),
}


@pytest.mark.parametrize("case", GROUP_REFUSED)
def test_group_with_a_slice_that_cannot_fold_says_why(case: str) -> None:
    text, outputs, reason = GROUP_REFUSED[case]
    g = from_text(text)
    got = candidates.legality(g, set(nodes(g, *outputs)))
    assert got is not None and reason in got, got


def test_split_joins_with_every_reader_of_its_outputs() -> None:
    # Growing from the Split must take in both readers (one alone leaves the other half outside).
    g = from_text("""g (float[4,8] x) => (float[4,4] y, float[4,4] z) <int64[2] s = {4, 4}> {
                       a, b = Split<axis = 1>(x, s)
                       y = Relu(a)
                       z = Neg(b)
                     }""")
    found = candidates.enumerate_candidates(g).groups
    assert tuple(sorted(nodes(g, "a", "y", "z"))) in found


def test_unequal_split_stays_with_onnx_runtime_and_still_matches() -> None:
    model = parser.parse_model('<ir_version: 10, opset_import: ["" : 17]>\n' + GROUP_REFUSED["unequal-split"][0])
    res = onnxstitch.optimize(model, archs=("sm_90",))
    assert "Split" in [n.op_type for n in res.model.graph.node]
    feeds = {"x": np.random.default_rng(fresh_seed()).standard_normal((4, 10)).astype(np.float32)}
    y, z = run_cpu(res.model, feeds)
    np.testing.assert_allclose(y, np.maximum(feeds["x"][:, :4], 0))
    np.testing.assert_allclose(z, np.maximum(feeds["x"][:, 4:], 0))
