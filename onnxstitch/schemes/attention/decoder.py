"""Decoder forms of the attention chain (issue 22): grouped KV heads and causal masks.

Grouped KV heads. LLaMA-, Qwen2- and Mistral-style models keep Hkv = H / g heads of K and V and
repeat each for g q heads before the products (transformers' repeat_kv), as both torch.onnx
exporters write it:

    K [b, Hkv, S, D] → Unsqueeze(2) → Expand [b, Hkv, g, S, D] → Reshape [b, H, S, D] → kᵀ

where kᵀ is that tensor's Transpose(0, 1, 3, 2) (TorchScript) or Reshape [b·H, S, D] →
Transpose(0, 2, 1) → Reshape [b, H, D, S] (dynamo), and V the same without the transposition.
The chain then takes K and V as they are (`kv_group` g; K read as rows) and the kernel maps q
head h to KV head h // g: the expanded copies (g times K and V) are never written. The forms
are recognised by their shapes (an Unsqueeze inserting a 1 at axis 2, an Expand of that axis
alone, a Reshape merging it into the heads), every tensor between read once.

Causal masks. transformers builds its mask in the graph as Where(And(causal, padding), 0, F)
(sdpa_mask: `kv_idx <= q_idx` from iotas AND the padding mask gathered from attention_mask),
added to the scores. The And's operands are looked at one by one: an operand computed from
nothing but constants and input *shapes* is evaluated (ONNX Runtime, CPU) at the planning
shapes and at other sequence lengths; if it is key ≤ query + Sk − Sq each time it is applied
in the kernel (`causal`) and the kernel skips key tiles wholly above the diagonal. What is
left of the And (the padding operand) becomes the kernel's boolean mask, Where(P, scores, F):
scores + F rounds to F where a mask drops a key, so it gives the same scores. P must be a
tensor the plan cannot absorb into another kernel (a graph input, a constant or the output of
a node onnxstitch does not fuse), since no node of the chain reads it; otherwise (and with
more than one other operand, Mistral's sliding window) the combined mask stays an additive
term and the kernel still applies the causal mask, for the tiles it skips.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ... import ops

from ...graph import FusionGraph
from ...shapes import symbolic_value
from . import chain as attention

# Nodes an in-graph causal mask may take to compute (transformers': ~10); larger ones are not
# evaluated.
MAX_CAUSAL_NODES = 40
# Sequence lengths the causal operand is also evaluated at (besides the planning shapes), so
# that a mask that happens to be causal at one length is not taken for one.
OTHER_LENGTHS = (5, 13)


@dataclass(frozen=True)
class Grouped:
    """K and V [b, Hkv, S, D] as the chain reads them, g, and the repeat_kv nodes between."""

    k: str
    v: str
    group: int
    nodes: tuple[int, ...]


def _shape_readers(g: FusionGraph, t: str, reader: int) -> tuple[int, ...] | None:
    """The readers of `t` besides `reader` when each is a Shape whose results reach no node's
    data and no graph output (they compute the repeat's own Reshape and Expand shapes, which
    the graph records as no edge): the chain takes them along. None when another reads `t`."""
    if t in g.graph_outputs:
        return None
    found: set[int] = set()
    todo = [c for c in g.consumers.get(t, ()) if c != reader]
    if any(g.nodes[c].op_type != "Shape" for c in todo):
        return None
    while todo:
        i = todo.pop()
        if i in found:
            continue
        found.add(i)
        for u in g.nodes[i].outputs:
            if u in g.graph_outputs:
                return None
            todo.extend(g.consumers.get(u, ()))
        if len(found) > MAX_CAUSAL_NODES or g.nodes[i].kind not in SHAPE_ARITHMETIC:
            return None
    return tuple(sorted(found))


# What shape arithmetic is made of (Shape, Slice, Concat, Gather, Squeeze...): opaque and
# layout nodes, elementwise integer arithmetic.
SHAPE_ARITHMETIC = (ops.OpKind.OPAQUE, ops.OpKind.INJECTIVE, ops.OpKind.ELEMENTWISE, ops.OpKind.BROADCAST,
                    ops.OpKind.SLICE, ops.OpKind.CONCAT)


def _only(g: FusionGraph, t: str, reader: int, op: str, along: set[int] | None = None) -> int | None:
    """`t`'s producer when it is an `op` and `reader` is the tensor's only reader; with `along`,
    but for shape readers (added to it). The graph records no edge into a shape input, so a
    Shape's results may size a node outside the chain (TorchScript sizes the context's Reshape
    from the expanded V): only dynamo's kᵀ form, whose Shape sizes its own two Reshapes, takes
    them along."""
    at = g.producer.get(t)
    if at is None or g.nodes[at].op_type != op:
        return None
    if along is None:
        return at if g.only_reader(t) == reader else None
    shapes = _shape_readers(g, t, reader)
    if shapes is None:
        return None
    along.update(shapes)
    return at


def _repeated(g: FusionGraph, t: str, reader: int, along: set[int] | None = None) -> tuple[str, int, tuple[int, ...]] | None:
    """(X, g, nodes) when `t` [b, H, S, D] is Reshape(Expand(Unsqueeze(X, 2))) of X [b, Hkv, S, D]
    repeated g times per head, each step read once; None otherwise."""
    rs = _only(g, t, reader, "Reshape", along)
    ex = None if rs is None else _only(g, g.nodes[rs].inputs[0], rs, "Expand")
    un = None if ex is None else _only(g, g.nodes[ex].inputs[0], ex, "Unsqueeze")
    if un is None:
        return None
    x = g.nodes[un].inputs[0]
    xs, us, es, rsh = (g.shape(u) for u in (x, g.nodes[ex].inputs[0], g.nodes[rs].inputs[0], t))
    if xs is None or us is None or es is None or rsh is None or len(xs) != 4 or len(us) != 5 or len(es) != 5 \
            or len(rsh) != 4:
        return None
    group, heads = es[2], xs[1]
    ok = us[2] == 1 and list(us[:2]) == list(xs[:2]) and list(us[3:]) == list(xs[2:]) and \
        all(attention.same(a, b) for k, (a, b) in enumerate(zip(es, us)) if k != 2) and \
        isinstance(group, int) and group >= 2 and isinstance(heads, int) and \
        attention.same(rsh[0], xs[0]) and rsh[1] == heads * group and list(rsh[2:]) == list(xs[2:])
    return (x, group, (un, ex, rs)) if ok else None


def _transposed(g: FusionGraph, t: str, reader: int, along: set[int]) -> tuple[str, tuple[int, ...]] | None:
    """(X, nodes) when `t` [b, H, D, S] is X [b, H, S, D] with its last two axes swapped, as
    Transpose(0, 1, 3, 2) or dynamo's Reshape [b·H, S, D] → Transpose(0, 2, 1) → Reshape; None
    otherwise."""
    at = g.producer.get(t)
    if at is not None and _only(g, t, reader, "Transpose") == at and \
            list(g.nodes[at].attrs.get("perm", ())) == [0, 1, 3, 2]:
        return g.nodes[at].inputs[0], (at,)
    split = _only(g, t, reader, "Reshape")
    tr = None if split is None else _only(g, g.nodes[split].inputs[0], split, "Transpose")
    if tr is None or list(g.nodes[tr].attrs.get("perm", ())) != [0, 2, 1]:
        return None
    merge = _only(g, g.nodes[tr].inputs[0], tr, "Reshape", along)
    if merge is None:
        return None
    x = g.nodes[merge].inputs[0]
    xs, ms, ts = g.shape(x), g.shape(g.nodes[tr].inputs[0]), g.shape(t)
    # Reshapes that keep the last two axes only merge and split the leading ones (element order
    # kept), so back at [b, H] the three are X's last two axes swapped.
    if xs is None or ms is None or ts is None or len(xs) != 4 or len(ms) != 3 or len(ts) != 4 or \
            list(ms[1:]) != list(xs[2:]) or list(ts[2:]) != [xs[3], xs[2]] or \
            not (attention.same(ts[0], xs[0]) and attention.same(ts[1], xs[1])):
        return None
    return x, (merge, tr, split)


def grouped(g: FusionGraph, m: attention.Match, k_reader: int, v_reader: int) -> Grouped | None:
    """K and V before their repeat_kv when the chain's kᵀ and v are both repeated the same g
    times (module docstring); None otherwise. `k_reader`, `v_reader`: the chain's nodes reading
    kᵀ and v."""
    along: set[int] = set()
    kt = _transposed(g, m.kt, k_reader, along)
    if kt is None:
        return None
    # (dynamo's kᵀ form sizes its Reshapes from the Shape of the repeat's output)
    k = _repeated(g, kt[0], kt[1][0], along if len(kt[1]) == 3 else None)
    v = _repeated(g, m.v, v_reader)
    if k is None or v is None or k[1] != v[1]:
        return None
    return Grouped(k[0], v[0], k[1], tuple(sorted(set(kt[1] + k[2] + v[2]) | along)))


def heads_broadcast(g: FusionGraph, q: str, kt: str, v: str) -> bool:
    """Whether kᵀ and v have one head [b, 1, ·, ·] that the products broadcast against q's H."""
    qs, ks, vs = g.shape(q), g.shape(kt), g.shape(v)
    return (qs is not None and ks is not None and vs is not None and len(qs) == len(ks) == len(vs) == 4
            and ks[1] == 1 and vs[1] == 1 and isinstance(qs[1], int) and qs[1] >= 2
            and attention.same(qs[0], ks[0]) and attention.same(qs[0], vs[0]))


