"""The simplify stage: exact rewrites of index arithmetic exporters leave around masks.

transformers (5.x) exported by torch.onnx builds BERT's padding mask as
    GatherND(mask [b, s], Concat(Unsqueeze(Expand(batch index)), Unsqueeze(Expand(key index))))
        → And(And(True, Range(0, s) ≥ 0), ·) → Where(·, 0, -max)            [b, 1, s, s]
about ten small ONNX Runtime kernels per run whose result holds one value per (batch, key),
copied along the queries; each attention kernel then reads the whole [b, 1, s, s] tensor. Two
rewrites keep the values and drop the work:

- **GatherND over an index grid.** When every index component is an iota — a Range(0, n, 1)
  placed on one axis by Unsqueeze and Expand, n the size of the data's matching dim — and the
  components walk the output axes in increasing order, the gather reads data[i_a0, i_a1, …]:
  an Unsqueeze of the data (where every other output axis has size 1).
- **And with a tensor known all true** (a true constant; Range(0, n, δ ≥ 0) ≥ c ≤ 0; And of such)
  is its other operand. Where that operand is smaller than the And's output, the smaller tensor
  replaces it only if every reader still computes the same shape: elementwise ops whose other
  operands cover the dropped dims (checked forward through elementwise readers; never a graph
  output).

- **The shape of a repeated K or V.** TorchScript sizes its attention output's Reshape from
  Shape(repeat_kv(V)) [b, h, s, d] (repeat_kv: Reshape(Expand(Unsqueeze(V, 2)))), which keeps the
  repeated V alive for the Shape alone. Where every reader of that Shape gathers one dim other
  than the heads and shape inference gives the repeated tensor V's dims there, the Shape reads
  V itself: the attention chain may then read V un-expanded (schemes/attention/decoder.py).

- **A product on flattened rows.** HF's Conv1D (GPT-2) and dynamo's decomposed Linear write a
  product over a [b, s, K] activation as Reshape(x → [b·s, K]) → Gemm(·, W, C) or MatMul →
  Reshape(→ [b, s, N]). Where shape inference shows the last Reshape giving x's leading dims and
  N, the three are MatMul(x', W) → Add(·, C): x' is x, or x's trailing dims merged into K by a
  Reshape to [0, …, 0, K]; transB becomes a transposed copy of a constant W (a Transpose of any
  other). The same sum: MatMul broadcasts over the leading dims as the flattening did, and Gemm
  adds C after the product as the Add does (float16 rounds the product once more unless a GEMM
  epilogue takes the Add back). Later stages then see one product over rows with its bias, as
  TorchScript writes a Linear, and the GEMM epilogue and attention matchers take them alike.

- **An Identity of a constant.** TorchScript's exporter writes one initializer for weights
  that are equal (a BatchNorm's ones and zeros in every layer of an untrained or re-initialised
  net, tied embeddings) and Identity nodes giving it each of the other names. The readers then
  read the initializer itself, so they still see a constant (a BatchNorm's scale and shift).

- **Fixed dims of a Shape.** A Gather or Slice of a Shape's output that selects only dims the
  model fixes (a head size) is that constant, and small arithmetic on constants alone (FOLDABLE)
  is folded after it: TorchScript's SDPA without a scale computes 1/√√D from Shape(q)[-1:] and
  scales q and kᵀ by it; folded, the attention matcher takes it as its scale.
- **A batched product on merged heads.** BLOOM's attention multiplies [b·h, s, d] operands
  (Reshapes of [b, h, s, d] tensors, kᵀ a Transpose of one), scales the scores, adds its ALiBi
  bias ([b·h, 1, s], a Reshape of [b, h, s]) and reshapes them to [b, h, s, s] for the mask and
  the Softmax; the probabilities go back to [b·h, s, s] for the second product, which is
  reshaped to [b, h, s, d] again. Where shape inference shows each Reshape merging (or
  splitting) exactly the two leading dims, the product runs on the 4-D tensors themselves (the
  same sums, batched over b and h rather than b·h), kᵀ as a Transpose of the 4-D K, and each
  term on the way as a 4-D tensor: a scalar or a [1, x, y] as it is, a Reshape of a
  [b, h, …] tensor reshaped to [b, h, x, y] instead. The attention matcher then sees the chain
  it knows.
- **Attention over windows.** Hiera (SAM 2's image encoder) attends within mask units with
  rank-5 operands [b, h, w, s, d] (heads, windows, tokens): MatMul(q·scale, kᵀ) → Softmax →
  MatMul(·, v), kᵀ a Transpose of the last two dims of K. Where every dim but b is fixed, the
  chain runs on [b, h·w, s, d] views of them (Reshapes of contiguous tensors, which ONNX Runtime
  makes without copying), kᵀ as the 4-D K's transpose and q's scale after its view, and the
  context is reshaped back: the same sums, and a chain the attention matcher knows.
- **A per-head scale of a product.** XCiT multiplies its scores by a learned temperature per
  head ([h, 1, 1]), Swin V2 by its logit scale: Mul(MatMul(a, b), t) with t constant along the
  product's last two dims. The scale moves onto the first operand, MatMul(Mul(a, t), b): the
  same value in real arithmetic (the product rounds differently, as it does where the attention
  kernel folds q's and kᵀ's scalar scales), and the attention matcher then sees a product
  feeding the terms and the Softmax, the scale fused with what makes a.
- **A Cast to the type its input has.** Models written for several dtypes cast where the
  float32 form has nothing to cast (BLOOM's attention probabilities, cast back to the hidden
  dtype after a float32 Softmax): the Cast is its input, so the attention matcher sees the
  probabilities reach the second MatMul directly.
- **A Slice that keeps every element.** TorchScript writes `x[:, :, 0:]` and `x[0:]` as Slices
  from 0 to INT64_MAX with step 1: the Slice is its input. ONNX Runtime's shape inference names
  each such output's dim anew (silero-vad's STFT takes the real and imaginary halves through two
  of them, and `re² + im²` then adds a [b, 129, unk__4] to a [b, 129, unk__5], which no group
  could prove alike); its input keeps the dim it has.

- **An If on a condition known by construction.** TorchScript writes Python's branches on sizes
  as If nodes: silero-vad's `if state.size(0)` (a state of a fixed 2 layers) and
  `if out.size(1) == 1` (a convolution of one output channel) each wrap part of the network in a
  branch that ONNX Runtime runs as a subgraph, at a host cost per run. Where the condition folds
  to a constant (fixed dims of a Shape, arithmetic and comparisons on constants, the Size of a
  tensor whose shape is fixed), the If is the branch it takes: its nodes join the graph (its
  Constant nodes as constants), its outputs named as the If's where anything outside reads them
  (an Identity where a graph output or another subgraph does). A branch making a name the graph
  already has stays an If. Rewrites repeat over what they inline (nested Ifs), a few rounds.

Nodes left without readers are removed. Anything else is left as it was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import edit, ops
from .folds import slices
from .graph import node_attrs
from .shapes import Shape, TensorInfo, broadcast_shapes, infer, shape_output


@dataclass(frozen=True)
class Simplified:
    """The rewritten model (the input itself when nothing applied), its tensor facts, and one
    line per rewrite."""

    model: onnx.ModelProto
    tensors: Mapping[str, TensorInfo]
    rewrites: tuple[str, ...] = ()
    # Nodes that inlined If branches brought, less the Ifs they replace: what ONNX Runtime ran
    # inside those Ifs, which a count of the given graph's own nodes misses.
    inlined_nodes: int = 0


class _Graph:
    """Lookups over one model's main graph (edit.ModelIndex) with its inferred tensor facts."""

    def __init__(self, model: onnx.ModelProto, tensors: Mapping[str, TensorInfo]) -> None:
        self.index = edit.ModelIndex.of(model)
        self.nodes = self.index.nodes
        self.tensors = tensors
        self.constants = self.index.constants
        self.outputs = self.index.outputs

    def shape(self, t: str) -> Shape | None:
        info = self.tensors.get(t)
        return None if info is None else info.shape

    def value(self, t: str) -> np.ndarray | None:
        c = self.constants.get(t)
        return None if c is None else numpy_helper.to_array(c)

    def op(self, t: str) -> onnx.NodeProto | None:
        n = self.index.node_of(t)
        return n if n is not None and n.domain in ("", "ai.onnx") else None

    def ints(self, t: str) -> list[int] | None:
        v = self.value(t)
        return None if v is None or v.dtype.kind not in "iu" else [int(x) for x in v.reshape(-1)]


