"""The conv scheme's layouts: which tensors stay NHWC between its groups, and how the nodes ONNX
Runtime runs between them (channel Concat/Split, elementwise work, pixel poolings) run over NHWC
tensors. The planner settles them after the plan (`layouts`, through the scheme's Matcher); the
rewrite applies them through the scheme's `Relayout` (schemes/base.py), naming no scheme.
A 1-D convolution's tensors ([N, C, W]) are held NWC the same way, between conv groups only (the
layout-neutral nodes here take rank-4 tensors)."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper

from ... import ops
from ...graph import FusionGraph, TensorInfo, row_axes
from ...planned import Plan
from .. import CONV
from ..base import NodeRewrite, Relayout
from .spec import DTYPES


NHWC_SUFFIX = "~nhwc"


def nhwc_name(t: str) -> str:
    """The name of tensor `t` held in NHWC between two conv nodes."""
    return t + NHWC_SUFFIX


def held(t: str) -> str | None:
    """The NCHW tensor an NHWC name (`nhwc_name`) holds, None for any other name."""
    return t[:-len(NHWC_SUFFIX)] if t.endswith(NHWC_SUFFIX) else None


def nhwc_info(g: FusionGraph, t: str) -> TensorInfo | None:
    """The type and shape of `t`, an NHWC tensor named by `nhwc_name`: its NCHW tensor's, dims
    permuted (None for any other name)."""
    base = g.tensors.get(nchw) if (nchw := held(t)) is not None else None
    if base is None:
        return None
    shape = None if base.shape is None else tuple(base.shape[k] for k in to_channels_last(len(base.shape)))
    return TensorInfo(t, base.dtype, shape)


def to_channels_last(rank: int) -> tuple[int, ...]:
    """The permutation taking a channels-first tensor of `rank` to channels-last: NCHW → NHWC
    (0, 2, 3, 1), a 1-D convolution's NCW → NWC (0, 2, 1)."""
    return (0, *range(2, rank), 1)


def to_channels_first(rank: int) -> tuple[int, ...]:
    """The inverse of `to_channels_last`."""
    return (0, rank - 1, *range(1, rank - 1))


def one_pixel(g: FusionGraph, t: str) -> bool:
    """Whether rank-4 `t` is [N, C, 1, 1]: its NCHW and NHWC forms are the same bytes (a
    squeeze-excite's pooled vector), so changing its layout costs nothing (launch.cc skips it)."""
    s = g.shape(t)
    return s is not None and len(s) == 4 and s[2] == 1 and s[3] == 1


# Nodes ONNX Runtime runs in either layout (`_neutral`): a channel Concat or Split is a
# last-axis one in NHWC; elementwise work is the same over permuted operands (broadcasts
# included, every rank-4 operand permuted alike); a reduction over the pixels (a squeeze-excite's
# pooling) is a product by a constant row over the NHWC tensor's pixels (`nhwc_node`).
CHANNEL_OPS = frozenset({"Concat", "Split"})
ELEMENTWISE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Relu", "HardSwish", "HardSigmoid", "Sigmoid",
                             "Tanh", "Clip", "LeakyRelu"})
POOL_OPS = frozenset({"ReduceMean", "ReduceSum", "GlobalAveragePool"})
AXES_INPUT_FROM = {"ReduceSum": 13, "ReduceMean": 18}  # the opset whose Reduce* takes its axes as an input


def _pools_pixels(g: FusionGraph, n) -> bool:
    """A reduction of a rank-4 tensor over its pixels alone, keeping the reduced dims."""
    keeps = n.op_type in ops.GLOBAL_POOLS or bool(int(n.attrs.get("keepdims", 1)))
    return keeps and row_axes(n, n.attrs, g.constants, g.opset, 4) == [2, 3]


def _neutral(g: FusionGraph, i: int) -> bool:
    """A node of CHANNEL_OPS, ELEMENTWISE_OPS or POOL_OPS that runs as well over NHWC tensors:
    rank-4 tensors; a channel Concat/Split; elementwise operands all rank 4 or constant scalars;
    a pooling over the pixels only."""
    n = g.nodes[i]
    if n.domain not in ("", "ai.onnx"):
        return False
    shape = g.shape(n.outputs[0])
    if shape is None or len(shape) != 4:
        return False
    if n.op_type in CHANNEL_OPS:
        return int(n.attrs.get("axis", 0)) in (1, -3)
    if n.op_type in ELEMENTWISE_OPS:
        for t in n.inputs:
            if not t:
                continue
            s = g.shape(t)
            if t in g.constants:
                if s is None or int(np.prod(s)) != 1:
                    return False
            elif s is None or len(s) != 4:
                return False
        return bool(_data_inputs(g, i))
    if n.op_type in POOL_OPS:
        s = g.shape(n.inputs[0])
        return s is not None and len(s) == 4 and _pools_pixels(g, n)
    return False


