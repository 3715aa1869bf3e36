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

Legal chains (`find`): a Conv of rank-4 float32/float16 X, a constant 4-D weight, explicit pads
(auto_pad NOTSET or VALID), its own bias [K] or none, a BatchNormalization with constant
parameters after it or none (folded into new weights and bias, as ONNX Runtime folds it), then
optionally

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

Each chain is proposed with every legal prefix, the Conv alone included, all sharing its nodes: the
plan takes at most one, or none; the refusals say why a chain stops.

Price (`group_of`): ORT's price of the Conv (cost.node_us, the same in every plan) scaled by
NHWC_FACTOR, plus the bytes of its residual: the epilogue itself costs cuDNN nearly nothing.
Layout changes at the chain's ends are not priced (they depend on what the plan chooses around
it; `layouts` decides them after).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

from ...cost import CostModel, node_us
from ..gemm.match import FP16_TFLOPS, TF32_TFLOPS, library_operands, residual_add
from ... import ops
from ...graph import FusionGraph, TensorInfo, constant_value, row_axes
from ...planned import Group, Plan
from ...weights import Weights
from .. import CONV, written
from .spec import DTYPES, ConvSpec

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


NHWC_SUFFIX = "~nhwc"


def nhwc_name(t: str) -> str:
    """The name of tensor `t` held in NHWC between two conv nodes."""
    return t + NHWC_SUFFIX


def nhwc_info(g: FusionGraph, t: str) -> TensorInfo:
    """The type and shape of `t`, an NHWC tensor named by `nhwc_name`: its NCHW tensor's, dims
    permuted."""
    base = g.tensors[t[:-len(NHWC_SUFFIX)]]
    shape = None if base.shape is None else tuple(base.shape[k] for k in (0, 2, 3, 1))
    return TensorInfo(t, base.dtype, shape)


def _conv(g: FusionGraph, i: int) -> dict | str:
    """The Conv's geometry, or why it is no conv epilogue's."""
    n = g.nodes[i]
    x, w = n.inputs[:2]
    b = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    y = n.outputs[0]
    why = library_operands(g, (x, w, y), w)
    if why:
        return why
    sx, sw = g.shape(x), g.shape(w)
    if sx is None or len(sx) != 4 or sw is None or len(sw) != 4 or not all(isinstance(d, int) for d in sw):
        return "not a 2-D convolution of a rank-4 input with a fixed 4-D weight"
    if not isinstance(sx[1], int):
        return f"the channels of '{x}' are not fixed"
    auto_pad = n.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return f"auto_pad {auto_pad} (explicit pads only)"
    pads = tuple(int(v) for v in n.attrs.get("pads", (0, 0, 0, 0))) if auto_pad == "NOTSET" else (0, 0, 0, 0)
    strides = tuple(int(v) for v in n.attrs.get("strides", (1, 1)))
    dilations = tuple(int(v) for v in n.attrs.get("dilations", (1, 1)))
    group = int(n.attrs.get("group", 1))
    if len(pads) != 4 or len(strides) != 2 or len(dilations) != 2:
        return "pads, strides or dilations not of a 2-D convolution"
    if sx[1] != sw[1] * group:
        return f"'{x}' has {sx[1]} channels, the weight {sw[1]} × {group} groups"
    if group > 1 and not (group == sx[1] and sw[1] == 1):
        return (f"a grouped convolution ({group} groups of {sw[1]} channels): only depthwise ones (one channel a "
                f"group) were measured with cuDNN's fused NHWC engines (scripts/probe_cudnn.cc)")
    if b is not None and (g.shape(b) != (sw[0],) or g.tensors[b].dtype != g.tensors[y].dtype):
        return f"its bias '{b}' is not [{sw[0]}] of its type"
    return dict(x=x, w=w, bias=b, pads=pads, strides=strides, dilations=dilations, group=group,
                dtype=g.tensors[y].dtype)


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
        form = n.attrs.get("approximate", "none")
        form = form.decode() if isinstance(form, bytes) else form
        return ("gelu_tanh" if form == "tanh" else "gelu"), (0.0, 0.0), (n.index,), n.outputs[0]
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
    folded = (weights.add((w * k[:, None, None, None]).astype(np_dtype), f"{name}~bn_weight"),
              weights.add((b * k + shift).astype(np_dtype), f"{name}~bn_bias"))
    return at, folded


