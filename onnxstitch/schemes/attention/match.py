"""Stage 5b: attention — the core of scaled dot-product attention as one kernel.

Design note
-----------
Exporters write attention's core as MatMul(q, kᵀ) → (Mul | Div by a scalar) → (Add mask, after
Add position bias in T5) →
Softmax over the keys → MatMul(·, v), often followed by the Transpose that puts heads back
beside each other ([b, h, s, d] → [b, s, h, d]). Stock ONNX Runtime runs that as two batched
GEMMs around a Softmax kernel and a Transpose, writing and re-reading the scores each time.
Here the chain is one kernel (codegen_attention.py): a block owns 64 queries of one (batch,
head), walks the keys in tiles of 64 with the running-maximum Softmax of FlashAttention, and
writes the context once, transposed when the Transpose was part of the chain.

Where q, kᵀ and v are each a projection's output split into heads — Transpose ← Reshape
[b, s, h·d] → [b, s, h, d] ← [Add bias] ← [Slice or Split of the columns] ← x [b, s, w], as
BERT, GPT-2, ViT and T5 write them (the merge stage makes Q/K/V one GEMM and a Slice each) —
the kernel reads x itself at the head's columns and adds the bias as it loads: the kernel that
would add the biases and write q, kᵀ and v apart (as much traffic as the attention itself at
BERT's sizes) is not needed.

Both products run on tensor cores in TF32, as ONNX Runtime's float32 GEMMs do by default
(`use_tf32`), so the groups are marked `tf32` and verified at TF32's accuracy (verify.py).

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

import numpy as np
from onnx import TensorProto as TP

from ...cost import CostModel
from ...graph import FusionGraph, constant_value
from ...plan import Group, Plan
from .. import ATTENTION

# Head sizes the kernel is generated for: whole mma fragments (8), registers for the
# context (D / 2 floats per thread) and the query fragments (D / 2) within one thread's budget.
MIN_HEAD, MAX_HEAD = 8, 128
# Terms added to the scaled scores (a mask; T5 adds a position bias first): the kernel reads
# each through its own strides (docs/abi.md).
MAX_MASKS = 2


@dataclass(frozen=True)
class Projection:
    """An operand read straight from a projection's output `x` [b, s, w]: head j's columns are
    offset + j·d .. offset + (j+1)·d, plus `bias` [h·d] where the chain adds one; `nodes` are the
    Transpose, Reshape, Add and Slice/Split between x and the operand."""

    x: str
    offset: int
    bias: str | None
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Match:
    """One attention chain: its nodes and what the kernel needs to know of them."""

    # topological: [the projections' nodes], MatMul, [Mul|Div], [Add, [Add]], Softmax, MatMul, [Transpose]
    nodes: tuple[int, ...]
    q: str  # [L..., Sq, D]
    kt: str  # [L..., D, Sk]: the first MatMul's second operand, keys already transposed
    v: str  # [L..., Sk, D]
    masks: tuple[str, ...]  # added to the scaled scores in this order; each broadcasts to [L..., Sq, Sk]
    scale: float  # the scores' multiplier (1 when there is no Mul/Div)
    output: str  # the context, [L..., Sq, D], or [b, Sq, h, D] when `transposed`
    transposed: bool
    head_dim: int
    # q, kᵀ and v read from their projections (all three or none), with `heads` heads.
    projections: tuple[Projection, ...] = ()
    heads: int = 0

    @property
    def biased(self) -> bool:
        return any(p.bias for p in self.projections)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The kernel's inputs: q, kᵀ, v (or the projections' outputs, then their biases), then
        the masks (docs/abi.md)."""
        if not self.projections:
            return (self.q, self.kt, self.v) + self.masks
        biases = tuple(p.bias for p in self.projections if p.bias)
        return tuple(p.x for p in self.projections) + biases + self.masks

    def describe(self) -> str:
        """One line for reports."""
        mask = "".join(f" + '{t}'" for t in self.masks)
        read = ""
        if self.projections:
            cols = ", ".join(f"'{p.x}'[{p.offset}:]" for p in self.projections)
            read = f"; q, kᵀ, v read from {cols}{' with their biases' if self.biased else ''}"
        return (f"'{self.q}' · '{self.kt}' × {self.scale:g}{mask} → Softmax → · '{self.v}' → '{self.output}'"
                f"{' (transposed)' if self.transposed else ''}, heads of {self.head_dim}{read}")


@dataclass(frozen=True)
class Found:
    """The chains that become attention kernels, and the near-misses with why."""

    matches: tuple[Match, ...] = ()
    refusals: tuple[str, ...] = ()


def _only_reader(g: FusionGraph, tensor: str) -> int | None:
    """The node reading `tensor` when it is the only one and the tensor leaves no other way."""
    readers = g.consumers.get(tensor, ())
    if len(readers) != 1 or tensor in g.graph_outputs:
        return None
    return readers[0]


