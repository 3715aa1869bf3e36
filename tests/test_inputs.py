"""Seeded random feeds: every dtype, every rank (0 included) comes back as an ndarray ORT takes."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch.inputs import random_feeds


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16, TP.DOUBLE, TP.INT32, TP.INT64, TP.BOOL, TP.UINT8])
@pytest.mark.parametrize("shape", [[], [3], ["batch", 2]])
def test_feeds_are_arrays_that_ort_accepts(dtype: int, shape: list) -> None:
    x = helper.make_tensor_value_info("x", dtype, shape)
    y = helper.make_tensor_value_info("y", dtype, shape)
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = random_feeds(model, seed=1, dim_values={"batch": 5})
    arr = feeds["x"]
    assert isinstance(arr, np.ndarray) and arr.shape == tuple(5 if d == "batch" else d for d in shape)
    out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(out, arr)


def test_gather_indices_are_drawn_in_range() -> None:
    from onnx import numpy_helper

    table = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "table")
    ids = helper.make_tensor_value_info("ids", TP.INT64, ["batch", 7])
    out = helper.make_tensor_value_info("e", TP.FLOAT, ["batch", 7, 3])
    nodes = [helper.make_node("Cast", ["ids"], ["i32"], to=TP.INT32), helper.make_node("Gather", ["table", "i32"], ["e"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [ids], [out], [table]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = random_feeds(model, seed=3, dim_values={"batch": 50})
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() <= 1 and len(np.unique(feeds["ids"])) == 2
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
