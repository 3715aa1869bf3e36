#!/usr/bin/env python3
"""Generated GEMM configurations against cuBLAS, kernel for kernel (issue 38), on the GPU.

Each configuration of schemes/gemm/generated.py (tile, scheduler, epilogue) is loaded from its
shared object and called through its C ABI (docs/abi.md, "Generated GEMMs") at BERT-base's and a
LLaMA layer's shapes, beside cuBLAS's plain product of the same operands (CuPy's matmul: TF32 in
float32, float32 accumulation in float16; the weight K-major as float32 gemm nodes read it, or
[K, N] for half configurations that read it as stored). Every generated call is captured in a
CUDA graph, `--reps` calls a graph, the graphs launched round by round in turn, so that what is
timed is the kernels alone (as in a stitched model run in CUDA graphs); CuPy cannot capture
cuBLAS, whose `--reps` calls are timed as they are enqueued. (CuPy's cuBLAS is no baseline: at
BERT's shapes it ran 2-3× slower than ORT's cuBLASLt node, bench/results/nvidia-h200/wave3l; read
the configurations against each other.) µs per product: the median round. Each configuration's
output is checked against a float64 product first.

    python3 scripts/bench_cutlass_configs.py [--set stream-k] [--out cutlass_configs.json]

The objects come from the cache (scripts/prebuild_gemms.py built them on the CPU machine) or are
built here by nvcc, all at once.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch.compile import cache_dir  # noqa: E402
from onnxstitch.schemes.gemm import generated as g  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402

from onnxstitch.schemes.gemm.match import FP16_TFLOPS, TF32_TFLOPS  # noqa: E402
from scripts.prebuild_gemms import SETS  # noqa: E402

SHAPES = ((1024, 768, 2304), (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768),
          (2048, 2048, 2560), (2048, 2048, 2048), (2048, 2048, 11264), (2048, 5632, 2048))


class Args(ctypes.Structure):  # cutlass_gemm.cu.in's Args, ABI version 1
    _fields_ = [("m", ctypes.c_longlong), ("n", ctypes.c_longlong), ("k", ctypes.c_longlong),
                ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("c", ctypes.c_void_p),
                ("d", ctypes.c_void_p), ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_ulonglong),
                ("stream", ctypes.c_void_p)]


def load(config: g.Config, image: bytes, folder: Path) -> ctypes.CDLL:
    """The configuration's object loaded from a file of its own."""
    path = folder / f"{config.name}.so"
    path.write_bytes(image)
    lib = ctypes.CDLL(str(path))
    lib.onnxstitch_gemm_workspace.restype = ctypes.c_ulonglong
    lib.onnxstitch_gemm_workspace.argtypes = [ctypes.c_longlong] * 3
    lib.onnxstitch_gemm_run.restype = ctypes.c_int
    lib.onnxstitch_gemm_run.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulonglong]
    if lib.onnxstitch_gemm_abi() != 1:
        raise SystemExit(f"{config.name}: ABI {lib.onnxstitch_gemm_abi()}, expected 1")
    return lib


