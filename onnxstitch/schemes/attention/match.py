"""The attention stage: the core of scaled dot-product attention as one kernel.

Design note
-----------
Exporters write attention's core as MatMul(q, kᵀ) → Softmax over the keys → MatMul(·, v), often
followed by the Transpose that puts heads back beside each other ([b, h, s, d] → [b, s, h, d]),
with these between:

- a scale: a Mul or Div by a scalar constant after the product (the eager form), or on q and/or
  kᵀ before it (transformers' SDPA as both torch.onnx exporters write it: each by
  1/sqrt(sqrt(d)), or q alone); all fold into the kernel's one scale, their product;
- up to MAX_MASKS terms: Adds of a mask or T5's position bias (the exporters' boolean masks
  arrive as such a term, Where(mask, 0, -max) computed once outside the chain), and at most one
  boolean mask on the scores themselves, Where(mask, scores, fill) or Where(mask, fill, scores)
  with a scalar fill, outermost;
- after the Softmax, SDPA's guard Where(IsNaN(p), 0, p): a row whose every score is -inf gives
  zeros instead of NaN, and the kernel is generated to do the same (`guarded`).

Stock ONNX Runtime runs that as two batched
GEMMs around a Softmax kernel and a Transpose, writing and re-reading the scores each time.
Here the chain is one kernel (codegen.py): a block owns 64 queries of one (batch,
head), walks the keys in tiles of 64 with the running-maximum Softmax of FlashAttention, and
writes the context once, transposed when the Transpose was part of the chain.

Every Softmax between two MatMuls is matched or refused with why (`Found.refusals`, in the
report): anything else between them (a Reshape in DeBERTa's scores, a third term) is named.

Where q, kᵀ and v are each a projection's output split into heads — Transpose ← Reshape
[b, s, h·d] → [b, s, h, d] ← [Add bias] ← [Slice or Split of the columns] ← x [b, s, w], as
BERT, GPT-2, ViT and T5 write them (the merge stage makes Q/K/V one GEMM and a Slice each) —
the kernel reads x itself at the head's columns and adds the bias as it loads: the kernel that
would add the biases and write q, kᵀ and v apart (as much traffic as the attention itself at
BERT's sizes) is not needed.

Both products run on tensor cores: float32 chains in TF32, as ONNX Runtime's float32 GEMMs do
by default (`use_tf32`), so their groups are marked `tf32` and verified at TF32's accuracy
(verify.py); float16 and bfloat16 chains (every operand, additive mask and the context of one
of them) on half-precision products with float32 accumulation and a float32 Softmax, verified
at half precision's tolerance as any half-precision group.

This module decides legality only (which chains can be one kernel, and why not) and prices a
chain as one kernel (`group_of`); taking it is the plan's choice: each chain is a candidate of
the one ILP (plan.py), weighed against the rows and elementwise groups over its Softmax, scale
and mask and the two GEMMs ORT would run. At BERT's sizes it wins by far (two launches and two
round trips of the scores saved). A chain is convex by construction (its intermediates have no
reader outside it), so choosing it adds no cycle the plan's cuts do not already handle.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from onnx import TensorProto as TP

from ...cost import CostModel
from ...graph import FusionGraph
from ...planned import Group, Plan
from .. import ATTENTION
from . import decode, decoder
from .chain import (DTYPES, MAX_HEAD, MAX_MASKS, MIN_HEAD, TENSOR_TFLOPS, Match, Projection, Select,  # noqa: F401
                    context_elements, flops, planned_dim, planned_keys, same as _same, scalar as _scalar)

# Head sizes the kernel is generated for: whole mma fragments (8), registers for the
# context (D / 2 floats per thread) and the query fragments (D / 2) within one thread's budget.
@dataclass(frozen=True)
class Found:
    """The chains that become attention kernels, and the near-misses with why."""

    matches: tuple[Match, ...] = ()
    refusals: tuple[str, ...] = ()


def _op(g: FusionGraph, t: str) -> str | None:
    """The op type of `t`'s producer (None for graph inputs and constants)."""
    at = g.producer.get(t)
    return None if at is None else g.nodes[at].op_type