def _scalar(g: FusionGraph, tensor: str) -> float | None:
    c = g.constants.get(tensor)
    if c is None or math.prod(c.dims) != 1 or c.data_type not in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16):
        return None
    return float(np.asarray(constant_value(g, tensor)))


def _same(a: object, b: object) -> bool:
    """Dims known equal: the same number or the same symbol."""
    return a is not None and a == b


def _scaled(g: FusionGraph, t: str) -> tuple[str, float, int | None] | None:
    """(product, scale, the Mul/Div node or None) when `t` is a MatMul's product, possibly
    multiplied or divided by a scalar constant; None otherwise."""
    at = g.producer.get(t)
    if at is None:
        return None
    n = g.nodes[at]
    if n.op_type == "MatMul":
        return t, 1.0, None
    if n.op_type not in ("Mul", "Div"):
        return None
    a, b = n.inputs[:2]
    for inner, factor in ((a, b), (b, a)) if n.op_type == "Mul" else ((a, b),):
        value = _scalar(g, factor)
        p = g.producer.get(inner)
        if value is not None and value != 0 and p is not None and g.nodes[p].op_type == "MatMul":
            return inner, (value if n.op_type == "Mul" else 1.0 / value), at
    return None


def _leads_to_scores(g: FusionGraph, t: str, adds: int) -> bool:
    """Whether `t` is the (scaled) product, or reaches it through at most `adds` more Adds."""
    if _scaled(g, t) is not None:
        return True
    at = g.producer.get(t)
    return adds > 0 and at is not None and g.nodes[at].op_type == "Add" and \
        any(_leads_to_scores(g, u, adds - 1) for u in g.nodes[at].inputs[:2])


def _chain(g: FusionGraph, soft: int) -> Match | str | None:
    """The chain around Softmax `soft`, why it cannot be one kernel, or None
    when the Softmax is not between two MatMuls at all (nothing worth reporting)."""
    n = g.nodes[soft]
    x = n.inputs[0]
    nodes = [soft]
    masks: list[str] = []
    # Additive terms, outermost first: at each Add, the operand that leads back to the product
    # is the chain, the other a term.
    while len(masks) < MAX_MASKS and _scaled(g, x) is None:
        at = g.producer.get(x)
        if at is None or g.nodes[at].op_type != "Add":
            break
        a, b = g.nodes[at].inputs[:2]
        inner, term = (a, b) if _leads_to_scores(g, a, MAX_MASKS - len(masks) - 1) else (b, a)
        masks.insert(0, term)
        nodes.insert(0, at)
        x = inner
    scaled = _scaled(g, x)
    if scaled is None:
        return None
    product, scale, scaler = scaled
    if scaler is not None:
        nodes.insert(0, scaler)
    first = g.producer[product]
    probs = n.outputs[0]
    second = next((c for c in g.consumers.get(probs, ()) if g.nodes[c].op_type == "MatMul"
                   and g.nodes[c].inputs[0] == probs), None)
    if second is None:
        return None
    name = f"attention at '{n.name or n.outputs[0]}'"
    chain = [first] + nodes + [second]
    for i, j in zip(chain, chain[1:]):
        if any(_only_reader(g, t) != j for t in g.nodes[i].outputs if t):
            return f"{name}: '{g.nodes[i].outputs[0]}' is also read outside the chain"
    q, kt = g.nodes[first].inputs[:2]
    v = g.nodes[second].inputs[1]
    ctx = g.nodes[second].outputs[0]
    nodes = chain
    transposed = False
    after = _only_reader(g, ctx)
    if after is not None and g.nodes[after].op_type == "Transpose" and \
            list(g.nodes[after].attrs.get("perm", ())) == [0, 2, 1, 3]:
        nodes.append(after)
        ctx, transposed = g.nodes[after].outputs[0], True
    why = _shape_reason(g, q, kt, v, tuple(masks), ctx, soft)
    if why:
        return f"{name}: {why}"
    match = Match(tuple(nodes), q, kt, v, tuple(masks), scale, ctx, transposed, int(g.shape(q)[-1]))  # type: ignore[index]
    return _projections(g, match, first, second) or match


# Transposes from [b, s, h, d] to the operands: q and v [b, h, s, d], kᵀ [b, h, d, s].
_HEADS_FIRST, _KEYS_TRANSPOSED = [0, 2, 1, 3], [0, 2, 3, 1]


