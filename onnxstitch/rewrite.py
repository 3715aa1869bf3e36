"""The rewrite stage: the stitched model. Each fused group becomes one `com.onnxstitch::FusedKernel`
node carrying its compiled kernel (docs/abi.md), backed by a model-local function whose
body is the original subgraph, so ONNX Runtime without the library still runs it.
"""
from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .compile import CompiledKernel, arch_number
from .schemes import registry
from . import lowering, ops
from .folds import concats, slices, views
from .edit import implicit_inputs
from .graph import FusionGraph, TensorInfo

DOMAIN = "com.onnxstitch"
OP_TYPE = "FusedKernel"
IR_VERSION = 10  # first IR version with function overloads
KERNEL_ATTRS = ("kernel_name", "vec_width", "image_archs", "image_sizes", "images", "ptx",
                "input_kinds", "output_dtypes", "shape_rule", "output_kinds", "row_geometry", "output_views",
                "input_boxes", "input_windows", "images_sha256")


@dataclass(frozen=True)
class FusedGroup:
    """What the rewrite needs of a planned group: its name, nodes and compiled kernel."""

    name: str
    nodes: tuple[int, ...]
    kernel: CompiledKernel


def _fused_node(group: FusedGroup) -> onnx.NodeProto:
    k = group.kernel
    # ORT's custom-op API reads no STRINGS attribute: cubins travel as one STRING blob split by
    # image_sizes (docs/abi.md). A library call (the gemm scheme) carries no image.
    blob = b"".join(k.images)
    # The runtime checks the images against their digest before loading them (docs/abi.md).
    images = dict(image_archs=[arch_number(a) for a in k.archs], image_sizes=[len(i) for i in k.images],
                  images=blob, ptx=k.ptx, images_sha256=hashlib.sha256(blob + k.ptx).hexdigest()) \
        if k.images or k.ptx else {}
    node = helper.make_node(
        OP_TYPE, list(k.source.bound_inputs), list(k.source.outputs), name=f"stitch_{group.name}", domain=DOMAIN,
        kernel_name=k.source.name, vec_width=k.source.vec_width, shape_rule=k.source.shape_rule, **images)
    node.attribute.append(helper.make_attribute("output_dtypes", list(k.source.output_dtypes),
                                                attr_type=onnx.AttributeProto.INTS))
    # Typed explicitly: a group fed only by baked constants has no inputs, and an empty list
    # has no type to infer.
    node.attribute.append(helper.make_attribute("input_kinds", list(k.source.input_kinds),
                                                attr_type=onnx.AttributeProto.INTS))
    node.attribute.extend(registry.get(k.source.scheme).attributes(k.source))
    if k.source.input_boxes:
        node.attribute.append(helper.make_attribute("input_boxes", slices.encode_all(k.source.input_boxes)))
    if k.source.input_windows:
        node.attribute.append(helper.make_attribute("input_windows", concats.encode_all(k.source.input_windows)))
    node.overload = group.name
    return node