def _scaling(g: FusionGraph, t: str) -> tuple[str, float, int] | None:
    """(x, factor, the node) when `t` is x multiplied or divided by a non-zero scalar constant
    (simplify folds one computed from fixed dims: TorchScript's SDPA without a scale)."""
    at = g.producer.get(t)
    if at is None or g.nodes[at].op_type not in ("Mul", "Div"):
        return None
    n = g.nodes[at]
    a, b = n.inputs[:2]
    for inner, factor in ((a, b), (b, a)) if n.op_type == "Mul" else ((a, b),):
        value = _scalar(g, factor)
        if value is not None and value != 0 and math.isfinite(value) and factor != inner:
            return inner, (value if n.op_type == "Mul" else 1.0 / value), at
    return None


def _scaled(g: FusionGraph, t: str) -> tuple[str, float, int | None] | None:
    """(product, scale, the Mul/Div node or None) when `t` is a MatMul's product, possibly
    multiplied or divided by a scalar constant; None otherwise."""
    if _op(g, t) == "MatMul":
        return t, 1.0, None
    s = _scaling(g, t)
    if s is not None and _op(g, s[0]) == "MatMul":
        return s
    return None


def _upcast(g: FusionGraph, t: str) -> tuple[str, int] | None:
    """(the half tensor, the Cast) when `t` is Cast(to float32) of a float16/bfloat16 tensor:
    TorchScript's SDPA in a half model adds a float32 mask to the product cast to float32, and
    casts V to float32 for the second product."""
    at = g.producer.get(t)
    if at is None or g.nodes[at].op_type != "Cast" or g.nodes[at].attrs.get("to") != TP.FLOAT:
        return None
    src = g.nodes[at].inputs[0]
    info = g.tensors.get(src)
    return (src, at) if info is not None and info.dtype in (TP.FLOAT16, TP.BFLOAT16) else None


def _upcast_scores(g: FusionGraph, t: str) -> tuple[str, int] | None:
    """(the half scores, the Cast) when `t` is the (scaled) half product cast to float32."""
    got = _upcast(g, t)
    return got if got is not None and _scaled(g, got[0]) is not None else None


def _leads_to_scores(g: FusionGraph, t: str, adds: int) -> bool:
    """Whether `t` is the (scaled, capped) product, or reaches it through at most `adds` more Adds."""
    if _scaled(g, t) is not None or _upcast_scores(g, t) is not None:
        return True
    if (capped := _softcap(g, t)) is not None:
        return _scaled(g, capped[0]) is not None or _upcast_scores(g, capped[0]) is not None
    at = g.producer.get(t)
    if at is not None and g.nodes[at].op_type == "Where" and (got := _select(g, t)) is not None:
        return _leads_to_scores(g, got[0], 0)  # a boolean mask before the terms (Select.first)
    return adds > 0 and at is not None and g.nodes[at].op_type == "Add" and \
        any(_leads_to_scores(g, u, adds - 1) for u in g.nodes[at].inputs[:2])


# How far a Softmax's input and output are searched for a MatMul that the chain's form does not
# reach: such a Softmax is a near-miss, refused with the node that stopped the match.
BACK_SEARCH, AHEAD_SEARCH = 8, 4


def _reaches(g: FusionGraph, t: str, depth: int, backward: bool) -> bool:
    """Whether a MatMul writes (backward) or reads (forward) `t` within `depth` nodes."""
    frontier = {t}
    for _ in range(depth):
        if backward:
            nodes = {g.producer[x] for x in frontier if x in g.producer}
        else:
            nodes = {i for x in frontier for i in g.consumers.get(x, ())}
        if any(g.nodes[i].op_type == "MatMul" for i in nodes):
            return True
        frontier = {x for i in nodes for x in (g.nodes[i].inputs if backward else g.nodes[i].outputs) if x}
    return False


@dataclass(frozen=True)
class _Scores:
    """The scores as the chain computes them, walked back from the Softmax's input."""

    product: str  # the first MatMul's output
    scale: float  # the scale after the product
    masks: tuple[str, ...]
    select: Select | None
    nodes: tuple[int, ...]  # the Mul/Div, the Adds and the Where (and the Cast when upcast)
    upcast: bool = False  # the half product cast to float32 before the terms (_upcast)
    softcap: float = 0.0  # cap · tanh(scores · scale) before the terms (_softcap)


