"""Convolution epilogues: a 2-D Conv and the elementwise work after it as one cuDNN graph.

Design note
-----------
Stock ONNX Runtime runs Conv (with ReLU where it fuses one) in NCHW through cuDNN's legacy API,
then every other activation, residual Add or clip as kernels of their own that read the
convolution's output back. cuDNN's graph API runs conv → bias → residual Add → activation as one
engine, but only in NHWC on the H100: scripts/probe_cudnn.cc found no engine for NCHW graphs with
a residual or SiLU, and NHWC convolutions 1.6–2.7× faster than NCHW ones in float16 (H100,
`bench/results/nvidia-h100/cudnn/`). So a matched chain runs in NHWC: its input, residual and
output change layout at the node (cuBLASLt transforms in scratch memory), except between two conv
nodes, where the tensor stays NHWC (`layouts`: the plan's conv groups decide it together).

Legal chains (`find`): a Conv of rank-4 float32/float16 X, a constant 4-D weight (or a 1-D one:
rank-3 X and weight, run as 2-D of H = R = 1, its tensors held NWC between conv groups), explicit pads
(auto_pad NOTSET or VALID, or SAME_UPPER/SAME_LOWER where the pads do not depend on the input's
size: stride 1, as TorchScript exports PyTorch's padding="same", or fixed pixels), its own bias
[K] or none, a BatchNormalization with constant parameters after it or none (folded into new
weights and bias, as ONNX Runtime folds it), then optionally

- a residual: an Add of a runtime tensor of the convolution's shape, before the activation (as
  ResNet's blocks and MobileNet's inverted residuals write it) or after it (YOLO's bottlenecks);
- an activation: Relu; Clip with constant bounds (ReLU6); LeakyRelu; Sigmoid; Tanh; Gelu; SiLU as
  exporters write it, x · Sigmoid(x); HardSwish; HardSigmoid (MobileNetV3's); or SiLU, GELU (either
  form), HardSwish or HardSigmoid written out as elementwise nodes, recognised by evaluating them
  (schemes/written.py: paddle2onnx writes HardSwish as x · Clip(x + 3, 0, 6) / 6).

Depthwise convolutions (one input channel a group) are legal; other grouped ones are refused.
cuDNN's heuristic sends a depthwise conv + bias (+ ReLU) graph to an engine 6–16× slower than
the plain convolution, but one with a by-value scalar operand to its runtime-fusion engines,
which run it as fast as the plain NHWC call — 2× faster than ORT's NCHW one in float32 — so the
runtime gives every depthwise graph such an operand (launch.cc). Graphs ending in a clip
(ReLU6) get one too, whatever their group: without it torchvision's MobileNetV2 ran 0.28× of
stock ORT on an H200, with it 2.31×.

A zero Pad of the pixels alone in front of the Conv, read by nothing else (TensorFlow-style
"same" padding: transformers' MobileNetV2 and EfficientNet, whose TorchScript exports compute
the pads from constants), joins the chain as more of the Conv's pads (`_pad`): the same sums,
the copy saved, and the tensor before it may stay NHWC (the export ran at 0.99× of stock ORT,
its dynamo export, without the Pads, 2.2×). ONNX Runtime folds such a Pad into the Conv too.

Each chain is proposed with every legal prefix, the Conv alone included, all sharing its nodes: the
plan takes at most one, or none; the refusals say why a chain stops.

Price (`group_of`): ORT's price of the Conv (cost.node_us, the same in every plan) scaled by
NHWC_FACTOR, plus the bytes of its residual: the epilogue itself costs cuDNN nearly nothing.
Layout changes at the chain's ends are not priced (they depend on what the plan chooses around
it; `layouts` decides them after).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from ...cost import CostModel, node_us
from ..gemm.match import FP16_TFLOPS, TF32_TFLOPS, library_operands, residual_add
from ...graph import FusionGraph, constant_value
from ...planned import Group, Plan
from ...weights import Weights
from .. import CONV, written
from .layout import nhwc_name, one_pixel
from .spec import ConvSpec

# cuDNN's fused NHWC engine against ORT's NCHW call, as measured on the H100
# (scripts/probe_cudnn.cc: 0.37–0.72× in float16, 0.5–1.0× in float32 for ResNet's 3×3 and 1×1
# convolutions): the plan's price of a conv node relative to ORT's Conv.
NHWC_FACTOR = 0.8
# cuDNN runs float32 convolutions on TF32 tensor cores unless told otherwise, as ONNX Runtime's
# CUDA EP does by default (its use_tf32): verification judges them at TF32's accuracy.
TF32 = True


@dataclass(frozen=True)
class Match:
    """One Conv and the epilogue cuDNN runs after it."""

    nodes: tuple[int, ...]  # the Conv, its Add, the activation's nodes (topological)
    x: str
    w: str
    bias: str | None
    residual: str | None
    output: str
    activation: str  # one of spec.ACTIVATIONS
    params: tuple[float, float]
    dtype: int
    pads: tuple[int, int, int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    group: int
    conv: str  # the Conv's name, for reports
    layouts: tuple[bool, bool, bool] = (False, False, False)  # X, Y, R in NHWC (`layouts`)
    residual_after: bool = False  # R added after the activation (YOLO's bottlenecks), not before
    # A BatchNormalization after the Conv folded into new weights and bias (W', b'), which the
    # node reads in place of w and bias; empty when there is none.
    folded: tuple[onnx.TensorProto, ...] = ()
    # A 1-D convolution (rank-3 X, W, Y), its geometry that of a 2-D one of H = R = 1 (its
    # layouts NCW or NWC).
    line: bool = False

    def _name(self, t: str, nhwc: bool) -> str:
        return nhwc_name(t) if nhwc else t

    @property
    def inputs(self) -> tuple[str, ...]:
        """The node's inputs: X, W, [the bias], [R] (docs/abi.md), NHWC ones by their NHWC name."""
        w, bias = (self.folded[0].name, self.folded[1].name) if self.folded else (self.w, self.bias)
        return ((self._name(self.x, self.layouts[0]), w) + ((bias,) if bias else ())
                + ((self._name(self.residual, self.layouts[2]),) if self.residual else ()))

    @property
    def node_output(self) -> str:
        return self._name(self.output, self.layouts[1])

    @property
    def spec(self) -> ConvSpec:
        return ConvSpec(self.dtype, self.pads, self.strides, self.dilations, self.group,
                        self.bias is not None or bool(self.folded),
                        self.residual is not None, self.activation, self.params, self.layouts, self.residual_after)

    def describe(self) -> str:
        """One line for reports."""
        parts = [f"+ bias '{self.bias}'"] if self.bias else []
        if self.folded:
            parts.append("with its BatchNormalization folded in")
        if self.residual and not self.residual_after:
            parts.append(f"+ '{self.residual}'")
        if self.activation:
            parts.append(f"→ {self.activation}")
        if self.residual and self.residual_after:
            parts.append(f"+ '{self.residual}'")
        dtype = TP.DataType.Name(self.dtype).lower()
        return f"conv epilogue at '{self.conv}': '{self.x}' ⊛ '{self.w}' {' '.join(parts)} → '{self.output}', {dtype}"