def _data_inputs(g: FusionGraph, i: int) -> tuple[str, ...]:
    """The rank-4 tensors a layout-neutral node reads (renamed to their NHWC form)."""
    n = g.nodes[i]
    if n.op_type == "Concat":
        return tuple(t for t in n.inputs if t)
    if n.op_type in ELEMENTWISE_OPS:
        return tuple(dict.fromkeys(t for t in n.inputs if t and t not in g.constants))
    return (n.inputs[0],) if n.inputs[0] else ()


def layouts(g: FusionGraph, plan: Plan) -> Plan:
    """`plan` with the tensors that pass between its conv groups and layout-neutral nodes
    (`_neutral`, run by ONNX Runtime: ungrouped, or the only node of its group) held NHWC: an
    output of a conv group or such a node, every reader of which is a conv group reading it as X
    or R, or such a node whose data inputs and outputs are all NHWC too (the largest such set,
    found by removing what breaks it). At one pixel ([N, C, 1, 1], `one_pixel`) both layouts are
    the same bytes: such a tensor may also have readers of the other layout, and a neutral node
    may read one held NCHW — the rewrite bridges them by Reshapes (`bridge`)."""
    convs = [grp for grp in plan.groups if grp.scheme == CONV]
    if not convs:
        return plan
    owner = {i: grp for grp in convs for i in grp.nodes}
    grouped = {i: grp for grp in plan.groups for i in grp.nodes}
    nodes = {i for i in range(len(g.nodes)) if _neutral(g, i)
             and (i not in grouped or (grouped[i].scheme != CONV and grouped[i].nodes == (i,)))}
    made = {grp.payload.output: None for grp in convs}
    made.update({t: i for i in nodes for t in g.nodes[i].outputs if t})

    def reads_nhwc(t: str, r: int) -> bool:
        if r in owner:
            return t in (owner[r].payload.x, owner[r].payload.residual)
        return r in nodes and t in _data_inputs(g, r)

    nhwc = set(made)
    while True:
        keep = {t for t in nhwc if t not in g.graph_outputs and g.consumers.get(t)
                and (one_pixel(g, t) or all(reads_nhwc(t, r) for r in g.consumers[t]))}
        # A neutral node stays where it reads at least one NHWC tensor of more than one pixel
        # and every other tensor it reads or writes is NHWC or one pixel.
        kept_nodes = {i for i in nodes
                      if all(t in keep or one_pixel(g, t) for t in _data_inputs(g, i))
                      and any(t in keep and not one_pixel(g, t) for t in _data_inputs(g, i))
                      and all(t in keep for t in g.nodes[i].outputs if t)}
        keep = {t for t in keep if made[t] is None or made[t] in kept_nodes}
        if keep == nhwc and kept_nodes == nodes:
            break
        nhwc, nodes = keep, kept_nodes
    if not nhwc:
        return plan
    groups = []
    for grp in plan.groups:
        if grp.scheme == CONV:
            m = grp.payload
            m = dataclasses.replace(m, layouts=(m.x in nhwc, m.output in nhwc, m.residual in nhwc))
            grp = dataclasses.replace(grp, payload=m)
        elif len(grp.nodes) == 1 and grp.nodes[0] in nodes:
            continue  # ONNX Runtime runs it, in NHWC
        groups.append(grp)
    return dataclasses.replace(plan, groups=tuple(groups), relaid=tuple((i, CONV) for i in sorted(nodes)))


