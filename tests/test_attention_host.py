"""The attention kernel (codegen_attention.py) run on the CPU (tests/host_kernels.py, with the
host forms of its TF32 mma.sync in tests/host_cuda.h), launched as the runtime's
ComputeAttention does, against an independent float64 numpy reference of
softmax(q·kᵀ·scale + mask)·v on fresh random inputs: within 2e-3 relative norm error (TF32
products; about 5e-4 in practice), every output element written (outputs are poisoned first).

The cases walk whole and ragged tiles of queries and keys (64 each), cross attention, head sizes
16, 32 and 64, masks broadcast over heads, rows or batches (and none), rank-3 operands,
the context stored transposed to [b, s, h, d] or not, and BERT's padding mask (-3.4e38 on some
keys, a whole tile of keys masked in one case) whose keys must get no weight: their rows of v
are then overwritten with 1e4 and the context must not change."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxstitch import attention, codegen_attention, graph as graph_mod, load, shapes

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
    lead: tuple[int, ...]  # [b, h] or [L] (rank-3 operands)
    sq: int
    sk: int
    d: int
    mask: tuple[int, ...] | None = None  # the mask's shape, broadcast to the scores [*lead, sq, sk]
    transposed: bool = False
    padding: bool = False  # a BERT padding mask: 0, or -3.4e38 on the masked keys
    masked_tile: bool = False  # padding: the first 128 keys (a whole tile) masked in batch 0
    bias: tuple[int, ...] | None = None  # a term added before the mask (T5's position bias)


CASES = {
    # BERT: whole tiles, a [b, 1, 1, s] padding mask, the context transposed to [b, s, h, d].
    "bert_64": Case((2, 2), 64, 64, 64, (2, 1, 1, 64), transposed=True, padding=True),
    "ragged_70_rows_mask": Case((2, 1), 70, 70, 64, (2, 1, 70, 70)),
    "few_queries_long_keys_transposed": Case((1, 2), 5, 130, 32, None, transposed=True),
    "cross_70x40_head_mask": Case((1, 2), 70, 40, 16, (1, 2, 70, 40)),
    # (Tiles of 64 or 128 keys, as codegen_attention chooses: these sizes are whole, ragged and
    # several tiles under either.)
    "padding_masks_a_whole_tile": Case((2, 1), 20, 200, 16, (2, 1, 1, 200), padding=True, masked_tile=True),
    "two_whole_key_tiles": Case((1, 2), 16, 256, 16, (1, 2, 16, 256)),
    "rank3_mask": Case((3,), 33, 70, 16, (3, 1, 70)),
    "rank3_no_mask": Case((3,), 70, 64, 32),
    "t5_position_bias_then_padding": Case((2, 2), 70, 70, 32, (2, 1, 1, 70), padding=True, bias=(1, 2, 70, 70)),
    "bias_alone": Case((1, 2), 20, 33, 16, None, transposed=True, bias=(20, 33)),
}


def attention_model(c: Case) -> onnx.ModelProto:
    """MatMul(q, kᵀ) → Mul(1/√d) → [Add(mask)] → Softmax(-1) → MatMul(·, v) → [Transpose 0213],
    as exporters write it. The tensors are named alike in every case, so kernels that differ
    only in shapes are one source (one host build)."""
    lead = list(c.lead)
    inputs = [helper.make_tensor_value_info("q", TP.FLOAT, lead + [c.sq, c.d]),
              helper.make_tensor_value_info("kt", TP.FLOAT, lead + [c.d, c.sk]),
              helper.make_tensor_value_info("v", TP.FLOAT, lead + [c.sk, c.d])]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"])]
    x = "scaled"
    if c.bias is not None:
        inputs.append(helper.make_tensor_value_info("bias", TP.FLOAT, list(c.bias)))
        nodes.append(helper.make_node("Add", ["bias", "scaled"], ["biased"]))  # the term first, as T5
        x = "biased"
    if c.mask is not None:
        inputs.append(helper.make_tensor_value_info("mask", TP.FLOAT, list(c.mask)))
        nodes.append(helper.make_node("Add", [x, "mask"], ["masked"]))
        x = "masked"
    nodes += [helper.make_node("Softmax", [x], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["context"])]
    out, shape = "context", lead + [c.sq, c.d]
    if c.transposed:
        nodes.append(helper.make_node("Transpose", ["context"], ["out"], perm=[0, 2, 1, 3]))
        out, shape = "out", [lead[0], c.sq, lead[1], c.d]
    scale = numpy_helper.from_array(np.array(1 / np.sqrt(c.d), np.float32), "scale")
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info(out, TP.FLOAT, shape)],
                              [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def generated(model: onnx.ModelProto, options: codegen_attention.AttentionOptions = codegen_attention.AttentionOptions()):
    """(the chain attention.find matches, its kernel source), the graph built as the pipeline does."""
    m = load.constants_to_initializers(load.load(model))
    m, dim_values = shapes.resolve_shapes(m, {})
    _, infos = shapes.infer(m)
    g = graph_mod.build(m, infos, dim_values, True)
    found = attention.find(g)
    assert len(found.matches) == 1, found.refusals
    match = found.matches[0]
    return match, codegen_attention.generate(g, "stitch_h0", match, options)


def inputs_for(c: Case, rng: np.random.Generator) -> list[np.ndarray]:
    lead = c.lead
    q = rng.standard_normal(lead + (c.sq, c.d), np.float32)
    kt = rng.standard_normal(lead + (c.d, c.sk), np.float32)
    v = rng.standard_normal(lead + (c.sk, c.d), np.float32)
    terms = [] if c.bias is None else [rng.standard_normal(c.bias, np.float32)]
    if c.mask is None:
        return [q, kt, v] + terms
    if c.padding:
        # Each batch keeps its first keys (at least one) and pads the rest, as BERT's mask.
        mask = np.zeros(c.mask, np.float32)
        for b in range(c.mask[0]):
            keep = rng.integers(1, c.sk) if c.sk > 1 else 1
            mask[b, ..., keep:] = BERT_MASKED
        # Some keys masked in the middle too, and a whole first tile of keys in batch 0.
        mask[..., rng.integers(0, c.sk, 3)] = BERT_MASKED
        # Every row keeps a key: the first, or in batch 0 of `masked_tile` the last.
        mask[..., 0] = 0
        if c.masked_tile:
            mask[0, ..., :128] = BERT_MASKED
            mask[0, ..., -1] = 0
    else:
        mask = (2 * rng.standard_normal(c.mask)).astype(np.float32)
    return [q, kt, v] + terms + [mask]


def reference(c: Case, ins: list[np.ndarray]) -> np.ndarray:
    """softmax(q·kᵀ/√d + mask)·v in float64, transposed to [b, s, h, d] when the model does."""
    q, kt, v = (x.astype(np.float64) for x in ins[:3])
    s = q @ kt * np.float64(np.float32(1 / np.sqrt(c.d)))
    for term in ins[3:]:  # the bias, then the mask
        s = s + term.astype(np.float64)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    ctx = p @ v
    return ctx.transpose(0, 2, 1, 3) if c.transposed else ctx


# The default kernel, and the variants scripts/bench_attention.py compares.
OPTIONS = {"default": codegen_attention.AttentionOptions(),
           "tf32-at-fragments": codegen_attention.AttentionOptions(staged_tf32=False),
           "tf32-staged": codegen_attention.AttentionOptions(staged_tf32=True),
           "keys-128": codegen_attention.AttentionOptions(keys=128),
           "double-buffer": codegen_attention.AttentionOptions(double_buffer=True),
           "double-buffer-tf32-at-fragments": codegen_attention.AttentionOptions(double_buffer=True, staged_tf32=False)}


@pytest.mark.parametrize("variant", list(OPTIONS))
@pytest.mark.parametrize("name", list(CASES))
def test_attention_kernel_matches_float64(name, variant, folder) -> None:
    c = CASES[name]
    match, src = generated(attention_model(c), OPTIONS[variant])
    terms = (c.bias is not None) + (c.mask is not None)
    assert (match.head_dim, len(match.masks), match.transposed) == (c.d, terms, c.transposed)
    assert src.shape_rule == "attention" and src.attention[0] == c.d
    seed = fresh_seed()
    ins = inputs_for(c, np.random.default_rng(seed))
    expected = reference(c, ins)
    got = np.full(expected.shape, np.nan, np.float32)  # poisoned: every element must be written
    launch(src, ins, [got], folder)
    assert np.isfinite(got).all(), f"{name} (seed {seed}): elements not written or not finite"
    err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert err <= TOLERANCE, f"{name} (seed {seed}): relative error {err:.2e}"
    if c.padding:
        # Keys under -3.4e38 take no weight: v's rows there can be anything.
        noisy = [x.copy() for x in ins]
        masked = (ins[-1] == BERT_MASKED)[:, 0, 0, :]  # [b, sk]
        noisy[2][np.broadcast_to(masked[:, None, :], noisy[2].shape[:-1])] = 1e4
        again = np.full(expected.shape, np.nan, np.float32)
        launch(src, noisy, [again], folder)
        err = np.linalg.norm(again - expected) / np.linalg.norm(expected)
        assert err <= TOLERANCE, f"{name} (seed {seed}): masked keys weigh in, relative error {err:.2e}"