@dataclass(frozen=True)
class Found:
    """The chains cuDNN can run (every legal prefix of each), and the refusals with why."""

    matches: tuple[Match, ...] = ()
    refusals: tuple[str, ...] = ()


def _pad(g: FusionGraph, i: int, x: str) -> tuple[int, tuple[int, int, int, int]] | None:
    """The Pad making Conv `i`'s input `x` where it is a constant zero pad of the pixels alone
    that nothing else reads: its node and pads in the Conv's order (h, w begins; h, w ends)."""
    at = g.producer.get(x)
    if at is None or x in g.graph_outputs or g.consumers.get(x, ()) != (i,):
        return None
    p = g.nodes[at]
    if p.op_type != "Pad" or p.domain not in ("", "ai.onnx"):
        return None
    # (Node attributes come decoded: graph.node_attrs.)
    if p.attrs.get("mode", "constant") != "constant" or (len(p.inputs) > 3 and p.inputs[3]):
        return None
    if len(p.inputs) > 1:  # opset 11 on: pads and the value as inputs
        if p.inputs[1] not in g.constants:
            return None
        pads = [int(v) for v in numpy_helper.to_array(g.constants[p.inputs[1]]).reshape(-1)]
        value = p.inputs[2] if len(p.inputs) > 2 and p.inputs[2] else None
        if value is not None and (value not in g.constants or float(constant_value(g, value)) != 0.0):
            return None
    else:
        pads = [int(v) for v in p.attrs.get("pads", ())]
        if float(p.attrs.get("value", 0.0)) != 0.0:
            return None
    if len(pads) != 8 or any(v < 0 for v in pads) or any(pads[k] for k in (0, 1, 4, 5)):
        return None
    return at, (pads[2], pads[3], pads[6], pads[7])