def _chain(g: FusionGraph, weights: Weights, i: int) -> tuple[list[Match], list[str]]:
    n = g.nodes[i]
    name = f"conv epilogue at '{n.name or n.outputs[0]}'"
    got = _conv(g, i)
    if isinstance(got, str):
        return [], [f"{name}: {got}"]
    t, nodes, residual = n.outputs[0], [i], None
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
                           n.name or n.outputs[0], residual_after=after, folded=folded))

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
    return Group(name, m.nodes, ins, (m.output,), None, moved, NHWC_FACTOR * node_us(g, cost, m.nodes[0]) + extra,
                 tuple(g.nodes[i].label for i in m.nodes), tf32=m.dtype == TP.FLOAT and TF32, scheme=CONV, payload=m)


def conv_us(g: FusionGraph, cost: CostModel, m: Match) -> float:
    """The convolution's roofline with a launch: its flops at the tensor rate of its dtype
    against the bytes of X, W and Y."""
    sw = g.shape(m.w)
    rows = g.tensor_bytes(m.output) // (2 if m.dtype == TP.FLOAT16 else 4) // sw[0]
    flops = 2.0 * rows * sw[0] * sw[1] * sw[2] * sw[3]
    rate = FP16_TFLOPS if m.dtype == TP.FLOAT16 else TF32_TFLOPS
    nbytes = sum(g.tensor_bytes(t) for t in (m.x, m.w, m.output))
    return cost.launch_us + max(flops / (rate * 1e6), nbytes / (cost.bandwidth_gbs * 1e3))


def one_pixel(g: FusionGraph, t: str) -> bool:
    """Whether rank-4 `t` is [N, C, 1, 1]: its NCHW and NHWC forms are the same bytes (a
    squeeze-excite's pooled vector), so changing its layout costs nothing (launch.cc skips it)."""
    s = g.shape(t)
    return s is not None and len(s) == 4 and s[2] == 1 and s[3] == 1


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
                if t and not nhwc and not one_pixel(g, t)]
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


# Nodes ONNX Runtime runs in either layout (`_neutral`): a channel Concat or Split is a
# last-axis one in NHWC; elementwise work is the same over permuted operands (broadcasts
# included, every rank-4 operand permuted alike); a reduction over the pixels (a squeeze-excite's
# pooling) is a product by a constant row over the NHWC tensor's pixels (`nhwc_node`).
CHANNEL_OPS = frozenset({"Concat", "Split"})
ELEMENTWISE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Relu", "HardSwish", "HardSigmoid", "Sigmoid",
                             "Tanh", "Clip", "LeakyRelu"})
POOL_OPS = frozenset({"ReduceMean", "ReduceSum", "GlobalAveragePool"})
AXES_INPUT_FROM = {"ReduceSum": 13, "ReduceMean": 18}  # the opset whose Reduce* takes its axes as an input


def _pools_pixels(g: FusionGraph, n) -> bool:
    """A reduction of a rank-4 tensor over its pixels alone, keeping the reduced dims."""
    keeps = n.op_type in ops.GLOBAL_POOLS or bool(int(n.attrs.get("keepdims", 1)))
    return keeps and row_axes(n, n.attrs, g.constants, g.opset, 4) == [2, 3]


def _neutral(g: FusionGraph, i: int) -> bool:
    """A node of CHANNEL_OPS, ELEMENTWISE_OPS or POOL_OPS that runs as well over NHWC tensors:
    rank-4 tensors; a channel Concat/Split; elementwise operands all rank 4 or constant scalars;
    a pooling over the pixels only."""
    n = g.nodes[i]
    if n.domain not in ("", "ai.onnx"):
        return False
    shape = g.shape(n.outputs[0])
    if shape is None or len(shape) != 4:
        return False
    if n.op_type in CHANNEL_OPS:
        return int(n.attrs.get("axis", 0)) in (1, -3)
    if n.op_type in ELEMENTWISE_OPS:
        for t in n.inputs:
            if not t:
                continue
            s = g.shape(t)
            if t in g.constants:
                if s is None or int(np.prod(s)) != 1:
                    return False
            elif s is None or len(s) != 4:
                return False
        return bool(_data_inputs(g, i))
    if n.op_type in POOL_OPS:
        s = g.shape(n.inputs[0])
        return s is not None and len(s) == 4 and _pools_pixels(g, n)
    return False


