"""Function bodies at the model's own opset: the nodes onnxstitch writes into a fused node's
fallback function (the constants a body cannot read from the graph, the Slice of a boxed input)
are written in their current form, which older opsets do not have.

- **Constants before opset 9.** Constant-1 gives float16, float and double tensors only; a
  Reshape's shape or a Slice's bounds are int64 (PP-OCRv5's mobile recognizer, opset 7, failed
  onnx.checker: "Constant: output has unsupported type tensor(int64)"). Such a constant becomes
  a double Constant and a Cast to its type, exact for integers up to 2**53 in magnitude; larger
  int64 values are written as q·2**26 + r, each part exact, joined by Mul and Add (which take
  int64 from opset 7 on).
- **Slice before opset 10.** Slice-1 takes starts, ends and axes as attributes, not inputs: a
  Slice whose parameters are the body's own Constants (step 1) takes them as attributes.

Every other node is the model's own, at its opset already.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .folds import slices

# Types Constant gives before opset 9.
_EARLY_CONSTANT_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE})
_EXACT = 2**53  # integers of at most this magnitude are exact in a double
_SPLIT = 2**26  # larger int64 values: q·2**26 + r, with |q| < 2**38 and 0 ≤ r < 2**26


def default_opset(opsets: Sequence[onnx.OperatorSetIdProto]) -> int:
    """The version of the default ONNX domain among `opsets` (0 when it is not imported)."""
    return next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 0)


def lowered(body: Sequence[onnx.NodeProto], opset: int, outputs: Sequence[str] = ()) -> list[onnx.NodeProto]:
    """`body` with the nodes onnxstitch writes in forms `opset` lacks rewritten as the module
    docstring says; the same nodes where `opset` has them all. `outputs`: the body's outputs
    (a Constant giving one stays, read or not)."""
    nodes = list(body)
    if opset >= 10 or opset == 0:
        return nodes
    constants = {n.output[0]: n.attribute[0].t for n in nodes if _is_constant(n)}
    nodes = [_attribute_slice(n, constants) if n.op_type == "Slice" and n.domain in ("", "ai.onnx") else n
             for n in nodes]
    read = {t for n in nodes for t in n.input} | set(outputs)
    nodes = [n for n in nodes if not (_is_constant(n) and n.output[0] not in read)]
    if opset >= 9:
        return nodes
    out: list[onnx.NodeProto] = []
    for n in nodes:
        out.extend(_early_constant(n) if _is_constant(n) else [n])
    return out


def _is_constant(n: onnx.NodeProto) -> bool:
    return n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1 \
        and n.attribute[0].name == "value"


def _attribute_slice(n: onnx.NodeProto, constants: Mapping[str, onnx.TensorProto]) -> onnx.NodeProto:
    """Slice-10's form (parameters as inputs) as Slice-1's (attributes), where every parameter
    is one of the body's Constants and the steps are 1; else the node as it is (the model's
    own Slice-1, which has one input)."""
    if len(n.input) < 3:
        return n
    starts, ends, axes, steps = (slices.parameter(n, {}, constants, k, name)
                                 for k, name in enumerate(slices.PARAMETERS, 1))
    if any(isinstance(v, str) for v in (starts, ends, axes, steps)):
        return n  # (a parameter computed in the body)
    if steps is not None and any(s != 1 for s in steps):
        return n
    attrs = {"starts": starts, "ends": ends}
    if axes is not None:
        attrs["axes"] = axes
    return helper.make_node("Slice", [n.input[0]], list(n.output), name=n.name, **attrs)


def _early_constant(n: onnx.NodeProto) -> list[onnx.NodeProto]:
    """A Constant as Constant-1 can give it: the node itself for a float type, else a double
    Constant cast to the type (in two exact parts for int64 values past 2**53)."""
    t = n.attribute[0].t
    if t.data_type in _EARLY_CONSTANT_TYPES:
        return [n]
    name = n.output[0]
    value = numpy_helper.to_array(t)
    if value.dtype.kind not in "biu":
        raise ValueError(f"a {value.dtype} constant has no form before opset 9")  # (no such ONNX type is left)

    def double(values: np.ndarray, tag: str) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{name}~{tag}"],
                                value=numpy_helper.from_array(values.astype(np.float64), f"{name}~{tag}"))

    def cast(src: str, out: str) -> onnx.NodeProto:
        return helper.make_node("Cast", [src], [out], to=t.data_type)

    wide = value.astype(np.int64) if value.dtype.kind != "b" else value
    if value.dtype.kind == "b" or np.all(np.abs(wide) <= _EXACT):
        return [double(value, "double"), cast(f"{name}~double", name)]
    q, r = np.divmod(wide, _SPLIT)
    return [double(q, "high"), cast(f"{name}~high", f"{name}~high64"),
            double(np.array(_SPLIT), "unit"), cast(f"{name}~unit", f"{name}~unit64"),
            helper.make_node("Mul", [f"{name}~high64", f"{name}~unit64"], [f"{name}~scaled"]),
            double(r, "low"), cast(f"{name}~low", f"{name}~low64"),
            helper.make_node("Add", [f"{name}~scaled", f"{name}~low64"], [name])]
