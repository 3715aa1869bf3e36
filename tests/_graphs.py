"""Helpers for planning tests: FusionGraphs from ONNX text, nodes looked up by output name."""
from __future__ import annotations

import onnx
import onnx.parser

from onnxstitch import graph as fgraph
from onnxstitch import shapes

HEADER = '<ir_version: 10, opset_import: ["" : 20]>'


def from_text(text: str) -> fgraph.FusionGraph:
    """Parse, check, infer and build. `text` may omit the `<ir_version ...>` header."""
    if not text.lstrip().startswith("<"):
        text = HEADER + "\n" + text
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return from_model(model)


def from_model(model: onnx.ModelProto) -> fgraph.FusionGraph:
    inferred, tensors = shapes.infer(model)
    return fgraph.build(inferred, tensors)


def node(g: fgraph.FusionGraph, output: str) -> int:
    """Id of the node producing tensor `output`."""
    return g.producer[output]


def nodes(g: fgraph.FusionGraph, *outputs: str) -> tuple[int, ...]:
    """Sorted ids of the nodes producing `outputs`."""
    return tuple(sorted(g.producer[t] for t in outputs))


# Graphs several planning tests share.
CHAIN = """
g (float[8,16] x, float[16] b) => (float[8,16] y) {
  t = Add(x, b)
  u = Relu(t)
  v = Sigmoid(u)
  y = Mul(v, x)
}"""

# t fans out to two branches that meet again.
DIAMOND = """
g (float[8,16] x, float[16] b) => (float[8,16] y) {
  t = Add(x, b)
  r = Relu(t)
  s = Sigmoid(t)
  y = Mul(r, s)
}"""

# A chain with a MatMul in the middle: two fusible pairs around an opaque node.
MATMUL_SPLIT = """
g (float[8,16] x, float[16,16] w) => (float[8,16] y) {
  a = Relu(x)
  b = Sigmoid(a)
  m = MatMul(b, w)
  c = Neg(m)
  y = Exp(c)
}"""
