"""Models with sibling MatMuls (one activation, several constant weights) and float64 numpy
references for them: attention-style projections (bias, then a head split), gated MLPs."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

Reference = Callable[[dict], list[np.ndarray]]
NP = {TP.FLOAT: np.float32, TP.FLOAT16: np.float16, TP.DOUBLE: np.float64}


def projections(sizes: Sequence[int], k: int, dtype: int = TP.FLOAT, tail: str = "bias-relu", opset: int = 18,
                seed: int = 0, heads: int = 2) -> tuple[onnx.ModelProto, Reference]:
    """x [batch, seq, k] times one weight [k, n] per size. `tail` after each product:
    "bias-relu" (Relu(p + b)), "heads" (p + b → [batch, seq, heads, n/heads] → [0, 2, 1, 3]),
    "matmul" (the product feeds another MatMul by a square weight), "glu" (two products:
    Sigmoid(a)·a·b, a gated MLP)."""
    rng = np.random.default_rng(seed)
    np_t = NP[dtype]
    ws = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_t) for n in sizes]
    bs = [rng.standard_normal(n).astype(np_t) for n in sizes]
    inits = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"], name=f"proj{i}") for i in range(len(sizes))]
    outs: list[onnx.ValueInfoProto] = []
    if tail == "glu":
        assert len(sizes) == 2 and sizes[0] == sizes[1]
        nodes += [helper.make_node("Sigmoid", ["p0"], ["s"]), helper.make_node("Mul", ["s", "p0"], ["silu"]),
                  helper.make_node("Mul", ["silu", "p1"], ["y0"])]
        outs.append(helper.make_tensor_value_info("y0", dtype, ["batch", "seq", sizes[0]]))
    for i, n in enumerate(sizes if tail != "glu" else ()):
        inits.append(numpy_helper.from_array(bs[i], f"b{i}"))
        if tail == "bias-relu":
            nodes += [helper.make_node("Add", [f"p{i}", f"b{i}"], [f"a{i}"]), helper.make_node("Relu", [f"a{i}"], [f"y{i}"])]
            outs.append(helper.make_tensor_value_info(f"y{i}", dtype, ["batch", "seq", n]))
        elif tail == "heads":
            inits.append(numpy_helper.from_array(np.array([0, 0, heads, n // heads], np.int64), f"shape{i}"))
            nodes += [helper.make_node("Add", [f"p{i}", f"b{i}"], [f"a{i}"]),
                      helper.make_node("Reshape", [f"a{i}", f"shape{i}"], [f"r{i}"]),
                      helper.make_node("Transpose", [f"r{i}"], [f"y{i}"], perm=[0, 2, 1, 3])]
            outs.append(helper.make_tensor_value_info(f"y{i}", dtype, ["batch", heads, "seq", n // heads]))
        elif tail == "matmul":
            inits.append(numpy_helper.from_array(np.eye(n, dtype=np_t), f"sq{i}"))
            nodes.append(helper.make_node("MatMul", [f"p{i}", f"sq{i}"], [f"y{i}"]))
            outs.append(helper.make_tensor_value_info(f"y{i}", dtype, ["batch", "seq", n]))
        else:
            raise ValueError(tail)
    graph = helper.make_graph(nodes, "siblings", [helper.make_tensor_value_info("x", dtype, ["batch", "seq", k])],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8

    def ref(feeds: dict) -> list[np.ndarray]:
        x = feeds["x"].astype(np.float64)
        ps = [x @ w.astype(np.float64) for w in ws]
        if tail == "glu":
            return [(1 / (1 + np.exp(-ps[0]))) * ps[0] * ps[1]]
        if tail == "bias-relu":
            return [np.maximum(p + b.astype(np.float64), 0) for p, b in zip(ps, bs)]
        if tail == "heads":
            return [(p + b.astype(np.float64)).reshape(*p.shape[:2], heads, -1).transpose(0, 2, 1, 3)
                    for p, b in zip(ps, bs)]
        return ps

    return model, ref
