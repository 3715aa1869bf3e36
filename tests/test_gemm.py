"""GEMM epilogues (schemes/gemm) on the CPU: what the matcher takes and refuses with why, the
plan choosing them by price, the stitched model running through its fallback, the runtime's
attribute checks, shapes and errors (the CPU-EP test build), and the hand-declared cuBLASLt
values against the real header where it is installed."""
from __future__ import annotations

import dataclasses
import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP, helper, numpy_helper

import onnxstitch
from onnxstitch.cli.main import main as cli
from onnxstitch.cost import CostModel
from onnxstitch.runtime import build as rtbuild
from onnxstitch.schemes.gemm import match as gemm
from onnxstitch.schemes.gemm.spec import GemmSpec

from onnxstitch import graph as fgraph, shapes, simplify, sizes
from .gemm_models import Chain, chain_model, feeds, reference
from .stitching import fresh_seed

ROOT = Path(__file__).resolve().parents[1]


def from_model(model: onnx.ModelProto) -> fgraph.FusionGraph:
    """The model's FusionGraph, its large weights among the constants (tests/_graphs.py's
    builds from the inferred model, which leaves them out)."""
    return fgraph.build(model, shapes.infer(model)[1])


def longest(c: Chain) -> gemm.Match:
    """The longest chain the matcher proposes for the model of `c`."""
    found = gemm.find(from_model(chain_model(c)))
    assert found.matches, found.refusals
    return found.matches[-1]


# ---------------------------------------------------------------------------------------------
# Legality.

LEGAL = [
    (Chain(), "", None),
    (Chain(activation="relu"), "relu", None),
    (Chain(activation="gelu_op"), "gelu", None),
    (Chain(activation="gelu_tanh_pow"), "gelu", None),
    (Chain(activation="gelu_tanh_cube"), "gelu", None),
    (Chain(residual="before"), "", "r"),
    (Chain(residual="before", activation="gelu_tanh_pow"), "gelu", "r"),
    (Chain(lead=("batch", "seq"), k=32, n=48, activation="gelu_tanh_pow"), "gelu", None),  # BERT's FFN, tanh form
    (Chain(lead=("batch", "seq"), k=32, n=32, residual="before"), "", "r"),  # BERT's output projections
    (Chain(lead=(6,), dtype=TP.FLOAT16, activation="gelu_tanh_pow"), "gelu", None),
    (Chain(lead=(6,), gemm=True, activation="relu"), "relu", None),
]


@pytest.mark.parametrize("c,activation,residual", LEGAL, ids=[c.id for c, _, _ in LEGAL])
def test_legal_chains_are_matched_whole(c: Chain, activation: str, residual: str | None) -> None:
    m = longest(c)
    assert (m.activation, m.residual, m.output) == (activation, residual, "y")
    assert m.bias == "b" and m.b == "w" and (m.k, m.n) == (c.k, c.n) and m.trans_b == c.gemm
    assert m.spec.tf32 == (c.dtype == TP.FLOAT) and m.spec.dtype == c.dtype


@pytest.mark.parametrize("c,epilogue", [(Chain(biased=False, residual="before"), "none"),
                                       (Chain(biased=False, activation="gelu_tanh_pow"), "gelu"),
                                       (Chain(lead=(10,), biased=False, gemm=True, residual="before", activation="relu"), "relu")],
                         ids=lambda x: x.id if isinstance(x, Chain) else x)
def test_products_without_a_bias_take_the_rest(c: Chain, epilogue: str) -> None:
    m = longest(c)
    assert m.bias is None and m.output == "y" and m.spec.epilogue == epilogue and not m.spec.biased
    assert m.inputs == ("a", "w") + (("r",) if c.residual else ())
    assert m.spec.attributes()["gemm_epilogue"] == ("none", "bias", "relu_bias", "gelu_bias", "relu", "gelu").index(epilogue)


@pytest.mark.parametrize("c", [Chain(lead=("batch", "seq"), gemm=True, flattened=True, activation="gelu_tanh_pow"),
                               Chain(lead=("batch", "seq"), flattened=True, residual="before"),
                               Chain(lead=("batch", "seq"), gemm=True, biased=False, flattened=True, residual="before")],
                         ids=lambda c: c.id)
