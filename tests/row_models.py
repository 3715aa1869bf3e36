"""Small models of every row operation onnxstitch stitches, each with an independent float64
numpy reference, for the CPU (fallback, compile) and GPU (real kernels) tests."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

Reference = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "rows", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _np_reduce(op: str, x: np.ndarray) -> np.ndarray:
    f = {"ReduceSum": lambda v: v.sum(-1, keepdims=True), "ReduceMean": lambda v: v.mean(-1, keepdims=True),
         "ReduceMax": lambda v: v.max(-1, keepdims=True), "ReduceMin": lambda v: v.min(-1, keepdims=True),
         "ReduceProd": lambda v: v.prod(-1, keepdims=True), "ReduceSumSquare": lambda v: (v * v).sum(-1, keepdims=True),
         "ReduceL1": lambda v: np.abs(v).sum(-1, keepdims=True), "ReduceL2": lambda v: np.sqrt((v * v).sum(-1, keepdims=True))}
    return f[op](x)


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2"]


def row_models(rows: int, cols: int, dtype: int = TP.FLOAT, opset: int = 18) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for each row op, stitched with elementwise work around it."""
    x = helper.make_tensor_value_info("x", dtype, ["batch", cols])
    g = helper.make_tensor_value_info("g", dtype, [cols])
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    for op in REDUCE_OPS:
        # pre-op, reduction, post-op, plus a full-shaped output that uses the reduced value
        as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)  # axes moved from attribute to input
        axes_in = [numpy_helper.from_array(np.array([-1], np.int64), "axes")] if as_input else []
        red = (helper.make_node(op, ["t", "axes"], ["r"], keepdims=1) if as_input
               else helper.make_node(op, ["t"], ["r"], axes=[-1], keepdims=1))
        scale = 0.999 if op == "ReduceProd" else 0.5  # products of many values stay in range
        nodes = [helper.make_node("Mul", ["x", "s"], ["t0"]), helper.make_node("Tanh" if op == "ReduceProd" else "Identity", ["t0"], ["t1"]),
                 helper.make_node("Add", ["t1", "c1"], ["t"]) if op == "ReduceProd" else helper.make_node("Identity", ["t1"], ["t"]),
                 red, helper.make_node("Sub", ["t", "r"], ["y"])]
        inits = axes_in + [numpy_helper.from_array(np.array(scale, npd), "s"), numpy_helper.from_array(np.array(1.0, npd), "c1")]
        model = _model(nodes, [x], [helper.make_tensor_value_info("r", dtype, ["batch", 1]),
                                    helper.make_tensor_value_info("y", dtype, ["batch", cols])], inits, opset)

        def ref(f, op=op, scale=scale):
            t = f["x"].astype(np.float64) * scale
            if op == "ReduceProd":
                t = np.tanh(t) + 1.0
            r = _np_reduce(op, t)
            return [r, t - r]

        yield f"{op}", model, ref
    # Softmax over an attention-like [batch, heads, s, s] with a mask broadcast over heads and rows
    s_in = helper.make_tensor_value_info("s", dtype, ["batch", 2, 3, cols])
    m_in = helper.make_tensor_value_info("m", dtype, ["batch", 1, 1, cols])
    for op in ("Softmax", "LogSoftmax"):
        nodes = [helper.make_node("Mul", ["s", "k"], ["a"]), helper.make_node("Add", ["a", "m"], ["b"]),
                 helper.make_node(op, ["b"], ["p"], axis=-1)]
        model = _model(nodes, [s_in, m_in], [helper.make_tensor_value_info("p", dtype, ["batch", 2, 3, cols])],
                       [numpy_helper.from_array(np.array(0.125, npd), "k")], opset)

        def ref(f, op=op):
            b = f["s"].astype(np.float64) * 0.125 + f["m"].astype(np.float64)
            z = b - b.max(-1, keepdims=True)
            e = np.exp(z)
            return [e / e.sum(-1, keepdims=True) if op == "Softmax" else z - np.log(e.sum(-1, keepdims=True))]

        yield op, model, ref
    # Row offsets over a middle row axis and the outer one but not between: [batch, 1, 3, cols]
    # and [2, 1, cols] against rows [batch, 2, 3].
    e_in = helper.make_tensor_value_info("e", dtype, ["batch", 1, 3, cols])
    h_in = helper.make_tensor_value_info("h", dtype, [2, 1, cols])
    nodes = [helper.make_node("Add", ["s", "e"], ["a"]), helper.make_node("Mul", ["a", "h"], ["b"]),
             helper.make_node("Softmax", ["b"], ["p"], axis=-1)]
    model = _model(nodes, [s_in, e_in, h_in], [helper.make_tensor_value_info("p", dtype, ["batch", 2, 3, cols])],
                   None, opset)

    def gapped(f):
        b = (f["s"].astype(np.float64) + f["e"].astype(np.float64)) * f["h"].astype(np.float64)
        e = np.exp(b - b.max(-1, keepdims=True))
        return [e / e.sum(-1, keepdims=True)]

    yield "Softmax-gapped-broadcast", model, gapped
    # LayerNormalization (opset 17 op) with residual add before and GELU-ish after
    if opset >= 17:
        for with_bias in (True, False):
            ins = ["h", "g"] + (["bb"] if with_bias else [])
            nodes = [helper.make_node("Add", ["x", "x2"], ["h"]),
                     helper.make_node("LayerNormalization", ins, ["ln"], axis=-1, epsilon=1e-5),
                     helper.make_node("Relu", ["ln"], ["y"])]
            x2 = helper.make_tensor_value_info("x2", dtype, ["batch", cols])
            bb = helper.make_tensor_value_info("bb", dtype, [cols])
            model = _model(nodes, [x, x2, g] + ([bb] if with_bias else []),
                           [helper.make_tensor_value_info("y", dtype, ["batch", cols])], None, opset)

            def ref(f, with_bias=with_bias):
                h = f["x"].astype(np.float64) + f["x2"].astype(np.float64)
                mu = h.mean(-1, keepdims=True)
                var = ((h - mu) ** 2).mean(-1, keepdims=True)
                y = (h - mu) / np.sqrt(var + 1e-5) * f["g"].astype(np.float64)
                if with_bias:
                    y = y + f["bb"].astype(np.float64)
                return [np.maximum(y, 0)]

            yield f"LayerNormalization{'-bias' if with_bias else ''}", model, ref
    # RMSNorm as exporters write it: Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul
    axes_in = [numpy_helper.from_array(np.array([-1], np.int64), "axes")] if opset >= 18 else []
    mean = (helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1) if opset >= 18
            else helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1))
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]), mean, helper.make_node("Add", ["ms", "eps"], ["v"]),
             helper.make_node("Sqrt", ["v"], ["sd"]), helper.make_node("Reciprocal", ["sd"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["nx"]), helper.make_node("Mul", ["nx", "g"], ["y"])]
    inits = axes_in + [numpy_helper.from_array(np.array(2.0, npd), "two"), numpy_helper.from_array(np.array(1e-6, npd), "eps")]
    model = _model(nodes, [x, g], [helper.make_tensor_value_info("y", dtype, ["batch", cols])], inits, opset)

    def rms(f):
        v = f["x"].astype(np.float64)
        return [v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * f["g"].astype(np.float64)]

    yield "RMSNorm", model, rms


