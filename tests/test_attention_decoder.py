"""Decoder forms of the attention chain (schemes/attention/decoder.py, issue 22): grouped KV
heads (repeat_kv's Expand/Reshape as both torch.onnx exporters write it, K and V read
un-expanded, q head h on KV head h // g) and causal masks built in the graph (applied in the
kernel, key tiles after the diagonal skipped; a padding mask beside it read as the kernel's
boolean mask where it is a tensor of its own, else the combined mask read as it is).

Matching on small models written node for node as the corpus decoders (attention_models.Decoder),
the kernel on the CPU host harness against a float64 numpy reference (the existing tolerances:
2e-3 float32/TF32, 2e-3 float16), a kernel with the wrong head mapping or the diagonal one key
off failing them, the function body (fallback.py) on ONNX Runtime against the same reference,
and the corpus decoders optimized and verified on ONNX Runtime's CPU."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxstitch
from onnxstitch.schemes.attention import codegen as codegen_attention
from onnxstitch.schemes.attention import fallback

from .attention_models import (Decoder, attention_graph, decoder_feeds, decoder_model, decoder_reference, np_dtype,
                               relative_error)
from .host_kernels import HAVE_GXX, launch
from .corpus import CORPUS, corpus_entry
from .stitching import fresh_seed

TOLERANCE = {TP.FLOAT: 2e-3, TP.FLOAT16: 2e-3}

CASES = [
    Decoder(2, 4, 2, 70, 70, 16, "dynamo"),  # g = 2, Sq = Sk over two ragged tiles
    Decoder(1, 6, 3, 64, 64, 32, "ts"),  # g = 3 (Qwen2-style), whole tiles
    Decoder(1, 7, 7, 20, 20, 16, "ts", causal=False),  # g = 7, no mask
    Decoder(2, 6, 3, 1, 150, 16, "dynamo"),  # decode: one query against 150 keys
    Decoder(1, 4, 2, 16, 200, 16, "ts"),  # decode-like: 16 queries, keys in 4 tiles (3 skipped before)
    Decoder(1, 4, 2, 7, 130, 32, "dynamo", padding="input"),  # causal + a padding input: boolean mask
    Decoder(2, 4, 2, 70, 70, 16, "ts", padding="input"),  # left-padded rows: all keys masked
    Decoder(2, 4, 2, 70, 140, 16, "dynamo", padding="computed"),  # combined mask read, tiles skipped
]
# Multi-query attention as Falcon writes it: one K and V head that MatMul broadcasts (g = heads).
CASES += [Decoder(2, 4, 4, 70, 70, 16, "mqa"), Decoder(1, 6, 6, 1, 150, 32, "mqa", causal=False)]
HALF = [dataclasses.replace(c, dtype=TP.FLOAT16) for c in CASES[::2]]
# Rows with every key masked by a finite fill and keys after the block's diagonal inside its last
# tile: 128-key tiles (float16, 128 keys), and Sk − Sq not a multiple of the tile.
HALF.append(Decoder(2, 6, 3, 128, 128, 64, "dynamo", padding="input", dtype=TP.FLOAT16))
CASES.append(Decoder(2, 4, 2, 70, 100, 16, "ts", padding="input"))


def _match(c: Decoder):
    g, found = attention_graph(decoder_model(c))
    assert len(found.matches) == 1 and not found.refusals, found.refusals
    return g, found.matches[0]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_decoder_forms_are_one_chain_over_unexpanded_kv(c: Decoder) -> None:
    g, m = _match(c)
    assert (m.kt, m.v, m.kv_group, m.causal) == ("k", "v", c.group, c.causal)
    # The repeat_kv and kᵀ nodes are the chain's: nothing writes the expanded K and V (one
    # broadcast head: the kᵀ Transpose is the chain's).
    assert ({"Transpose"} if c.form == "mqa" else {"Expand", "Unsqueeze"}) <= {g.nodes[i].op_type for i in m.nodes}
    if c.padding == "input":
        assert m.masks == () and m.select is not None and m.select.mask == "pad"
    elif c.padding == "computed":  # Not(pad) could be computed inside another kernel: read the mask
        assert m.masks == ("mask",) and m.select is None
    else:
        assert m.masks == () and m.select is None


def test_a_mask_that_is_not_causal_stays_a_term() -> None:
    model = decoder_model(Decoder(1, 4, 2, 8, 8, 16, "ts"))
    le = next(n for n in model.graph.node if n.op_type == "LessOrEqual")
    le.op_type = "Less"  # key < query: one key off the diagonal
    _, found = attention_graph(model)
    (m,) = found.matches
    assert not m.causal and m.masks == ("mask",)


def test_repeated_kv_read_elsewhere_stays_expanded() -> None:
    model = decoder_model(Decoder(1, 4, 2, 8, 8, 16, "ts"))
    model.graph.output.append(helper.make_tensor_value_info("vr", TP.FLOAT, [1, 4, 8, 16]))
    _, found = attention_graph(model)
    (m,) = found.matches
    assert m.kv_group == 1 and m.v == "vr"


def _inputs(c: Decoder, model: onnx.ModelProto, names, feeds) -> list[np.ndarray]:
    """The kernel's inputs: feeds, and tensors ONNX Runtime computes (the combined mask)."""
    missing = [t for t in names if t not in feeds]
    if missing:
        extra = onnx.ModelProto()
        extra.CopyFrom(model)
        extra.graph.output.extend(helper.make_tensor_value_info(t, c.dtype, None) for t in missing)
        got = ort.InferenceSession(extra.SerializeToString(), providers=["CPUExecutionProvider"]).run(missing, feeds)
        feeds = {**feeds, **dict(zip(missing, got))}
    return [feeds[t] for t in names]


