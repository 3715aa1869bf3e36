"""The attention kernel (schemes/attention/codegen.py) run on the CPU (tests/host_kernels.py,
with the host forms of its TF32 mma.sync in tests/host_cuda.h), launched as the scheme's
runtime launch (schemes/attention/launch.cc) does, against an independent float64 numpy reference of
softmax(q·kᵀ·scale + mask)·v on fresh random inputs: within 2e-3 relative norm error (TF32
products; about 5e-4 in practice), every output element written (outputs are poisoned first).

The cases walk whole and ragged tiles of queries and keys (64 each), cross attention, head sizes
16, 32 and 64, masks broadcast over heads, rows or batches (and none), rank-3 operands,
the context stored transposed to [b, s, h, d] or not, T5's position bias before a mask, and
BERT's padding mask (-3.4e38 on some keys, a whole tile of keys masked in one case) whose keys
must get no weight: their rows of v are then overwritten with 1e4 and the context must not
change. Each case runs the default kernel and the variants scripts/bench_attention.py compares.

transformers' SDPA forms (attention_models.Sdpa, both exporters) run the same way: q and kᵀ
scaled before the product (one folded scale in the kernel), additive masks made by Where,
boolean masks on the scores (kept where true or where false, filled with -inf or float32's
minimum), and the NaN guard: rows whose every key is masked with -inf give exactly 0 with the
guard, NaN without it (as ONNX Runtime's Softmax).

float16 and bfloat16 (schemes/attention/flavors.py: m16n8k16 products, float32 Softmax,
probabilities kept in registers as the second product's operand) run the same cases, forms
and projections with inputs of that type. The reference is computed in float64 from those
inputs, so what separates the kernel from it is what the kernel rounds: the probabilities
(each to the type) and the context (to the type), each a relative rounding error uniform
within ±u (u = 2^-11 for float16, 2^-8 for bfloat16: RMS u/√3), independent from key to key
and element to element, so the context's relative norm error is about √2·u/√3 ≈ 0.8u:
4e-4 for float16, 3.2e-3 for bfloat16 (float32 accumulation and ex2.approx add ~1e-6).
Projected cores also round q, kᵀ and v once more (the bias added in float32, rounded back, as
ONNX Runtime's Add in that type does): about 1.3u. HALF_TOLERANCE is 2e-3 for float16 (5u,
4× the worst expected) and 1e-2 for bfloat16 (2.6u); a kernel with its probabilities' pairs
or V's pairs swapped is tested to fail them."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP

from onnxstitch.schemes.attention import codegen as codegen_attention

from .attention_models import (PROJECTED, SDPA, Core, Projected, Sdpa, attention_graph, cast, core_feeds, core_model,
                               core_reference, lowest, np_dtype, projected_feeds, projected_model, projected_reference,
                               projected_values, relative_error, sdpa_feeds, sdpa_inputs, sdpa_model, sdpa_reference)
from .host_kernels import HAVE_GXX, launch
from .stitching import fresh_seed

pytestmark = pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")

TOLERANCE = 2e-3
HALF_TOLERANCE = {TP.FLOAT16: 2e-3, TP.BFLOAT16: 1e-2}
HALVES = {"float16": TP.FLOAT16, "bfloat16": TP.BFLOAT16}
BERT_MASKED = -3.4e38  # clamped to the type's lowest (float16: -65504)


def tolerance(dtype: int) -> float:
    return HALF_TOLERANCE.get(dtype, TOLERANCE)


def poisoned(shape: tuple[int, ...], dtype: int) -> np.ndarray:
    """NaN everywhere (every element must be written), of the ONNX element type."""
    return np.full(shape, np.nan, np_dtype(dtype))


def finite(x: np.ndarray) -> bool:
    return bool(np.isfinite(x.astype(np.float64)).all())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("host-attention")


@dataclass(frozen=True)
class Case:
    core: Core
    padding: bool = False  # BERT's padding mask: 0, or -3.4e38 on the masked keys
    masked_tile: bool = False  # padding: the first 128 keys (a whole tile) masked in batch 0


CASES = {
    # BERT: whole tiles, a [b, 1, 1, s] padding mask, the context transposed to [b, s, h, d].
    "bert_64": Case(Core((2, 2), 64, 64, 64, (2, 1, 1, 64)), padding=True),
    "ragged_70_rows_mask": Case(Core((2, 1), 70, 70, 64, (2, 1, 70, 70), transposed=False)),
    "few_queries_long_keys_transposed": Case(Core((1, 2), 5, 130, 32, None)),
    "cross_70x40_head_mask": Case(Core((1, 2), 70, 40, 16, (1, 2, 70, 40), transposed=False)),
    # (Tiles of 64 or 128 keys, as codegen_attention chooses: these sizes are whole, ragged and
    # several tiles under either.)
    "padding_masks_a_whole_tile": Case(Core((2, 1), 20, 200, 16, (2, 1, 1, 200), transposed=False), padding=True,
                                       masked_tile=True),
    "two_whole_key_tiles": Case(Core((1, 2), 16, 256, 16, (1, 2, 16, 256), transposed=False)),
    "rank3_mask": Case(Core((3,), 33, 70, 16, (3, 1, 70), transposed=False)),
    "rank3_no_mask": Case(Core((3,), 70, 64, 32, None, transposed=False)),
    "t5_position_bias_then_padding": Case(Core((2, 2), 70, 70, 32, (2, 1, 1, 70), bias=(1, 2, 70, 70)), padding=True),
    "bias_alone": Case(Core((1, 2), 20, 33, 16, None, bias=(20, 33))),
    # Values wider than the keys, as LeViT's (keys 16 wide, values 32 or 64; a learned bias per
    # head added to the scores), and narrower, ragged.
    "levit_values_twice_keys": Case(Core((2, 4), 49, 49, 16, (4, 49, 49), dv=32)),
    "levit_values_4x_few_queries": Case(Core((2, 2), 16, 49, 16, (2, 1, 1, 49), dv=64), padding=True),
    "values_narrower_ragged": Case(Core((1, 2), 70, 90, 32, None, transposed=False, dv=16)),
}


def generated(model: onnx.ModelProto, options: codegen_attention.AttentionOptions = codegen_attention.AttentionOptions()):
    """(the chain attention.find matches, its kernel source), the graph built as the pipeline does."""
    g, found = attention_graph(model)
    assert len(found.matches) == 1, found.refusals
    match = found.matches[0]
    return match, codegen_attention.generate(g, "stitch_h0", match, options)


def feeds_for(c: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random operands; a padding case's mask as BERT's: each batch keeps its first keys and
    pads the rest with -3.4e38 (the type's lowest; some keys in the middle too), every row
    keeping a key."""
    feeds = core_feeds(c.core, rng, masked=None)
    if c.padding:
        masked = max(BERT_MASKED, lowest(c.core.dtype))
        mask = np.zeros(c.core.mask, np.float32)
        for b in range(mask.shape[0]):
            mask[b, ..., rng.integers(1, c.core.sk) if c.core.sk > 1 else 1:] = masked
        mask[..., rng.integers(0, c.core.sk, 3)] = masked
        mask[..., 0] = 0
        if c.masked_tile:  # batch 0 keeps only its last key
            mask[0, ..., :128] = masked
            mask[0, ..., -1] = 0
        feeds["mask"] = cast(mask, c.core.dtype)
    return feeds


