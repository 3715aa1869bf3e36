"""GPU tests of the custom-op library: hand-written ABI kernels run through ONNX Runtime's CUDA EP.

Each test writes a small CUDA kernel that follows docs/abi.md (out0 = in0 + in1 with numpy
broadcasting, plus an int32 out1 recording which entry ran), compiles it with NVRTC, wraps it in
a one-node ``com.onnxstitch::FusedKernel`` model and compares ORT's results with numpy on fresh
random inputs. Skipped unless cupy sees a GPU and onnxruntime has the CUDA EP.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _gpu_count() -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, no device
        return 0


if _gpu_count() == 0:
    pytest.skip("cupy sees no GPU", allow_module_level=True)
if "CUDAExecutionProvider" not in ort.get_available_providers():
    pytest.skip("onnxruntime has no CUDAExecutionProvider", allow_module_level=True)

from onnxstitch.schemes.source import ARGS_STRUCT  # noqa: E402
from onnxstitch.runtime import session  # noqa: E402

from ..test_runtime_build import fused_model_bytes  # noqa: E402

FULL, BROADCAST = 0, 1
# Entry codes the test kernels write to out1, per docs/abi.md variant names.
V32, S64 = 1, 4

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float16): "unsigned short"}
_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}

_PRELUDE = ARGS_STRUCT + r"""
struct __align__(16) Vec16 { unsigned int w[4]; };

__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, long long i) {
  float f; unsigned short h = p[i];
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float from_bits(float, const void* chunk, int k) {
  return reinterpret_cast<const float*>(chunk)[k];
}
__device__ __forceinline__ float from_bits(unsigned short, const void* chunk, int k) {
  float f; unsigned short h = reinterpret_cast<const unsigned short*>(chunk)[k];
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ void store(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned short* p, long long i, float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  p[i] = h;
}

// Offset of input `k` for linear iteration index `lin`, through the ABI strides.
template <typename I>
__device__ __forceinline__ I offset(const StitchArgs& a, int k, I lin) {
  I off = 0;
  for (int d = a.rank - 1; d >= 0; --d) {
    const I ext = (I)a.dims[d];
    off += (lin % ext) * (I)a.strides[k][d];
    lin /= ext;
  }
  return off;
}
"""

_BODY = r"""
typedef $T0 T0;
typedef $T1 T1;
typedef $TO TO;
#define KIND0 $KIND0
#define KIND1 $KIND1
#define VW $VW

template <typename I>
__device__ __forceinline__ float elem0(const StitchArgs& a, I i) {
  return load((const T0*)a.in[0], (long long)(KIND0 ? offset<I>(a, 0, i) : i));
}
template <typename I>
__device__ __forceinline__ float elem1(const StitchArgs& a, I i) {
  return load((const T1*)a.in[1], (long long)(KIND1 ? offset<I>(a, 1, i) : i));
}

template <typename I>
__device__ void scalar_entry(const StitchArgs& a, int code) {
  const I n = (I)a.n;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    store((TO*)a.out[0], (long long)i, elem0<I>(a, i) + elem1<I>(a, i));
    ((int*)a.out[1])[i] = code;
  }
}

// Vector entry: FULL inputs whose VW elements span exactly 16 bytes are read with one 16-byte
// load, so a misaligned pointer here would fault (the library must then pick the _s entry).
template <typename I>
__device__ void vector_entry(const StitchArgs& a, int code) {
  const I nv = (I)a.n / VW;
  for (I v = (I)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += (I)gridDim.x * blockDim.x) {
    Vec16 c0, c1;
    const bool wide0 = !KIND0 && sizeof(T0) * VW == 16;
    const bool wide1 = !KIND1 && sizeof(T1) * VW == 16;
    if (wide0) c0 = reinterpret_cast<const Vec16*>(a.in[0])[v];
    if (wide1) c1 = reinterpret_cast<const Vec16*>(a.in[1])[v];
    for (int k = 0; k < VW; ++k) {
      const I i = v * VW + k;
      const float x = wide0 ? from_bits(T0(), &c0, k) : elem0<I>(a, i);
      const float y = wide1 ? from_bits(T1(), &c1, k) : elem1<I>(a, i);
      store((TO*)a.out[0], (long long)i, x + y);
      ((int*)a.out[1])[i] = code;
    }
  }
}

extern "C" __global__ void $NAME_v32(StitchArgs a) { vector_entry<unsigned int>(a, 1); }
extern "C" __global__ void $NAME_s64(StitchArgs a) { scalar_entry<long long>(a, 4); }
"""


def kernel_source(name: str, dtypes: tuple[np.dtype, np.dtype, np.dtype], kinds: tuple[int, int], vw: int) -> str:
    """CUDA source of an ABI kernel computing out0 = in0 + in1 (+ entry code in out1)."""
    body = _BODY
    for key, value in {
        "$T0": _CTYPE[np.dtype(dtypes[0])],
        "$T1": _CTYPE[np.dtype(dtypes[1])],
        "$TO": _CTYPE[np.dtype(dtypes[2])],
        "$KIND0": str(kinds[0]),
        "$KIND1": str(kinds[1]),
        "$VW": str(vw),
        "$NAME": name,
    }.items():
        body = body.replace(key, value)
    return _PRELUDE + body


def nvrtc_compile(source: str, arch: str) -> bytes:
    """Compile with NVRTC: ``arch`` "sm_XY" gives a cubin, "compute_XY" gives PTX."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, "stitch_test.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "--std=c++17"])
        except Exception as exc:
            raise AssertionError(f"NVRTC failed: {exc}\n{nvrtc.getProgramLog(prog)}") from exc
        if arch.startswith("sm_"):
            return bytes(nvrtc.getCUBIN(prog))
        ptx = nvrtc.getPTX(prog)
        return ptx if isinstance(ptx, bytes) else ptx.encode()
    finally:
        nvrtc.destroyProgram(prog)