def test_a_product_on_flattened_rows_is_matched_after_simplify(c: Chain) -> None:
    """HF's Conv1D / dynamo's Linear: Reshape → Gemm → Reshape becomes MatMul over A's rows
    (simplify.py), and the epilogue reads A as it is, rank 3."""
    model = chain_model(c)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    assert any("on rows flattened from 'a'" in r for r in s.rewrites), s.rewrites
    found = gemm.find(fgraph.build(s.model, s.tensors))
    assert found.matches, found.refusals
    m = found.matches[-1]
    assert m.a == "a" and m.output == "y" and (m.residual is not None) == bool(c.residual)
    assert m.activation == ("gelu" if c.activation else "") and (m.bias is not None) == c.biased
    # The simplified model computes what the original does (ORT CPU, fresh inputs).
    rng = np.random.default_rng(fresh_seed())
    given = feeds(c, (3, 7), rng)
    want = reference(c, model, given)
    for m_ in (model, s.model):
        got = ort.InferenceSession(m_.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], given)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_every_prefix_is_proposed_sharing_the_product() -> None:
    found = gemm.find(from_model(chain_model(Chain(residual="before", activation="relu"))))
    assert [(m.activation, m.residual is not None) for m in found.matches] == [("", False), ("", True), ("relu", True)]
    assert len({m.nodes[0] for m in found.matches}) == 1
    assert all(set(a.nodes) < set(b.nodes) for a, b in zip(found.matches, found.matches[1:]))


REFUSED = [
    (Chain(activation="gelu_erf"), 1, "exact (erf) GELU into 'y' stays a stitched kernel: cuBLASLt's GELU epilogue is the tanh form"),
    (Chain(activation="gelu_erf_op"), 1, "the exact GELU 'y' stays a stitched kernel: cuBLASLt's GELU epilogue is the tanh form"),
    (Chain(activation="relu", residual="after"), 2, "the Add after its activation stays apart (cuBLASLt adds C before"),
    (Chain(bias_shape=(1, 24)), 0, "no bias, residual or activation after it for an epilogue (read by Add)"),
    (Chain(biased=False), 0, "no bias, residual or activation after it for an epilogue (the product is a graph output)"),
    (Chain(lead=(2, 3, 4)), 0, "A 'a' of shape [2, 3, 4, 16]: rank 2 or 3"),
]


@pytest.mark.parametrize("c,kept,reason", REFUSED, ids=[c.id for c, _, _ in REFUSED])
def test_refusals_say_why(c: Chain, kept: int, reason: str) -> None:
    found = gemm.find(from_model(chain_model(c)))
    assert len(found.matches) == kept  # the legal prefixes stay proposed
    assert any(reason in r for r in found.refusals), found.refusals


def _edited(c: Chain, edit) -> onnx.ModelProto:
    model = chain_model(c)
    edit(model)
    return model


def _weight_as_input(m: onnx.ModelProto) -> None:
    w = next(t for t in m.graph.initializer if t.name == "w")
    m.graph.initializer.remove(w)
    m.graph.input.append(helper.make_tensor_value_info("w", w.data_type, list(w.dims)))


def _gemm_attr(name: str, value) -> callable:
    def edit(m: onnx.ModelProto) -> None:
        m.graph.node[0].attribute.append(helper.make_attribute(name, value))
    return edit


def _read_twice(m: onnx.ModelProto) -> None:
    m.graph.node.append(helper.make_node("Neg", ["prod"], ["neg"]))
    m.graph.output.append(helper.make_tensor_value_info("neg", TP.FLOAT, None))


@pytest.mark.parametrize("c,edit,reason", [
    (Chain(), _weight_as_input, "its weight 'w' is not a constant"),
    (Chain(lead=(6,), gemm=True, activation="relu"), _gemm_attr("alpha", 2.0), "Gemm's alpha is not 1"),
    (Chain(lead=(6,), gemm=True, activation="relu"), _gemm_attr("beta", 0.5), "Gemm's C 'b' is not a bias [N] added with beta 1"),
    (Chain(), _read_twice, "no bias, residual or activation after it for an epilogue (it is read by 2 nodes: Add, Neg)"),
    (Chain(lead=(6,), gemm=True), lambda m: None,
     "no bias, residual or activation after its own bias for an epilogue (the product is a graph output)"),
], ids=["weight-input", "alpha", "beta", "product-read-twice", "gemm-alone"])
def test_refusals_of_the_product_say_why(c: Chain, edit, reason: str) -> None:
    found = gemm.find(from_model(_edited(c, edit)))
    assert not found.matches and any(reason in r for r in found.refusals), found.refusals


