"""GEMM epilogues through cuBLASLt on the GPU (marker `gpu`): each chain of tests/gemm_models.py
optimized with `epilogues=True` (verified there against stock ORT CUDA), then run through the
custom op with poisoned outputs against a float64 reference on fresh random inputs: each
epilogue, float32 (TF32) and float16, row counts that are a multiple of nothing, rank-3 A,
Gemm's transposed weight, and CUDA graphs (warm-up, capture, replays with new data).

Tolerances (‖got − want‖ / ‖want‖): TF32 rounds A and B to 10 mantissa bits, about 5e-4 relative
per product at these K, so 2e-3; float16 rounds the inputs, the output and GELU's argument to 11
bits (about 1e-3 relative), so 5e-3 — far below a wrong bias, activation, transpose or layout."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper


from ..gemm_models import Chain, chain_model, feeds, reference
from ..stitching import fresh_seed
from .test_stitched_gpu import replay_under_cuda_graphs, run_gpu, stitch

pytestmark = pytest.mark.gpu

TOLERANCE = {TP.FLOAT: 2e-3, TP.FLOAT16: 5e-3}

# (A's dims before K at run time, the chain); A's leading dims planned at other sizes.
CASES = [
    ((91,), Chain(lead=("m",), k=40, n=72)),
    ((7, 13), Chain(lead=("b", "s"), k=40, n=72, activation="relu")),
    ((7, 13), Chain(lead=("b", "s"), k=64, n=96, activation="gelu_tanh_pow")),
    ((7, 13), Chain(lead=("b", "s"), k=64, n=96, activation="gelu_op")),
    ((5, 37), Chain(lead=("b", "s"), k=48, n=48, residual="before")),
    ((5, 37), Chain(lead=("b", "s"), k=48, n=48, residual="before", activation="gelu_tanh_cube")),
    ((33,), Chain(lead=("m",), k=33, n=75, activation="relu")),  # odd K and N: unaligned rows
    ((91,), Chain(lead=("m",), k=40, n=72, gemm=True, activation="gelu_op")),  # Gemm, weight [N, K]
    ((8, 128), Chain(lead=("b", "s"), k=768, n=3072, activation="gelu_tanh_pow")),  # BERT-base's FFN
    ((8, 128), Chain(lead=("b", "s"), k=3072, n=768, residual="before")),
    # Without a bias (cuBLASLt's DEFAULT, RELU and GELU epilogues), and GPT-2's flattened rows.
    ((7, 13), Chain(lead=("b", "s"), k=64, n=96, biased=False, activation="gelu_tanh_pow")),
    ((5, 37), Chain(lead=("b", "s"), k=48, n=48, biased=False, residual="before")),
    ((91,), Chain(lead=("m",), k=40, n=72, gemm=True, biased=False, residual="before", activation="relu")),
    ((7, 13), Chain(lead=("b", "s"), k=64, n=96, gemm=True, flattened=True, activation="gelu_tanh_pow")),
]
CASES += [(lead, dataclasses.replace(c, dtype=TP.FLOAT16)) for lead, c in CASES if c.k % 8 == 0]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def stitched(c: Chain):
    """The chain optimized with epilogues: one gemm group, verified on the GPU."""
    res = stitch(chain_model(c), epilogues=True, shapes={"m": [64], "b": [4], "s": [16]})
    assert [g.scheme for g in res.report.plan.groups] == ["gemm"] and not res.report.dropped
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    return res


@pytest.mark.parametrize("lead,c", CASES, ids=[f"{c.id}@{'x'.join(map(str, lead))}" for lead, c in CASES])
def test_epilogue_matches_float64(lead: tuple[int, ...], c: Chain) -> None:
    res = stitched(c)
    given = feeds(c, lead, np.random.default_rng(fresh_seed()))
    want = reference(c, chain_model(c), given)
    (got,) = run_gpu(res.model, given, [want.astype(given["a"].dtype)])
    assert relative_error(got, want) <= TOLERANCE[c.dtype]


@pytest.mark.parametrize("c", [Chain(lead=("b", "s"), k=64, n=96, activation="gelu_tanh_pow"),
                               Chain(lead=("b", "s"), k=64, n=64, dtype=TP.FLOAT16, residual="before")],
                         ids=lambda c: c.id)
def test_epilogue_under_cuda_graphs(c: Chain) -> None:
    check_under_cuda_graphs(c, stitched(c).model)


def check_under_cuda_graphs(c: Chain, model) -> None:
    """`model` (chain `c` stitched) replayed in CUDA graphs on new data against float64."""
    rng = np.random.default_rng(fresh_seed())
    lead = (3, 29)

    def check(run: int, given: dict, got: np.ndarray) -> None:
        assert relative_error(got, reference(c, chain_model(c), given)) <= TOLERANCE[c.dtype], f"run {run}"

    replay_under_cuda_graphs(model, lambda: feeds(c, lead, rng),
                             ("y", lead + (c.n,), helper.tensor_dtype_to_np_dtype(c.dtype)), check)


@pytest.mark.parametrize("c", [Chain(lead=("b", "s"), k=768, n=3072, activation="gelu_tanh_pow"),
                               Chain(lead=("b", "s"), k=3072, n=768, dtype=TP.FLOAT16, residual="before")],
                         ids=lambda c: c.id)
def test_heuristic_first_algorithm_matches_float64(c: Chain) -> None:
    # gemm_timed = 0 (the benchmark's baseline) runs cuBLASLt's heuristic's first algorithm
    # instead of the fastest timed one: the same product either way.
    model = stitched(c).model
    (node,) = [n for n in model.graph.node if n.op_type == "FusedKernel"]
    (timed,) = [a for a in node.attribute if a.name == "gemm_timed"]
    assert timed.i == 1
    timed.i = 0
    given = feeds(c, (8, 128), np.random.default_rng(fresh_seed()))
    want = reference(c, chain_model(c), given)
    (got,) = run_gpu(model, given, [want.astype(given["a"].dtype)])
    assert relative_error(got, want) <= TOLERANCE[c.dtype]
