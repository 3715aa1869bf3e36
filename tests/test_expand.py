"""Expand inside a fused group (ops.py: broadcasting is indexing): where the group's inputs
already carry the expanded shape, the Expand costs nothing in the kernel and its runtime shape
computation goes with it; the stitched model reproduces an independent numpy reference
through its fallback on CPU; where Expand widens the shape, the refusal says why."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import candidates
from onnxstitch.inputs import random_feeds

from ._graphs import from_text, nodes
from .stitching import assert_close, fresh_seed

HEADS = 3


def masked_softmax(dtype: int) -> onnx.ModelProto:
    """Attention scores plus a [b, 1, 1, s] mask expanded to the scores' runtime shape (as
    exporters write it: Shape → Expand), then Softmax over the last axis."""
    sc = helper.make_tensor_value_info("scores", dtype, ["batch", HEADS, "seq", "seq"])
    mk = helper.make_tensor_value_info("mask", dtype, ["batch", 1, 1, "seq"])
    out = helper.make_tensor_value_info("p", dtype, ["batch", HEADS, "seq", "seq"])
    g = helper.make_graph([helper.make_node("Shape", ["scores"], ["shape"]),
                           helper.make_node("Expand", ["mask", "shape"], ["wide"]),
                           helper.make_node("Add", ["scores", "wide"], ["a"]),
                           helper.make_node("Softmax", ["a"], ["p"], axis=-1)], "m", [sc, mk], [out])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def scaled_bias(dtype: int) -> onnx.ModelProto:
    """A [C] bias expanded by a constant shape to [N, C], times x, through Relu."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    x = helper.make_tensor_value_info("x", dtype, [6, 40])
    y = helper.make_tensor_value_info("y", dtype, [6, 40])
    inits = [numpy_helper.from_array(np.random.default_rng(2).standard_normal(40).astype(npd), "bias"),
             numpy_helper.from_array(np.array([6, 40], np.int64), "to")]
    g = helper.make_graph([helper.make_node("Expand", ["bias", "to"], ["b"]),
                           helper.make_node("Mul", ["x", "b"], ["m"]),
                           helper.make_node("Relu", ["m"], ["y"])], "s", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_expanded_mask_stitches_into_the_softmax_kernel(dtype: int) -> None:
    model = masked_softmax(dtype)
    res = onnxstitch.optimize(model, shapes={"batch": [2], "seq": [16]}, archs=("sm_90",))
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]  # Shape went with the Expand
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3, "seq": 9})
    (got,) = run_cpu(res.model, feeds)
    want = _softmax(feeds["scores"].astype(np.float64) + feeds["mask"].astype(np.float64))
    assert_close(got, want.astype(got.dtype), "masked softmax")


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_expand_by_a_constant_shape_is_free_in_an_elementwise_kernel(dtype: int) -> None:
    model = scaled_bias(dtype)
    res = onnxstitch.optimize(model, archs=("sm_90",))
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    bias = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    feeds = random_feeds(model, seed=fresh_seed())
    (got,) = run_cpu(res.model, feeds)
    assert_close(got, np.maximum(feeds["x"].astype(np.float64) * bias, 0).astype(got.dtype), "scaled bias")


def test_expand_that_widens_the_shape_is_refused_with_a_reason() -> None:
    g = from_text("""g (float[3,1] x) => (float[2,3,6] y) <int64[3] to = {2, 3, 6}> {
                      e = Expand(x, to)
                      y = Relu(e)
                    }""")
    got = candidates.legality(g, set(nodes(g, "e", "y")))
    assert got is not None and "an Expand or baked constants widen it" in got, got


def test_expand_shape_input_is_not_a_kernel_input() -> None:
    res = onnxstitch.optimize(scaled_bias(TP.FLOAT), archs=("sm_90",), verify=False)
    (fused,) = res.model.graph.node
    assert sorted(fused.input) == ["bias", "x"]  # not "to"