def _same_pads(auto_pad: str, pixels, kernel, strides, dilations) -> tuple[int, int, int, int] | None:
    """Explicit pads (h, w begins; h, w ends) of a SAME_UPPER/SAME_LOWER convolution where they
    do not depend on the input's size (stride 1: (k − 1)·d in all, as PyTorch's padding="same"
    exports it), or where its pixels are fixed; None otherwise. SAME_UPPER puts the odd one at
    the end, SAME_LOWER at the beginning (ONNX's Conv)."""
    totals = []
    for size, k, s, d in zip(pixels, kernel, strides, dilations):
        if s == 1:
            totals.append((k - 1) * d)
        elif isinstance(size, int):
            totals.append(max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0))
        else:
            return None
    small = [t // 2 for t in totals]
    big = [t - t // 2 for t in totals]
    begins, ends = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    return (begins[0], begins[1], ends[0], ends[1])


def _conv(g: FusionGraph, i: int) -> dict | str:
    """The Conv's geometry, or why it is no conv epilogue's."""
    n = g.nodes[i]
    x, w = n.inputs[:2]
    padded = _pad(g, i, x)
    if padded is not None:  # the Pad's input is the chain's X (module docstring)
        x = g.nodes[padded[0]].inputs[0]
    b = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    y = n.outputs[0]
    why = library_operands(g, (x, w, y), w)
    if why:
        return why
    sx, sw = g.shape(x), g.shape(w)
    # A 1-D convolution ([N, C, W] by [K, C/group, S]: wav2vec2's feature encoder, Whisper's
    # stem, silero-vad) runs as a 2-D one of H = R = 1, its attributes those of the second axis.
    line = sx is not None and sw is not None and len(sx) == 3 and len(sw) == 3 and padded is None
    if line:
        sx, sw = lifted(sx), lifted(sw)
    if sx is None or len(sx) != 4 or sw is None or len(sw) != 4 or not all(isinstance(d, int) for d in sw):
        return "not a 1-D or 2-D convolution of a rank-3 or rank-4 input with a fixed weight"
    if not isinstance(sx[1], int):
        return f"the channels of '{x}' are not fixed"
    auto_pad = n.attrs.get("auto_pad", "NOTSET")
    axes = 1 if line else 2
    # The model's own strides and dilations, then lifted to the 2-D convolution's (H's first).
    given = {k: tuple(int(v) for v in n.attrs.get(k, (1,) * axes)) for k in ("strides", "dilations")}
    group = int(n.attrs.get("group", 1))
    if any(len(v) != axes for v in given.values()):
        return f"strides or dilations not of a {axes}-D convolution"
    strides, dilations = ((1,) * (2 - axes) + given[k] for k in ("strides", "dilations"))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # (Over the Conv's own input: a Pad joined in front makes it larger than X.)
        own = g.shape(n.inputs[0])
        pixels = (lifted(own) if line and own is not None else (own or sx))[2:]
        pads = _same_pads(auto_pad, pixels, sw[2:], strides, dilations)
        if pads is None:
            return (f"auto_pad {auto_pad} with strides {list(given['strides'])} over pixels not fixed in the model "
                    f"(its pads depend on the input's size)")
    elif auto_pad in ("NOTSET", "VALID"):
        zeros = (0,) * (2 * axes)
        pads = tuple(int(v) for v in n.attrs.get("pads", zeros)) if auto_pad == "NOTSET" else zeros
        if line and len(pads) == 2:  # (the second axis's begin and end)
            pads = (0, pads[0], 0, pads[1])
    else:
        return f"auto_pad {auto_pad}"
    if len(pads) != 4:
        return f"pads not of a {axes}-D convolution"
    if padded is not None:
        pads = tuple(a + b for a, b in zip(pads, padded[1]))
    if sx[1] != sw[1] * group:
        return f"'{x}' has {sx[1]} channels, the weight {sw[1]} × {group} groups"
    if group > 1 and not (group == sx[1] and sw[1] == 1):
        return (f"a grouped convolution ({group} groups of {sw[1]} channels): only depthwise ones (one channel a "
                f"group) were measured with cuDNN's fused NHWC engines (scripts/probe_cudnn.cc)")
    if b is not None and (g.shape(b) != (sw[0],) or g.tensors[b].dtype != g.tensors[y].dtype):
        return f"its bias '{b}' is not [{sw[0]}] of its type"
    return dict(x=x, w=w, bias=b, pads=pads, strides=strides, dilations=dilations, group=group,
                dtype=g.tensors[y].dtype, pad=() if padded is None else (padded[0],), line=line)


def lifted(shape: tuple) -> tuple:
    """A 1-D convolution's rank-3 shape ([N, C, W] or [K, C/group, S]) as the 2-D one it runs as,
    H (or R) = 1."""
    return (shape[0], shape[1], 1, shape[2])


def _scalar(g: FusionGraph, t: str) -> float | None:
    if not t or t not in g.constants:
        return None
    v = constant_value(g, t)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def _activation(g: FusionGraph, t: str) -> tuple[str, tuple[float, float], tuple[int, ...], str] | str | None:
    """(kind, params, nodes, output) of the activation read from `t`, why not, or None."""
    readers = g.consumers.get(t, ())
    if not readers or t in g.graph_outputs:
        return None
    if len(readers) == 2:  # SiLU as exporters write it: t · Sigmoid(t)
        a, b = (g.nodes[r] for r in readers)
        sig, mul = (a, b) if a.op_type == "Sigmoid" else (b, a)
        if sig.op_type == "Sigmoid" and mul.op_type == "Mul" and set(mul.inputs[:2]) == {t, sig.outputs[0]} \
                and tuple(g.consumers.get(sig.outputs[0], ())) == (mul.index,) and sig.outputs[0] not in g.graph_outputs:
            return "silu", (0.0, 0.0), tuple(sorted((sig.index, mul.index))), mul.outputs[0]
        return _written(g, t)
    if len(readers) != 1:
        return None
    n = g.nodes[readers[0]]
    if n.domain not in ("", "ai.onnx"):
        return None
    if n.op_type in ("Relu", "Sigmoid", "Tanh"):
        return n.op_type.lower(), (0.0, 0.0), (n.index,), n.outputs[0]
    if n.op_type == "HardSwish":
        return "hardswish", (1.0 / 6.0, 0.5), (n.index,), n.outputs[0]
    if n.op_type == "HardSigmoid":
        return "hard_sigmoid", (float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5))), (n.index,), n.outputs[0]
    if n.op_type == "LeakyRelu":
        return "leaky_relu", (float(n.attrs.get("alpha", 0.01)), 0.0), (n.index,), n.outputs[0]
    if n.op_type == "Gelu":
        return ("gelu_tanh" if n.attrs.get("approximate", "none") == "tanh" else "gelu"), (0.0, 0.0), (n.index,), n.outputs[0]
    if n.op_type == "Clip":
        lo = _scalar(g, n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else float(n.attrs.get("min", -3.4e38))
        hi = _scalar(g, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else float(n.attrs.get("max", 3.4e38))
        if lo is None or hi is None:
            return f"its Clip '{n.name or n.outputs[0]}' has bounds computed at run time"
        if lo > 0:
            return f"its Clip '{n.name or n.outputs[0]}' has a positive lower bound (cuDNN's ReLU clips from ≤ 0)"
        return "clip", (lo, hi), (n.index,), n.outputs[0]
    return _written(g, t)


# The activations cuDNN's graph runs that exporters also write out as elementwise nodes.
_WRITTEN = frozenset({"silu", "gelu", "gelu_tanh", "hardswish", "hard_sigmoid"})


def _written(g: FusionGraph, t: str) -> tuple[str, tuple[float, float], tuple[int, ...], str] | None:
    """(kind, params, nodes, output) of an activation written out after `t` (paddle2onnx's
    HardSwish t·Clip(t + 3, 0, 6)/6, a GELU's formula), the smallest such node set; else None."""
    for nodes, y in written.regions(g, t):
        form = written.identify(g, t, nodes, y, _WRITTEN)
        if form is not None:
            return form[0], form[1], nodes, y
    return None


def _batch_norm(g: FusionGraph, weights: Weights, t: str, conv: dict,
                name: str) -> tuple[int, tuple[onnx.TensorProto, ...]] | None:
    """(the node, W' and b') where `t`'s one reader is an inference BatchNormalization with
    constant parameters: folded into the weights and bias in float64, as ONNX Runtime folds it
    into a Conv (its ConvBNFusion). Constants are read, and W' made, through `weights` (large
    ones are stubs there)."""

    def _array(x: str) -> np.ndarray:
        return weights.value(g.constants[x]).astype(np.float64)

    at = g.only_reader(t)
    if at is None:
        return None
    n = g.nodes[at]
    params = n.inputs[1:]
    if n.op_type != "BatchNormalization" or n.domain not in ("", "ai.onnx") or len(n.outputs) != 1 or \
            len(params) not in (2, 4) or not all(x in g.constants for x in params) or int(n.attrs.get("training_mode", 0)):
        return None
    if conv["bias"] and conv["bias"] not in g.constants:
        return None
    values = [_array(x).reshape(-1) for x in params]
    w = _array(conv["w"])
    if any(v.size != w.shape[0] for v in values):
        return None
    if len(values) == 2:  # the graph stage's form of it (folds/channel_params): x · k + shift
        k, shift = values
    else:  # as ONNX writes it: scale, B, mean, var
        scale, beta, mean, var = values
        k = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
        shift = beta - mean * k
    b = _array(conv["bias"]).reshape(-1) if conv["bias"] else np.zeros(w.shape[0])
    np_dtype = helper.tensor_dtype_to_np_dtype(conv["dtype"])
    folded = (weights.add((w * k.reshape(-1, *(1,) * (w.ndim - 1))).astype(np_dtype), f"{name}~bn_weight"),
              weights.add((b * k + shift).astype(np_dtype), f"{name}~bn_bias"))
    return at, folded


def _chain(g: FusionGraph, weights: Weights, i: int) -> tuple[list[Match], list[str]]:
    n = g.nodes[i]
    name = f"conv epilogue at '{n.name or n.outputs[0]}'"
    got = _conv(g, i)
    if isinstance(got, str):
        return [], [f"{name}: {got}"]
    t, nodes, residual = n.outputs[0], [*got["pad"], i], None
    found: list[Match] = []
    why: list[str] = []
    folded: tuple[onnx.TensorProto, ...] = ()
    bn = _batch_norm(g, weights, t, got, n.name or n.outputs[0])
    if bn is not None:
        at, folded = bn
        nodes.append(at)
        t = g.nodes[at].outputs[0]

    def take(activation: str = "", params: tuple[float, float] = (0.0, 0.0), after: bool = False) -> None:
        found.append(Match(tuple(sorted(nodes)), got["x"], got["w"], got["bias"], residual, t, activation, params,
                           got["dtype"], got["pads"], got["strides"], got["dilations"], got["group"],
                           n.name or n.outputs[0], residual_after=after, folded=folded, line=got["line"]))

    take()
    res = residual_add(g, t)
    if res is not None:
        at, residual = res
        nodes.append(at)
        t = g.nodes[at].outputs[0]
        take()
    act = _activation(g, t)
    if isinstance(act, str):
        why.append(f"{name}: {act}")
    elif act is not None:
        kind, params, extra, out = act
        nodes.extend(extra)
        t = out
        take(kind, params)
        res = residual_add(g, t) if residual is None else None
        if res is not None:  # the shortcut Add after the activation (YOLO's bottlenecks)
            at, residual = res
            nodes.append(at)
            t = g.nodes[at].outputs[0]
            take(kind, params, after=True)
    return found, why


def without(found: Found, refused: dict[str, str]) -> Found:
    """`found` less the chains of the Convs in `refused`, their reasons among the refusals."""
    return Found(tuple(m for m in found.matches if m.conv not in refused), found.refusals + tuple(refused.values()))


def find(g: FusionGraph, weights: Weights | None = None) -> Found:
    """Every Conv chain of `g` cuDNN can run as one graph, and the refusals. `weights` holds the
    payloads of the model's stubbed constants (pipeline.optimize's store; none: every constant
    is inline)."""
    weights = weights if weights is not None else Weights()
    matches: list[Match] = []
    refusals: list[str] = []
    for n in g.nodes:
        if n.op_type != "Conv" or n.domain not in ("", "ai.onnx"):
            continue
        got, why = _chain(g, weights, n.index)
        matches += got
        refusals += why
    return Found(tuple(matches), tuple(refusals))


def group_of(g: FusionGraph, cost: CostModel, name: str, m: Match) -> Group:
    """The plan's group for chain `m` (module docstring)."""
    extra = g.tensor_bytes(m.residual) / (cost.bandwidth_gbs * 1e3) if m.residual else 0.0
    ins = (m.x, m.w) + ((m.bias,) if m.bias else ()) + ((m.residual,) if m.residual else ())
    moved = sum(g.tensor_bytes(t) for t in dict.fromkeys(ins + (m.output,)))
    conv = next(i for i in m.nodes if g.nodes[i].op_type == "Conv")  # (after a Pad joined in front)
    return Group(name, m.nodes, ins, (m.output,), None, moved, NHWC_FACTOR * node_us(g, cost, conv) + extra,
                 tuple(g.nodes[i].label for i in m.nodes), tf32=m.dtype == TP.FLOAT and TF32, scheme=CONV, payload=m)


def conv_us(g: FusionGraph, cost: CostModel, m: Match) -> float:
    """The convolution's roofline with a launch: its flops at the tensor rate of its dtype
    against the bytes of X, W and Y."""
    sw = g.shape(m.w)
    rows = g.tensor_bytes(m.output) // (2 if m.dtype == TP.FLOAT16 else 4) // sw[0]
    flops = 2.0 * rows * float(np.prod(sw))
    rate = FP16_TFLOPS if m.dtype == TP.FLOAT16 else TF32_TFLOPS
    nbytes = sum(g.tensor_bytes(t) for t in (m.x, m.w, m.output))
    return cost.launch_us + max(flops / (rate * 1e6), nbytes / (cost.bandwidth_gbs * 1e3))


def _same_bytes(g: FusionGraph, t: str) -> bool:
    """Whether `t`'s channels-first and channels-last forms are the same bytes (one pixel, or one
    channel): launch.cc changes nothing there."""
    s = g.shape(t)
    return one_pixel(g, t) or (s is not None and len(s) in (3, 4) and
                               (s[1] == 1 or all(d == 1 for d in s[2:])))


def unprofitable(g: FusionGraph, cost: CostModel, plan: Plan) -> dict[str, str]:
    """The plan's conv groups (by Conv name) whose layout changes cost more than they save, with
    why: each NCHW end (X, Y or R changed by a transform in scratch memory, except at one pixel:
    `one_pixel`) costs a launch and a
    read and write of its tensor; a group saves the NHWC engine's share of the convolution and
    the stitched kernel its epilogue nodes would otherwise be."""
    out: dict[str, str] = {}
    for grp in plan.groups if cost.layout_changes else ():
        if grp.scheme != CONV:
            continue
        m: Match = grp.payload
        ends = [t for t, nhwc in ((m.x, m.layouts[0]), (m.output, m.layouts[1]), (m.residual, m.layouts[2]))
                if t and not nhwc and not _same_bytes(g, t)]
        paid = sum(cost.launch_us + 2 * g.tensor_bytes(t) / (cost.bandwidth_gbs * 1e3) for t in ends)
        # Without the group its epilogue nodes would be one stitched kernel reading the
        # convolution's output (and R) and writing the result.
        epilogue = cost.kernel_us(2 * g.tensor_bytes(m.output) + (g.tensor_bytes(m.residual) if m.residual else 0)) \
            if len(m.nodes) > 1 else 0.0
        saved = (1 - NHWC_FACTOR) * conv_us(g, cost, m) + epilogue
        if paid > saved:
            out[m.conv] = (f"conv epilogue at '{m.conv}': changing the layout of {', '.join(repr(t) for t in ends)} "
                           f"(predicted {paid:.1f} µs) costs more than the NHWC engine saves ({saved:.1f} µs)")
    return out


def linked(plan_groups) -> set[str]:
    """The names of the conv groups that read or write an NHWC tensor: they stand or fall
    together (a rewrite without one of them would leave its neighbours' tensors unmade)."""
    return {grp.name for grp in plan_groups if grp.scheme == CONV and any(grp.payload.layouts)}


def chosen(found: Found, plan: Plan) -> Found:
    """`found` as the plan left it: the chains it runs through cuDNN, and for each Conv with
    none taken, why (among the refusals)."""
    taken = [grp.payload for grp in plan.groups if grp.scheme == CONV]
    done = {m.conv for m in taken}
    longest: dict[str, Match] = {}
    for m in found.matches:
        if m.conv not in done:
            longest[m.conv] = m
    passed = tuple(f"{m.describe()}: the plan found other kernels over these nodes cheaper" for m in longest.values())
    return Found(tuple(taken), found.refusals + passed)
