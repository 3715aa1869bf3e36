"""Attention cores as exporters write them (MatMul q·kᵀ → Mul scale → Add mask → Softmax →
MatMul ·v → Transpose; transformers' SDPA with its scales before the product, Where masks and
NaN guard), at chosen shapes and element types (float32, float16, bfloat16), and independent
float64 references computed from the inputs as the model holds them (rounded to its type)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxstitch import graph as graph_mod, load, shapes, sizes
from onnxstitch.schemes.attention import match as attention


def np_dtype(dtype: int) -> np.dtype:
    """numpy's type for an ONNX element type (ml_dtypes' bfloat16 for BFLOAT16)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype))


def lowest(dtype: int) -> float:
    """The type's most negative finite value (the exporters' fill and BERT's mask)."""
    return float(ml_dtypes.finfo(np_dtype(dtype)).min)


def cast(x: np.ndarray, dtype: int) -> np.ndarray:
    """`x` rounded to the ONNX element type (finite values beyond its range clamped to it)."""
    t = np_dtype(dtype)
    if dtype == TP.FLOAT16:
        x = np.where(np.isfinite(x), np.clip(x, lowest(dtype), -lowest(dtype)), x)
    return np.asarray(x, np.float32).astype(t)


@dataclass(frozen=True)
class Core:
    """One attention core: operands [*lead, S, D]; mask None or its shape; output transposed to
    [b, s, h, d] (rank 4 only)."""

    lead: tuple[int, ...]  # (b, h) or (b·h,)
    sq: int
    sk: int
    d: int
    mask: tuple[int, ...] | None
    transposed: bool = True
    bias: tuple[int, ...] | None = None  # a term added before the mask (T5's position bias)
    dtype: int = TP.FLOAT  # of every tensor: operands, terms, scale and context
    dv: int | None = None  # V's and the context's head width, where not d (LeViT's values are wider)

    @property
    def values(self) -> int:
        return self.d if self.dv is None else self.dv

    @property
    def id(self) -> str:
        m = "x".join(map(str, self.mask)) if self.mask else "none"
        bias = f"-bias{'x'.join(map(str, self.bias))}" if self.bias else ""
        kind = "" if self.dtype == TP.FLOAT else f"-{np_dtype(self.dtype).name}"
        return (f"{'x'.join(map(str, self.lead))}-q{self.sq}-k{self.sk}-d{self.d}"
                f"{f'-dv{self.dv}' if self.dv is not None else ''}-mask{m}{bias}"
                f"{'-T' if self.transposed else ''}{kind}")


def core_model(c: Core, dtype: int | None = None, opset: int = 18, seq: str | None = None) -> onnx.ModelProto:
    """The core as a model with inputs q, kt, v (and mask) and output y, of `dtype` (default
    the core's); `seq` names the sequence dims (self-attention: Sq = Sk) instead of fixing them."""
    dtype = c.dtype if dtype is None else dtype
    vi = helper.make_tensor_value_info
    sq, sk = (seq, seq) if seq else (c.sq, c.sk)
    ins = [vi("q", dtype, [*c.lead, sq, c.d]), vi("kt", dtype, [*c.lead, c.d, sk]),
           vi("v", dtype, [*c.lead, sk, c.values])]
    return _model(c, [], ins, [], dtype, opset, seq)


