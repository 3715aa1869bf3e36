"""Generated GEMMs (schemes/gemm/generated.py) on the GPU (marker `gpu`): exact-GELU chains of
tests/gemm_models.py (as exporters write it and as the Gelu op) optimized with --arch sm_90
--generated-gemms on (verified there against stock ORT CUDA), run through the custom op with
poisoned outputs against a float64 reference on fresh random inputs: row counts that are a
multiple of nothing, rank-3 A, BERT's and a LLaMA layer's widths, and CUDA graphs; and chains
cuBLASLt runs, whose nodes carry a generated GEMM beside it (float32 on a K-major weight, half on
the weight as stored), each library forced through gemm_library and the timed choice. Skipped
where the GPU is not of compute capability 9.0 or nvcc and CUTLASS are not here. Tolerances as
tests/gpu/test_gemm_gpu.py's."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper

from onnxstitch.schemes.gemm import generated

from ..gemm_models import Chain, chain_model, feeds, reference
from ..stitching import fresh_seed
from .test_gemm_gpu import TOLERANCE, check_under_cuda_graphs, relative_error
from .test_stitched_gpu import run_gpu, stitch

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("generated-gemm")]  # (one worker: nvcc builds once)

CASES = [
    ((7, 13), Chain(lead=("b", "s"), k=64, n=96, activation="gelu_erf")),
    ((91,), Chain(lead=("m",), k=64, n=136, activation="gelu_erf")),
    ((8, 128), Chain(lead=("b", "s"), k=768, n=3072, activation="gelu_erf")),  # BERT-base's FFN
    ((4, 77), Chain(lead=("b", "s"), k=2048, n=5632, activation="gelu_erf_op")),
]


@pytest.fixture(scope="module", autouse=True)
def hopper() -> None:
    if generated.local_sm_count() is None:
        pytest.skip("the GPU is not of compute capability 9.0")
    if isinstance(why := generated.toolchain(), str):
        pytest.skip(why)


def stitched(c: Chain, mode: str = "on"):
    """The chain optimized with generated GEMMs (`mode`: on or all): one gemm group carrying one,
    verified on the GPU."""
    res = stitch(chain_model(c), archs=("sm_90",), generated_gemms=mode, shapes={"m": [64], "b": [4], "s": [16]})
    groups = res.report.plan.groups
    assert [g.scheme for g in groups] == ["gemm"] and groups[0].payload.generated is not None, res.report.epilogues
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    return res


@pytest.mark.parametrize("lead,c", CASES, ids=[f"{c.id}@{'x'.join(map(str, lead))}" for lead, c in CASES])
def test_generated_gemm_matches_float64(lead: tuple[int, ...], c: Chain) -> None:
    model = stitched(c).model
    given = feeds(c, lead, np.random.default_rng(fresh_seed()))
    want = reference(c, chain_model(c), given)
    (got,) = run_gpu(model, given, [want.astype(given["a"].dtype)])
    assert relative_error(got, want) <= TOLERANCE[c.dtype]


def test_generated_gemm_under_cuda_graphs() -> None:
    c = Chain(lead=("b", "s"), k=64, n=96, activation="gelu_erf")
    check_under_cuda_graphs(c, stitched(c).model)


BESIDE = [
    ((91,), Chain(lead=("m",), k=64, n=136, residual="before")),
    ((8, 128), Chain(lead=("b", "s"), k=768, n=768, residual="before")),  # BERT-base's output projection
    ((7, 13), Chain(lead=("b", "s"), k=64, n=96, dtype=TP.FLOAT16)),
    ((8, 128), Chain(lead=("b", "s"), k=3072, n=768, dtype=TP.FLOAT16, residual="before")),
    ((4, 77), Chain(lead=("b", "s"), k=2048, n=2048, dtype=TP.FLOAT16, biased=False, residual="before")),  # LLaMA's
]


def forced(model: onnx.ModelProto, library: int) -> onnx.ModelProto:
    """`model` with its gemm nodes' gemm_library set (0 timed, 1 cuBLASLt, 2 the generated GEMM)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if any(a.name == "gemm_epilogue" for a in node.attribute):
            node.attribute.append(helper.make_attribute("gemm_library", library))
    return out


@pytest.mark.parametrize("library", [0, 1, 2], ids=["timed", "cublaslt", "generated"])
@pytest.mark.parametrize("lead,c", BESIDE, ids=[f"{c.id}@{'x'.join(map(str, lead))}" for lead, c in BESIDE])
def test_a_generated_gemm_beside_cublaslt_matches_float64(lead: tuple[int, ...], c: Chain, library: int) -> None:
    model = forced(stitched(c, "all").model, library)
    given = feeds(c, lead, np.random.default_rng(fresh_seed()))
    want = reference(c, chain_model(c), given)
    (got,) = run_gpu(model, given, [want.astype(given["a"].dtype)])
    assert relative_error(got, want) <= TOLERANCE[c.dtype]
