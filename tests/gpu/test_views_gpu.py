"""Layout folding on the GPU (marker `gpu`): elementwise work written through Reshape/Transpose
views, against an independent float64 numpy reference on fresh random inputs, float32 within
1e-5 and float16 within 1e-2 (relative norm error), every output element written (outputs are
poisoned first). Sizes cover whole 16-byte vectors, rows that split vectors (the scalar
store path) and element counts that are not a multiple of the vector width (the 64-bit
scalar entry)."""
from __future__ import annotations

import itertools

import pytest
from onnx import TensorProto as TP

from ..layout_models import attention_split, layout_models
from .test_rows_gpu import _check_gpu

pytestmark = pytest.mark.gpu

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16) for cols in (2, 10, 64, 768)
         for name, model, ref in layout_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
@pytest.mark.parametrize("batch,seq", [(4, 7), (3, 128)])
def test_layout_tail_matches_float64_numpy(name, model, ref, dtype, batch, seq) -> None:
    _check_gpu(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": batch, "seq": seq}, name)


PERMS = [p for p in itertools.permutations(range(4)) if p != (0, 1, 2, 3)]


# head_dim 64: whole tiles (views that move the innermost axis go through shared memory);
# 12 and 24: whole vectors, partial tiles; 5: vectors split, the element-by-element path.
@pytest.mark.parametrize("perm", PERMS, ids=lambda p: "".join(map(str, p)))
@pytest.mark.parametrize("heads,head_dim", [(12, 64), (3, 5), (4, 12), (2, 24)])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_every_permutation_of_an_attention_split(perm, heads, head_dim, dtype) -> None:
    model, ref = attention_split(heads, head_dim, perm, dtype)
    _check_gpu(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 2, "seq": 33}, f"perm{perm}")
