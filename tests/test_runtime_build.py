"""CPU tests of the runtime library: it builds, exports its entry point, registers into ONNX
Runtime, drives graph resolution (types and shapes of FusedKernel outputs), and ``session()``
refuses to register it where the CUDA EP is missing."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxstitch import runtime
from onnxstitch.runtime import build as rtbuild

HAS_CUDA_EP = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def lib() -> Path:
    return runtime.library_path()


def add_model() -> bytes:
    """A trivial model without the custom op."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def fused_model(
    x_shape: list,
    y_shape: list,
    out_dtypes: list[int],
    declared: list[tuple[int, list | None]],
    shape_rule: str = "broadcast",
) -> bytes:
    """One FusedKernel node over x, y with outputs z0.. declared as ``declared`` (dtype, shape),
    plus the model-local fallback function (Add, then Cast per output)."""
    outs = [f"z{i}" for i in range(len(out_dtypes))]
    node = helper.make_node(
        "FusedKernel",
        ["x", "y"],
        outs,
        name="fused0",
        domain="com.onnxstitch",
        kernel_name="k0",
        vec_width=4,
        input_kinds=[1, 1],
        output_dtypes=out_dtypes,
        shape_rule=shape_rule,
        ptx=b"// no device here",
    )
    node.overload = "g0"
    fouts = [f"c{i}" for i in range(len(out_dtypes))]
    body = [helper.make_node("Add", ["a", "b"], ["s"])]
    body += [helper.make_node("Cast", ["s"], [c], to=t) for c, t in zip(fouts, out_dtypes)]
    fn = helper.make_function("com.onnxstitch", "FusedKernel", ["a", "b"], fouts, body, [helper.make_opsetid("", 17)])
    fn.overload = "g0"
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape),
        ],
        [helper.make_tensor_value_info(o, t, s) for o, (t, s) in zip(outs, declared)],
    )
    return fused_model_bytes(graph, fn)


def fused_model_bytes(graph, fn) -> bytes:
    """A serialized model of `graph` whose FusedKernel nodes fall back to function `fn`."""
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxstitch", 1)],
        functions=[fn],
        ir_version=10,
    )
    return model.SerializeToString()


def cpu_session_error(model: bytes, lib: Path) -> str:
    """Create a CPU session with the library registered and strict shape/type inference; return
    the error text (the op has no CPU kernel, so creation must fail somewhere)."""
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    so.add_session_config_entry("session.strict_shape_type_inference", "1")
    with pytest.raises(Exception) as info:
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return str(info.value)


def test_library_builds_and_exports_entry_point(lib: Path):
    assert lib.is_file() and lib.name == rtbuild.LIBRARY_NAME
    handle = ctypes.CDLL(str(lib))
    assert hasattr(handle, "RegisterCustomOps")
    # Nothing else leaks out of the library (version script).
    assert not hasattr(handle, "_ZNSt7__cxx119to_stringEi")


def test_library_path_is_cached(lib: Path):
    assert runtime.library_path() == lib
    assert runtime.library_path(build=False) == lib


def test_registration_in_cpu_session(lib: Path):
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    sess = ort.InferenceSession(add_model(), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng().standard_normal((2, 3)).astype(np.float32)
    y = np.random.default_rng().standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "y": y})[0], x + y)


def test_fallback_function_runs_without_library():
    # Sanity check of the test model itself: without the library ORT inlines the function.
    model = fused_model([3, 1, 5], [4, 1], [TensorProto.FLOAT], [(TensorProto.FLOAT, None)])
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng().standard_normal((3, 1, 5)).astype(np.float32)
    y = np.random.default_rng().standard_normal((4, 1)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "y": y})[0], x + y)


def test_graph_resolution_reaches_kernel_lookup(lib: Path):
    # With the library, ORT resolves the node against our schema (heterogeneous variadic
    # outputs typed by output_dtypes) and only then finds no CPU kernel.
    model = fused_model(
        ["n", 1, 5], [4, 1], [TensorProto.FLOAT, TensorProto.INT32], [(TensorProto.FLOAT, None), (TensorProto.INT32, None)]
    )
    err = cpu_session_error(model, lib)
    assert "NOT_IMPLEMENTED" in err and "fused0" in err


