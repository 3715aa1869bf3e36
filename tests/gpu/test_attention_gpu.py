"""Attention kernels on the GPU (marker `gpu`): each core of tests/attention_models.py
optimized as the pipeline does (verified there against stock ORT CUDA at TF32's accuracy),
then run through the custom op with poisoned outputs against a float64 reference on fresh
random inputs. TF32 rounds both products' inputs to 10 mantissa bits: about 5e-4 relative,
so 2e-3 is four times the expected error and far below a wrong mask, scale or layout.

float16 and bfloat16 cores (m16n8k16, probabilities in registers) run the same way with inputs
of their type, verified by optimize against stock ORT CUDA at half precision's tolerance, and
held here to tests/test_attention_host.py's HALF_TOLERANCE against float64 (derived there)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto as TP


from ..attention_models import (CORES, PROJECTED, SDPA, Core, Decoder, Projected, Sdpa, core_feeds, core_model,
                                core_reference, decoder_feeds, decoder_model, decoder_reference, np_dtype,
                                projected_feeds, projected_model, projected_reference, relative_error, sdpa_feeds,
                                sdpa_model, sdpa_reference)
from ..stitching import fresh_seed
from ..test_attention_host import HALF_TOLERANCE, HALVES
from .test_stitched_gpu import replay_under_cuda_graphs, run_gpu, stitch

pytestmark = pytest.mark.gpu

TF32_REFERENCE_TOLERANCE = 2e-3


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.id)
def test_attention_kernel_matches_float64(core) -> None:
    res = stitch(core_model(core))
    assert [grp.tf32 for grp in res.report.plan.groups] == [True] and not res.report.dropped
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    feeds = core_feeds(core, np.random.default_rng(fresh_seed()))
    want = core_reference(core, feeds)
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32)])
    assert relative_error(got, want) <= TF32_REFERENCE_TOLERANCE


def test_attention_kernel_at_another_sequence_length() -> None:
    # Planned at 128, run at 77: sequence lengths are runtime values.
    core = CORES[0]
    res = stitch(core_model(core, seq="seq"), shapes={"seq": [128]})
    assert [grp.tf32 for grp in res.report.plan.groups] == [True]
    other = type(core)(core.lead, 77, 77, core.d, (core.lead[0], 1, 1, 77))
    feeds = core_feeds(other, np.random.default_rng(fresh_seed()))
    want = core_reference(other, feeds)
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32)])
    assert relative_error(got, want) <= TF32_REFERENCE_TOLERANCE


@pytest.mark.parametrize("p", PROJECTED, ids=lambda p: p.id)
def test_projected_attention_kernel_matches_float64(p: Projected) -> None:
    # q, kᵀ and v read from their projections' outputs, biases added by the kernel.
    rng = np.random.default_rng(fresh_seed())
    model = projected_model(p, rng)
    res = stitch(model)
    assert [grp.tf32 for grp in res.report.plan.groups if grp.tf32] == [True] and not res.report.dropped
    (kernel,) = [k for k in res.report.kernels if k["scheme"] == "attention"]
    assert kernel["heads"] == p.core.lead[1] and kernel["biases"] == p.biased
    feeds = projected_feeds(p, rng)
    want = projected_reference(p, model, feeds)
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32)])
    assert relative_error(got, want) <= TF32_REFERENCE_TOLERANCE


def test_projected_attention_kernel_at_another_sequence_length() -> None:
    p = PROJECTED[0]
    rng = np.random.default_rng(fresh_seed())
    model = projected_model(p, rng, seq="seq")
    res = stitch(model, shapes={"seq": [128]})
    assert any(k["scheme"] == "attention" and k.get("heads") for k in res.report.kernels)
    other = Projected(type(p.core)(p.core.lead, 77, 77, p.core.d, (p.core.lead[0], 1, 77, 77)))
    feeds = projected_feeds(other, rng)
    want = projected_reference(other, model, feeds)
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32)])
    assert relative_error(got, want) <= TF32_REFERENCE_TOLERANCE


@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_sdpa_attention_kernel_matches_float64(s: Sdpa) -> None:
    # transformers' SDPA forms (issue 22); with the NaN guard and -inf fills, rows that attend
    # to nothing must come out exactly 0.
    res = stitch(sdpa_model(s))
    assert [grp.scheme for grp in res.report.plan.groups].count("attention") == 1 and not res.report.dropped
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    blank = s.guard and s.core.mask is not None and s.fill == -np.inf
    feeds = sdpa_feeds(s, np.random.default_rng(fresh_seed()), blank_rows=blank)
    want = sdpa_reference(s, feeds)
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32)])
    assert np.isfinite(got).all() and relative_error(got, want) <= TF32_REFERENCE_TOLERANCE
    if blank:
        zeros = (want == 0).all(-1)
        assert zeros.any() and (got[zeros] == 0).all()


def _typed(x, dtype: str):
    """A core, projected core or SDPA form with its core in `dtype`."""
    core = dataclasses.replace(x.core if not isinstance(x, Core) else x, dtype=HALVES[dtype])
    return core if isinstance(x, Core) else dataclasses.replace(x, core=core)


def _half_on_gpu(model, feeds: dict, want: np.ndarray, dtype: str) -> tuple[dict, np.ndarray]:
    """(the attention kernel's report entry, the context) of `model` optimized (one half kernel,
    verified on the GPU) and run on `feeds`; the context within HALF_TOLERANCE of `want`."""
    res = stitch(model)
    groups = [grp for grp in res.report.plan.groups if grp.scheme == "attention"]
    assert len(groups) == 1 and not groups[0].tf32 and not res.report.dropped
    (kernel,) = [k for k in res.report.kernels if k["scheme"] == "attention"]
    assert kernel["dtype"] == dtype
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    typed = next(iter(feeds.values())).dtype
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32).astype(typed)])
    assert got.dtype == typed and relative_error(got, want) <= HALF_TOLERANCE[HALVES[dtype]]
    return kernel, got.astype(np.float64)


# BERT's core, ragged tiles with a per-row mask, few queries against long keys, rank 3 with a
# broadcast mask, head size 128, head size 8 (a padded 16-wide slice), T5's bias.
HALF_CORES = [CORES[0], CORES[1], CORES[2], CORES[3], CORES[4], CORES[6], CORES[7], CORES[8], CORES[9]]


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("core", HALF_CORES, ids=lambda c: c.id)
def test_half_attention_kernel_matches_float64(core: Core, dtype: str) -> None:
    core = _typed(core, dtype)
    feeds = core_feeds(core, np.random.default_rng(fresh_seed()))
    _half_on_gpu(core_model(core), feeds, core_reference(core, feeds), dtype)


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("p", PROJECTED, ids=lambda p: p.id)
def test_half_projected_attention_kernel_matches_float64(p: Projected, dtype: str) -> None:
    p = _typed(p, dtype)
    rng = np.random.default_rng(fresh_seed())
    model = projected_model(p, rng)
    feeds = projected_feeds(p, rng)
    kernel, _ = _half_on_gpu(model, feeds, projected_reference(p, model, feeds), dtype)
    assert kernel["heads"] == p.core.lead[1] and kernel["biases"] == p.biased


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_half_sdpa_attention_kernel_matches_float64(s: Sdpa, dtype: str) -> None:
    s = _typed(s, dtype)
    blank = s.guard and s.core.mask is not None and s.fill == -np.inf
    feeds = sdpa_feeds(s, np.random.default_rng(fresh_seed()), blank_rows=blank)
    want = sdpa_reference(s, feeds)
    _, got = _half_on_gpu(sdpa_model(s), feeds, want, dtype)
    assert np.isfinite(got).all()
    if blank:
        zeros = (want == 0).all(-1)
        assert zeros.any() and (got[zeros] == 0).all()


# Decoder forms (issue 22): grouped KV heads and causal masks in the kernel, float32 and
# float16; selected alone by `-k "gqa or causal"`.
DECODERS = [Decoder(2, 6, 3, 128, 128, 64, "dynamo", padding="input"),  # Qwen2-style prefill, left padding
            Decoder(2, 8, 2, 1, 1024, 64, "ts"),  # a decode step against a long cache
            Decoder(1, 14, 7, 16, 300, 64, "dynamo", padding="computed"),  # combined mask read, tiles skipped
            Decoder(2, 4, 2, 70, 70, 32, "ts", causal=False),  # grouped heads alone
            Decoder(4, 32, 8, 1, 4096, 128, "dynamo"),  # decode form: one token against a 4k cache
            Decoder(2, 8, 8, 2, 1000, 64, "ts", padding="input")]  # decode form, 16 rows, padding
DECODERS += [dataclasses.replace(c, dtype=TP.FLOAT16) for c in DECODERS]


@pytest.mark.parametrize("c", DECODERS, ids=lambda c: c.id)
def test_gqa_causal_kernel_matches_float64(c: Decoder) -> None:
    res = stitch(decoder_model(c))
    (kernel,) = [k for k in res.report.kernels if k["scheme"] == "attention"]
    assert (kernel["kv_group"], kernel["causal"]) == (c.group, c.causal) and not res.report.dropped
    # The split-KV decode form where a step's rows fit it (chosen by cost: so at these sizes).
    assert bool(kernel["decode_rows"]) == (c.group * c.sq <= 16)
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    feeds = decoder_feeds(c, np.random.default_rng(fresh_seed()))
    want = decoder_reference(c, feeds)
    (got,) = run_gpu(res.model, feeds, [want.astype(np_dtype(c.dtype))])
    tolerance = HALF_TOLERANCE.get(c.dtype, TF32_REFERENCE_TOLERANCE)
    assert relative_error(got.astype(np.float64), want) <= tolerance


@pytest.mark.parametrize("sq", [1, 70])
@pytest.mark.parametrize("dtype", list(HALVES))
def test_upcast_sdpa_kernel_matches_float64(dtype: str, sq: int) -> None:
    # TorchScript's SDPA in a half model (float32 terms and context): tiled and decode forms.
    s = Sdpa(Core((2, 3), sq, 300, 64, (2, 1, 1, 300), dtype=HALVES[dtype]), exporter="ts", upcast=True)
    feeds = sdpa_feeds(s, np.random.default_rng(fresh_seed()), blank_rows=True)
    want = sdpa_reference(s, feeds)
    res = stitch(sdpa_model(s))
    (kernel,) = [k for k in res.report.kernels if k["scheme"] == "attention"]
    assert kernel["upcast"] and bool(kernel["decode_rows"]) == (sq == 1) and not res.report.dropped
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    (got,) = run_gpu(res.model, feeds, [want.astype(np.float32)])
    assert got.dtype == np.float32 and relative_error(got, want) <= HALF_TOLERANCE[HALVES[dtype]]


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_decode_form_under_cuda_graphs(dtype: int) -> None:
    # The decode form allocates its partials from ORT's allocator in each Compute: captured once,
    # then replayed with new data in the same buffers.
    c = Decoder(2, 8, 4, 1, 700, 64, "dynamo", causal=False, dtype=dtype)
    res = stitch(decoder_model(c))
    (kernel,) = [k for k in res.report.kernels if k["scheme"] == "attention"]
    assert kernel["decode_rows"] and not res.report.dropped
    rng = np.random.default_rng(fresh_seed())
    tolerance = HALF_TOLERANCE.get(dtype, TF32_REFERENCE_TOLERANCE)

    def check(run: int, given: dict, got: np.ndarray) -> None:
        assert relative_error(got.astype(np.float64), decoder_reference(c, given)) <= tolerance, f"run {run}"

    replay_under_cuda_graphs(res.model, lambda: decoder_feeds(c, rng),
                             ("y", (c.b, c.sq, c.heads, c.d), np_dtype(dtype)), check)
