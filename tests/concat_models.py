"""Small models whose kernels stitch a Concat (concats.py: operands computed in windows of its
output), each with an independent float64 numpy reference, for the CPU (plan, fallback, host
kernels) and GPU (real kernels) tests."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

from .layout_models import Reference, _model
from .slice_models import _slice


def rope(heads: int, head_dim: int, dtype: int = TP.FLOAT) -> tuple[onnx.ModelProto, Reference]:
    """LLaMA's rotary embedding as exporters write it: q·cos + rotate_half(q)·sin, where
    rotate_half(q) = Concat(-q[..., d/2:], q[..., :d/2]) and cos/sin are [seq, d] tables.
    ONNX Runtime runs two Slices, Neg, Concat, two Muls and an Add."""
    half = head_dim // 2
    q = helper.make_tensor_value_info("q", dtype, ["batch", heads, "seq", head_dim])
    cos = helper.make_tensor_value_info("cos", dtype, ["seq", head_dim])
    sin = helper.make_tensor_value_info("sin", dtype, ["seq", head_dim])
    n1, i1 = _slice("q", "q1", [0], [half], [-1])
    n2, i2 = _slice("q", "q2", [half], [2 ** 62], [-1])
    nodes = n1 + n2 + [helper.make_node("Neg", ["q2"], ["nq2"]),
                       helper.make_node("Concat", ["nq2", "q1"], ["rot"], axis=-1),
                       helper.make_node("Mul", ["q", "cos"], ["qc"]),
                       helper.make_node("Mul", ["rot", "sin"], ["rs"]),
                       helper.make_node("Add", ["qc", "rs"], ["y"])]
    out = helper.make_tensor_value_info("y", dtype, ["batch", heads, "seq", head_dim])
    model = _model(nodes, [q, cos, sin], [out], i1 + i2)

    def ref(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        v, c, s = (f[k].astype(np.float64) for k in ("q", "cos", "sin"))
        rot = np.concatenate([-v[..., half:], v[..., :half]], axis=-1)
        return [v * c + rot * s]

    return model, ref


def _f64(f: dict[str, np.ndarray], *names: str) -> list[np.ndarray]:
    return [f[k].astype(np.float64) for k in names]


def concat_models(cols: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for each way a kernel stitches a Concat, rows of `cols` elements
    (`cols` even); the batch dim stays symbolic."""
    half = cols // 2
    yield ("rope", *rope(2, cols, dtype))

    # Operands computed in their windows along the last axis, a bias over the whole output.
    a = helper.make_tensor_value_info("a", dtype, ["batch", half])
    b = helper.make_tensor_value_info("b", dtype, ["batch", cols + 3])
    bias = helper.make_tensor_value_info("bias", dtype, [half + cols + 3])
    nodes = [helper.make_node("Sigmoid", ["a"], ["sa"]), helper.make_node("Abs", ["b"], ["ab"]),
             helper.make_node("Sqrt", ["ab"], ["rb"]), helper.make_node("Concat", ["sa", "rb"], ["c"], axis=1),
             helper.make_node("Add", ["c", "bias"], ["y"])]
    out = helper.make_tensor_value_info("y", dtype, ["batch", half + cols + 3])
    yield ("concat-computed-last-axis", _model(nodes, [a, b, bias], [out]),
           lambda f: [np.concatenate([1 / (1 + np.exp(-_f64(f, "a")[0])), np.sqrt(np.abs(_f64(f, "b")[0]))], 1)
                      + _f64(f, "bias")[0]])

    # Three operands along a middle axis, read as they are, then ReLU·2: windows of whole rows.
    xs = [helper.make_tensor_value_info(f"x{k}", dtype, ["batch", r, cols]) for k, r in enumerate((3, 1, 4))]
    nodes = [helper.make_node("Concat", ["x0", "x1", "x2"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "r"], ["y"])]
    out = helper.make_tensor_value_info("y", dtype, ["batch", 8, cols])
    yield ("concat-middle-axis", _model(nodes, xs, [out]),
           lambda f: [2 * np.maximum(np.concatenate(_f64(f, "x0", "x1", "x2"), 1), 0)])

    # A per-row scale inside one window (the same in every window: read unshifted) and the
    # Concat along the first axis, whose inner dims are symbolic (a divisor read at run time).
    p = helper.make_tensor_value_info("p", dtype, [2, "batch", cols])
    r = helper.make_tensor_value_info("r", dtype, [3, "batch", cols])
    s = helper.make_tensor_value_info("s", dtype, ["batch", 1])
    nodes = [helper.make_node("Mul", ["p", "s"], ["ps"]), helper.make_node("Concat", ["ps", "r"], ["c"], axis=0),
             helper.make_node("Neg", ["c"], ["y"])]
    out = helper.make_tensor_value_info("y", dtype, [5, "batch", cols])
    yield ("concat-first-axis-dynamic-inner", _model(nodes, [p, r, s], [out]),
           lambda f: [-np.concatenate([_f64(f, "p")[0] * _f64(f, "s")[0], _f64(f, "r")[0]], 0)])