def test_inferred_shape_is_the_broadcast(lib: Path):
    # A declared output shape that contradicts the broadcast [3,4,5] fails the strict merge with
    # the inferred one; the right one (or a symbolic one) passes.
    bad = fused_model([3, 1, 5], [4, 1], [TensorProto.FLOAT], [(TensorProto.FLOAT, [3, 4, 6])])
    err = cpu_session_error(bad, lib)
    assert "Inferred=5" in err and "Declared=6" in err
    good = fused_model([3, 1, 5], [4, 1], [TensorProto.FLOAT], [(TensorProto.FLOAT, [3, 4, 5])])
    assert "NOT_IMPLEMENTED" in cpu_session_error(good, lib)
    symbolic = fused_model(["n", 1, 5], [4, 1], [TensorProto.FLOAT], [(TensorProto.FLOAT, [7, 4, 5])])
    assert "NOT_IMPLEMENTED" in cpu_session_error(symbolic, lib)


def test_inferred_types_follow_output_dtypes(lib: Path):
    model = fused_model([3, 1, 5], [4, 1], [TensorProto.FLOAT, TensorProto.BOOL], [(TensorProto.FLOAT, None), (TensorProto.FLOAT, None)])
    err = cpu_session_error(model, lib)
    assert "Type Error" in err and "tensor(bool)" in err


@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA EP")
def test_session_refuses_without_cuda_ep():
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
        runtime.session(add_model())


def test_session_refuses_providers_without_cuda():
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
        runtime.session(add_model(), providers=["CPUExecutionProvider"])


def test_library_env_override(monkeypatch: pytest.MonkeyPatch, lib: Path, tmp_path: Path):
    monkeypatch.setenv("ONNXSTITCH_LIBRARY", str(lib))
    assert runtime.library_path() == lib
    monkeypatch.setenv("ONNXSTITCH_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="ONNXSTITCH_LIBRARY"):
        runtime.library_path()


def test_build_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path))
    with pytest.raises(rtbuild.BuildError, match="ORT_INCLUDE_DIR") as info:
        rtbuild.find_ort_include()
    assert "\n" not in str(info.value)
    monkeypatch.delenv("ORT_INCLUDE_DIR")
    monkeypatch.setenv("CXX", "no-such-compiler-onnxstitch")
    with pytest.raises(rtbuild.BuildError, match="g\\+\\+") as info:
        rtbuild.build()
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# The same sources built with -DONNXSTITCH_CPU_EP_FOR_TESTS register FusedKernel for the CPU EP,
# so kernel creation and Compute run here up to the first CUDA driver call.


@pytest.fixture(scope="module")
def cpu_lib() -> Path:
    return rtbuild.build(extra_flags=("-DONNXSTITCH_CPU_EP_FOR_TESTS",))


def probe_model(x_shape: list, y_shape: list, outs: list[int] | None = None, **overrides) -> bytes:
    """A FusedKernel node over float x, y; ``overrides`` replace attributes (None removes one)."""
    outs = outs or [TensorProto.FLOAT]
    attrs = dict(
        kernel_name="k0", vec_width=4, input_kinds=[1, 1], output_dtypes=outs, shape_rule="broadcast", ptx=b"// none"
    )
    attrs.update(overrides)
    attrs = {k: v for k, v in attrs.items() if v is not None}
    names = [f"z{i}" for i in range(len(outs))]
    node = helper.make_node("FusedKernel", ["x", "y"], names, name="fused0", domain="com.onnxstitch", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape),
        ],
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, outs)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxstitch", 1)], ir_version=10
    )
    return model.SerializeToString()


def cpu_run(lib: Path, model: bytes, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    so.log_severity_level = 4  # the expected failures need not be logged
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "y": y})


F32 = np.float32


def test_empty_iteration_allocates_outputs_and_launches_nothing(cpu_lib: Path):
    model = probe_model(["a", "b"], ["c"], outs=[TensorProto.FLOAT, TensorProto.INT32])
    z, code = cpu_run(cpu_lib, model, np.zeros((0, 5), F32), np.zeros(5, F32))
    assert z.shape == (0, 5) and z.dtype == F32
    assert code.shape == (0, 5) and code.dtype == np.int32


