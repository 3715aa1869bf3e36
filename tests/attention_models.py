"""Attention cores as exporters write them (MatMul q·kᵀ → Mul scale → Add mask → Softmax →
MatMul ·v → Transpose), at chosen shapes, and an independent float64 reference."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxstitch import attention, graph as graph_mod, load, shapes


@dataclass(frozen=True)
class Core:
    """One attention core: operands [*lead, S, D]; mask None or its shape; output transposed to
    [b, s, h, d] (rank 4 only)."""

    lead: tuple[int, ...]  # (b, h) or (b·h,)
    sq: int
    sk: int
    d: int
    mask: tuple[int, ...] | None
    transposed: bool = True
    bias: tuple[int, ...] | None = None  # a term added before the mask (T5's position bias)

    @property
    def id(self) -> str:
        m = "x".join(map(str, self.mask)) if self.mask else "none"
        bias = f"-bias{'x'.join(map(str, self.bias))}" if self.bias else ""
        return (f"{'x'.join(map(str, self.lead))}-q{self.sq}-k{self.sk}-d{self.d}-mask{m}{bias}"
                f"{'-T' if self.transposed else ''}")


def core_model(c: Core, dtype: int = TP.FLOAT, opset: int = 18, seq: str | None = None) -> onnx.ModelProto:
    """The core as a model with inputs q, kt, v (and mask) and output y; `seq` names the
    sequence dims (self-attention: Sq = Sk) instead of fixing them."""
    scale = numpy_helper.from_array(np.array(1 / np.sqrt(c.d), np.float32), "scale")
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"])]
    last = "ss"
    if c.bias is not None:
        nodes.append(helper.make_node("Add", ["ss", "bias"], ["sb"]))
        last = "sb"
    if c.mask is not None:
        nodes.append(helper.make_node("Add", [last, "mask"], ["sm"]))
        last = "sm"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["ctx"])]
    sq, sk = (seq, seq) if seq else (c.sq, c.sk)
    out_shape = [*c.lead, sq, c.d]
    if c.transposed:
        nodes.append(helper.make_node("Transpose", ["ctx"], ["y"], perm=[0, 2, 1, 3]))
        out_shape = [c.lead[0], sq, c.lead[1], c.d]
    else:
        nodes[-1].output[0] = "y"
    vi = helper.make_tensor_value_info
    ins = [vi("q", dtype, [*c.lead, sq, c.d]), vi("kt", dtype, [*c.lead, c.d, sk]), vi("v", dtype, [*c.lead, sk, c.d])]
    for name, shape in (("bias", c.bias), ("mask", c.mask)):
        if shape is not None:
            ins.append(vi(name, dtype, [seq if seq and m == c.sk else m for m in shape]))
    g = helper.make_graph(nodes, "attention", ins, [vi("y", dtype, out_shape)], [scale])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def core_feeds(c: Core, rng: np.random.Generator, masked: float | None = -3.4e38) -> dict[str, np.ndarray]:
    """Random operands; the mask holds 0 or `masked` (BERT's float32 minimum), a tenth masked,
    never a whole row, or with `masked` None normal values (scaled by 2)."""
    feeds = {"q": rng.standard_normal((*c.lead, c.sq, c.d)), "kt": rng.standard_normal((*c.lead, c.d, c.sk)),
             "v": rng.standard_normal((*c.lead, c.sk, c.d))}
    if c.bias is not None:
        feeds["bias"] = rng.standard_normal(c.bias)
    if c.mask is not None and masked is None:
        feeds["mask"] = 2 * rng.standard_normal(c.mask)
    elif c.mask is not None:
        hidden = rng.random(c.mask) < 0.1
        hidden[..., 0] = False
        feeds["mask"] = np.where(hidden, masked, 0.0)
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def core_reference(c: Core, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """softmax(q·kᵀ/√d + mask)·v in float64, transposed as the model does."""
    q, kt, v = (feeds[k].astype(np.float64) for k in ("q", "kt", "v"))
    s = q @ kt / np.sqrt(c.d)
    for name in ("bias", "mask"):
        if name in feeds:
            s = s + feeds[name].astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v
    return y.transpose(0, 2, 1, 3) if c.transposed else y


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖ (Frobenius)."""
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


# Shapes the tests run: BERT-base's, ragged sequences, cross attention, masks of every
# broadcast, rank-3 operands, small and large heads.
CORES = [
    Core((8, 12), 128, 128, 64, (8, 1, 1, 128)),
    Core((2, 3), 70, 70, 64, (2, 1, 70, 70)),
    Core((2, 2), 5, 130, 32, (1, 2, 5, 130)),
    Core((1, 4), 200, 77, 16, (77,), transposed=False),
    Core((3,), 64, 64, 128, None, transposed=False),
    Core((2, 3), 197, 197, 64, None),
    Core((2, 2), 33, 65, 8, (2, 2, 33, 65), transposed=False),
    Core((2, 4), 70, 70, 64, (2, 1, 1, 70), bias=(1, 4, 70, 70)),
]


def attention_graph(model: onnx.ModelProto) -> tuple[graph_mod.FusionGraph, attention.Found]:
    """The model's FusionGraph, built as the pipeline builds it, and its attention chains."""
    m = load.constants_to_initializers(load.load(model))
    m, dims = shapes.resolve_shapes(m, {})
    g = graph_mod.build(m, shapes.infer(m)[1], dims)
    return g, attention.find(g)
