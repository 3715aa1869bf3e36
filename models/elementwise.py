"""Elementwise models: the 20-op benchmark chain and random elementwise DAGs."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

# Each step maps the running value through one op; constants keep values in a range where
# float16 neither overflows nor loses everything. LIGHT is what models chain between matrix
# products (scale, shift, clamp, an activation or two); HEAVY is transcendental-bound.
LIGHT_CHAIN = [
    ("Mul", 0.5), ("Add", 0.25), ("Sigmoid", None), ("Mul", 1.5), ("Sub", 0.5),
    ("Abs", None), ("Add", 1.0), ("Sqrt", None), ("Mul", 0.75), ("Max", 0.1),
    ("Min", 4.0), ("Neg", None), ("Add", 2.0), ("Relu", None), ("Mul", 2.0),
    ("Tanh", None), ("Add", 0.5), ("Mul", 3.0), ("Sub", 1.0), ("Mul", 0.25),
]
HEAVY_CHAIN = [
    ("Mul", 0.5), ("Add", 0.25), ("Tanh", None), ("Mul", 1.5), ("Sigmoid", None),
    ("Sub", 0.5), ("Abs", None), ("Add", 1.0), ("Sqrt", None), ("Log", None),
    ("Neg", None), ("Exp", None), ("Mul", 2.0), ("Relu", None), ("Sin", None),
    ("Div", 1.25), ("Erf", None), ("Cos", None), ("Reciprocal", None), ("Softplus", None),
]

def _dims(shape: Sequence[int | str]) -> list[int | str]:
    return list(shape)


def chain(n_ops: int = 20, shape: Sequence[int | str] = ("batch", 4096), dtype: int = TP.FLOAT,
          opset: int = 20, steps: Sequence[tuple[str, float | None]] = LIGHT_CHAIN) -> onnx.ModelProto:
    """A chain of `n_ops` elementwise ops over one input (stock ORT runs one kernel each),
    cycling through `steps` (LIGHT_CHAIN or HEAVY_CHAIN)."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    nodes, inits = [], []
    cur = "x"
    for i in range(n_ops):
        op, c = steps[i % len(steps)]
        out = "y" if i == n_ops - 1 else f"t{i}"
        if c is None:
            nodes.append(helper.make_node(op, [cur], [out], name=f"{op.lower()}_{i}"))
        else:
            inits.append(numpy_helper.from_array(np.array(c, dtype=np_dtype), f"c{i}"))
            nodes.append(helper.make_node(op, [cur, f"c{i}"], [out], name=f"{op.lower()}_{i}"))
        cur = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", dtype, _dims(shape))],
                              [helper.make_tensor_value_info("y", dtype, _dims(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


_UNARY = ["Neg", "Abs", "Tanh", "Sigmoid", "Relu", "Sin", "Cos", "Erf", "Softplus", "HardSigmoid", "LeakyRelu"]
_BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


def random_graph(n_nodes: int, seed: int = 0, shape: Sequence[int | str] = ("batch", 64),
                 dtype: int = TP.FLOAT, opaque_every: int = 0, opset: int = 20) -> onnx.ModelProto:
    """A random DAG of elementwise ops with fan-out, broadcast constants ([last dim] and
    scalars) and, every `opaque_every` nodes, a non-fusible MatMul with a square weight."""
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    last = shape[-1]
    assert isinstance(last, int), "the last dim must be static (broadcast constants use it)"
    inputs = [helper.make_tensor_value_info(n, dtype, _dims(shape)) for n in ("x0", "x1")]
    values = ["x0", "x1"]
    nodes, inits = [], []
    for i in range(n_nodes):
        out = f"v{i}"
        if opaque_every and i % opaque_every == opaque_every - 1:
            w = f"w{i}"
            inits.append(numpy_helper.from_array((rng.standard_normal((last, last)) / np.sqrt(last)).astype(np_dtype), w))
            nodes.append(helper.make_node("MatMul", [values[rng.integers(len(values))], w], [out], name=f"mm{i}"))
        elif rng.random() < 0.45:
            op = _UNARY[rng.integers(len(_UNARY))]
            nodes.append(helper.make_node(op, [values[-1 - rng.integers(min(3, len(values)))]], [out], name=f"n{i}"))
        else:
            op = _BINARY[rng.integers(len(_BINARY))]
            a = values[-1 - rng.integers(min(4, len(values)))]
            r = rng.random()
            if r < 0.2:
                b = f"k{i}"
                inits.append(numpy_helper.from_array(rng.standard_normal((last,)).astype(np_dtype), b))
            elif r < 0.35:
                b = f"k{i}"
                inits.append(numpy_helper.from_array(np.array(rng.standard_normal(), dtype=np_dtype), b))
            else:
                b = values[rng.integers(len(values))]
            nodes.append(helper.make_node(op, [a, b], [out], name=f"n{i}"))
        values.append(out)
    # Every value nobody consumes becomes an output, plus a few consumed ones (fan-out to outside).
    used = {t for n in nodes for t in n.input}
    outs = [v for v in values[2:] if v not in used]
    outs += [v for v in values[2:] if v in used and rng.random() < 0.02]
    outputs = [helper.make_tensor_value_info(o, dtype, _dims(shape)) for o in outs]
    graph = helper.make_graph(nodes, "random", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
