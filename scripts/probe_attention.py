#!/usr/bin/env python3
"""Feasibility probe for an attention kernel (docs/next-steps.md): BERT-base's attention core at
batch 8, sequence 128, 12 heads of 64 — scores = QKᵀ·scale + mask, Softmax, PV, written as
[batch, seq, heads, dim] — as one hand-written float32 kernel (CUDA cores, no tensor cores),
against ONNX Runtime running the same subgraph (two batched GEMMs in TF32, Softmax, Transpose)
and against onnxstitch today (the scale/mask/Softmax stitched), all with CUDA graphs. The
kernel is checked against float64 numpy first; a second one runs both products on TF32
tensor cores (`mma.sync` m16n8k8), as ORT's GEMMs do. Not part of the tool: it measures whether the
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
from scripts.bench_elementwise import launch_ms  # noqa: E402

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

TC_KERNEL = r"""
__device__ __forceinline__ unsigned tf32(float x) { unsigned u; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x)); return u; }
__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// One block per (batch·head, 64 queries); a warp per 16 queries. Padded strides keep the
// fragment loads free of bank conflicts.
extern "C" __global__ void __launch_bounds__(128) attention_tc(const float* __restrict__ q, const float* __restrict__ kt,
    const float* __restrict__ v, const float* __restrict__ mask, float* __restrict__ out, float scale) {
  constexpr int S = 128, D = 64, QT = 64, H = 12, QS = 68, KS = 136, VS = 72, PS = 132;
  extern __shared__ float smem[];
  float* Qs = smem;             // [QT][QS]
  float* Kts = Qs + QT * QS;    // [D][KS]
  float* Vs = Kts + D * KS;     // [S][VS]
  float* Ps = smem;             // [QT][PS] over Qs and Kts once the scores are in registers
  const int bh = blockIdx.x, q0 = blockIdx.y * QT, b = bh / H, h = bh % H, t = threadIdx.x;
  const int w = t / 32, lane = t % 32, g = lane / 4, tig = lane % 4;
  const float4* q4 = reinterpret_cast<const float4*>(q + ((size_t)bh * S + q0) * D);
  const float4* k4 = reinterpret_cast<const float4*>(kt + (size_t)bh * D * S);
  const float4* v4 = reinterpret_cast<const float4*>(v + (size_t)bh * S * D);
  for (int i = t; i < QT * D / 4; i += 128) { const float4 x = q4[i]; float* d = Qs + (i * 4 / D) * QS + i * 4 % D; d[0] = x.x; d[1] = x.y; d[2] = x.z; d[3] = x.w; }
  for (int i = t; i < D * S / 4; i += 128) { const float4 x = k4[i]; float* d = Kts + (i * 4 / S) * KS + i * 4 % S; d[0] = x.x; d[1] = x.y; d[2] = x.z; d[3] = x.w; }
  for (int i = t; i < S * D / 4; i += 128) { const float4 x = v4[i]; float* d = Vs + (i * 4 / D) * VS + i * 4 % D; d[0] = x.x; d[1] = x.y; d[2] = x.z; d[3] = x.w; }
  __syncthreads();
  const int r0 = w * 16;
  unsigned a[8][4];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    a[k][0] = tf32(Qs[(r0 + g) * QS + k * 8 + tig]);
    a[k][1] = tf32(Qs[(r0 + g + 8) * QS + k * 8 + tig]);
    a[k][2] = tf32(Qs[(r0 + g) * QS + k * 8 + tig + 4]);
    a[k][3] = tf32(Qs[(r0 + g + 8) * QS + k * 8 + tig + 4]);
  }
  float c[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      mma(c[n], a[k], tf32(Kts[(k * 8 + tig) * KS + n * 8 + g]), tf32(Kts[(k * 8 + tig + 4) * KS + n * 8 + g]));
  }
  __syncthreads();  // every warp is done with Qs and Kts: Ps may overwrite them
  float mx0 = -__int_as_float(0x7f800000), mx1 = mx0;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const float m0 = mask[b * S + n * 8 + 2 * tig], m1 = mask[b * S + n * 8 + 2 * tig + 1];
    c[n][0] = fmaf(c[n][0], scale, m0); c[n][1] = fmaf(c[n][1], scale, m1);
    c[n][2] = fmaf(c[n][2], scale, m0); c[n][3] = fmaf(c[n][3], scale, m1);
    mx0 = fmaxf(mx0, fmaxf(c[n][0], c[n][1])); mx1 = fmaxf(mx1, fmaxf(c[n][2], c[n][3]));
  }
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) { mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o)); mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o)); }
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    c[n][0] = __expf(c[n][0] - mx0); c[n][1] = __expf(c[n][1] - mx0);
    c[n][2] = __expf(c[n][2] - mx1); c[n][3] = __expf(c[n][3] - mx1);
    s0 += c[n][0] + c[n][1]; s1 += c[n][2] + c[n][3];
  }
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) { s0 += __shfl_xor_sync(0xffffffffu, s0, o); s1 += __shfl_xor_sync(0xffffffffu, s1, o); }
  const float i0 = 1.f / s0, i1 = 1.f / s1;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    Ps[(r0 + g) * PS + n * 8 + 2 * tig] = c[n][0] * i0; Ps[(r0 + g) * PS + n * 8 + 2 * tig + 1] = c[n][1] * i0;
    Ps[(r0 + g + 8) * PS + n * 8 + 2 * tig] = c[n][2] * i1; Ps[(r0 + g + 8) * PS + n * 8 + 2 * tig + 1] = c[n][3] * i1;
  }
  __syncwarp();  // a warp reads back only its own rows
  float o[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll 4
  for (int k = 0; k < 16; ++k) {
    unsigned p[4] = {tf32(Ps[(r0 + g) * PS + k * 8 + tig]), tf32(Ps[(r0 + g + 8) * PS + k * 8 + tig]),
                     tf32(Ps[(r0 + g) * PS + k * 8 + tig + 4]), tf32(Ps[(r0 + g + 8) * PS + k * 8 + tig + 4])};
#pragma unroll
    for (int n = 0; n < 8; ++n)
      mma(o[n], p, tf32(Vs[(k * 8 + tig) * VS + n * 8 + g]), tf32(Vs[(k * 8 + tig + 4) * VS + n * 8 + g]));
  }
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    float* d0 = out + (((size_t)b * S + q0 + r0 + g) * H + h) * D + n * 8 + 2 * tig;
    float* d1 = out + (((size_t)b * S + q0 + r0 + g + 8) * H + h) * D + n * 8 + 2 * tig;
    *reinterpret_cast<float2*>(d0) = make_float2(o[n][0], o[n][1]);
    *reinterpret_cast<float2*>(d1) = make_float2(o[n][2], o[n][3]);
  }
}
"""
TC_SHARED = (QT * 68 + 64 * 136 + 128 * 72) * 4


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


def probe_kernel(source: str, name: str, smem: int, reps: int = 200) -> dict:
    """One probe kernel: its error against float64 numpy and its time per launch."""
    import cupy as cp

    rng = np.random.default_rng(0)
    q, kt, v = (rng.standard_normal(sh).astype(np.float32) for sh in ((B, H, S, D), (B, H, D, S), (B, H, S, D)))
    mask = np.where(rng.random((B, 1, 1, S)) < 0.1, -10000.0, 0.0).astype(np.float32)
    dq, dk, dv, dm = (cp.asarray(a) for a in (q, kt, v, mask))
    out = cp.full((B, S, H, D), np.nan, cp.float32)
    kern = cp.RawKernel(source, name, options=("-std=c++17",))
    kern.max_dynamic_shared_size_bytes = smem
    args = (dq, dk, dv, dm, out, np.float32(1 / np.sqrt(D)))

    def launch():
        kern((B * H, S // QT), (128,), args, shared_mem=smem)

    launch()
    want = reference(q, kt, v, mask)
    err = float(np.linalg.norm(out.get() - want) / np.linalg.norm(want))
    for _ in range(20):
        launch()
    return {"kernel_us": launch_ms(launch, reps) * 1e3, "relative_error_vs_float64": err,
            "blocks": B * H * (S // QT), "shared_bytes": smem}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("probe_attention.json"))
    args = ap.parse_args()
    bench.require_gpu("the attention probe")
    result = {"gpu": bench.gpu_name(), "shape": {"batch": B, "heads": H, "seq": S, "dim": D}}
    for label, (src, name, smem) in {"probe": (KERNEL, "attention", (QT * D + D * S + S * D) * 4),
                                     "probe_tf32_mma": (TC_KERNEL, "attention_tc", TC_SHARED)}.items():
        result[label] = probe_kernel(src, name, smem)
        print(f"{label}: {result[label]['kernel_us']:.2f} µs, relative error "
              f"{result[label]['relative_error_vs_float64']:.1e}")
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