@pytest.mark.parametrize(
    "x,y,kinds,message",
    [
        (np.zeros((3, 5), F32), np.zeros(4, F32), [1, 1], "do not broadcast: \\[3,5\\] \\[4\\]"),
        (np.zeros((3, 5), F32), np.zeros(5, F32), [0, 0], "input 1 is FULL but has shape \\[5\\]"),
        (np.zeros((1,) * 9, F32), np.zeros(1, F32), [1, 1], "rank 9"),
    ],
)
def test_compute_rejects_bad_shapes(cpu_lib: Path, x, y, kinds, message):
    model = probe_model(["a"] * x.ndim, ["b"] * y.ndim, input_kinds=kinds)
    with pytest.raises(Exception, match=f"fused0.*{message}"):
        cpu_run(cpu_lib, model, x, y)


def test_compute_reaches_the_driver(cpu_lib: Path):
    # Leading 1s on a FULL input are accepted; the next step needs the CUDA driver, which this
    # machine lacks (on a GPU machine the garbage PTX fails instead): either way the node is named.
    model = probe_model(["a", "b", "c"], ["d"], input_kinds=[0, 1])
    with pytest.raises(Exception, match="fused0.*CUDA"):
        cpu_run(cpu_lib, model, np.zeros((1, 3, 5), F32), np.zeros(5, F32))


def test_shape_rule_without_a_scheme_is_refused(cpu_lib: Path):
    model = probe_model([2], [2], shape_rule="gather")
    with pytest.raises(Exception, match="fused0.*shape_rule 'gather'"):
        cpu_run(cpu_lib, model, np.zeros(2, F32), np.zeros(2, F32))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(kernel_name=None), "missing STRING attribute 'kernel_name'"),
        (dict(vec_width=0), "vec_width must be >= 1"),
        (dict(input_kinds=[0]), "input_kinds has 1 entries for 2 inputs"),
        (dict(input_kinds=[0, 2]), "input_kinds values"),
        (dict(ptx=None), "carries no kernel image"),
        # The ABI's first draft wrote the cubins as STRINGS: unreadable, so refused loudly.
        (dict(images=[b"\x7fELF\0\0", b"x"], image_archs=["sm_90"]), "attribute 'images' must be a STRING"),
        (dict(images=b"\x7fELF\0\0x", image_archs=["sm_90"]), "image_archs' and 'image_sizes' as INTS"),
        (dict(images=b"\x7fELF\0\0x", image_archs=[90, 80], image_sizes=[6, 2]), "image 1: bad"),
        (dict(images=b"\x7fELF\0\0x", image_archs=[90], image_sizes=[6]), "add up to 6 bytes"),
        # threads per row: a power of two up to 32, whole warps beyond (docs/abi.md)
        (dict(shape_rule="rows", output_kinds=[0], row_geometry=[1, 12, 96]), "row_geometry must be"),
        (dict(shape_rule="rows", output_kinds=[0], row_geometry=[1, 48, 48]), "row_geometry must be"),
        (dict(shape_rule="rows", output_kinds=[0], row_geometry=[1, 96, 192]), "row_geometry must be"),
        # blocks per row (a split row): 1..8, and only where the block is the row
        (dict(shape_rule="rows", output_kinds=[0], row_geometry=[1, 128, 128, 0, 16]), "row_geometry must be"),
        (dict(shape_rule="rows", output_kinds=[0], row_geometry=[1, 128, 128, 0, 0]), "row_geometry must be"),
        (dict(shape_rule="rows", output_kinds=[0], row_geometry=[1, 16, 128, 0, 4]), "row_geometry must be"),
    ],
)
def test_kernel_creation_rejects_bad_attributes(cpu_lib: Path, overrides, message):
    model = probe_model([2], [2], **overrides)
    with pytest.raises(Exception, match=f"fused0.*{message}"):
        cpu_run(cpu_lib, model, np.zeros(2, F32), np.zeros(2, F32))


@pytest.mark.parametrize("geometry", [[1, 16, 128], [1, 96, 96], [1, 640, 640], [1, 320, 320, 0, 8], [1, 128, 128, 0, 1]])
def test_row_geometries_of_whole_warps_are_accepted(cpu_lib: Path, geometry):
    # With no GPU the run stops at the driver, after kernel creation accepted the geometry.
    model = probe_model([2], [2], shape_rule="rows", row_geometry=geometry, output_kinds=[0])
    with pytest.raises(Exception, match="fused0.*CUDA"):
        cpu_run(cpu_lib, model, np.ones(2, F32), np.ones(2, F32))