# The default kernel, and the variants scripts/bench_attention.py compares.
OPTIONS = {"default": codegen_attention.AttentionOptions(),
           "tf32-at-fragments": codegen_attention.AttentionOptions(staged_tf32=False),
           "tf32-staged": codegen_attention.AttentionOptions(staged_tf32=True),
           "keys-128": codegen_attention.AttentionOptions(keys=128),
           # the half kernels' B fragments as shared-load pairs, masks read per score from memory
           "pairs-unstaged-masks": codegen_attention.AttentionOptions(ldmatrix=False, staged_masks=False),
           # ldmatrix whatever the key count (by default only where K is staged a vector at a time)
           "ldmatrix": codegen_attention.AttentionOptions(ldmatrix=True)}


@pytest.mark.parametrize("variant", list(OPTIONS))
@pytest.mark.parametrize("name", list(CASES))
def test_attention_kernel_matches_float64(name, variant, folder) -> None:
    check_case(name, CASES[name], OPTIONS[variant], folder)


def check_case(name: str, c: Case, options: codegen_attention.AttentionOptions, folder, edit=None) -> None:
    """Case `c`'s kernel (its source passed through `edit` when given) against float64 within
    the tolerance of its type; with padding, again with the masked keys' values made huge."""
    core = c.core
    match, src = generated(core_model(core), options)
    if edit is not None:
        src = dataclasses.replace(src, source=edit(src.source))
    terms = (core.bias is not None) + (core.mask is not None)
    assert (match.head_dim, len(match.masks), match.transposed) == (core.d, terms, core.transposed)
    assert src.shape_rule == "attention" and src.spec.head_size == core.d and src.spec.dtype == core.dtype
    assert src.spec.value_size == (0 if core.dv in (None, core.d) else core.dv) and match.values == core.values
    seed = fresh_seed()
    feeds = feeds_for(c, np.random.default_rng(seed))
    ins = [feeds[t] for t in src.inputs]
    expected = core_reference(core, feeds)
    got = poisoned(expected.shape, core.dtype)
    launch(src, ins, [got], folder)
    assert finite(got), f"{name} (seed {seed}): elements not written or not finite"
    err = relative_error(got, expected)
    assert err <= tolerance(core.dtype), f"{name} (seed {seed}): relative error {err:.2e}"
    if c.padding:
        # Keys under the type's lowest take no weight: v's rows there can be anything.
        masked = (feeds["mask"].astype(np.float64) == lowest(core.dtype) if core.dtype != TP.FLOAT else
                  feeds["mask"] == np.float32(BERT_MASKED))[:, 0, 0, :]  # [b, sk]
        noisy = [x.copy() for x in ins]
        noisy[2][np.broadcast_to(masked[:, None, :], noisy[2].shape[:-1])] = 1e4
        again = poisoned(expected.shape, core.dtype)
        launch(src, noisy, [again], folder)
        err = relative_error(again, expected)
        assert err <= tolerance(core.dtype), f"{name} (seed {seed}): masked keys weigh in, relative error {err:.2e}"


