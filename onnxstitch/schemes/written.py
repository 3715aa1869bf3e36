"""Activations as exporters write them out: the library epilogues (schemes/gemm, schemes/conv)
run an activation as one step, but exporters often write it as a handful of elementwise nodes —
GELU's 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), paddle2onnx's HardSwish x·Clip(x + 3, 0, 6)/6.
`regions` finds the candidate node sets after a tensor, `evaluate` computes one in float64 with
the model's own constants, and `identify` names what it computes by comparing it with the
activations the epilogues know, over a range where they all differ.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto as TP, helper, numpy_helper

from ..graph import FusionGraph, constant_value

# Nodes of an activation written out (GELU's tanh form takes 7 to 9).
MAX_NODES = 12
# Elementwise ops an activation is written with; every other input is a scalar constant.
OPS = frozenset({"Mul", "Add", "Sub", "Div", "Pow", "Tanh", "Erf", "Sqrt", "Neg", "Clip", "Relu", "Max", "Min",
                 "Sigmoid", "Exp", "Reciprocal", "HardSigmoid", "Abs"})
# Largest difference from an activation that still names it: the GELU forms differ by up to
# 4.7e-4; float16's rounding of the model's constants moves each by up to 3.2e-5.
TOLERANCE = 1e-4
_V = np.linspace(-8.0, 8.0, 321)


def regions(g: FusionGraph, x: str) -> list[tuple[tuple[int, ...], str]]:
    """Each way, smallest first, of computing one tensor from `x` and scalar constants alone with
    x and everything between read only by those nodes: (the nodes, their output). An activation
    written out is one of them (GELU's x·(1 + tanh(..)) closes before its final ×0.5)."""
    start = g.producer.get(x, -1)
    region: list[int] = []
    known = {x}
    closed: list[tuple[tuple[int, ...], str]] = []
    for i in range(start + 1, min(len(g.nodes), start + 1 + 4 * MAX_NODES)):
        n = g.nodes[i]
        ins = [t for t in n.inputs if t]
        if not any(t in known for t in ins):
            continue
        if n.op_type not in OPS or n.domain not in ("", "ai.onnx") or len(n.outputs) != 1 or \
                not all(t in known or (t in g.constants and math.prod(g.constants[t].dims) == 1) for t in ins) or \
                len(region) == MAX_NODES:
            break
        region.append(i)
        known.add(n.outputs[0])
        members = set(region)
        inner = [x] + [g.nodes[j].outputs[0] for j in region[:-1]]
        if all(t not in g.graph_outputs and all(c in members for c in g.consumers.get(t, ())) for t in inner):
            closed.append((tuple(region), n.outputs[0]))
    return closed


def evaluate(g: FusionGraph, x: str, nodes: tuple[int, ...], y: str, v: np.ndarray) -> np.ndarray | None:
    """The nodes' `y` for `x` = v, in float64 with the model's constants (ONNX's reference
    evaluator); None where it cannot be computed so (an op it lacks in float64)."""
    made = [helper.make_node(g.nodes[i].op_type, list(g.nodes[i].inputs), list(g.nodes[i].outputs),
                             **dict(g.nodes[i].attrs)) for i in nodes]
    consts = sorted({t for i in nodes for t in g.nodes[i].inputs if t in g.constants})
    inits = [numpy_helper.from_array(np.asarray(constant_value(g, t), np.float64).reshape(()), t) for t in consts]
    model = helper.make_model(helper.make_graph(made, "activation", [helper.make_tensor_value_info(x, TP.DOUBLE, [None])],
                                                [helper.make_tensor_value_info(y, TP.DOUBLE, [None])], inits),
                              opset_imports=[helper.make_opsetid("", max(g.opset, 13))])
    from onnx.reference import ReferenceEvaluator

    try:
        got = np.asarray(ReferenceEvaluator(model).run(None, {x: v})[0], np.float64)
    except Exception:  # an op the evaluator does not take in float64: not an activation we know
        return None
    return got if got.shape == v.shape else None


def _hard_sigmoid(v: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(alpha * v + beta, 0.0, 1.0)


# (name, its (alpha, beta) parameters, values over _V): what `identify` can name. HardSwish and
# HardSigmoid with ONNX's and PyTorch's/Paddle's slopes (0.2 and 1/6).
KNOWN = (
    ("gelu_tanh", (0.0, 0.0), 0.5 * _V * (1 + np.tanh(math.sqrt(2 / math.pi) * (_V + 0.044715 * _V ** 3)))),
    ("gelu", (0.0, 0.0), 0.5 * _V * (1 + np.vectorize(math.erf)(_V / math.sqrt(2)))),
    ("silu", (0.0, 0.0), _V / (1 + np.exp(-_V))),
    ("hardswish", (1.0 / 6.0, 0.5), _V * _hard_sigmoid(_V, 1.0 / 6.0, 0.5)),
    ("hardswish", (0.2, 0.5), _V * _hard_sigmoid(_V, 0.2, 0.5)),
    ("hard_sigmoid", (1.0 / 6.0, 0.5), _hard_sigmoid(_V, 1.0 / 6.0, 0.5)),
    ("hard_sigmoid", (0.2, 0.5), _hard_sigmoid(_V, 0.2, 0.5)),
)


def identify(g: FusionGraph, x: str, nodes: tuple[int, ...], y: str,
             names: frozenset[str] | None = None) -> tuple[str, tuple[float, float]] | None:
    """(name, parameters) of the activation of KNOWN (only those in `names`, if given) that the
    nodes compute from `x` within TOLERANCE over [-8, 8], else None."""
    got = evaluate(g, x, nodes, y, _V)
    if got is None:
        return None
    for name, params, want in KNOWN:
        if (names is None or name in names) and np.max(np.abs(got - want)) <= TOLERANCE:
            return name, params
    return None
