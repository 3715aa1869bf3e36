"""Convolution chains for the conv scheme's tests (tests/test_conv.py, tests/gpu/test_conv_gpu.py):
small networks of Conv → [residual Add] → [activation] layers as exporters write them, and a
float64 reference of each (onnx's reference evaluator over the same graph in double: neither ONNX
Runtime nor cuDNN)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

ACTIVATIONS = ("", "relu", "relu6", "leaky_relu", "silu", "sigmoid", "tanh")


@dataclass(frozen=True)
class Layer:
    """One Conv and what follows it: `residual` adds the layer's input (same shape needed)."""

    out: int
    kernel: int = 3
    stride: int = 1
    pad: tuple[int, int, int, int] | None = None  # ONNX order; None: "same" for stride 1
    dilation: int = 1
    group: int = 1
    bias: bool = True
    residual: bool = False
    activation: str = ""
    shortcut: bool = False  # adds the layer's input after the activation (YOLO's bottleneck)
    bn: bool = False  # a BatchNormalization after the Conv (exports that do not fold it)
    # MobileNetV3's squeeze-excite after the activation: the pixels' mean → 1×1 Conv → ReLU → 1×1
    # Conv → HardSigmoid, scaling the channels (ReduceMean's axes an input from opset 18 on)
    se: bool = False


@dataclass(frozen=True)
class Net:
    channels: int
    layers: tuple[Layer, ...]
    dtype: int = TP.FLOAT
    seed: int = 0
    name: str = field(default="")
    opset: int = 17
    line: bool = False  # 1-D convolutions over x [n, C, w] (wav2vec2's, Whisper's, silero-vad's)

    @property
    def id(self) -> str:
        acts = "-".join(f"{'bn/' if ly.bn else ''}{ly.activation or 'none'}{'+r' if ly.residual else ''}{'+s' if ly.shortcut else ''}{'+se' if ly.se else ''}{f'/g{ly.group}' if ly.group > 1 else ''}"
                        f"{f'/s{ly.stride}' if ly.stride > 1 else ''}{f'/d{ly.dilation}' if ly.dilation > 1 else ''}"
                        for ly in self.layers)
        return f"{'f16' if self.dtype == TP.FLOAT16 else 'f32'}{'-1d' if self.line else ''}-{acts}"


