"""Kernel packing on the GPU (marker `gpu`): BERT's Q, K and V projection tails in one kernel
(vector stores, the shared-memory tile and the element path side by side), against an
independent float64 numpy reference on fresh random inputs, float32 within 1e-5 and float16
within 1e-2 (relative norm error), outputs poisoned first."""
from __future__ import annotations

import pytest
from onnx import TensorProto as TP

from ..layout_models import QKV_PERMS, attention_projections
from .test_rows_gpu import _check_gpu

pytestmark = pytest.mark.gpu

PERMS = {"qkv": QKV_PERMS, "same": ((0, 2, 1, 3),) * 3, "two-keys": ((0, 2, 3, 1), (0, 2, 3, 1))}


# head_dim 64: whole tiles; 12: whole vectors, partial tiles; 5: vectors split (element path).
@pytest.mark.parametrize("perms", PERMS.values(), ids=PERMS.keys())
@pytest.mark.parametrize("heads,head_dim", [(12, 64), (4, 12), (3, 5)])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("batch,seq", [(8, 128), (2, 33)])
def test_packed_projection_tails_match_float64_numpy(perms, heads, head_dim, dtype, batch, seq) -> None:
    model, ref = attention_projections(heads, head_dim, dtype, perms)
    _check_gpu(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": batch, "seq": seq}, f"packed{perms}")