def test_double_is_refused() -> None:
    model = chain_model(Chain())
    for t in list(model.graph.initializer):
        model.graph.initializer.remove(t)
        model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in list(model.graph.input) + list(model.graph.output):
        v.type.tensor_type.elem_type = TP.DOUBLE
    found = gemm.find(from_model(model))
    assert not found.matches and "'a' is double: float32 or float16 only" in found.refusals[0]


@pytest.mark.skipif(not (ROOT / "build/bertc/bert-base-float32.onnx").is_file(), reason="build/bertc is not here")
def test_bert_base_float32() -> None:
    # Its FFN's GELU is the exact one: refused, the bias alone stays proposed; its output
    # projections take bias + residual.
    # (Its Q/K/V products are matched apart here: the pipeline merges them into one first.)
    model = onnx.load(str(ROOT / "build/bertc/bert-base-float32.onnx"), load_external_data=False)
    found = gemm.find(from_model(model))
    longest_of = {m.product: m for m in found.matches}
    assert len(longest_of) == 72 and all(m.activation == "" for m in longest_of.values())
    assert sum(bool(m.residual) for m in longest_of.values()) == 24
    assert sum(gemm.EXACT_GELU in r for r in found.refusals) == 12


# ---------------------------------------------------------------------------------------------
# The plan's choice and the stitched model.

BIG = Chain(lead=("batch", 128), k=64, n=256, activation="gelu_tanh_pow")


def test_epilogues_are_on_by_default_and_can_be_turned_off() -> None:
    res = onnxstitch.optimize(chain_model(BIG), verify=False)
    assert any(g.scheme == "gemm" for g in res.report.plan.groups) and res.report.epilogues
    off = onnxstitch.optimize(chain_model(BIG), verify=False, epilogues=False)
    assert not any(g.scheme == "gemm" for g in off.report.plan.groups) and not off.report.epilogues


def test_the_plan_weighs_an_epilogue_against_the_stitched_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    model = chain_model(BIG)
    priced = gemm.group_of
    monkeypatch.setattr(gemm, "group_of", lambda *a, **k: dataclasses.replace(priced(*a, **k), predicted_us=1e6))
    dear = onnxstitch.optimize(model, verify=False, epilogues=True)
    assert [g.scheme for g in dear.report.plan.groups] == ["elementwise"] and not dear.report.epilogues
    assert any("the plan found other kernels over these nodes cheaper" in r for r in dear.report.epilogue_refusals)
    monkeypatch.setattr(gemm, "group_of", priced)
    fair = onnxstitch.optimize(model, verify=False, epilogues=True)
    assert [g.scheme for g in fair.report.plan.groups] == ["gemm"] and len(fair.report.epilogues) == 1
    assert fair.report.plan.predicted_us_after < dear.report.plan.predicted_us_after


@pytest.mark.parametrize("m,k,n", [(1024, 768, 3072), (2048, 2048, 2048)], ids=["bert-ffn1", "square"])
def test_price_is_the_gemm_plus_what_the_epilogue_adds(m: int, k: int, n: int) -> None:
    # The residual's read costs what it adds to the roofline (nothing once the math is longer),
    # and the residual epilogue's measured slowdown of the plain GEMM.
    model = chain_model(Chain(lead=(m,), k=k, n=n, residual="before"))
    g = from_model(model)
    cost = CostModel()
    bias, residual = (gemm.group_of(g, cost, "e", x) for x in gemm.find(g).matches)
    flops_us = 2 * m * k * n / (gemm.TF32_TFLOPS * 1e6)
    plain = 4 * (m * k + k * n + m * n)  # A, W, Y in float32
    roof = [max(flops_us, (plain + 4 * n + extra) / (cost.bandwidth_gbs * 1e3)) for extra in (0, 4 * m * n)]
    bare = max(flops_us, plain / (cost.bandwidth_gbs * 1e3))
    slower = {p: gemm.EPILOGUE_OVERHEAD[(TP.FLOAT, p)] * bare for p in ("bias", "residual")}
    assert residual.predicted_us - bias.predicted_us == pytest.approx(
        roof[1] - roof[0] + slower["residual"] - slower["bias"], rel=1e-6)
    assert residual.predicted_bytes == bias.predicted_bytes + 4 * m * n
    assert (roof[1] == roof[0]) == (flops_us > (plain + 4 * n + 4 * m * n) / (cost.bandwidth_gbs * 1e3))


