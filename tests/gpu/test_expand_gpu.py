"""Expand stitched into kernels on the GPU (marker `gpu`): an attention mask expanded to the
scores' runtime shape inside the Softmax row kernel, and a bias expanded by a constant shape
inside an elementwise kernel, against float64 numpy on fresh random inputs (float32 within
1e-5, float16 within 1e-2, relative norm error; outputs poisoned first)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import numpy_helper

from ..test_expand import masked_softmax, scaled_bias
from .test_rows_gpu import _check_gpu

pytestmark = pytest.mark.gpu

DTYPES = pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])


@DTYPES
@pytest.mark.parametrize("batch,seq", [(2, 16), (3, 130)])
def test_expanded_mask_softmax_matches_float64_numpy(dtype, batch, seq) -> None:
    def ref(f):
        a = f["scores"].astype(np.float64) + f["mask"].astype(np.float64)
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return [e / e.sum(axis=-1, keepdims=True)]

    _check_gpu(masked_softmax(dtype), ref, dtype, {"batch": [2], "seq": [16]}, {"batch": batch, "seq": seq}, "mask")


@DTYPES
def test_expanded_bias_matches_float64_numpy(dtype) -> None:
    model = scaled_bias(dtype)
    bias = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    _check_gpu(model, lambda f: [np.maximum(f["x"].astype(np.float64) * bias, 0)], dtype, {}, {}, "bias")