def device_arch() -> int:
    """Compute capability of device 0 as major*10+minor (e.g. 90)."""
    return int(cupy.cuda.Device(0).compute_capability)


@dataclass
class Images:
    """Kernel images as they go into the node's attributes."""

    archs: list[int]
    cubins: list[bytes]
    ptx: bytes | None


def build_images(source: str, cubin_archs: list[int], with_ptx: bool) -> Images:
    cubins = [nvrtc_compile(source, f"sm_{a}") for a in cubin_archs]
    ptx = nvrtc_compile(source, "compute_80") if with_ptx else None
    return Images(cubin_archs, cubins, ptx)


def fused_model(
    name: str,
    dtypes: tuple[np.dtype, np.dtype, np.dtype],
    shapes: tuple[list, list],
    kinds: tuple[int, int],
    vw: int,
    images: Images,
    node_name: str = "fused_add",
    shape_rule: str = "broadcast",
) -> bytes:
    """One FusedKernel node (inputs x, y; outputs z, code) plus its model-local fallback function."""
    out_dtypes = [_ONNX[np.dtype(dtypes[2])], TensorProto.INT32]
    attrs: dict = dict(
        kernel_name=name,
        vec_width=vw,
        input_kinds=list(kinds),
        output_dtypes=out_dtypes,
        shape_rule=shape_rule,
    )
    if images.cubins:
        attrs["image_archs"] = images.archs
        attrs["image_sizes"] = [len(c) for c in images.cubins]
        attrs["images"] = b"".join(images.cubins)
    if images.ptx is not None:
        attrs["ptx"] = images.ptx
    node = helper.make_node("FusedKernel", ["x", "y"], ["z", "code"], name=node_name, domain="com.onnxstitch", **attrs)
    node.overload = name
    # The fallback ORT would inline without the library: same values, code all zeros.
    body = [
        helper.make_node("Cast", ["a"], ["af"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["af", "bf"], ["sf"]),
        helper.make_node("Cast", ["sf"], ["s"], to=out_dtypes[0]),
        helper.make_node("Shape", ["sf"], ["shp"]),
        helper.make_node(
            "ConstantOfShape", ["shp"], ["c"], value=helper.make_tensor("zero", TensorProto.INT32, [1], [0])
        ),
    ]
    fn = helper.make_function("com.onnxstitch", "FusedKernel", ["a", "b"], ["s", "c"], body, [helper.make_opsetid("", 17)])
    fn.overload = name
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", _ONNX[np.dtype(dtypes[0])], shapes[0]),
            helper.make_tensor_value_info("y", _ONNX[np.dtype(dtypes[1])], shapes[1]),
        ],
        [
            helper.make_tensor_value_info("z", out_dtypes[0], None),
            helper.make_tensor_value_info("code", TensorProto.INT32, None),
        ],
    )
    return fused_model_bytes(graph, fn)


_counter = iter(range(1_000_000))


def make_case(
    dtypes: tuple,
    shapes: tuple[tuple[int, ...], tuple[int, ...]],
    kinds: tuple[int, int],
    cubin_archs: list[int] | None = None,
    with_ptx: bool = True,
    symbolic: bool = False,
) -> tuple[bytes, int]:
    """Model bytes and vec_width for an add kernel over the given dtypes/shapes/kinds."""
    dtypes = tuple(np.dtype(d) for d in dtypes)
    widest = max(d.itemsize for d, k in zip(dtypes[:2], kinds) if k == FULL) if FULL in kinds else 4
    widest = max(widest, dtypes[2].itemsize, 4)  # outputs are linear too (out1 is int32)
    vw = 16 // widest
    name = f"stitch_add_{next(_counter)}"
    src = kernel_source(name, dtypes, kinds, vw)
    archs = [device_arch()] if cubin_archs is None else cubin_archs
    images = build_images(src, archs, with_ptx)
    decl = [list(s) for s in shapes]
    if symbolic:  # name every non-1 dim of the inputs: ORT then infers a symbolic output shape
        decl = [[f"d{len(s) - j}" if v != 1 else 1 for j, v in enumerate(s)] for s in shapes]
    return fused_model(name, dtypes, (decl[0], decl[1]), kinds, vw, images), vw