def _data_inputs(g: FusionGraph, i: int) -> tuple[str, ...]:
    """The rank-4 tensors a layout-neutral node reads (renamed to their NHWC form)."""
    n = g.nodes[i]
    if n.op_type == "Concat":
        return tuple(t for t in n.inputs if t)
    if n.op_type in ELEMENTWISE_OPS:
        return tuple(dict.fromkeys(t for t in n.inputs if t and t not in g.constants))
    return (n.inputs[0],) if n.inputs[0] else ()


def layouts(g: FusionGraph, plan: Plan) -> Plan:
    """`plan` with the tensors that pass between its conv groups and layout-neutral nodes
    (`_neutral`, run by ONNX Runtime: ungrouped, or the only node of its group) held NHWC: an
    output of a conv group or such a node, every reader of which is a conv group reading it as X
    or R, or such a node whose data inputs and outputs are all NHWC too (the largest such set,
    found by removing what breaks it). At one pixel ([N, C, 1, 1], `one_pixel`) both layouts are
    the same bytes: such a tensor may also have readers of the other layout, and a neutral node
    may read one held NCHW — the rewrite bridges them by Reshapes (`bridge`)."""
    convs = [grp for grp in plan.groups if grp.scheme == CONV]
    if not convs:
        return plan
    owner = {i: grp for grp in convs for i in grp.nodes}
    grouped = {i: grp for grp in plan.groups for i in grp.nodes}
    nodes = {i for i in range(len(g.nodes)) if _neutral(g, i)
             and (i not in grouped or (grouped[i].scheme != CONV and grouped[i].nodes == (i,)))}
    made = {grp.payload.output: None for grp in convs}
    made.update({t: i for i in nodes for t in g.nodes[i].outputs if t})

    def reads_nhwc(t: str, r: int) -> bool:
        if r in owner:
            return t in (owner[r].payload.x, owner[r].payload.residual)
        return r in nodes and t in _data_inputs(g, r)

    nhwc = set(made)
    while True:
        keep = {t for t in nhwc if t not in g.graph_outputs and g.consumers.get(t)
                and (one_pixel(g, t) or all(reads_nhwc(t, r) for r in g.consumers[t]))}
        # A neutral node stays where it reads at least one NHWC tensor of more than one pixel
        # and every other tensor it reads or writes is NHWC or one pixel.
        kept_nodes = {i for i in nodes
                      if all(t in keep or one_pixel(g, t) for t in _data_inputs(g, i))
                      and any(t in keep and not one_pixel(g, t) for t in _data_inputs(g, i))
                      and all(t in keep for t in g.nodes[i].outputs if t)}
        keep = {t for t in keep if made[t] is None or made[t] in kept_nodes}
        if keep == nhwc and kept_nodes == nodes:
            break
        nhwc, nodes = keep, kept_nodes
    if not nhwc:
        return plan
    groups = []
    for grp in plan.groups:
        if grp.scheme == CONV:
            m = grp.payload
            m = dataclasses.replace(m, layouts=(m.x in nhwc, m.output in nhwc, m.residual in nhwc))
            grp = dataclasses.replace(grp, payload=m)
        elif len(grp.nodes) == 1 and grp.nodes[0] in nodes:
            continue  # ONNX Runtime runs it, in NHWC
        groups.append(grp)
    return dataclasses.replace(plan, groups=tuple(groups), nhwc_nodes=tuple(sorted(nodes)))


@dataclass(frozen=True)
class NhwcNode:
    """A layout-neutral node as it runs over NHWC tensors (one node or a few), and the
    constants they read."""

    nodes: tuple[onnx.NodeProto, ...]
    constants: tuple[onnx.TensorProto, ...] = ()