# Half precision: BERT's padding with a whole masked tile, ragged tiles, cross attention, a T5
# bias, rank-3 operands, and head sizes 8 and 24 (a 16-wide slice half padded) and 128.
HALF_CASES = {name: CASES[name] for name in ("bert_64", "ragged_70_rows_mask", "few_queries_long_keys_transposed",
                                             "cross_70x40_head_mask", "padding_masks_a_whole_tile", "rank3_mask",
                                             "t5_position_bias_then_padding")} | {
    "head_8": Case(Core((2, 2), 33, 65, 8, (2, 2, 33, 65), transposed=False)),
    "head_24_padded_slice": Case(Core((1, 3), 40, 70, 24, (1, 1, 1, 70)), padding=True),
    "head_128": Case(Core((1, 2), 64, 64, 128, None, transposed=False)),
    "levit_values_twice_keys": CASES["levit_values_twice_keys"],
    "levit_values_4x_few_queries": CASES["levit_values_4x_few_queries"],
    "values_narrower_ragged": CASES["values_narrower_ragged"],
}


def in_type(c: Case, dtype: int) -> Case:
    return dataclasses.replace(c, core=dataclasses.replace(c.core, dtype=dtype))


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("name", list(HALF_CASES))
def test_half_attention_kernel_matches_float64(name: str, dtype: str, folder) -> None:
    check_case(name, in_type(HALF_CASES[name], HALVES[dtype]), OPTIONS["default"], folder)


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("name", ["ragged_70_rows_mask", "padding_masks_a_whole_tile"])
def test_half_attention_kernel_with_128_keys_a_tile(name: str, dtype: str, folder) -> None:
    check_case(name, in_type(HALF_CASES[name], HALVES[dtype]), OPTIONS["keys-128"], folder)


@pytest.mark.parametrize("variant", ["pairs-unstaged-masks", "ldmatrix"])
@pytest.mark.parametrize("name", ["bert_64", "ragged_70_rows_mask", "few_queries_long_keys_transposed",
                                  "padding_masks_a_whole_tile"])
