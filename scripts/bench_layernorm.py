#!/usr/bin/env python3
"""Benchmark: BERT's residual LayerNorm (bias Add, residual Add, LayerNorm over 768 at [1024, 768]),
float16 and float32, timed the way CUDA graphs play kernels (back to back in a captured graph):

- stock ORT against our rows kernel, as a chain of 12 such blocks with a row permutation (a
  Gather) between them (stock against stitched, `bench --cuda-graph`), per block; ORT 1.31 does
  not fuse these blocks into SkipLayerNormalization (BERT's timeline times that kernel);
- our generated rows kernel of that group alone, in a graph of 100 launches;
- hand-written forms of the same row kernel, so that the generator's next form is chosen by
  measurement (issue 38): `two` (two block reductions, mean then squared deviations: the form
  we generate), `onepass` (one reduction of the sum and the sum of squares, as ORT's kernel),
  `chan` (one reduction merging per-thread means and squared deviations: no cancellation),
  `shifted` (sums of the row less its warp's first value, one shuffle reduction, the warps'
  means and deviations merged: no cancellation either), each at several threads per row and
  vector widths; `add` (the same loads and store, no reduction) is the floor. `two` and
  `shifted` are timed again with a by-value parameter as large as StitchArgs (does its size
  cost a launch time?).

    python3 scripts/bench_layernorm.py --out layernorm.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import bench  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402
from scripts.bench_rows import kernel_inputs, rows_launcher  # noqa: E402

ROWS, HIDDEN, CHAIN, EPS = 1024, 768, 12, 1e-12
DIMS = {"batch": 8, "sequence": 128}

SOURCE = r"""
#include <cuda_fp16.h>
typedef ELEM elem;
struct __align__(sizeof(elem) * VW) Vec { elem v[VW]; };
__device__ __forceinline__ float tof(float f) { return f; }
__device__ __forceinline__ float tof(__half h) { return __half2float(h); }
__device__ __forceinline__ void put(float f, float& o) { o = f; }
__device__ __forceinline__ void put(float f, __half& o) { o = __float2half_rn(f); }