def _softcap(g: FusionGraph, t: str) -> tuple[str, float, float, tuple[int, ...]] | None:
    """(x, the scale inside, the cap, the nodes) when `t` is cap · Tanh(x · scale) with both
    scalar constants, the Tanh's input scaled by a Mul or Div (Gemma 2's logit cap:
    Mul(Tanh(Div(scores, cap)), cap)); None otherwise."""
    at = g.producer.get(t)
    if at is None or g.nodes[at].op_type != "Mul":
        return None
    a, b = g.nodes[at].inputs[:2]
    for tanh, cap_t in ((a, b), (b, a)):
        cap = _scalar(g, cap_t)
        inner = g.producer.get(tanh)
        if cap is None or not cap > 0 or inner is None or g.nodes[inner].op_type != "Tanh":
            continue
        scaled = _scaling(g, g.nodes[inner].inputs[0])
        if scaled is None:
            return None
        return scaled[0], scaled[1], cap, (at, inner, scaled[2])
    return None


def _select(g: FusionGraph, t: str) -> tuple[str, Select] | None:
    """(the scores, the boolean mask) when `t` is Where(mask, scores, fill) or Where(mask, fill,
    scores), the mask boolean and the fill a scalar constant that is not NaN or +inf."""
    at = g.producer.get(t)
    if at is None or g.nodes[at].op_type != "Where":
        return None
    cond, x, y = g.nodes[at].inputs[:3]
    info = g.tensors.get(cond)
    if info is None or info.dtype != TP.BOOL:
        return None
    for scores, fill, keep in ((x, y, True), (y, x, False)):
        value = _scalar(g, fill)
        if value is not None and value == value and value != math.inf and _scalar(g, scores) is None:
            return scores, Select(cond, keep, value)
    return None


def _scores(g: FusionGraph, soft: int) -> _Scores | str:
    """The scores feeding Softmax `soft` in the chain's form, or what stops them being so: the
    first node, walking back, that is not the form's (a refusal when a MatMul lies behind)."""
    x = g.nodes[soft].inputs[0]
    nodes: list[int] = []
    select = None
    got = _select(g, x)
    if got is not None:
        nodes.append(g.producer[x])
        x, select = got
    masks: list[str] = []
    room = MAX_MASKS - (select is not None)
    # Additive terms, outermost first: at each Add, the operand that leads back to the product
    # is the chain, the other a term.
    while _scaled(g, x) is None and _upcast_scores(g, x) is None and _op(g, x) == "Add" and len(masks) < room:
        at = g.producer[x]
        a, b = g.nodes[at].inputs[:2]
        # (Through more Adds than the kernel takes, so that too many terms are named as such.)
        inner, term = (a, b) if _leads_to_scores(g, a, BACK_SEARCH) else \
            (b, a) if _leads_to_scores(g, b, BACK_SEARCH) else (None, None)
        if inner is None:
            # Neither side is the form's: name the node on the side a MatMul lies behind.
            x = next((u for u in (a, b) if _reaches(g, u, BACK_SEARCH, backward=True)), x)
            break
        masks.insert(0, term)
        nodes.append(at)
        x = inner
    if select is None and masks and len(masks) < MAX_MASKS and (got := _select(g, x)) is not None:
        # A boolean mask before the added terms (GPT-Neo: Where(causal, scores, fill) + mask)
        nodes.append(g.producer[x])
        x, select = got[0], dataclasses.replace(got[1], first=True)
    capped = _softcap(g, x)
    inner = 1.0  # the scale inside the cap's tanh (its division by the cap)
    if capped is not None:
        x, inner = capped[0], capped[1]
        nodes += capped[3]
    upcast = _upcast_scores(g, x)
    if upcast is not None:
        nodes.append(upcast[1])
        x = upcast[0]
    scaled = _scaled(g, x)
    if scaled is None:
        at = g.producer.get(x)
        if at is None:
            return f"its input '{x}' comes from no MatMul"
        n = g.nodes[at]
        what = ("more terms than the kernel adds" if n.op_type == "Add" and len(masks) == room
                else "a boolean mask before an added term" if n.op_type == "Where" and x != g.nodes[soft].inputs[0]
                else "not the chain's form")
        return (f"{n.op_type} '{n.name or n.outputs[0]}' between the scores' product and the Softmax ({what}: a "
                f"scale, a cap · tanh, up to {MAX_MASKS} added terms or boolean masks (one Where, outermost))")
    product, scale, scaler = scaled
    return _Scores(product, scale * inner, tuple(masks), select,
                   tuple(nodes) + ((scaler,) if scaler is not None else ()), upcast=upcast is not None,
                   softcap=capped[2] if capped is not None else 0.0)


