"""`onnxstitch bench`: stock ONNX Runtime CUDA EP against the stitched model, side by side in
one process, same inputs, IO binding on the GPU."""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx

from .inputs import random_feeds

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Timing:
    """Latency of one configuration over `iters` runs, in milliseconds."""

    median_ms: float
    p90_ms: float
    min_ms: float
    iters: int
    launches_per_run: float  # CUDA EP node executions per run, from ORT's profile
    fused_nodes_on_cuda: int  # FusedKernel nodes that ORT's profile shows on the CUDA EP


@dataclass(frozen=True)
class BenchResult:
    """Stock vs stitched: timings, speedup and output error."""

    model: str
    device: str
    ort_version: str
    stock: Timing
    stitched: Timing
    speedup: float
    max_abs_err: float
    max_rel_err: float
    inputs: Mapping[str, list[int]]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, **asdict(self)}


def gpu_name() -> str:
    """The GPU's name as the CUDA runtime reports it, or 'unknown'."""
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown"


def _bind(sess, feeds: Mapping[str, np.ndarray]):
    import onnxruntime as ort

    io = sess.io_binding()
    keep = []
    for name, arr in feeds.items():
        ov = ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0)
        keep.append(ov)
        io.bind_ortvalue_input(name, ov)
    for out in sess.get_outputs():
        io.bind_output(out.name, "cuda", 0)
    return io, keep


def _time(sess, feeds, warmup: int, iters: int) -> tuple[list[float], list[np.ndarray]]:
    io, _keep = _bind(sess, feeds)
    for _ in range(warmup):
        sess.run_with_iobinding(io)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sess.run_with_iobinding(io)  # Run synchronizes the CUDA EP's stream before returning
        times.append((time.perf_counter() - t0) * 1e3)
    return times, [o.numpy() for o in io.get_outputs()]


def _profile_counts(make_session, feeds, runs: int = 5) -> tuple[float, int]:
    """(CUDA EP node executions per run, FusedKernel nodes on CUDA) from ORT's profiler."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "prof")
        sess = make_session(so)
        io, _keep = _bind(sess, feeds)
        for _ in range(runs):
            sess.run_with_iobinding(io)
        events = json.loads(Path(sess.end_profiling()).read_text())
    cuda = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
            and e.get("args", {}).get("provider") == "CUDAExecutionProvider"]
    fused = {e["name"] for e in cuda if e.get("args", {}).get("op_name") == "FusedKernel"}
    return len(cuda) / runs, len(fused)


def _stats(times: list[float], counts: tuple[float, int]) -> Timing:
    q = statistics.quantiles(times, n=10) if len(times) > 1 else times * 9
    return Timing(statistics.median(times), q[8], min(times), len(times), counts[0], counts[1])


def run(model_path: str | os.PathLike, stitched_path: str | os.PathLike, *, warmup: int = 20, iters: int = 100,
        dim_values: Mapping[str, int] | None = None, overrides: Mapping[str, tuple[int, ...]] | None = None,
        seed: int = 0) -> BenchResult:
    """Benchmark the stock model on ORT's CUDA EP (default graph optimizations) against the
    stitched model with the onnxstitch library registered."""
    import onnxruntime as ort

    from .runtime import session as stitch_session

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    model = onnx.load(str(model_path), load_external_data=False)
    feeds = random_feeds(model, seed, dim_values, overrides)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def stock(so=None):
        return ort.InferenceSession(str(model_path), sess_options=so, providers=providers)

    def stitched(so=None):
        return stitch_session(str(stitched_path), sess_options=so)

    t_stock, out_stock = _time(stock(), feeds, warmup, iters)
    t_stitch, out_stitch = _time(stitched(), feeds, warmup, iters)
    abs_err, rel_err = 0.0, 0.0
    for a, b in zip(out_stitch, out_stock):
        a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a64.size:
            diff = np.abs(a64 - b64)
            both_nan = np.isnan(a64) & np.isnan(b64)
            diff[both_nan] = 0.0
            abs_err = max(abs_err, float(np.max(diff)))
            rel_err = max(rel_err, float(np.max(diff / np.maximum(np.abs(b64), 1e-6))))
    stock_t = _stats(t_stock, _profile_counts(stock, feeds))
    stitch_t = _stats(t_stitch, _profile_counts(stitched, feeds))
    return BenchResult(str(model_path), gpu_name(), ort.__version__, stock_t, stitch_t,
                       stock_t.median_ms / stitch_t.median_ms, abs_err, rel_err,
                       {k: list(v.shape) for k, v in feeds.items()})