def trailing_models(cols: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for rows made of several trailing axes, keepdims=0, the global
    pools, ReduceLogSumExp, LayerNorm over two axes, opset-11 Softmax and an input that
    broadcasts inside the row."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    x3 = helper.make_tensor_value_info("x", dtype, ["batch", 6, cols])
    axes2 = numpy_helper.from_array(np.array([-2, -1], np.int64), "axes")
    s = numpy_helper.from_array(np.array(0.5, npd), "s")

    def f64(f, k="x"):
        return f[k].astype(np.float64)

    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("ReduceSum", ["t", "axes"], ["r"], keepdims=0),
             helper.make_node("Relu", ["t"], ["y"])]
    yield "ReduceSum-2axes-keepdims0", _model(nodes, [x3], [helper.make_tensor_value_info("r", dtype, ["batch"]),
                                                            helper.make_tensor_value_info("y", dtype, ["batch", 6, cols])],
                                              [axes2, s], 18), \
        lambda f: [(f64(f) * 0.5).sum((-2, -1)), np.maximum(f64(f) * 0.5, 0)]
    w = helper.make_tensor_value_info("w", dtype, [6, 1])
    nodes = [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("ReduceMean", ["t", "axes"], ["m"], keepdims=1),
             helper.make_node("Sub", ["t", "m"], ["y"])]
    yield "ReduceMean-2axes-broadcast-in-row", _model(nodes, [x3, w], [helper.make_tensor_value_info("y", dtype, ["batch", 6, cols])],
                                                      [axes2], 18), \
        lambda f: [(f64(f) * f64(f, "w")) - (f64(f) * f64(f, "w")).mean((-2, -1), keepdims=True)]
    ax1 = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    x2 = helper.make_tensor_value_info("x", dtype, ["batch", cols])
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("ReduceLogSumExp", ["t", "axes"], ["l"], keepdims=1),
             helper.make_node("Sub", ["t", "l"], ["y"])]

    def lse(f):
        t = f64(f) * 0.5
        m = t.max(-1, keepdims=True)
        return [t - (np.log(np.exp(t - m).sum(-1, keepdims=True)) + m)]

    yield "ReduceLogSumExp", _model(nodes, [x2], [helper.make_tensor_value_info("y", dtype, ["batch", cols])], [ax1, s], 18), lse
    x4 = helper.make_tensor_value_info("x", dtype, ["batch", 4, 5, cols])
    for pool, fn in (("GlobalAveragePool", np.mean), ("GlobalMaxPool", np.max)):
        nodes = [helper.make_node("Abs", ["x"], ["t"]), helper.make_node(pool, ["t"], ["p"]),
                 helper.make_node("Sigmoid", ["p"], ["y"])]
        yield pool, _model(nodes, [x4], [helper.make_tensor_value_info("y", dtype, ["batch", 4, 1, 1])], None, 18), \
            (lambda f, fn=fn: [1 / (1 + np.exp(-fn(np.abs(f64(f)), axis=(2, 3), keepdims=True)))])
    g2 = helper.make_tensor_value_info("g", dtype, [6, cols])
    b2 = helper.make_tensor_value_info("bb", dtype, [6, cols])
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]),
             helper.make_node("LayerNormalization", ["t", "g", "bb"], ["y"], axis=-2, epsilon=1e-5)]

    def ln2(f):
        h = f64(f) * 0.5
        mu = h.mean((-2, -1), keepdims=True)
        var = ((h - mu) ** 2).mean((-2, -1), keepdims=True)
        return [(h - mu) / np.sqrt(var + 1e-5) * f64(f, "g") + f64(f, "bb")]

    yield "LayerNormalization-2axes", _model(nodes, [x3, g2, b2], [helper.make_tensor_value_info("y", dtype, ["batch", 6, cols])],
                                             [s], 18), ln2
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=1)]

    def sm2(f):
        t = f64(f) * 0.5
        e = np.exp(t - t.max((1, 2), keepdims=True))
        return [e / e.sum((1, 2), keepdims=True)]

    yield "Softmax-opset11-axis1", _model(nodes, [x3], [helper.make_tensor_value_info("y", dtype, ["batch", 6, cols])], [s], 11), sm2