def test_half_attention_kernel_variants(name: str, variant: str, folder) -> None:
    check_case(name, in_type(HALF_CASES[name], HALVES["float16"]), OPTIONS[variant], folder)


# Deliberate mistakes in the half kernel's fragment layouts that the tolerances must catch: the
# two probabilities of a register swapped, V's two keys of a B register swapped (shared-load
# pairs), and with ldmatrix V's two 8-key halves or K's two blocks swapped. (edit, options)
BROKEN = {
    "probability-pairs-swapped": (lambda src: src.replace("PACK(e0, e1)", "PACK(e1, e0)"), "default"),
    "value-pairs-swapped": (lambda src: src.replace("stitch_pair(Vs + (k * 16 + 2 * tg) * VS + n * 8 + g, VS)",
                                                    "stitch_pair(Vs + (k * 16 + 2 * tg + 1) * VS + n * 8 + g, -VS)"),
                            "pairs-unstaged-masks"),
    "value-halves-swapped": (lambda src: src.replace("MMA(o[n], pf[k], vb[0], vb[1])", "MMA(o[n], pf[k], vb[1], vb[0])"),
                             "ldmatrix"),
    "key-blocks-swapped": (lambda src: src.replace("MMA(s[n], qf[k], kb[0], kb[1])", "MMA(s[n], qf[k], kb[2], kb[3])"),
                           "ldmatrix"),
}


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("mistake", list(BROKEN))
def test_a_broken_half_kernel_fails_the_tolerance(mistake: str, dtype: str, folder) -> None:
    edit, variant = BROKEN[mistake]
    c = in_type(HALF_CASES["ragged_70_rows_mask"], HALVES[dtype])
    source = generated(core_model(c.core), OPTIONS[variant])[1].source
    assert edit(source) != source
    with pytest.raises(AssertionError, match="relative error"):
        check_case(mistake, c, OPTIONS[variant], folder, edit)


# Projected operands (attention.Projection): the kernel reads q, kᵀ and v at their heads' columns
# of the projections' outputs and adds the biases itself.
def _projected() -> list:
    """PROJECTED as parameters; a BERT-sized one (20-40 s on the host) goes to one test worker
    with the others of its size (`--dist loadgroup`), so two never contend for the two cores."""
    return [pytest.param(p, id=p.id, marks=[pytest.mark.xdist_group("bert-sized-host-attention")]
                         if math.prod(p.core.lead) * p.core.sq >= 8 * 12 * 128 else []) for p in PROJECTED]


@pytest.mark.parametrize("variant", ["default", "keys-128"])
@pytest.mark.parametrize("p", _projected())
def test_projected_attention_kernel_matches_float64(p, variant, folder) -> None:
    check_projected(p, OPTIONS[variant], folder)


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("p", _projected())
def test_half_projected_attention_kernel_matches_float64(p: Projected, dtype: str, folder) -> None:
    check_projected(dataclasses.replace(p, core=dataclasses.replace(p.core, dtype=HALVES[dtype])), OPTIONS["default"],
                    folder)


def check_projected(p: Projected, options: codegen_attention.AttentionOptions, folder) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    model = projected_model(p, rng)
    match, src = generated(model, options)
    assert len(match.projections) == 3 and match.biased == p.biased
    assert src.spec.projected and src.spec.heads == p.core.lead[1]
    assert src.spec.attributes()["attention_column_offsets"] == [x.offset for x in match.projections]
    assert src.spec.attributes()["attention_dtype"] == p.core.dtype
    feeds = projected_feeds(p, rng)
    values = projected_values(p, model, feeds)
    ins = [values[t] for t in src.inputs]
    expected = projected_reference(p, model, feeds)
    got = poisoned(expected.shape, p.core.dtype)
    launch(src, ins, [got], folder)
    assert finite(got), f"{p.id} (seed {seed}): elements not written or not finite"
    err = relative_error(got, expected)
    assert err <= tolerance(p.core.dtype), f"{p.id} (seed {seed}): relative error {err:.2e}"


