"""The conv scheme's launch facts (docs/abi.md, shape rule "conv"): one cuDNN graph of a 2-D
convolution and its epilogue, no generated kernel."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from onnx import TensorProto as TP

from .. import CONV
from ..source import Spec

ATTRIBUTE_PREFIX = "conv_"
# The activations cuDNN's pointwise modes run after the convolution, by the code the node carries
# (conv_activation): clip is ReLU's mode with both clips, leaky_relu its lower-clip slope, silu
# its Swish with β = 1; hard_sigmoid (params alpha, beta) is clip(alpha·x + beta, 0, 1) and
# hardswish x · hard_sigmoid(x) with its own alpha, beta (1/6, 1/2 for ONNX's HardSwish), as
# pointwise ops with by-value scalars.
ACTIVATIONS = ("", "relu", "clip", "leaky_relu", "silu", "sigmoid", "tanh", "gelu", "gelu_tanh", "hardswish",
               "hard_sigmoid")
DTYPES = (TP.FLOAT, TP.FLOAT16)


def _bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", v))[0]


@dataclass(frozen=True)
class ConvSpec(Spec):
    """Y = act(conv(X, W) + bias + R), or act(conv(X, W) + bias) + R (`residual_after`): X [N, C, H, W]
    (or NHWC, `layouts[0]`), W [K, C/group, R, S] as ONNX stores it, the bias [K] (`bias`), R of Y's shape (`residual`, NHWC with
    `layouts[2]`), Y NCHW or NHWC (`layouts[1]`)."""

    scheme: ClassVar[str] = CONV
    shape_rule: ClassVar[str] = "conv"
    entry_suffixes: ClassVar[tuple[str, ...]] = ()  # a library call: no image, no entry
    dtype: int
    pads: tuple[int, int, int, int]  # ONNX's order: begin of H, W, then end of H, W
    strides: tuple[int, int]
    dilations: tuple[int, int]
    group: int
    bias: bool
    residual: bool
    activation: str  # one of ACTIVATIONS
    params: tuple[float, float] = (0.0, 0.0)  # clip's min and max; leaky_relu's slope first; hard_sigmoid's alpha, beta
    layouts: tuple[bool, bool, bool] = (False, False, False)  # X, Y, R in NHWC
    residual_after: bool = False  # R added after the activation rather than before
    # The geometry the node was planned at (N, C, H, W of X; K, C/group, R, S of W), () where
    # unknown: the runtime loads its saved cuDNN plan before the node's first run.
    hint: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"conv activation {self.activation!r}: one of {', '.join(a or 'none' for a in ACTIVATIONS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"conv dtype {self.dtype}: float32 or float16")

    @property
    def input_count(self) -> int:
        """X, W, [the bias], [R]: the node's inputs in this order."""
        return 2 + self.bias + self.residual

    def attributes(self) -> dict[str, object]:
        """The node attributes the runtime reads (docs/abi.md): conv_<field>, booleans as 0/1
        (conv_residual: 0 none, 1 before the activation, 2 after it),
        the activation by its index in ACTIVATIONS and its parameters as float32 bit patterns (ORT's
        custom-op API reads no FLOATS through the scheme's attribute reader)."""
        p = ATTRIBUTE_PREFIX
        return {p + "pads": list(self.pads), p + "strides": list(self.strides), p + "dilations": list(self.dilations),
                p + "group": self.group, p + "bias": int(self.bias),
                p + "residual": 0 if not self.residual else 2 if self.residual_after else 1,
                p + "activation": ACTIVATIONS.index(self.activation),
                p + "activation_params": [_bits(v) for v in self.params],
                p + "layouts": [int(v) for v in self.layouts],
                **({p + "hint": list(self.hint)} if self.hint else {})}