def _model(c: Core, nodes: list[onnx.NodeProto], ins: list, inits: list, dtype: int, opset: int,
           seq: str | None) -> onnx.ModelProto:
    """`nodes` (making q, kt and v from `ins`) followed by the core, as a model."""
    scale = numpy_helper.from_array(cast(np.array(1 / np.sqrt(c.d)), dtype), "scale")
    nodes = nodes + [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"])]
    last = "ss"
    if c.bias is not None:
        nodes.append(helper.make_node("Add", ["ss", "bias"], ["sb"]))
        last = "sb"
    if c.mask is not None:
        nodes.append(helper.make_node("Add", [last, "mask"], ["sm"]))
        last = "sm"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["ctx"])]
    sq, sk = (seq, seq) if seq else (c.sq, c.sk)
    out_shape = [*c.lead, sq, c.values]
    if c.transposed:
        nodes.append(helper.make_node("Transpose", ["ctx"], ["y"], perm=[0, 2, 1, 3]))
        out_shape = [c.lead[0], sq, c.lead[1], c.values]
    else:
        nodes[-1].output[0] = "y"
    vi = helper.make_tensor_value_info
    for name, shape in (("bias", c.bias), ("mask", c.mask)):
        if shape is not None:
            ins.append(vi(name, dtype, [seq if seq and m == c.sk else m for m in shape]))
    g = helper.make_graph(nodes, "attention", ins, [vi("y", dtype, out_shape)], [scale, *inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def core_feeds(c: Core, rng: np.random.Generator, masked: float | None = -3.4e38) -> dict[str, np.ndarray]:
    """Random operands of the core's type; the mask holds 0 or `masked` (BERT's float32 minimum,
    clamped to the type's), a tenth masked, never a whole row, or with `masked` None normal
    values (scaled by 2)."""
    feeds = {"q": rng.standard_normal((*c.lead, c.sq, c.d)), "kt": rng.standard_normal((*c.lead, c.d, c.sk)),
             "v": rng.standard_normal((*c.lead, c.sk, c.values))}
    if c.bias is not None:
        feeds["bias"] = rng.standard_normal(c.bias)
    if c.mask is not None and masked is None:
        feeds["mask"] = 2 * rng.standard_normal(c.mask)
    elif c.mask is not None:
        hidden = rng.random(c.mask) < 0.1
        hidden[..., 0] = False
        feeds["mask"] = np.where(hidden, max(masked, lowest(c.dtype)), 0.0)
    return {k: cast(v, c.dtype) for k, v in feeds.items()}


def core_reference(c: Core, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """softmax(q·kᵀ·scale + mask)·v in float64 (scale: the model's constant 1/√d in the core's
    type), transposed as the model does."""
    q, kt, v = (feeds[k].astype(np.float64) for k in ("q", "kt", "v"))
    s = q @ kt * float(cast(np.array(1 / np.sqrt(c.d)), c.dtype))
    for name in ("bias", "mask"):
        if name in feeds:
            s = s + feeds[name].astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v
    return y.transpose(0, 2, 1, 3) if c.transposed else y


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖ (Frobenius)."""
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


# Shapes the tests run: BERT-base's, ragged sequences, cross attention, masks of every
# broadcast, rank-3 operands, small and large heads.
CORES = [
    Core((8, 12), 128, 128, 64, (8, 1, 1, 128)),
    Core((2, 3), 70, 70, 64, (2, 1, 70, 70)),
    Core((2, 2), 5, 130, 32, (1, 2, 5, 130)),
    Core((1, 4), 200, 77, 16, (77,), transposed=False),
    Core((3,), 64, 64, 128, None, transposed=False),
    Core((2, 3), 197, 197, 64, None),
    Core((2, 2), 33, 65, 8, (2, 2, 33, 65), transposed=False),
    Core((2, 4), 70, 70, 64, (2, 1, 1, 70), bias=(1, 4, 70, 70)),
    # LeViT's (batch 8): values wider than the keys, a learned bias per head; its downsampling
    # attention, 49 queries over 196 keys with values four times as wide
    Core((8, 4), 196, 196, 16, (4, 196, 196), dv=32),
    Core((8, 8), 49, 196, 16, None, dv=64),
]


@dataclass(frozen=True)
class Projected:
    """A core (lead (b, h)) whose q, kᵀ and v are split from projections as exporters write them:
    columns of a projection's output [b, s, w] (`source`: "slice" — one Slice each, the merge
    stage's form; "split" — GPT-2's Split into three; "matmul" — three MatMuls of x [b, s, e] by
    constant weights, which the merge stage makes one GEMM), an optional bias Add, Reshape to
    [b, s, h, d] and Transpose to [b, h, s, d] (kᵀ: [b, h, d, s]). Self-attention reads one x;
    with Sq ≠ Sk ("slice" only) q comes from xq [b, sq, 4 + h·d] at column 4, k and v from
    xkv [b, sk, 2·h·d + pad]."""

    core: Core
    source: str = "slice"
    biased: bool = True
    pad: int = 0  # columns after the heads (slice)

    @property
    def id(self) -> str:
        return f"{self.source}{'-bias' if self.biased else ''}{f'-pad{self.pad}' if self.pad else ''}-{self.core.id}"


def projected_model(p: Projected, rng: np.random.Generator, seq: str | None = None) -> onnx.ModelProto:
    """The core of `p` with its projections (biases and weights drawn from `rng`), inputs x (or
    xq and xkv) and the core's terms; `seq` names the sequence dims."""
    c = p.core
    (b, h), hd = c.lead, c.lead[1] * c.d
    assert c.transposed or c.sq == c.sk
    vi, dt = helper.make_tensor_value_info, c.dtype
    sq, sk = (seq, seq) if seq else (c.sq, c.sk)
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.array([0, 0, h, c.d], np.int64), "heads")]
    cols: dict[str, str] = {}
    if p.source == "matmul":
        e = 2 * c.d
        ins = [vi("x", dt, [b, sq, e])]
        for o in "qkv":
            inits.append(numpy_helper.from_array(cast(rng.standard_normal((e, hd)) / np.sqrt(e), dt), f"w{o}"))
            nodes.append(helper.make_node("MatMul", ["x", f"w{o}"], [f"{o}_cols"]))
            cols[o] = f"{o}_cols"
    elif p.source == "split":
        ins = [vi("x", dt, [b, sq, 3 * hd])]
        nodes.append(helper.make_node("Split", ["x"], ["q_cols", "k_cols", "v_cols"], axis=2, num_outputs=3))
        cols = {o: f"{o}_cols" for o in "qkv"}
    else:
        if c.sq == c.sk:
            ins = [vi("x", dt, [b, sq, 3 * hd + p.pad])]
            at = {"q": ("x", 0), "k": ("x", hd), "v": ("x", 2 * hd)}
        else:
            ins = [vi("xq", dt, [b, sq, 4 + hd]), vi("xkv", dt, [b, sk, 2 * hd + p.pad])]
            at = {"q": ("xq", 4), "k": ("xkv", 0), "v": ("xkv", hd)}
        for o, (x, start) in at.items():
            inits += [numpy_helper.from_array(np.array([start], np.int64), f"{o}_start"),
                      numpy_helper.from_array(np.array([start + hd], np.int64), f"{o}_end")]
            inits.append(numpy_helper.from_array(np.array([2], np.int64), f"{o}_axis"))
            nodes.append(helper.make_node("Slice", [x, f"{o}_start", f"{o}_end", f"{o}_axis"], [f"{o}_cols"]))
            cols[o] = f"{o}_cols"
    for o in "qkv":
        flat = cols[o]
        if p.biased:
            inits.append(numpy_helper.from_array(cast(rng.standard_normal(hd), dt), f"b{o}"))
            nodes.append(helper.make_node("Add", [flat, f"b{o}"], [f"{o}_biased"]))
            flat = f"{o}_biased"
        nodes.append(helper.make_node("Reshape", [flat, "heads"], [f"{o}_heads"]))
        perm = [0, 2, 3, 1] if o == "k" else [0, 2, 1, 3]
        nodes.append(helper.make_node("Transpose", [f"{o}_heads"], ["kt" if o == "k" else o], perm=perm))
    return _model(c, nodes, ins, inits, dt, 18, seq)