def _range(g: _Graph, t: str) -> tuple[int, int] | None:
    """(start, delta) of a Range with constant start and delta producing `t`."""
    n = g.op(t)
    if n is None or n.op_type != "Range":
        return None
    start, delta = g.ints(n.input[0]), g.ints(n.input[2])
    if start is None or delta is None or len(start) != 1 or len(delta) != 1:
        return None
    return start[0], delta[0]


def _iota_axis(g: _Graph, t: str) -> int | None:
    """The axis a when t[I] = I[a] for every index I (an iota along a, broadcast elsewhere):
    Range(0, n, 1), placed by Unsqueeze and broadcast by Expand along other axes."""
    shape = g.shape(t)
    n = g.op(t)
    if shape is None or n is None:
        return None
    if n.op_type == "Range":
        return 0 if _range(g, t) == (0, 1) else None
    if n.op_type == "Unsqueeze":
        inner = _iota_axis(g, n.input[0])
        axes = g.ints(n.input[1]) if len(n.input) > 1 else list(node_attrs(n).get("axes", []))  # type: ignore[call-overload]
        if inner is None or axes is None:
            return None
        axes = sorted(a % len(shape) for a in axes)
        kept = [k for k in range(len(shape)) if k not in axes]
        return kept[inner] if inner < len(kept) else None
    if n.op_type == "Expand":
        inner = _iota_axis(g, n.input[0])
        src = g.shape(n.input[0])
        if inner is None or src is None or len(src) > len(shape):
            return None
        a = len(shape) - len(src) + inner  # right-aligned broadcasting
        return a if src[inner] == shape[a] else None  # the iota itself is not broadcast
    return None


def _unsqueezed_gather(g: _Graph, n: onnx.NodeProto) -> tuple[list[int], str] | None:
    """(axes to unsqueeze the data by, why not) for GatherND `n` over an index grid; None with
    no rewrite when the indices are anything else."""
    if int(node_attrs(n).get("batch_dims", 0)) != 0:  # type: ignore[call-overload]
        return None
    data, indices = n.input[0], n.input[1]
    ds, xs, ys = g.shape(data), g.shape(indices), g.shape(n.output[0])
    cat = g.op(indices)
    if ds is None or xs is None or ys is None or cat is None or cat.op_type != "Concat":
        return None
    if int(node_attrs(cat).get("axis", 0)) % len(xs) != len(xs) - 1 or len(cat.input) != len(ds) or xs[-1] != len(ds):  # type: ignore[call-overload]
        return None
    out_rank = len(xs) - 1
    axes = []
    for part in cat.input:
        a = _iota_axis(g, part)
        ps = g.shape(part)
        if a is None or ps is None or len(ps) != len(xs) or a >= out_rank:
            return None
        axes.append(a)
    if axes != sorted(set(axes)):
        return None
    # The gather reads data[I[a0], I[a1], …]: its output has the data's dims on axes a and, to be
    # an Unsqueeze, size 1 everywhere else.
    for k, d in enumerate(ys):
        want = ds[axes.index(k)] if k in axes else 1
        if d is None or d != want:
            return None
    return [k for k in range(out_rank) if k not in axes], data


def _all_true(g: _Graph, t: str, depth: int = 0) -> bool:
    """Whether bool tensor `t` is true everywhere, by construction."""
    v = g.value(t)
    if v is not None:
        return v.dtype == np.bool_ and bool(v.all())
    n = g.op(t)
    if n is None or depth > 8:
        return False
    if n.op_type == "And":
        return all(_all_true(g, x, depth + 1) for x in n.input)
    if n.op_type == "GreaterOrEqual":
        bound = g.value(n.input[1])
        return bound is not None and bound.size == 1 and float(bound.reshape(-1)[0]) <= 0 and \
            _non_negative(g, n.input[0])
    return False


