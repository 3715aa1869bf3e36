"""Small models whose kernels read Slice/Split outputs (slices.py: folded into boxes of their
input), each with an independent float64 numpy reference, for the CPU (plan, fallback, host
kernels) and GPU (real kernels) tests."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

from .layout_models import Reference, _i64, _model


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def qkv_split(heads: int, head_dim: int, dtype: int = TP.FLOAT) -> tuple[onnx.ModelProto, Reference]:
    """GPT-2's attention input as torch.onnx writes it: the fused projection [b, s, 3·H·D] split
    in three, each reshaped to heads and transposed (query and value (0, 2, 1, 3), key
    (0, 2, 3, 1)). No arithmetic at all: ONNX Runtime runs a Split and three Transposes."""
    hd = heads * head_dim
    x = helper.make_tensor_value_info("x", dtype, ["batch", "seq", 3 * hd])
    perms = ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3))
    nodes = [helper.make_node("Split", ["x", "sizes"], ["q", "k", "v"], axis=2)]
    outs = []
    for t, perm in zip("qkv", perms):
        nodes += [helper.make_node("Reshape", [t, "heads"], [f"{t}h"]),
                  helper.make_node("Transpose", [f"{t}h"], [f"{t}t"], perm=list(perm))]
        outs.append(helper.make_tensor_value_info(f"{t}t", dtype, [["batch", "seq", heads, head_dim][p] for p in perm]))
    model = _model(nodes, [x], outs, [_i64("sizes", [hd] * 3), _i64("heads", [0, 0, heads, head_dim])])

    def ref(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        v = f["x"].astype(np.float64)
        parts = [v[..., j * hd:(j + 1) * hd].reshape(v.shape[0], v.shape[1], heads, head_dim) for j in range(3)]
        return [p.transpose(perm) for p, perm in zip(parts, perms)]

    return model, ref


def glu(cols: int, dtype: int = TP.FLOAT, opset: int = 17) -> tuple[onnx.ModelProto, Reference]:
    """A gated linear unit: [b, 2·cols] split in halves, a · sigmoid(g). Opset 18 states the
    halves by `num_outputs`, 17 by a `split` input."""
    x = helper.make_tensor_value_info("x", dtype, ["batch", 2 * cols])
    if opset >= 18:
        split = helper.make_node("Split", ["x"], ["a", "g"], axis=-1, num_outputs=2)
        inits = []
    else:
        split = helper.make_node("Split", ["x", "sizes"], ["a", "g"], axis=-1)
        inits = [_i64("sizes", [cols, cols])]
    nodes = [split, helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["a", "s"], ["y"])]
    g = helper.make_graph(nodes, "glu", [x], [helper.make_tensor_value_info("y", dtype, ["batch", cols])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)

    def ref(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        v = f["x"].astype(np.float64)
        return [v[:, :cols] * _sigmoid(v[:, cols:])]

    return model, ref


def _slice(x: str, y: str, starts: list[int], ends: list[int], axes: list[int]) -> tuple[list, list]:
    names = [f"{y}_{p}" for p in ("starts", "ends", "axes")]
    inits = [_i64(n, v) for n, v in zip(names, (starts, ends, axes))]
    return [helper.make_node("Slice", [x, *names], [y])], inits


def slice_models(cols: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for each way a kernel reads Slice/Split outputs, rows of `cols`
    elements (`cols` even); the batch dim stays symbolic."""
    half = cols // 2
    yield ("qkv-split", *qkv_split(2, half, dtype))
    yield ("glu", *glu(half, dtype))
    yield ("glu-opset18", *glu(half, dtype, opset=18))

    # Two Slices of one input, counted from either end: x[..., :half] - x[..., -half:] (·2).
    x = helper.make_tensor_value_info("x", dtype, ["batch", 3, cols])
    n1, i1 = _slice("x", "lo", [0], [half], [-1])
    n2, i2 = _slice("x", "hi", [-half], [2 ** 62], [2])
    nodes = n1 + n2 + [helper.make_node("Sub", ["lo", "hi"], ["d"]), helper.make_node("Add", ["d", "d"], ["y"])]
    yield ("slice-halves", _model(nodes, [x], [helper.make_tensor_value_info("y", dtype, ["batch", 3, half])], i1 + i2),
           lambda f: [2 * (f["x"].astype(np.float64)[..., :half] - f["x"].astype(np.float64)[..., -half:])])

    # A Slice along a middle axis, added to a whole tensor: x[:, 1:4, :] + z.
    x = helper.make_tensor_value_info("x", dtype, ["batch", 6, cols])
    z = helper.make_tensor_value_info("z", dtype, ["batch", 3, cols])
    nodes, inits = _slice("x", "m", [1], [4], [1])
    nodes += [helper.make_node("Add", ["m", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    yield ("slice-middle-axis", _model(nodes, [x, z], [helper.make_tensor_value_info("y", dtype, ["batch", 3, cols])], inits),
           lambda f: [np.maximum(f["x"].astype(np.float64)[:, 1:4] + f["z"].astype(np.float64), 0)])

    # A box of one row broadcast over the others: -(w[:, 2:3, :] · z).
    w = helper.make_tensor_value_info("w", dtype, ["batch", 5, cols])
    nodes, inits = _slice("w", "row", [2], [3], [1])
    nodes += [helper.make_node("Mul", ["row", "z"], ["p"]), helper.make_node("Neg", ["p"], ["y"])]
    yield ("slice-broadcast-row",
           _model(nodes, [w, z], [helper.make_tensor_value_info("y", dtype, ["batch", 3, cols])], inits),
           lambda f: [-(f["w"].astype(np.float64)[:, 2:3] * f["z"].astype(np.float64))])

    # A box of whole, aligned vectors in rows of odd pitch (their vectors are not aligned: no
    # 16-byte loads): x[..., 8:cols + 8] of cols + 9.
    x = helper.make_tensor_value_info("x", dtype, ["batch", cols + 9])
    nodes, inits = _slice("x", "c", [8], [-1], [1])
    nodes += [helper.make_node("Abs", ["c"], ["a"]), helper.make_node("Sqrt", ["a"], ["y"])]
    yield ("slice-odd-pitch", _model(nodes, [x], [helper.make_tensor_value_info("y", dtype, ["batch", cols])], inits),
           lambda f: [np.sqrt(np.abs(f["x"].astype(np.float64)[:, 8:cols + 8]))])
