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
guard, NaN without it (as ONNX Runtime's Softmax)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxstitch.schemes.attention import codegen as codegen_attention

from .attention_models import (PROJECTED, SDPA, Core, Sdpa, attention_graph, core_feeds, core_model, core_reference,
                               projected_feeds, projected_model, projected_reference, relative_error, sdpa_feeds,
                               sdpa_model, sdpa_reference, tensor_values)
from .host_kernels import HAVE_GXX, launch
from .stitching import fresh_seed

pytestmark = pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")

TOLERANCE = 2e-3
BERT_MASKED = np.float32(-3.4e38)


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
}


def generated(model: onnx.ModelProto, options: codegen_attention.AttentionOptions = codegen_attention.AttentionOptions()):
    """(the chain attention.find matches, its kernel source), the graph built as the pipeline does."""
    g, found = attention_graph(model)
    assert len(found.matches) == 1, found.refusals
    match = found.matches[0]
    return match, codegen_attention.generate(g, "stitch_h0", match, options)


def feeds_for(c: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random operands; a padding case's mask as BERT's: each batch keeps its first keys and
    pads the rest with -3.4e38 (some keys in the middle too), every row keeping a key."""
    feeds = core_feeds(c.core, rng, masked=None)
    if c.padding:
        mask = np.zeros(c.core.mask, np.float32)
        for b in range(mask.shape[0]):
            mask[b, ..., rng.integers(1, c.core.sk) if c.core.sk > 1 else 1:] = BERT_MASKED
        mask[..., rng.integers(0, c.core.sk, 3)] = BERT_MASKED
        mask[..., 0] = 0
        if c.masked_tile:  # batch 0 keeps only its last key
            mask[0, ..., :128] = BERT_MASKED
            mask[0, ..., -1] = 0
        feeds["mask"] = mask
    return feeds


# The default kernel, and the variants scripts/bench_attention.py compares.
OPTIONS = {"default": codegen_attention.AttentionOptions(),
           "tf32-at-fragments": codegen_attention.AttentionOptions(staged_tf32=False),
           "tf32-staged": codegen_attention.AttentionOptions(staged_tf32=True),
           "keys-128": codegen_attention.AttentionOptions(keys=128)}


@pytest.mark.parametrize("variant", list(OPTIONS))
@pytest.mark.parametrize("name", list(CASES))
def test_attention_kernel_matches_float64(name, variant, folder) -> None:
    c = CASES[name]
    core = c.core
    match, src = generated(core_model(core), OPTIONS[variant])
    terms = (core.bias is not None) + (core.mask is not None)
    assert (match.head_dim, len(match.masks), match.transposed) == (core.d, terms, core.transposed)
    assert src.shape_rule == "attention" and src.spec.head_size == core.d
    seed = fresh_seed()
    feeds = feeds_for(c, np.random.default_rng(seed))
    ins = [feeds[t] for t in src.inputs]
    expected = core_reference(core, feeds)
    got = np.full(expected.shape, np.nan, np.float32)  # poisoned: every element must be written
    launch(src, ins, [got], folder)
    assert np.isfinite(got).all(), f"{name} (seed {seed}): elements not written or not finite"
    err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert err <= TOLERANCE, f"{name} (seed {seed}): relative error {err:.2e}"
    if c.padding:
        # Keys under -3.4e38 take no weight: v's rows there can be anything.
        noisy = [x.copy() for x in ins]
        masked = (feeds["mask"] == BERT_MASKED)[:, 0, 0, :]  # [b, sk]
        noisy[2][np.broadcast_to(masked[:, None, :], noisy[2].shape[:-1])] = 1e4
        again = np.full(expected.shape, np.nan, np.float32)
        launch(src, noisy, [again], folder)
        err = np.linalg.norm(again - expected) / np.linalg.norm(expected)
        assert err <= TOLERANCE, f"{name} (seed {seed}): masked keys weigh in, relative error {err:.2e}"


# Projected operands (attention.Projection): the kernel reads q, kᵀ and v at their heads' columns
# of the projections' outputs and adds the biases itself.
@pytest.mark.parametrize("variant", ["default", "keys-128"])
@pytest.mark.parametrize("p", PROJECTED, ids=lambda p: p.id)
def test_projected_attention_kernel_matches_float64(p, variant, folder) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    model = projected_model(p, rng)
    match, src = generated(model, OPTIONS[variant])
    assert len(match.projections) == 3 and match.biased == p.biased
    assert src.spec.projected and src.spec.heads == p.core.lead[1]
    assert src.spec.attributes()["attention_column_offsets"] == [x.offset for x in match.projections]
    feeds = projected_feeds(p, rng)
    values = feeds | {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    if p.source == "matmul":  # the projections' products, which ONNX Runtime computes
        values |= {f"{o}_cols": feeds["x"] @ values[f"w{o}"] for o in "qkv"}
    ins = [values[t] for t in src.inputs]
    expected = projected_reference(p, model, feeds)
    got = np.full(expected.shape, np.nan, np.float32)
    launch(src, ins, [got], folder)
    assert np.isfinite(got).all(), f"{p.id} (seed {seed}): elements not written or not finite"
    err = relative_error(got, expected)
    assert err <= TOLERANCE, f"{p.id} (seed {seed}): relative error {err:.2e}"


def run_sdpa(s: Sdpa, rng: np.random.Generator, folder, options=codegen_attention.AttentionOptions(),
             blank_rows: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(the kernel's context, the float64 reference) over fresh random inputs; the kernel's
    inputs that the model computes before the chain (kᵀ, an additive mask) from ONNX Runtime."""
    model = sdpa_model(s)
    match, src = generated(model, options)
    assert match.guarded == s.guard and src.spec.guarded == s.guard
    assert src.spec.boolean_mask == (s.core.mask is not None and s.mask != "additive")
    feeds = sdpa_feeds(s, rng, blank_rows=blank_rows)
    ins = tensor_values(model, feeds, src.inputs)
    expected = sdpa_reference(s, feeds)
    got = np.full(expected.shape, np.nan, np.float32)  # poisoned: every element must be written
    launch(src, ins, [got], folder)
    return got, expected


def _finite_rows_error(got: np.ndarray, expected: np.ndarray) -> float:
    keep = np.isfinite(expected)
    return relative_error(got[keep], expected[keep])


@pytest.mark.parametrize("variant", ["default", "keys-128"])
@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_sdpa_kernel_matches_float64(s: Sdpa, variant: str, folder) -> None:
    seed = fresh_seed()
    # Rows with nothing to attend to where the guard makes them 0 (-inf fills; a finite fill
    # leaves such a row a plain Softmax).
    blank = s.guard and s.core.mask is not None and s.fill == -np.inf
    got, expected = run_sdpa(s, np.random.default_rng(seed), folder, OPTIONS[variant], blank_rows=blank)
    assert np.isfinite(got).all(), f"{s.id} (seed {seed}): elements not written or not finite"
    if blank:  # the reference's rows of zeros: exactly zeros
        zeros = (expected == 0).all(-1)
        assert zeros.any() and (got[zeros] == 0).all(), f"{s.id} (seed {seed}): rows with every key masked"
    err = relative_error(got, expected)
    assert err <= TOLERANCE, f"{s.id} (seed {seed}): relative error {err:.2e}"


@pytest.mark.parametrize("guard", [True, False])
def test_rows_with_every_key_masked_give_zeros_only_with_the_guard(guard: bool, folder) -> None:
    # -inf on every key of batch 0's first query row: Softmax gives NaN there, which
    # Where(IsNaN(p), 0, p) makes 0; the other rows are untouched either way.
    s = Sdpa(Core((2, 2), 70, 70, 32, (2, 1, 70, 70), transposed=False), exporter="ts", mask="keep", guard=guard)
    seed = fresh_seed()
    got, expected = run_sdpa(s, np.random.default_rng(seed), folder, blank_rows=True)
    blank = got[0, :, 0]
    if guard:
        assert (blank == 0).all() and np.isfinite(got).all(), f"seed {seed}"
    else:
        assert np.isnan(blank).all() and np.isnan(expected[0, :, 0]).all(), f"seed {seed}"
        assert np.isfinite(np.delete(got, 0, axis=2)).all(), f"seed {seed}"
    err = _finite_rows_error(got, expected)
    assert err <= TOLERANCE, f"seed {seed}: relative error {err:.2e}"
