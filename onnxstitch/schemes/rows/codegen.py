"""Code generation, rows scheme: one kernel for a group that reduces a run of consecutive axes of its
iteration space (Reduce*, Softmax, LogSoftmax, LayerNormalization, global pools) together with
the elementwise work before and after the reductions (FusionStitching's warp and block
composition).

The row is the product of the axes the group's reductions reduce: trailing axes, or a run
followed by others — a column reduction, where one thread owns a column whose elements lie S
apart (S the product of the axes after the run), so that neighbouring threads read neighbouring
addresses. Every tensor of the
group is either per-element (varies along the row) or per-row (constant along it). A row
belongs to `T` threads: a few lanes or a warp for short rows (reductions by shuffles only), a
whole block for long ones (shuffles, then shared memory). When the row fits, each thread
loads its share once into registers with 16-byte accesses, computes the first reduction's
input into registers, issues the next row's loads, and runs every pass — one per reduction,
then the per-element outputs — from registers: one read and one write of the row. Longer rows
than planned (dynamic dims) take a loop path that re-reads the row per pass. Per-row steps run
as soon as their inputs exist; lane 0 stores per-row outputs.

Steps, row levels and geometry come from rowplan.py. Kernel ABI: docs/abi.md, shape_rule "rows",
entries `<name>_rows` (32-bit indices) and `<name>_rows64`.
"""
from __future__ import annotations

import math

from ... import ops
from ...graph import FusionGraph, reduced_shape
from ..source import ARGS_STRUCT, BROADCAST, FULL, KernelSource, half_only
from ... import rowplan as rows
from .printer import FULL_OUTPUT, ROW_DROPPED_OUTPUT, ROW_OUTPUT, RowPrinter
from .spec import RowsSpec

ROWS_PRELUDE = r"""
__device__ __forceinline__ bool stitch_aligned(const void* p, unsigned long long n) {
  return reinterpret_cast<unsigned long long>(p) % n == 0;
}
// The row's total for each of its T threads: shuffles within an aligned group of T <= 32
// lanes, or (T == blockDim.x > 32) shuffles then one partial per warp in smem.
template <int T, typename V, typename F>
__device__ __forceinline__ V stitch_row_reduce(V v, F f, V ident, V* smem) {
#pragma unroll
  for (int o = (T < 32 ? T : 32) / 2; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o, T < 32 ? T : 32));
  if (T <= 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < T / 32 ? smem[lane] : ident;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // the next reduction may overwrite smem
  return v;
}
// A row's mean and variance in one reduction (LayerNorm's two passes), each of its T threads
// holding N values and its sums s, q of them less k, one value of its warp's (or lane group's)
// part of the row: no cancellation where |mean| >> std. The warps' (mean, squared deviations)
// are merged in order (Chan et al.'s update, equal counts) by every thread. Counts are
// compile-time, so every division is by a constant folded into a multiply: IEEE divisions on
// this path (one row per block, latency-bound) cost more than the reduction itself.
template <int T, int N>
__device__ __forceinline__ float2 stitch_row_moments(float k, float s, float q, float2* smem) {
  constexpr int W = T < 32 ? T : 32;
  constexpr float NW = (float)(N * W), INV = 1.0f / NW;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o, W);
    q += __shfl_xor_sync(0xffffffffu, q, o, W);
  }
  const float mean = k + s * INV, m2 = fmaxf(q - s * (s * INV), 0.f);
  if (T <= 32) return make_float2(mean, m2 * INV);
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = make_float2(mean, m2);
  __syncthreads();
  float2 t = smem[0];
#pragma unroll
  for (int w = 1; w < T / 32; ++w) {  // w warps merged so far, w·NW values
    const float2 u = smem[w];
    const float d = u.x - t.x;
    t.x += d * (1.0f / (float)(w + 1));
    t.y += u.y + d * d * (NW * (float)w / (float)(w + 1));
  }
  __syncthreads();  // the next reduction may overwrite smem
  return make_float2(t.x, t.y * (1.0f / (NW * (float)(T / 32))));
}
"""


