"""Forms that real exporters write and that broke optimize on models nobody here built
(issue 19): dead nodes (torch.onnx's TorchScript exporter), dim_value -1 and unnamed dims
(paddle2onnx), fused producers read only inside an If branch, CNNs whose small verification
sizes do not run, the newest opsets, and several groups wrong at once."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper, numpy_helper, parser

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import rewrite, verify
from onnxstitch.cli.main import main
from onnxstitch.errors import BadInputError
from onnxstitch.inputs import input_shapes, random_feeds
from onnxstitch.sessions import Runner

from .stitching import assert_close, fresh_seed


def _matmul_chain(groups: int) -> onnx.ModelProto:
    """x → [elementwise group → MatMul] × (groups − 1) → elementwise group: `groups` groups
    that MatMuls (left to ONNX Runtime) keep apart."""
    ops = ["Sigmoid", "Tanh", "Relu", "Exp", "Neg"]
    lines, t = ["a0 = Mul(x, x)"], "a0"
    for k in range(groups):
        lines.append(f"e{k} = {ops[k % len(ops)]}({t})")
        t = f"e{k}"
        if k < groups - 1:
            lines += [f"m{k} = MatMul({t}, w)", f"s{k} = Add({t}, m{k})"]
            t = f"s{k}"
    lines.append(f"z = Identity({t})")
    body = "\n  ".join(lines)
    return parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 16] x, float[16, 16] w) => (float[B, 16] z) {{
  {body}
}}""")


def _same_outputs(original: onnx.ModelProto, stitched: onnx.ModelProto, dims: dict) -> None:
    feeds = random_feeds(original, fresh_seed(), dims)
    for a, b in zip(run_cpu(stitched, feeds), run_cpu(original, feeds)):
        assert_close(a, b)


def test_dead_nodes_are_refused_not_fused_into_a_group_without_outputs() -> None:
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 16] x) => (float[N, 16] y) {
  a = Add(x, x)
  b = Relu(a)
  c = Sigmoid(x)
  y = Tanh(c)
}""")
    res = onnxstitch.optimize(model)
    assert [len(g.nodes) for g in res.report.plan.groups] == [2]  # Sigmoid → Tanh; Add → Relu is dead
    assert any("dead code" in r.reason for r in res.report.plan.rejections) or \
        all("Add" not in lbl for g in res.report.plan.groups for lbl in g.labels)
    onnx.checker.check_model(res.model, full_check=True)
    _same_outputs(model, res.model, {"N": 3})


def _paddle_like(dims: list) -> onnx.ModelProto:
    """x[-1, 8] as paddle2onnx writes a dynamic batch, or with an unnamed dim."""
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8])
    d = x.type.tensor_type.shape.dim[0]
    d.Clear()
    if dims[0] is not None:
        d.dim_value = dims[0]
    y = helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("Tanh", ["m"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 12)],
                             ir_version=7)


@pytest.mark.parametrize("dim", [-1, None], ids=["minus-one", "unnamed"])
def test_dynamic_dims_as_exporters_write_them_take_shapes(dim) -> None:
    model = _paddle_like([dim])
    assert input_shapes(model, {"x_dim0": 5}) == {"x": (5, 8)}
    res = onnxstitch.optimize(model, shapes={"x": [32, 8]})
    assert res.report.dim_values == {"x_dim0": 32} and res.report.plan.groups
    d = res.model.graph.input[0].type.tensor_type.shape.dim[0]
    assert d.dim_param == "x_dim0"  # the stitched model stays dynamic there
    _same_outputs(model, res.model, {"x_dim0": 7})


def test_question_mark_dims_are_each_their_own_size() -> None:
    """Older paddle2onnx writes every dynamic dim as "?" (PP-OCRv3: x [-1, 3, "?", "?"]). They
    are placeholders, not one size: height and width get names of their own, take --shape each,
    and the stitched model runs where they differ."""
    x = helper.make_tensor_value_info("x", TP.FLOAT, [None, 3, "?", "?"])
    x.type.tensor_type.shape.dim[0].dim_value = -1
    y = helper.make_tensor_value_info("y", TP.FLOAT, [None, 3, "?", "?"])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("Tanh", ["m"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 12)],
                              ir_version=7)
    assert input_shapes(model, {"x_dim0": 2, "x_dim2": 5, "x_dim3": 9}) == {"x": (2, 3, 5, 9)}
    res = onnxstitch.optimize(model, shapes={"x": [2, 3, 24, 40]})
    assert res.report.dim_values == {"x_dim0": 2, "x_dim2": 24, "x_dim3": 40} and res.report.plan.groups
    dims = [d.dim_param for d in res.model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["x_dim0", "", "x_dim2", "x_dim3"]
    _same_outputs(model, res.model, {"x_dim0": 1, "x_dim2": 6, "x_dim3": 11})


def test_a_parameter_shaped_by_a_tensor_the_group_makes_closes_no_cycle() -> None:
    """PP-OCRv3's recognizer reshapes each LayerNorm's scale to Shape(x)[-1:], x the residual sum
    the LayerNorm normalizes: the group {Add, LayerNorm} would make x and read the Reshape that
    waits for it. The plan must see that shape read (plan.contract) and not take that group."""
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 16] a, float[N, 16] b) => (float[N, 16] y) {
  x = Add(a, b)
  s = Shape(x)
  start = Constant<value = int64[1] {-1}>()
  end = Constant<value = int64[1] {2}>()
  last = Slice(s, start, end)
  w = Constant<value = float[16] {1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8}>()
  scale = Reshape(w, last)
  n = LayerNormalization<axis = -1>(x, scale)
  y = Tanh(n)
}""")
    res = onnxstitch.optimize(model, shapes={"N": [8]})
    assert res.report.plan.groups
    onnx.checker.check_model(res.model, full_check=True)
    _same_outputs(model, res.model, {"N": 5})