def graph_of(stream, reps: int, call):
    """`call` captured `reps` times in one CUDA graph on `stream`."""
    with stream:
        call()  # (outside capture: lazy initialisation)
        stream.synchronize()
        stream.begin_capture()
        for _ in range(reps):
            call()
        return stream.end_capture()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", choices=sorted(SETS), help="configurations (default: default, stream-k, persistent)")
    ap.add_argument("--shapes", help="M×K×N list, e.g. 1024x768x768,1024x3072x768 (default: all eight)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("CUPY_TF32", "1")  # cuBLAS on TF32 tensor cores, as ORT's CUDA EP (before CuPy loads)
    import cupy as cp

    configs = list(dict.fromkeys(c for s in (args.set or ["default", "stream-k", "persistent"]) for c in SETS[s]))
    shapes = SHAPES if not args.shapes else tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    props = cp.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        images = pool.map(lambda c: g.build(g.source(c), c.name, cache_dir()), configs)
        libs = {c: load(c, image, Path(tmp)) for c, image in zip(configs, images)}
        for (m, k, n), dtype in ((s, d) for d in (TP.FLOAT, TP.FLOAT16) for s in shapes):
            these = {c: lib for c, lib in libs.items() if c.dtype == dtype}
            if not these:
                continue
            np_dtype = np.float16 if dtype == TP.FLOAT16 else np.float32
            rng = np.random.default_rng(0)
            a_h = rng.standard_normal((m, k)).astype(np_dtype)
            w_h = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np_dtype)  # [N, K]: K-major
            bias_h = (rng.standard_normal(n) * 0.5).astype(np_dtype)
            r_h = rng.standard_normal((m, n)).astype(np_dtype)
            a, w, bias, r = (cp.asarray(x) for x in (a_h, w_h, bias_h, r_h))
            w_kn = cp.ascontiguousarray(w.T)  # [K, N], for half configurations that read it as stored
            ref = a_h.astype(np.float64) @ w_h.T.astype(np.float64)
            graphs, outs = {}, {}
            plain_out = cp.empty((m, n), np_dtype)
            def cublas(a=a, w=w, out=plain_out) -> None:
                for _ in range(args.reps):
                    cp.matmul(a, w.T, out=out)

            with stream:
                cublas()  # (its handle and workspace made before timing)
            for c, lib in these.items():
                d = cp.empty((m, n), np_dtype)
                ws_bytes = int(lib.onnxstitch_gemm_workspace(m, n, k))
                ws = cp.empty(max(ws_bytes, 1), cp.uint8)
                x = Args(m, n, k, a.data.ptr, (w if c.b_kmajor else w_kn).data.ptr, bias.data.ptr,
                         r.data.ptr if c.residual else None, d.data.ptr, ws.data.ptr, ws_bytes, stream.ptr)
                err = ctypes.create_string_buffer(512)

                def call(x=x, lib=lib, err=err, what=f"{c.name} at {m}×{k}×{n}"):
                    if lib.onnxstitch_gemm_run(ctypes.byref(x), err, 512) != 0:
                        raise SystemExit(f"{what}: {err.value.decode()}")

                graphs[c.name] = graph_of(stream, args.reps, call)
                outs[c.name] = (d, ws, x, c)
            times: dict[str, list[float]] = {name: [] for name in ("cublas", *graphs)}
            start, end = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(args.rounds):
                for name in times:
                    with stream:
                        start.record(stream)
                        if name == "cublas":
                            cublas()
                        else:
                            graphs[name].launch(stream)
                        end.record(stream)
                        end.synchronize()
                    times[name].append(cp.cuda.get_elapsed_time(start, end) * 1e3 / args.reps)
            plain = float(np.median(times["cublas"]))
            flops = 2.0 * m * n * k
            peak = FP16_TFLOPS if dtype == TP.FLOAT16 else TF32_TFLOPS
            dt = "float16" if dtype == TP.FLOAT16 else "float32"
            print(f"{dt} {m}×{k}×{n}: cuBLAS plain {plain:.2f} µs ({flops / plain / 1e6:.0f} TFLOP/s)", flush=True)
            rows.append(dict(dtype=dt, m=m, k=k, n=n, kernel="cublas_plain", us=plain, tflops=flops / plain / 1e6))
            for name, (d, _, _, c) in outs.items():
                want = ref + (bias_h.astype(np.float64) if c.bias else 0) + (r_h.astype(np.float64) if c.residual else 0)
                if c.activation == "gelu_erf":
                    from scipy.special import erf
                    want = 0.5 * want * (1 + erf(want / np.sqrt(2)))
                got = cp.asnumpy(d).astype(np.float64)
                worst = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
                us = float(np.median(times[name]))
                ok = worst < 5e-3  # TF32 or half: 10 mantissa bits, K up to 5632
                print(f"  {name:34s} {us:8.2f} µs  {us / plain:5.2f}× of plain  {flops / us / 1e6:4.0f} TFLOP/s "
                      f"({flops / us / 1e6 / peak:.0%})  max rel err {worst:.1e}{'' if ok else '  WRONG'}",
                      flush=True)
                rows.append(dict(dtype=dt, m=m, k=k, n=n, kernel=name, us=us, of_plain=us / plain, tflops=flops / us / 1e6,
                                 max_rel_err=worst, ok=ok, tile_n=c.tile_n, stream_k=c.stream_k,
                                 epilogue=c.activation or ("residual" if c.residual else "bias")))
    if args.out:
        args.out.write_text(json.dumps(dict(device=device, reps=args.reps, rounds=args.rounds, rows=rows), indent=1))
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
