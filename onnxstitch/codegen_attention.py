"""Stage 6 for attention chains (attention.py): one kernel for QKᵀ·scale + mask → Softmax → ·V.

Kernel ABI: docs/abi.md, shape_rule "attention". A block of 4 warps owns 64 queries of one
(batch, head); each warp 16 of them, held as TF32 `mma.sync` m16n8k8 A fragments for the whole
kernel. The keys go by in tiles of 64: the tile of Kᵀ and of V is staged in shared memory
(rows padded by 8 floats so the fragment reads hit 32 different banks), the warp computes its
16 × 64 scores on tensor cores, scales them, adds the mask, and folds them into a running row
maximum and sum (FlashAttention's online Softmax: earlier partial results are rescaled by
exp(old max − new max)). The probabilities go through a per-warp shared buffer into A
fragments for the second product. The context is normalised once at the end and stored at
[b, h, s, d], or [b, s, h, d] when the chain's Transpose was folded. Sequence lengths are
runtime values (tiles are guarded); the head size is compiled in.
"""
from __future__ import annotations

from . import attention
from .codegen import ARGS_STRUCT, ATTENTION_ENTRY_SUFFIX as ENTRY_SUFFIX, KernelSource
from .graph import FusionGraph

QUERIES = 64  # per block: 4 warps × 16 rows of the mma tile
KEYS = 64  # per tile of keys
THREADS = 128

# TF32 conversion and the m16n8k8 product. Device forms only: tests/host_cuda.h has host ones.
MMA_PRELUDE = r"""
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ unsigned stitch_tf32(float x) {
  unsigned u;
  asm volatile("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
}
// c (16×8, f32) += a (16×8, tf32, row) · b (8×8, tf32, col); fragments as the PTX ISA lays
// them out for lane (g = lane / 4, t = lane % 4): a = (g, t), (g+8, t), (g, t+4), (g+8, t+4);
// b = (t, g), (t+4, g); c = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void stitch_mma_tf32(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
"""


def shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block: the Kᵀ and V tiles and the probabilities."""
    return 4 * (head_dim * (KEYS + 8) + KEYS * (head_dim + 8) + QUERIES * (KEYS + 4))


def _literal(x: float) -> str:
    return f"{float.hex(float(x))}f" if x == x else "__int_as_float(0x7fc00000)"


def generate(graph: FusionGraph, name: str, m: attention.Match) -> KernelSource:
    """The kernel for chain `m` under entry `name` + "_attn" (docs/abi.md, "attention")."""
    d = m.head_dim
    scale = _literal(m.scale)
    mask = "true" if m.mask else "false"
    body = f"""
{ARGS_STRUCT}
{MMA_PRELUDE}
// {m.q} · {m.kt} → Softmax → · {m.v} → {m.output}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}{ENTRY_SUFFIX}(const StitchArgs a) {{
  constexpr int D = {d}, QT = {QUERIES}, KT = {KEYS}, NT = D / 8, KS = KT + 8, VS = D + 8, PS = KT + 4;
  constexpr bool MASK = {mask}, TRANSPOSED = {"true" if m.transposed else "false"};
  constexpr float LOG2E = 1.4426950408889634f;
  const float NEG_INF = -__int_as_float(0x7f800000);
  extern __shared__ __align__(16) float stitch_smem[];
  float* Ks = stitch_smem;     // [D][KS]: the tile's columns of Kᵀ
  float* Vs = Ks + D * KS;     // [KT][VS]: the tile's rows of V
  float* Ps = Vs + KT * VS;    // [QT][PS]: probabilities, 16 rows per warp
  const long long H = a.dims[1];
  const int Sq = (int)a.dims[2], Sk = (int)a.dims[3];
  const int tiles = (Sq + QT - 1) / QT;
  const long long bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
  const int q0 = (int)(blockIdx.x % tiles) * QT;
  const int t = threadIdx.x, lane = t & 31, g = lane >> 2, tg = lane & 3, r0 = (t >> 5) * 16;
  const float* q = static_cast<const float*>(a.in[0]) + bh * Sq * D;
  const float* kt = static_cast<const float*>(a.in[1]) + bh * D * Sk;
  const float* v = static_cast<const float*>(a.in[2]) + bh * Sk * D;
  const int qa = q0 + r0 + g, qb = qa + 8;  // this thread's two query rows
  // The warp's queries as A fragments, read once from global memory.
  unsigned qf[NT][4];
