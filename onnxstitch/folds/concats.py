"""Concat stitched into the elementwise kernel around it (docs/abi.md, `input_windows`).

A Concat along one axis with sizes fixed at optimize time splits its output's axis into
windows: operand k covers [origin_k, origin_k + size_k). A group holding the Concat iterates
over its output. Each operand, and every member that computes it, is evaluated in its window:
the inputs they read are shifted by -origin_k along the axis (the runtime offsets the pointer,
keeps the tensor's own strides, and counts the axis as the Concat's for the iteration shape)
and are loaded only where the element lies in that window. The Concat itself selects, per
element, the operand whose window holds it. So the Concat's copy, and the second pass over
the bytes it writes, disappear; with Slice folding (slices.py) LLaMA's rotate_half
(Slice, Slice, Neg, Concat) and the rotary embedding's Mul/Add around it are one kernel.

Members in a window compute values that exist only there: every member they feed is in the
same window or is the Concat. Inputs of size 1 along the axis (or of lower rank) read the same
value in every window and need none, unless their window is one element wide too. What folds,
per node (graph.build asks): a Concat whose operands' sizes along its axis are known. Per group
(candidates.py asks `layout`): one Concat, no reductions, each window's values and inputs kept
to that window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import onnx

from ..ops import OpKind
from ..shapes import Shape, TensorInfo

if TYPE_CHECKING:
    from ..graph import FusionGraph

NO_WINDOW = (-1, 0, 0, 0)  # the `input_windows` entry of an input read unshifted
# Operands of a stitched Concat. Each thread tests every operand's window, computes every
# operand's offset (per element where the innermost dim is not a multiple of the vector: 7 × 7
# maps) and selects among them by a chain of comparisons: work per element grows with the
# operand count. DenseNet-121's dense layers concatenate up to 25 tensors before their
# BatchNorm → ReLU; all stitched, torchvision's DenseNet-121 (batch 8, both exporters) ran at
# 0.54× of stock ORT on an H200. The data Concats of every other corpus and zoo model have at
# most 4 operands (YOLO's C2f and SPPF, Inception's branches, Swin's patch merging, PP-OCR's
# necks, rotary halves); more are left to ONNX Runtime's copy.
MAX_OPERANDS = 4


@dataclass(frozen=True)
class Window:
    """An input read in one operand's window of a Concat: along `axis` (of the input's own
    rank) its element j is the iteration's element origin + j, for j < size; `total` is the
    Concat's size along the axis, which the input counts as for the iteration shape."""

    axis: int
    origin: int
    size: int
    total: int

    def encode(self) -> tuple[int, int, int, int]:
        return (self.axis, self.origin, self.size, self.total)


@dataclass(frozen=True)
class Layout:
    """The windows of one group's Concat."""

    concat: int  # the Concat's node id
    from_end: int  # its axis counted from the innermost (1 = innermost): rank-independent
    sizes: tuple[int, ...]  # per operand, along the axis
    node_window: Mapping[int, int]  # member node -> the operand whose window it computes in
    input_window: Mapping[str, int]  # boundary input -> the operand whose window reads it

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def origins(self) -> tuple[int, ...]:
        """Where each operand's window starts along the axis."""
        return tuple(sum(self.sizes[:k]) for k in range(len(self.sizes)))

    def window(self, tensor: str, info: TensorInfo) -> Window | None:
        """The window a boundary input is read through, None when read unshifted."""
        k = self.input_window.get(tensor)
        if k is None or info.shape is None:
            return None
        return Window(len(info.shape) - self.from_end, self.origins[k], self.sizes[k], self.total)

    def lift(self, shape: Shape | None) -> Shape | None:
        """The shape of a windowed value as the iteration sees it: its size along the axis
        counted as the Concat's."""
        if shape is None or len(shape) < self.from_end:
            return shape
        out = list(shape)
        out[len(shape) - self.from_end] = self.total
        return tuple(out)


