"""Decode-shaped attention (issue 22): a few query rows per KV head against a long cache.

The tiled kernel (codegen.py) gives a block 64 queries of one head. A generation step has 1 to
16 new queries: three of a block's four warps idle, and the g q heads of a KV group each read
the same K and V again. Here a block owns every row of one (batch, KV head) — its g q heads ×
Sq queries, at most ROWS (4 or 8 where the planned rows fit: fewer products), which are
consecutive rows of q [b, H, Sq, D] — and one range of keys
(a *split*): B · Hkv · splits blocks, the split count set at launch (launch.cc) so that the GPU
is filled whatever the batch and cache length. Each split stages its K and V tiles through
shared memory once for all its rows and keeps an online Softmax per row on CUDA cores (the
products are tiny against the bytes; the scores are float32 products of the elements as they
are, no TF32 rounding). With one split it writes the context; with more, each writes its rows'
partial (maximum, sum, unnormalised context; float32, in scratch memory ORT allocates) and the
`_merge` kernel combines them, one block per row.

A chain gets these entries besides the tiled one when the plan's cost (`better`) finds them
cheaper at the planning shapes; the runtime then takes them for every launch whose g · Sq rows
fit a block (prefill launches of the same node stay tiled).
"""
from __future__ import annotations

import math
import string
from pathlib import Path
from dataclasses import dataclass

from onnx import TensorProto as TP

from ...cost import CostModel
from ...graph import FusionGraph
from . import chain as attention
from .flavors import FLAVORS

ROWS = 16  # query rows a decode block holds at most (g · Sq); 4 or 8 where the planned rows fit

THREADS = 128
SHARED_LIMIT = 48 * 1024  # the default dynamic shared memory: no opt-in needed
# CUDA-core float32 rate the decode kernel's products run at (H100 SXM: 67 TFLOP/s), and the
# fraction of it its shared-memory-fed loops reach.
CUDA_CORE_TFLOPS = 67.0 * 0.25
# Blocks of four warps an H100 (132 multiprocessors) needs in flight to stream memory at copy
# bandwidth: a kernel with fewer reaches that fraction of it (the tiled kernel at decode shapes
# has one block per (batch, head); the decode kernel's splits fill the GPU).
FULL_BLOCKS = 4 * 132


# The two kernels' CUDA, with named places for what each chain fills in (decode.cu.in).
TEMPLATE = string.Template((Path(__file__).parent / "decode.cu.in").read_text())


@dataclass(frozen=True)
class DecodeKernel:
    """The decode and merge entries' source and launch facts."""

    source: str
    rows: int  # the runtime takes them for launches with g · Sq ≤ rows
    keys: int  # keys a tile (and the granularity of splits)
    shared_bytes: int


def shared_bytes(head_dim: int, elem_bytes: int, keys: int, rows: int = ROWS) -> int:
    """Rows of q, the tile's scores, three per-row floats (rescale, max, sum), K's rows padded
    against bank conflicts and V's rows."""
    pad = 1 if elem_bytes == 4 else 2
    return 4 * (rows * head_dim + rows * keys + 3 * rows) + elem_bytes * keys * (2 * head_dim + pad)


def _keys(head_dim: int, elem_bytes: int, rows: int) -> int:
    return 64 if shared_bytes(head_dim, elem_bytes, 64, rows) <= SHARED_LIMIT else 32


def rows_for(g: FusionGraph, m: attention.Match) -> int:
    """The rows a decode block holds: the least of 4, 8 and 16 that g · Sq at the planning shapes
    fits (at least 4: one row for each warp's share of the online Softmax)."""
    planned = m.kv_group * max(1, attention.planned_dim(g, m.q, -2))
    return next(r for r in (4, 8, ROWS) if planned <= r or r == ROWS)