def broadcast(g: FusionGraph, m: attention.Match, k_reader: int) -> Grouped | None:
    """K and V of one head [b, 1, Sk, D] that the products broadcast against q's H heads
    (multi-query attention as Falcon writes it: no repeat_kv), with kᵀ a transpose of K: K read
    as rows and g = H, the transpose taken into the chain; None otherwise."""
    if not heads_broadcast(g, m.q, m.kt, m.v):
        return None
    along: set[int] = set()
    kt = _transposed(g, m.kt, k_reader, along)
    if kt is None:
        return None
    ks, vs = g.shape(kt[0]), g.shape(m.v)
    if ks is None or vs is None or len(ks) != 4 or ks[1] != 1 or not all(attention.same(a, b) for a, b in zip(ks, vs)):
        return None
    return Grouped(kt[0], m.v, int(g.shape(m.q)[1]), tuple(sorted(set(kt[1]) | along)))  # type: ignore[index]


def with_groups(g: FusionGraph, m: attention.Match, readers: tuple[int, int, int]) -> attention.Match:
    """`m` reading un-expanded K and V (`kv_group` > 1) where its operands are repeat_kv's, or
    one K and V head broadcast against every q head (`broadcast`)."""
    got = grouped(g, m, readers[1], readers[2]) or broadcast(g, m, readers[1])
    if got is None or g.tensors[got.k].dtype != m.dtype or g.tensors[got.v].dtype != m.dtype:
        return m
    ks, vs = g.shape(got.k), g.shape(got.v)
    if ks is None or vs is None or ks[3] != m.head_dim or vs[3] != m.head_dim or list(ks) != list(vs):
        return m
    return dataclasses.replace(m, nodes=tuple(sorted(set(m.nodes) | set(got.nodes))), kt=got.k, v=got.v,
                               kv_group=got.group)


