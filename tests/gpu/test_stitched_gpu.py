"""Real kernels on the GPU (marker `gpu`): every op's kernel against an independent reference
(ORT CPU, else stock ORT CUDA) on fresh random inputs with odd sizes, broadcasting, float16
and empty tensors; planned models against stock ORT CUDA; ORT's profile shows the fused
nodes on the CUDA EP. Outputs are poisoned before each run so unwritten elements fail."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP

import onnxstitch
from models.elementwise import chain, random_graph
from onnxstitch import ortio, sizes
from onnxstitch.inputs import random_feeds

from ..op_models import op_models
from ..stitching import as_float32, assert_close, chain_tolerance, fresh_seed, stitch_nodes

pytestmark = pytest.mark.gpu

SHAPES = [(7, 33), (64, 1024), (0, 33)]
NAMES = [name for name, _ in op_models()]


def _model_at(name: str, shape: tuple[int, ...]) -> onnx.ModelProto:
    """The op's model built at the test shape (per-channel parameters follow the last dim)."""
    return dict(op_models(shape))[name]


def _poison(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
        return np.full(arr.shape, np.nan, arr.dtype)
    if arr.dtype == np.bool_:
        return np.asarray(~arr)  # wrong everywhere: an element left unwritten shows up (an array at rank 0 too)
    return np.full(arr.shape, 77, arr.dtype)


# TF32 off: the MatMuls between fused groups must compute in float32 like the CPU reference.
PROVIDERS = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]


def stitch(model: onnx.ModelProto, **settings) -> "onnxstitch.OptimizeResult":
    """optimize for a kernel test: the gate off (these tests judge kernels, and whether a kernel
    pays at test sizes is test_measure_gpu's matter; timing also spreads when xdist runs several
    tests on one GPU), sizes given for names the model lacks dropped (one set of names sizes
    several models)."""
    if "shapes" in settings:
        settings["shapes"] = sizes.applicable(model, settings["shapes"])
    return onnxstitch.optimize(model, gate=False, **settings)


def run_gpu(model: onnx.ModelProto, feeds: dict, expected_like: list[np.ndarray]) -> list[np.ndarray]:
    """Run the stitched model on the CUDA EP through IO binding, outputs preallocated and poisoned."""
    sess = onnxstitch.session(model.SerializeToString(), providers=PROVIDERS)
    io = sess.io_binding()
    for k, v in feeds.items():
        io.bind_ortvalue_input(k, ortio.to_ortvalue(v, "cuda", 0))  # bfloat16 too
    outs = []
    for meta, like in zip(sess.get_outputs(), expected_like):
        ov = ortio.to_ortvalue(_poison(np.asarray(like)), "cuda", 0)
        io.bind_ortvalue_output(meta.name, ov)
        outs.append(ov)
    sess.run_with_iobinding(io)
    return [ortio.to_numpy(o) for o in outs]