def better(g: FusionGraph, cost: CostModel, m: attention.Match) -> tuple[bool, float, float]:
    """(whether the decode entries pay, tiled µs, decode µs) at the planning shapes. The tiled
    kernel reads K and V once per q head, computes 64-query tiles whatever Sq is and has one
    block per (batch, head, tile) to stream them with (FULL_BLOCKS); the decode kernel reads them
    once per KV head with the GPU filled, its products on CUDA cores, plus a merge launch."""
    if m.projections or m.value_dim:  # (the decode kernel reads heads of one width)
        return False, 0.0, 0.0
    sq = attention.planned_dim(g, m.q, -2)
    context = attention.context_elements(g, m)  # B·H·Sq·D
    if sq <= 0 or m.kv_group * sq > ROWS or context <= 0:
        return False, 0.0, 0.0
    products = attention.flops(g, m)
    kv = g.tensor_bytes(m.kt) + g.tensor_bytes(m.v)
    rest = g.tensor_bytes(m.q) + g.tensor_bytes(m.output) + sum(g.tensor_bytes(t) for t in m.mask_inputs)
    bw = cost.bandwidth_gbs * 1e3  # bytes per µs
    tiles = math.ceil(sq / 64)  # of 64 queries, the tiled kernel's block
    blocks = context / (sq * m.head_dim) * tiles
    tiled = cost.launch_us + max((rest + kv * m.kv_group) / (bw * min(1.0, blocks / FULL_BLOCKS)),
                                 products * 64 * tiles / sq / (attention.TENSOR_TFLOPS[m.dtype] * 1e6))
    decode = 2 * cost.launch_us + max((rest + kv) / bw, products / (CUDA_CORE_TFLOPS * 1e6))
    return decode < tiled, tiled, decode