CLUSTER_PRELUDE = r"""
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STITCH_CLUSTERS 1
__device__ __forceinline__ unsigned stitch_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void stitch_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address of *p in the shared memory of the cluster's block `rank` (distributed shared memory).
template <typename V>
__device__ __forceinline__ const V* stitch_cluster_ptr(const V* p, unsigned rank) {
  unsigned long long out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(p), "r"(rank));
  return reinterpret_cast<const V*>(out);
}
#endif
template <int KS>
__device__ __forceinline__ unsigned stitch_rank() {
#ifdef STITCH_CLUSTERS
  if constexpr (KS > 1) return stitch_cluster_rank();
#endif
  return 0;
}
// A split row's total: each block's total (in every thread) goes to its `slot`; after a
// cluster barrier every thread combines the KS slots in rank order, so all blocks hold the same
// value. Callers alternate slots between rows: a block running ahead into the next row writes
// the other slot, and reaches this one again only after the next barrier, which the slower
// blocks pass only once they have read it.
// EACH: every thread has a total of its own (a split column kernel: a column per thread), in
// its own slot; else thread 0's stands for the block.
template <int KS, bool EACH = false, typename V, typename F>
__device__ __forceinline__ V stitch_cluster_reduce(V v, F f, V* slot) {
#ifdef STITCH_CLUSTERS
  if constexpr (KS > 1) {
    if (EACH || threadIdx.x == 0) *slot = v;
    stitch_cluster_sync();
    V r = *stitch_cluster_ptr(slot, 0);
#pragma unroll
    for (unsigned k = 1; k < KS; ++k) r = f(r, *stitch_cluster_ptr(slot, k));
    return r;
  }
#endif
  return v;
}
// No block of a cluster may exit while another may still read its slots.
template <int KS>
__device__ __forceinline__ void stitch_cluster_done() {
#ifdef STITCH_CLUSTERS
  if constexpr (KS > 1) stitch_cluster_sync();
#endif
}
"""


ARG_PRELUDE = r"""
// ArgMax/ArgMin across the row's T threads: (value, position) pairs, position -1 = none yet.
template <bool MAX, bool LAST, typename V>
__device__ __forceinline__ bool stitch_arg_better(V a, long long ai, V b, long long bi) {
  if (bi < 0) return false;
  if (ai < 0) return true;
  if (MAX ? b > a : b < a) return true;
  return b == a && (LAST ? bi > ai : bi < ai);
}
template <int T, bool MAX, bool LAST, typename V>
__device__ __forceinline__ void stitch_row_argreduce(V& v, long long& i, V* smem) {
  __shared__ long long stitch_smem_idx[32];
#pragma unroll
  for (int o = (T < 32 ? T : 32) / 2; o > 0; o >>= 1) {
    const V ov = __shfl_xor_sync(0xffffffffu, v, o, T < 32 ? T : 32);
    const long long oi = __shfl_xor_sync(0xffffffffu, i, o, T < 32 ? T : 32);
    if (stitch_arg_better<MAX, LAST>(v, i, ov, oi)) { v = ov; i = oi; }
  }
  if (T <= 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { smem[warp] = v; stitch_smem_idx[warp] = i; }
  __syncthreads();
  v = lane < T / 32 ? smem[lane] : v;
  i = lane < T / 32 ? stitch_smem_idx[lane] : -1LL;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const V ov = __shfl_xor_sync(0xffffffffu, v, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (stitch_arg_better<MAX, LAST>(v, i, ov, oi)) { v = ov; i = oi; }
  }
  __syncthreads();  // the next reduction may overwrite smem
}
"""