def dynamic_row_model(dtype: int = TP.FLOAT) -> tuple[onnx.ModelProto, Reference]:
    """Softmax over a symbolic row length: planned at the default length, run at any (rows
    longer than the plan's registers take the loop path)."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    x = helper.make_tensor_value_info("x", dtype, ["batch", "cols"])
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=-1)]

    def ref(f):
        t = f["x"].astype(np.float64) * 0.5
        e = np.exp(t - t.max(-1, keepdims=True))
        return [e / e.sum(-1, keepdims=True)]

    return _model(nodes, [x], [helper.make_tensor_value_info("y", dtype, ["batch", "cols"])],
                  [numpy_helper.from_array(np.array(0.5, npd), "s")], 18), ref


def long_row_model(dtype: int = TP.FLOAT) -> tuple[onnx.ModelProto, Reference]:
    """A residual add, LayerNorm over a symbolic row length and a row-shaped output (the row's
    max, keepdims): per-element and per-row outputs of one kernel, for split rows."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    x, r = (helper.make_tensor_value_info(n, dtype, ["batch", "cols"]) for n in ("x", "r"))
    nodes = [helper.make_node("Add", ["x", "r"], ["t"]), helper.make_node("ReduceMax", ["t", "axes"], ["m"], keepdims=1),
             helper.make_node("ReduceMean", ["t", "axes"], ["mu"], keepdims=1), helper.make_node("Sub", ["t", "mu"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]), helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["y"])]

    def ref(f):
        t = f["x"].astype(np.float64) + f["r"].astype(np.float64)
        mu = t.mean(-1, keepdims=True)
        d = t - mu
        return [d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5), t.max(-1, keepdims=True)]

    outs = [helper.make_tensor_value_info("y", dtype, ["batch", "cols"]), helper.make_tensor_value_info("m", dtype, ["batch", 1])]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes"), numpy_helper.from_array(np.array(1e-5, npd), "eps")]
    return _model(nodes, [x, r], outs, inits, 18), ref


