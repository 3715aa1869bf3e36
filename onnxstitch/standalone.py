"""A fused group as a model of its own: its original nodes (what ONNX Runtime would run) or its
fused node (what the stitched model runs), with every tensor renamed under a prefix so that
several groups, or several copies of one, can sit side by side in one model. Verification runs
every group on its own inputs this way (verify.py); measured costs time them (measure.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import onnx
from onnx import helper

from .edit import implicit_inputs
from .graph import FusionGraph
from .planned import Group
from .rewrite import DOMAIN, OP_TYPE


@dataclass(frozen=True)
class Piece:
    """Nodes renamed under `prefix`, the tensors they read from outside (original names), the
    tensors they write that the group outputs (original names) and the initializers they use."""

    nodes: tuple[onnx.NodeProto, ...]
    reads: tuple[str, ...]
    outputs: tuple[str, ...]
    initializers: frozenset[str]
    prefix: str = ""


def group_reads(model: onnx.ModelProto, graph: FusionGraph, grp: Group) -> list[str]:
    """Tensors a group's original nodes read from outside it (shape inputs and subgraph reads
    included), less initializers: what its subgraph needs to run on its own."""
    members = set(grp.nodes)
    inits = {i.name for i in model.graph.initializer}
    out: list[str] = []
    for i in grp.nodes:
        n = model.graph.node[i]
        for t in list(n.input) + implicit_inputs(n):
            if t and graph.producer.get(t) not in members and t not in inits and t not in out:
                out.append(t)
    return out


def _renamed(nodes: Sequence[onnx.NodeProto], inits: set[str], prefix: str) -> list[onnx.NodeProto] | None:
    out = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        if prefix:
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
                return None  # its subgraph reads outer names, which renaming cannot follow
            c.name = prefix + n.name if n.name else ""
            c.input[:] = [t if not t or t in inits else prefix + t for t in n.input]
            c.output[:] = [prefix + t if t else t for t in n.output]
        out.append(c)
    return out


def original_piece(model: onnx.ModelProto, graph: FusionGraph, grp: Group, prefix: str = "") -> Piece | None:
    """The group's original nodes of `model` (the plan's normalized model); None where a node
    holds a subgraph and `prefix` is asked for."""
    inits = {i.name for i in model.graph.initializer}
    nodes = [model.graph.node[i] for i in sorted(grp.nodes)]
    renamed = _renamed(nodes, inits, prefix)
    if renamed is None:
        return None
    used = frozenset(t for n in nodes for t in n.input if t in inits)
    return Piece(tuple(renamed), tuple(group_reads(model, graph, grp)), tuple(grp.outputs), used, prefix)


def fused_node(stitched: onnx.ModelProto, group: str) -> onnx.NodeProto | None:
    """The FusedKernel node of `group` in the stitched model."""
    return next((n for n in stitched.graph.node if n.op_type == OP_TYPE and n.domain == DOMAIN
                 and n.overload == group), None)


def fused_piece(stitched: onnx.ModelProto, group: str, prefix: str = "") -> Piece | None:
    """The group's fused node of the stitched model, as a piece."""
    node = fused_node(stitched, group)
    if node is None:
        return None
    inits = {i.name for i in stitched.graph.initializer}
    (renamed,) = _renamed([node], inits, prefix) or [None]
    # Each once: a fused attention node reads the merged QKV projection three times (q, k, v).
    reads = tuple(dict.fromkeys(t for t in node.input if t and t not in inits))
    used = frozenset(t for t in node.input if t in inits)
    return Piece((renamed,), reads, tuple(t for t in node.output if t), used, prefix)


def model_of(pieces: Sequence[Piece], source: onnx.ModelProto, types: Mapping[str, tuple[int, list | None]],
             name: str = "standalone") -> onnx.ModelProto:
    """One model of `pieces` taken from `source` (their initializers and functions come from
    it): each piece's reads are graph inputs and its outputs graph outputs, under its prefix.
    `types`: tensor → (onnx dtype, dims or None) for the inputs and outputs."""
    nodes, inputs, outputs, inits = [], [], [], set()
    for p in pieces:
        nodes += p.nodes
        inits |= p.initializers
        inputs += [helper.make_tensor_value_info(p.prefix + t, *types[t]) for t in p.reads]
        outputs += [helper.make_tensor_value_info(p.prefix + t, *types[t]) for t in p.outputs]
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [i for i in source.graph.initializer if i.name in inits])
    m = helper.make_model(graph, opset_imports=list(source.opset_import), ir_version=source.ir_version)
    wanted = {(n.domain, n.op_type, n.overload) for n in nodes}
    m.functions.extend(f for f in source.functions if (f.domain, f.name, f.overload) in wanted
                       or f.domain not in (DOMAIN,))
    return m
