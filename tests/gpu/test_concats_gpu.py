"""Stitched Concat on the GPU (marker `gpu`): kernels reading their inputs in windows of the
Concat's output, against an independent float64 numpy reference on fresh random inputs,
float32 within 1e-5 and half precision within 1e-2 (relative norm error), every output element
written (outputs are poisoned first). Sizes cover windows along the last axis (LLaMA's rotary
embedding over boxes of one tensor), a middle and the first axis (symbolic inner dims), and
element counts that are not a multiple of the vector width (the 64-bit scalar entry)."""
from __future__ import annotations

import pytest
from onnx import TensorProto as TP

from ..concat_models import concat_models, rope
from .test_rows_gpu import _check_gpu

pytestmark = pytest.mark.gpu

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16) for cols in (2, 10, 64, 768)
         for name, model, ref in concat_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
@pytest.mark.parametrize("batch,seq", [(4, 7), (3, 128)])
def test_windowed_inputs_match_float64_numpy(name, model, ref, dtype, batch, seq) -> None:
    _check_gpu(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": batch, "seq": seq}, name)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_llama_rope_matches_float64_numpy(dtype) -> None:
    model, ref = rope(32, 128, dtype)
    _check_gpu(model, ref, dtype, {"batch": [2], "seq": [256]}, {"batch": 2, "seq": 256}, "llama-rope")