def nhwc_node(g: FusionGraph, i: int, node: onnx.NodeProto) -> NhwcNode:
    """Node `i` of `layouts` (`node` in the model) over the NHWC tensors: its data inputs and
    outputs renamed (`nhwc_name`), a channel Concat/Split along the last axis. A pooling over the
    pixels becomes a batched product [1, HW] · [N, HW, C] by a constant row (1/HW for a mean,
    ones for a sum) between two free Reshapes: ORT reduces an NHWC tensor's middle axes through
    cuDNN's reduction, 25 µs a squeeze-excite in MobileNetV3 float16 against ~4 µs for the NCHW
    pooling (H200 timeline), while the product is one GEMM reading it once. Where the pixels are
    not fixed, it is the Reduce* over axes 1 and 2 (its axes an input from AXES_INPUT_FROM on, by the
    model's opset)."""
    n = g.nodes[i]
    out = onnx.NodeProto()
    out.CopyFrom(node)
    data = set(_data_inputs(g, i))
    for k, t in enumerate(out.input):
        if t in data:
            out.input[k] = nhwc_name(t)
    for k, t in enumerate(out.output):
        if t:
            out.output[k] = nhwc_name(t)
    if n.op_type in CHANNEL_OPS:
        for a in out.attribute:
            if a.name == "axis":
                a.i = 3
        return NhwcNode((out,))
    if n.op_type not in POOL_OPS:
        return NhwcNode((out,))
    _, c, h, w = g.shape(n.inputs[0])
    dtype = g.tensors[n.inputs[0]].dtype
    if not all(isinstance(d, int) for d in (c, h, w)) or dtype not in DTYPES:
        # Pixels not fixed: the reduction over axes 1 and 2 (slower, but any size).
        op = ops.GLOBAL_POOLS.get(n.op_type, n.op_type)
        attrs = {a.name: helper.get_attribute_value(a) for a in out.attribute if a.name not in ("axes", "keepdims")}
        if g.opset >= AXES_INPUT_FROM[op]:
            axes = f"{out.output[0]}~axes"
            return NhwcNode((helper.make_node(op, [out.input[0], axes], list(out.output), name=out.name, keepdims=1, **attrs),),
                            (onnx.numpy_helper.from_array(np.array([1, 2], np.int64), axes),))
        return NhwcNode((helper.make_node(op, [out.input[0]], list(out.output), name=out.name, axes=[1, 2], keepdims=1,
                                          **attrs),))
    y = out.output[0]
    row = np.full((1, h * w), 1.0 if n.op_type == "ReduceSum" else 1.0 / (h * w), helper.tensor_dtype_to_np_dtype(dtype))
    names = {k: f"{y}~{k}" for k in ("row", "rows_shape", "rows", "product", "pixel_shape")}
    constants = (onnx.numpy_helper.from_array(row, names["row"]),
                 onnx.numpy_helper.from_array(np.array([0, h * w, c], np.int64), names["rows_shape"]),
                 onnx.numpy_helper.from_array(np.array([0, 1, 1, c], np.int64), names["pixel_shape"]))
    return NhwcNode((helper.make_node("Reshape", [out.input[0], names["rows_shape"]], [names["rows"]], name=f"{out.name}~rows"),
                     helper.make_node("MatMul", [names["row"], names["rows"]], [names["product"]], name=f"{out.name}~pool"),
                     helper.make_node("Reshape", [names["product"], names["pixel_shape"]], [y], name=f"{out.name}~pixel")),
                    constants)


# Reshapes between the layouts of a one-pixel tensor: [N, C, 1, 1] ↔ [N, 1, 1, C].
TO_NHWC, TO_NCHW = "onnxstitch~one_pixel_nhwc", "onnxstitch~one_pixel_nchw"


def bridge(nodes: list[onnx.NodeProto], available: set[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Reshapes making each tensor `nodes` read but nothing makes from its other layout's form
    (`layouts` allows this at one pixel only), and the shapes they read. `available`: the graph's
    inputs and initializers."""
    made = {t for n in nodes for t in n.output if t} | available
    read = dict.fromkeys(t for n in nodes for t in n.input if t and t not in made)
    extra: list[onnx.NodeProto] = []
    for t in read:
        if t.endswith(NHWC_SUFFIX) and t[:-len(NHWC_SUFFIX)] in made:
            extra.append(helper.make_node("Reshape", [t[:-len(NHWC_SUFFIX)], TO_NHWC], [t], name=f"stitch_bridge_{t}"))
        elif nhwc_name(t) in made:
            extra.append(helper.make_node("Reshape", [nhwc_name(t), TO_NCHW], [t], name=f"stitch_bridge_{t}"))
    shapes = {TO_NHWC: [0, 1, 1, -1], TO_NCHW: [0, -1, 1, 1]}
    used = {n.input[1] for n in extra}
    return extra, [onnx.numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items() if k in used]


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