STITCHED = [Chain(lead=("batch", 9), activation="gelu_tanh_pow"), Chain(lead=(7,), residual="before", activation="relu"),
            Chain(lead=(3, 5), residual="before"), Chain(lead=(6,), gemm=True, activation="gelu_op"),
            Chain(lead=(4, 3), dtype=TP.FLOAT16, activation="gelu_tanh_cube"),
            Chain(lead=(3, 5), biased=False, residual="before"), Chain(lead=("batch", 9), biased=False, activation="gelu_tanh_pow")]


@pytest.mark.parametrize("c", STITCHED, ids=lambda c: c.id)
def test_stitched_chain_runs_anywhere_through_its_function(c: Chain) -> None:
    model = chain_model(c)
    res = onnxstitch.optimize(model, epilogues=True, shapes=sizes.applicable(model, {"batch": [4]}))
    (grp,) = res.report.plan.groups
    assert grp.scheme == "gemm" and grp.tf32 == (c.dtype == TP.FLOAT) and res.report.verification.device == "cpu"
    (node,) = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["shape_rule"] == b"gemm" and not {"images", "ptx", "image_archs"} & set(attrs)
    spec = grp.payload.spec
    assert {k: attrs[k] for k in spec.attributes()} == spec.attributes()
    assert list(node.input) == list(grp.payload.node_inputs)
    # float32 reads its weight K-major (a transposed copy), which the function transposes back
    assert (node.input[1] == f"{grp.payload.b}~kmajor") == (c.dtype == TP.FLOAT and not c.gemm)
    (fn,) = res.model.functions
    originals = {n.name for n in model.graph.node if n.op_type not in ("Constant",)}
    assert {n.name for n in fn.node if n.op_type not in ("Constant", "Transpose")} == originals  # the chain, verbatim
    lead = tuple(4 if isinstance(d, str) else d for d in c.lead)
    given = feeds(c, lead, np.random.default_rng(fresh_seed()))
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    want = reference(c, model, given)
    tol = 2e-2 if c.dtype == TP.FLOAT16 else 1e-5
    assert np.abs(got.astype(np.float64) - want).max() <= tol * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("c", [Chain(lead=("batch", 9), gemm=True, flattened=True, activation="gelu_tanh_pow"),
                               Chain(lead=("batch", 9), gemm=True, biased=False, flattened=True, residual="before")],
                         ids=lambda c: c.id)
def test_flattened_chain_is_one_gemm_node_and_runs_through_its_function(c: Chain) -> None:
    """GPT-2's Conv1D as exported: the Reshapes around the Gemm go (simplify), the node reads A
    of rank 3 and its function computes the chain on the CPU."""
    model = chain_model(c)
    res = onnxstitch.optimize(model, epilogues=True, shapes=sizes.applicable(model, {"batch": [4]}))
    (grp,) = [g for g in res.report.plan.groups if g.scheme == "gemm"]
    assert grp.payload.a == "a" and res.report.verification.device == "cpu"
    assert not any(n.op_type in ("Gemm", "MatMul") for n in res.model.graph.node)
    given = feeds(c, (4, 9), np.random.default_rng(fresh_seed()))
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    want = reference(c, model, given)
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_cli_option(tmp_path: Path) -> None:
    src = tmp_path / "chain.onnx"
    onnx.save(chain_model(BIG), src)
    report = tmp_path / "report.json"
    out = CliRunner().invoke(cli, ["optimize", str(src), "--epilogues", "--no-verify", "--report", str(report), "-q"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(report.read_text())["epilogues"]["gemms"]) == 1
    assert "cuBLASLt" in CliRunner().invoke(cli, ["optimize", "--help"]).output


def test_spec_refuses_what_the_runtime_does_not_run() -> None:
    with pytest.raises(ValueError, match="gemm epilogue 'silu'"):
        GemmSpec("silu", False, TP.FLOAT, True)
    with pytest.raises(ValueError, match="float32 or float16"):
        GemmSpec("bias", False, TP.BFLOAT16, False)


# ---------------------------------------------------------------------------------------------
# The runtime (CPU-EP test build: everything up to the first driver call).


@pytest.fixture(scope="module")
def cpu_lib() -> Path:
    return rtbuild.build(extra_flags=("-DONNXSTITCH_CPU_EP_FOR_TESTS",))


def node_model(a: list, w: list, spec: GemmSpec | None, residual: list | None = None, out: list | None = None,
               dtype: int = TP.FLOAT, bias: list | None = None, **overrides) -> bytes:
    """One gemm FusedKernel over input a, weight w (an input here), bias b ([w's N] unless
    given), [r]."""
    n = w[0] if spec is not None and spec.trans_b else w[-1]
    names = ["a", "w"] + (["b"] if spec is None or spec.biased else []) + (["r"] if residual is not None else [])
    attrs = dict(kernel_name="cublaslt_test", vec_width=1, input_kinds=[1] * len(names), output_dtypes=[dtype],
                 shape_rule="gemm") | (spec.attributes() if spec is not None else {})
    attrs = {k: v for k, v in (attrs | overrides).items() if v is not None}
    node = helper.make_node("FusedKernel", names, ["y"], name="fused0", domain="com.onnxstitch", **attrs)
    dims = {"a": a, "w": w, "b": bias or [n], "r": residual}
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(t, dtype, dims[t]) for t in names],
                          [helper.make_tensor_value_info("y", dtype, out)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxstitch", 1)],
                          ir_version=10)
    return m.SerializeToString()