# Ops folded where every input is a constant (or folded) and the result is small: the
# arithmetic TorchScript writes on fixed dims (1/√√D from a head size, a Reshape's heads).
# (ConstantOfShape and Transpose: TorchScript's exports of TensorFlow-style "same" padding build
# each Pad's pads from constants through them, which the conv scheme folds into the Conv.)
FOLDABLE = frozenset({"Cast", "Sqrt", "Reciprocal", "Div", "Mul", "Add", "Sub", "Pow", "Neg", "Abs", "Floor", "Ceil",
                      "Unsqueeze", "Squeeze", "Concat", "Gather", "Slice", "Reshape", "Identity", "Max", "Min",
                      "ConstantOfShape", "Transpose", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                      "Not", "And", "Or", "Xor"})
# Rounds of rewrites over the nodes an inlined If brings (its nested Ifs fold in the next).
INLINE_ROUNDS = 4
# Inputs that ONNX Runtime's inference requires to be scalars where it knows them; an If's output
# hides its branch's tensor from it (ONNX's AffineGrid function feeds Range dims of shape [1], one
# a constant: inlined, ORT folded that Range at load and refused the model), so an inlined If's
# outputs are read there through a Reshape to rank 0 (_scalar_views).
SCALAR_INPUTS = {"Range": (0, 1, 2)}
FOLD_MAX_ELEMENTS = 64


def _small(g: _Graph, t: str) -> bool:
    c = g.constants.get(t)
    return c is not None and int(np.prod(c.dims)) <= FOLD_MAX_ELEMENTS


def _folded(g: _Graph, n: onnx.NodeProto, known: Mapping[str, np.ndarray], opset: int) -> np.ndarray | None:
    """Node `n`'s output computed from its constant inputs (onnx's reference evaluator), or
    None where it is too large or the evaluator does not take it."""
    from onnx.reference import ReferenceEvaluator

    feeds = {t: known[t] if t in known else g.value(t) for t in n.input if t}
    graph = helper.make_graph([n], "fold", [helper.make_tensor_value_info(t, numpy_helper.from_array(v).data_type,
                                                                          list(np.shape(v))) for t, v in feeds.items()],
                              [helper.make_tensor_value_info(n.output[0], onnx.TensorProto.UNDEFINED, None)])
    try:
        (out,) = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])).run(
            None, feeds)
    except Exception:  # noqa: BLE001 - not folded: ORT computes it as before
        return None
    out = np.asarray(out)
    return out if out.size <= FOLD_MAX_ELEMENTS and out.dtype != object else None


