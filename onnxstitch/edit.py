"""The model-rewrite toolkit of the passes that run before the fusion graph (simplify, siblings,
normalize): one index of a model's main graph, and one way to splice nodes in and out of it
and prune what no longer has a reader."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from . import load


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node's attributes hold (If branches, Loop and Scan bodies)."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors a node's subgraphs (If/Loop/Scan bodies) read: dependencies as real
    as its inputs, though they appear in no input list."""
    found: list[str] = []

    def walk(g: onnx.GraphProto, outer_defined: set[str]) -> None:
        defined = set(outer_defined) | {i.name for i in g.input} | {i.name for i in g.initializer}
        for n in g.node:
            for t in n.input:
                if t and t not in defined and t not in found:
                    found.append(t)
            for sub in subgraphs(n):
                walk(sub, defined)
            defined.update(n.output)

    for sub in subgraphs(node):
        walk(sub, set())
    return found


def reads(n: onnx.NodeProto) -> list[str]:
    """What a node reads: its inputs and what its subgraphs read from outside them."""
    return [t for t in list(n.input) + implicit_inputs(n) if t]


def reader_map(nodes: Iterable[onnx.NodeProto]) -> dict[str, tuple[int, ...]]:
    """Tensor → the positions of the nodes that read it (reads), in order."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in reads(n):
            readers.setdefault(t, []).append(i)
    return {t: tuple(r) for t, r in readers.items()}


@dataclass(frozen=True)
class ModelIndex:
    """Lookups over one model's main graph, by node position."""

    model: onnx.ModelProto
    nodes: tuple[onnx.NodeProto, ...]
    inputs: frozenset[str]
    outputs: frozenset[str]
    constants: Mapping[str, onnx.TensorProto]  # initializers that are not graph inputs' defaults
    producer: Mapping[str, int]
    readers: Mapping[str, tuple[int, ...]]
    opset: int = field(default=0)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelIndex:
        g = model.graph
        inputs = frozenset(i.name for i in g.input)
        return cls(model, tuple(g.node), inputs, frozenset(o.name for o in g.output),
                   {t.name: t for t in g.initializer if t.name not in inputs},
                   {o: i for i, n in enumerate(g.node) for o in n.output if o},
                   reader_map(g.node), load.ai_onnx_opset(model))

    def node_of(self, t: str) -> onnx.NodeProto | None:
        """The node that makes `t` (None for a graph input, a constant or an unknown name)."""
        i = self.producer.get(t)
        return None if i is None else self.nodes[i]

    def readers_of(self, t: str) -> list[onnx.NodeProto]:
        return [self.nodes[i] for i in self.readers.get(t, ())]


def spliced(index: ModelIndex, replace: Mapping[int, Sequence[onnx.NodeProto]],
            after: Mapping[int, Sequence[onnx.NodeProto]] | None = None,
            initializers: Iterable[onnx.TensorProto] = (), rename: Mapping[str, str] | None = None,
            prune: bool = False) -> onnx.ModelProto:
    """A copy of the index's model with node i replaced by `replace[i]` (an empty list removes
    it) and followed by `after[i]`, inputs renamed through `rename` (followed to its end),
    `initializers` added; with `prune`, nodes whose outputs nothing reads go too (repeatedly).
    Constants nothing reads any longer and value_info of tensors nothing makes are dropped;
    a graph input's default stays."""
    rename = rename or {}
    after = after or {}

    def resolved(t: str) -> str:
        while t in rename:
            t = rename[t]
        return t

    nodes: list[onnx.NodeProto] = []
    for i, n in enumerate(index.nodes):
        for new in list(replace.get(i, (n,))) + list(after.get(i, ())):
            if rename and any(t in rename for t in new.input):
                new = onnx.NodeProto.FromString(new.SerializeToString())
                new.input[:] = [resolved(t) for t in new.input]
            nodes.append(new)
    if prune:
        nodes = live(nodes, index.outputs)
    out = onnx.ModelProto()
    out.CopyFrom(index.model)
    g = out.graph
    del g.node[:]
    g.node.extend(nodes)
    read = {t for n in nodes for t in reads(n)} | index.outputs
    kept = [t for t in list(g.initializer) + list(initializers) if t.name in read or t.name in index.inputs]
    del g.initializer[:]
    g.initializer.extend(kept)
    made = {o for n in nodes for o in n.output} | index.inputs | {t.name for t in kept}
    info = [v for v in g.value_info if v.name in made]
    del g.value_info[:]
    g.value_info.extend(info)
    return out


def live(nodes: list[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """`nodes` without those whose outputs nothing reads (repeatedly), order kept."""
    alive, outputs = list(nodes), set(outputs)
    while True:
        read = outputs | {t for n in alive for t in reads(n)}
        keep = [n for n in alive if any(o in read for o in n.output if o)]
        if len(keep) == len(alive):
            return keep
        alive = keep