def channel_models(cols: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for the per-channel normalizations over [batch, 4, 5, cols]:
    InstanceNormalization (a row op over axes 2…) and inference BatchNormalization (elementwise),
    each with constant parameters and a neighbour to stitch with."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng()
    x = helper.make_tensor_value_info("x", dtype, ["batch", 4, 5, cols])
    y = helper.make_tensor_value_info("y", dtype, ["batch", 4, 5, cols])
    scale, bias = rng.standard_normal(4), rng.standard_normal(4)
    inits = [numpy_helper.from_array(scale.astype(npd), "scale"), numpy_helper.from_array(bias.astype(npd), "bias"),
             numpy_helper.from_array(np.array(0.5, npd), "s")]
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]),
             helper.make_node("InstanceNormalization", ["t", "scale", "bias"], ["n"], epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    sc, bc = scale.astype(npd).astype(np.float64).reshape(4, 1, 1), bias.astype(npd).astype(np.float64).reshape(4, 1, 1)

    def inorm(f):
        t = f["x"].astype(np.float64) * 0.5
        mu = t.mean((2, 3), keepdims=True)
        var = ((t - mu) ** 2).mean((2, 3), keepdims=True)
        return [np.maximum((t - mu) / np.sqrt(var + 1e-5) * sc + bc, 0)]

    yield "InstanceNormalization", _model(nodes, [x], [y], inits, 18), inorm
    mean, var = rng.standard_normal(4), 0.5 + rng.random(4)
    inits = [numpy_helper.from_array(v.astype(npd), k) for k, v in
             (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))]
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    mc, vc = (v.astype(npd).astype(np.float64).reshape(4, 1, 1) for v in (mean, var))

    def bnorm(f):
        return [np.maximum((f["x"].astype(np.float64) - mc) / np.sqrt(vc + 1e-3) * sc + bc, 0)]

    yield "BatchNormalization", _model(nodes, [x], [y], inits, 18), bnorm