def cpu_run(lib: Path, model: bytes, given: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    so.log_severity_level = 4
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, given)


def zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


SPEC = GemmSpec("gelu_bias", False, TP.FLOAT, True)


@pytest.mark.parametrize("spec,given,shape", [
    (SPEC, {"a": zeros(0, 16), "w": zeros(16, 24), "b": zeros(24)}, (0, 24)),
    (SPEC, {"a": zeros(2, 0, 16), "w": zeros(16, 24), "b": zeros(24)}, (2, 0, 24)),
    (dataclasses.replace(SPEC, trans_a=True, trans_b=True), {"a": zeros(16, 0), "w": zeros(24, 16), "b": zeros(24)},
     (0, 24)),
    (dataclasses.replace(SPEC, residual=True), {"a": zeros(0, 16), "w": zeros(16, 8), "b": zeros(8), "r": zeros(0, 8)},
     (0, 8)),
    (GemmSpec("none", False, TP.FLOAT, False), {"a": zeros(3, 0, 4), "w": zeros(4, 5)}, (3, 0, 5)),
], ids=["rank2", "rank3", "transposed", "residual", "no-epilogue"])
def test_runtime_allocates_the_product_without_an_image(cpu_lib: Path, spec, given, shape) -> None:
    # No rows: the output is allocated at its shape and nothing launched; the node has no image.
    model = node_model(list(given["a"].shape), list(given["w"].shape), spec,
                       list(given["r"].shape) if "r" in given else None)
    (y,) = cpu_run(cpu_lib, model, given)
    assert y.shape == shape


def test_runtime_reaches_the_driver(cpu_lib: Path) -> None:
    model = node_model([3, 16], [16, 24], SPEC)
    with pytest.raises(Exception, match="fused0.*cublaslt_test.*CUDA"):
        cpu_run(cpu_lib, model, {"a": zeros(3, 16), "w": zeros(16, 24), "b": zeros(24)})


@pytest.mark.parametrize("overrides,message", [
    (dict(gemm_epilogue=None), "missing INT attribute 'gemm_epilogue' \\(shape_rule \"gemm\"\\)"),
    (dict(gemm_tf32=None), "missing INT attribute 'gemm_tf32'"),
    (dict(gemm_epilogue=8), "gemm_epilogue must be 0 \\(none\\), 1 \\(bias\\), 2 \\(relu_bias\\), 3 \\(gelu_bias\\), "
                            "4 \\(relu\\), 5 \\(gelu\\), 6 \\(gelu_erf_bias\\) or 7 \\(gelu_erf\\), got 8"),
    (dict(gemm_trans_b=2), "are 0 or 1"),
    (dict(gemm_timed=3), "gemm_timed are 0 or 1"),
    (dict(gemm_epilogue=0), "with epilogue none takes 2 inputs and gives 1 output, not 3 and 1"),
    (dict(gemm_residual=1), "gelu_bias and a residual takes 4 inputs"),
    (dict(output_dtypes=[TP.INT32]), "float32 or float16 \\(output_dtypes\\)"),
], ids=["no-epilogue", "no-tf32", "epilogue-8", "trans-2", "timed-3", "inputs", "residual-input", "int32"])
def test_runtime_refuses_malformed_attributes(cpu_lib: Path, overrides, message) -> None:
    model = node_model([3, 16], [16, 24], SPEC, **overrides)
    with pytest.raises(Exception, match=f"fused0.*{message}"):
        cpu_run(cpu_lib, model, {"a": zeros(3, 16), "w": zeros(16, 24), "b": zeros(24)})


