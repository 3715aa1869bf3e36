"""Merged sibling MatMuls on the GPU (marker `gpu`): one GEMM over the concatenated weights
(ONNX Runtime's, TF32 by default for float32) whose Slices the stitched kernels read as boxes,
against an independent float64 numpy reference on fresh random inputs. The GEMMs round
(TF32, float16), so values are compared at half-precision tolerance (1e-2 relative norm)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch.inputs import random_feeds

from ..sibling_models import projections
from ..stitching import assert_matches_reference, fresh_seed
from .test_stitched_gpu import run_gpu, stitch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("tail,sizes", [("heads", (64, 64, 64)), ("heads", (64, 128, 64)), ("bias-relu", (48, 8)),
                                        ("glu", (256, 256))])
def test_merged_gemm_and_its_slices_match_float64_numpy(tail, sizes, dtype) -> None:
    model, ref = projections(sizes, 128, dtype=dtype, tail=tail, heads=4, seed=fresh_seed())
    res = stitch(model, shapes={"batch": [4], "seq": [64]})
    ops = [n.op_type for n in res.model.graph.node]
    assert ops.count("MatMul") == 1 and "Slice" not in ops, ops
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3, "seq": 50})
    expected = ref(feeds)
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    got = run_gpu(res.model, feeds, [e.astype(npd) for e in expected])
    for g, e in zip(got, expected):
        assert np.asarray(g).dtype == npd
        assert_matches_reference(g, e, True, f"{tail} {sizes}")