def _run(c: Decoder, folder: Path, edit=None) -> float:
    """The kernel's relative error against the float64 reference (`edit` changes its source)."""
    g, m = _match(c)
    src = codegen_attention.generate(g, "stitch_h0", m)
    if edit is not None:
        src = dataclasses.replace(src, source=edit(src.source))
    rng = np.random.default_rng(fresh_seed())
    feeds = decoder_feeds(c, rng)
    y = np.full((c.b, c.sq, c.heads, c.values), np.nan, np_dtype(c.dtype))
    launch(src, _inputs(c, decoder_model(c), src.inputs, feeds), [y], folder)
    return relative_error(y.astype(np.float64), decoder_reference(c, feeds))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("host-decoder")


@pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")
@pytest.mark.parametrize("c", CASES + HALF, ids=lambda c: c.id)
def test_decoder_kernel_matches_float64(c: Decoder, folder: Path) -> None:
    assert _run(c, folder) <= TOLERANCE[c.dtype]


# DeepSeek-V3's latent attention: q and k 48 wide, v 32, causal with a finite fill (rows with
# every key masked add the skipped keys' values: the causal tail over V's own width). Read as
# the chain has them: grouped KV heads read heads of one width.
WIDER_KEYS = [Decoder(2, 4, 1, 70, 70, 48, "ts", dv=32), Decoder(1, 4, 2, 20, 150, 48, "dynamo", dv=32,
                                                                  padding="input")]


@pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")
@pytest.mark.parametrize("c", WIDER_KEYS + [dataclasses.replace(c, dtype=TP.FLOAT16) for c in WIDER_KEYS],
                         ids=lambda c: c.id)
def test_causal_values_narrower_than_keys_match_float64(c: Decoder, folder: Path) -> None:
    g, found = attention_graph(decoder_model(c))
    (m,) = found.matches
    assert (m.head_dim, m.value_dim, m.kv_group, m.causal) == (48, 32, 1, True)
    assert _run(c, folder) <= TOLERANCE[c.dtype]


BROKEN = {
    "head-mapping": lambda s: s.replace("h / G", "h % G"),
    "diagonal-off-by-one": lambda s: s.replace("key <= qa + OFF", "key < qa + OFF").replace("key <= qb + OFF",
                                                                                            "key < qb + OFF"),
}


@pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")
@pytest.mark.parametrize("broken", list(BROKEN))
def test_broken_kernels_fail_the_reference(broken: str, folder: Path) -> None:
    c = Decoder(1, 4, 2, 20, 20, 16, "ts")
    assert _run(c, folder, BROKEN[broken]) > 10 * TOLERANCE[c.dtype]


@pytest.mark.parametrize("c", CASES + HALF[:1], ids=lambda c: c.id)
def test_function_body_matches_float64(c: Decoder) -> None:
    # The fused node's function (what ORT runs without the library, and what verify runs).
    g, m = _match(c)
    vi = helper.make_tensor_value_info
    ins = [vi(t, g.tensors[t].dtype, list(g.tensors[t].shape)) for t in m.inputs]
    model = helper.make_model(helper.make_graph(list(fallback.body(g, m)), "body", ins, [vi("y", c.dtype, None)]),
                              opset_imports=[helper.make_opsetid("", 18)])
    feeds = decoder_feeds(c, np.random.default_rng(fresh_seed()))
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, dict(zip(m.inputs, _inputs(c, decoder_model(c), m.inputs, feeds))))[0]
    assert relative_error(got.astype(np.float64), decoder_reference(c, feeds)) <= TOLERANCE[c.dtype]


