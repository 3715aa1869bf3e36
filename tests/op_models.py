"""One small model per fusible op and dtype, with broadcasting inputs, for kernel tests."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper


UNARY_FLOAT = ["Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "Elu", "Selu",
               "HardSigmoid", "HardSwish", "Softplus", "Gelu", "Sin", "Cos", "Floor", "Ceil", "Round",
               "IsNaN", "IsInf"]
UNARY_NUM = ["Neg", "Abs", "Relu", "Sign", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
VARIADIC = ["Min", "Max"]
BOOL_OPS = ["Not", "And", "Or", "Xor"]
BOOL_OUT = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN", "IsInf", "Not", "And", "Or", "Xor"}


def _model(op: str, inputs: Sequence[tuple[str, int, list]], out_dtype: int, shape: list,
           inits: Sequence[onnx.TensorProto] = (), **attrs) -> onnx.ModelProto:
    names = [n for n, _, _ in inputs] + [i.name for i in inits]
    node = helper.make_node(op, names, ["y"], name=f"{op.lower()}_0", **attrs)
    # A second op so the group also exercises an internal value (y -> z).
    follow = helper.make_node("Identity", ["y"], ["z"], name="identity_1")
    graph = helper.make_graph([node, follow], op, [helper.make_tensor_value_info(n, d, s) for n, d, s in inputs],
                              [helper.make_tensor_value_info("z", out_dtype, shape)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def op_models(shape: Sequence[int] = (7, 33)) -> Iterator[tuple[str, onnx.ModelProto]]:
    """(id, model) for every fusible op at its dtypes; the second operand broadcasts over the
    last dim, so both FULL and BROADCAST inputs are exercised."""
    shape = list(shape)
    row = [shape[-1]]
    for dt in (TP.FLOAT, TP.FLOAT16):
        name = TP.DataType.Name(dt).lower()
        for op in UNARY_FLOAT:
            yield f"{op}-{name}", _model(op, [("x", dt, shape)], TP.BOOL if op in BOOL_OUT else dt, shape)
        for op in UNARY_NUM:
            yield f"{op}-{name}", _model(op, [("x", dt, shape)], dt, shape)
        for op in BINARY:
            attrs = {"fmod": 1} if op == "Mod" else {}
            yield f"{op}-{name}", _model(op, [("x", dt, shape), ("b", dt, row)], TP.BOOL if op in BOOL_OUT else dt,
                                         shape, **attrs)
        for op in VARIADIC:
            yield f"{op}-{name}", _model(op, [("x", dt, shape), ("b", dt, row), ("c", dt, [])], dt, shape)
        yield f"Where-{name}", _model("Where", [("m", TP.BOOL, shape), ("x", dt, shape), ("b", dt, row)], dt, shape)
        np_dt = helper.tensor_dtype_to_np_dtype(dt)
        # Expand legal alone only where its input already has the shape (a kernel's iteration
        # shape comes from its inputs): tests/test_expand.py covers the broadcasting uses.
        yield f"Expand-{name}", _model("Expand", [("x", dt, shape)], dt, shape,
                                       inits=[numpy_helper.from_array(np.array(shape, np.int64), "to")])
        yield f"Clip-{name}", _model("Clip", [("x", dt, shape), ("lo", dt, [])], dt, shape,
                                     inits=[numpy_helper.from_array(np.array(0.5, np_dt), "hi")])
        rng = np.random.default_rng()
        params = [numpy_helper.from_array(v.astype(np_dt), k) for k, v in (
            ("scale", rng.standard_normal(shape[1])), ("bias", rng.standard_normal(shape[1])),
            ("mean", rng.standard_normal(shape[1])), ("var", 0.5 + rng.random(shape[1])))]
        yield f"BatchNormalization-{name}", _model("BatchNormalization", [("x", dt, shape)], dt, shape, inits=params,
                                                   epsilon=1e-3)
        for to in (TP.FLOAT, TP.FLOAT16, TP.INT32, TP.BOOL, TP.DOUBLE):
            yield f"Cast-{name}-to-{TP.DataType.Name(to).lower()}", _model("Cast", [("x", dt, shape)], to, shape, to=to)
    for dt in (TP.INT32, TP.INT64):
        name = TP.DataType.Name(dt).lower()
        for op in ["Add", "Sub", "Mul", "Div", "Mod", "Equal", "Less", "Greater"]:
            yield f"{op}-{name}", _model(op, [("x", dt, shape), ("b", dt, row)], TP.BOOL if op in BOOL_OUT else dt, shape)
        for op in ["Neg", "Abs", "Sign"] + (["Relu"] if dt == TP.INT32 else []):  # ORT has no int64 Relu
            yield f"{op}-{name}", _model(op, [("x", dt, shape)], dt, shape)
        yield f"Cast-{name}-to-float", _model("Cast", [("x", dt, shape)], TP.FLOAT, shape, to=TP.FLOAT)
    for op in BOOL_OPS:
        ins = [("p", TP.BOOL, shape)] + ([("q", TP.BOOL, row)] if op != "Not" else [])
        yield f"{op}-bool", _model(op, ins, TP.BOOL, shape)


def covered_ops() -> set[str]:
    """Ops that op_models exercises (a test checks this is the whole table)."""
    return set(UNARY_FLOAT + UNARY_NUM + BINARY + VARIADIC + BOOL_OPS + ["Where", "Clip", "Cast", "BatchNormalization",
                                                                       "Expand"])


