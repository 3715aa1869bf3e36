"""bfloat16 on the GPU (marker `gpu`): row kernels, layout tails, packed projections and an
elementwise chain with bfloat16 inputs and outputs (float32 inside), against an independent
float64 numpy reference on fresh random inputs within 1e-2 (relative norm error, as float16),
outputs poisoned first; and `optimize` verifies a bfloat16 model on the GPU instead of
skipping it."""
from __future__ import annotations

import pytest
from onnx import TensorProto as TP


from ..layout_models import attention_projections, layout_models
from ..row_models import row_models, trailing_models
from .test_rows_gpu import _check_gpu
from .test_stitched_gpu import stitch

pytestmark = pytest.mark.gpu
BF16 = TP.BFLOAT16

ROWS = [pytest.param(name, model, ref, id=f"{name}-c{cols}")
        for cols in (7, 768, 1000) for name, model, ref in row_models(3, cols, dtype=BF16)]
ROWS += [pytest.param(name, model, ref, id=f"{name}-c300") for name, model, ref in trailing_models(300, dtype=BF16)]


@pytest.mark.parametrize("name,model,ref", ROWS)
def test_bfloat16_row_kernel_matches_float64_numpy(name, model, ref) -> None:
    _check_gpu(model, ref, BF16, {"batch": [5]}, {"batch": 5}, name)


LAYOUT = [pytest.param(name, model, ref, id=f"{name}-c{cols}") for cols in (10, 64)
          for name, model, ref in layout_models(cols, BF16)]


@pytest.mark.parametrize("name,model,ref", LAYOUT)
def test_bfloat16_layout_tail_matches_float64_numpy(name, model, ref) -> None:
    _check_gpu(model, ref, BF16, {"batch": [8], "seq": [128]}, {"batch": 3, "seq": 33}, name)


@pytest.mark.parametrize("heads,head_dim", [(12, 64), (3, 5)])
def test_bfloat16_packed_projections_match_float64_numpy(heads, head_dim) -> None:
    model, ref = attention_projections(heads, head_dim, BF16)
    _check_gpu(model, ref, BF16, {"batch": [8], "seq": [128]}, {"batch": 2, "seq": 40}, "packed-bf16")


def test_optimize_verifies_a_bfloat16_model_on_the_gpu() -> None:
    _, model, _ = next(c for c in row_models(3, 768, dtype=BF16) if c[0] == "LayerNormalization")
    res = stitch(model, shapes={"batch": [5]})
    v = res.report.verification
    assert v is not None and v.device == "gpu" and not v.skipped, v
    assert v.tensors_checked >= 1 and v.worst_relative_error < 5e-2
