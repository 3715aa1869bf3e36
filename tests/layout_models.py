"""Small models whose elementwise work ends in layout ops (Reshape, Flatten, Squeeze, Unsqueeze,
Transpose), each with an independent float64 numpy reference, for the CPU (plan, fallback,
compile) and GPU (real kernels) tests of layout folding."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

Reference = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "layout", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _split_tail(x: str, y: str, heads: int, head_dim: int, perm: tuple[int, ...], dtype: int,
                seed: int) -> tuple[list, list, Callable[[np.ndarray], np.ndarray]]:
    """Nodes, initializers and float64 reference of one projection tail, `x` → `y`: bias Add,
    Reshape to [b, s, heads, head_dim] through a shape computed at run time (Shape → Gather →
    Concat), Transpose by `perm`."""
    def n(t: str) -> str:
        return f"{y}_{t}"

    nodes = [
        helper.make_node("Add", [x, n("bias")], [n("t")]),
        helper.make_node("Shape", [x], [n("shape")]),
        helper.make_node("Gather", [n("shape"), n("i0")], [n("b")], axis=0),
        helper.make_node("Gather", [n("shape"), n("i1")], [n("s")], axis=0),
        helper.make_node("Concat", [n("b"), n("s"), n("hd")], [n("target")], axis=0),
        helper.make_node("Reshape", [n("t"), n("target")], [n("view")], allowzero=1),
        helper.make_node("Transpose", [n("view")], [y], perm=list(perm)),
    ]
    bias = np.random.default_rng(seed).standard_normal(heads * head_dim).astype(helper.tensor_dtype_to_np_dtype(dtype))
    inits = [numpy_helper.from_array(bias, n("bias")), _i64(n("i0"), [0]), _i64(n("i1"), [1]),
             _i64(n("hd"), [heads, head_dim])]

    def ref(v: np.ndarray) -> np.ndarray:
        t = v.astype(np.float64) + bias.astype(np.float64)
        return t.reshape(t.shape[0], t.shape[1], heads, head_dim).transpose(perm)

    return nodes, inits, ref


def _heads_shape(heads: int, head_dim: int, perm: tuple[int, ...]) -> list:
    return [["batch", "seq", heads, head_dim][p] for p in perm]


def attention_split(heads: int, head_dim: int, perm: tuple[int, ...], dtype: int = TP.FLOAT) -> tuple[onnx.ModelProto, Reference]:
    """BERT's projection tail as torch.onnx writes it (`_split_tail`)."""
    x = helper.make_tensor_value_info("x", dtype, ["batch", "seq", heads * head_dim])
    nodes, inits, tail = _split_tail("x", "y", heads, head_dim, perm, dtype, seed=1)
    model = _model(nodes, [x], [helper.make_tensor_value_info("y", dtype, _heads_shape(heads, head_dim, perm))], inits)
    return model, lambda f: [tail(f["x"])]


QKV_PERMS = ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3))  # BERT's query, key (transposed), value


def attention_projections(heads: int, head_dim: int, dtype: int = TP.FLOAT,
                          perms: tuple[tuple[int, ...], ...] = QKV_PERMS) -> tuple[onnx.ModelProto, Reference]:
    """Independent projection tails over one [batch, seq, hidden] space (inputs q0, q1, …),
    one per permutation: BERT's Q, K and V, which kernel packing runs as one launch."""
    nodes, inits, tails, ins, outs = [], [], [], [], []
    for j, perm in enumerate(perms):
        ns, its, tail = _split_tail(f"q{j}", f"y{j}", heads, head_dim, perm, dtype, seed=j + 1)
        nodes += ns
        inits += its
        tails.append(tail)
        ins.append(helper.make_tensor_value_info(f"q{j}", dtype, ["batch", "seq", heads * head_dim]))
        outs.append(helper.make_tensor_value_info(f"y{j}", dtype, _heads_shape(heads, head_dim, perm)))
    return _model(nodes, ins, outs, inits), lambda f: [t(f[f"q{j}"]) for j, t in enumerate(tails)]


def layout_models(cols: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for each kind of layout tail over rows of `cols` elements
    (`cols` even); the batch dim stays symbolic."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    half = cols // 2
    yield ("attention-q", *attention_split(2, half, (0, 2, 1, 3), dtype))
    yield ("attention-k", *attention_split(2, half, (0, 2, 3, 1), dtype))

    # Split, transpose, merge: [b, cols, 3] → [b, 2, half, 3] → [b, 3, 2, half] → [b, 3, cols]
    x = helper.make_tensor_value_info("x", dtype, ["batch", cols, 3])
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]),
             helper.make_node("Reshape", ["t", "s1"], ["u"]),
             helper.make_node("Transpose", ["u"], ["v"], perm=[0, 3, 1, 2]),
             helper.make_node("Reshape", ["v", "s2"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2, npd), "two"), _i64("s1", [0, 2, half, 3]), _i64("s2", [0, 3, cols])]
    yield ("split-transpose-merge",
           _model(nodes, [x], [helper.make_tensor_value_info("y", dtype, ["batch", 3, cols])], inits),
           lambda f: [(f["x"].astype(np.float64) * 2).reshape(-1, 2, half, 3).transpose(0, 3, 1, 2).reshape(-1, 3, cols)])

    # Three outputs: the value itself, its Transpose flattened, and a Squeeze → Transpose →
    # Unsqueeze of an inner value.
    x = helper.make_tensor_value_info("x", dtype, ["batch", 1, cols])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Transpose", ["n"], ["nt"], perm=[0, 2, 1]),
             helper.make_node("Flatten", ["nt"], ["flat"], axis=1),
             helper.make_node("Squeeze", ["r", "ax1"], ["sq"]),
             helper.make_node("Transpose", ["sq"], ["tq"]),
             helper.make_node("Unsqueeze", ["tq", "ax2"], ["col"])]
    outs = [helper.make_tensor_value_info("n", dtype, ["batch", 1, cols]),
            helper.make_tensor_value_info("flat", dtype, ["batch", cols]),
            helper.make_tensor_value_info("col", dtype, [cols, "batch", 1])]

    def flat_ref(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        r = np.maximum(f["x"].astype(np.float64), 0)
        b = r.shape[0]
        return [-r, (-r).transpose(0, 2, 1).reshape(b, cols), r.reshape(b, cols).T[:, :, None]]

    yield ("transpose-flatten-squeeze-unsqueeze", _model(nodes, [x], outs, [_i64("ax1", [1]), _i64("ax2", [2])]),
           flat_ref)

    # Transpose with the default (reversed) permutation: [3, b, cols] → [cols, b, 3].
    x = helper.make_tensor_value_info("x", dtype, [3, "batch", cols])
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Transpose", ["t"], ["y"])]
    yield ("transpose-reversed",
           _model(nodes, [x], [helper.make_tensor_value_info("y", dtype, [cols, "batch", 3])]),
           lambda f: [np.tanh(f["x"].astype(np.float64)).transpose()])
