"""Register budget of the rows scheme: the generated row kernels of long rows and of groups
with many per-element inputs compile without (more than a few bytes of) register spills, as
ptxas reports them for sm_90 (`nvcc -Xptxas -v`; skipped where nvcc is missing). Before the
budget, float16 × 65536 columns spilled 2.6 KB per thread and 16 float32 inputs × 8192
columns 6 KB."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from onnx import TensorProto as TP

from onnxstitch import plan
from onnxstitch.pipeline import generate_kernel

from .row_models import many_input_rows, row_models
from .stitching import prepared

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (ptxas) for register counts")

SMALL_SPILL = 128  # bytes per thread: ptxas leaves a few at the budget's edge (LayerNorm f16 × 16384: 68)


def _models():
    for dt in (TP.FLOAT, TP.FLOAT16):
        name = TP.DataType.Name(dt).lower()
        for cols in (16384, 32768, 65536):
            for op, model, _ in row_models(3, cols, dtype=dt):
                if op in ("Softmax", "LayerNormalization"):
                    yield f"{op}-{cols}-{name}", model
        for n in (8, 16):
            yield f"{n}-inputs-8192-{name}", many_input_rows(n, 8192, dt)[0]


MODELS = list(_models())


def _spills(source: str, tmp_path) -> list[int]:
    path = tmp_path / "k.cu"
    path.write_text(source)
    out = subprocess.run(["nvcc", "-std=c++17", "--cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"),
                          str(path)], capture_output=True, text=True, check=True).stderr
    return [int(b) for b in re.findall(r"(\d+) bytes spill stores", out)]


@pytest.mark.parametrize("name,model", MODELS, ids=[m[0] for m in MODELS])
def test_row_kernels_stay_within_the_register_budget(name, model, tmp_path) -> None:
    _, g = prepared(model)
    for grp in plan.make_plan(g).groups:
        spills = _spills(generate_kernel(g, "k", grp).source, tmp_path)
        assert spills and max(spills) <= SMALL_SPILL, f"{name}: {spills} bytes of spill stores"