def _guarded_probabilities(g: FusionGraph, soft: int) -> tuple[str, tuple[int, ...]]:
    """(the probabilities as the second MatMul should read them, the guard's nodes): after
    Where(IsNaN(p), 0, p), or p itself when there is no such guard."""
    p = g.nodes[soft].outputs[0]
    readers = g.consumers.get(p, ())
    if len(readers) != 2:  # (p read elsewhere too is refused as such by the chain's check)
        return p, ()
    isnan = next((i for i in readers if g.nodes[i].op_type == "IsNaN"), None)
    where = next((i for i in readers if g.nodes[i].op_type == "Where"), None)
    if isnan is None or where is None or g.only_reader(g.nodes[isnan].outputs[0]) != where:
        return p, ()
    cond, zero, kept = g.nodes[where].inputs[:3]
    if cond != g.nodes[isnan].outputs[0] or kept != p or _scalar(g, zero) != 0:
        return p, ()
    return g.nodes[where].outputs[0], (isnan, where)


def _operand(g: FusionGraph, t: str, first: int) -> tuple[str, float, tuple[int, ...]]:
    """(the operand, its scale, the scale's node) for the first MatMul's input `t`: SDPA scales
    q and kᵀ before the product; a Mul/Div by a scalar read by the product alone folds into the
    kernel's scale."""
    s = _scaling(g, t)
    if s is None or g.only_reader(t) != first:
        return t, 1.0, ()
    return s[0], s[1], (s[2],)


def _chain(g: FusionGraph, soft: int) -> Match | str | None:
    """The chain around Softmax `soft`, why it cannot be one kernel, or None when the Softmax
    is not between two MatMuls at all (nothing worth reporting)."""
    n = g.nodes[soft]
    name = f"attention at '{n.name or n.outputs[0]}'"
    probs, guard = _guarded_probabilities(g, soft)
    second = next((c for c in g.consumers.get(probs, ()) if g.nodes[c].op_type == "MatMul"
                   and g.nodes[c].inputs[0] == probs), None)
    if second is None:
        if not _reaches(g, n.outputs[0], AHEAD_SEARCH, backward=False) or \
                not _reaches(g, n.inputs[0], BACK_SEARCH, backward=True):
            return None
        ops = sorted({g.nodes[c].op_type for c in g.consumers.get(probs, ())})
        return (f"{name}: the probabilities reach the second MatMul through {', '.join(ops)} (the kernel takes them "
                f"as they are, or through Where(IsNaN(p), 0, p))")
    scores = _scores(g, soft)
    if isinstance(scores, str):
        return f"{name}: {scores}" if _reaches(g, n.inputs[0], BACK_SEARCH, backward=True) else None
    first = g.producer[scores.product]
    q, q_scale, q_node = _operand(g, g.nodes[first].inputs[0], first)
    kt, k_scale, k_node = _operand(g, g.nodes[first].inputs[1], first)
    v = g.nodes[second].inputs[1]
    ctx = g.nodes[second].outputs[0]
    nodes = set(q_node + k_node + scores.nodes + guard) | {first, soft, second}
    v_reader = second
    if scores.upcast:  # V comes cast to float32 as well: the kernel reads it as it was
        v_cast = _upcast(g, v)
        if v_cast is None or g.tensors[v_cast[0]].dtype != g.tensors[q].dtype:
            return f"{name}: the scores are cast to float32 but '{v}' is not the half V cast alike"
        v, v_reader = v_cast
        nodes.add(v_reader)
    # Convex: what the chain computes before its context is read only inside it.
    for i in sorted(nodes - {second}):
        for t in g.nodes[i].outputs:
            if t and (t in g.graph_outputs or any(c not in nodes for c in g.consumers.get(t, ()))):
                return f"{name}: '{t}' is also read outside the chain"
    transposed = False
    after = g.only_reader(ctx)
    if after is not None and g.nodes[after].op_type == "Transpose" and \
            list(g.nodes[after].attrs.get("perm", ())) == [0, 2, 1, 3]:
        nodes.add(after)
        ctx, transposed = g.nodes[after].outputs[0], True
    select = scores.select
    why = _shape_reason(g, q, kt, v, scores.masks + ((select.mask,) if select else ()), ctx, soft, bool(select),
                        scores.upcast)
    if why:
        return f"{name}: {why}"
    d, dv = int(g.shape(q)[-1]), int(g.shape(v)[-1])  # type: ignore[index]
    match = Match(tuple(sorted(nodes)), q, kt, v, scores.masks, scores.scale * q_scale * k_scale, ctx, transposed,
                  d, select=select, guarded=bool(guard), softmax=n.name or n.outputs[0], dtype=g.tensors[q].dtype,
                  upcast=scores.upcast, softcap=scores.softcap, value_dim=dv if dv != d else 0)
    readers = (q_node[0] if q_node else first, k_node[0] if k_node else first, v_reader)
    # (Projections are taken for chains of one element type; they and grouped KV heads read
    # heads of one width.)
    if not match.value_dim:
        match = (None if match.upcast else _projections(g, match, readers)) or decoder.with_groups(g, match, readers)
    if match.kv_group == 1 and decoder.heads_broadcast(g, match.q, match.kt, match.v):
        return f"{name}: one K and V head broadcast against q's heads, kᵀ not a transpose of K read only here"
    causal = decoder.with_causal(g, match)
    return causal if isinstance(causal, Match) else dataclasses.replace(match, decoder_note=causal)


