"""A wrong kernel is caught whatever the model's depth: a 1e-3 relative error planted in one
fused group (its fallback's output scaled by 1 + 1e-3, which is what runs on the CPU) is found
and that group alone is left to ONNX Runtime, in a 100-convolution residual CNN and in a BERT
export, while the same models without the planted error keep every group. The envelope that
lets deep networks' rounding through (verify.py) must not let this through."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from onnxstitch import rewrite

from .stitching import fresh_seed

PLANTED = 1e-3
SMALL_BERT = "models/small/bert-base-float32.onnx"


def deep_cnn(blocks: int = 50, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """A residual CNN of `blocks` blocks (Conv → BatchNorm → ReLU → Conv → BatchNorm → + input →
    ReLU): 2 × blocks convolutions, random weights scaled to keep activations O(1)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for b in range(blocks):
        h = x
        for j in range(2):
            p = f"b{b}c{j}"
            w = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
            inits += [numpy_helper.from_array(w, f"{p}.w")]
            inits += [numpy_helper.from_array(v.astype(np.float32), f"{p}.{k}") for k, v in
                      (("s", 1 + 0.1 * rng.standard_normal(channels)), ("b", 0.1 * rng.standard_normal(channels)),
                       ("m", 0.1 * rng.standard_normal(channels)), ("v", 1 + 0.1 * rng.random(channels)))]
            nodes.append(helper.make_node("Conv", [h, f"{p}.w"], [f"{p}.conv"], pads=[1, 1, 1, 1]))
            nodes.append(helper.make_node("BatchNormalization", [f"{p}.conv", f"{p}.s", f"{p}.b", f"{p}.m", f"{p}.v"],
                                          [f"{p}.bn"]))
            if j == 0:
                nodes.append(helper.make_node("Relu", [f"{p}.bn"], [f"{p}.out"]))
                h = f"{p}.out"
        nodes.append(helper.make_node("Add", [f"b{b}c1.bn", x], [f"b{b}.sum"]))
        nodes.append(helper.make_node("Relu", [f"b{b}.sum"], [f"b{b}.out"]))
        x = f"b{b}.out"
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", channels, 12, 12])],
                              [helper.make_tensor_value_info(x, TP.FLOAT, ["N", channels, 12, 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def plant(monkeypatch: pytest.MonkeyPatch, group: str, factor: float = 1 + PLANTED) -> None:
    """Scale the first output of `group`'s fallback body (what runs on the CPU) by `factor`."""
    real = rewrite._function

    def planted(model, graph, grp):
        fn = real(model, graph, grp)
        if grp.name == group:
            out = fn.output[0]
            for n in fn.node:
                n.output[:] = [t + "~raw" if t == out else t for t in n.output]
            fn.node.extend([helper.make_node("Constant", [], [out + "~k"], value=numpy_helper.from_array(
                                np.array(factor, np.float32))),
                            helper.make_node("Mul", [out + "~raw", out + "~k"], [out])])
        return fn

    monkeypatch.setattr(rewrite, "_function", planted)


def _check(monkeypatch: pytest.MonkeyPatch, model, shapes: dict, pick, factor: float = 1 + PLANTED,
           **options) -> None:
    clean = onnxstitch.optimize(model, shapes=shapes, seed=fresh_seed(), **options)
    groups = clean.report.plan.groups
    assert not clean.report.dropped and clean.report.verification.tensors_checked > 0
    target = pick(groups)
    plant(monkeypatch, target.name, factor)
    res = onnxstitch.optimize(model, shapes=shapes, seed=fresh_seed(), **options)
    assert [d["group"] for d in res.report.dropped] == [target.name], res.report.dropped
    assert "on its own inputs" in res.report.dropped[0]["reason"]
    kept = [n.overload for n in res.model.graph.node if n.op_type == "FusedKernel"]
    assert len(kept) == len(groups) - 1 and target.name not in kept


def test_a_planted_error_is_found_in_a_100_convolution_cnn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without conv epilogues the groups are float32 elementwise work (BatchNorm, residual,
    ReLU), held to float32's rounding: 1e-3 is found."""
    model = deep_cnn()
    assert sum(n.op_type == "Conv" for n in model.graph.node) == 100
    _check(monkeypatch, model, {"N": [2]}, lambda groups: groups[len(groups) // 2], epilogues=False)


def test_a_planted_error_is_found_in_a_conv_group_between_nhwc_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """With conv epilogues (the default) every block is a conv group whose output stays NHWC for
    the next: verification compares it in NCHW, and an error beyond TF32's rounding (conv groups
    round like stock ORT's TF32 convolutions: verify.TF32_TOLERANCE, so 1e-3 is within it) in the
    middle of the chain is found and that group left to ONNX Runtime — with its chain (linked
    groups go together)."""
    from onnxstitch import verify

    model = deep_cnn(blocks=10)
    factor = 1 + 3 * verify.TF32_TOLERANCE
    clean = onnxstitch.optimize(model, shapes={"N": [2]}, seed=fresh_seed())
    convs = [g for g in clean.report.plan.groups if g.scheme == "conv"]
    assert len(convs) == 20 and not clean.report.dropped
    assert clean.report.verification.tensors_checked >= len(convs)  # each group's output, NHWC ones too
    target = convs[len(convs) // 2]
    plant(monkeypatch, target.name, factor)
    res = onnxstitch.optimize(model, shapes={"N": [2]}, seed=fresh_seed())
    dropped = [d["group"] for d in res.report.dropped]
    assert target.name in dropped and "on its own inputs" in res.report.dropped[0]["reason"], res.report.dropped
    assert target.name not in {n.overload for n in res.model.graph.node if n.op_type == "FusedKernel"}


def test_a_planted_error_is_found_in_bert(monkeypatch: pytest.MonkeyPatch) -> None:
    model = onnx.load(SMALL_BERT)
    # A row kernel after the first attention kernel (a LayerNorm), where TF32 rounding reaches.
    def after_attention(groups):
        first = next(i for i, g in enumerate(groups) if g.scheme == "attention")
        return next(g for g in groups[first + 1:] if not g.tf32 and g.scheme == "rows")

    _check(monkeypatch, model, {"batch": [2], "sequence": [16]}, after_attention)