def _projection(g: FusionGraph, t: str, perm: list[int], reader: int) -> tuple[Projection, int] | None:
    """(operand `t` as columns of a projection's output, its head count) when `t` is
    Transpose(perm) ← Reshape([b, s, h·d] → [b, s, h, d]) ← [Add a float32 bias [h·d]] ←
    [a Slice/Split of the last axis] ← x [b, s, w] with every tensor between read once, and the
    columns 16-byte aligned (the kernel reads 4 floats at a time); None otherwise."""
    at = g.producer.get(t)
    if at is None or _only_reader(g, t) != reader or g.nodes[at].op_type != "Transpose" or \
            list(g.nodes[at].attrs.get("perm", ())) != perm:
        return None
    r = g.nodes[at].inputs[0]
    rs = g.producer.get(r)
    if rs is None or _only_reader(g, r) != at or g.nodes[rs].op_type != "Reshape":
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
    if ad is not None and _only_reader(g, a) == rs and g.nodes[ad].op_type == "Add":
        x0, x1 = g.nodes[ad].inputs[:2]
        for y, b in ((x0, x1), (x1, x0)):
            if b in g.constants and g.shape(b) == (h * d,) and g.tensors[b].dtype == TP.FLOAT and \
                    g.shape(y) == flat:
                a, bias = y, b
                nodes.append(ad)
                break
    box = g.boxes.get(a)
    x, offset = a, 0
    if box is not None and _only_reader(g, a) == nodes[-1] and box.axis == 2:
        x, offset = box.source, box.start
        nodes.append(g.producer[a])
    xs = g.shape(x)
    info = g.tensors.get(x)
    if xs is None or len(xs) != 3 or info is None or info.dtype != TP.FLOAT or not _same(xs[0], flat[0]) or \
            not _same(xs[1], flat[1]) or not isinstance(xs[2], int) or xs[2] % 4 or offset % 4 or \
            offset + h * d > xs[2]:
        return None
    return Projection(x, offset, bias, tuple(nodes)), h


def _projections(g: FusionGraph, m: Match, first: int, second: int) -> Match | None:
    """`m` reading q, kᵀ and v from their projections (module docstring), or None when one of
    them is not such a read, their head counts or biases differ, or a Split's other outputs are
    read outside the chain."""
    got = [_projection(g, m.q, _HEADS_FIRST, first), _projection(g, m.kt, _KEYS_TRANSPOSED, first),
           _projection(g, m.v, _HEADS_FIRST, second)]
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
                  soft: int) -> str | None:
    """Why these operands do not fit the kernel (None when they do)."""
    for t in (q, kt, v, *masks, ctx):
        if g.tensors.get(t) is None or g.tensors[t].dtype != TP.FLOAT:
            info = g.tensors.get(t)
            have = "unknown" if info is None else TP.DataType.Name(info.dtype).lower()
            return f"'{t}' is {have}: the kernel is float32 only (float16 keeps its stitched Softmax)"
    qs, ks, vs = g.shape(q), g.shape(kt), g.shape(v)
    if qs is None or ks is None or vs is None:
        return "operand shapes are unknown"
    if not 3 <= len(qs) <= 4 or len(ks) != len(qs) or len(vs) != len(qs):
        return f"operands of rank {len(qs)}, {len(ks)}, {len(vs)}: [b, s, d] or [b, h, s, d] each"
    if not all(_same(a, b) and _same(a, c) for a, b, c in zip(qs[:-2], ks[:-2], vs[:-2])):
        return f"batch dims of q {list(qs)}, kᵀ {list(ks)} and v {list(vs)} differ (no broadcasting)"
    d = qs[-1]
    if not isinstance(d, int) or not _same(d, ks[-2]) or not _same(d, vs[-1]):
        return f"head dims {qs[-1]}, {ks[-2]}, {vs[-1]} are not one fixed size"
    if d % 8 or not MIN_HEAD <= d <= MAX_HEAD:
        return f"head size {d}: a multiple of 8 from {MIN_HEAD} to {MAX_HEAD} is needed"
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
            continue
        taken |= set(got.nodes)
        matches.append(got)
    return Found(tuple(matches), tuple(refusals))


def group_of(g: FusionGraph, cost: CostModel, name: str, m: Match) -> Group:
    """The plan's group for chain `m`: priced as one launch moving q, kᵀ, v, the mask and the
    context once each (the products' arithmetic is far below the memory time at these sizes)."""
    moved = sum(g.tensor_bytes(t) for t in dict.fromkeys(m.inputs + (m.output,)))
    return Group(name, m.nodes, m.inputs, (m.output,), None, moved, cost.kernel_us(moved),
                 tuple(g.nodes[i].label for i in m.nodes), tf32=True, scheme=ATTENTION, payload=m)


def chosen(found: Found, plan: Plan) -> Found:
    """`found` as the plan left it: the chains it runs as attention kernels, and those it found
    cheaper to run otherwise among the refusals, with why."""
    taken = [grp.payload for grp in plan.groups if grp.scheme == ATTENTION]
    passed = [f"{m.describe()}: the plan found other kernels over these nodes cheaper"
              for m in found.matches if not any(m is t for t in taken)]
    return Found(tuple(m for m in found.matches if any(m is t for t in taken)), found.refusals + tuple(passed))