def test_binary_images_are_accepted(cpu_lib: Path):
    # NUL bytes inside cubins survive: the images blob is split by image_sizes. With no GPU the
    # run stops at the driver, after kernel creation succeeded.
    model = probe_model([2], [2], images=b"\x7fELF\0\0\x7fELF\0", image_archs=[90, 80], image_sizes=[6, 5])
    with pytest.raises(Exception, match="fused0.*CUDA"):
        cpu_run(cpu_lib, model, np.ones(2, F32), np.ones(2, F32))


# output_views (docs/abi.md): [rank, split..., perm..., final rank, final...] per output, [0] plain.
# Split [b, 2, 3] of an iteration shape [b, 6], permuted (2, 0, 1), kept as is.
SPLIT_PERM = [3, -2, 2, 3, 2, 0, 1, 3, -2, -3, -4]


def test_view_outputs_take_the_permuted_shape(cpu_lib: Path):
    # An empty iteration allocates its outputs and launches nothing: the view's shape shows.
    model = probe_model(["a", 6], [6], outs=[TensorProto.FLOAT, TensorProto.FLOAT], output_views=SPLIT_PERM + [0])
    viewed, plain = cpu_run(cpu_lib, model, np.zeros((0, 6), F32), np.zeros(6, F32))
    assert viewed.shape == (3, 0, 2) and plain.shape == (0, 6)
    # A remainder (-1) takes what the fixed sizes leave: [2, 0] split [b, -1, 1] is [2, 0, 1],
    # permuted (0, 2, 1) to [2, 1, 0], then reshaped to [2, -1].
    rest = [3, -2, -1, 1, 0, 2, 1, 2, -2, -1]
    (z,) = cpu_run(cpu_lib, probe_model([2, 0], [0], output_views=rest), np.zeros((2, 0), F32), np.zeros(0, F32))
    assert z.shape == (2, 0)
    rest = [3, -2, -1, 1, 0, 2, 1, 3, -2, -3, -4]
    (z,) = cpu_run(cpu_lib, probe_model([2, 0], [0], output_views=rest), np.zeros((2, 0), F32), np.zeros(0, F32))
    assert z.shape == (2, 1, 0)


@pytest.mark.parametrize(
    "views,message",
    [
        ([3, -2, 4, 3, 2, 0, 1, 3, -2, -3, -4], "holds 24 elements, not 12"),  # [2, 4, 3] from [2, 6]
        ([3, -2, 2, 3, 2, 0, 0, 3, -2, -3, -4], "not a permutation"),
        ([3, -2, 2, 3, 2, 0, 1], "malformed"),
        (SPLIT_PERM + [0, 0], "longer than its outputs"),
        ([3, -9, 2, 3, 2, 0, 1, 3, -2, -3, -4], "a copy of dim 7"),
    ],
)
def test_bad_output_views_are_refused(cpu_lib: Path, views, message):
    model = probe_model([2, 6], [6], output_views=views)
    with pytest.raises(Exception, match=f"fused0.*{message}"):
        cpu_run(cpu_lib, model, np.zeros((2, 6), F32), np.zeros(6, F32))