def _function(model: onnx.ModelProto, graph: FusionGraph, group: FusedGroup) -> onnx.FunctionProto:
    src = group.kernel.source
    body: list[onnx.NodeProto] = []
    members = frozenset(group.nodes)
    # The original nodes' constants that are not the function's inputs: baked scalars, and the
    # [C] parameters that channel_params replaced by [C, 1, …] inputs. Function bodies cannot
    # see graph initializers.
    inits = {i.name: i for i in model.graph.initializer}
    # A scheme whose kernels read their own shape and slice parameters (attention) has the
    # group's nodes as they are for its body.
    chain = registry.get(src.scheme).fallback_verbatim
    # Layout tails go into the body as the original nodes wherever their shape inputs are
    # constants (the body is then the original subgraph, verbatim); a tail whose shapes are
    # computed at run time, which the function does not receive, is written as the view the
    # kernel computes (views.fallback_nodes).
    layout = [i for i in group.nodes if graph.nodes[i].kind == ops.OpKind.INJECTIVE]
    verbatim = chain or all(graph.producer.get(t) in members or t in graph.constants
                            for i in layout for t in model.graph.node[i].input[1:] if t)
    computes = [i for i in group.nodes if chain or graph.nodes[i].kind != ops.OpKind.SLICE
                and (verbatim or graph.nodes[i].kind != ops.OpKind.INJECTIVE)]
    # An attention chain's nodes read their own shape and slice parameters (its projections'
    # Slices and Reshapes, attention.Projection); a Reshape's runtime shape becomes a constant.
    nodes, made = {i: model.graph.node[i] for i in computes}, {}
    for i in computes if chain and not src.fallback else ():
        nodes[i], extra = _fixed_reshape(graph, nodes[i])
        made |= extra
    # (Expand's shape input is not read: _expand_fallback takes the shape from the inputs.)
    read = [t for i in computes for n in [nodes[i]]
            for t in (n.input if chain or i in layout else ops.data_inputs(n.op_type, n.domain, n.input))]
    before = list(src.fallback_before)
    made_before = {t for n in before for t in n.output}
    local = {t for t in read if t and graph.producer.get(t) not in members and t not in src.inputs
             and t not in made_before}
    body += before
    for t in sorted(local) if not src.fallback else ():
        body.append(helper.make_node("Constant", [], [t], value=graph.constants.get(t) or inits.get(t) or made[t]))
    # Boxed inputs (folded Slice/Split): the function receives their sources and slices them.
    boxes = src.input_boxes or (None,) * len(src.inputs)
    for b in boxes:
        if b is not None:
            body.extend(slices.fallback_nodes(b))
    for i in computes:
        body.extend(_expand_fallback(model.graph.node[i], src.inputs) if graph.nodes[i].op_type == "Expand"
                    else [nodes[i]])
    if src.fallback:  # the scheme wrote the body itself, over the kernel's inputs alone
        body = list(src.fallback)
    # Layout chains as the kernel writes them: their own shape inputs may be runtime tensors
    # the function does not receive.
    for view in () if verbatim else views.group_views(graph, members, src.outputs):
        if view is not None:
            body.extend(views.fallback_nodes(view))
    # Written in the forms the model's opset has (Constant-1 gives no int64: an opset-7 model).
    body = lowering.lowered(body, lowering.default_opset(model.opset_import), src.outputs)
    formal = [slices.formal(b) if b is not None else t for t, b in zip(src.inputs, boxes)]
    # A tensor bound twice (an attention kernel's one projection for q, kᵀ and v) is one formal
    # input; the repeats get names of their own the body does not read.
    formal = [t if t not in formal[:k] else f"{t}~{k}" for k, t in enumerate(formal)]
    fn = helper.make_function(DOMAIN, OP_TYPE, formal, list(src.outputs), body,
                              [o for o in model.opset_import if o.domain != DOMAIN],
                              attributes=[*KERNEL_ATTRS, *(a.name for a in registry.get(src.scheme).attributes(src)
                                                           if a.name not in KERNEL_ATTRS)])
    fn.overload = group.name
    return fn


def _fixed_reshape(graph: FusionGraph, node: onnx.NodeProto) -> tuple[onnx.NodeProto, dict[str, onnx.TensorProto]]:
    """(`node`, no constants), or for a Reshape whose shape is computed at run time, the same
    Reshape to a constant shape and that constant: its output's fixed dims, and 0 (copy the
    input's dim) where the output has its input's symbolic dim at the same position."""
    if node.op_type != "Reshape" or node.input[1] in graph.constants:
        return node, {}
    src, out = graph.tensors[node.input[0]].shape, graph.tensors[node.output[0]].shape
    assert src is not None and out is not None
    assert all(isinstance(d, int) or (k < len(src) and src[k] == d) for k, d in enumerate(out)), node.name
    shape = f"{node.output[0]}~shape"
    dims = np.array([d if isinstance(d, int) else 0 for d in out], np.int64)
    fixed = helper.make_node("Reshape", [node.input[0], shape], list(node.output), name=node.name)
    return fixed, {shape: numpy_helper.from_array(dims, shape)}


def _expand_fallback(node: onnx.NodeProto, inputs: Sequence[str]) -> list[onnx.NodeProto]:
    """Expand inside a function body, whose shape input may be a runtime tensor the function
    does not receive: expanded against the shape of every group input instead (legality made
    their broadcast the expanded shape; Expand broadcasts both ways)."""
    nodes, t = [], node.input[0]
    for k, x in enumerate(inputs):
        out = node.output[0] if k == len(inputs) - 1 else f"{node.output[0]}~expand{k}"
        nodes += [helper.make_node("Shape", [x], [f"{node.output[0]}~shape{k}"]),
                  helper.make_node("Expand", [t, f"{node.output[0]}~shape{k}"], [out])]
        t = out
    return nodes