struct S1 { float a; };
struct S2 { float a, b; };
struct S3 { float n, m, q; };  // count, mean, sum of squared deviations
__device__ __forceinline__ S1 comb(S1 x, S1 y) { return {x.a + y.a}; }
__device__ __forceinline__ S2 comb(S2 x, S2 y) { return {x.a + y.a, x.b + y.b}; }
__device__ __forceinline__ S3 comb(S3 x, S3 y) {  // Chan et al.'s pairwise merge
  const float n = x.n + y.n;
  if (n == 0.f) return x;
  const float d = y.m - x.m, w = y.n / n;
  return {n, x.m + d * w, x.q + y.q + d * d * x.n * w};
}
__device__ __forceinline__ S1 shfl(S1 v, int o, int w) { return {__shfl_xor_sync(0xffffffffu, v.a, o, w)}; }
__device__ __forceinline__ S2 shfl(S2 v, int o, int w) {
  return {__shfl_xor_sync(0xffffffffu, v.a, o, w), __shfl_xor_sync(0xffffffffu, v.b, o, w)};
}
__device__ __forceinline__ S3 shfl(S3 v, int o, int w) {
  return {__shfl_xor_sync(0xffffffffu, v.n, o, w), __shfl_xor_sync(0xffffffffu, v.m, o, w),
          __shfl_xor_sync(0xffffffffu, v.q, o, w)};
}
template <typename R>
__device__ __forceinline__ R reduce(R v, R ident, R* smem) {
  constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = comb(v, shfl(v, o, W));
  if (TPR <= 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < TPR / 32 ? smem[lane] : ident;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = comb(v, shfl(v, o, 32));
  __syncthreads();
  return v;
}

#if PAD > 0
struct Pad { long long b[PAD / 8]; };  // a by-value parameter of PAD bytes, as StitchArgs is
#define PAD_PARAM , const Pad pad
#else
#define PAD_PARAM
#endif
extern "C" __global__ void __launch_bounds__(BLOCK) ln(const elem* __restrict__ x, const elem* __restrict__ bias,
    const elem* __restrict__ res, const elem* __restrict__ g, const elem* __restrict__ b,
    elem* __restrict__ y, int rows PAD_PARAM) {
  constexpr int NCH = HID / (TPR * VW), RPB = BLOCK / TPR;
  __shared__ S3 smem[32];
  const int lane = threadIdx.x % TPR, row = blockIdx.x * RPB + threadIdx.x / TPR;
  if (row >= rows) return;  // (rows is a multiple of RPB here: no block is left half-empty)
  float h[NCH * VW];
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int c0 = (i * TPR + lane) * VW;
    const Vec xv = *reinterpret_cast<const Vec*>(x + (size_t)row * HID + c0);
    const Vec rv = *reinterpret_cast<const Vec*>(res + (size_t)row * HID + c0);
    const Vec bv = *reinterpret_cast<const Vec*>(bias + c0);
#pragma unroll
    for (int j = 0; j < VW; ++j) h[i * VW + j] = tof(xv.v[j]) + tof(bv.v[j]) + tof(rv.v[j]);
  }
  float mean = 0.f, rstd = 1.f;
#if FORM == 1  // two reductions: the mean, then the squared deviations from it
  S1 s{0.f};
#pragma unroll
  for (int k = 0; k < NCH * VW; ++k) s.a += h[k];
  s = reduce(s, S1{0.f}, reinterpret_cast<S1*>(smem));
  mean = s.a / HID;
  S1 q{0.f};
#pragma unroll
  for (int k = 0; k < NCH * VW; ++k) q.a += (h[k] - mean) * (h[k] - mean);
  q = reduce(q, S1{0.f}, reinterpret_cast<S1*>(smem));
  rstd = rsqrtf(q.a / HID + EPS);
#elif FORM == 2  // one reduction of the sum and the sum of squares
  S2 s{0.f, 0.f};
#pragma unroll
  for (int k = 0; k < NCH * VW; ++k) { s.a += h[k]; s.b += h[k] * h[k]; }
  s = reduce(s, S2{0.f, 0.f}, reinterpret_cast<S2*>(smem));
  mean = s.a / HID;
  rstd = rsqrtf(fmaxf(s.b / HID - mean * mean, 0.f) + EPS);
#elif FORM == 3  // one reduction merging each thread's mean and squared deviations
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < NCH * VW; ++k) m += h[k];
  m *= 1.f / (NCH * VW);
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < NCH * VW; ++k) q += (h[k] - m) * (h[k] - m);
  S3 s = reduce(S3{(float)(NCH * VW), m, q}, S3{0.f, 0.f, 0.f}, smem);
  mean = s.m;
  rstd = rsqrtf(s.q / HID + EPS);
#elif FORM == 4  // one reduction of sums shifted by a value of the row (its warp's first): no cancellation
  constexpr int W = TPR < 32 ? TPR : 32;
  const float k = __shfl_sync(0xffffffffu, h[0], 0, W);
  S2 s{0.f, 0.f};
#pragma unroll
  for (int j = 0; j < NCH * VW; ++j) { const float d = h[j] - k; s.a += d; s.b += d * d; }
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) s = comb(s, shfl(s, o, W));
  constexpr float NW = W * NCH * VW;  // elements a warp holds
  if (TPR <= 32) {
    mean = k + s.a / HID;
    rstd = rsqrtf(fmaxf(s.b / HID - (s.a / HID) * (s.a / HID), 0.f) + EPS);
  } else {  // each warp's (mean, squared deviations), merged in order (equal counts) by every thread
    S2* part = reinterpret_cast<S2*>(smem);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = S2{k + s.a / NW, fmaxf(s.b - s.a * s.a / NW, 0.f)};
    __syncthreads();
    float m = part[0].a, q = part[0].b, n = NW;
#pragma unroll
    for (int w = 1; w < TPR / 32; ++w) {
      const float d = part[w].a - m, n2 = n + NW;
      m += d * (NW / n2);
      q += part[w].b + d * d * (n * NW / n2);
      n = n2;
    }
    mean = m;
    rstd = rsqrtf(q / HID + EPS);
  }
#endif
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int c0 = (i * TPR + lane) * VW;
    Vec o;
#if FORM == 0  // the floor: the same loads and store, no reduction
#pragma unroll
    for (int j = 0; j < VW; ++j) put(h[i * VW + j], o.v[j]);
#else
    const Vec gv = *reinterpret_cast<const Vec*>(g + c0);
    const Vec bv = *reinterpret_cast<const Vec*>(b + c0);
#pragma unroll
    for (int j = 0; j < VW; ++j) put((h[i * VW + j] - mean) * rstd * tof(gv.v[j]) + tof(bv.v[j]), o.v[j]);