def arg_models(cols: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for ArgMax/ArgMin over the last axis after Floor(2x), which makes
    ties common: keepdims both ways, first and last index on ties."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    x = helper.make_tensor_value_info("x", dtype, ["batch", 3, cols])
    for op in ("ArgMax", "ArgMin"):
        for keep in (1, 0):
            for last in (0, 1):
                nodes = [helper.make_node("Mul", ["x", "two"], ["t0"]), helper.make_node("Floor", ["t0"], ["t"]),
                         helper.make_node(op, ["t"], ["i"], axis=-1, keepdims=keep, select_last_index=last)]
                shape = ["batch", 3] + ([1] if keep else [])
                model = _model(nodes, [x], [helper.make_tensor_value_info("i", TP.INT64, shape)],
                               [numpy_helper.from_array(np.array(2.0, npd), "two")], 18)

                def ref(f, op=op, keep=keep, last=last):
                    t = np.floor(f["x"].astype(np.float64) * 2)
                    fn = np.argmax if op == "ArgMax" else np.argmin
                    idx = (t.shape[-1] - 1 - fn(t[..., ::-1], axis=-1)) if last else fn(t, axis=-1)
                    return [idx[..., None] if keep else idx]

                yield f"{op}-keep{keep}-last{last}", model, ref


def many_input_rows(n: int, cols: int, dtype: int = TP.FLOAT) -> tuple[onnx.ModelProto, Reference]:
    """x0 + x1 + … + x{n-1} → Softmax over rows of `cols`: a row group with many per-element
    inputs (register budget: prefetch and the register path give way to the loop path). The
    reference rounds the partial sums named in `written` (a1, a2, …) to the model's dtype, as
    the model declares them: where a plan writes one between two kernels, it is rounded there."""
    ins = [helper.make_tensor_value_info(f"x{j}", dtype, ["batch", cols]) for j in range(n)]
    nodes, prev = [], "x0"
    for j in range(1, n):
        nodes.append(helper.make_node("Add", [prev, f"x{j}"], [f"a{j}"]))
        prev = f"a{j}"
    nodes.append(helper.make_node("Softmax", [prev], ["y"], axis=-1))
    model = _model(nodes, ins, [helper.make_tensor_value_info("y", dtype, ["batch", cols])])

    npd = helper.tensor_dtype_to_np_dtype(dtype)

    def ref(f, written: frozenset[str] = frozenset()):
        t = f["x0"].astype(np.float64)
        for j in range(1, n):
            t = t + f[f"x{j}"].astype(np.float64)
            if f"a{j}" in written:
                t = t.astype(npd).astype(np.float64)
        e = np.exp(t - t.max(-1, keepdims=True))
        return [e / e.sum(-1, keepdims=True)]

    return model, ref


def group_norm_models(channels: int, groups: int, spatial: tuple[int, ...], dtype: int = TP.FLOAT
                      ) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for GroupNorm followed by SiLU over [batch, channels, *spatial]:
    as torch.onnx writes it (Reshape → InstanceNormalization → Reshape(Shape(x)) → Mul → Add),
    the same with the normalized tensor also a graph output (it must be materialized), and
    ONNX's GroupNormalization-21."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng()
    dims = ["batch", channels, *spatial]
    x = helper.make_tensor_value_info("x", dtype, dims)
    ones = [1] * len(spatial)
    gamma, beta = (rng.standard_normal(channels).astype(npd) for _ in range(2))
    eps = 1e-5

    def reference(gc: np.ndarray, bc: np.ndarray, both: bool = False) -> Reference:
        def ref(f):
            v = f["x"].astype(np.float64)
            t = v.reshape(v.shape[0], groups, -1)
            mu = t.mean(-1, keepdims=True)
            var = ((t - mu) ** 2).mean(-1, keepdims=True)
            shape = (channels, *ones)
            gn = ((t - mu) / np.sqrt(var + eps)).reshape(v.shape) * gc.astype(np.float64).reshape(shape) + \
                bc.astype(np.float64).reshape(shape)
            silu = gn / (1 + np.exp(-gn))
            return [silu, gn] if both else [silu]
        return ref

    silu = [helper.make_node("Sigmoid", ["gn"], ["sg"]), helper.make_node("Mul", ["gn", "sg"], ["y"])]
    out = helper.make_tensor_value_info("y", dtype, dims)
    inits = [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "grouped"),
             numpy_helper.from_array(np.ones(groups, npd), "ones"), numpy_helper.from_array(np.zeros(groups, npd), "zeros"),
             numpy_helper.from_array(gamma.reshape(channels, *ones), "gamma"),
             numpy_helper.from_array(beta.reshape(channels, *ones), "beta")]
    torch_like = [helper.make_node("Reshape", ["x", "grouped"], ["r"]),
                  helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["inorm"], epsilon=eps),
                  helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Reshape", ["inorm", "xs"], ["back"]),
                  helper.make_node("Mul", ["back", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["gn"])]
    yield "exported", _model(torch_like + silu, [x], [out], inits, 17), reference(gamma, beta)
    both = [out, helper.make_tensor_value_info("gn", dtype, dims)]
    yield "exported-two-outputs", _model(torch_like + silu, [x], both, inits, 17), reference(gamma, beta, True)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["gn"], num_groups=groups, epsilon=eps)
    params = [numpy_helper.from_array(gamma, "s"), numpy_helper.from_array(beta, "b")]
    yield "GroupNormalization", _model([node] + silu, [x], [out], params, 21), reference(gamma, beta)