# --- causal masks ---------------------------------------------------------------------------


def _ancestry(g: FusionGraph, t: str) -> list[int] | None:
    """The nodes computing `t` from constants and tensors' shapes alone (topological; a Shape's
    input is not followed), None when it reads any other tensor's values or takes more than
    MAX_CAUSAL_NODES nodes."""
    seen: set[int] = set()
    todo = [t]
    while todo:
        x = todo.pop()
        at = g.producer.get(x)
        if x in g.graph_inputs or at is None:
            return None
        if at in seen:
            continue
        n = g.nodes[at]
        if n.domain not in ("", "ai.onnx") or len(seen) >= MAX_CAUSAL_NODES:
            return None
        seen.add(at)
        if n.op_type != "Shape":
            todo.extend(u for u in n.inputs if u and u not in g.constants)
    return sorted(seen)


def _node_at(g: FusionGraph, i: int, dims: dict[str, int], name: str) -> list | None:
    """Node `i` as an ONNX node (and the constant it reads) at `dims`. The graph keeps only data
    inputs: a layout op or Expand becomes a Reshape or Expand to its output's shape there; None
    for a Slice or Split, whose bounds it does not keep."""
    n = g.nodes[i]
    if n.op_type in ops.SHAPE_INPUTS and n.op_type != "Transpose":
        out = g.shape(n.outputs[0])
        if n.op_type in ("Slice", "Split") or out is None:
            return None
        shape = numpy_helper.from_array(np.array([d if isinstance(d, int) else symbolic_value(d, dims)
                                                  for d in out], np.int64), name)
        op = "Expand" if n.op_type == "Expand" else "Reshape"
        return [helper.make_node(op, [n.inputs[0], name], list(n.outputs)), shape]
    return [helper.make_node(n.op_type, list(n.inputs), list(n.outputs), **dict(n.attrs)), None]


