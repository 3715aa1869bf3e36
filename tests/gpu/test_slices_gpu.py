"""Folded Slice/Split on the GPU (marker `gpu`): kernels reading boxes of their inputs, against
an independent float64 numpy reference on fresh random inputs, float32 within 1e-5 and half
precision within 1e-2 (relative norm error), every output element written (outputs are
poisoned first). Sizes cover boxes of whole 16-byte vectors (vector loads), boxes in rows of
odd pitch (element loads), broadcast boxes, and element counts that are not a multiple of
the vector width (the 64-bit scalar entry)."""
from __future__ import annotations

import pytest
from onnx import TensorProto as TP

from ..slice_models import qkv_split, slice_models
from .test_rows_gpu import _check_gpu

pytestmark = pytest.mark.gpu

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16) for cols in (2, 10, 64, 768)
         for name, model, ref in slice_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
@pytest.mark.parametrize("batch,seq", [(4, 7), (3, 128)])
def test_boxed_inputs_match_float64_numpy(name, model, ref, dtype, batch, seq) -> None:
    _check_gpu(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": batch, "seq": seq}, name)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_gpt2_qkv_split_matches_float64_numpy(dtype) -> None:
    model, ref = qkv_split(12, 64, dtype)
    _check_gpu(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 8, "seq": 128}, "gpt2-qkv")