def _fixed_dims(g: _Graph, n: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Gather (axis 0) or Slice of a Shape's output when every dim it selects is
    fixed in the model (a head size, not a batch or a length), else None."""
    src = g.op(n.input[0]) if n.input else None
    if src is None or src.op_type != "Shape":
        return None
    shape = g.shape(src.input[0])
    if shape is None:
        return None
    dims = shape_output(src, shape)
    pos = np.arange(len(dims))
    if n.op_type == "Gather":
        idx = g.value(n.input[1]) if len(n.input) > 1 else None
        if idx is None or idx.dtype.kind not in "iu" or node_attrs(n).get("axis", 0) != 0:
            return None
        picked = pos[idx]  # (a scalar index gives a scalar)
    else:
        if g.index.opset < 10:
            return None
        bounds = [g.ints(t) if t else None for t in list(n.input[1:5]) + [""] * (5 - len(n.input))]
        starts, ends, axes, steps = bounds
        if starts is None or ends is None or len(starts) != 1 or (axes is not None and axes not in ([0], [-1])):
            return None
        picked = pos[slice(starts[0], ends[0], (steps or [1])[0])]
    chosen = [dims[int(k)] for k in np.ravel(picked)]
    if not all(isinstance(d, int) for d in chosen):
        return None
    return np.array(chosen, np.int64).reshape(np.shape(picked))


# An end at or past this is the end of any axis (exporters write INT64_MAX, or INT32_MAX's
# neighbours for "to the end"; no dim reaches 2**62 elements).
_TO_THE_END = 2**62


def _keeps_everything(g: _Graph, n: onnx.NodeProto) -> bool:
    """Whether Slice `n` selects every element of its input: each sliced axis from its start
    (0, or a negative start at or before it) to its end, with step 1."""
    shape = g.shape(n.input[0]) if n.input else None
    if shape is None:
        return False
    attrs = node_attrs(n)
    starts, ends, axes, steps = (slices.parameter(n, attrs, g.constants, k, name)
                                 for k, name in enumerate(slices.PARAMETERS, 1))
    if not isinstance(starts, list) or not isinstance(ends, list) or isinstance(axes, str) or isinstance(steps, str):
        return False  # (not given, or not constants)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not (len(starts) == len(ends) == len(axes) == len(steps)):
        return False
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if not -len(shape) <= axis < len(shape):
            return False
        dim = shape[axis]
        fixed = isinstance(dim, int)
        from_start = start == 0 or (fixed and start <= -dim)
        to_end = end >= _TO_THE_END or (fixed and end >= dim)
        if step != 1 or not from_start or not to_end:
            return False
    return True


def _non_negative(g: _Graph, t: str) -> bool:
    """Whether every element of `t` is ≥ 0 by construction: Range(start ≥ 0, δ ≥ 0), placed or
    broadcast by Unsqueeze/Expand/Reshape."""
    n = g.op(t)
    if n is None:
        return False
    if n.op_type == "Range":
        r = _range(g, t)
        return r is not None and r[0] >= 0 and r[1] >= 0
    return n.op_type in ("Unsqueeze", "Expand", "Reshape") and _non_negative(g, n.input[0])


def _keeps_shapes(g: _Graph, t: str, shape: Shape, depth: int = 0) -> bool:
    """Whether `t` may take `shape` (smaller, broadcasting to its own): every reader is an
    elementwise op whose output keeps its shape, or changes only where its own readers allow it
    in turn; `t` and what changes are no graph outputs."""
    if t in g.outputs or depth > 8:
        return False
    for r in g.index.readers_of(t):
        kind = ops.spec(r.op_type, r.domain).kind
        if kind not in (ops.OpKind.ELEMENTWISE, ops.OpKind.BROADCAST) or len(r.output) != 1:
            return False
        new = broadcast_shapes([shape if x == t else g.shape(x) for x in r.input if x])
        old = g.shape(r.output[0])
        if new is None or old is None:
            return False
        if tuple(new) != tuple(old) and not _keeps_shapes(g, r.output[0], new, depth + 1):
            return False
    return True


def _repeat_source(g: _Graph, t: str) -> str | None:
    """x when `t` is Reshape(Expand(Unsqueeze(x, [2]), ·), ·) of a rank-4 x (repeat_kv)."""
    r = g.op(t)
    e = g.op(r.input[0]) if r is not None and r.op_type == "Reshape" else None
    u = g.op(e.input[0]) if e is not None and e.op_type == "Expand" else None
    if u is None or u.op_type != "Unsqueeze":
        return None
    axes = g.ints(u.input[1]) if len(u.input) > 1 else list(node_attrs(u).get("axes", []))
    x = u.input[0]
    return x if axes == [2] and len(g.shape(x) or ()) == 4 else None


def _shape_of_repeat(g: _Graph, n: onnx.NodeProto) -> str | None:
    """The un-repeated tensor a Shape node may read instead (module docstring), or None."""
    if n.attribute or n.output[0] in g.outputs:  # (start/end would move the gathered indices)
        return None
    x = _repeat_source(g, n.input[0])
    xs, rs = (g.shape(x), g.shape(n.input[0])) if x is not None else (None, None)
    if xs is None or rs is None or len(rs) != 4:
        return None
    readers = g.index.readers_of(n.output[0])
    for r in readers:
        index = g.ints(r.input[1]) if r.op_type == "Gather" and len(r.input) > 1 else None
        if index is None or len(index) != 1 or node_attrs(r).get("axis", 0) != 0:
            return None
        k = index[0] % 4
        if k == 1 or xs[k] != rs[k] or (not isinstance(xs[k], int) and not xs[k]):
            return None
    return x if readers else None


@dataclass(frozen=True)
class _Flattened:
    """A product on flattened rows (module docstring): Reshape(x) → product → Reshape(→ y)."""

    x: str  # the activation before flattening
    rows: tuple[int, ...] | None  # the Reshape target merging x's trailing dims into K, [0, …, 0, K]
    weight: str
    trans_b: bool
    bias: str | None  # Gemm's C, added after the product
    y: str  # the last Reshape's output, made by the replacement


def _flattened(g: _Graph, r: onnx.NodeProto) -> _Flattened | None:
    """The product on flattened rows that Reshape `r` ends, or None."""
    p = g.op(r.input[0])
    if p is None or p.op_type not in ("Gemm", "MatMul") or len(g.index.readers_of(r.input[0])) != 1 \
            or r.input[0] in g.outputs:
        return None
    attrs = node_attrs(p)
    if p.op_type == "Gemm" and (attrs.get("transA", 0) or float(attrs.get("alpha", 1.0)) != 1.0):
        return None
    bias = p.input[2] if p.op_type == "Gemm" and len(p.input) > 2 and p.input[2] else None
    flat = g.op(p.input[0])
    if flat is None or flat.op_type != "Reshape":
        return None
    x = flat.input[0]
    xs, a, w, y = g.shape(x), g.shape(p.input[0]), g.shape(p.input[1]), g.shape(r.output[0])
    if xs is None or a is None or w is None or y is None or len(a) != 2 or len(w) != 2 or len(y) < 3 \
            or len(xs) < len(y):
        return None
    trans_b = bool(attrs.get("transB", 0))
    k, n = (w[1], w[0]) if trans_b else (w[0], w[1])
    lead, rest = xs[:len(y) - 1], xs[len(y) - 1:]
    if not isinstance(k, int) or not isinstance(n, int) or a[1] != k or y[-1] != n or \
            any(d is None or not isinstance(d, int) for d in rest) or int(np.prod(rest)) != k or \
            any(d is None or d != e for d, e in zip(lead, y[:-1])):
        return None
    if bias is not None:
        if float(attrs.get("beta", 1.0)) != 1.0:
            return None
        bs = g.shape(bias)
        if bs is None or len(bs) > 2 or (len(bs) == 2 and bs[0] != 1) or (bs and bs[-1] not in (1, n)):
            return None  # only a C that broadcasts along the rows is a bias
    rows = tuple([0] * len(lead) + [k]) if len(rest) > 1 else None  # None: x's last dim is K
    return _Flattened(x, rows, p.input[1], trans_b, bias, r.output[0])


def _unflattened(g: _Graph, f: _Flattened, name: str, extra: list[onnx.TensorProto]) -> list[onnx.NodeProto]:
    """The nodes computing `f`'s output as a product over x's rows (module docstring)."""
    out: list[onnx.NodeProto] = []
    x = f.x
    if f.rows is not None:
        shape = f"{f.y}~rows"
        extra.append(numpy_helper.from_array(np.array(f.rows, np.int64), shape))
        out.append(helper.make_node("Reshape", [f.x, shape], [f"{f.y}~x"], name=f"{name}~rows"))
        x = f"{f.y}~x"
    w = f.weight
    if f.trans_b:
        value = g.value(f.weight)
        if value is not None:  # one transposed copy, however many products share the weight
            w = f"{f.weight}~t"
            if all(t.name != w for t in extra):
                extra.append(numpy_helper.from_array(np.ascontiguousarray(value.T), w))
        else:  # a weight made at run time: a Transpose of its own per product
            w = f"{f.y}~wt"
            out.append(helper.make_node("Transpose", [f.weight], [w], name=f"{name}~t", perm=[1, 0]))
    product = f.y if f.bias is None else f"{f.y}~product"
    out.append(helper.make_node("MatMul", [x, w], [product], name=name))
    if f.bias is not None:
        out.append(helper.make_node("Add", [product, f.bias], [f.y], name=f"{name}~bias"))
    return out


# Elementwise ops that may lie between a batched product on merged heads and its Reshape back
# to 4-D (a scale, an added bias), and how many of them.
LIFT_TERMS, MAX_LIFT_TERMS = ("Add", "Sub", "Mul", "Div"), 4


def _known(dims: Shape | None) -> bool:
    return dims is not None and all(d is not None and d != "" for d in dims)


def _heads_source(g: _Graph, t: str, lead: tuple) -> str | None:
    """The [B, H, m, n] tensor (B, H = `lead`) whose leading dims Reshape `t` ([B·H, m, n])
    merges, or None."""
    r = g.op(t)
    if r is None or r.op_type != "Reshape":
        return None
    ts, xs = g.shape(t), g.shape(r.input[0])
    if not _known(ts) or not _known(xs) or len(ts) != 3 or len(xs) != 4 or tuple(xs[:2]) != lead or \
            tuple(xs[2:]) != tuple(ts[1:]):
        return None
    return r.input[0]  # (elements are kept, so t's first dim is B·H)


# Unary ops and ops with a scalar other operand that a term on the merged scores may pass
# through on its way from its Reshape (TorchScript scales BLOOM's ALiBi bias after the Reshape).
TERM_STEPS = frozenset({"Cast", "Neg", "Add", "Sub", "Mul", "Div"})


def _lifted_term(g: _Graph, o: str, lead: tuple, y: str, k: int,
                 nodes: list[onnx.NodeProto], extra: list[onnx.TensorProto], depth: int = 0) -> str | None:
    """Operand `o` of a term on the merged scores as a tensor that broadcasts to [B, H, m, n]
    (`nodes` and `extra` get what computes it)."""
    os_ = g.shape(o)
    if not _known(os_) or len(os_) > 3:
        return None
    if len(os_) < 3 or os_[0] == 1:  # a scalar, or broadcast over B·H: it broadcasts the same
        return o
    src = _heads_source(g, o, lead)
    if src is not None:
        return src
    r = g.op(o)
    if r is None:
        return None
    name = f"{y}~term{k}" + (f"~{depth}" if depth else "")
    if r.op_type in TERM_STEPS and depth < 3:
        # op(u, scalar) or op(u): the same op on u lifted
        ins = [u for u in r.input if u]
        scalar = lambda u: _known(g.shape(u)) and all(d == 1 for d in g.shape(u))  # noqa: E731
        full = [j for j, u in enumerate(ins) if not scalar(u)]
        if len(full) == 1:
            inner = _lifted_term(g, ins[full[0]], lead, y, k, nodes, extra, depth + 1)
            if inner is None:
                return None
            ins[full[0]] = inner
            nodes.append(helper.make_node(r.op_type, ins, [name], name=name, **node_attrs(r)))
            return name
        return None
    ts = g.shape(r.input[0]) if r.op_type == "Reshape" else None
    # A Reshape of a [B, H, …] tensor whose other dims hold as many elements as o's last two
    # (the same dims other than ones): reshaped to [B, H, x, y] instead.
    if not _known(ts) or len(ts) < 2 or tuple(ts[:2]) != lead or not isinstance(os_[1], int) or \
            [d for d in ts[2:] if d != 1] != [d for d in os_[1:] if d != 1]:
        return None
    extra.append(numpy_helper.from_array(np.array([0, 0, os_[1], -1], np.int64), f"{name}~shape"))
    nodes.append(helper.make_node("Reshape", [r.input[0], f"{name}~shape"], [name], name=name))
    return name


def _sizes_only(g: _Graph, t: str, r: onnx.NodeProto, depth: int = 0) -> bool:
    """Whether everything computed from `t` ends in Reshape `r`'s target alone (it dies with r)."""
    readers = g.index.readers_of(t)
    if t in g.outputs or not readers or depth > 8:
        return False
    return all((n is r and list(n.input).index(t) == 1) or
               (n is not r and all(_sizes_only(g, o, r, depth + 1) for o in n.output)) for n in readers)


def _moved_shapes(g: _Graph, t: str, reader: onnx.NodeProto, r: onnx.NodeProto, same: list[str],
                  moved: dict[int, onnx.NodeProto]) -> bool:
    """Whether every reader of `t` but `reader` is a Shape that either only sizes Reshape `r` (it
    dies with r) or can read a tensor of `same` of t's very shape instead (put in `moved`, by node
    position): TorchScript sizes the Reshape after a product, and what follows, from the
    product's shape."""
    shape = g.shape(t)
    for n in g.index.readers_of(t):
        if n is reader:
            continue
        if n.op_type != "Shape":
            return False
        if _sizes_only(g, n.output[0], r):
            continue
        alike = next((u for u in same if _known(shape) and g.shape(u) == shape), None)
        if alike is None:
            return False
        moved[g.nodes.index(n)] = helper.make_node("Shape", [alike], list(n.output), name=n.name, **node_attrs(n))
    return sum(n is reader for n in g.index.readers_of(t)) == 1


def _lifted_product(g: _Graph, r: onnx.NodeProto, extra: list[onnx.TensorProto],
                    moved: dict[int, onnx.NodeProto]) -> list[onnx.NodeProto] | None:
    """The nodes computing Reshape `r`'s [B, H, m, n] output as a batched product on merged
    heads over the 4-D tensors themselves (module docstring), or None; Shape nodes of the
    merged form that read an operand of its shape instead go into `moved` (by position)."""
    y = g.shape(r.output[0])
    if not _known(y) or len(y) != 4:
        return None
    lead = tuple(y[:2])
    terms: list[tuple[onnx.NodeProto, int]] = []  # (node, its input from the product), outermost first
    chain: list[tuple[str, onnx.NodeProto]] = []  # (a merged tensor, its reader in the chain)
    t, reader = r.input[0], r
    while True:
        n = g.op(t)
        if n is None or t in g.outputs:
            return None
        chain.append((t, reader))
        if n.op_type == "MatMul":
            break
        if n.op_type not in LIFT_TERMS or len(n.input) != 2 or len(terms) == MAX_LIFT_TERMS:
            return None
        full = [k for k, u in enumerate(n.input) if g.shape(u) is not None and g.shape(u) == g.shape(t)]
        if len(full) != 1:  # the product's side is the one of the output's shape, alone
            return None
        terms.append((n, full[0]))
        t, reader = n.input[full[0]], n
    a = _heads_source(g, n.input[0], lead)
    kt = g.op(n.input[1])
    transposed = kt is not None and kt.op_type == "Transpose" and list(node_attrs(kt).get("perm", ())) == [0, 2, 1]
    b = _heads_source(g, kt.input[0] if transposed else n.input[1], lead)
    same = [n.input[0], n.input[1]] + ([kt.input[0]] if transposed else [])
    if a is None or b is None or not all(_moved_shapes(g, u, by, r, same, moved) for u, by in chain):
        return None
    name, out = r.output[0], []
    more: list[onnx.TensorProto] = []
    if transposed:
        out.append(helper.make_node("Transpose", [b], [f"{name}~bt"], name=f"{name}~bt", perm=[0, 1, 3, 2]))
        b = f"{name}~bt"
    x = name if not terms else f"{name}~product"
    out.append(helper.make_node("MatMul", [a, b], [x], name=n.name or f"{name}~product"))
    for depth, (term, k) in enumerate(reversed(terms)):
        other = _lifted_term(g, term.input[1 - k], lead, name, depth, out, more)
        if other is None:
            return None
        inputs = [x, other] if k == 0 else [other, x]
        x = name if depth == len(terms) - 1 else f"{name}~{depth}"
        out.append(helper.make_node(term.op_type, inputs, [x], name=term.name or x))
    extra.extend(more)
    return out


def _head_scaled(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """Mul `n` of a product by a factor constant along its last two dims, as the product of the
    scaled first operand (module docstring), or None."""
    if len(n.input) != 2:
        return None
    for k in (0, 1):
        p, t = g.op(n.input[k]), n.input[1 - k]
        if p is None or p.op_type != "MatMul" or len(g.index.readers_of(n.input[k])) != 1 or n.input[k] in g.outputs:
            continue
        a, ts, out = g.shape(p.input[0]), g.shape(t), g.shape(n.output[0])
        # (products over heads alone, [b, h, m, k]: a GEMM's epilogue scale stays where it is)
        if not _known(a) or not _known(ts) or not _known(out) or len(a) != 4 or len(ts) > len(a) or \
                tuple(ts[-2:]) != (1,) * min(2, len(ts)) or all(d == 1 for d in ts) or \
                broadcast_shapes([a, ts]) != tuple(a) or g.shape(n.input[k]) != out:
            continue  # (a scalar is the attention matcher's own scale)
        scaled = f"{n.output[0]}~scaled"
        return [helper.make_node("Mul", [p.input[0], t], [scaled], name=f"{n.name or n.output[0]}~scale"),
                helper.make_node("MatMul", [scaled, p.input[1]], list(n.output), name=p.name)]
    return None


def _scalar_step(g: _Graph, t: str) -> tuple[onnx.NodeProto, int] | None:
    """(the Mul or Div producing `t`, the position of its other operand) when that operand is a
    scalar constant: a step that applies alike to a tensor of any rank."""
    n = g.op(t)
    if n is None or n.op_type not in ("Mul", "Div") or len(n.input) != 2:
        return None
    for k in ((1,) if n.op_type == "Div" else (1, 0)):
        c = g.constants.get(n.input[k])
        if c is not None and int(np.prod(c.dims)) == 1:
            return n, k
    return None


def _window_attention(g: _Graph, n: onnx.NodeProto, extra: list[onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    """The nodes computing MatMul `n`'s output when `n` ends an attention chain on rank-5
    operands [b, h, w, s, d] (module docstring: attention over windows), each step read once:
    the chain over [b, h·w, s, d] views of them, its context reshaped back; None otherwise."""
    probs, v = n.input[:2]
    soft = g.op(probs)
    if soft is None or soft.op_type != "Softmax" or node_attrs(soft).get("axis", -1) not in (-1, 4):
        return None
    steps: list[tuple[onnx.NodeProto, int]] = []  # scalar scales between the product and the Softmax
    t = soft.input[0]
    while (step := _scalar_step(g, t)) is not None and len(steps) < 2:
        steps.append(step)
        t = step[0].input[1 - step[1]]
    product = g.op(t)
    chain = [product, *(st for st, _ in steps), soft]
    if product is None or product.op_type != "MatMul" or \
            any(x.output[0] in g.outputs or len(g.index.readers_of(x.output[0])) != 1 for x in chain):
        return None
    q, kt = product.input[:2]
    qs, kts, vs, out = (g.shape(x) for x in (q, kt, v, n.output[0]))
    # (Every dim but b fixed: windows counted at run time, as TorchScript's Hiera has them, would
    # give q, kᵀ and v merged dims that shape inference names apart, and the matcher could not
    # tell them equal.)
    if not all(_known(x) and len(x) == 5 for x in (qs, kts, vs, out)) or \
            not all(isinstance(d, int) for x in (qs, kts, vs, out) for d in x[1:]) or \
            not (qs[:3] == kts[:3] == vs[:3]) or qs[4] != kts[3] or kts[4] != vs[3]:
        return None
    q_step = _scalar_step(g, q)
    if q_step is not None and (len(g.index.readers_of(q)) != 1 or q in g.outputs):
        q_step = None
    q_src = q_step[0].input[1 - q_step[1]] if q_step is not None else q
    name, nodes = n.output[0], []

    def shape(dims: list[int], tag: str) -> str:
        extra.append(numpy_helper.from_array(np.array(dims, np.int64), f"{name}~{tag}"))
        return f"{name}~{tag}"

    def node(op: str, ins: list[str], tag: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [f"{name}~{tag}"], name=f"{name}~{tag}", **attrs))
        return f"{name}~{tag}"

    # q's own scalar scale after the view (the attention matcher folds it); kᵀ as the 4-D K's
    # transpose where it is one of a rank-5 K.
    if q_step is not None:
        k = q_step[1]
        view = node("Reshape", [q_src, shape([0, -1, qs[3], qs[4]], "qshape")], "q")
        ins = [view, q_step[0].input[k]] if k == 1 else [q_step[0].input[k], view]
        q4 = node(q_step[0].op_type, ins, "qscaled")
    else:
        q4 = node("Reshape", [q, shape([0, -1, qs[3], qs[4]], "qshape")], "q")
    tr = g.op(kt)
    if tr is not None and tr.op_type == "Transpose" and list(node_attrs(tr).get("perm", ())) == [0, 1, 2, 4, 3] and \
            len(g.index.readers_of(kt)) == 1 and kt not in g.outputs:
        k4 = node("Reshape", [tr.input[0], shape([0, -1, kts[4], kts[3]], "kshape")], "k")
        kt4 = node("Transpose", [k4], "kt", perm=[0, 1, 3, 2])
    else:
        kt4 = node("Reshape", [kt, shape([0, -1, kts[3], kts[4]], "ktshape")], "kt")
    x = node("MatMul", [q4, kt4], "scores")
    for j, (st, k) in enumerate(reversed(steps)):
        x = node(st.op_type, [x, st.input[k]] if k == 1 else [st.input[k], x], f"scaled{j}")
    p = node("Softmax", [x], "probs", axis=-1)
    v4 = node("Reshape", [v, shape([0, -1, vs[3], vs[4]], "vshape")], "v")
    c = node("MatMul", [p, v4], "context")
    nodes.append(helper.make_node("Reshape", [c, shape([0, *out[1:]], "shape")], [name], name=n.name or name))
    return nodes


def _fixed_size(g: _Graph, n: onnx.NodeProto) -> np.ndarray | None:
    """The value of Size `n` when its input's shape is fixed (the Size of a Shape: a rank)."""
    shape = g.shape(n.input[0]) if n.input else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return np.array(int(np.prod(shape, dtype=np.int64)), np.int64)


def _taken_branch(g: _Graph, n: onnx.NodeProto, known: Mapping[str, np.ndarray]) -> tuple[str, onnx.GraphProto] | None:
    """(attribute name, graph) of the branch If `n` takes when its condition is known, else None."""
    cond = known.get(n.input[0]) if n.input else None
    if cond is None and n.input:
        cond = g.value(n.input[0])
    if cond is None or np.size(cond) != 1:
        return None
    name = "then_branch" if bool(np.ravel(cond)[0]) else "else_branch"
    body = next((a.g for a in n.attribute if a.name == name), None)
    return None if body is None else (name, body)


def _inlined_branch(g: _Graph, n: onnx.NodeProto, body: onnx.GraphProto, nested: set[str],
                    rename: dict[str, str], extra: list[onnx.TensorProto]) -> list[onnx.NodeProto] | None:
    """The nodes of If `n`'s branch `body` in the graph's place of `n` (module docstring), or None
    where the branch makes a name the graph has or has outputs other than the If's count."""
    if len(body.output) != len(n.output):
        return None
    made = {o for m in body.node for o in m.output if o} | {t.name for t in body.initializer}
    taken = set(g.index.producer) | set(g.index.inputs) | set(g.constants)
    if made & taken:
        return None
    nodes: list[onnx.NodeProto] = []
    extra.extend(body.initializer)
    for m in body.node:
        value = next((a.t for a in m.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        if m.op_type == "Constant" and m.domain in ("", "ai.onnx") and value is not None and len(m.attribute) == 1:
            t = onnx.TensorProto()
            t.CopyFrom(value)
            t.name = m.output[0]
            extra.append(t)
        else:
            nodes.append(m)
    for inner, outer in zip((o.name for o in body.output), n.output):
        if not outer:
            continue
        if outer in g.outputs or outer in nested:  # (names that must stay)
            nodes.append(helper.make_node("Identity", [inner], [outer], name=f"{n.name or outer}~{outer}"))
        else:
            rename[outer] = inner
    return nodes


def _scalar_views(g: _Graph, n: onnx.NodeProto, replace: dict[int, list[onnx.NodeProto]],
                  extra: list[onnx.TensorProto]) -> list[onnx.NodeProto]:
    """For an If `n` being inlined: each of its outputs of rank >= 1 that an op reads where it
    takes a scalar (SCALAR_INPUTS) read as a Reshape of it to rank 0 instead (the same value: the
    op runs only on one element); the Reshapes, the readers rewired in `replace`."""
    views: list[onnx.NodeProto] = []
    for outer in n.output:
        shape = g.shape(outer) if outer else None
        if not shape:
            continue
        for j in g.index.readers.get(outer, ()):
            r = g.nodes[j]
            slots = [k for k in SCALAR_INPUTS.get(r.op_type, ()) if k < len(r.input) and r.input[k] == outer]
            if not slots or j in replace or r.domain not in ("", "ai.onnx"):
                continue
            if not views or views[-1].input[0] != outer:
                extra.append(numpy_helper.from_array(np.zeros(0, np.int64), f"{outer}~scalar_shape"))
                views.append(helper.make_node("Reshape", [outer, f"{outer}~scalar_shape"], [f"{outer}~scalar"],
                                              name=f"{n.name or outer}~{outer}~scalar"))
            rewired = onnx.NodeProto()
            rewired.CopyFrom(r)
            for k in slots:
                rewired.input[k] = f"{outer}~scalar"
            replace[j] = [rewired]
    return views


def simplify(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo], rounds: int = INLINE_ROUNDS) -> Simplified:
    """`model` with the rewrites of the module docstring applied; `tensors` are its inferred
    facts, inferred again for a rewritten model."""
    g = _Graph(model, tensors)
    opset = g.index.opset
    replace: dict[int, list[onnx.NodeProto]] = {}  # node position → its replacement
    rename: dict[str, str] = {}  # a removed And's or Identity's output → the tensor that replaces it
    extra: list[onnx.TensorProto] = []
    done: list[str] = []
    # Tensors read inside subgraphs: the rename reaches only the main graph's inputs.
    nested = {t for n in g.nodes for t in edit.implicit_inputs(n)}
    known: dict[str, np.ndarray] = {}  # values folded so far (fixed dims, then what they feed)
    folded: list[str] = []
    inlines = brought = 0
    for i, n in enumerate(g.nodes):
        if n.domain not in ("", "ai.onnx") or i in replace:  # (a Shape a lifted product moved)
            continue
        if n.op_type == "Identity" and n.input and n.input[0] in g.constants and \
                n.output[0] not in g.outputs and n.output[0] not in nested:
            rename[n.output[0]] = n.input[0]
            replace[i] = []
            done.append(f"{n.name or n.output[0]} (an Identity of the constant '{n.input[0]}') is that constant")
            continue
        if n.op_type == "Cast" and n.input and n.output[0] not in g.outputs and n.output[0] not in nested:
            src = g.tensors.get(n.input[0])
            if src is not None and src.dtype and src.dtype == node_attrs(n).get("to"):
                rename[n.output[0]] = n.input[0]
                replace[i] = []
                done.append(f"{n.name or n.output[0]} (a Cast to the type '{n.input[0]}' has) is '{n.input[0]}'")
                if n.input[0] in known:  # (what reads it may fold on)
                    known[n.output[0]] = known[n.input[0]]
                continue
        if n.op_type == "Slice" and n.output[0] not in g.outputs and n.output[0] not in nested and \
                _keeps_everything(g, n):
            rename[n.output[0]] = n.input[0]
            replace[i] = []
            done.append(f"{n.name or n.output[0]} (a Slice that keeps every element) is '{n.input[0]}'")
            if n.input[0] in known:
                known[n.output[0]] = known[n.input[0]]
            continue
        if n.op_type == "If" and (taken := _taken_branch(g, n, known)) is not None:
            inlined = _inlined_branch(g, n, taken[1], nested, rename, extra)
            if inlined is not None:
                replace[i] = inlined + _scalar_views(g, n, replace, extra)
                inlines += 1
                brought += len(inlined) - 1
                done.append(f"{n.name or n.output[0]} (an If on a condition known by construction) is its "
                            f"{taken[0].split('_')[0]} branch, {len(taken[1].node)} nodes")
                continue
        if len(n.output) == 1 and n.output[0] not in g.outputs and n.output[0] not in nested:
            value = _fixed_dims(g, n) if n.op_type in ("Gather", "Slice") else None
            if value is not None:
                done.append(f"{n.name or n.output[0]} ({n.op_type} of fixed dims of a Shape) is the constant "
                            f"{value.tolist()}")
            elif n.op_type == "Size" and (value := _fixed_size(g, n)) is not None:
                done.append(f"{n.name or n.output[0]} (the Size of a tensor of fixed shape) is the constant "
                            f"{value.tolist()}")
            elif n.op_type in FOLDABLE and n.input and all(not t or t in known or _small(g, t) for t in n.input):
                value = _folded(g, n, known, opset)
                if value is not None:
                    folded.append(n.name or n.output[0])
            if value is not None:
                known[n.output[0]] = value
                extra.append(numpy_helper.from_array(value, n.output[0]))
                replace[i] = []
                continue
        if n.op_type == "GatherND":
            got = _unsqueezed_gather(g, n)
            if got is None:
                continue
            axes, data = got
            if opset >= 13:  # axes an input from opset 13, an attribute before
                name = f"{n.output[0]}~axes"
                extra.append(numpy_helper.from_array(np.array(axes, np.int64), name))
                replace[i] = [helper.make_node("Unsqueeze", [data, name], list(n.output), name=n.name)]
            else:
                replace[i] = [helper.make_node("Unsqueeze", [data], list(n.output), name=n.name, axes=axes)]
            done.append(f"{n.name or n.output[0]} (GatherND over an index grid) is an Unsqueeze of '{data}'")
        elif n.op_type == "Reshape" and (f := _flattened(g, n)) is not None:
            product = g.op(n.input[0])
            replace[i] = _unflattened(g, f, product.name or f.y, extra)
            done.append(f"{product.name or n.input[0]} ({product.op_type} on rows flattened from '{f.x}') "
                        f"is a MatMul over them{' with its bias added' if f.bias else ''}")
        elif n.op_type == "Reshape" and n.output[0] not in nested and \
                (lifted := _lifted_product(g, n, extra, moved := {})) is not None and not set(moved) & set(replace):
            replace[i] = lifted
            replace.update({at: [shape] for at, shape in moved.items()})
            done.append(f"{n.name or n.output[0]} (a product on merged heads reshaped to 4-D) is a batched "
                        f"product over the 4-D tensors")
        elif n.op_type == "MatMul" and n.output[0] not in nested and \
                (windows := _window_attention(g, n, more := [])) is not None:
            replace[i] = windows
            extra.extend(more)
            done.append(f"{n.name or n.output[0]} (attention over windows: rank-5 operands) runs on [b, h·w, s, d] "
                        f"views of them")
        elif n.op_type == "Mul" and n.output[0] not in nested and (scaled := _head_scaled(g, n)) is not None:
            replace[i] = scaled
            done.append(f"{n.name or n.output[0]} (a product scaled per head) scales its first operand instead")
        elif n.op_type == "Shape" and n.input and (x := _shape_of_repeat(g, n)) is not None:
            replace[i] = [helper.make_node("Shape", [x], list(n.output), name=n.name)]
            done.append(f"{n.name or n.output[0]} (the shape of a repeated K/V, dims other than the heads) reads '{x}'")
        elif n.op_type == "And" and len(n.input) == 2 and n.output[0] not in g.outputs:  # outputs keep their names
            for x, y in ((n.input[0], n.input[1]), (n.input[1], n.input[0])):
                ys, out = g.shape(y), g.shape(n.output[0])
                if ys is None or out is None or not _all_true(g, x):
                    continue
                if tuple(ys) == tuple(out) or _keeps_shapes(g, n.output[0], ys):
                    rename[n.output[0]] = y
                    replace[i] = []
                    done.append(f"{n.name or n.output[0]} (And with a tensor known all true) is '{y}'"
                                + ("" if tuple(ys) == tuple(out) else f", {list(ys)} rather than {list(out)}"))
                    break
    if folded:
        more = f" (and {len(folded) - 3} more)" if len(folded) > 3 else ""
        done.append(f"{', '.join(folded[:3])}{more}: computed from constants alone, constants")
    if not done:
        return Simplified(model, tensors)
    out = edit.spliced(g.index, replace, initializers=extra, rename=rename, prune=True)
    result = Simplified(out, infer(out)[1], tuple(done), brought)
    if inlines and rounds > 1:  # (the inlined nodes have not been looked at)
        again = simplify(result.model, result.tensors, rounds - 1)
        result = Simplified(again.model, again.tensors, result.rewrites + again.rewrites, brought + again.inlined_nodes)
    return result
