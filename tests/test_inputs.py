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


def test_a_masks_running_sum_indexes_its_positions_in_range() -> None:
    """OPT's position ids: cumsum(mask) · mask − 1 + 2 index a table of sequence + 2 rows; only a
    mask of 0s and 1s stays within it, so the mask is drawn from {0, 1} as indices are."""
    from onnx import numpy_helper

    from .stitching import fresh_seed

    seq = 16
    table = numpy_helper.from_array(np.random.default_rng().standard_normal((seq + 2, 4)).astype(np.float32), "pos")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("axis", 1), ("one", 1), ("two", 2))]
    nodes = [helper.make_node("CumSum", ["mask", "axis"], ["c"]), helper.make_node("Mul", ["c", "mask"], ["m"]),
             helper.make_node("Sub", ["m", "one"], ["s"]), helper.make_node("Add", ["s", "two"], ["p"]),
             helper.make_node("Gather", ["pos", "p"], ["y"])]
    graph = helper.make_graph(nodes, "opt_positions", [helper.make_tensor_value_info("mask", TP.INT64, ["b", seq])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["b", seq, 4])], [table, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"b": 3})
    assert set(np.unique(feeds["mask"])) <= {0, 1}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, feeds)[0].shape == (3, seq, 4)


def test_feeds_for_timing_share_one_buffer_a_dtype() -> None:
    """Feeds drawn for timing with one pool are views of one buffer per dtype across models (a
    network's measured groups held one buffer each: 9.9 GB for MobileViT V2), grown where a
    later model's input is larger, the earlier views left as they were."""
    def model(n: int):
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TP.FLOAT, [n, 64])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [n, 64])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    pool: dict = {}
    small = random_feeds(model(4), drawn=100, pool=pool)["x"]
    same = random_feeds(model(2), drawn=100, pool=pool)["x"]
    assert np.shares_memory(small, same) and len(pool) == 1
    before = small.copy()
    large = random_feeds(model(64), drawn=100, pool=pool)["x"]
    assert large.shape == (64, 64) and pool[TP.FLOAT].size >= 64 * 64
    np.testing.assert_array_equal(small, before)
    again = random_feeds(model(8), drawn=100, pool=pool)["x"]
    assert np.shares_memory(again, large)