def replay_under_cuda_graphs(model: onnx.ModelProto, fresh, output: tuple[str, tuple[int, ...], np.dtype],
                             check, runs: int = 4) -> None:
    """Run `model` (with the library) under CUDA graphs `runs` times — warm-up, capture, then
    replays — each on new inputs `fresh()` copied into the same device buffers, its one output
    (name, shape, dtype) poisoned with NaN before each run; `check(run, inputs, output)` after each."""
    import cupy

    sess = onnxstitch.session(model.SerializeToString(),
                              providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"])
    given = fresh()
    dev = {k: cupy.empty(v.shape, v.dtype) for k, v in given.items()}
    name, shape, dtype = output
    y = cupy.empty(shape, dtype)
    io = sess.io_binding()
    for k, v in dev.items():
        io.bind_input(k, "cuda", 0, v.dtype, list(v.shape), int(v.data.ptr))
    io.bind_output(name, "cuda", 0, y.dtype, list(y.shape), int(y.data.ptr))
    for run in range(runs):
        if run:
            given = fresh()
        for k, v in given.items():
            dev[k].set(v)
        y.fill(np.nan)
        cupy.cuda.Device().synchronize()
        sess.run_with_iobinding(io)
        cupy.cuda.Device().synchronize()
        check(run, given, y.get())


def reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Outputs from ORT CPU, or from stock ORT CUDA where the CPU EP lacks the op/dtype."""
    try:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:
        return ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NAMES)
def test_op_kernel_matches_reference(name: str, shape: tuple[int, int]) -> None:
    model = _model_at(name, shape)
    feeds = random_feeds(model, seed=fresh_seed())
    if "b" in feeds and feeds["b"].dtype.kind == "i":
        feeds["b"][feeds["b"] == 0] = 3
    ref = reference(model, feeds)
    got = run_gpu(stitch_nodes(model, [(0, 1)]), feeds, ref)
    for a, b in zip(got, ref):
        assert_close(a, b, f"{name} {shape}")


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("seed", range(6))
def test_planned_random_model_matches_stock_cuda(dtype: int, seed: int) -> None:
    model = random_graph(40, seed=seed, shape=("batch", 257), dtype=dtype, opaque_every=13)
    res = stitch(model)
    stitched = res.model
    assert any(n.op_type == "FusedKernel" for n in stitched.graph.node)
    # A MatMul the plan gave to a cuBLASLt epilogue runs in TF32 there, as stock ORT runs it by
    # default (10 mantissa bits: ~5e-4 relative a product), where the reference does not.
    tf32 = dtype == TP.FLOAT and any(k.get("scheme") == "gemm" for k in res.report.kernels)
    feeds = random_feeds(model, seed=seed + 100, dim_values={"batch": 9})
    # Half-precision kernels compute in float32, so their reference is the float32 model on
    # the CPU, not stock ORT's float16 kernels (which round after every op).
    ref_model = as_float32(model) if dtype == TP.FLOAT16 else model
    ref = reference(ref_model, {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()})
    got = run_gpu(stitched, feeds, [r.astype(np.float16) if dtype == TP.FLOAT16 else r for r in ref])
    for a, b, o in zip(got, ref, model.graph.output):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert not np.isnan(a64).any(), o.name
        if tf32:
            assert np.linalg.norm(a64 - b64) <= 5e-3 * np.linalg.norm(b64), o.name
        elif dtype == TP.FLOAT:
            rtol, atol = chain_tolerance(a.dtype)
            np.testing.assert_allclose(a64, b64, rtol=rtol, atol=atol, err_msg=o.name)
        else:
            # float16 group outputs are rounded where they leave a kernel (and before each
            # MatMul) and the float32 reference never rounds, so single elements can drift
            # through long chains: judge by the relative norm error, as for any half-precision result.
            assert np.linalg.norm(a64 - b64) <= 1e-2 * np.linalg.norm(b64), o.name


def test_dynamic_batch_without_reoptimizing() -> None:
    model = chain(20, shape=("batch", 1000), dtype=TP.FLOAT)
    stitched = stitch(model).model
    for batch in (1, 3, 17):
        feeds = random_feeds(model, seed=batch, dim_values={"batch": batch})
        ref = reference(model, feeds)
        assert_close(run_gpu(stitched, feeds, ref)[0], ref[0], f"batch {batch}")


def test_profile_shows_fused_nodes_on_cuda(tmp_path) -> None:
    import json

    model = chain(20, shape=("batch", 512), dtype=TP.FLOAT)
    stitched = stitch(model).model
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxstitch.session(stitched.SerializeToString(), sess_options=so)
    sess.run(None, random_feeds(model, seed=1, dim_values={"batch": 4}))
    events = json.loads(open(sess.end_profiling()).read())
    fused = [e for e in events if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == "FusedKernel"]
    assert fused and all(e["args"]["provider"] == "CUDAExecutionProvider" for e in fused)


def test_tensor_over_2_31_elements() -> None:
    """The 64-bit entry: 2^31 + 17 bools (2 GiB in, 2 GiB out), every element checked."""
    from onnx import helper

    n = 2**31 + 17
    nodes = [helper.make_node("Not", ["x"], ["t"]), helper.make_node("Xor", ["t", "k"], ["y"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TP.BOOL, [n]),
                                              helper.make_tensor_value_info("k", TP.BOOL, [1])],
                              [helper.make_tensor_value_info("y", TP.BOOL, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    rng = np.random.default_rng()
    x = (np.frombuffer(rng.bytes(n), dtype=np.uint8) & 1).view(np.bool_)
    k = np.array([rng.random() < 0.5])
    expected = np.logical_xor(~x, k)
    got = run_gpu(stitch_nodes(model, [(0, 1)]), {"x": x, "k": k}, [expected])[0]
    assert got.shape == (n,) and np.array_equal(got, expected)


def test_cast_of_a_half_intermediate_widens_the_half_value() -> None:
    """Add in float16 then Cast to float32 inside one kernel: the cast sees the float16 sum
    (as ONNX Runtime computes it), not the float32 intermediate."""
    from onnx import helper

    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Cast", ["s"], ["z"], to=TP.FLOAT)]
    ins = [helper.make_tensor_value_info(n, TP.FLOAT16, [5, 33]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("z", TP.FLOAT, [5, 33])]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    feeds = random_feeds(model, seed=fresh_seed())
    expected = (feeds["x"] + feeds["y"]).astype(np.float32)  # numpy adds in float16
    got = run_gpu(stitch_nodes(model, [(0, 1)]), feeds, [expected])[0]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("c", [1.4142135, 4.0, -0.1, 3.0, 1e38, 1e-30])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_division_by_a_constant_matches_float64_numpy(c: float, dtype: int) -> None:
    """x / c runs as x * (1/c) where 1/c is normal: within one rounding of the quotient
    (exact for powers of two), and as a division otherwise (1e38: 1/c is subnormal)."""
    from ..test_codegen import _div_by

    model = _div_by(c, dtype)
    res = stitch(model, shapes={"n": [64]}, verify=False)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    npd = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    x = (np.random.default_rng(fresh_seed()).standard_normal((1000, 16)) * 100).astype(npd)
    (got,) = run_gpu(res.model, {"x": x}, [x])
    cc = float(np.array(c, npd))  # the constant as the model stores it
    if not np.isfinite(cc) or cc == 0:
        pytest.skip(f"{c} is not a finite nonzero {np.dtype(npd).name}")
    want = np.maximum(x.astype(np.float64) / cc, 0)
    if c == 4.0:
        np.testing.assert_array_equal(got, np.maximum(x / np.array(4, npd), 0))
    err = np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-300)
    assert err <= (1e-2 if dtype == TP.FLOAT16 else 1e-6), err


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_sign_of_log_keeps_nan_and_infinities(dtype: int) -> None:
    """Sign(Log(x)) over negative, zero, one and positive x: NaN stays NaN, -inf gives -1,
    as numpy and ORT's CPU kernel (a GPU fuzz example once saw a NaN go missing)."""
    h = onnx.helper
    x = h.make_tensor_value_info("x", dtype, ["n"])
    outs = [h.make_tensor_value_info(t, dtype, ["n"]) for t in ("l", "s")]
    nodes = [h.make_node("Log", ["x"], ["l"]), h.make_node("Sign", ["l"], ["s"])]
    model = h.make_model(h.make_graph(nodes, "g", [x], outs), opset_imports=[h.make_opsetid("", 20)], ir_version=10)
    res = stitch(model, shapes={"n": [4096]}, verify=False)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    npd = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(fresh_seed())
    v = np.concatenate([rng.standard_normal(4093), [0.0, -0.0, 1.0]]).astype(npd)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.sign(np.log(v.astype(np.float64)))
    _, got = run_gpu(res.model, {"x": v}, [v, v])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)].astype(npd))