def nhwc_node(g: FusionGraph, i: int, node: onnx.NodeProto) -> NodeRewrite:
    """Node `i` of `layouts` (`node` in the model) over the NHWC tensors: its data inputs and
    outputs renamed (`nhwc_name`), a channel Concat/Split along the last axis. A pooling over the
    pixels becomes a batched product [1, HW] · [N, HW, C] by a constant row (1/HW for a mean,
    ones for a sum) between two free Reshapes: ORT reduces an NHWC tensor's middle axes through
    cuDNN's reduction, 25 µs a squeeze-excite in MobileNetV3 float16 against ~4 µs for the NCHW
    pooling (H200 timeline), while the product is one GEMM reading it once. Where the pixels are
    not fixed, it is the Reduce* over axes 1 and 2 (its axes an input from AXES_INPUT_FROM on, by the
    model's opset)."""
    n = g.nodes[i]
    out = onnx.NodeProto()
    out.CopyFrom(node)
    data = set(_data_inputs(g, i))
    for k, t in enumerate(out.input):
        if t in data:
            out.input[k] = nhwc_name(t)
    for k, t in enumerate(out.output):
        if t:
            out.output[k] = nhwc_name(t)
    if n.op_type in CHANNEL_OPS:
        for a in out.attribute:
            if a.name == "axis":
                a.i = 3
        return NodeRewrite((out,))
    if n.op_type not in POOL_OPS:
        return NodeRewrite((out,))
    _, c, h, w = g.shape(n.inputs[0])
    dtype = g.tensors[n.inputs[0]].dtype
    if not all(isinstance(d, int) for d in (c, h, w)) or dtype not in DTYPES:
        # Pixels not fixed: the reduction over axes 1 and 2 (slower, but any size).
        op = ops.GLOBAL_POOLS.get(n.op_type, n.op_type)
        attrs = {a.name: helper.get_attribute_value(a) for a in out.attribute if a.name not in ("axes", "keepdims")}
        if g.opset >= AXES_INPUT_FROM[op]:
            axes = f"{out.output[0]}~axes"
            node = helper.make_node(op, [out.input[0], axes], list(out.output), name=out.name, keepdims=1, **attrs)
            return NodeRewrite((node,), (onnx.numpy_helper.from_array(np.array([1, 2], np.int64), axes),))
        return NodeRewrite((helper.make_node(op, [out.input[0]], list(out.output), name=out.name, axes=[1, 2],
                                             keepdims=1, **attrs),))
    y = out.output[0]
    row = np.full((1, h * w), 1.0 if n.op_type == "ReduceSum" else 1.0 / (h * w), helper.tensor_dtype_to_np_dtype(dtype))
    names = {k: f"{y}~{k}" for k in ("row", "rows_shape", "rows", "product", "pixel_shape")}
    constants = (onnx.numpy_helper.from_array(row, names["row"]),
                 onnx.numpy_helper.from_array(np.array([0, h * w, c], np.int64), names["rows_shape"]),
                 onnx.numpy_helper.from_array(np.array([0, 1, 1, c], np.int64), names["pixel_shape"]))
    return NodeRewrite((
        helper.make_node("Reshape", [out.input[0], names["rows_shape"]], [names["rows"]], name=f"{out.name}~rows"),
        helper.make_node("MatMul", [names["row"], names["rows"]], [names["product"]], name=f"{out.name}~pool"),
        helper.make_node("Reshape", [names["product"], names["pixel_shape"]], [y], name=f"{out.name}~pixel")), constants)


# Reshapes between the layouts of a one-pixel tensor: [N, C, 1, 1] ↔ [N, 1, 1, C].
TO_NHWC, TO_NCHW = "onnxstitch~one_pixel_nhwc", "onnxstitch~one_pixel_nchw"


def bridge(nodes: list[onnx.NodeProto], available: set[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Reshapes making each tensor `nodes` read but nothing makes from its other layout's form
    (`layouts` allows this at one pixel only), and the shapes they read. `available`: the graph's
    inputs and initializers."""
    made = {t for n in nodes for t in n.output if t} | available
    read = dict.fromkeys(t for n in nodes for t in n.input if t and t not in made)
    extra: list[onnx.NodeProto] = []
    for t in read:
        if (nchw := held(t)) is not None and nchw in made:
            extra.append(helper.make_node("Reshape", [nchw, TO_NHWC], [t], name=f"stitch_bridge_{t}"))
        elif nhwc_name(t) in made:
            extra.append(helper.make_node("Reshape", [nhwc_name(t), TO_NCHW], [t], name=f"stitch_bridge_{t}"))
    shapes = {TO_NHWC: [0, 1, 1, -1], TO_NCHW: [0, -1, 1, 1]}
    used = {n.input[1] for n in extra}
    return extra, [onnx.numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items() if k in used]


def restored(t: str, value: np.ndarray) -> np.ndarray:
    """An NHWC (or NWC) tensor's value as its NCHW (NCW) tensor."""
    return np.ascontiguousarray(np.transpose(value, to_channels_first(value.ndim)))


# How the rewrite runs the nodes `layouts` left to ONNX Runtime over NHWC tensors.
RELAYOUT = Relayout(node=nhwc_node, bridge=bridge, info=nhwc_info, holds=held, restored=restored)