def _topo(nodes: list[onnx.NodeProto], graph_inputs: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order (ties keep list order), so fused nodes land where they can."""
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    # Subgraphs' reads of outer tensors (If/Loop/Scan bodies) order their node as inputs do.
    deps = [{producer[t] for t in list(n.input) + implicit_inputs(n) if t in producer and producer[t] != i}
            for i, n in enumerate(nodes)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    pending = [len(d) for d in deps]
    ready = [i for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise AssertionError("rewrite produced a cycle; the plan must be acyclic")
    return [nodes[i] for i in order]


def _drop_orphans(original: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` without those the rewrite orphaned: nodes whose every output was read in the
    original graph and is read by nothing now (a folded Reshape's shape computation)."""
    def reads(ns: Sequence[onnx.NodeProto]) -> set[str]:
        return {t for n in ns for t in list(n.input) + implicit_inputs(n)} | {o.name for o in original.output}

    read_before = reads(original.node)
    while True:
        read = reads(nodes)
        keep = [n for n in nodes if n.domain == DOMAIN or not n.output
                or any(t in read or t not in read_before for t in n.output if t)]
        if len(keep) == len(nodes):
            return nodes
        nodes = keep


def _relaid_info(graph: FusionGraph, t: str) -> TensorInfo:
    info = registry.relaid_info(graph, t)
    if info is None:
        raise KeyError(f"no tensor {t!r} in the graph and no scheme names it")
    return info


def _declare_fused_outputs(g: onnx.GraphProto, graph: FusionGraph, groups: Sequence[FusedGroup]) -> None:
    """value_info for every fused output: ORT cannot infer a custom op's output type where an
    input is a scalar (it cannot tell 'scalar' from 'unknown shape')."""
    known = {v.name for v in g.value_info} | {o.name for o in g.output}
    for grp in groups:
        for t in grp.kernel.source.outputs:
            if t not in known:
                # An output a scheme names in a layout of its own (conv's NHWC ones) is its to describe.
                info = graph.tensors.get(t) or _relaid_info(graph, t)
                shape = None if info.shape is None else list(info.shape)
                g.value_info.append(helper.make_tensor_value_info(t, info.dtype, shape))


def _forget_derived_dims(g: onnx.GraphProto) -> None:
    """value_info dims named by anything but the graph inputs' symbols made unknown. Shape
    inference names derived dims by expressions of the inputs' (`floor(h/2 - 1/2) + 1`); two
    tensors it gives one expression may still differ at sizes where the model only runs by
    broadcasting (PP-OCR's detector at 3×3 pixels: an upsampled [1, 96, 1, 1] added to a
    [1, 96, 4, 4]), and ORT, taking equal names for equal sizes, then reuses a buffer of the
    wrong size and fails."""
    symbols = {d.dim_param for i in g.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    for v in g.value_info:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in symbols:
                d.ClearField("dim_param")


def rewrite(model: onnx.ModelProto, graph: FusionGraph, groups: Sequence[FusedGroup],
            relaid: Mapping[int, str] | None = None) -> onnx.ModelProto:
    """The stitched model: `model` (the normalized input whose main graph `graph` describes)
    with every group replaced by its FusedKernel node and function, and the `relaid` nodes (node
    index → the scheme that runs it in its layout: Plan.relaid) as that scheme writes them
    (base.Relayout), tensors bridged between the layouts where read in the other."""
    relaid = relaid or {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    first = {min(grp.nodes): grp for grp in groups}
    fused_members = {i for grp in groups for i in grp.nodes}
    new_nodes: list[onnx.NodeProto] = []
    relaid_constants: dict[str, onnx.TensorProto] = {}
    for i, node in enumerate(model.graph.node):
        if i in first:
            new_nodes.append(_fused_node(first[i]))
        elif i in relaid:
            relayout = registry.get(relaid[i]).relayout
            assert relayout is not None, f"scheme {relaid[i]} relays node {i} out but has no Relayout"
            made = relayout.node(graph, i, node)
            new_nodes.extend(made.nodes)
            relaid_constants.update((c.name, c) for c in made.constants)
        elif i not in fused_members:
            new_nodes.append(node)
    # Tensors read in the other layout than made (conv's one-pixel tensors).
    available = {x.name for x in g.input} | {t.name for t in g.initializer} | set(graph.constants)
    for relayout in registry.relayouts():
        bridges, shapes = relayout.bridge(new_nodes, available)
        new_nodes += bridges
        relaid_constants.update((c.name, c) for c in shapes)
    del g.node[:]
    g.node.extend(_topo(_drop_orphans(model.graph, new_nodes), {x.name for x in g.input}))
    g.initializer.extend(relaid_constants.values())
    out.functions.extend(_function(model, graph, grp) for grp in groups)

    used = {t for n in g.node for t in list(n.input) + implicit_inputs(n)} | {o.name for o in g.output}
    live = used | {t for n in g.node for t in n.output}
    # Constants the graph stage derived (channel_params) and fused nodes now read.
    have = {t.name for t in g.initializer}
    g.initializer.extend(graph.constants[t] for t in sorted(used) if t in graph.constants and t not in have)
    # (once each: groups over one weight share its transposed copy)
    g.initializer.extend({c.name: c for grp in groups for c in grp.kernel.source.constants
                          if c.name not in have}.values())
    keep_init = [t for t in g.initializer if t.name in used or t.name in {x.name for x in g.input}]
    del g.initializer[:]
    g.initializer.extend(keep_init)
    keep_vi = [v for v in g.value_info if v.name in live]
    del g.value_info[:]
    g.value_info.extend(keep_vi)
    _declare_fused_outputs(g, graph, groups)
    _forget_derived_dims(g)
    if groups:
        out.ir_version = max(out.ir_version, IR_VERSION)
        if not any(o.domain == DOMAIN for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out