def _erf64(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(x)


@pytest.mark.parametrize("form", ["Erf", "Gelu", "erf-chain"])
def test_half_erf_and_gelu_match_float64(form: str) -> None:
    """float16 kernels take erf from a short fit of log2 erfc (ops.PRELUDE, stitch_fast): Erf,
    Gelu and the exporters' Div → Erf → Add → Mul → Mul chain stay within one float16 ulp
    (2^-10 relative) of the float64 result plus a few of float16's least subnormals, over
    [-12, 12], at ±0, ±inf and NaN (kept)."""
    h = onnx.helper
    c = {"r2": 1.4142135, "one": 1.0, "half": 0.5}
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float16), k) for k, v in c.items()]
    if form == "erf-chain":
        nodes = [h.make_node("Div", ["x", "r2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
                 h.make_node("Add", ["e", "one"], ["f"]), h.make_node("Mul", ["x", "f"], ["g"]),
                 h.make_node("Mul", ["g", "half"], ["y"])]
    else:
        nodes = [h.make_node(form, ["x"], ["y"])]
    model = h.make_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT16, [8192])],
                                      [h.make_tensor_value_info("y", TP.FLOAT16, [8192])], inits),
                         opset_imports=[h.make_opsetid("", 20)], ir_version=10)
    fused = stitch_nodes(model, [tuple(range(len(nodes)))])
    assert [n.op_type for n in fused.graph.node] == ["FusedKernel"]
    rng = np.random.default_rng(fresh_seed())
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-7, -1e-7, 6e-5, -6e-5]
    x = np.concatenate([rng.uniform(-12, 12, 8192 - len(special)), special]).astype(np.float16)
    (got,) = run_gpu(fused, {"x": x}, [x])
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        if form == "Erf":
            want = _erf64(xd)
        else:
            xs = xd / 1.4142135 if form == "Gelu" else xd / np.float64(np.float16(1.4142135))
            want = 0.5 * xd * (1 + _erf64(xs))
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    g, w = got[~nan].astype(np.float64), want[~nan]
    bad = np.abs(g - w) > 2.0 ** -10 * np.abs(w) + 4 * 2.0 ** -24
    assert not bad.any(), f"{form}: {x[~nan][bad][:8]} -> {g[bad][:8]}, want {w[bad][:8]}"