def test_fused_producer_of_a_tensor_read_only_in_a_branch_comes_before_the_if() -> None:
    # The group {Sigmoid, Mul} is placed at the Sigmoid and must wait for the MatMul; the If
    # reads the Sigmoid's output only inside its branch, yet must still come after the group.
    out = helper.make_tensor_value_info("o", TP.FLOAT, [4, 8])
    # The branch also reads a constant nothing else reads (silero-vad's STFT basis).
    then = helper.make_graph([helper.make_node("Add", ["a", "k"], ["o"])], "then", [], [out])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["o"])], "else", [], [out])
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full(8, 0.5, np.float32))),
             helper.make_node("Sigmoid", ["x"], ["a"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("MatMul", ["x", "w"], ["r"]),
             helper.make_node("Mul", ["a", "r"], ["t"]), helper.make_node("Tanh", ["t"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [4, 8]),
                                       helper.make_tensor_value_info("c", TP.BOOL, [])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [4, 8]),
                           helper.make_tensor_value_info("z", TP.FLOAT, [4, 8])],
                          [numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    res = onnxstitch.optimize(model)
    assert [len(grp.nodes) for grp in res.report.plan.groups] == [3]
    onnx.checker.check_model(res.model, full_check=True)
    order = [n.op_type for n in res.model.graph.node]
    assert order.index("FusedKernel") < order.index("If")
    _same_outputs(model, res.model, {})


def _strided_cnn() -> onnx.ModelProto:
    """Two stride-2 3×3 convolutions: the original needs height and width ≥ 7 to run."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["c2"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]), helper.make_node("Sigmoid", ["p"], ["ps"]),
             helper.make_node("Mul", ["c2", "ps"], ["y"])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8, "h", "w"])], [w1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_cnn_whose_small_sizes_do_not_run_is_verified_at_the_planning_sizes() -> None:
    model = _strided_cnn()
    res = onnxstitch.optimize(model)
    v = res.report.verification
    assert v is not None and not v.skipped and v.tensors_checked > 0 and not res.report.dropped
    assert any(n.op_type == "FusedKernel" for n in res.model.graph.node)


def test_a_model_verification_cannot_run_is_written_unchanged(tmp_path) -> None:
    # 5 × 5 images cannot pass two stride-2 3×3 convolutions: no size verification tries runs.
    model = _strided_cnn()
    x = model.graph.input[0].type.tensor_type.shape
    for d, v in zip(x.dim[2:], (5, 5)):
        d.Clear()
        d.dim_value = v
    res = onnxstitch.optimize(model, shapes={"N": [2]})
    assert res.report.dropped and all("cannot run the original" in d["reason"] for d in res.report.dropped)
    assert not any(n.op_type == "FusedKernel" for n in res.model.graph.node)
    with pytest.raises(verify.CannotVerify, match="--no-verify"):
        onnxstitch.optimize(model, shapes={"N": [2]}, strict=True)
    # The CLI says the reason once, with how many groups it left to ONNX Runtime.
    path = tmp_path / "cnn.onnx"
    onnx.save(model, str(path))
    res = CliRunner().invoke(main, ["optimize", str(path), "--shape", "N=2", "-o", str(tmp_path / "s.onnx")],
                             terminal_width=400)
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("left to ONNX Runtime")]
    groups = len({d["group"] for d in onnxstitch.optimize(model, shapes={"N": [2]}).report.dropped})
    assert len(lines) == 1 and (groups == 1 or f"({groups} groups)" in lines[0]), res.output


def test_a_model_onnx_runtime_cannot_load_is_named_bad_input(tmp_path) -> None:
    # TorchScript's float16 export of BERT-like encoders with SDPA and a mask (torch 2.13):
    # LayerNormalization of a float32 input with float16 scale and bias. ORT refuses the model at
    # load, whatever the sizes: a fault of the model, exit status 2, the file and node named.
    model = parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float16[B, 8] x) => (float16[B, 8] y) {
            xf = Cast<to = 1>(x)
            s = Add(xf, xf)
            t = Mul(s, xf)
            n = LayerNormalization<axis = -1>(t, scale, bias)
            y = Relu(n)
        }""")
    model.graph.initializer.extend([numpy_helper.from_array(np.ones(8, np.float16), "scale"),
                                    numpy_helper.from_array(np.zeros(8, np.float16), "bias")])
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    with pytest.raises(BadInputError, match=r"model\.onnx: ONNX Runtime cannot load the model as given .*LayerNorm"):
        onnxstitch.optimize(str(path), shapes={"B": [4]})
    from click.testing import CliRunner

    from onnxstitch.cli.main import main
    got = CliRunner().invoke(main, ["optimize", str(path), "--shape", "B=4"])
    assert got.exit_code == 2 and "cannot load the model as given" in got.output


def test_every_group_wrong_on_its_own_inputs_is_dropped_in_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _matmul_chain(3)
    names = [g.name for g in onnxstitch.optimize(model, verify=False).report.plan.groups]
    assert len(names) == 3
    wrong = {names[0], names[2]}
    real = rewrite._function

    def corrupt(m, graph, grp):
        fn = real(m, graph, grp)
        if grp.name in wrong:
            for node in fn.node:
                if node.op_type in ("Add", "Mul"):
                    node.op_type = "Sub"
        return fn

    monkeypatch.setattr(rewrite, "_function", corrupt)
    runs = []
    monkeypatch.setattr(verify, "_compare_runs", lambda *a, _real=verify._compare_runs, **k: runs.append(1) or _real(*a, **k))
    res = onnxstitch.optimize(model)
    assert {d["group"] for d in res.report.dropped} == wrong
    assert len(runs) == 2  # one run finds both, one run passes the rest
    assert [n.overload for n in res.model.graph.node if n.op_type == "FusedKernel"] == [names[1]]
    _same_outputs(model, res.model, {"B": 5})


def test_a_group_that_inherits_rounding_from_upstream_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first group is off by 3e-5 absolute on values near 0.5 (within float32's tolerance on
    # its own); the second cancels the 0.5 and so fails end to end, but is right on its inputs.
    eye = numpy_helper.from_array(np.eye(64, dtype=np.float32), "eye")
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 64] x) => (float[B, 64] z) {
  a = Mul(x, x)
  t = Constant<value = float {0.1}>()
  a2 = Mul(a, t)
  b = Sigmoid(a2)
  m = MatMul(b, eye)
  h = Constant<value = float {0.5}>()
  c = Sub(m, h)
  k = Constant<value = float {1000.0}>()
  z = Mul(c, k)
}""".replace("float[B, 64] x)", "float[B, 64] x, float[64, 64] eye)"))
    model.graph.initializer.append(eye)
    real = rewrite._function

    def perturb(m, graph, grp):
        fn = real(m, graph, grp)
        sig = [n for n in fn.node if n.op_type == "Sigmoid"]
        if sig:
            raw = sig[0].output[0] + "~raw"
            fn.node.extend([helper.make_node("Constant", [], [raw + "~d"], value=numpy_helper.from_array(np.float32(3e-5))),
                            helper.make_node("Add", [raw, raw + "~d"], [sig[0].output[0]])])
            sig[0].output[0] = raw
        return fn

    plan = onnxstitch.optimize(model, verify=False).report.plan
    assert len(plan.groups) == 2
    monkeypatch.setattr(rewrite, "_function", perturb)
    res = onnxstitch.optimize(model)
    assert not res.report.dropped and 1e-4 < res.report.verification.worst_relative_error < verify.ACCUMULATED_TOLERANCE


def test_newest_opsets_are_stitched_and_float_floor_mod_is_refused() -> None:
    model = parser.parse_model("""<ir_version: 11, opset_import: ["" : 28]>