def column_models(length: int, inner: int, dtype: int = TP.FLOAT) -> Iterator[tuple[str, onnx.ModelProto, Reference]]:
    """(id, model, reference) for reductions over a run of axes followed by others (column
    reductions): Softmax over axis 1 of [batch, length, inner], a weighted ReduceSum dropping
    axis 1, LayerNorm over the channels of [batch, length, inner] as exporters write it, YOLO's
    distribution focal loss decode (Softmax over axis 2 of [batch, 4, length, inner], weighted
    by the bin positions, summed away), ArgMax over axis 1, and ReduceMax over two middle axes."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng()
    f64 = lambda f, k="x": f[k].astype(np.float64)  # noqa: E731
    x = helper.make_tensor_value_info("x", dtype, ["batch", length, inner])
    half = numpy_helper.from_array(np.array(0.5, npd), "s")
    axis1 = numpy_helper.from_array(np.array([1], np.int64), "axes")
    w = rng.standard_normal((length, 1)).astype(npd)
    out = lambda dims, t=dtype: helper.make_tensor_value_info("y", t, dims)  # noqa: E731

    def softmax(t, axis):
        e = np.exp(t - t.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=1)]
    yield "Softmax-axis1", _model(nodes, [x], [out(["batch", length, inner])], [half], 18), \
        lambda f: [softmax(f64(f) * 0.5, 1)]
    nodes = [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0)]
    yield "ReduceSum-axis1-dropped", _model(nodes, [x], [out(["batch", inner])],
                                            [numpy_helper.from_array(w, "w"), axis1], 18), \
        lambda f: [(f64(f) * w.astype(np.float64)).sum(1)]
    g, b = (rng.standard_normal((length, 1)).astype(npd) for _ in range(2))
    inits = [axis1, numpy_helper.from_array(np.array(2.0, npd), "two"), numpy_helper.from_array(np.array(1e-5, npd), "eps"),
             numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"]), helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]), helper.make_node("ReduceMean", ["d2", "axes"], ["var"]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]

    def channel_norm(f):
        v = f64(f)
        mu = v.mean(1, keepdims=True)
        var = ((v - mu) ** 2).mean(1, keepdims=True)
        return [(v - mu) / np.sqrt(var + 1e-5) * g.astype(np.float64) + b.astype(np.float64)]

    yield "LayerNorm-channels", _model(nodes, [x], [out(["batch", length, inner])], inits, 18), channel_norm
    x4 = helper.make_tensor_value_info("x", dtype, ["batch", 4, length, inner])
    bins = np.arange(length, dtype=npd).reshape(length, 1)
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=2), helper.make_node("Mul", ["p", "bins"], ["t"]),
             helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0)]
    yield "DFL-decode", _model(nodes, [x4], [out(["batch", 4, inner])],
                               [numpy_helper.from_array(bins, "bins"), numpy_helper.from_array(np.array([2], np.int64), "axes")],
                               18), \
        lambda f: [(softmax(f64(f), 2) * bins.astype(np.float64)).sum(2)]
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Floor", ["t"], ["u"]),
             helper.make_node("ArgMax", ["u"], ["y"], axis=1, keepdims=1)]
    yield "ArgMax-axis1", _model(nodes, [x], [out(["batch", 1, inner], TP.INT64)],
                                 [numpy_helper.from_array(np.array(2.0, npd), "two")], 18), \
        lambda f: [np.argmax(np.floor(f64(f) * 2), axis=1)[:, None, :].astype(np.int64)]
    x4 = helper.make_tensor_value_info("x", dtype, ["batch", length, 3, inner])
    nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1), helper.make_node("Sub", ["x", "m"], ["y"])]
    yield "ReduceMax-2axes-middle", _model(nodes, [x4], [out(["batch", length, 3, inner])],
                                           [numpy_helper.from_array(np.array([1, 2], np.int64), "axes")], 18), \
        lambda f: [f64(f) - f64(f).max((1, 2), keepdims=True)]
