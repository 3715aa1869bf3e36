"""bfloat16 through ONNX Runtime (ortio): arrays in and out of OrtValues bit for bit, and a
session run on bfloat16 inputs and outputs against numpy's own conversions."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch import ortio

from .stitching import fresh_seed


@pytest.mark.parametrize("shape", [(2, 3), (0, 4), ()])
def test_bfloat16_round_trips_through_an_ortvalue(shape) -> None:
    x = np.random.default_rng(fresh_seed()).standard_normal(shape).astype(ml_dtypes.bfloat16)
    value = ortio.to_ortvalue(x)
    assert value.data_type() == "tensor(bfloat16)"
    back = ortio.to_numpy(value)
    assert back.dtype == x.dtype and back.shape == x.shape
    np.testing.assert_array_equal(back.view(np.uint16), x.view(np.uint16))


def test_other_dtypes_take_orts_own_path() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ortio.to_numpy(ortio.to_ortvalue(x)), x)
    assert ortio.empty((4,), np.float16).data_type() == "tensor(float16)"
    assert ortio.empty((4,), ml_dtypes.bfloat16).data_type() == "tensor(bfloat16)"


def test_run_feeds_and_returns_bfloat16() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["f"], to=TP.FLOAT), helper.make_node("Identity", ["x"], ["y"]),
             helper.make_node("Cast", ["w"], ["z"], to=TP.BFLOAT16)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.BFLOAT16, [3, 5]),
                                       helper.make_tensor_value_info("w", TP.FLOAT, [3, 5])],
                          [helper.make_tensor_value_info(n, t, [3, 5]) for n, t in
                           (("y", TP.BFLOAT16), ("f", TP.FLOAT), ("z", TP.BFLOAT16))])
    sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
                                .SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(fresh_seed())
    x = rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    y, f, z = ortio.run(sess, ["y", "f", "z"], {"x": x, "w": w})
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))
    np.testing.assert_array_equal(f, x.astype(np.float32))  # bfloat16 → float32 is exact
    np.testing.assert_array_equal(z.view(np.uint16), w.astype(ml_dtypes.bfloat16).view(np.uint16))  # round to nearest even