g (float[4, 8] x, float[4, 8] y) => (float[4, 8] z, float[4, 8] r) {
  a = Sigmoid(x)
  z = Mul(a, x)
  m = Mod<fmod = 0>(x, y)
  r = Abs(m)
}""")
    res = onnxstitch.optimize(model, verify=False)
    assert res.report.plan.groups
    assert any("floor modulo" in r.reason for r in res.report.plan.rejections) or \
        all("Mod" not in lbl for g in res.report.plan.groups for lbl in g.labels)


def test_shape_arithmetic_that_ort_keeps_on_the_cpu_is_not_fused() -> None:
    # ORT's CUDA EP runs the integer arithmetic on Shape's output on the CPU; a FusedKernel
    # made of it would be placed there as well, where the library has no kernel.
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 16] x) => (float[M, 16] y) {
  s = Shape(x)
  i = Constant<value = int64[1] {0}>()
  n = Gather(s, i)
  two = Constant<value = int64 {2}>()
  m = Mul(n, two)
  one = Constant<value = int64 {1}>()
  m2 = Add(m, one)
  d = Div(m2, two)
  c = Constant<value = int64[1] {16}>()
  shp = Concat<axis=0>(d, c)
  a = Sigmoid(x)
  b = Mul(a, x)
  y = Reshape(b, shp)
}""")
    from onnxstitch import graph, shapes

    _, infos = shapes.infer(model)
    on_cpu = {model.graph.node[i].output[0] for i in graph.cpu_placed(model.graph, infos)}
    assert on_cpu == {"n", "m", "m2", "d", "shp"}
    res = onnxstitch.optimize(model)
    assert [sorted(lbl.split(" ")[1] for lbl in g.labels) for g in res.report.plan.groups] == [["(Mul)", "(Sigmoid)"]]
    _same_outputs(model, res.model, {"N": 4})


