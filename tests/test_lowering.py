"""Fallback functions at the model's own opset (lowering.py): the constants and Slices onnxstitch
writes into a body take the forms opsets 7-9 have, the function passes onnx.checker, and it
computes what the original nodes do (run by ONNX Runtime's CPU provider on fresh inputs)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from onnxstitch import lowering

from .stitching import fresh_seed


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _constant_model(value: np.ndarray, opset: int) -> onnx.ModelProto:
    """A model whose one output is `value`, through lowering's constant at `opset`."""
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(value, "c"))
    nodes = lowering.lowered([const, helper.make_node("Identity", ["c"], ["y"])], opset)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
    return helper.make_model(helper.make_graph(nodes, "c", [], [out]), opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=7)


@pytest.mark.parametrize("value", [
    np.array([0, -1, 3, 8, 15], np.int64),  # PP-OCRv5 rec's Reshape shape
    np.array([2**62, -(2**62) - 12345, 2**63 - 1, -(2**63)], np.int64),  # past 2**53: two exact parts
    np.array([[1, 0], [0, 1]], np.bool_),
    np.array([7, -3], np.int32),
    np.array(5, np.uint8),
])
def test_a_constant_before_opset_9_keeps_its_value(value: np.ndarray) -> None:
    model = _constant_model(value, 7)
    onnx.checker.check_model(model, full_check=True)
    assert not any(n.op_type == "Constant" and n.attribute[0].t.data_type not in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16)
                   for n in model.graph.node)
    got = _run(model, {})[0]
    assert got.dtype == value.dtype
    np.testing.assert_array_equal(got, value)


def test_from_opset_9_on_a_constant_stays_as_it_is() -> None:
    model = _constant_model(np.array([0, -1], np.int64), 9)
    assert [n.op_type for n in model.graph.node] == ["Constant", "Identity"]


def test_a_slice_before_opset_10_takes_its_parameters_as_attributes() -> None:
    # A boxed input's Slice (folds/slices.py writes Slice-10's form) in an opset-9 body.
    c = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64)))  # noqa: E731
    body = [c("s", [2]), c("e", [5]), c("a", [1]), helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])]
    nodes = lowering.lowered(body, 9)
    assert [n.op_type for n in nodes] == ["Slice"] and len(nodes[0].input) == 1
    model = helper.make_model(helper.make_graph(nodes, "s", [helper.make_tensor_value_info("x", TP.FLOAT, [3, 7])],
                                                [helper.make_tensor_value_info("y", TP.FLOAT, [3, 3])]),
                              opset_imports=[helper.make_opsetid("", 9)], ir_version=7)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(fresh_seed()).standard_normal((3, 7)).astype(np.float32)
    np.testing.assert_array_equal(_run(model, {"x": x})[0], x[:, 2:5])


def test_a_constant_the_body_gives_as_an_output_stays() -> None:
    # Slice-1's form drops the parameters' Constants once they are attributes; one that is
    # also an output of the body is kept.
    c = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64)))  # noqa: E731
    body = [c("s", [2]), c("e", [5]), helper.make_node("Slice", ["x", "s", "e"], ["y"])]
    assert [n.op_type for n in lowering.lowered(body, 9)] == ["Slice"]
    kept = lowering.lowered(body, 9, outputs=["y", "e"])
    assert [n.output[0] for n in kept] == ["e", "y"]


def test_an_opset_7_model_with_a_layout_tail_is_stitched_and_checks() -> None:
    # PP-OCRv5's mobile recognizer (paddle2onnx, opset 7): bias Add → Reshape to a constant
    # [0, -1, 3, 8, 15] → Transpose, fused with the Reshape's shape a Constant of the body. It
    # failed onnx.checker ("Constant: output has unsupported type tensor(int64)") and optimize
    # said "internal error".
    rng = np.random.default_rng(fresh_seed())
    inits = [numpy_helper.from_array(rng.standard_normal(360).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([0, -1, 3, 8, 15], np.int64), "shape")]
    nodes = [helper.make_node("Add", ["x", "b"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]), helper.make_node("Relu", ["t"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 40, 360])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [3, "b", 8, 40, 15])], inits),
        opset_imports=[helper.make_opsetid("", 7)], ir_version=7)
    result = onnxstitch.optimize(model, shapes={"b": [4]})
    stitched = result.model
    assert any(n.op_type == "FusedKernel" for n in stitched.graph.node), result.report.plan.rejections
    onnx.checker.check_model(stitched, full_check=True)
    x = rng.standard_normal((4, 40, 360)).astype(np.float32)
    np.testing.assert_allclose(_run(stitched, {"x": x})[0], _run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
