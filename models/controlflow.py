"""Control-flow models of the forms users bring and no torch exporter writes today (the dynamo
exporter unrolls loops; the TorchScript one needs scripted modules): a GRU encoder as a `Scan`
over time, and greedy decoding as a `Loop` whose body is a GRU decoder step (embedding, cell,
LayerNorm, logits, ArgMax feeding the next step). The cells are written out as MatMul, Split and
elementwise ops, as exporters write an unfused GRU, so their bodies hold work to fuse. Weights
are random with a fixed seed; dims `batch` and `seq` are symbolic.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP, helper, numpy_helper

OPSET = 17
HIDDEN = 256
FEATURES = 128
VOCAB = 1000
STEPS = 32


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _gru_cell(x: str, h: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    """h' = (1 − z) · n + z · h, with z, r, n from x·Wx + bx and h·Wh + bh split in three (the
    weights are outer-scope initializers `{prefix}wx`, `{prefix}bx`, `{prefix}wh`, `{prefix}bh`)."""
    N = helper.make_node
    p = prefix
    return [
        N("MatMul", [x, f"{p}wx"], [f"{p}gx0"]), N("Add", [f"{p}gx0", f"{p}bx"], [f"{p}gx"]),
        N("MatMul", [h, f"{p}wh"], [f"{p}gh0"]), N("Add", [f"{p}gh0", f"{p}bh"], [f"{p}gh"]),
        N("Split", [f"{p}gx", f"{p}thirds"], [f"{p}xz", f"{p}xr", f"{p}xn"], axis=1),
        N("Split", [f"{p}gh", f"{p}thirds"], [f"{p}hz", f"{p}hr", f"{p}hn"], axis=1),
        N("Add", [f"{p}xz", f"{p}hz"], [f"{p}z0"]), N("Sigmoid", [f"{p}z0"], [f"{p}z"]),
        N("Add", [f"{p}xr", f"{p}hr"], [f"{p}r0"]), N("Sigmoid", [f"{p}r0"], [f"{p}r"]),
        N("Mul", [f"{p}r", f"{p}hn"], [f"{p}rh"]), N("Add", [f"{p}xn", f"{p}rh"], [f"{p}n0"]),
        N("Tanh", [f"{p}n0"], [f"{p}n"]),
        N("Sub", [h, f"{p}n"], [f"{p}hmn"]), N("Mul", [f"{p}z", f"{p}hmn"], [f"{p}zh"]),
        N("Add", [f"{p}n", f"{p}zh"], [out]),
    ]


def _gru_weights(rng: np.random.Generator, prefix: str, features: int) -> list[onnx.TensorProto]:
    return [_init(rng, f"{prefix}wx", (features, 3 * HIDDEN), features ** -0.5),
            _init(rng, f"{prefix}bx", (3 * HIDDEN,), 0.1),
            _init(rng, f"{prefix}wh", (HIDDEN, 3 * HIDDEN), HIDDEN ** -0.5),
            _init(rng, f"{prefix}bh", (3 * HIDDEN,), 0.1),
            numpy_helper.from_array(np.array([HIDDEN] * 3, np.int64), f"{prefix}thirds")]


def gru_scan(seed: int = 0) -> onnx.ModelProto:
    """x [batch, seq, 128], h0 [batch, 256] → ys [batch, seq, 256], h [batch, 256]: a GRU layer
    as a Scan over axis 1, then a LayerNormalization of every step's output."""
    rng = np.random.default_rng(seed)
    V = helper.make_tensor_value_info
    body = helper.make_graph(
        _gru_cell("x_t", "h", "h_next", "g_") + [helper.make_node("Identity", ["h_next"], ["y_t"])],
        "gru_step", [V("h", TP.FLOAT, ["batch", HIDDEN]), V("x_t", TP.FLOAT, ["batch", FEATURES])],
        [V("h_next", TP.FLOAT, ["batch", HIDDEN]), V("y_t", TP.FLOAT, ["batch", HIDDEN])])
    nodes = [helper.make_node("Scan", ["h0", "x"], ["h", "ys0"], body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_output_axes=[1]),
             helper.make_node("LayerNormalization", ["ys0", "ln_g", "ln_b"], ["ys"], axis=-1)]
    inits = _gru_weights(rng, "g_", FEATURES) + [
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "ln_g"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "ln_b")]
    graph = helper.make_graph(nodes, "gru_scan",
                              [V("x", TP.FLOAT, ["batch", "seq", FEATURES]), V("h0", TP.FLOAT, ["batch", HIDDEN])],
                              [V("ys", TP.FLOAT, ["batch", "seq", HIDDEN]), V("h", TP.FLOAT, ["batch", HIDDEN])],
                              inits)
    return _finish(graph)


def greedy_loop(seed: int = 0, steps: int = STEPS) -> onnx.ModelProto:
    """tok0 [batch] int64, h0 [batch, 256] → tokens [steps, batch], h [batch, 256]: greedy
    decoding for `steps` steps; each step embeds the last token, runs a GRU cell and a
    LayerNormalization, projects to a 1,000-token vocabulary and takes the ArgMax."""
    rng = np.random.default_rng(seed)
    V = helper.make_tensor_value_info
    N = helper.make_node
    step = [N("Gather", ["emb", "tok"], ["e"], axis=0)] + _gru_cell("e", "h", "h_next", "d_") + [
        N("LayerNormalization", ["h_next", "ln_g", "ln_b"], ["hn"], axis=-1),
        N("MatMul", ["hn", "wo"], ["logits0"]), N("Add", ["logits0", "bo"], ["logits"]),
        N("ArgMax", ["logits"], ["tok_next"], axis=-1, keepdims=0),
        N("Identity", ["cond_in"], ["cond_out"]), N("Identity", ["tok_next"], ["tok_out"])]
    body = helper.make_graph(
        step, "decode_step",
        [V("i", TP.INT64, []), V("cond_in", TP.BOOL, []), V("tok", TP.INT64, ["batch"]),
         V("h", TP.FLOAT, ["batch", HIDDEN])],
        [V("cond_out", TP.BOOL, []), V("tok_next", TP.INT64, ["batch"]), V("h_next", TP.FLOAT, ["batch", HIDDEN]),
         V("tok_out", TP.INT64, ["batch"])])
    inits = _gru_weights(rng, "d_", FEATURES) + [
        _init(rng, "emb", (VOCAB, FEATURES), 1.0),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "ln_g"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "ln_b"),
        _init(rng, "wo", (HIDDEN, VOCAB), HIDDEN ** -0.5), _init(rng, "bo", (VOCAB,), 0.1),
        numpy_helper.from_array(np.array(steps, np.int64), "steps"),
        numpy_helper.from_array(np.array(True), "keep_going")]
    graph = helper.make_graph(
        [N("Loop", ["steps", "keep_going", "tok0", "h0"], ["tok_last", "h", "tokens"], body=body)],
        "greedy_loop", [V("tok0", TP.INT64, ["batch"]), V("h0", TP.FLOAT, ["batch", HIDDEN])],
        [V("tokens", TP.INT64, [steps, "batch"]), V("h", TP.FLOAT, ["batch", HIDDEN])], inits)
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnxstitch-models")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