def test_a_failure_no_group_explains_is_bisected_to_one_group(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stitched model as written fails whenever one particular group is in it (as an ORT
    # rewrite around one fused node can): that group alone is left to ONNX Runtime.
    model = _matmul_chain(4)
    names = [g.name for g in onnxstitch.optimize(model, verify=False).report.plan.groups]
    assert len(names) == 4
    culprit = names[2]
    real = Runner.run

    def fails_with_culprit(self, m, stitched, feeds):
        # the model as written exposes no tensor: its outputs are the original's
        if stitched and len(m.graph.output) == len(model.graph.output) and \
                any(n.overload == culprit for n in m.graph.node):
            raise RuntimeError("ORT's rewrite around the fused node fails")
        return real(self, m, stitched, feeds)

    monkeypatch.setattr(Runner, "run", fails_with_culprit)
    res = onnxstitch.optimize(model)
    assert [d["group"] for d in res.report.dropped] == [culprit]
    assert sorted(n.overload for n in res.model.graph.node if n.op_type == "FusedKernel") == sorted(set(names) - {culprit})


def test_ir3_weights_listed_as_inputs_stay_constants() -> None:
    # Before IR 4 every initializer is also a graph input; ORT holds them constant. Raised to
    # the stitched model's IR they would become overridable inputs ORT cannot fold.
    model = _strided_cnn()
    model.ir_version = 3
    model.opset_import[0].version = 9
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    res = onnxstitch.optimize(model, shapes={"N": [2], "H": [32], "W": [32]})
    assert res.model.ir_version >= 4 and any(n.op_type == "FusedKernel" for n in res.model.graph.node)
    assert [i.name for i in res.model.graph.input] == ["x"]
    _same_outputs(model, res.model, {"N": 2, "H": 32, "W": 32})


def test_work_on_constants_alone_is_left_to_ort_constant_folding() -> None:
    # Weight norm as exporters write it (wav2vec2's positional convolution): ‖v‖ and g·v/‖v‖
    # depend on constants only; ORT folds them at session start, a kernel would redo them
    # every run (measured 0.34× on the H100 before this refusal).
    rng = np.random.default_rng(0)
    v = numpy_helper.from_array(rng.standard_normal((8, 4, 16)).astype(np.float32), "v")
    gain = numpy_helper.from_array(rng.standard_normal((1, 1, 16)).astype(np.float32), "gain")
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
g (float[N, 16] x, float[8, 4, 16] v, float[1, 1, 16] gain) => (float[N, 16] y) {
  sq = Mul(v, v)
  s = ReduceSum<keepdims = 1>(sq, axes)
  nrm = Sqrt(s)
  w0 = Div(v, nrm)
  w = Mul(w0, gain)
  ws = ReduceMean<keepdims = 0>(w, axes01)
  a = Mul(x, ws)
  y = Sigmoid(a)
}""")
    del model.graph.input[1:]
    model.graph.initializer.extend([v, gain, numpy_helper.from_array(np.array([0, 1], np.int64), "axes"),
                                    numpy_helper.from_array(np.array([0, 1], np.int64), "axes01")])
    res = onnxstitch.optimize(model)
    labels = [lbl for g in res.report.plan.groups for lbl in g.labels]
    assert labels and all("Mul" in lbl or "Sigmoid" in lbl for lbl in labels)
    assert not any(lbl.startswith(("sq", "s ", "nrm", "w0", "ws")) for lbl in labels)
    assert len(res.report.plan.groups) == 1 and len(res.report.plan.groups[0].nodes) == 2
    _same_outputs(model, res.model, {"N": 3})


def test_a_model_with_external_data_optimizes_from_its_path(tmp_path) -> None:
    # The dynamo exporter writes weights (and small biases) as external data: the large ones
    # stay memory-mapped, the small ones come inline, and the output carries them all.
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((512, 256)).astype(np.float32), "w")  # detached
    bias = numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "bias")  # inline
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 512] x) => (float[N, 256] y) {
  m = MatMul(x, w)
  a = Add(m, bias)
  s = Sigmoid(a)
  y = Mul(a, s)
}""")
    model.graph.initializer.extend([w, bias])
    src = tmp_path / "model.onnx"
    onnx.save(model, str(src), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    res = onnxstitch.optimize(src, shapes={"N": [4]})
    assert res.report.plan.groups and res.report.verification.tensors_checked > 0
    out = tmp_path / "out" / "model.stitched.onnx"
    out.parent.mkdir()
    res.save(out)
    _same_outputs(onnx.load(str(src)), onnx.load(str(out)), {"N": 3})


def test_constants_sliced_and_concatenated_are_folded_by_ort_not_stitched() -> None:
    # silero-vad reorders its LSTM weights with Slice and Concat of initializers: a kernel would
    # copy them on every run. A broadcast of a constant read by live work stays stitchable.
    rng = np.random.default_rng(0)
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) {
  a = Slice(w, s0, s1, ax)
  b = Slice(w, s1, s2, ax)
  r = Concat<axis = 1>(b, a)
  m = MatMul(x, r)
  e = Expand(bias, shp)
  k = Mul(m, e)
  y = Sigmoid(k)
}""")
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bias"),
        *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
          (("s0", [0]), ("s1", [4]), ("s2", [8]), ("ax", [1]), ("shp", [1, 8])))])
    res = onnxstitch.optimize(model, shapes={"N": [16]})
    ops_fused = sorted(lbl.split(" (")[1] for g in res.report.plan.groups for lbl in g.labels)
    assert ops_fused == ["Expand)", "Mul)", "Sigmoid)"], ops_fused
    _same_outputs(model, res.model, {"N": 3})


def test_what_ort_merges_into_a_conv_is_left_to_it() -> None:
    # Conv → per-channel Mul → Add → Relu: ORT folds the Mul and Add into the Conv's weights and
    # fuses the Relu into the convolution; stitched they would cost a kernel after the Conv.
    # What follows (the Sigmoid gate) is still stitched.
    rng = np.random.default_rng(0)
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) {
  c = Conv<pads = [1, 1, 1, 1]>(x, w)
  m = Mul(c, scale)
  a = Add(m, shift)
  r = Relu(a)
  s = Sigmoid(r)
  y = Mul(r, s)
}""")
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "shift")])
    from onnxstitch import graph, shapes

    _, infos = shapes.infer(model)
    merged = graph.conv_epilogues(model.graph, infos, graph.constant_nodes(model.graph))
    assert sorted(model.graph.node[k].output[0] for k in merged) == ["a", "m", "r"]
    res = onnxstitch.optimize(model, shapes={"N": [2]})
    assert [sorted(lbl.split(" (")[1] for lbl in g.labels) for g in res.report.plan.groups] == [["Mul)", "Sigmoid)"]]
    _same_outputs(model, res.model, {"N": 2})