def node_reason(n: onnx.NodeProto, attrs: Mapping[str, object], tensors: Mapping[str, TensorInfo]) -> str | None:
    """Why a Concat node cannot be stitched (None when it can)."""
    out = tensors.get(n.output[0])
    if out is None or out.shape is None or not out.shape:
        return "the Concat's output shape is unknown"
    rank = len(out.shape)
    if rank == 1 and out.dtype in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        # ONNX Runtime keeps shape arithmetic on the host; a kernel would pull it to the GPU.
        return "a 1-D integer Concat builds a shape, which ONNX Runtime computes on the host"
    axis = int(attrs.get("axis", 0)) % rank  # type: ignore[call-overload]
    sizes = [tensors[t].shape[axis] if t in tensors and tensors[t].shape and len(tensors[t].shape) == rank else None
             for t in n.input]
    if any(not isinstance(s, int) for s in sizes):
        return f"an operand's size along axis {axis} is not fixed at optimize time"
    if len(set(n.input)) != len(n.input):
        return "it concatenates one tensor more than once (an input is read in one window)"
    if len(n.input) > MAX_OPERANDS:
        return (f"it concatenates {len(n.input)} tensors: a stitched Concat tests and holds every operand in each "
                f"thread, so at most {MAX_OPERANDS} are stitched")
    return None


def axis_from_end(graph: FusionGraph, concat: int) -> int:
    """The Concat's axis counted from the innermost (1 = innermost)."""
    n = graph.nodes[concat]
    rank = len(graph.tensors[n.outputs[0]].shape)
    return rank - int(n.attrs.get("axis", 0)) % rank  # type: ignore[call-overload]


def layout(graph: FusionGraph, members: frozenset[int], inputs: Sequence[str]) -> Layout | str | None:
    """The windows of a group (`members`, whose boundary inputs are `inputs`): None without a
    Concat, else its Layout or why its windows do not hold."""
    cats = [i for i in sorted(members) if graph.nodes[i].kind == OpKind.CONCAT]
    if not cats:
        return None
    if len(cats) > 1:
        return f"{graph.nodes[cats[1]].label}: a kernel stitches one Concat"
    c = cats[0]
    cat = graph.nodes[c]
    end = axis_from_end(graph, c)

    sizes = tuple(graph.tensors[t].shape[-end] for t in cat.inputs)

    def windowed(t: str, k: int) -> bool:
        """Whether `t`, met in window k, holds values of that window only: it has the axis, and
        its size there is not 1 (a broadcast value, the same in every window) unless the
        window's is."""
        info = graph.tensors.get(t)
        shape = info.shape if info is not None else None
        return shape is not None and len(shape) >= end and (shape[-end] != 1 or sizes[k] == 1)

    node_window: dict[int, int] = {}
    for k, t in enumerate(cat.inputs):
        stack = [t]
        while stack:
            v = stack.pop()
            p = graph.producer.get(v)
            if p is None or p not in members or not windowed(v, k) or graph.nodes[p].kind == OpKind.SLICE:
                continue  # read from outside (or a box of an outside tensor), or the same in every window
            if node_window.setdefault(p, k) != k:
                return (f"{graph.nodes[p].label} computes values of two windows of {cat.label}: "
                        f"a member computes in one window")
            stack += [u for u in graph.nodes[p].inputs if u]
    for p, k in node_window.items():
        if graph.nodes[p].op_type == "Expand":
            # Its fallback expands to the broadcast of the group's inputs (rewrite.py), which a
            # window's values do not have.
            return f"{graph.nodes[p].label} computes in window {k} of {cat.label}: Expand is not stitched in a window"
        for t in graph.nodes[p].outputs:
            if t in graph.graph_outputs or any(m not in members for m in graph.consumers.get(t, ())):
                return (f"'{t}' of {graph.nodes[p].label} is computed in window {k} of {cat.label} and "
                        f"needed outside the group: the kernel writes only the Concat's space")
            stray = [m for m in graph.consumers.get(t, ()) if m in members and m != c and node_window.get(m) != k]
            if stray:
                return (f"{graph.nodes[stray[0]].label} reads '{t}', which {graph.nodes[p].label} computes in "
                        f"window {k} of {cat.label}, outside that window")
    input_window: dict[str, int] = {}
    for t in inputs:
        seen = {cat.inputs.index(t) if m == c else node_window.get(m)
                for m in graph.consumers.get(t, ()) if m in members}
        need = {k for k in seen if k is not None and windowed(t, k)}
        if need and len(seen) > 1:
            where = ", ".join("the Concat's space" if w is None else f"window {w}" for w in sorted(seen, key=str))
            return f"'{t}' is read in {where} of {cat.label}: an input is read in one window"
        if need:
            input_window[t] = need.pop()
    return Layout(c, end, sizes, node_window, input_window)


def encode_all(ws: Sequence[Window | None]) -> list[int]:
    """The `input_windows` attribute: (axis, origin, size, total) per input, NO_WINDOW where
    the input is read unshifted."""
    return [v for w in ws for v in (w.encode() if w is not None else NO_WINDOW)]
