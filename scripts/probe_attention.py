#!/usr/bin/env python3
"""Feasibility probe for an attention kernel (docs/next-steps.md): BERT-base's attention core at
batch 8, sequence 128, 12 heads of 64 — scores = QKᵀ·scale + mask, Softmax, PV, written as
[batch, seq, heads, dim] — as one hand-written float32 kernel (CUDA cores, no tensor cores),
against ONNX Runtime running the same subgraph (two batched GEMMs in TF32, Softmax, Transpose)
and against onnxstitch today (the scale/mask/Softmax stitched), all with CUDA graphs. The
kernel is checked against float64 numpy first. Not part of the tool: it measures whether the
planner should learn the scheme.

    python3 scripts/probe_attention.py [--out probe_attention.json]
"""
from __future__ import annotations

import argparse
import json
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

B, H, S, D = 8, 12, 128, 64
QT = 64  # query rows per block

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(128) attention(const float* __restrict__ q, const float* __restrict__ kt,
    const float* __restrict__ v, const float* __restrict__ mask, float* __restrict__ out, float scale) {
  constexpr int S = 128, D = 64, QT = 64, H = 12;
  extern __shared__ float smem[];
  float* Qs = smem;               // [QT][D]
  float* Ks = Qs + QT * D;        // [D][S]
  float* Vs = Ks + D * S;         // [S][D]
  float* Ps = smem;               // [QT][S], over Qs and Ks once the scores are in registers
  const int bh = blockIdx.x, q0 = blockIdx.y * QT, b = bh / H, h = bh % H, t = threadIdx.x;
  const float4* q4 = reinterpret_cast<const float4*>(q + ((size_t)bh * S + q0) * D);
  const float4* k4 = reinterpret_cast<const float4*>(kt + (size_t)bh * D * S);
  const float4* v4 = reinterpret_cast<const float4*>(v + (size_t)bh * S * D);
  for (int i = t; i < QT * D / 4; i += 128) reinterpret_cast<float4*>(Qs)[i] = q4[i];
  for (int i = t; i < D * S / 4; i += 128) reinterpret_cast<float4*>(Ks)[i] = k4[i];
  for (int i = t; i < S * D / 4; i += 128) reinterpret_cast<float4*>(Vs)[i] = v4[i];
  __syncthreads();
  const int ty = t / 16, tx = t % 16;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
#pragma unroll 4
  for (int d = 0; d < D; ++d) {
    float a[8], k[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = Qs[(ty * 8 + i) * D + d];
#pragma unroll
    for (int j = 0; j < 8; ++j) k[j] = Ks[d * S + tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], k[j], acc[i][j]);
  }
  float m[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) m[j] = mask[b * S + tx + 16 * j];
  __syncthreads();  // Qs and Ks are read: Ps may overwrite them
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float mx = -__int_as_float(0x7f800000);
#pragma unroll
    for (int j = 0; j < 8; ++j) { acc[i][j] = fmaf(acc[i][j], scale, m[j]); mx = fmaxf(mx, acc[i][j]); }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) { acc[i][j] = expf(acc[i][j] - mx); sum += acc[i][j]; }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float r = 1.f / sum;
#pragma unroll
    for (int j = 0; j < 8; ++j) Ps[(ty * 8 + i) * S + tx + 16 * j] = acc[i][j] * r;
  }
  __syncthreads();
  float o[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) o[i][j] = 0.f;
#pragma unroll 4
  for (int c = 0; c < S; ++c) {
    float p[8], w[4];
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = Ps[(ty * 8 + i) * S + c];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = Vs[c * D + tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[i][j] = fmaf(p[i], w[j], o[i][j]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float* dst = out + (((size_t)b * S + q0 + ty * 8 + i) * H + h) * D;
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[tx + 16 * j] = o[i][j];
  }
}
"""


def core_model() -> onnx.ModelProto:
    """The attention core as BERT's export has it (K already transposed by the Q/K/V kernel)."""
    inits = [numpy_helper.from_array(np.array(1 / np.sqrt(D), np.float32), "scale")]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Add", ["ss", "mask"], ["sm"]), helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["y"], perm=[0, 2, 1, 3])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "attention", [vi("q", TP.FLOAT, [B, H, S, D]), vi("kt", TP.FLOAT, [B, H, D, S]),
                                               vi("v", TP.FLOAT, [B, H, S, D]), vi("mask", TP.FLOAT, [B, 1, 1, S])],
                          [vi("y", TP.FLOAT, [B, S, H, D])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def reference(q, kt, v, mask) -> np.ndarray:
    s = q.astype(np.float64) @ kt.astype(np.float64) / np.sqrt(D) + mask.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v.astype(np.float64)).transpose(0, 2, 1, 3)


def probe_kernel(reps: int = 200) -> dict:
    import cupy as cp

    rng = np.random.default_rng(0)
    q, kt, v = (rng.standard_normal(sh).astype(np.float32) for sh in ((B, H, S, D), (B, H, D, S), (B, H, S, D)))
    mask = np.where(rng.random((B, 1, 1, S)) < 0.1, -10000.0, 0.0).astype(np.float32)
    dq, dk, dv, dm = (cp.asarray(a) for a in (q, kt, v, mask))
    out = cp.full((B, S, H, D), np.nan, cp.float32)
    kern = cp.RawKernel(KERNEL, "attention", options=("-std=c++17",))
    smem = (QT * D + D * S + S * D) * 4
    kern.max_dynamic_shared_size_bytes = smem
    args = (dq, dk, dv, dm, out, np.float32(1 / np.sqrt(D)))

    def launch():
        kern((B * H, S // QT), (128,), args, shared_mem=smem)

    launch()
    err = float(np.linalg.norm(out.get() - reference(q, kt, v, mask)) / np.linalg.norm(reference(q, kt, v, mask)))
    for _ in range(20):
        launch()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        launch()
    stop.record()
    stop.synchronize()
    return {"kernel_us": cp.cuda.get_elapsed_time(start, stop) / reps * 1e3, "relative_error_vs_float64": err,
            "blocks": B * H * (S // QT), "shared_bytes": smem}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("probe_attention.json"))
    args = ap.parse_args()
    bench.require_gpu("the attention probe")
    result = {"gpu": bench.gpu_name(), "shape": {"batch": B, "heads": H, "seq": S, "dim": D}}
    result["probe"] = probe_kernel()
    print(f"probe kernel: {result['probe']['kernel_us']:.2f} µs, relative error {result['probe']['relative_error_vs_float64']:.1e}")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "attention.onnx"
        stitched = Path(tmp) / "attention.stitched.onnx"
        onnx.save(core_model(), model)
        onnx.save(onnxstitch.optimize(str(model)).model, stitched)
        r = bench.run(model, stitched, config=bench.BenchConfig(iters=200, cuda_graph=True))
        result["ort"] = r.to_json()
        for label, t in r.configs.items():
            print(f"{label}: {t.median_ms * 1e3:.2f} µs per run (CUDA graphs, {t.launches_per_run:.0f} launches)")
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
