#!/usr/bin/env python3
"""Benchmark: the 20-op elementwise chain on [8192, 4096] (float32, float16).

Measures, in one process on one GPU: the device-to-device copy bandwidth (the ceiling),
the fused kernel alone (launched from its embedded cubin, timed with CUDA events), and stock
ORT CUDA EP vs the stitched model end to end (IO binding). Prints a table, writes JSON.

    python scripts/bench_elementwise.py --out results.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from models.elementwise import HEAVY_CHAIN, LIGHT_CHAIN, chain  # noqa: E402
from onnxstitch import bench  # noqa: E402

ROWS, COLS = 8192, 4096


def launch_ms(launch: Callable[[], object], reps: int) -> float:
    """Milliseconds per call of `launch` (warmed up by the caller), from CUDA events around
    `reps` back-to-back calls on the default stream."""
    import cupy as cp

    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        launch()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / reps


def copy_bandwidth(nbytes: int, reps: int = 50) -> float:
    """Device-to-device copy, GB/s counting bytes read plus written."""
    import cupy as cp

    a = cp.random.standard_normal(nbytes // 4, dtype=cp.float32)
    b = cp.empty_like(a)
    for _ in range(5):
        b[...] = a
    ms = launch_ms(lambda: cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, a.nbytes,
                                                       cp.cuda.runtime.memcpyDeviceToDevice, 0), reps)
    return 2 * a.nbytes / (ms * 1e-3) / 1e9


class _Args(ctypes.Structure):
    # docs/abi.md StitchArgs
    _fields_ = [("inp", ctypes.c_void_p * 32), ("out", ctypes.c_void_p * 16), ("n", ctypes.c_longlong),
                ("rank", ctypes.c_int), ("pad", ctypes.c_int), ("dims", ctypes.c_longlong * 8),
                ("strides", (ctypes.c_longlong * 8) * 32)]


def node_image(node: onnx.NodeProto) -> tuple[bytes, str, int]:
    """(cubin for this GPU, kernel name, vector width) of a FusedKernel node."""
    import cupy as cp

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    cc = int(cp.cuda.Device().compute_capability)  # e.g. 90
    k = list(attrs["image_archs"]).index(cc)
    start = sum(attrs["image_sizes"][:k])
    return attrs["images"][start:start + attrs["image_sizes"][k]], attrs["kernel_name"].decode(), attrs["vec_width"]


def variant_images(model: onnx.ModelProto, shapes: dict) -> dict[str, tuple[bytes, str, int]]:
    """The single fused kernel of `model` compiled under each KernelOptions combination."""
    import cupy as cp

    from onnxstitch import compile as nvrtc, graph as graph_mod, load

    from onnxstitch.schemes.elementwise import codegen
    from onnxstitch import shapes as shapes_mod, sizes as sizes_mod
    from onnxstitch.plan import make_plan

    m = load.constants_to_initializers(load.load(model))
    m, dims = sizes_mod.resolve_shapes(m, shapes)
    g = graph_mod.build(m, shapes_mod.infer(m)[1], dims)
    (grp,) = make_plan(g).groups
    arch = f"sm_{cp.cuda.Device().compute_capability}"
    out = {}
    for prefetch in (False, True):
        for fast in (False, True):
            opts = codegen.KernelOptions(prefetch=prefetch, fast_half=fast)
            src = codegen.generate(g, "stitch_bench", grp.nodes, opts)
            k = nvrtc.compile_kernel(src, (arch,))
            out[f"prefetch={int(prefetch)},fast_half={int(fast)}"] = (k.images[0], src.name, src.vec_width)
    return out


def fused_kernel_time(image: bytes, kernel_name: str, vw: int, x, y, reps: int = 50, grid_cap: int | None = 64) -> float:
    """Milliseconds per launch of a one-input one-output FULL fused kernel from its cubin."""
    import cupy as cp

    cuda = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)) == 0
    name = kernel_name + "_v32"
    assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0
    args = _Args()
    args.inp[0], args.out[0], args.n, args.rank = x.data.ptr, y.data.ptr, x.size, 2
    args.dims[0], args.dims[1] = x.shape
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = max(1, (x.size // vw + 255) // 256)
    if grid_cap:  # docs/abi.md: grid = min(ceil(work / 256), 64 * multiprocessors)
        grid = min(grid, grid_cap * sms)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(args), ctypes.c_void_p))

    def launch():
        assert cuda.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, None, params, None) == 0

    for _ in range(5):
        launch()
    return launch_ms(launch, reps)


def per_node_us(n_ops: int = 20) -> float:
    """Stock ORT's cost of one tiny elementwise node (launch + framework overhead), in µs:
    the cost model's launch constant."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "tiny.onnx"
        onnx.save(chain(n_ops, shape=(1, 256)), src)
        empty = Path(tmp) / "empty.onnx"
        onnx.save(chain(1, shape=(1, 256)), empty)
        many = bench.run(src, src, config=bench.BenchConfig(iters=200))
        one = bench.run(empty, empty, config=bench.BenchConfig(iters=200))
    return (many.stock.median_ms - one.stock.median_ms) / (n_ops - 1) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_elementwise.json"))
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    import cupy as cp

    results = {"gpu": bench.gpu_name(), "shape": [ROWS, COLS], "ops": 20}
    results["copy_gbs"] = copy_bandwidth(ROWS * COLS * 4)
    results["stock_us_per_small_node"] = per_node_us()
    cases = [(f"{TP.DataType.Name(dt).lower()}-{kind}", dt, steps) for kind, steps in
             (("light", LIGHT_CHAIN), ("heavy", HEAVY_CHAIN)) for dt in (TP.FLOAT, TP.FLOAT16)]
    results["ops_light"] = [op for op, _ in LIGHT_CHAIN]
    results["ops_heavy"] = [op for op, _ in HEAVY_CHAIN]
    for name, dtype, steps in cases:
        model = chain(20, shape=("batch", COLS), dtype=dtype, steps=steps)
        res = onnxstitch.optimize(model, shapes={"batch": [ROWS]})
        fused = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "chain.onnx", Path(tmp) / "chain.stitched.onnx"
            onnx.save(model, src)
            onnx.save(res.model, dst)
            b = bench.run(src, dst, config=bench.BenchConfig(warmup=10, iters=args.iters), shapes={"batch": ROWS})
        np_dtype = np.float32 if dtype == TP.FLOAT else np.float16
        x = cp.asarray(np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np_dtype))
        y = cp.empty_like(x)
        k_ms = fused_kernel_time(*node_image(fused[0]), x, y) if len(fused) == 1 else float("nan")
        variants = {f"{v},grid_cap={cap}": 2 * x.nbytes / (fused_kernel_time(*img, x, y, grid_cap=cap) * 1e-3) / 1e9 / results["copy_gbs"]
                    for v, img in variant_images(model, {"batch": [ROWS]}).items() if "fast_half=1" in v
                    for cap in (16, 32, 64, None)}
        moved = 2 * x.nbytes
        results[name] = {
            "kernels_stitched": len(fused), "bench": b.to_json(), "fused_kernel_ms": k_ms,
            "fused_kernel_gbs": moved / (k_ms * 1e-3) / 1e9,
            "fused_kernel_fraction_of_copy": moved / (k_ms * 1e-3) / 1e9 / results["copy_gbs"],
            "end_to_end_gbs": moved / (b.stitched.median_ms * 1e-3) / 1e9,
            "speedup_vs_stock": b.speedup,
            "kernel_fraction_of_copy_by_variant": variants,
        }
    args.out.write_text(json.dumps(results, indent=2))
    print(f"GPU {results['gpu']}: device-to-device copy {results['copy_gbs']:.0f} GB/s, "
          f"stock ORT {results['stock_us_per_small_node']:.1f} µs per small node")
    print(f"{'chain':14} {'stock ms':>9} {'stitched ms':>12} {'speedup':>8} {'kernel ms':>10} {'kernel GB/s':>12} {'of copy':>8} {'maxrel':>8}")
    for name, _, _ in cases:
        r = results[name]
        bj = r["bench"]
        stock, stitched = bj["configs"][bench.STOCK], bj["configs"][bench.STITCHED]
        print(f"{name:14} {stock['median_ms']:9.3f} {stitched['median_ms']:12.3f} {r['speedup_vs_stock']:8.2f} "
              f"{r['fused_kernel_ms']:10.3f} {r['fused_kernel_gbs']:12.0f} {r['fused_kernel_fraction_of_copy']:8.1%} "
              f"{stitched['max_rel_err']:8.2g}")
    for name, _, _ in cases:
        print(f"{name:14} kernel fraction of copy by variant: " +
              ", ".join(f"{k} {v:.1%}" for k, v in results[name]["kernel_fraction_of_copy_by_variant"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