# Transposes from [b, s, h, d] to the operands: q and v [b, h, s, d], kᵀ [b, h, d, s].
_HEADS_FIRST, _KEYS_TRANSPOSED = [0, 2, 1, 3], [0, 2, 3, 1]


def _projection(g: FusionGraph, t: str, perm: list[int], reader: int, dtype: int) -> tuple[Projection, int] | None:
    """(operand `t` as columns of a projection's output, its head count) when `t` is
    Transpose(perm) ← Reshape([b, s, h·d] → [b, s, h, d]) ← [Add a bias [h·d]] ← [a Slice/Split
    of the last axis] ← x [b, s, w], x and the bias of the chain's `dtype`, with every tensor
    between read once, and the columns 4-element aligned (the kernel reads 4 elements at a
    time: 16 bytes of float32, 8 of half); None otherwise."""
    at = g.producer.get(t)
    if at is None or g.only_reader(t) != reader or g.nodes[at].op_type != "Transpose" or \
            list(g.nodes[at].attrs.get("perm", ())) != perm:
        return None
    r = g.nodes[at].inputs[0]
    rs = g.producer.get(r)
    if rs is None or g.only_reader(r) != at or g.nodes[rs].op_type != "Reshape":
        return None
    a = g.nodes[rs].inputs[0]
    split, flat = g.shape(r), g.shape(a)
    if split is None or flat is None or len(split) != 4 or len(flat) != 3 or \
            not (_same(split[0], flat[0]) and _same(split[1], flat[1])):
        return None
    h, d = split[2], split[3]
    if not isinstance(h, int) or not isinstance(d, int) or flat[2] != h * d:
        return None
    nodes, bias = [at, rs], None
    ad = g.producer.get(a)
    if ad is not None and g.only_reader(a) == rs and g.nodes[ad].op_type == "Add":
        x0, x1 = g.nodes[ad].inputs[:2]
        for y, b in ((x0, x1), (x1, x0)):
            if b in g.constants and g.shape(b) == (h * d,) and g.tensors[b].dtype == dtype and \
                    g.shape(y) == flat:
                a, bias = y, b
                nodes.append(ad)
                break
    box = g.boxes.get(a)
    x, offset = a, 0
    if box is not None and g.only_reader(a) == nodes[-1] and box.axis == 2:
        x, offset = box.source, box.start
        nodes.append(g.producer[a])
    xs = g.shape(x)
    info = g.tensors.get(x)
    if xs is None or len(xs) != 3 or info is None or info.dtype != dtype or not _same(xs[0], flat[0]) or \
            not _same(xs[1], flat[1]) or not isinstance(xs[2], int) or xs[2] % 4 or offset % 4 or \
            offset + h * d > xs[2]:
        return None
    return Projection(x, offset, bias, tuple(nodes)), h


