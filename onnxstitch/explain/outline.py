"""The planned graph as the report carries it (`"graph"` in --report's JSON): one entry per node
of the graph the plan indexes (its node ids are the groups' `nodes`) and its data edges, so that
a picture of the plan can be drawn from the report alone, after the fact."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Mapping

import onnx

from ..graph import FusionGraph

# torch.onnx's dynamo exporter records each node's module path here: ['', 'encoder',
# 'encoder.layer.1', ..., 'layer_norm_4'] (the last entry is the node's own name).
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


@dataclass(frozen=True)
class OutlineNode:
    """One node: its name, op type, module scope, why ONNX Runtime keeps it (None: fusible), and
    whether it reads constants only (ONNX Runtime folds it away when the session starts)."""

    name: str
    op: str
    # The module path as "/"-separated tokens ("encoder/layer/1/attention"); "" when unknown.
    scope: str
    ort_reason: str | None
    constant: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"name": self.name, "op": self.op, "scope": self.scope, "ort_reason": self.ort_reason,
                "constant": self.constant}


@dataclass(frozen=True)
class GraphOutline:
    """Nodes in the plan's order (ids are indices), data edges (producer, consumer) and the
    nodes that write a graph output."""

    nodes: tuple[OutlineNode, ...]
    edges: tuple[tuple[int, int], ...]
    outputs: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"nodes": [n.to_json() for n in self.nodes], "edges": [list(e) for e in self.edges],
                "outputs": list(self.outputs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GraphOutline:
        """The outline from its `to_json` form (KeyError/TypeError on a malformed one)."""
        nodes = tuple(OutlineNode(str(n["name"]), str(n["op"]), str(n.get("scope", "")), n.get("ort_reason"),
                                  bool(n.get("constant", False))) for n in data["nodes"])
        return cls(nodes, tuple((int(a), int(b)) for a, b in data["edges"]),
                   tuple(int(i) for i in data.get("outputs", ())))


def scope_of(node: onnx.NodeProto) -> str:
    """The module path of `node`: the dynamo exporter's name scopes when present, else the
    directory part of a TorchScript-style name ("/encoder/layer.0/attention/MatMul")."""
    for prop in node.metadata_props:
        if prop.key == _SCOPES_KEY:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            if isinstance(scopes, list) and len(scopes) >= 2:
                return _tokens(str(scopes[-2]))
    head, sep, _ = node.name.rpartition("/")
    return _tokens(head) if sep else ""


def _tokens(path: str) -> str:
    """"/model/layer.0/attn" and "model.layer.0.attn" both → "model/layer/0/attn"."""
    return "/".join(t for t in re.split(r"[/.]", path) if t)


def outline(g: FusionGraph, model: onnx.ModelProto) -> GraphOutline:
    """The outline of `g`, built from `model` (whose node i is g's node i): names, op types,
    scopes, ONNX Runtime's reasons, constant nodes, the planner's data edges (a Reshape's shape input is not one)
    and the nodes writing graph outputs."""
    protos = model.graph.node
    nodes = tuple(OutlineNode(n.name or f"{n.op_type}#{n.index}", n.op_type,
                              scope_of(protos[n.index]) if n.index < len(protos) else "", n.reason,
                              all(t in g.constants for t in n.inputs if t) and bool(n.inputs))
                  for n in g.nodes)
    edges = tuple((p, i) for i in range(len(g.nodes)) for p in sorted(g.preds[i]))
    outputs = tuple(n.index for n in g.nodes if any(t in g.graph_outputs for t in n.outputs))
    return GraphOutline(nodes, edges, outputs)