def projected_feeds(p: Projected, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs of projected_model(p): x (or xq, xkv) and the core's terms."""
    c = p.core
    b, hd = c.lead[0], c.lead[1] * c.d
    terms = {k: v for k, v in core_feeds(c, rng).items() if k in ("bias", "mask")}
    if p.source == "matmul":
        xs = {"x": rng.standard_normal((b, c.sq, 2 * c.d))}
    elif p.source == "split":
        xs = {"x": rng.standard_normal((b, c.sq, 3 * hd))}
    elif c.sq == c.sk:
        xs = {"x": rng.standard_normal((b, c.sq, 3 * hd + p.pad))}
    else:
        xs = {"xq": rng.standard_normal((b, c.sq, 4 + hd)), "xkv": rng.standard_normal((b, c.sk, 2 * hd + p.pad))}
    return {k: cast(v, c.dtype) for k, v in xs.items()} | terms


def projection_product(p: Projected, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A projection's product x·w as ONNX Runtime gives it: accumulated in float32, rounded to
    the core's type."""
    return cast(x.astype(np.float32) @ w.astype(np.float32), p.core.dtype)


def projected_reference(p: Projected, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The context in float64: q, kᵀ and v computed from the inputs and the model's weights and
    biases in numpy (the projections' products as projection_product), then core_reference."""
    c = p.core
    (b, h), hd = c.lead, c.lead[1] * c.d
    consts = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    f = {k: v.astype(np.float64) for k, v in feeds.items()}
    if p.source == "matmul":
        raw = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        cols = {o: projection_product(p, feeds["x"], raw[f"w{o}"]).astype(np.float64) for o in "qkv"}
    elif "x" in f:
        cols = {o: f["x"][..., i * hd:(i + 1) * hd] for i, o in enumerate("qkv")}
    else:
        cols = {"q": f["xq"][..., 4:4 + hd], "k": f["xkv"][..., :hd], "v": f["xkv"][..., hd:2 * hd]}
    heads = {}
    for o in "qkv":
        x = cols[o] + (consts[f"b{o}"] if p.biased else 0)
        heads[o] = x.reshape(b, -1, h, c.d).transpose(0, 2, 1, 3)
    operands = {"q": heads["q"], "kt": heads["k"].transpose(0, 1, 3, 2), "v": heads["v"]}
    return core_reference(c, operands | {k: v for k, v in feeds.items() if k in ("bias", "mask")})


# Projected cores the tests run: BERT's merged Q/K/V, GPT-2's Split, T5's unbiased Slices, the
# projections' own MatMuls (merged by the pipeline), cross attention from two sources with a
# column offset, ragged tiles, wider sources than the heads.
PROJECTED = [
    Projected(Core((8, 12), 128, 128, 64, (8, 1, 128, 128))),
    Projected(Core((2, 3), 70, 70, 32, (2, 1, 1, 70)), "split", biased=False),
    Projected(Core((2, 4), 70, 70, 32, (2, 1, 1, 70), bias=(1, 4, 70, 70)), biased=False, pad=8),
    Projected(Core((2, 2), 33, 33, 16, None, transposed=False), "matmul"),
    Projected(Core((1, 2), 70, 40, 16, (1, 2, 70, 40)), pad=4),
]


def attention_graph(model: onnx.ModelProto) -> tuple[graph_mod.FusionGraph, attention.Found]:
    """The model's FusionGraph, built as the pipeline builds it, and its attention chains."""
    m = load.constants_to_initializers(load.load(model))
    m, dims = sizes.resolve_shapes(m, {})
    g = graph_mod.build(m, shapes.infer(m)[1], dims)
    return g, attention.find(g)


# transformers' SDPA attention as torch.onnx writes it (issue 22), node for node as in
# build/corpus/distilbert-{dynamo,ts}.onnx: q (and k) scaled before the product, the mask made
# additive by Where or applied to the scores by Where, and Where(IsNaN(p), 0, p) after the
# Softmax.


@dataclass(frozen=True)
class Sdpa:
    """A core (lead (b, h); `core.mask` the boolean mask's shape or None) written as an exporter
    writes SDPA.

    exporter "dynamo": kᵀ = Reshape [b, h, d, s] ← Transpose [0, 2, 1] ← Reshape [b·h, s, d] ←
    k [b, h, s, d], masks filled with the type's minimum; "ts": kᵀ = Transpose [0, 2, 3, 1] ←
    k [b, s, h, d], masks filled with -inf. scale "both": Mul by d^-1/4 on q and on kᵀ; "q": Mul
    by d^-1/2 on q alone; "div": Div by d^1/4 on each. mask "additive": scores + Where(mask, 0,
    fill); "keep": Where(mask, scores, fill); "drop": Where(mask, fill, scores); "first":
    Where(mask, scores, fill) + pad, an additive float mask [b, 1, 1, sk] (GPT-Neo's causal mask
    before its padding mask). `guard`: Where(IsNaN(p), 0, p) after the Softmax."""

    core: Core
    exporter: str = "dynamo"
    scale: str = "both"
    mask: str = "additive"
    guard: bool = True
    # Half q, k, v with the product cast to float32 before the (float32) mask and V cast to
    # float32 for the second product: TorchScript's SDPA in a half model.
    upcast: bool = False
    # Gemma 2's logit cap before the mask: Mul(Tanh(Div(scores, cap)), cap); 0 for none.
    softcap: float = 0.0

    @property
    def id(self) -> str:
        return f"{self.exporter}-{self.scale}-{self.mask if self.core.mask else 'nomask'}" \
               f"{'-guard' if self.guard else ''}{'-upcast' if self.upcast else ''}" \
               f"{f'-cap{self.softcap:g}' if self.softcap else ''}-{self.core.id}"

    @property
    def fill(self) -> float:
        return lowest(self.core.dtype) if self.exporter == "dynamo" else -np.inf

    @property
    def factors(self) -> tuple[float, float]:
        """The constants (of the core's type) multiplying q and kᵀ (a Div's divisor inverted)."""
        d, dt = self.core.d, self.core.dtype
        if self.scale == "q":
            return float(cast(np.array(d ** -0.5), dt)), 1.0
        if self.scale == "div":
            return (1 / float(cast(np.array(d ** 0.25), dt)),) * 2
        return (float(cast(np.array(d ** -0.25), dt)),) * 2


def sdpa_model(s: Sdpa, opset: int = 18) -> onnx.ModelProto:
    """The core of `s` with inputs q [b, h, sq, d], k (see Sdpa), v [b, h, sk, d] and the
    boolean mask; output y."""
    c = s.core
    (b, h), d = c.lead, c.d
    vi, mk, dt = helper.make_tensor_value_info, helper.make_node, c.dtype
    tt = TP.FLOAT if s.upcast else dt  # the scores' and terms' type
    scalar = lambda name, x, t=dt: numpy_helper.from_array(cast(np.array(x), t), name)  # noqa: E731
    inits = [scalar("zero", 0.0, tt)] if s.guard or (c.mask is not None and s.mask == "additive") else []
    inits += [scalar("fill", s.fill, tt)] if c.mask is not None else []
    k_shape = [b, h, c.sk, d] if s.exporter == "dynamo" else [b, c.sk, h, d]
    ins = [vi("q", dt, [b, h, c.sq, d]), vi("k", dt, k_shape), vi("v", dt, [b, h, c.sk, d])]
    if s.exporter == "dynamo":
        inits += [numpy_helper.from_array(np.array(x, np.int64), n)
                  for n, x in (("flat", [b * h, c.sk, d]), ("split", [b, h, d, c.sk]))]
        nodes = [mk("Reshape", ["k", "flat"], ["k_flat"]), mk("Transpose", ["k_flat"], ["kt_flat"], perm=[0, 2, 1]),
                 mk("Reshape", ["kt_flat", "split"], ["kt"])]
    else:
        nodes = [mk("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1])]
    op = "Div" if s.scale == "div" else "Mul"
    factor = {"q": d ** -0.5, "div": d ** 0.25}.get(s.scale, d ** -0.25)
    inits.append(scalar("factor", factor))
    q, kt = "q", "kt"
    nodes.append(mk(op, ["q", "factor"], ["q_scaled"]))
    q = "q_scaled"
    if s.scale != "q":
        nodes.append(mk(op, ["kt", "factor"], ["kt_scaled"]))
        kt = "kt_scaled"
    nodes.append(mk("MatMul", [q, kt], ["scores"]))
    last = "scores"
    if s.upcast:
        nodes.append(mk("Cast", ["scores"], ["scores32"], to=TP.FLOAT))
        last = "scores32"
    if s.softcap:
        inits.append(scalar("cap", s.softcap, tt))
        nodes += [mk("Div", [last, "cap"], ["capped_in"]), mk("Tanh", ["capped_in"], ["capped_t"]),
                  mk("Mul", ["capped_t", "cap"], ["capped"])]
        last = "capped"
    if c.mask is not None:
        ins.append(vi("mask", TP.BOOL, list(c.mask)))
        if s.mask == "additive":
            nodes += [mk("Where", ["mask", "zero", "fill"], ["bias"]), mk("Add", [last, "bias"], ["masked"])]
        elif s.mask == "first":
            ins.append(vi("pad", tt, [b, 1, 1, c.sk]))
            nodes += [mk("Where", ["mask", last, "fill"], ["selected"]), mk("Add", ["selected", "pad"], ["masked"])]
        else:
            kept = [last, "fill"] if s.mask == "keep" else ["fill", last]
            nodes.append(mk("Where", ["mask", *kept], ["masked"]))
        last = "masked"
    nodes.append(mk("Softmax", [last], ["p"], axis=-1))
    probs = "p"
    if s.guard:
        nodes += [mk("IsNaN", ["p"], ["p_nan"]), mk("Where", ["p_nan", "zero", "p"], ["p_guarded"])]
        probs = "p_guarded"
    if s.upcast:
        nodes.append(mk("Cast", ["v"], ["v32"], to=TP.FLOAT))
    nodes.append(mk("MatMul", [probs, "v32" if s.upcast else "v"], ["ctx"]))
    out_shape = [b, h, c.sq, d]
    if c.transposed:
        nodes.append(mk("Transpose", ["ctx"], ["y"], perm=[0, 2, 1, 3]))
        out_shape = [b, c.sq, h, d]
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "sdpa", ins, [vi("y", tt, out_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def sdpa_feeds(s: Sdpa, rng: np.random.Generator, blank_rows: bool = False) -> dict[str, np.ndarray]:
    """Random q, k, v and a boolean mask dropping a tenth of the keys, never a whole row unless
    `blank_rows`: then batch 0's first query row (every row of batch 0 when the mask does not
    vary by query) attends to nothing."""
    c = s.core
    (b, h), d = c.lead, c.d
    k_shape = (b, h, c.sk, d) if s.exporter == "dynamo" else (b, c.sk, h, d)
    feeds = {"q": rng.standard_normal((b, h, c.sq, d)), "k": rng.standard_normal(k_shape),
             "v": rng.standard_normal((b, h, c.sk, d))}
    feeds = {k: cast(v, c.dtype) for k, v in feeds.items()}
    if c.mask is not None:
        mask = rng.random(c.mask) >= 0.1
        mask[..., 0] = True
        if blank_rows:
            mask[0, ..., 0, :] = False
        feeds["mask"] = mask if s.mask != "drop" else ~mask  # "drop": true where a key is dropped
        if s.mask == "first":  # padding: a tenth of the keys, never the first
            pad = rng.random((b, 1, 1, c.sk)) < 0.1
            pad[..., 0] = False
            feeds["pad"] = cast(np.where(pad, s.fill, 0.0), TP.FLOAT if s.upcast else c.dtype)
    return feeds


def sdpa_reference(s: Sdpa, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The context in float64 from the inputs, with the model's float32 scale constants: NaN
    where a row's every score is -inf, or 0 there with the guard."""
    c = s.core
    q, k, v = (feeds[n].astype(np.float64) for n in ("q", "k", "v"))
    kt = k.transpose(0, 1, 3, 2) if s.exporter == "dynamo" else k.transpose(0, 2, 3, 1)
    fq, fk = s.factors
    scores = (q * fq) @ (kt * fk)
    if s.softcap:
        cap = float(cast(np.array(s.softcap), TP.FLOAT if s.upcast else c.dtype))
        scores = cap * np.tanh(scores / cap)
    if c.mask is not None:
        mask = feeds["mask"]
        if s.mask == "additive":
            scores = scores + np.where(mask, 0.0, s.fill)
        elif s.mask == "first":
            with np.errstate(invalid="ignore"):  # (-inf fills: -inf + -inf stays -inf)
                scores = np.where(mask, scores, s.fill) + feeds["pad"].astype(np.float64)
        else:
            scores = np.where(mask if s.mask == "keep" else ~mask, scores, s.fill)
    with np.errstate(invalid="ignore"):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    if s.guard:
        p = np.where(np.isnan(p), 0.0, p)
    y = p @ v
    return y.transpose(0, 2, 1, 3) if c.transposed else y


def sdpa_inputs(s: Sdpa, feeds: dict[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
    """The values of `names` among an SDPA model's tensors that the attention kernel reads (its
    inputs, kᵀ, the additive mask) as the model computes them before the chain: kᵀ is k's
    transpose (the exporter's Transposes and Reshapes move values only), the additive mask
    Where(mask, 0, fill) in the core's type (float32 where upcast)."""
    k = feeds["k"]
    values = feeds | {"kt": k.transpose(0, 1, 3, 2) if s.exporter == "dynamo" else k.transpose(0, 2, 3, 1)}
    if s.core.mask is not None and s.mask == "additive":
        values["bias"] = cast(np.where(feeds["mask"], 0.0, s.fill), TP.FLOAT if s.upcast else s.core.dtype)
    return [np.ascontiguousarray(values[t]) for t in names]


def projected_values(p: Projected, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor a projected core's kernel may read, by name: the inputs, the model's
    constants and, where the projections are MatMuls, their products (which ONNX Runtime
    computes: projection_product)."""
    values = feeds | {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    if p.source == "matmul":
        values |= {f"{o}_cols": projection_product(p, feeds["x"], values[f"w{o}"]) for o in "qkv"}
    return values


# SDPA cores the tests run: both exporters, each scale placement, additive and boolean masks
# (kept where true, or where false), masks per key or per (query, key), with and without the
# guard, rank-4 heads transposed back or not, ragged tiles.
SDPA = [
    Sdpa(Core((2, 3), 70, 70, 64, (2, 1, 1, 70))),
    Sdpa(Core((2, 3), 70, 70, 64, (2, 1, 1, 70)), exporter="ts"),
    Sdpa(Core((1, 2), 33, 130, 32, (1, 1, 33, 130), transposed=False), exporter="ts", scale="q"),
    Sdpa(Core((2, 2), 20, 64, 16, (2, 1, 20, 64)), scale="div", mask="keep"),
    Sdpa(Core((2, 2), 20, 70, 16, (2, 2, 20, 70), transposed=False), exporter="ts", mask="drop"),
    Sdpa(Core((2, 2), 65, 65, 32, None), exporter="ts", guard=False),
    Sdpa(Core((1, 2), 40, 40, 16, (1, 1, 40, 40)), exporter="ts", mask="keep", guard=False),
    Sdpa(Core((2, 2), 50, 50, 32, (1, 1, 50, 50)), mask="first", guard=False),
]


# Decoder attention as transformers writes it for LLaMA/Qwen2 (issue 22), node for node as in
# build/corpus/{qwen2,llama}-{dynamo,ts}.onnx: K and V repeated to the q heads (repeat_kv:
# Unsqueeze → Expand → Reshape), kᵀ by Transpose (TorchScript) or Reshape → Transpose → Reshape
# (dynamo), and the mask Where(And(key ≤ query + Sk − Sq, padding), 0, lowest) built from iotas
# of the operands' shapes, added to the scores.


@dataclass(frozen=True)
class Decoder:
    """A grouped-KV core: q [b, heads, sq, d], K and V [b, heads / group, sk, d]."""

    b: int
    heads: int
    group: int
    sq: int
    sk: int
    d: int
    form: str = "dynamo"  # or "ts"; "mqa": one K and V head (group = heads) broadcast, no repeat_kv
    causal: bool = True
    padding: str = ""  # "": none; "input": a [b, 1, 1, sk] boolean input; "computed": Not of one
    dtype: int = TP.FLOAT
    dv: int | None = None  # V's head width where not d (DeepSeek's latent attention: q, k 48, v 32)

    @property
    def values(self) -> int:
        return self.d if self.dv is None else self.dv

    @property
    def id(self) -> str:
        kind = "" if self.dtype == TP.FLOAT else f"-{np_dtype(self.dtype).name}"
        return (f"{self.form}-h{self.heads}g{self.group}-q{self.sq}-k{self.sk}-d{self.d}"
                f"{f'-dv{self.dv}' if self.dv is not None else ''}"
                f"{'-causal' if self.causal else ''}{'-pad-' + self.padding if self.padding else ''}{kind}")


def decoder_model(c: Decoder) -> onnx.ModelProto:
    """The core as a model with inputs q, k, v (and pad) and output y [b, sq, heads, d]."""
    vi, mk, t = helper.make_tensor_value_info, helper.make_node, c.dtype
    kv = c.heads // c.group
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [i64("ax2", [2]), i64("ax1", [1]), i64("two", 2), i64("zero", 0), i64("one", 1),
             i64("expk", [c.b, kv, c.group, c.sk, c.d]), i64("repk", [c.b, c.heads, c.sk, c.d]),
             i64("expv", [c.b, kv, c.group, c.sk, c.values]), i64("repv", [c.b, c.heads, c.sk, c.values]),
             i64("m3", [c.b * c.heads, c.sk, c.d]), i64("t4", [c.b, c.heads, c.d, c.sk]),
             numpy_helper.from_array(cast(np.array(1 / np.sqrt(c.d)), t), "scale"),
             numpy_helper.from_array(cast(np.array(0.0), t), "zerof"),
             numpy_helper.from_array(cast(np.array(lowest(t)), t), "fill")]
    nodes = []
    if c.form == "mqa":  # one K and V head, broadcast by the products themselves (Falcon)
        assert kv == 1
        nodes.append(mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    else:
        for x in ("k", "v"):
            nodes += [mk("Unsqueeze", [x, "ax2"], [f"{x}u"]), mk("Expand", [f"{x}u", f"exp{x}"], [f"{x}e"]),
                      mk("Reshape", [f"{x}e", f"rep{x}"], [f"{x}r"])]
    if c.form == "ts":
        nodes.append(mk("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]))
    elif c.form == "dynamo":
        nodes += [mk("Reshape", ["kr", "m3"], ["k3"]), mk("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
                  mk("Reshape", ["k3t", "t4"], ["kt"])]
    nodes += [mk("MatMul", ["q", "kt"], ["s"]), mk("Mul", ["s", "scale"], ["ss"])]
    ins = [vi("q", t, [c.b, c.heads, c.sq, c.d]), vi("k", t, [c.b, kv, c.sk, c.d]),
           vi("v", t, [c.b, kv, c.sk, c.values])]
    last = "ss"
    if c.causal or c.padding:
        cond = []
        if c.causal:  # key <= query + Sk - Sq, from the shapes
            nodes += [mk("Shape", ["q"], ["qsh"]), mk("Gather", ["qsh", "two"], ["sqn"], axis=0),
                      mk("Shape", ["k"], ["ksh"]), mk("Gather", ["ksh", "two"], ["skn"], axis=0),
                      mk("Sub", ["skn", "sqn"], ["off"]), mk("Range", ["zero", "sqn", "one"], ["qi"]),
                      mk("Add", ["qi", "off"], ["qo"]), mk("Unsqueeze", ["qo", "ax1"], ["qc"]),
                      mk("Range", ["zero", "skn", "one"], ["ki"]), mk("LessOrEqual", ["ki", "qc"], ["causal"])]
            cond.append("causal")
        if c.padding:
            ins.append(vi("pad", TP.BOOL, [c.b, 1, 1, c.sk]))
            if c.padding == "computed":
                nodes.append(mk("Not", ["pad"], ["padn"]))
            cond.append("padn" if c.padding == "computed" else "pad")
        if len(cond) == 2:
            nodes.append(mk("And", cond, ["cond"]))
        nodes += [mk("Where", ["cond" if len(cond) == 2 else cond[0], "zerof", "fill"], ["mask"]),
                  mk("Add", ["ss", "mask"], ["sm"])]
        last = "sm"
    nodes += [mk("Softmax", [last], ["p"], axis=-1), mk("MatMul", ["p", "v" if c.form == "mqa" else "vr"], ["ctx"]),
              mk("Transpose", ["ctx"], ["y"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, "decoder", ins, [vi("y", t, [c.b, c.sq, c.heads, c.values])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8  # onnx's default (IR 14 with onnx 1.23) is newer than ORT 1.31 reads
    return m


def decoder_feeds(c: Decoder, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random q, K, V; a padding mask keeping each batch's keys from a random start (so that
    the first rows of a left-padded batch have every key masked)."""
    kv = c.heads // c.group
    feeds = {"q": cast(rng.standard_normal((c.b, c.heads, c.sq, c.d)), c.dtype),
             "k": cast(rng.standard_normal((c.b, kv, c.sk, c.d)), c.dtype),
             "v": cast(rng.standard_normal((c.b, kv, c.sk, c.values)), c.dtype)}
    if c.padding:
        keep = np.ones((c.b, 1, 1, c.sk), bool)
        keep[0, ..., :min(c.sk - 1, 3 + c.sk // 3)] = False  # batch 0 left-padded
        keep[..., rng.integers(0, c.sk, 2)] = False
        feeds["pad"] = ~keep if c.padding == "computed" else keep
    return feeds


def decoder_reference(c: Decoder, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """softmax(q·kᵀ·scale + mask)·v in float64, K and V repeated (q head h reads KV head
    h // group), the masked scores at the fill; [b, sq, heads, d]."""
    q, k, v = (feeds[x].astype(np.float64) for x in ("q", "k", "v"))
    k, v = np.repeat(k, c.group, axis=1), np.repeat(v, c.group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * float(cast(np.array(1 / np.sqrt(c.d)), c.dtype))
    keep = np.ones(s.shape, bool)
    if c.causal:
        keep &= np.arange(c.sk)[None, :] <= np.arange(c.sq)[:, None] + (c.sk - c.sq)
    if c.padding:
        keep &= ~feeds["pad"] if c.padding == "computed" else feeds["pad"]
    s = np.where(keep, s, lowest(c.dtype))  # scores + lowest round to lowest
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.swapaxes((p / p.sum(-1, keepdims=True)) @ v, 1, 2)