@pytest.mark.parametrize("name", ["qwen2-dynamo", "llama-dynamo"])
def test_corpus_decoders_get_grouped_causal_kernels(name: str) -> None:
    # Verified on ONNX Runtime's CPU inside optimize (the fused nodes run their functions there).
    entry = corpus_entry(name)
    layers = int(re.search(r"\bnum_hidden_layers=(\d+)", entry["origin"]).group(1)) if "num_hidden" in \
        entry["origin"] else 2
    res = onnxstitch.optimize(str(CORPUS / entry["file"]), shapes=entry["shapes"], strict=True)
    kernels = [k for k in res.report.kernels if k["scheme"] == "attention"]
    assert len(kernels) == layers and not res.report.attention_refusals
    assert all(k["kv_group"] > 1 and k["causal"] for k in kernels)
    assert res.report.verification is not None and res.report.verification.tensors_checked


# Decode shapes (schemes/attention/decode.py): g · Sq ≤ 16 rows per (batch, KV head), keys split
# over blocks (a GPU of `sms` multiprocessors: 4 makes several splits of these few keys, 1000
# one split per tile) and their partials merged.
DECODE = [
    Decoder(2, 6, 3, 1, 150, 16, "dynamo"),  # one query, three q heads a KV head, causal mask
    Decoder(1, 8, 8, 2, 300, 64, "ts", causal=False),  # 16 rows, ragged last tile
    Decoder(1, 4, 2, 7, 130, 32, "dynamo", padding="input"),  # causal + boolean padding mask
    Decoder(2, 4, 2, 3, 100, 16, "ts", padding="input"),  # left-padded rows: every key masked
    Decoder(1, 4, 1, 1, 90, 32, "ts"),  # no grouping: kᵀ read as the chain has it
]
# bfloat16 only without a computed mask (ONNX Runtime's CPU has no bfloat16 Expand to compute it).
DECODE_HALF = [dataclasses.replace(c, dtype=TP.FLOAT16) for c in DECODE[:3]] + [
    dataclasses.replace(DECODE[1], dtype=TP.BFLOAT16)]


def _run_decode(c: Decoder, folder: Path, sms: int, edit=None) -> float:
    g, m = _match(c)
    src = codegen_attention.generate(g, "stitch_h0", dataclasses.replace(m, decode=True))
    assert src.spec.decode_rows >= c.group * c.sq
    if edit is not None:
        src = dataclasses.replace(src, source=edit(src.source))
    feeds = decoder_feeds(c, np.random.default_rng(fresh_seed()))
    y = np.full((c.b, c.sq, c.heads, c.values), np.nan, np_dtype(c.dtype))
    launch(src, _inputs(c, decoder_model(c), src.inputs, feeds), [y], folder, sm_count=sms)
    return relative_error(y.astype(np.float64), decoder_reference(c, feeds))


@pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")
@pytest.mark.parametrize("sms", [4, 1000])
@pytest.mark.parametrize("c", DECODE + DECODE_HALF, ids=lambda c: c.id)
def test_decode_kernel_matches_float64(c: Decoder, sms: int, folder: Path) -> None:
    # float32 products here are exact float32 (CUDA cores): the float16 tolerance serves bfloat16's
    # inputs too, since the reference is computed from the rounded inputs.
    assert _run_decode(c, folder, sms) <= TOLERANCE.get(c.dtype, 2e-3)


# (edit, multiprocessors): the merge needs splits; the rescaling, several tiles in one split.
DECODE_BROKEN = {
    "merge-weights": (lambda s: s.replace("p[i * (D + 2) + c] * EXP2((mi - top) * LOG2E)", "p[i * (D + 2) + c]"), 4),
    "diagonal-off-by-one": (lambda s: s.replace("key <= r % Sq + Sk - Sq", "key < r % Sq + Sk - Sq"), 4),
    "rescale": (lambda s: s.replace("float acc = o[i] * cs[r];", "float acc = o[i];"), 1),
}


@pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")
@pytest.mark.parametrize("broken", list(DECODE_BROKEN))
def test_broken_decode_kernels_fail_the_reference(broken: str, folder: Path) -> None:
    edit, sms = DECODE_BROKEN[broken]
    assert _run_decode(DECODE[0], folder, sms, edit) > 10 * TOLERANCE[TP.FLOAT]


def test_the_plan_takes_the_decode_kernel_only_for_decode_shapes() -> None:
    from onnxstitch.cost import CostModel
    from onnxstitch.schemes.attention import decode, match

    for c, want in ((Decoder(4, 32, 8, 1, 4096, 64, "dynamo"), True), (Decoder(4, 32, 8, 512, 512, 64, "dynamo"), False),
                    (Decoder(1, 4, 1, 17, 64, 16, "ts"), False)):
        g, m = _match(c)
        cheaper, tiled, dec = decode.better(g, CostModel(), m)
        assert cheaper == want, (c.id, tiled, dec)
        assert match.group_of(g, CostModel(), "a0", m).payload.decode == want