def generate(m: attention.Match, name: str, fill: str, scale: str, rows: int = ROWS) -> DecodeKernel:
    """The `name`_attn_decode and `name`_attn_merge entries for chain `m` (not projected), to
    follow the tiled kernel's source in one module (its prelude defines EXP2 and, for half
    types, CVT); `fill` declares the masks' fills, `scale` is the scores' multiplier literal;
    a block holds `rows` rows (4, 8 or 16)."""
    fl = FLAVORS[m.dtype]
    half = fl.half
    elem_bytes = 2 if half else 4
    d, g = m.head_dim, m.kv_group
    kt = _keys(d, elem_bytes, rows)
    smem = shared_bytes(d, elem_bytes, kt, rows)
    load = (lambda x: f"CVT({x})") if half else (lambda x: x)
    store = {TP.FLOAT: "(x)", TP.FLOAT16: "stitch_f2h(x)", TP.BFLOAT16: "stitch_f2bf(x)"}[m.term_dtype]
    out_elem = "float" if m.upcast else fl.elem
    term = (lambda x: x) if m.upcast else load  # the added terms: float32 where upcast
    masks = len(m.mask_inputs)
    boolean = m.select is not None
    rstep = THREADS // kt
    rpt = rows // rstep

    def kind(i: int) -> str:
        return "unsigned char" if boolean and i == masks - 1 else "float" if m.upcast else fl.elem

    mask_ptrs = "\n".join(
        f"  const {kind(i)}* mk{i} = static_cast<const {kind(i)}*>(a.in[{3 + i}]) + b * a.strides[{3 + i}][0];\n"
        f"  const long long mc{i} = a.strides[{3 + i}][3];\n"
        f"  long long mr{i}[RPT];\n"
        f"#pragma unroll\n  for (int i = 0; i < RPT; ++i) {{\n"
        f"    const int r = r0 + i * RSTEP;\n"
        f"    mr{i}[i] = (kvh * G + r / Sq) * a.strides[{3 + i}][1] + (long long)(r % Sq) * a.strides[{3 + i}][2];\n"
        f"  }}" for i in range(masks))

    def scaled(i: int) -> str:
        """Row r0 + i·RSTEP's score of `key` as the tiled kernel makes it: scale, added terms,
        the boolean mask's fill, the causal fill (key after query + Sk − Sq)."""
        terms = " + ".join(term(f"mk{k}[mr{k}[{i}] + key * mc{k}]") for k in range(len(m.masks)))
        k = len(m.masks)
        value = m.score(f"acc[{i}]", terms, f"mk{k}[mr{k}[{i}] + key * mc{k}]")
        if m.causal:
            value = f"(key <= r % Sq + Sk - Sq ? {value} : CFILL)"
        return value

    # Staging: the next tile's loads are issued into registers before this tile is computed
    # (`fetch`, keys from `t1`), and stored to shared memory at the top of the next iteration
    # (`stash`): the block's memory traffic overlaps its arithmetic, and no loop waits out the
    # memory latency once per load.
    load_v = """#pragma unroll
      for (int n = 0; n < NV; ++n) {
        const int i = t + n * THREADS, key = t1 + (i * 4) / D;
        ys[n] = ZERO4;
        if (i < KT * D / 4 && key < k1) ys[n] = *reinterpret_cast<const VEC4*>(v + (long long)key * D + (i * 4) % D);
      }"""
    store_v = """#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int i = t + n * THREADS;
      if (i < KT * D / 4) *reinterpret_cast<VEC4*>(vs + i * 4) = ys[n];
    }"""
    if g > 1:
        regs = "  VEC4 xs[NV], ys[NV];  // the next tile's K and V"
        fetch = """#pragma unroll
      for (int n = 0; n < NV; ++n) {
        const int i = t + n * THREADS, key = t1 + (i * 4) / D;
        xs[n] = ZERO4;
        if (i < KT * D / 4 && key < k1) xs[n] = *reinterpret_cast<const VEC4*>(k + (long long)key * D + (i * 4) % D);
      }
""" + load_v
        stash = """#pragma unroll
    for (int n = 0; n < NV; ++n) {
      const int i = t + n * THREADS, j = (i * 4) / D, c = (i * 4) % D;
      const ELEM* xe = reinterpret_cast<const ELEM*>(&xs[n]);
      if (i < KT * D / 4) {
#pragma unroll
        for (int e = 0; e < 4; ++e) ks[j * KP + c + e] = xe[e];  // K's rows are padded: element by element
      }
    }
""" + store_v
        k_ptr = f"  const ELEM* k = static_cast<const ELEM*>(a.in[1]) + bkv * Sk * D;  // K [b, H / {g}, Sk, D] as rows"
    else:
        regs = "  ELEM xs[NK];  // the next tile's kᵀ\n  VEC4 ys[NV];  // and V"
        fetch = """#pragma unroll
      for (int n = 0; n < NK; ++n) {
        const int i = t + n * THREADS, key = t1 + i % KT;  // kᵀ's row i / KT: keys along it
        xs[n] = i < KT * D && key < k1 ? k[(long long)(i / KT) * Sk + key] : ZERO;
      }
""" + load_v
        stash = """#pragma unroll
    for (int n = 0; n < NK; ++n) {
      const int i = t + n * THREADS;
      if (i < KT * D) ks[(i % KT) * KP + i / KT] = xs[n];
    }
""" + store_v
        k_ptr = "  const ELEM* k = static_cast<const ELEM*>(a.in[1]) + bkv * D * Sk;  // kᵀ [.., D, Sk]"
    if half:
        dot = """      const ELEM* kr = ks + j * KP;
#pragma unroll 4
      for (int c = 0; c < D; c += 2) {
        const unsigned w = *reinterpret_cast<const unsigned*>(kr + c);  // two keys' elements, one load
        const float k0v = CVT((ELEM)(w & 0xffffu)), k1v = CVT((ELEM)(w >> 16));
#pragma unroll
        for (int i = 0; i < RPT; ++i)
          acc[i] = fmaf(qs[(r0 + i * RSTEP) * D + c + 1], k1v, fmaf(qs[(r0 + i * RSTEP) * D + c], k0v, acc[i]));
      }"""
    else:
        dot = """      const ELEM* kr = ks + j * KP;
#pragma unroll 4
      for (int c = 0; c < D; ++c) {
        const float kv = kr[c];
#pragma unroll
        for (int i = 0; i < RPT; ++i) acc[i] = fmaf(qs[(r0 + i * RSTEP) * D + c], kv, acc[i]);
      }"""
    normalise = "l > 0.f ? 1.f / l : 0.f" if m.guarded else "Sk > 0 ? 1.f / l : 0.f"
    score_lines = "\n".join(f"""      {{
        const int r = r0 + {i} * RSTEP;
        ps[r * KT + j] = key < k1 && r < rows ? {scaled(i)} : NEG_INF;
      }}""" for i in range(rpt))
    source = TEMPLATE.substitute(
        elem=fl.elem,
        vec4=fl.vec4,
        zero=fl.zero,
        zero4=fl.zero4,
        store=store,
        threads=THREADS,
        name=name,
        d=d,
        g=g,
        rows=rows,
        kt=kt,
        key_pad=1 if not half else 2,
        transposed="true" if m.transposed else "false",
        scale=scale,
        fill=fill,
        k_ptr=k_ptr,
        mask_ptrs=mask_ptrs,
        load_q=load("q[i]"),
        regs=regs,
        fetch=fetch,
        stash=stash,
        dot=dot,
        score_lines=score_lines,
        load_v=load("vs[jj * D + c]"),
        out_elem=out_elem,
        normalise=normalise)
    return DecodeKernel(source, rows, kt, smem)
