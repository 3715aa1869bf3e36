"""The Python steps of scripts/gpu_deploy.sh, run by path from the installed wheel's
environment (so the repository is not on sys.path):

  deploy_check.py model OUT.onnx                  a small transformer-style block (onnx.helper)
  deploy_check.py installed SITE                  onnxstitch and its library come from SITE, no g++
  deploy_check.py run BUNDLE_MODEL LIBRARY ORIGINAL [--dim NAME=N ...]
                                                  the bundle on the CUDA EP with the library vs the
                                                  original on stock ORT; fused nodes on CUDA
  deploy_check.py cuda-lib-dirs                   folders of the CUDA libraries ORT's CUDA EP loads
  deploy_check.py profile FILE                    fused nodes by provider in an ORT profile

Each prints what it found and exits 1 when a check fails."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 256


def build_model(out: Path) -> None:
    """x[batch, seq, 256] → LayerNorm → MatMul+bias → GELU (erf form) → MatMul+bias →
    residual Add → Softmax: elementwise, row and GEMM work as exported models have it."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    inits = [weight("w1", HIDDEN, 4 * HIDDEN), weight("b1", 4 * HIDDEN), weight("w2", 4 * HIDDEN, HIDDEN),
             weight("b2", HIDDEN), numpy_helper.from_array(np.ones(HIDDEN, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "beta"),
             numpy_helper.from_array(np.array(2 ** -0.5, np.float32), "rsqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
             n("MatMul", ["ln", "w1"], ["h0"]), n("Add", ["h0", "b1"], ["h1"]),
             n("Mul", ["h1", "rsqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
             n("Mul", ["h1", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["g4"]),
             n("MatMul", ["g4", "w2"], ["o0"]), n("Add", ["o0", "b2"], ["o1"]), n("Add", ["o1", "x"], ["res"]),
             n("Softmax", ["res"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, out)
    print(f"model {out}: {len(nodes)} nodes")


def check_installed(site: Path) -> int:
    import onnxstitch

    lib = onnxstitch.library_path()
    found = {"g++": shutil.which("g++"), "package": onnxstitch.__file__, "library": str(lib)}
    print(json.dumps(found))
    ok = found["g++"] is None and Path(onnxstitch.__file__).resolve().is_relative_to(site.resolve()) \
        and lib.resolve().is_relative_to(site.resolve())
    print("installed wheel:", "ok" if ok else "FAILED (see above)")
    return 0 if ok else 1


def _dims(items: list[str]) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=", 1) for item in items)}


def _feeds(model: Path, dims: dict[str, int]) -> dict[str, np.ndarray]:
    m = onnx.load(str(model), load_external_data=False)
    rng = np.random.default_rng(1)
    feeds = {}
    for i in m.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _median_ms(sess, feeds: dict[str, np.ndarray], runs: int = 50) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def fused_by_provider(profile: Path) -> Counter:
    """FusedKernel node events of an ORT profile, counted by the provider that ran them."""
    events = json.loads(profile.read_text())
    return Counter(e["args"].get("provider", "?") for e in events
                   if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == "FusedKernel")


def run_bundle(model: Path, library: Path, original: Path, dims: dict[str, int]) -> int:
    """The bundle as a user loads it (a plain InferenceSession, the library registered) against
    the original on stock ORT, both on the CUDA EP; the fused nodes must have run on CUDA."""
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    feeds = _feeds(original, dims)
    stock = ort.InferenceSession(str(original), providers=providers)
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library))
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "bundle")
    sess = ort.InferenceSession(str(model), so, providers=providers)
    ref, got = stock.run(None, feeds), sess.run(None, feeds)
    worst = max(float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6))) for a, b in zip(got, ref))
    close = all(np.allclose(a, b, rtol=1e-3, atol=1e-5) for a, b in zip(got, ref))
    stock_ms, stitched_ms = _median_ms(stock, feeds), _median_ms(sess, feeds)
    placed = fused_by_provider(Path(sess.end_profiling()))
    print(f"bundle on {sess.get_providers()[0]}: outputs {[a.shape for a in got]}, close={close} "
          f"(worst rel. err {worst:.1e}); fused nodes by provider {dict(placed)}; "
          f"median stock {stock_ms:.3f} ms, stitched {stitched_ms:.3f} ms ({stock_ms / stitched_ms:.2f}x)")
    ok = close and placed and set(placed) == {"CUDAExecutionProvider"}
    print("bundle run:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def cuda_lib_dirs() -> int:
    """Folders of the CUDA libraries a CUDA session loads from Python (pip's nvidia packages
    through preload_dlls, or the system's): what a C++ program needs on LD_LIBRARY_PATH."""
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
    dirs: dict[str, None] = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        name = os.path.basename(path)
        if name.startswith(("libcu", "libnv")) and not name.startswith("libcuda.so"):
            dirs[os.path.dirname(path)] = None
    print(":".join(dirs))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("model").add_argument("out", type=Path)
    sub.add_parser("installed").add_argument("site", type=Path)
    r = sub.add_parser("run")
    r.add_argument("model", type=Path)
    r.add_argument("library", type=Path)
    r.add_argument("original", type=Path)
    r.add_argument("--dim", action="append", default=[])
    sub.add_parser("cuda-lib-dirs")
    sub.add_parser("profile").add_argument("file", type=Path)
    a = p.parse_args()
    if a.cmd == "model":
        build_model(a.out)
        return 0
    if a.cmd == "installed":
        return check_installed(a.site)
    if a.cmd == "run":
        return run_bundle(a.model, a.library, a.original, _dims(a.dim))
    if a.cmd == "cuda-lib-dirs":
        return cuda_lib_dirs()
    placed = fused_by_provider(a.file)
    print(f"fused nodes by provider in {a.file.name}: {dict(placed)}")
    return 0 if placed and set(placed) == {"CUDAExecutionProvider"} else 1


if __name__ == "__main__":
    sys.exit(main())