#pragma unroll
  for (int k = 0; k < NT; ++k) {{
    qf[k][0] = stitch_tf32(qa < Sq ? q[(long long)qa * D + k * 8 + tg] : 0.f);
    qf[k][1] = stitch_tf32(qb < Sq ? q[(long long)qb * D + k * 8 + tg] : 0.f);
    qf[k][2] = stitch_tf32(qa < Sq ? q[(long long)qa * D + k * 8 + tg + 4] : 0.f);
    qf[k][3] = stitch_tf32(qb < Sq ? q[(long long)qb * D + k * 8 + tg + 4] : 0.f);
  }}
  const float* mk = nullptr;
  long long ma = 0, mb = 0, mc = 0;
  if (MASK) {{
    mk = static_cast<const float*>(a.in[3]) + b * a.strides[3][0] + h * a.strides[3][1];
    ma = (long long)(qa < Sq ? qa : 0) * a.strides[3][2], mb = (long long)(qb < Sq ? qb : 0) * a.strides[3][2];
    mc = a.strides[3][3];
  }}
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;  // running max and (partial) sum per row
  const bool vec_keys = (Sk & 3) == 0;
  for (int t0 = 0; t0 < Sk; t0 += KT) {{
    __syncthreads();  // every warp is done with the previous tile
    if (vec_keys && t0 + KT <= Sk) {{
      for (int i = t; i < D * KT / 4; i += {THREADS}) {{
        const int dd = i / (KT / 4), j = (i % (KT / 4)) * 4;
        *reinterpret_cast<float4*>(Ks + dd * KS + j) = *reinterpret_cast<const float4*>(kt + (long long)dd * Sk + t0 + j);
      }}
    }} else {{
      for (int i = t; i < D * KT; i += {THREADS}) {{
        const int dd = i / KT, j = i % KT;
        Ks[dd * KS + j] = t0 + j < Sk ? kt[(long long)dd * Sk + t0 + j] : 0.f;
      }}
    }}
    for (int i = t; i < KT * D / 4; i += {THREADS}) {{
      const int j = i / (D / 4), c = (i % (D / 4)) * 4;
      *reinterpret_cast<float4*>(Vs + j * VS + c) = t0 + j < Sk
          ? *reinterpret_cast<const float4*>(v + (long long)(t0 + j) * D + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }}
    __syncthreads();
    float s[KT / 8][4];
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {{
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int k = 0; k < NT; ++k)
        stitch_mma_tf32(s[n], qf[k], stitch_tf32(Ks[(k * 8 + tg) * KS + n * 8 + g]),
                        stitch_tf32(Ks[(k * 8 + tg + 4) * KS + n * 8 + g]));
    }}
    float x0 = NEG_INF, x1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {{
#pragma unroll
      for (int e = 0; e < 2; ++e) {{
        const int key = t0 + n * 8 + 2 * tg + e;
        if (key < Sk) {{
          s[n][e] = MASK ? fmaf(s[n][e], {scale}, mk[ma + key * mc]) : s[n][e] * {scale};
          s[n][2 + e] = MASK ? fmaf(s[n][2 + e], {scale}, mk[mb + key * mc]) : s[n][2 + e] * {scale};
        }} else {{
          s[n][e] = s[n][2 + e] = NEG_INF;
        }}
        x0 = fmaxf(x0, s[n][e]), x1 = fmaxf(x1, s[n][2 + e]);
      }}
    }}
#pragma unroll
    for (int k = 1; k < 4; k <<= 1) {{
      x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, k));
      x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, k));
    }}
    // New maxima; a row with no finite score yet keeps 0 as its base so exp gives 0, not NaN.
    const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
    const float base0 = n0 == NEG_INF ? 0.f : n0, base1 = n1 == NEG_INF ? 0.f : n1;
    const float c0 = exp2f((m0 - base0) * LOG2E), c1 = exp2f((m1 - base1) * LOG2E);
    m0 = n0, m1 = n1, l0 *= c0, l1 *= c1;
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] *= c0, o[n][1] *= c0, o[n][2] *= c1, o[n][3] *= c1;
    float* p0 = Ps + (r0 + g) * PS;
    float* p1 = p0 + 8 * PS;
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {{
      const float e0 = exp2f((s[n][0] - base0) * LOG2E), e1 = exp2f((s[n][1] - base0) * LOG2E);
      const float e2 = exp2f((s[n][2] - base1) * LOG2E), e3 = exp2f((s[n][3] - base1) * LOG2E);
      l0 += e0 + e1, l1 += e2 + e3;
      p0[n * 8 + 2 * tg] = e0, p0[n * 8 + 2 * tg + 1] = e1;
      p1[n * 8 + 2 * tg] = e2, p1[n * 8 + 2 * tg + 1] = e3;
    }}
    __syncwarp();  // a warp reads back only its own rows
#pragma unroll
    for (int k = 0; k < KT / 8; ++k) {{
      const unsigned pf[4] = {{stitch_tf32(p0[k * 8 + tg]), stitch_tf32(p1[k * 8 + tg]),
                              stitch_tf32(p0[k * 8 + tg + 4]), stitch_tf32(p1[k * 8 + tg + 4])}};
#pragma unroll
      for (int n = 0; n < NT; ++n)
        stitch_mma_tf32(o[n], pf, stitch_tf32(Vs[(k * 8 + tg) * VS + n * 8 + g]),
                        stitch_tf32(Vs[(k * 8 + tg + 4) * VS + n * 8 + g]));
    }}
    __syncwarp();  // the next tile's probabilities overwrite these rows
  }}
#pragma unroll
  for (int k = 1; k < 4; k <<= 1) {{
    l0 += __shfl_xor_sync(0xffffffffu, l0, k);
    l1 += __shfl_xor_sync(0xffffffffu, l1, k);
  }}
  const float i0 = 1.f / l0, i1 = 1.f / l1;
  float* out = static_cast<float*>(a.out[0]);
  const long long rowa = TRANSPOSED ? (b * Sq + qa) * H + h : bh * Sq + qa;
  const long long rowb = TRANSPOSED ? (b * Sq + qb) * H + h : bh * Sq + qb;
#pragma unroll
  for (int n = 0; n < NT; ++n) {{
    if (qa < Sq) *reinterpret_cast<float2*>(out + rowa * D + n * 8 + 2 * tg) = make_float2(o[n][0] * i0, o[n][1] * i0);
    if (qb < Sq) *reinterpret_cast<float2*>(out + rowb * D + n * 8 + 2 * tg) = make_float2(o[n][2] * i1, o[n][3] * i1);
  }}
}}
"""
    return KernelSource(
        name=name, source=body, vec_width=1, inputs=m.inputs, outputs=(m.output,),
        input_kinds=(1,) * len(m.inputs), output_dtypes=(graph.tensors[m.output].dtype,), shape_rule="attention",
        attention=(d, QUERIES, THREADS, shared_bytes(d), int(m.mask is not None), int(m.transposed)))