# The IR version of the models evaluated here: ONNX Runtime refuses IR versions newer than it
# knows (1.31 refused onnx 1.23's default, which made every causal mask look like none on the GPU
# machine's ORT), and 10 has every op these masks use.
EVAL_IR_VERSION = 10


class Unevaluable(Exception):
    """ONNX Runtime could not compute a mask's subgraph: why, for the report."""


def _evaluate(g: FusionGraph, nodes: list[int], t: str, dims: dict[str, int]) -> np.ndarray | None:
    """`t` computed by `nodes` with every symbolic dim at `dims` (ONNX Runtime on the CPU); None
    when its nodes cannot be written at these dims; Unevaluable when ONNX Runtime fails."""
    import onnxruntime as ort

    made = [_node_at(g, i, dims, f"{t}~shape{i}") for i in nodes]
    if any(x is None for x in made):
        return None
    read = {u for i in nodes for u in g.nodes[i].inputs if u}
    inits = [g.constants[u] for u in sorted(read) if u in g.constants] + [c for _, c in made if c is not None]
    ins, feeds = [], {}
    made_here = {u for i in nodes for u in g.nodes[i].outputs}
    for u in sorted(read - made_here - set(g.constants)):  # the Shapes' inputs
        info = g.tensors.get(u)
        if info is None or info.shape is None:
            return None
        shape = [d if isinstance(d, int) else symbolic_value(d, dims) for d in info.shape]
        ins.append(helper.make_tensor_value_info(u, info.dtype, shape))
        feeds[u] = np.zeros(shape, helper.tensor_dtype_to_np_dtype(info.dtype))
    model = helper.make_model(helper.make_graph([n for n, _ in made], "mask", ins,
                                                [helper.make_tensor_value_info(t, TP.BOOL, None)], inits),
                              opset_imports=[helper.make_opsetid("", g.opset)], ir_version=EVAL_IR_VERSION)
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4  # a failure is said in the report, not in ORT's log on the user's terminal
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return np.asarray(sess.run(None, feeds)[0])
    except Exception as e:  # an op or form ORT does not take here: said in the report
        raise Unevaluable(str(e).splitlines()[0][:200]) from e


def is_causal(g: FusionGraph, t: str, sq: object, sk: object) -> bool:
    """Whether boolean `t` is key ≤ query + Sk − Sq over [..., Sq, Sk] (Sq, Sk: the scores'
    dims), computed from shapes alone, at the planning shapes and at other sequence lengths."""
    if g.tensors.get(t) is None or g.tensors[t].dtype != TP.BOOL:
        return False
    nodes = _ancestry(g, t)
    if not nodes:
        return False
    symbols = {d for u in g.graph_inputs for d in (g.tensors[u].shape or ()) if isinstance(d, str)}
    # Dims shape inference could not name (unk__…) of the tensors whose Shapes the mask reads
    # are lengths too where they vary with the inputs' (TorchScript's decoders size their causal
    # mask from Shape(inputs_embeds), [batch, unk__5, d]): left at their planning values while
    # the inputs' lengths change, the evaluation read shapes that disagree and could not run.
    made = {o for i in nodes for o in g.nodes[i].outputs}
    read = {u for i in nodes if g.nodes[i].op_type == "Shape" for u in g.nodes[i].inputs[:1] if u not in made}
    symbols |= {d for u in read for d in (g.tensors[u].shape or ()) if isinstance(d, str) and d.startswith("unk__")}
    trials = [dict(g.dim_values)] + [{**g.dim_values, **{s: n for s in symbols}} for n in OTHER_LENGTHS]
    for dims in trials:
        got = _evaluate(g, nodes, t, dims)
        q = sq if isinstance(sq, int) else symbolic_value(str(sq), dims)
        k = sk if isinstance(sk, int) else symbolic_value(str(sk), dims)
        if got is None or got.dtype != np.bool_ or got.ndim < 2 or got.shape[-2:] != (q, k):
            return False
        want = np.arange(k)[None, :] <= np.arange(q)[:, None] + (k - q)
        if not (got == want).all():
            return False
    return True


