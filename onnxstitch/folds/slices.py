"""Slice and Split folded into the kernels that read their outputs (docs/abi.md, `input_boxes`).

A Slice or Split with constant parameters selects, for each of its outputs, a box of its input:
one axis cut to `[start, stop)`, every other axis whole. A group holding the node does not copy
the box out: the kernel reads the input through it (the runtime offsets the input's pointer to
the box's first element and passes the input's own strides), so the box is just an input whose
shape is the box's. ONNX Runtime's Slice/Split kernel, and the second pass over the bytes it
writes, disappear. GPT-2's fused QKV projection (Split → 3 × Reshape → Transpose) becomes one
kernel; a GLU's halves (Split → Sigmoid → Mul) one read of the projection.

What folds, decided here (graph.build asks): constant starts/ends/axes (steps 1) or split sizes
known from shape inference, one sliced axis, a static dim along it. Where a group may hold the
node (its input read from outside, its outputs all read inside) is candidates.py's business.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..shapes import TensorInfo

OPS = frozenset({"Slice", "Split"})
NO_BOX = (-1, 0, 0)  # the `input_boxes` entry of an input read whole


@dataclass(frozen=True)
class Box:
    """Output `tensor` of a Slice/Split is `source` with axis `axis` cut to [start, stop)."""

    tensor: str
    source: str
    axis: int  # non-negative, relative to the source's rank
    start: int
    stop: int

    def encode(self) -> tuple[int, int, int]:
        return (self.axis, self.start, self.stop)


# A Slice's parameters, in the order of its inputs from opset 10 on (the data is input 0).
PARAMETERS = ("starts", "ends", "axes", "steps")


def parameter(node: onnx.NodeProto, attrs: Mapping[str, object], constants: Mapping[str, onnx.TensorProto],
              position: int, name: str) -> list[int] | None | str:
    """A Slice parameter from its input (opset 10 on) or its attribute (before): the values,
    None when absent, or why it cannot be read."""
    if name in attrs:
        return [int(v) for v in attrs[name]]  # type: ignore[union-attr]
    if len(node.input) <= position or not node.input[position]:
        return None
    t = node.input[position]
    if t not in constants:
        return f"its {name} input '{t}' is not a constant"
    return [int(v) for v in numpy_helper.to_array(constants[t]).reshape(-1)]


def boxes(node: onnx.NodeProto, attrs: Mapping[str, object], tensors: Mapping[str, TensorInfo],
          constants: Mapping[str, onnx.TensorProto]) -> list[Box] | str:
    """The box of each output of a Slice/Split node, or why the node cannot be folded."""
    x = tensors.get(node.input[0])
    if x is None or x.shape is None:
        return f"the shape of '{node.input[0]}' is unknown"
    rank = len(x.shape)
    if rank == 0:
        return "a scalar input has nothing to slice"
    if node.op_type == "Split":
        axis = int(attrs.get("axis", 0)) % rank  # type: ignore[call-overload]
        dim = x.shape[axis]
        sizes = [tensors[t].shape[axis] if t in tensors and tensors[t].shape else None for t in node.output]
        if not isinstance(dim, int) or any(not isinstance(s, int) for s in sizes):
            return f"split along axis {axis}, whose size is not fixed at optimize time"
        if sum(sizes) != dim:  # type: ignore[arg-type]
            return f"its outputs' sizes along axis {axis} do not add up to {dim}"
        out, start = [], 0
        for t, s in zip(node.output, sizes):
            out.append(Box(t, node.input[0], axis, start, start + s))  # type: ignore[operator]
            start += s  # type: ignore[operator]
        return out
    starts, ends, axes, steps = (parameter(node, attrs, constants, k, name)
                                 for k, name in enumerate(PARAMETERS, 1))
    for v in (starts, ends, axes, steps):
        if isinstance(v, str):
            return v
    assert isinstance(starts, list) and isinstance(ends, list)
    axes = axes if isinstance(axes, list) else list(range(len(starts)))
    steps = steps if isinstance(steps, list) else [1] * len(starts)
    if any(s != 1 for s in steps):
        return "a step other than 1 (the kernel reads a box of whole elements)"
    cut: list[tuple[int, int, int]] = []
    for a, b, e in zip(axes, starts, ends):
        a %= rank
        dim = x.shape[a]
        if not isinstance(dim, int):
            return f"slices axis {a}, whose size is not fixed at optimize time"
        lo = min(max(b + dim if b < 0 else b, 0), dim)
        hi = min(max(e + dim if e < 0 else e, 0), dim)
        if (lo, max(lo, hi)) != (0, dim):
            cut.append((a, lo, max(lo, hi)))
    if len(cut) > 1:
        return f"slices {len(cut)} axes (a box cuts one)"
    a, lo, hi = cut[0] if cut else (0, 0, x.shape[0])  # type: ignore[assignment]
    if not isinstance(hi, int):
        return "slices nothing along a dynamic axis"  # a no-op Slice with a dynamic first dim
    return [Box(node.output[0], node.input[0], a, lo, hi)]


def encode_all(bs: Sequence[Box | None]) -> list[int]:
    """The `input_boxes` attribute: (axis, start, stop) per input, NO_BOX where read whole."""
    return [v for b in bs for v in (b.encode() if b is not None else NO_BOX)]


def formal(box: Box) -> str:
    """The fused node function's name for the source of a boxed input (a source read through two
    boxes, a Split's halves, is passed twice; a function's inputs need distinct names)."""
    return f"{box.tensor}~source"


def fallback_nodes(box: Box) -> list[onnx.NodeProto]:
    """ONNX nodes computing the boxed input from its source inside the fused node's function
    (which cannot read the graph's initializers: the parameters are Constant nodes)."""
    nodes, params = [], []
    for name, v in (("starts", box.start), ("ends", box.stop), ("axes", box.axis)):
        t = f"{box.tensor}~{name}"
        nodes.append(helper.make_node("Constant", [], [t], value=numpy_helper.from_array(np.array([v], np.int64))))
        params.append(t)
    nodes.append(helper.make_node("Slice", [formal(box), *params], [box.tensor]))
    return nodes