def rand(shape: tuple[int, ...], dtype, rng: np.random.Generator) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape)).astype(dtype)


def expected(x: np.ndarray, y: np.ndarray, out_dtype) -> np.ndarray:
    return (x.astype(np.float32) + y.astype(np.float32)).astype(out_dtype)


def check(sess, shapes, dtypes, rng, runs: int = 2) -> np.ndarray:
    """Run on fresh inputs ``runs`` times; compare with numpy; return the last entry codes."""
    out_dtype = np.dtype(dtypes[2])
    for _ in range(runs):
        x = rand(shapes[0], dtypes[0], rng)
        y = rand(shapes[1], dtypes[1], rng)
        z, code = sess.run(None, {"x": x, "y": y})
        want = expected(x, y, out_dtype)
        assert z.dtype == out_dtype and z.shape == want.shape
        assert code.dtype == np.int32 and code.shape == want.shape
        # fp32: one rounding of the same sum; fp16: one rounding to half of the fp32 sum.
        np.testing.assert_array_equal(z, want)
    return code


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


BROADCAST_CASES = [
    # shapes, kinds
    (((3, 1, 5), (4, 1)), (BROADCAST, BROADCAST)),
    (((7, 13), (13,)), (FULL, BROADCAST)),
    (((4, 8), (4, 8)), (FULL, FULL)),
    (((1023,), (1,)), (FULL, BROADCAST)),
    (((2, 3, 1, 5), (1,)), (BROADCAST, BROADCAST)),
    (((1, 1, 1, 1, 1, 2, 3, 4), (4,)), (FULL, BROADCAST)),
    (((257, 129), (257, 1)), (FULL, BROADCAST)),
    (((), (6,)), (BROADCAST, FULL)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shapes,kinds", BROADCAST_CASES)
def test_broadcast_add(shapes, kinds, dtype, rng):
    dtypes = (dtype, dtype, dtype)
    model, vw = make_case(dtypes, shapes, kinds)
    sess = session(model)
    code = check(sess, shapes, dtypes, rng)
    n = int(np.prod(np.broadcast_shapes(*shapes)))
    # ORT's buffers are 256-byte aligned, so only n decides between the vector and scalar entries.
    want = V32 if n % vw == 0 else S64
    assert np.all(code == want), f"n={n} vw={vw}: expected entry {want}, got {np.unique(code)}"


def test_mixed_dtypes(rng):
    dtypes = (np.float16, np.float32, np.float32)
    shapes = ((64, 33), (64, 33))
    model, _ = make_case(dtypes, shapes, (FULL, FULL))
    check(session(model), shapes, dtypes, rng)


def test_symbolic_input_shapes(rng):
    dtypes = (np.float32, np.float32, np.float32)
    shapes = ((5, 1, 7), (3, 1))
    model, _ = make_case(dtypes, shapes, (BROADCAST, BROADCAST), symbolic=True)
    sess = session(model)
    check(sess, shapes, dtypes, rng)
    # Inferred by the library's InferOutputShapeFn from the named input dims.
    assert sess.get_outputs()[0].shape == ["d3", "d2", "d1"]


def test_empty_tensor(rng):
    dtypes = (np.float32, np.float32, np.float32)
    for shapes in [((0, 5), (5,)), ((3, 0), (1, 1))]:
        model, _ = make_case(dtypes, shapes, (BROADCAST, BROADCAST))
        sess = session(model)
        x = rand(shapes[0], np.float32, rng)
        y = rand(shapes[1], np.float32, rng)
        z, code = sess.run(None, {"x": x, "y": y})
        assert z.shape == np.broadcast_shapes(*shapes) and code.shape == z.shape


def test_ptx_only(rng):
    dtypes = (np.float32, np.float32, np.float32)
    shapes = ((33, 17), (17,))
    model, _ = make_case(dtypes, shapes, (FULL, BROADCAST), cubin_archs=[])
    check(session(model), shapes, dtypes, rng)


def test_cubin_of_other_major_falls_back_to_ptx(rng):
    dtypes = (np.float32, np.float32, np.float32)
    shapes = ((9, 10), (10,))
    major = device_arch() // 10
    other = 75 if major != 7 else 80
    model, _ = make_case(dtypes, shapes, (FULL, BROADCAST), cubin_archs=[other])
    check(session(model), shapes, dtypes, rng)


def test_no_usable_image_names_the_node(rng):
    major = device_arch() // 10
    other = 75 if major != 7 else 80
    dtypes = (np.float32, np.float32, np.float32)
    model, _ = make_case(dtypes, ((4,), (4,)), (FULL, FULL), cubin_archs=[other], with_ptx=False)
    sess = session(model)
    with pytest.raises(Exception, match="fused_add"):
        sess.run(None, {"x": np.ones(4, np.float32), "y": np.ones(4, np.float32)})


def test_full_input_with_wrong_shape_is_an_error(rng):
    dtypes = (np.float32, np.float32, np.float32)
    # y is declared FULL but broadcasts: the library must refuse rather than read out of bounds.
    model, _ = make_case(dtypes, ((4, 8), (8,)), (FULL, FULL))
    sess = session(model)
    with pytest.raises(Exception, match="fused_add.*FULL"):
        sess.run(None, {"x": np.ones((4, 8), np.float32), "y": np.ones(8, np.float32)})


def test_misaligned_full_input_takes_scalar_entry(rng):
    dtypes = (np.float32, np.float32, np.float32)
    shapes = ((16, 16), (16, 16))
    model, vw = make_case(dtypes, shapes, (FULL, FULL))
    sess = session(model)
    x = rand(shapes[0], np.float32, rng)
    y = rand(shapes[1], np.float32, rng)
    # x lives 4 bytes into a device buffer: not 16-byte aligned although n % vw == 0.
    n = x.size
    buf = cupy.zeros(n + 4, dtype=cupy.float32)
    buf[1 : n + 1] = cupy.asarray(x.ravel())
    y_dev = cupy.asarray(y)
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, list(shapes[0]), int(buf.data.ptr) + 4)
    io.bind_input("y", "cuda", 0, np.float32, list(shapes[1]), int(y_dev.data.ptr))
    io.bind_output("z", "cuda")
    io.bind_output("code", "cuda")
    sess.run_with_iobinding(io)
    z, code = io.copy_outputs_to_cpu()
    np.testing.assert_array_equal(z, x + y)
    assert n % vw == 0 and np.all(code == S64)


def test_shape_rule_no_scheme_has_is_an_error():
    # The node's shape rule names its scheme (runtime/csrc/schemes.cc): an unknown one is
    # refused when the session is created, naming the node.
    dtypes = (np.float32, np.float32, np.float32)
    name = f"stitch_add_{next(_counter)}"
    src = kernel_source(name, tuple(np.dtype(d) for d in dtypes), (FULL, FULL), 4)
    images = build_images(src, [device_arch()], True)
    model = fused_model(name, tuple(np.dtype(d) for d in dtypes), ([4], [4]), (FULL, FULL), 4, images, shape_rule="gather")
    with pytest.raises(Exception, match="fused_add.*shape_rule 'gather' is not supported"):
        session(model)


def test_sessions_and_threads(rng):
    dtypes = (np.float32, np.float32, np.float32)
    shapes = ((37, 1, 19), (5, 1))
    model, _ = make_case(dtypes, shapes, (BROADCAST, BROADCAST))
    sessions = [session(model), session(model)]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            local = np.random.default_rng(seed)
            for _ in range(20):
                check(sessions[seed % 2], shapes, dtypes, local, runs=1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_cuda_graph(rng):
    dtypes = (np.float32, np.float32, np.float32)
    shapes = ((64, 32), (32,))
    model, _ = make_case(dtypes, shapes, (FULL, BROADCAST))
    sess = session(model, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"])
    x_dev = cupy.empty(shapes[0], cupy.float32)
    y_dev = cupy.empty(shapes[1], cupy.float32)
    z_dev = cupy.empty(shapes[0], cupy.float32)
    c_dev = cupy.empty(shapes[0], cupy.int32)
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, list(shapes[0]), int(x_dev.data.ptr))
    io.bind_input("y", "cuda", 0, np.float32, list(shapes[1]), int(y_dev.data.ptr))
    io.bind_output("z", "cuda", 0, np.float32, list(shapes[0]), int(z_dev.data.ptr))
    io.bind_output("code", "cuda", 0, np.int32, list(shapes[0]), int(c_dev.data.ptr))
    for _ in range(4):  # warm-up, capture, then replays with new data in the same buffers
        x = rand(shapes[0], np.float32, rng)
        y = rand(shapes[1], np.float32, rng)
        x_dev.set(x)
        y_dev.set(y)
        z_dev.fill(np.nan)
        cupy.cuda.Device().synchronize()
        sess.run_with_iobinding(io)
        np.testing.assert_array_equal(z_dev.get(), x + y)