#endif
    *reinterpret_cast<Vec*>(y + (size_t)row * HID + c0) = o;
  }
}
"""
FORMS = {"add": 0, "two": 1, "onepass": 2, "chan": 3, "shifted": 4}
# the by-value parameter bytes tried with the two-reduction form (StitchArgs: 2512 bytes)
PADS = (256, 2512)
# (vector width, threads per row) tried per dtype: 96 × 8 halves is ORT's and our choice today
GEOMETRIES = {TP.FLOAT16: ((8, 96), (8, 32), (4, 192), (4, 96), (4, 64)),
              TP.FLOAT: ((4, 192), (4, 96), (4, 64), (4, 32), (2, 384))}


def graph_us(launch, reps: int = 100, rounds: int = 9) -> float:
    """Microseconds per launch of `launch(stream)` played back to back from one CUDA graph of
    `reps` launches (the median over `rounds` playbacks)."""
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    s.begin_capture()
    for _ in range(reps):
        launch(s)
    g = s.end_capture()
    g.launch(s)
    s.synchronize()
    times = []
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(rounds):
        start.record(s)
        g.launch(s)
        stop.record(s)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps)
    return statistics.median(times)


def chain_model(dtype: int) -> onnx.ModelProto:
    """CHAIN blocks of y = LayerNorm(x + bias_i + y_prev) over [batch, sequence, 768], y_prev's
    rows permuted between blocks."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    # each block's residual is the last one's output with its rows permuted (a Gather, in both
    # models): without it the planner stitches the whole chain into one rows kernel
    perm = numpy_helper.from_array(np.arange(DIMS["sequence"])[::-1].copy(), "perm")
    nodes, inits, prev = [], [perm], "r"
    for i in range(CHAIN):
        if i:
            nodes.append(helper.make_node("Gather", [prev, "perm"], [f"p{i}"], axis=1))
            prev = f"p{i}"
        inits += [numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(npd), f"bias{i}"),
                  numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(npd), f"g{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(npd), f"b{i}")]
        nodes += [helper.make_node("Add", ["x", f"bias{i}"], [f"xb{i}"]),
                  helper.make_node("Add", [f"xb{i}", prev], [f"h{i}"]),
                  helper.make_node("LayerNormalization", [f"h{i}", f"g{i}", f"b{i}"], [f"y{i}"], axis=-1,
                                   epsilon=EPS)]
        prev = f"y{i}"
    shape = ["batch", "sequence", HIDDEN]
    graph = helper.make_graph(nodes, "residual_layernorm", [helper.make_tensor_value_info("x", dtype, shape),
                                                            helper.make_tensor_value_info("r", dtype, shape)],
                              [helper.make_tensor_value_info(prev, dtype, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)  # (ORT 1.31 reads up to 13)


def reference(x, bias, r, g, b) -> np.ndarray:
    """The block in float64."""
    h = x.astype(np.float64) + bias + r
    mu = h.mean(-1, keepdims=True)
    return (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + EPS) * g + b


def forms(dtype: int) -> list[dict]:
    """Every hand-written form at every geometry: µs per launch in a graph, GB/s, worst error."""
    import cupy as cp

    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(1)
    host = [rng.standard_normal((ROWS, HIDDEN)).astype(npd), (0.1 * rng.standard_normal(HIDDEN)).astype(npd),
            rng.standard_normal((ROWS, HIDDEN)).astype(npd), (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(npd),
            (0.1 * rng.standard_normal(HIDDEN)).astype(npd)]
    dev = [cp.asarray(a) for a in host]
    y = cp.empty((ROWS, HIDDEN), npd)
    want = reference(*host)
    moved = 3 * ROWS * HIDDEN * np.dtype(npd).itemsize
    elem = "__half" if dtype == TP.FLOAT16 else "float"
    out = []
    cuda = ctypes.CDLL("libcuda.so.1")
    for vec, threads in GEOMETRIES[dtype]:
        if HIDDEN % (vec * threads):
            continue
        block = threads if threads > 32 else 128
        variants = [(form, 0) for form in FORMS] + [("two", pad) for pad in PADS] + [("shifted", pad) for pad in PADS]
        for form, pad in variants:
            opts = (f"-DELEM={elem}", f"-DVW={vec}", f"-DTPR={threads}", f"-DBLOCK={block}", f"-DHID={HIDDEN}",
                    f"-DFORM={FORMS[form]}", f"-DEPS={EPS}f", f"-DPAD={pad}", "--use_fast_math")
            try:
                fn = cp.RawModule(code=SOURCE, options=opts).get_function("ln")
            except Exception as e:  # reported, not fatal: the other forms stand
                print(f"  {form} V={vec} T={threads} +{pad}: {type(e).__name__}: {str(e)[:400]}")
                continue
            grid = ROWS // (block // threads)
            vals = [ctypes.c_void_p(a.data.ptr) for a in (*dev, y)] + [ctypes.c_int(ROWS)]
            vals += [(ctypes.c_char * pad)()] if pad else []
            params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])

            def launch(s, fn=fn, grid=grid, block=block, params=params, vals=vals):
                return cuda.cuLaunchKernel(ctypes.c_void_p(fn.kernel.ptr), grid, 1, 1, block, 1, 1, 0,
                                           ctypes.c_void_p(s.ptr), params, None)

            assert launch(cp.cuda.Stream.null) == 0, f"{form} V={vec} T={threads}: launch failed"
            cp.cuda.Device().synchronize()
            got = cp.asnumpy(y).astype(np.float64)
            err = float(np.abs(got - (host[0].astype(np.float64) + host[1] + host[2] if form == "add" else want)).max())
            us = graph_us(launch)
            out.append({"form": form, "param_bytes": pad, "vec": vec, "threads_per_row": threads, "block": block,
                        "us": round(us, 3), "gbs": round(moved / (us * 1e-6) / 1e9, 1), "max_abs_err": err})
            print(f"  {form:8} V={vec} T={threads:<4} block {block:<4} param +{pad:<5} {us:7.3f} µs"
                  f"  {out[-1]['gbs']:7.1f} GB/s  err {err:.2e}")
    return out


def ours_and_ort(dtype: int, iters: int) -> dict:
    """The chain stock against stitched (our rows kernels) in CUDA graphs, per block (its
    Gathers included, in both; ORT 1.31's own fusions made no SkipLayerNormalization of these
    blocks), and our kernel alone in a graph of launches."""
    import cupy as cp

    model = chain_model(dtype)
    res = onnxstitch.optimize(model, shapes={k: [v] for k, v in DIMS.items()}, verify=False, gate=False)
    fused = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    row: dict = {"kernels_stitched": len(fused)}
    if fused:
        node = fused[1 if len(fused) > 1 else 0]  # one in mid-chain: its residual is computed
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        row["row_geometry"] = list(attrs.get("row_geometry", []))
        feeds = random_feeds(model, 0, DIMS)
        arrays = [cp.asarray(a) for a in kernel_inputs(res.model, feeds, list(node.input))]
        outs = [cp.empty((DIMS["batch"], DIMS["sequence"], HIDDEN), arrays[0].dtype) for _ in node.output]
        launch = rows_launcher(node, arrays, outs)
        row["ours_alone_us"] = round(graph_us(lambda s: launch(s.ptr)), 3)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "m.onnx", Path(tmp) / "m.stitched.onnx"
        onnx.save(model, src)
        onnx.save(res.model, dst)
        b = bench.run(src, dst, config=bench.BenchConfig(warmup=20, iters=iters, cuda_graph=True), shapes=DIMS)
    row.update(stock_us_per_block=round(b.stock.median_ms * 1e3 / CHAIN, 3),
               stitched_us_per_block=round(b.stitched.median_ms * 1e3 / CHAIN, 3), speedup=b.speedup,
               stock_launches=b.stock.launches_per_run, max_abs_err=b.max_abs_err)
    print(f"  chain of {CHAIN}: ORT {row['stock_us_per_block']:.3f} µs a block, ours {row['stitched_us_per_block']:.3f}"
          f" ({b.speedup:.3f}×); ours alone {row.get('ours_alone_us')} µs, geometry {row.get('row_geometry')}")
    return row


def main() -> None:
    """Time every form and the chain for each dtype; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_layernorm.json"))
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--dtypes", default="float16,float32")
    args = ap.parse_args()
    bench.require_gpu("bench_layernorm")
    result = {"device": bench.gpu_name(), "rows": ROWS, "hidden": HIDDEN, "versions": bench.package_versions()}
    for name in args.dtypes.split(","):
        dtype = TP.FLOAT16 if name == "float16" else TP.FLOAT
        print(f"== {name}")
        result[name] = {"chain": ours_and_ort(dtype, args.iters), "forms": forms(dtype)}
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