def _projections(g: FusionGraph, m: Match, readers: tuple[int, int, int]) -> Match | None:
    """`m` reading q, kᵀ and v from their projections (module docstring), or None when one of
    them is not such a read, their head counts or biases differ, or a Split's other outputs are
    read outside the chain. `readers`: the chain's node reading each of q, kᵀ and v."""
    got = [_projection(g, m.q, _HEADS_FIRST, readers[0], m.dtype),
           _projection(g, m.kt, _KEYS_TRANSPOSED, readers[1], m.dtype),
           _projection(g, m.v, _HEADS_FIRST, readers[2], m.dtype)]
    if any(p is None for p in got):
        return None
    projections = tuple(p for p, _ in got)  # type: ignore[misc]
    heads = {h for _, h in got}  # type: ignore[misc]
    if len(heads) != 1 or len({p.bias is None for p in projections}) != 1:
        return None
    members = {i for p in projections for i in p.nodes}
    # Every output of the nodes before the Transposes (a Split's three included) stays inside.
    for i in members - {p.nodes[0] for p in projections}:
        for t in g.nodes[i].outputs:
            if t and (t in g.graph_outputs or any(c not in members for c in g.consumers.get(t, ()))):
                return None
    xq, xk, xv = (g.shape(p.x) for p in projections)
    if not (_same(xq[0], xk[0]) and _same(xq[0], xv[0]) and _same(xk[1], xv[1])):  # type: ignore[index]
        return None
    nodes = tuple(sorted(set(m.nodes) | members))
    return dataclasses.replace(m, nodes=nodes, projections=projections, heads=heads.pop())


def _shape_reason(g: FusionGraph, q: str, kt: str, v: str, masks: tuple[str, ...], ctx: str,
                  soft: int, select: bool, upcast: bool = False) -> str | None:
    """Why these operands do not fit the kernel (None when they do); the last of `masks` is
    the boolean one when `select`; `upcast`: the added terms and the context are float32."""
    info = g.tensors.get(q)
    dtype = None if info is None else info.dtype
    if dtype not in DTYPES:
        have = "unknown" if dtype is None else TP.DataType.Name(dtype).lower()
        return f"'{q}' is {have}: the kernel is generated for {', '.join(DTYPES.values())}"
    for t in (kt, v, *masks, ctx):
        info = g.tensors.get(t)
        if info is not None and info.dtype == TP.BOOL and t == masks[-1] and select:
            continue
        want = TP.FLOAT if upcast and t not in (kt, v) else dtype
        if info is None or info.dtype != want:
            have = "unknown" if info is None else TP.DataType.Name(info.dtype).lower()
            return f"'{t}' is {have} where {DTYPES[want]} is needed: the kernel takes these element types"
    qs, ks, vs = g.shape(q), g.shape(kt), g.shape(v)
    if qs is None or ks is None or vs is None:
        return "operand shapes are unknown"
    if not 3 <= len(qs) <= 4 or len(ks) != len(qs) or len(vs) != len(qs):
        return f"operands of rank {len(qs)}, {len(ks)}, {len(vs)}: [b, s, d] or [b, h, s, d] each"
    # (one K and V head broadcast against q's heads is multi-query attention: decoder.broadcast)
    if not all(_same(a, b) and _same(a, c) for a, b, c in zip(qs[:-2], ks[:-2], vs[:-2])) and \
            not decoder.heads_broadcast(g, q, kt, v):
        return f"batch dims of q {list(qs)}, kᵀ {list(ks)} and v {list(vs)} differ (no broadcasting)"
    d, dv = qs[-1], vs[-1]
    # (V's heads may be wider or narrower than q's and kᵀ's: LeViT's are 2-4 times as wide.)
    if not isinstance(d, int) or not _same(d, ks[-2]) or not isinstance(dv, int):
        return f"head dims {qs[-1]}, {ks[-2]}, {vs[-1]} are not fixed sizes, q's and kᵀ's alike"
    for what, size in (("head size", d), ("value head size", dv)):
        if size % 8 or not MIN_HEAD <= size <= MAX_HEAD:
            return f"{what} {size}: a multiple of 8 from {MIN_HEAD} to {MAX_HEAD} is needed"
    if not _same(ks[-1], vs[-2]):
        return f"keys {ks[-1]} and values {vs[-2]} differ in length"
    scores = tuple(qs[:-1]) + (ks[-1],)
    for mask in masks:
        ms = g.shape(mask)
        if ms is None or len(ms) > len(scores):
            return f"the shape of mask '{mask}' is unknown or of higher rank than the scores"
        for have, want in zip(reversed(ms), reversed(scores)):
            if have != 1 and not _same(have, want):
                return f"the mask {list(ms)} does not broadcast to the scores {list(scores)}"
    if g.opset < 13 and g.nodes[soft].attrs.get("axis", 1) not in (-1, len(qs) - 1):
        return "Softmax before opset 13 over more than the keys"
    if g.opset >= 13 and int(g.nodes[soft].attrs.get("axis", -1)) % len(qs) != len(qs) - 1:
        return "Softmax is not over the keys (the last axis)"
    return None


