"""The fused function's body for a decoder-form chain (decoder.py): the chain's own nodes read
tensors the kernel does not take (the expanded K and V, the combined mask), so the body is
written from the match instead, over the kernel's inputs: K and V repeated to the q heads,
the scores (cast to float32 with V where the chain is upcast) scaled, the additive terms, the
boolean mask, the causal mask built from the operands' shapes, Softmax, the NaN guard, the
product with V and the Transpose."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...graph import FusionGraph
from . import match as attention


class _Body:
    """Nodes under names of their own (`prefix`~k), constants as Constant nodes."""

    def __init__(self, prefix: str, dtype: int) -> None:
        self.prefix, self.dtype, self.nodes, self.count = prefix, dtype, [], 0

    def name(self) -> str:
        self.count += 1
        return f"{self.prefix}~fallback{self.count}"

    def const(self, value: object, dtype: object = None) -> str:
        t = self.name()
        array = np.asarray(value, dtype if dtype is not None else helper.tensor_dtype_to_np_dtype(self.dtype))
        self.nodes.append(helper.make_node("Constant", [], [t], value=numpy_helper.from_array(array, t)))
        return t

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or self.name()
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def _repeat(b: _Body, x: str, group: int, heads: int, d: int) -> str:
    """`x` [b, heads / group, s, d] with each head repeated `group` times: [b, heads, s, d]
    (repeat_kv)."""
    u = b.op("Reshape", [x, b.const([0, 0, 1, -1, d], np.int64)])
    e = b.op("Expand", [u, b.const([1, 1, group, 1, 1], np.int64)])
    return b.op("Reshape", [e, b.const([0, heads, -1, d], np.int64)])


def _causal(b: _Body, q: str, v: str, scores: str, fill: float) -> str:
    """Where(key <= query + Sk − Sq, scores, fill), Sq and Sk from q's and v's shapes."""
    def length(t: str) -> str:
        return b.op("Gather", [b.op("Shape", [t]), b.const(2, np.int64)], axis=0)

    sq, sk = length(q), length(v)
    one, zero = b.const(1, np.int64), b.const(0, np.int64)
    rows = b.op("Add", [b.op("Range", [zero, sq, one]), b.op("Sub", [sk, sq])])
    keep = b.op("LessOrEqual", [b.op("Range", [zero, sk, one]), b.op("Reshape", [rows, b.const([-1, 1], np.int64)])])
    return b.op("Where", [keep, scores, b.const(fill)])


def body(graph: FusionGraph, m: attention.Match) -> tuple[onnx.NodeProto, ...]:
    """The function body computing `m.output` from `m.inputs` (module docstring)."""
    b = _Body(m.output, m.term_dtype)
    q, kt, v = m.q, m.kt, m.v
    if m.kv_group > 1:
        heads = int(graph.shape(m.q)[1])  # type: ignore[index]
        kt = b.op("Transpose", [_repeat(b, kt, m.kv_group, heads, m.head_dim)], perm=[0, 1, 3, 2])
        v = _repeat(b, v, m.kv_group, heads, m.head_dim)
    s = b.op("MatMul", [q, kt])
    if m.upcast:  # the half product and V in float32, as the chain had them
        s, v = b.op("Cast", [s], to=onnx.TensorProto.FLOAT), b.op("Cast", [v], to=onnx.TensorProto.FLOAT)
    s = b.op("Mul", [s, b.const(m.scale)])
    if m.softcap:  # softcap · tanh(s): Gemma 2's logit cap (the division by it is in the scale)
        s = b.op("Mul", [b.op("Tanh", [s]), b.const(m.softcap)])

    def select(s: str) -> str:
        fill = b.const(m.select.fill)
        return b.op("Where", [m.select.mask, s, fill] if m.select.keep else [m.select.mask, fill, s])

    if m.select is not None and m.select.first:  # Where(mask, scores, fill) + terms (GPT-Neo)
        s = select(s)
    for term in m.masks:
        s = b.op("Add", [s, term])
    if m.select is not None and not m.select.first:
        s = select(s)
    if m.causal:
        s = _causal(b, q, v, s, m.causal_fill)
    p = b.op("Softmax", [s], axis=-1)
    if m.guarded:
        p = b.op("Where", [b.op("IsNaN", [p]), b.const(0), p])
    if m.transposed:
        b.op("Transpose", [b.op("MatMul", [p, v])], m.output, perm=[0, 2, 1, 3])
    else:
        b.op("MatMul", [p, v], m.output)
    return tuple(b.nodes)