def _and_operands(g: FusionGraph, t: str) -> list[str]:
    """The operands of the And tree computing `t` (through Expand, whose broadcast the kernel
    does itself, and Casts of a boolean to boolean)."""
    at = g.producer.get(t)
    if at is None:
        return [t]
    n = g.nodes[at]
    if n.op_type == "And":
        return _and_operands(g, n.inputs[0]) + _and_operands(g, n.inputs[1])
    if n.op_type == "Expand" or (n.op_type == "Cast" and n.attrs.get("to") == TP.BOOL and
                                 g.tensors[n.inputs[0]].dtype == TP.BOOL):
        return _and_operands(g, n.inputs[0])
    return [t]


def _all_true(g: FusionGraph, t: str) -> bool:
    """A constant true, or ConstantOfShape of true (TorchScript's torch.ones(..., bool))."""
    at = g.producer.get(t)
    if at is not None and g.nodes[at].op_type == "ConstantOfShape":
        value = g.nodes[at].attrs.get("value")
        return isinstance(value, onnx.TensorProto) and bool(np.all(numpy_helper.to_array(value)))
    return t in g.constants and bool(np.all(numpy_helper.to_array(g.constants[t])))


def _materialized(g: FusionGraph, t: str) -> bool:
    """Whether `t` exists whatever the plan fuses: an input, a constant or the output of a node
    onnxstitch does not fuse."""
    at = g.producer.get(t)
    return at is None or not g.nodes[at].fusible


def with_causal(g: FusionGraph, m: attention.Match) -> attention.Match | str:
    """`m` with its causal mask applied in the kernel (module docstring), or why its last term
    stays read as it is (a line for the report; '' when the term is no such mask at all)."""
    if not m.masks:
        return ""
    term = m.masks[-1]
    at = g.producer.get(term)
    if at is None or g.nodes[at].op_type != "Where":
        return ""
    cond, zero, fill = g.nodes[at].inputs[:3]
    fill_value = attention.scalar(g, fill)
    if attention.scalar(g, zero) != 0 or fill_value is None or not fill_value < 0:
        return ""
    sq, sk = (g.shape(m.q) or (None, None))[-2], (g.shape(m.v) or (None, None))[-2]
    operands = [t for t in _and_operands(g, cond) if not _all_true(g, t)]
    try:
        causal = [t for t in operands if is_causal(g, t, sq, sk)]
    except Unevaluable as e:
        return f"its mask's operands could not be computed on ONNX Runtime's CPU to prove one causal ({e}): read as it is"
    if not causal:
        return ""
    rest = [t for t in operands if t not in causal]
    if m.projections:  # (the function body, fallback.py, reads operands as they are): read as it is
        return ""
    # The padding part as the kernel's boolean mask where it can be (one, boolean, broadcasting
    # to the scores, a tensor no plan computes inside another kernel); otherwise the combined
    # mask stays read as it is, and the kernel still skips the tiles after the diagonal (the
    # mask drops those keys anyway).
    single = m.select is None and len(rest) <= 1
    if not single or (rest and (not _materialized(g, rest[0]) or g.tensors[rest[0]].dtype != TP.BOOL
                                or _broadcasts(g, rest[0], m))):
        return dataclasses.replace(m, causal=True, causal_fill=fill_value)
    select = attention.Select(rest[0], True, fill_value) if rest else None
    return dataclasses.replace(m, masks=m.masks[:-1], select=select, causal=True, causal_fill=fill_value)


def _broadcasts(g: FusionGraph, mask: str, m: attention.Match) -> str | None:
    """Why `mask` does not broadcast to the scores [b, H, Sq, Sk] (None when it does)."""
    qs, vs, ms = g.shape(m.q), g.shape(m.v), g.shape(mask)
    if qs is None or vs is None or ms is None or len(ms) > 4:
        return "unknown shape"
    scores = tuple(qs[:-1]) + (vs[-2],)
    for have, want in zip(reversed(ms), reversed(scores)):
        if have != 1 and not attention.same(have, want):
            return f"the mask {list(ms)} does not broadcast to the scores {list(scores)}"
    return None