def generate_rows(graph: FusionGraph, name: str, nodes: tuple[int, ...], fast_half: bool = True,
                  threads: int | None = None) -> KernelSource:
    """CUDA source of a legal group with reductions over a run of axes (see candidates);
    `threads` overrides the threads per row (choose_geometry)."""
    inputs, outputs = graph.boundary(frozenset(nodes))
    rp = rows.row_plan(graph, nodes, threads)
    shape, span, geo, static_row = rp.shape, rp.span, rp.geometry, rp.static
    start, stop = rp.run
    kinds = tuple(FULL if graph.tensors[t].shape == shape else BROADCAST for t in inputs)
    lead = reduced_shape(tuple(shape), start, stop, False)
    out_kinds = tuple(FULL_OUTPUT if graph.tensors[t].shape == shape else
                      ROW_DROPPED_OUTPUT if tuple(graph.tensors[t].shape or ()) == lead else ROW_OUTPUT
                      for t in outputs)
    run = tuple(shape[start:stop])
    fixed = all(isinstance(d, int) for d in run)
    split = rp.split
    # Rows fixed in the model whose every chunk is full (a split row: every block's slice).
    full = fixed and rp.slice * split == math.prod(run) and rp.slice == geo.capacity if split > 1 else \
        static_row and math.prod(run) == geo.capacity  # type: ignore[arg-type]
    p = RowPrinter(graph=graph, nodes=tuple(nodes), inputs=inputs, outputs=outputs, kinds=kinds, out_kinds=out_kinds,
                   shape=tuple(shape), geo=geo, full_chunks=full, inner=rp.inner, split=split)
    body = p.body(static_row)
    fast = "  STITCH_FAST_HALF\n" if fast_half and half_only(graph, tuple(nodes), inputs) else ""
    rank = len(shape)
    # A row length fixed in the model is a constant: bounds tests against it fold away.
    row_length = (f"  constexpr I C = (I){math.prod(run)};\n  I rows = 1;" if static_row or (split > 1 and fixed) else  # type: ignore[arg-type]
                  f"  I C = 1, rows = 1;\n  for (int d = {start}; d < {stop}; ++d) C *= (I)a.dims[d];")
    if rp.inner:  # a column reduction: rows over the axes before and after the run; S apart
        row_length += (f"\n  for (int d = {stop}; d < {rank}; ++d) rows *= (I)a.dims[d];\n"
                       f"  const I S = {' * '.join(p.dim(d) for d in range(stop, rank))};")
    plain = ", 1" if split > 1 else ""
    # (a column kernel's loop path: blocks per SM bound its registers, rowplan.COLUMN_REGISTERS;
    # columns held in registers whole keep ptxas's own choice, for occupancy)
    bounds = f"{geo.block}, {rows.column_min_blocks(geo.block)}" if rp.inner and not static_row else f"{geo.block}"
    smem = "  __shared__ double stitch_smem[32];  // one partial per warp (T > 32); double-sized for any accumulator\n"
    if split > 1:
        reductions = sum(s.reduces for s in p.steps)
        row_length += ("\n  // this block's slice of the row: [cb, cb + Cs), whole vectors"
                       "\n  const unsigned rank = stitch_rank<KS>();"
                       "\n  const I Cs = ((C + KS - 1) / KS + V - 1) / V * V, cb = (I)rank * Cs;")
        if rp.inner:
            smem += (f"  __shared__ double stitch_slots[2][{reductions}][{geo.block}];  "
                     "// each thread's column totals, read by the cluster (2: by trip parity)\n")
        else:
            smem += (f"  __shared__ double stitch_slots[2][{reductions}];  "
                     "// each block's row totals, read by the cluster (2: by row parity)\n")
    src = f"""// generated by onnxstitch: group {name}, {len(nodes)} nodes, rows scheme ({geo.threads} threads per row)
{ops.PRELUDE}
{ARGS_STRUCT}
{ROWS_PRELUDE}
{ARG_PRELUDE if any(s.op in ops.ARG_REDUCERS for s in p.steps) else ""}
{CLUSTER_PRELUDE if split > 1 else ""}template <typename I{", int KS" if split > 1 else ""}>
__device__ __forceinline__ void {name}_body(const StitchArgs& a) {{
{fast}  constexpr int T = {geo.threads}, NCH = {max(geo.chunks, 1)}, V = {geo.vec};
  (void)NCH;
{smem}  const int lane = threadIdx.x % T;
  const I sub = threadIdx.x / T, per_block = blockDim.x / T;
{row_length}
  for (int d = 0; d < {start}; ++d) rows *= (I)a.dims[d];
  const bool vec = {p.vec_condition()};
  (void)vec;
{body}
}}
// Two entries (docs/abi.md): 32-bit index arithmetic whenever the tensors allow it (the
// per-row divisions cost several times more in 64 bits, and a shared entry would carry the
// 64-bit body's registers), 64-bit otherwise.
extern "C" __global__ void __launch_bounds__({bounds}) {name}_rows(const StitchArgs a) {{ {name}_body<int{plain}>(a); }}
extern "C" __global__ void __launch_bounds__({bounds}) {name}_rows64(const StitchArgs a) {{ {name}_body<long long{plain}>(a); }}
{cluster_entries(name, bounds, split)}"""
    return KernelSource(name, src, geo.vec, inputs, outputs, kinds, tuple(graph.tensors[t].dtype for t in outputs),
                        RowsSpec(out_kinds, span, geo.threads, geo.block, row_inner=rp.inner, row_split=split))


def cluster_entries(name: str, bounds: str, split: int) -> str:
    """A split kernel's entries for GPUs with thread-block clusters: `split` blocks per row, the
    cluster size fixed at compile time (a plain cuLaunchKernel then launches clusters). Absent
    from images for older GPUs, where the runtime uses the one-block-per-row entries."""
    if split <= 1:
        return ""
    return (f"#ifdef STITCH_CLUSTERS\n"
            f"extern \"C\" __global__ void __cluster_dims__({split}, 1, 1) __launch_bounds__({bounds}) "
            f"{name}_rows_cl(const StitchArgs a) {{ {name}_body<int, {split}>(a); }}\n"
            f"extern \"C\" __global__ void __cluster_dims__({split}, 1, 1) __launch_bounds__({bounds}) "
            f"{name}_rows64_cl(const StitchArgs a) {{ {name}_body<long long, {split}>(a); }}\n"
            f"#endif\n")