def test_dims_inference_derives_are_planned_at_their_real_size() -> None:
    """A strided Conv over a symbolic length gives a dim that shape inference writes as an
    expression (or onnxruntime's unk__N): its planning value comes from the planning sizes, so
    a GroupNorm-like row over it is planned as long as it is, not DEFAULT_SYMBOLIC_DIM."""
    rng = np.random.default_rng(fresh_seed())
    w = numpy_helper.from_array(rng.standard_normal((8, 1, 10)).astype(np.float32), "w")
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 1, samples] x, float[8, 1, 10] w) => (float[B, 8, T] y) {
  c = Conv <strides = [5]> (x, w)
  m = ReduceMean <axes = [2]> (c)
  d = Sub(c, m)
  q = Mul(d, d)
  v = ReduceMean <axes = [2]> (q)
  e = Add(v, v)
  s = Sqrt(e)
  y = Div(d, s)
}""")
    del model.graph.input[1]
    model.graph.initializer.append(w)
    samples = 4000
    res = onnxstitch.optimize(model, shapes={"B": [2], "samples": [samples]})
    planned = res.report.to_json()["symbolic_dims_for_cost"]
    frames = (samples - 10) // 5 + 1
    derived = {k: v for k, v in planned.items() if k not in ("B", "samples")}
    assert derived and set(derived.values()) == {frames}
    _same_outputs(model, res.model, {"B": 2, "samples": 123})


def test_a_model_whose_shapes_do_not_agree_goes_out_as_loaded() -> None:
    # CANINE's TorchScript export: kᵀ is a Transpose [0, 3, 1, 2] of [b, s, 4, 16] (so
    # [b, 16, s, 4]) multiplied with q [b, 4, s, 16]; its Reshape targets are computed, so
    # onnx.checker alone sees nothing wrong, and ONNX Runtime fails at the MatMul. The shapes
    # inferred for it (written into the stitched model) expose the disagreement: nothing fused
    # is written, the reason is the model's shapes, never an internal error.
    model = parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[B, S, 64] x) => (float[B, 4, S, S] y) {
            shp = Shape<end = 2>(x)
            heads = Constant<value = int64[2] {4, 16}>()
            target = Concat<axis = 0>(shp, heads)
            x4 = Reshape(x, target)
            xs = Mul(x4, x4)
            q = Transpose<perm = [0, 2, 1, 3]>(xs)
            kt = Transpose<perm = [0, 3, 1, 2]>(xs)
            y = MatMul(q, kt)
        }""")
    res = onnxstitch.optimize(model, shapes={"B": [2], "S": [8]})
    assert not any(n.op_type == "FusedKernel" for n in res.model.graph.node)
    assert res.report.dropped and all("do not agree" in d["reason"] for d in res.report.dropped), res.report.dropped