def test_an_unknown_output_dim_is_a_fresh_symbol_not_minus_one(lib: Path):
    # ORT writes an inferred dim without a name as that number: a remainder the library cannot
    # size ([b, 6] split [b, -1, 2], b symbolic) given as -1 became the size -1, and what ORT
    # inferred downstream from it was wrong (a Reshape [0, -1] gave [b, -2], and the MatMul
    # after it failed graph resolution). As a fresh name it is simply unknown.
    node = helper.make_node("FusedKernel", ["x", "y"], ["z0"], name="fused0", domain="com.onnxstitch",
                            kernel_name="k0", vec_width=4, input_kinds=[1, 1], output_dtypes=[TensorProto.FLOAT],
                            shape_rule="broadcast", ptx=b"// none", output_views=[3, -2, -1, 2, 0, 2, 1, 3, -2, -3, -4])
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [0, -1])
    w = helper.make_tensor("w", TensorProto.FLOAT, [6, 3], [0.0] * 18)
    graph = helper.make_graph(
        [node, helper.make_node("Reshape", ["z0", "s"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 6]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], [shape, w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxstitch", 1)],
                              ir_version=10).SerializeToString()
    err = cpu_session_error(model, lib)
    assert "NOT_IMPLEMENTED" in err and "fused0" in err, err


# Kernel images are checked against their digest (images_sha256) before anything loads.

SHA_DRIVER = r"""
#include "sha256.h"
extern "C" void sha256_hex(const unsigned char* data, long long size, long long split, char* out) {
  onnxstitch::Sha256 h;
  h.Update(data, static_cast<size_t>(split));  // in two pieces, as the runtime feeds images then PTX
  h.Update(data + split, static_cast<size_t>(size - split));
  std::string hex = h.HexDigest();
  std::memcpy(out, hex.c_str(), 65);
}
"""


def _header_driver(tmp_path_factory, name: str, source: str) -> ctypes.CDLL:
    """`source` (C++ over the runtime's headers) built as a shared library and loaded."""
    import subprocess

    folder = tmp_path_factory.mktemp(name)
    (folder / "driver.cc").write_text(source)
    subprocess.run(["g++", "-std=c++17", "-O1", "-fPIC", "-shared", f"-I{rtbuild.CSRC}", "-o", str(folder / "d.so"),
                    str(folder / "driver.cc")], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(folder / "d.so"))


@pytest.fixture(scope="module")
def sha_lib(tmp_path_factory) -> ctypes.CDLL:
    return _header_driver(tmp_path_factory, "sha256", SHA_DRIVER)


def test_the_runtimes_sha256_is_hashlibs(sha_lib: ctypes.CDLL) -> None:
    import hashlib

    rng = np.random.default_rng()
    # Lengths around the 64-byte block and its 56-byte padding boundary, and a few random ones.
    for size in [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, *rng.integers(0, 5000, 5)]:
        data = rng.integers(0, 256, int(size), dtype=np.uint8).tobytes()
        split = int(rng.integers(0, len(data) + 1))
        out = ctypes.create_string_buffer(65)
        sha_lib.sha256_hex(data, len(data), split, out)
        assert out.value.decode() == hashlib.sha256(data).hexdigest(), size


def test_images_that_do_not_match_their_digest_are_refused(cpu_lib: Path) -> None:
    import hashlib

    ptx = b"// the kernel"
    good = probe_model([2], [2], ptx=ptx, images_sha256=hashlib.sha256(ptx).hexdigest())
    bad = probe_model([2], [2], ptx=ptx, images_sha256=hashlib.sha256(ptx + b" ").hexdigest())
    with pytest.raises(Exception, match="fused0.*do not match their SHA-256.*altered after onnxstitch wrote it"):
        cpu_run(cpu_lib, bad, np.zeros(2, np.float32), np.zeros(2, np.float32))
    # The matching digest passes Init: the run goes on to the first driver call (no GPU here).
    with pytest.raises(Exception) as err:
        cpu_run(cpu_lib, good, np.zeros(2, np.float32), np.zeros(2, np.float32))
    assert "SHA-256" not in str(err.value)


def test_the_rewrite_writes_the_digest_of_what_it_embeds(tmp_path: Path) -> None:
    import hashlib

    import onnxstitch
    from models.elementwise import chain

    res = onnxstitch.optimize(chain(4), verify=False)
    fused = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    assert fused
    for n in fused:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        assert a["images_sha256"].decode() == hashlib.sha256(a["images"] + a["ptx"]).hexdigest()


# Library plans are saved on disk between processes (plan_cache.h): where, and whole or not at all.

PLAN_CACHE_DRIVER = r"""
#include <cstring>
#include "plan_cache.h"
extern "C" void path_of(const char* key, char* out, long long size) {
  std::strncpy(out, onnxstitch::plan_cache::PathOf(key).c_str(), static_cast<size_t>(size));
}
extern "C" void write_file(const char* path, const char* data, long long size) {
  onnxstitch::plan_cache::Write(path, std::string(data, static_cast<size_t>(size)));
}
extern "C" long long read_file(const char* path, char* out, long long size) {
  std::string text;
  if (!onnxstitch::plan_cache::Read(path, &text)) return -1;
  std::memcpy(out, text.data(), std::min(text.size(), static_cast<size_t>(size)));
  return static_cast<long long>(text.size());
}
"""


@pytest.fixture(scope="module")
def plan_cache_lib(tmp_path_factory) -> ctypes.CDLL:
    return _header_driver(tmp_path_factory, "plan_cache", PLAN_CACHE_DRIVER)


def test_saved_plans_live_in_the_cache_folder_under_a_digest_of_their_key(
        plan_cache_lib: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    def path_of(key: str) -> str:
        out = ctypes.create_string_buffer(4096)
        plan_cache_lib.path_of(key.encode(), out, len(out))
        return out.value.decode()

    key = "conv plan v1|sm 90|132 SMs|" + str(np.random.default_rng().integers(1 << 30))
    digest = hashlib.sha256(key.encode()).hexdigest()
    monkeypatch.setenv("ONNXSTITCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ONNXSTITCH_PLAN_CACHE", raising=False)
    assert path_of(key) == f"{tmp_path}/cache/plans/{digest}.plan"
    monkeypatch.delenv("ONNXSTITCH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert path_of(key) == f"{tmp_path}/home/.cache/onnxstitch/plans/{digest}.plan"
    monkeypatch.setenv("ONNXSTITCH_PLAN_CACHE", "0")
    assert path_of(key) == ""


def test_a_saved_plan_is_written_whole_in_new_folders_and_read_back(plan_cache_lib: ctypes.CDLL, tmp_path: Path) -> None:
    rng = np.random.default_rng()
    data = rng.integers(0, 256, int(rng.integers(1, 100_000)), dtype=np.uint8).tobytes()
    path = tmp_path / "a" / "b" / "plans" / "x.plan"
    plan_cache_lib.write_file(str(path).encode(), data, len(data))
    assert path.read_bytes() == data
    assert [p.name for p in path.parent.iterdir()] == ["x.plan"]  # no temporary file left
    out = ctypes.create_string_buffer(len(data))
    assert plan_cache_lib.read_file(str(path).encode(), out, len(out)) == len(data)
    assert out.raw == data
    assert plan_cache_lib.read_file(str(tmp_path / "missing.plan").encode(), out, len(out)) == -1
    # A folder that cannot be made leaves nothing behind and raises nothing.
    (tmp_path / "file").write_text("")
    plan_cache_lib.write_file(str(tmp_path / "file" / "x.plan").encode(), data, len(data))
    assert (tmp_path / "file").read_text() == ""


def test_saved_plans_are_keyed_by_the_sources_the_library_was_built_from(tmp_path: Path) -> None:
    """The library compiles in a digest of its sources (ONNXSTITCH_SOURCES), which the conv
    scheme puts in every saved plan's key: a library built from other sources builds its cuDNN
    graphs otherwise and must not load plans made for the old ones."""
    import hashlib

    h = hashlib.sha256()
    for path in rtbuild._sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    assert rtbuild.sources_digest() == h.hexdigest()[:16]
    cmd = rtbuild.build_command(tmp_path, tmp_path / "lib.so", "g++")
    assert f'-DONNXSTITCH_SOURCES="{h.hexdigest()[:16]}"' in cmd
    conv = (rtbuild.SCHEMES / "conv" / "launch.cc").read_text()
    assert '"conv plan v1|library " + std::string(ONNXSTITCH_SOURCES)' in conv


# What manylinux_2_34 (scripts/wheel_check.sh's tag) lets a library need of the system's
# glibc and libstdc++: GCC 12's libstdc++ adds GLIBCXX_3.4.30 (std::condition_variable::wait
# among others), which made auditwheel refuse the wheel in CI.
MANYLINUX_2_34 = {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)}


def test_library_needs_no_symbol_version_above_the_wheels_manylinux_tag(lib: Path):
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    too_new = []
    with open(lib, "rb") as f:
        for section in ELFFile(f).iter_sections():
            if not isinstance(section, GNUVerNeedSection):
                continue
            for _, aux in section.iter_versions():
                for a in aux:
                    family, _, number = a.name.partition("_")
                    if family in MANYLINUX_2_34 and number[:1].isdigit():
                        if tuple(int(p) for p in number.split(".")) > MANYLINUX_2_34[family]:
                            too_new.append(a.name)
    assert not too_new, f"{lib.name} needs {sorted(set(too_new))}: above manylinux_2_34"