@pytest.mark.parametrize("spec,given,message", [
    (SPEC, {"a": zeros(0, 16), "w": zeros(15, 24), "b": zeros(24)}, "A \\[0,16\\] and B \\[15,24\\] do not multiply"),
    (SPEC, {"a": zeros(0, 16), "w": zeros(16, 24), "b": zeros(23)}, "the bias \\[23\\] is not \\[24\\]"),
    (SPEC, {"a": zeros(1, 1, 0, 16), "w": zeros(16, 24), "b": zeros(24)}, "A of rank 2 or 3"),
    (dataclasses.replace(SPEC, residual=True), {"a": zeros(0, 16), "w": zeros(16, 8), "b": zeros(8), "r": zeros(1, 8)},
     "the residual \\[1,8\\] is not of the product's shape \\[0,8\\]"),
], ids=["k", "bias", "rank4", "residual"])
def test_runtime_names_shapes_that_do_not_fit(cpu_lib: Path, spec, given, message) -> None:
    model = node_model(list(given["a"].shape), list(given["w"].shape), spec,
                       list(given["r"].shape) if "r" in given else None, bias=list(given["b"].shape))
    with pytest.raises(Exception, match=f"fused0.*{message}"):
        cpu_run(cpu_lib, model, given)


def strict_session_error(model: bytes) -> str:
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(onnxstitch.runtime.library_path()))
    so.add_session_config_entry("session.strict_shape_type_inference", "1")
    with pytest.raises(Exception) as info:
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return str(info.value)


def test_runtime_infers_the_output_shape() -> None:
    # Declared against the inferred [batch, seq, N]: a wrong N fails the strict merge, the right
    # one (or the transposed weight's N) passes on to the missing CPU kernel.
    bad = node_model(["batch", "seq", 16], [16, 24], SPEC, out=["batch", "seq", 25])
    assert "Inferred=24" in strict_session_error(bad) and "Declared=25" in strict_session_error(bad)
    good = node_model(["batch", "seq", 16], [16, 24], SPEC, out=["batch", "seq", 24])
    assert "NOT_IMPLEMENTED" in strict_session_error(good)
    transposed = node_model([16, "m"], [24, 16], dataclasses.replace(SPEC, trans_a=True, trans_b=True), out=["m", 23])
    assert "Inferred=24" in strict_session_error(transposed)


# ---------------------------------------------------------------------------------------------
# cublaslt_api.h against the real header.

def _cublaslt_includes() -> list[str]:
    """Folders holding cublasLt.h and what it includes (the nvidia wheels, a CUDA toolkit)."""
    lt = [p for p in glob.glob(f"{sys.prefix}/lib/python3*/site-packages/nvidia/*/include/cublasLt.h")
          + glob.glob("/tmp/*venv*/lib/python3*/site-packages/nvidia/*/include/cublasLt.h")
          + glob.glob("/usr/local/cuda*/include/cublasLt.h")]
    crt = glob.glob("/usr/local/cuda*/include/crt/host_defines.h")
    if not lt:
        return []
    return [str(Path(lt[0]).parent)] + [str(Path(c).parents[1]) for c in crt[:1]]


@pytest.mark.skipif(not _cublaslt_includes() or shutil.which("g++") is None, reason="no cublasLt.h here")
def test_hand_declared_cublaslt_values_match_the_header() -> None:
    include = _cublaslt_includes()
    res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", *(f"-I{d}" for d in include),
                          f"-I{ROOT / 'onnxstitch/schemes/gemm'}", str(ROOT / "tests/gemm_header_check.cc")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
