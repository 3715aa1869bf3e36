"""The conv scheme behind the common interface (schemes/base.py): a library call (cuDNN's graph
API), so its KernelSource has no code; its fallback function is the chain's nodes, with the
layout changes of its NHWC inputs and output around them (layout.layouts)."""
from __future__ import annotations

import dataclasses
from typing import Any

import onnx
from onnx import helper

from ...graph import FusionGraph
from ...planned import Group
from ...shapes import symbolic_value
from .. import CONV
from ..source import BROADCAST, KernelSource
from ..base import Matcher
from . import layout, match
from .match import Match
from .spec import ACTIVATIONS


def fallback(graph: FusionGraph, m: Match) -> tuple[onnx.NodeProto, ...]:
    """The function body: NHWC inputs back to NCHW, the constants the nodes read (a function
    sees no initializers), the nodes as they were, the output to NHWC where it stays so."""
    body: list[onnx.NodeProto] = []
    rank = 3 if m.line else 4
    to_first, to_last = list(layout.to_channels_first(rank)), list(layout.to_channels_last(rank))
    if m.layouts[0]:
        body.append(helper.make_node("Transpose", [m.inputs[0]], [m.x], perm=to_first))
    if m.residual and m.layouts[2] and not (m.layouts[0] and m.residual == m.x):
        body.append(helper.make_node("Transpose", [m.inputs[-1]], [m.residual], perm=to_first))
    given = set(m.inputs) | {m.x, m.residual}
    nodes = [graph.nodes[i] for i in m.nodes]
    if m.folded:
        # The Conv with its BatchNormalization folded in, writing what the BatchNormalization wrote.
        # (A Pad joined in front, match._pad, stays before it.)
        conv = next(n for n in nodes if n.op_type == "Conv")
        bn = next(n for n in nodes if n.op_type == "BatchNormalization")
        nodes = [dataclasses.replace(conv, inputs=(conv.inputs[0], m.folded[0].name, m.folded[1].name),
                                     outputs=bn.outputs) if n is conv else n for n in nodes if n is not bn]
    for t in sorted({t for n in nodes for t in n.inputs if t and t not in given and t in graph.constants}):
        body.append(helper.make_node("Constant", [], [t], value=graph.constants[t]))
    body += [helper.make_node(n.op_type, list(n.inputs), list(n.outputs), name=n.name, domain=n.domain, **dict(n.attrs))
             for n in nodes]
    if m.layouts[1]:
        body.append(helper.make_node("Transpose", [m.output], [m.node_output], perm=to_last))
    return tuple(body)


def _hint(graph: FusionGraph, m: Match) -> tuple[int, ...]:
    """The geometry the node is planned at (N, C, H, W of X; K, C/group, R, S of W; symbolic dims
    at their planning values), () where a rank is unknown: the runtime loads the saved plan of
    that geometry before the node's first run (launch.cc, Library::hints)."""
    sx, sw = graph.shape(m.x), graph.shape(m.w)
    if m.line and sx is not None and sw is not None and len(sx) == 3 and len(sw) == 3:  # (as launch.cc runs it)
        sx, sw = match.lifted(sx), match.lifted(sw)
    if sx is None or sw is None or len(sx) != 4 or len(sw) != 4 or not all(isinstance(d, int) for d in sw):
        return ()
    return tuple(d if isinstance(d, int) else symbolic_value(d, graph.dim_values) for d in sx) + tuple(sw)


def _settle(g: FusionGraph, cost, plan, found):
    """Tensors passing between conv groups alone stay NHWC; a conv group whose layout changes
    cost more than it saves is left out and the model planned again."""
    plan = layout.layouts(g, plan)
    worse = match.unprofitable(g, cost, plan)
    return plan, (match.without(found, worse) if worse else None)


# (Looked up at each call, so that what the match module holds is what runs.)
MATCHER = Matcher(
    stage="conv epilogues", prefix="c", enabled=lambda o: o.epilogues, find=lambda g, weights, _options: match.find(g, weights),
    group_of=lambda *a: match.group_of(*a), chosen=lambda *a: match.chosen(*a), settle=_settle,
    linked=lambda groups: match.linked(groups))


class Conv:
    name = CONV
    matcher = MATCHER
    relayout = layout.RELAYOUT
    fallback_verbatim = True  # the body is the scheme's own (`fallback`)
    plans_per_shape = True  # cuDNN's engines, compiled and timed at first run (registry.plans_per_shape)

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        return False  # its groups are its matcher's

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        m: Match = group.payload
        spec = dataclasses.replace(m.spec, hint=_hint(graph, m))
        dtype = "f16" if spec.dtype == onnx.TensorProto.FLOAT16 else "f32"
        # Named after what it runs (there is no code to hash): the runtime's messages name it.
        kernel = f"cudnn_conv{'_bias' if spec.bias else ''}{'_residual' if spec.residual else ''}" \
                 f"{'_' + spec.activation if spec.activation else ''}_{dtype}"
        return KernelSource(kernel, "", 1, m.inputs, (m.node_output,), (BROADCAST,) * len(m.inputs), (m.dtype,), spec,
                            fallback=fallback(graph, m), constants=m.folded)

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        spec = src.spec
        return {"scheme": self.name, "library": "cuDNN", "bias": spec.bias, "residual": spec.residual,
                "activation": spec.activation or "none", "group": spec.group,
                "nhwc": {"x": spec.layouts[0], "y": spec.layouts[1], "residual": spec.layouts[2]}}

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        return [helper.make_attribute(k, v) for k, v in src.spec.attributes().items()]


assert ACTIVATIONS[0] == ""  # "no activation" is code 0 in the runtime
SCHEME = Conv()