def find(g: FusionGraph) -> Found:
    """Every attention chain of `g` that one kernel can run, and the near-misses with why."""
    matches: list[Match] = []
    refusals: list[str] = []
    taken: set[int] = set()
    for n in g.nodes:
        if n.op_type != "Softmax" or n.domain not in ("", "ai.onnx"):
            continue
        got = _chain(g, n.index)
        if got is None:
            continue
        if isinstance(got, str):
            refusals.append(got)
            continue
        if taken & set(got.nodes):
            refusals.append(f"attention at '{got.softmax}': shares nodes with a chain found before it")
            continue
        taken |= set(got.nodes)
        matches.append(got)
        if got.decoder_note:
            refusals.append(got.decoder_note)
    return Found(tuple(matches), tuple(refusals))


def group_of(g: FusionGraph, cost: CostModel, name: str, m: Match) -> Group:
    """The plan's group for chain `m`: one launch and the roofline of moving q, kᵀ, v, the masks
    and the context once each against both products at the tensor rate of the chain's dtype
    (half precision: half the bytes of float32 and twice the rate). Memory dominates at
    BERT's sizes; long sequences make the products count. Where the decode kernel is cheaper at
    the planning shapes (decode.better: few queries, grouped heads), its cost, and the chain
    carries its entries."""
    moved = sum(g.tensor_bytes(t) for t in dict.fromkeys(m.inputs + (m.output,)))
    compute_us = flops(g, m) / (TENSOR_TFLOPS[m.dtype] * 1e6)
    us = cost.launch_us + max(moved / (cost.bandwidth_gbs * 1e3), compute_us)
    cheaper, tiled_us, decode_us = decode.better(g, cost, m)
    if cheaper:
        m, us = dataclasses.replace(m, decode=True), us - tiled_us + decode_us
    return Group(name, m.nodes, m.inputs, (m.output,), None, moved, us,
                 tuple(g.nodes[i].label for i in m.nodes), tf32=m.dtype == TP.FLOAT, scheme=ATTENTION, payload=m)


def chosen(found: Found, plan: Plan) -> Found:
    """`found` as the plan left it: the chains it runs as attention kernels, and those it found
    cheaper to run otherwise among the refusals, with why."""
    taken = {grp.payload.nodes: grp.payload for grp in plan.groups if grp.scheme == ATTENTION}
    passed = [f"{m.describe()}: the plan found other kernels over these nodes cheaper"
              for m in found.matches if m.nodes not in taken]
    return Found(tuple(taken[m.nodes] for m in found.matches if m.nodes in taken), found.refusals + tuple(passed))
