"""Per-channel parameters of BatchNormalization and InstanceNormalization, as tensors the
kernels can broadcast.

Both ops take `[C]` vectors that apply along axis 1 of an `[N, C, ...]` input, while kernels
broadcast numpy-style (right-aligned). When the parameters are constant, the graph stage gives
the node constant inputs of shape `[C, 1, …, 1]` instead (the rewrite adds them as
initializers; the fallback body keeps the original op and its original constants):
- BatchNormalization (inference): `y = x·s + b` with `s = scale / sqrt(var + eps)` and
  `b = B − mean·s`, computed once in float64 — one elementwise op;
- InstanceNormalization: `scale` and `B` reshaped — a row op over axes 2… (schemes/rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from ..shapes import TensorInfo

OPS = ("BatchNormalization", "InstanceNormalization")


@dataclass(frozen=True)
class Folded:
    """The node's new inputs and the constants they name (or why it cannot be folded)."""

    inputs: tuple[str, ...] = ()
    constants: Mapping[str, onnx.TensorProto] | None = None
    reason: str | None = None


def fold(n: onnx.NodeProto, attrs: Mapping[str, object], tensors: Mapping[str, TensorInfo],
         constants: Mapping[str, onnx.TensorProto]) -> Folded:
    """Broadcastable constant inputs for a BatchNormalization/InstanceNormalization node."""
    x = tensors.get(n.input[0])
    if x is None or x.shape is None or len(x.shape) < 2:
        return Folded(reason=f"{n.op_type} needs an input of known rank >= 2")
    params = [t for t in n.input[1:] if t]
    missing = [t for t in params if t not in constants]
    if missing:
        return Folded(reason=f"{n.op_type}'s parameters are not constant ('{missing[0]}')")
    if n.op_type == "BatchNormalization" and (attrs.get("training_mode", 0) or len([o for o in n.output if o]) > 1):
        return Folded(reason="BatchNormalization in training mode is not stitched")
    values = [numpy_helper.to_array(constants[t]).astype(np.float64) for t in params]
    view = (-1,) + (1,) * (len(x.shape) - 2)
    eps = float(attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
    if n.op_type == "BatchNormalization":
        scale, bias, mean, var = values
        s = scale / np.sqrt(var + eps)
        arrays = [s, bias - mean * s]
    else:
        arrays = values
    dtype = numpy_helper.to_array(constants[params[0]]).dtype
    out: dict[str, onnx.TensorProto] = {}
    names = []
    for role, a in zip(("scale", "bias"), arrays):
        name = f"{n.output[0]}~{role}"
        out[name] = numpy_helper.from_array(a.reshape(view).astype(dtype), name)
        names.append(name)
    return Folded((n.input[0], *names), out)