def run_sdpa(s: Sdpa, rng: np.random.Generator, folder, options=codegen_attention.AttentionOptions(),
             blank_rows: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(the kernel's context, the float64 reference) over fresh random inputs; the kernel's
    inputs that the model computes before the chain (kᵀ, an additive mask) as sdpa_inputs."""
    model = sdpa_model(s)
    match, src = generated(model, options)
    assert match.guarded == s.guard and src.spec.guarded == s.guard
    assert src.spec.boolean_mask == (s.core.mask is not None and s.mask != "additive")
    feeds = sdpa_feeds(s, rng, blank_rows=blank_rows)
    ins = sdpa_inputs(s, feeds, src.inputs)
    expected = sdpa_reference(s, feeds)
    got = poisoned(expected.shape, TP.FLOAT if s.upcast else s.core.dtype)
    launch(src, ins, [got], folder)
    return got, expected


def _finite_rows_error(got: np.ndarray, expected: np.ndarray) -> float:
    keep = np.isfinite(expected)
    return relative_error(got[keep], expected[keep])


@pytest.mark.parametrize("variant", ["default", "keys-128"])
@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_sdpa_kernel_matches_float64(s: Sdpa, variant: str, folder) -> None:
    check_sdpa(s, variant, folder)


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_half_sdpa_kernel_matches_float64(s: Sdpa, dtype: str, folder) -> None:
    check_sdpa(dataclasses.replace(s, core=dataclasses.replace(s.core, dtype=HALVES[dtype])), "default", folder)


def check_sdpa(s: Sdpa, variant: str, folder) -> None:
    seed = fresh_seed()
    # Rows with nothing to attend to where the guard makes them 0 (-inf fills; a finite fill
    # leaves such a row a plain Softmax).
    blank = s.guard and s.core.mask is not None and s.fill == -np.inf
    got, expected = run_sdpa(s, np.random.default_rng(seed), folder, OPTIONS[variant], blank_rows=blank)
    assert finite(got), f"{s.id} (seed {seed}): elements not written or not finite"
    if blank:  # the reference's rows of zeros: exactly zeros
        zeros = (expected == 0).all(-1)
        assert zeros.any() and (got[zeros] == 0).all(), f"{s.id} (seed {seed}): rows with every key masked"
    err = relative_error(got, expected)
    assert err <= tolerance(s.core.dtype), f"{s.id} (seed {seed}): relative error {err:.2e}"


@pytest.mark.parametrize("dtype", ["float32", *HALVES])
@pytest.mark.parametrize("guard", [True, False])
def test_rows_with_every_key_masked_give_zeros_only_with_the_guard(guard: bool, dtype: str, folder) -> None:
    # -inf on every key of batch 0's first query row: Softmax gives NaN there, which
    # Where(IsNaN(p), 0, p) makes 0; the other rows are untouched either way.
    dt = HALVES.get(dtype, TP.FLOAT)
    s = Sdpa(Core((2, 2), 70, 70, 32, (2, 1, 70, 70), transposed=False, dtype=dt), exporter="ts", mask="keep",
             guard=guard)
    seed = fresh_seed()
    got, expected = run_sdpa(s, np.random.default_rng(seed), folder, blank_rows=True)
    got = got.astype(np.float64)
    blank = got[0, :, 0]
    if guard:
        assert (blank == 0).all() and np.isfinite(got).all(), f"seed {seed}"
    else:
        assert np.isnan(blank).all() and np.isnan(expected[0, :, 0]).all(), f"seed {seed}"
        assert np.isfinite(np.delete(got, 0, axis=2)).all(), f"seed {seed}"
    err = _finite_rows_error(got, expected)
    assert err <= tolerance(dt), f"seed {seed}: relative error {err:.2e}"


# TorchScript's SDPA in a half model: the product cast to float32, a float32 mask, V cast to
# float32 and a float32 context; the kernel reads q, k, v as they were and writes float32.
UPCAST = [dataclasses.replace(s, exporter="ts", upcast=True, core=dataclasses.replace(s.core, dtype=HALVES[dt]))
          for s in SDPA[:4] for dt in HALVES]


@pytest.mark.parametrize("s", UPCAST, ids=lambda s: s.id)
def test_upcast_sdpa_kernel_matches_float64(s: Sdpa, folder) -> None:
    match, src = generated(sdpa_model(s))
    assert match.upcast and src.output_dtypes == (TP.FLOAT,)
    check_sdpa(s, "default", folder)


@pytest.mark.parametrize("sms", [4, 1000])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
@pytest.mark.parametrize("upcast", [False, True])
def test_decode_kernel_of_an_sdpa_core_matches_float64(upcast: bool, dtype: int, sms: int, folder) -> None:
    # One query per head against 150 keys: the decode kernel (split keys, merged) instead of
    # the tiled one, K read as kᵀ (no grouped heads), masks per key, the guard's zero rows.
    if upcast and dtype == TP.FLOAT:
        pytest.skip("upcast chains are half")
    s = Sdpa(Core((2, 3), 1, 150, 64, (2, 1, 1, 150), dtype=dtype), exporter="ts", upcast=upcast)
    check_decode_sdpa(s, sms, folder)


@pytest.mark.parametrize("sms", [4, 1000])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_decode_kernel_applies_a_boolean_mask_before_the_terms(dtype: int, sms: int, folder) -> None:
    # GPT-Neo's form in a decoder step: Where(mask, scores, fill) + padding (Select.first).
    s = Sdpa(Core((2, 3), 1, 150, 64, (2, 1, 1, 150), dtype=dtype), mask="first", guard=False)
    check_decode_sdpa(s, sms, folder)


def check_decode_sdpa(s: Sdpa, sms: int, folder) -> None:
    """The decode kernel of SDPA core `s` (one query) against the float64 reference."""
    dtype, upcast = s.core.dtype, s.upcast
    g, found = attention_graph(sdpa_model(s))
    (m,) = found.matches
    src = codegen_attention.generate(g, "stitch_h0", dataclasses.replace(m, decode=True))
    assert src.spec.decode_rows >= 1
    seed = fresh_seed()
    feeds = sdpa_feeds(s, np.random.default_rng(seed), blank_rows=s.guard)
    expected = sdpa_reference(s, feeds)
    got = poisoned(expected.shape, TP.FLOAT if upcast else dtype)
    launch(src, sdpa_inputs(s, feeds, src.inputs), [got], folder, sm_count=sms)
    assert finite(got) and (got[(expected == 0).all(-1)] == 0).all(), f"seed {seed}"
    assert relative_error(got, expected) <= tolerance(dtype), f"seed {seed}"


# Gemma 2's logit cap (cap · tanh(scores / cap), before the mask), with a cap the scores reach
# (q and k of unit variance, d 64: scores of standard deviation 1 after the scale) so that the
# tanh bends them: tiled in every type, with the mask before and after, and the decode kernel.
CAPPED = [Sdpa(Core((2, 2), 70, 90, 64, (2, 1, 70, 90), dtype=dt), exporter=ex, mask=mask, softcap=1.5)
          for dt in (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16) for ex, mask in (("ts", "additive"), ("dynamo", "first"))]


@pytest.mark.parametrize("s", CAPPED, ids=lambda s: s.id)
def test_softcapped_scores_match_float64(s: Sdpa, folder) -> None:
    match, _ = generated(sdpa_model(s))
    assert match.softcap == pytest.approx(1.5, rel=1e-2) and "capped at" in match.describe()
    check_sdpa(s, "default", folder)


@pytest.mark.parametrize("sms", [4, 1000])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_decode_kernel_caps_the_scores(dtype: int, sms: int, folder) -> None:
    s = Sdpa(Core((2, 3), 1, 150, 64, (2, 1, 1, 150), dtype=dtype), exporter="ts", softcap=1.5, guard=False)
    check_decode_sdpa(s, sms, folder)


def test_a_mistake_dropping_the_cap_is_caught(folder) -> None:
    """The kernel without its tanh (the cap dropped) is beyond the tolerance: the test can fail."""
    s = CAPPED[0]
    model = sdpa_model(s)
    match, _ = generated(model)
    g, _ = attention_graph(model)
    src = codegen_attention.generate(g, "stitch_h0", dataclasses.replace(match, softcap=0.0))
    feeds = sdpa_feeds(s, np.random.default_rng(fresh_seed()))
    expected = sdpa_reference(s, feeds)
    got = poisoned(expected.shape, s.core.dtype)
    launch(src, sdpa_inputs(s, feeds, src.inputs), [got], folder)
    assert relative_error(got, expected) > tolerance(s.core.dtype)