def model(net: Net, dtype: int | None = None) -> onnx.ModelProto:
    """The network as a model of input x [n, C, h, w] (symbolic n, h, w) in `dtype` (the net's)."""
    dtype = net.dtype if dtype is None else dtype
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(net.seed)
    nodes, inits = [], []
    x, c = "x", net.channels
    for k, ly in enumerate(net.layers):
        pad = ly.pad if ly.pad is not None else (ly.dilation * (ly.kernel - 1) // 2,) * 4
        axes = 1 if net.line else 2
        if net.line:  # (a 4-tuple's second axis: its w begin and end)
            pad = (pad[1], pad[3])
        w = rng.standard_normal((ly.out, c // ly.group) + (ly.kernel,) * axes) / np.sqrt(c // ly.group * ly.kernel ** axes)
        inits.append(numpy_helper.from_array(w.astype(np_dtype), f"w{k}"))
        ins = [x, f"w{k}"]
        if ly.bias:
            inits.append(numpy_helper.from_array((0.5 * rng.standard_normal(ly.out)).astype(np_dtype), f"b{k}"))
            ins.append(f"b{k}")
        t = f"conv{k}"
        nodes.append(helper.make_node("Conv", ins, [t], name=f"conv{k}", pads=list(pad), strides=[ly.stride] * axes,
                                      dilations=[ly.dilation] * axes, group=ly.group, kernel_shape=[ly.kernel] * axes))
        if ly.bn:
            params = [rng.uniform(0.5, 1.5, ly.out), 0.3 * rng.standard_normal(ly.out), 0.3 * rng.standard_normal(ly.out),
                      rng.uniform(0.5, 2.0, ly.out)]
            for name, v in zip(("scale", "beta", "mean", "var"), params):
                inits.append(numpy_helper.from_array(v.astype(np_dtype), f"bn_{name}{k}"))
            nodes.append(helper.make_node("BatchNormalization", [t] + [f"bn_{n}{k}" for n in ("scale", "beta", "mean", "var")],
                                          [f"bn{k}"], epsilon=1e-3))
            t = f"bn{k}"
        if ly.residual:
            nodes.append(helper.make_node("Add", [t, x], [f"sum{k}"]))
            t = f"sum{k}"
        a = ly.activation
        if a in ("relu", "sigmoid", "tanh"):
            nodes.append(helper.make_node(a.capitalize(), [t], [f"act{k}"]))
        elif a == "relu6":
            for name, v in ((f"lo{k}", 0.0), (f"hi{k}", 6.0)):
                inits.append(numpy_helper.from_array(np.array(v, np_dtype), name))
            nodes.append(helper.make_node("Clip", [t, f"lo{k}", f"hi{k}"], [f"act{k}"]))
        elif a == "hardswish":
            nodes.append(helper.make_node("HardSwish", [t], [f"act{k}"]))
        elif a == "hardswish_written":  # as paddle2onnx writes it: t · Clip(t + 3, 0, 6) / 6
            for name, v in ((f"three{k}", 3.0), (f"zero{k}", 0.0), (f"six{k}", 6.0)):
                inits.append(numpy_helper.from_array(np.array([v], np_dtype), name))
            nodes += [helper.make_node("Add", [t, f"three{k}"], [f"hs_add{k}"]),
                      helper.make_node("Clip", [f"hs_add{k}", f"zero{k}", f"six{k}"], [f"hs_clip{k}"]),
                      helper.make_node("Mul", [t, f"hs_clip{k}"], [f"hs_mul{k}"]),
                      helper.make_node("Div", [f"hs_mul{k}", f"six{k}"], [f"act{k}"])]
        elif a == "gelu_written":  # the erf form as torch.onnx's TorchScript exporter writes it
            for name, v in ((f"sqrt2{k}", np.sqrt(2.0)), (f"one{k}", 1.0), (f"half{k}", 0.5)):
                inits.append(numpy_helper.from_array(np.array(v, np_dtype), name))
            nodes += [helper.make_node("Div", [t, f"sqrt2{k}"], [f"g_div{k}"]),
                      helper.make_node("Erf", [f"g_div{k}"], [f"g_erf{k}"]),
                      helper.make_node("Add", [f"g_erf{k}", f"one{k}"], [f"g_add{k}"]),
                      helper.make_node("Mul", [t, f"g_add{k}"], [f"g_mul{k}"]),
                      helper.make_node("Mul", [f"g_mul{k}", f"half{k}"], [f"act{k}"])]
        elif a == "hard_sigmoid":
            nodes.append(helper.make_node("HardSigmoid", [t], [f"act{k}"], alpha=1 / 6, beta=0.5))
        elif a == "leaky_relu":
            nodes.append(helper.make_node("LeakyRelu", [t], [f"act{k}"], alpha=0.1))
        elif a == "silu":
            nodes.append(helper.make_node("Sigmoid", [t], [f"sig{k}"]))
            nodes.append(helper.make_node("Mul", [t, f"sig{k}"], [f"act{k}"]))
        t = f"act{k}" if a else t
        if ly.se:
            squeeze = max(8, ly.out // 4)
            for name, shape in ((f"se_w1_{k}", (squeeze, ly.out, 1, 1)), (f"se_w2_{k}", (ly.out, squeeze, 1, 1))):
                inits.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np_dtype), name))
            for name, size in ((f"se_b1_{k}", squeeze), (f"se_b2_{k}", ly.out)):
                inits.append(numpy_helper.from_array((0.5 * rng.standard_normal(size)).astype(np_dtype), name))
            if net.opset >= 18:
                inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), f"se_axes{k}"))
                nodes.append(helper.make_node("ReduceMean", [t, f"se_axes{k}"], [f"se_mean{k}"], keepdims=1))
            else:
                nodes.append(helper.make_node("ReduceMean", [t], [f"se_mean{k}"], axes=[2, 3], keepdims=1))
            nodes += [helper.make_node("Conv", [f"se_mean{k}", f"se_w1_{k}", f"se_b1_{k}"], [f"se_fc1_{k}"], name=f"se_fc1_{k}",
                                       kernel_shape=[1, 1]),
                      helper.make_node("Relu", [f"se_fc1_{k}"], [f"se_relu{k}"]),
                      helper.make_node("Conv", [f"se_relu{k}", f"se_w2_{k}", f"se_b2_{k}"], [f"se_fc2_{k}"], name=f"se_fc2_{k}",
                                       kernel_shape=[1, 1]),
                      helper.make_node("HardSigmoid", [f"se_fc2_{k}"], [f"se_gate{k}"], alpha=1 / 6, beta=0.5),
                      helper.make_node("Mul", [t, f"se_gate{k}"], [f"se{k}"])]
            t = f"se{k}"
        if ly.shortcut:
            nodes.append(helper.make_node("Add", [x, t], [f"short{k}"]))
            t = f"short{k}"
        x, c = t, ly.out
    nodes[-1].output[0] = "y"
    dims = ["n", net.channels, "w"] if net.line else ["n", net.channels, "h", "w"]
    graph = helper.make_graph(nodes, net.name or "convs", [helper.make_tensor_value_info("x", dtype, dims)],
                              [helper.make_tensor_value_info("y", dtype, [None] * len(dims))], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", net.opset)])
    m.ir_version = 9
    return m


def feeds(net: Net, n: int, h: int, w: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x at [n, C, h, w] (1-D nets: [n, C, h·w], a longer line)."""
    x = rng.standard_normal((n, net.channels, h * w) if net.line else (n, net.channels, h, w))
    return {"x": x.astype(helper.tensor_dtype_to_np_dtype(net.dtype))}


def reference(net: Net, given: dict[str, np.ndarray]) -> np.ndarray:
    """y in float64: the same graph, weights as the model holds them (rounded to its dtype), run
    by onnx's reference evaluator in double."""
    m = model(net)
    double = model(net, TP.DOUBLE)
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in m.graph.initializer}
    for t in double.graph.initializer:
        if t.data_type == TP.DOUBLE:  # not ReduceMean's axes
            t.CopyFrom(numpy_helper.from_array(weights[t.name], t.name))
    (y,) = ReferenceEvaluator(double).run(None, {"x": given["x"].astype(np.float64)})
    return np.asarray(y)
