"""Code generation for attention chains (schemes/attention/match.py): one kernel for QKᵀ·scale + masks → Softmax → ·V.

Kernel ABI: docs/abi.md, shape_rule "attention". A block of 4 warps owns 64 queries of one
(batch, head); each warp holds its 16 queries as TF32 `mma.sync` m16n8k8 A fragments for the
whole kernel. The keys go by in tiles staged in shared memory (Kᵀ and V, rows padded so the
fragment reads hit 32 banks, rounded to TF32 once as they are staged): the warp computes its
16 × KT scores on tensor cores (head slices outside key blocks, so each step has KT/8
independent products), scales them, adds the masks (up to two terms), and folds them into a
running row maximum and sum (FlashAttention's online Softmax: earlier partial results are
rescaled by exp(old max − new max)); the probabilities stay in registers as the second
product's A fragments, their keys in a permuted order (_float_body). The context is normalised
once and stored at [b, h, s, d], or [b, s, h, d] when the chain's Transpose was folded.
Operands read from projections [b, s, w] (attention.Projection) are addressed at the head's
columns with their biases added as they are loaded; K's tile is then staged as rows. Sequence
lengths are runtime values (tiles are guarded); the head size is compiled in. Variants measured
on an H100 (fewer warps, staged queries, two warp sets splitting the keys, tiles of 128 keys)
are in docs/perf-notes.md.

float16 and bfloat16 chains get the same kernel on mma.sync m16n8k16 (float32 accumulation,
float32 Softmax) with the probabilities kept in registers as the second product's operand
(flavors.py: what depends on the element type).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

from ...graph import FusionGraph
from ..source import ARGS_STRUCT, KernelSource
from . import decode, fallback, flavors, match as attention
from .chain import c_float as _literal
from .flavors import Flavor
from .spec import ENTRY_SUFFIX, AttentionSpec

WARPS = 4  # per block, 16 queries each: the mma tile's rows


@dataclass(frozen=True)
class AttentionOptions:
    """Code-generation choices (scripts/bench_attention.py compares them; the defaults are what
    optimize uses)."""

    # Keys per tile, 64 or 128. None: by shape, 128 for float16/bfloat16 heads of up to 64 with
    # 128 to 256 planned keys, else 64. H200 (scripts/bench_attention.py): BERT's core in float16
    # 12.2 against 13.6 µs, ViT's (197 keys) 22.2 against 25.6, BERT projected 11.4 against 11.9;
    # but 512 keys 104.3 against 86.9, and float32 gains nothing (BERT 13.3 against 13.3).
    keys: int | None = None
    fast_exp: bool = True  # ex2.approx.ftz (2 ulp) rather than exp2f
    # Round K, V and P to TF32 once as they are staged, rather than as each fragment is read (4
    # warps read each element): H100, BERT's 128 keys 12.7–13.3 against 14.0–15.3 µs. None: by
    # shape, staged where the planned key count is a multiple of 4; otherwise Kᵀ is staged
    # element by element and the conversions there cost more than they save (ViT's 197 keys:
    # 52.8–80.7 staged against 32.5–46.1 µs, two runs).
    staged_tf32: bool | None = None
    # float16/bfloat16: K's and V's B fragments read by ldmatrix.x4 (two key or head blocks a
    # load) rather than 32-bit pairs and 16-bit pairs of shared loads. None: by shape, where the
    # head size is a multiple of 16 (its slices whole) and K is staged a vector at a time (as
    # rows, or a planned key count that is a multiple of 4). H100 (scripts/bench_attention.py),
    # kernels alone: BERT's core 8.61 → 7.22 µs, projected 9.61 → 8.70, 512 tokens 60.0 → 44.8;
    # but ViT's 197 keys (Kᵀ staged element by element) 22.1 → 29.7, so not there.
    ldmatrix: bool | None = None
    # Additive masks that broadcast over the queries (a padding mask [b, 1, 1, s]) staged per
    # tile in shared memory as float32, one load per key per block rather than one per score
    # per thread. H100: BERT's core in float16 10.41 → 7.22 µs (with ldmatrix), float32 12.0 →
    # 10.8; 512 tokens in float16 72.8 → 44.8.
    staged_masks: bool = True

# TF32 conversion and the m16n8k8 product. Device forms only: tests/host_cuda.h has host ones.
TF32_PRELUDE = r"""
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ unsigned stitch_tf32(float x) {
  unsigned u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
}
// c (16×8, f32) += a (16×8, tf32, row) · b (8×8, tf32, col); fragments as the PTX ISA lays
// them out for lane (g = lane / 4, t = lane % 4): a = (g, t), (g+8, t), (g, t+4), (g+8, t+4);
// b = (t, g), (t+4, g); c = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void stitch_mma_tf32(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
"""
EX2_PRELUDE = r"""// 2^x, 2 ulp; subnormal results flush to 0 (far below what a probability can add to a sum
// of at least 1).
__device__ __forceinline__ float stitch_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""
MMA_PRELUDE = TF32_PRELUDE + EX2_PRELUDE


def v_stride(head_dim: int, half: bool) -> int:
    """The V tile's row stride in elements. Half: D + 8 (ldmatrix rows 16 bytes apart, banks
    spread). float32: the second product reads rows 2t and 2t + 1 (its permuted key order,
    _float_body), so two rows apart must be 8 banks apart: the stride is 4 or 12 modulo 16."""
    if half:
        return head_dim + 8
    return head_dim + 4 if head_dim % 8 == 0 else head_dim + 8


def shared_bytes(head_dim: int, options: AttentionOptions, projected: bool = False, half: bool = False,
                 values: int | None = None) -> int:
    """Dynamic shared memory of one block: the K tile (as Kᵀ [D][KT + 8], or as rows [KT][D + 4]
    when read from a projection) and the V tile (rows v_stride apart, of `values` elements: V's
    head width, D where None); the probabilities stay in registers. Half precision: 2-byte
    elements, K's rows [KT][D + 8]."""
    kt, dv = options.keys, head_dim if values is None else values
    if half:
        k_tile = kt * (head_dim + 8) if projected else head_dim * (kt + 8)
        return 2 * (k_tile + kt * v_stride(dv, True))
    k_tile = kt * (head_dim + 4) if projected else head_dim * (kt + 8)
    return 4 * (k_tile + kt * v_stride(dv, False))


def generate(graph: FusionGraph, name: str, m: attention.Match,
             options: AttentionOptions = AttentionOptions()) -> KernelSource:
    """The kernel for chain `m` under entry `name` + "_attn" (docs/abi.md, "attention")."""
    fl = flavors.FLAVORS[m.dtype]
    if options.keys is None:
        options = dataclasses.replace(options, keys=128 if fl.half and m.head_dim <= 64 and
                                      128 <= attention.planned_keys(graph, m) <= 256 else 64)
    d, kt = m.head_dim, options.keys
    # V's and the context's width: where it differs from D, named DV and its 8-column blocks NV
    # (the other chains' sources stay as they were, with D and NT).
    dv, nv, dvn = m.values, "NV" if m.value_dim else "NT", "DV" if m.value_dim else "D"
    threads, queries = 32 * WARPS, 16 * WARPS
    projected, biased = bool(m.projections), m.biased
    rows = projected or m.kv_group > 1  # K staged as rows [KT][KS] (read from rows), not as Kᵀ
    first_mask = 6 if biased else 3
    mask_rows = _mask_rows(len(m.mask_inputs), first_mask, "float" if m.upcast else fl.elem,
                           boolean=m.select is not None)
    term = (lambda x: x) if m.upcast else fl.load  # the added terms: float32 where upcast
    operands, stage_k, k_frag, v_bias, q_bias = _operand_code(m, projected, biased, threads, kt, fl)
    stage_v = _stage_rows("Vs", "VS", "v + (long long)t0 * VW", "VW", kt, dv, threads, "Sk - t0", fl, v_bias)
    if options.ldmatrix is None:
        options = dataclasses.replace(options, ldmatrix=rows or attention.planned_keys(graph, m) % 4 == 0)
    ldsm = fl.half and d % 16 == 0 and dv % 16 == 0 and options.ldmatrix
    tile_bytes = -(-shared_bytes(d, options, rows, fl.half, dv) // 16) * 16
    staged = [i for i, t in enumerate(m.masks) if options.staged_masks and _query_broadcast(graph, t)]
    mask_tiles = "".join(f"  float* Ms{i} = reinterpret_cast<float*>(reinterpret_cast<char*>(stitch_smem) + "
                         f"{tile_bytes + 4 * kt * j});  // [KT]: mask {i}'s keys of the tile, as float\n"
                         for j, i in enumerate(staged))
    stage_v += "".join(f"""
    for (int j = t; j < KT; j += THREADS) Ms{i}[j] = t0 + j < Sk ? {term(f"mk{i}[(long long)(t0 + j) * mc{i}]")} : 0.f;"""
                       for i in staged)

    def mask_term(i: int, row: str) -> str:
        return f"Ms{i}[key - t0]" if i in staged else term(f"mk{row}{i}[key * mc{i}]")

    def scaled(elem: str, row: str) -> str:
        terms = " + ".join(mask_term(i, row) for i in range(len(m.masks)))
        value = m.score(f"s[n][{elem}]", terms, f"mk{row}{len(m.masks)}[key * mc{len(m.masks)}]")
        # Causal: keys after query + Sk − Sq score the mask's fill.
        return f"(key <= q{row} + OFF ? {value} : CFILL)" if m.causal else value

    if options.staged_tf32 is None:
        # Rows of K (from a projection, or un-expanded K) are staged 4 floats at a time whatever
        # the key count.
        options = dataclasses.replace(options, staged_tf32=rows or attention.planned_keys(graph, m) % 4 == 0)
    body = _half_body(k_frag, biased, m.upcast, ldsm, rows, nv) if fl.half else _float_body(k_frag, q_bias, nv)
    source = f"""
{ARGS_STRUCT}
{_defines(fl, options)}
// {m.q} · {m.kt} → Softmax → · {m.v} → {m.output}
extern "C" __global__ void __launch_bounds__({threads}) {name}{ENTRY_SUFFIX}(const StitchArgs a) {{
  constexpr int D = {d}, QT = {queries}, KT = {kt}, NT = D / 8, {f"DV = {dv}, NV = DV / 8, " if m.value_dim else ""}{body.constants}KS = {"D + 4" if rows and not fl.half else "D + 8" if rows else "KT + 8"}, VS = {v_stride(dv, fl.half)};
  constexpr int THREADS = {threads};
  constexpr bool TRANSPOSED = {"true" if m.transposed else "false"};
  constexpr float LOG2E = 1.4426950408889634f, SCALE = {_literal(m.scale)};
  const float NEG_INF = -__int_as_float(0x7f800000);
{_fill(m)}  extern __shared__ __align__(16) float stitch_smem[];
{_tiles(fl, rows)}
{mask_tiles}  const long long H = a.dims[1];
  const int Sq = (int)a.dims[2], Sk = (int)a.dims[3];
  const int tiles = (Sq + QT - 1) / QT;
  const long long bh = blockIdx.x / tiles, b = bh / H, h = bh % H;
  const int q0 = (int)(blockIdx.x % tiles) * QT;
  const int t = threadIdx.x, lane = t & 31, g = lane >> 2, tg = lane & 3, r0 = (t >> 5) * 16;
{operands}
  const int qa = q0 + r0 + g, qb = qa + 8;  // this thread's two query rows
{body.queries}
{mask_rows}
  float o[{nv}][4];
#pragma unroll
  for (int n = 0; n < {nv}; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;  // running max and (partial) sum per row
{_key_loop(stage_k, stage_v, body, scaled, m.guarded, fl, m.causal, _causal_tail(m, fl, nv), nv, dvn)}"""
    spec = AttentionSpec(d, queries, threads, tile_bytes + 4 * kt * len(staged), len(m.mask_inputs),
                         bool(m.transposed), boolean_mask=m.select is not None, guarded=m.guarded, dtype=m.dtype,
                         kv_group=m.kv_group, causal=m.causal, value_size=m.value_dim)
    if projected:
        spec = dataclasses.replace(spec, heads=m.heads, column_offsets=tuple(p.offset for p in m.projections),
                                   biases=bool(biased))
    elif m.decode:
        dk = decode.generate(m, name, _fill(m), _literal(m.scale), decode.rows_for(graph, m))
        source += dk.source
        spec = dataclasses.replace(spec, decode_rows=dk.rows, decode_keys=dk.keys, decode_shared_bytes=dk.shared_bytes)
    return KernelSource(
        name=name, source=source, vec_width=1, inputs=m.inputs, outputs=(m.output,),
        input_kinds=(1,) * len(m.inputs), output_dtypes=(graph.tensors[m.output].dtype,), spec=spec,
        fallback=fallback.body(graph, m) if m.kv_group > 1 or m.causal else ())


def _defines(fl: Flavor, options: AttentionOptions) -> str:
    """The prelude and the kernel's macros: TF32 rounding where staged (float32) or the half
    type's conversions and product (flavors.half_prelude)."""
    exp2 = f'#define EXP2 {"stitch_ex2" if options.fast_exp else "exp2f"}'
    if fl.half:
        return f"{flavors.half_prelude(fl.dtype)}{EX2_PRELUDE}{exp2}\n#define STAGE(x) (x)"
    return f"""{MMA_PRELUDE}
{exp2}
{"#define STAGE(x) __uint_as_float(stitch_tf32(x))" if options.staged_tf32 else "#define STAGE(x) (x)"}
{"#define FRAG(x) __float_as_uint(x)" if options.staged_tf32 else "#define FRAG(x) stitch_tf32(x)"}"""


def _tiles(fl: Flavor, projected: bool) -> str:
    """The block's shared tiles: K and V."""
    k = "[KT][KS]: the tile's rows of K" if projected else "[D][KS]: the tile's columns of Kᵀ"
    rows = "KT" if projected else "D"
    if fl.half:
        return f"""  {fl.elem}* Ks = reinterpret_cast<{fl.elem}*>(stitch_smem);  // {k}
  {fl.elem}* Vs = Ks + {rows} * KS;  // [KT][VS]: the tile's rows of V"""
    return f"""  float* Ks = stitch_smem;     // {k}
  float* Vs = Ks + {rows} * KS;     // [KT][VS]: the tile's rows of V"""


@dataclass(frozen=True)
class _Body:
    """What the element type changes in the kernel's body (besides staging)."""

    constants: str  # more constexpr ints
    queries: str  # the query fragments
    scores: str  # the first product over the tile
    probabilities: Callable[[str], str]  # from the exponentials' code: P and the second product
    out_type: str  # the context's element, the type of two, and the conversion making two
    out_pair: str
    out_make: str


def _scores(slices: str, products: str) -> str:
    """The first product over the tile: the scores zeroed, then `products` (the loops over
    `slices` adding into them)."""
    return f"""    // Scores: KT/8 blocks of 8 keys, summed over {slices}.
    float s[KT / 8][4];
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
{products}"""


def _pair_products(count: str, mma: str, k_frag: str) -> str:
    """`count` head slices outside the key blocks (independent products per step), `mma` each
    with B fragment `k_frag`."""
    return f"""#pragma unroll
    for (int k = 0; k < {count}; ++k) {{
#pragma unroll
      for (int n = 0; n < KT / 8; ++n)
        {mma}(s[n], qf[k], {k_frag});
    }}"""


def _float_body(k_frag: str, q_bias: Callable[[str], str], nv: str = "NT") -> _Body:
    """float32: TF32 m16n8k8, the probabilities in registers in a permuted key order; the
    context in `nv` blocks of 8 columns."""
    queries = f"""  // The warp's queries as A fragments, read once from global memory.
  unsigned qf[NT][4];
#pragma unroll
  for (int k = 0; k < NT; ++k) {{
    qf[k][0] = stitch_tf32(qa < Sq ? q[(long long)qa * QW + k * 8 + tg]{q_bias("k * 8 + tg")} : 0.f);
    qf[k][1] = stitch_tf32(qb < Sq ? q[(long long)qb * QW + k * 8 + tg]{q_bias("k * 8 + tg")} : 0.f);
    qf[k][2] = stitch_tf32(qa < Sq ? q[(long long)qa * QW + k * 8 + tg + 4]{q_bias("k * 8 + tg + 4")} : 0.f);
    qf[k][3] = stitch_tf32(qb < Sq ? q[(long long)qb * QW + k * 8 + tg + 4]{q_bias("k * 8 + tg + 4")} : 0.f);
  }}"""
    scores = _scores("D/8 head slices (independent products per step)", _pair_products("NT", "stitch_mma_tf32", k_frag))

    def probabilities(exponentials: str) -> str:
        # Block n's exponentials are this lane's C fragment: rows g and g + 8, keys 2t and 2t + 1.
        # The m16n8k8 A fragment wants keys t and t + 4 instead; as the product sums over keys,
        # their order is free: slice n's k = t stands for key 2t and k = t + 4 for key 2t + 1, and
        # V's B fragment reads rows 2t and 2t + 1 to match. So P stays in registers (no shuffles,
        # no shared buffer), as FlashAttention-2 keeps it in half precision.
        return f"""#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {{
{exponentials}
      const unsigned pf[4] = {{stitch_tf32(e0), stitch_tf32(e2), stitch_tf32(e1), stitch_tf32(e3)}};
#pragma unroll
      for (int j = 0; j < {nv}; ++j)
        stitch_mma_tf32(o[j], pf, FRAG(Vs[(n * 8 + 2 * tg) * VS + j * 8 + g]), FRAG(Vs[(n * 8 + 2 * tg + 1) * VS + j * 8 + g]));
    }}"""

    return _Body("", queries, scores, probabilities, "float", "float2", "make_float2")


def _half_body(k_frag: str, biased: bool, float_out: bool = False, ldsm: bool = False, rows: bool = False,
               nv: str = "NT") -> _Body:
    """float16/bfloat16: m16n8k16 over 16-wide head slices (NK of them), P in registers; the
    context stored as float32 where `float_out` (upcast chains); with `ldsm` K's and V's B
    fragments by ldmatrix (K staged as `rows` or as Kᵀ)."""
    out = ("float", "float2", "make_float2") if float_out else ("unsigned short", "unsigned", "PACK")
    queries = flavors.query_fragments(biased)
    if ldsm:
        return _Body("NK = D / 16, ", queries + "\n" + flavors.ldsm_offsets(rows),
                     _scores("NK head slices of 16 (B fragments by ldmatrix)", flavors.key_products_ldsm(rows)),
                     lambda e: flavors.probabilities(e, ldsm=True, blocks=nv), *out)
    scores = _scores("NK head slices of 16 (independent products per step)", _pair_products("NK", "MMA", k_frag))
    return _Body("NK = (D + 15) / 16, ", queries, scores, lambda e: flavors.probabilities(e, blocks=nv), *out)


def _query_broadcast(graph: FusionGraph, mask: str) -> bool:
    """Whether additive mask `mask` is the same for every query (its query axis, the one before
    last, is 1 or absent) and varies along the keys (staged per tile: AttentionOptions)."""
    shape = graph.tensors[mask].shape
    return shape is not None and len(shape) >= 1 and shape[-1] != 1 and (len(shape) == 1 or shape[-2] == 1)


def _mask_rows(masks: int, first_mask: int, elem: str, boolean: bool = False) -> str:
    """Each mask's rows for this thread's two queries (element strides from the runtime, 0
    where it broadcasts; input first_mask + i, strides[first_mask + i]), its keys `mc<i>` apart;
    additive ones of C type `elem`, the last ONNX bool (a byte each) when `boolean`."""
    def kind(i: int) -> str:
        return "unsigned char" if boolean and i == masks - 1 else elem

    return "\n".join(f"""  const {kind(i)}* mk{i} = static_cast<const {kind(i)}*>(a.in[{first_mask + i}]) + b * a.strides[{first_mask + i}][0] + h * a.strides[{first_mask + i}][1];
  const {kind(i)}* mka{i} = mk{i} + (long long)(qa < Sq ? qa : 0) * a.strides[{first_mask + i}][2];
  const {kind(i)}* mkb{i} = mk{i} + (long long)(qb < Sq ? qb : 0) * a.strides[{first_mask + i}][2];
  const int mc{i} = (int)a.strides[{first_mask + i}][3];""" for i in range(masks))


def _fill(m: attention.Match) -> str:
    """The boolean mask's fill as a constant (nothing without one, so the other chains' sources
    stay as they were)."""
    out = ""
    if m.select is not None:
        fill = "NEG_INF" if m.select.fill == -math.inf else _literal(m.select.fill)
        out += f"  const float FILL = {fill};  // where the boolean mask drops a score\n"
    if m.causal:
        fill = "NEG_INF" if m.causal_fill == -math.inf else _literal(m.causal_fill)
        out += f"  const float CFILL = {fill};  // where the causal mask drops a score\n"
    return out


def _causal_tail(m: attention.Match, fl: Flavor, nv: str = "NT") -> str:
    """Causal chains skip the key tiles wholly after the block's last query (from KEND on). With
    a finite fill, a row whose every score so far is the fill (all its keys masked) has a
    Softmax uniform over every key, the skipped ones too: they are added here with weight 1
    (exp(fill − fill)), read straight from global memory (such rows are rare: padding), from the
    end of the last tile computed on."""
    if not m.causal or m.causal_fill == -math.inf:
        return ""
    bias = (lambda c: f" + {fl.load(f'bv[{c}]')}") if m.biased else (lambda c: "")
    # The tiles went on to the end of the last tile begun (KDONE), past KEND: those keys were
    # scored with the fill already.
    return f"""  const int KDONE = (KEND + KT - 1) / KT * KT < Sk ? (KEND + KT - 1) / KT * KT : Sk;
  if (KDONE < Sk) {{
    const bool fa = m0 <= CFILL && qa < Sq, fb = m1 <= CFILL && qb < Sq;
    if (fa || fb) {{
      for (int key = KDONE; key < Sk; ++key) {{
#pragma unroll
        for (int n = 0; n < {nv}; ++n) {{
          const int c = n * 8 + 2 * tg;
          const float x0 = {fl.load("v[(long long)key * VW + c]")}{bias("c")}, x1 = {fl.load("v[(long long)key * VW + c + 1]")}{bias("c + 1")};
          if (fa) o[n][0] += x0, o[n][1] += x1;
          if (fb) o[n][2] += x0, o[n][3] += x1;
        }}
      }}
      if (tg == 0) l0 += fa ? Sk - KDONE : 0, l1 += fb ? Sk - KDONE : 0;  // the quad's sum adds the lanes' parts
    }}
  }}
"""


def _normalise(guarded: bool) -> str:
    """The context's normaliser per row: 1 / the row's sum."""
    if not guarded:
        return """  // No keys: zeros, as ONNX Runtime's empty product; a row whose every score is -inf: NaN, as
  // its Softmax.
  const float i0 = Sk > 0 ? 1.f / l0 : 0.f, i1 = Sk > 0 ? 1.f / l1 : 0.f;
"""
    return """  // No keys: zeros, as ONNX Runtime's empty product. A row whose every score is -inf sums to 0:
  // its Softmax is NaN there and the guard makes it 0, so the context is 0 (o is 0 there).
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
"""


def _key_loop(stage_k: str, stage_v: str, body: _Body, scaled: Callable[[str, str], str], guarded: bool,
              fl: Flavor, causal: bool, tail: str, nv: str = "NT", dv: str = "D") -> str:
    """The loop over tiles of keys (stage K and V, scores on tensor cores, the online Softmax,
    the context's product) and the context's store (`nv` blocks of 8 of its `dv` columns)."""
    exponentials = """      const float e0 = EXP2((s[n][0] - base0) * LOG2E), e1 = EXP2((s[n][1] - base0) * LOG2E);
      const float e2 = EXP2((s[n][2] - base1) * LOG2E), e3 = EXP2((s[n][3] - base1) * LOG2E);
      l0 += e0 + e1, l1 += e2 + e3;"""
    # Causal: the block's keys end after its last query's diagonal (Sk − Sq on).
    head = ("  const int OFF = Sk - Sq, KLAST = q0 + QT + OFF;\n"
            "  const int KEND = KLAST < 0 ? 0 : KLAST < Sk ? KLAST : Sk;\n") if causal else ""
    return f"""{head}  for (int t0 = 0; t0 < {"KEND" if causal else "Sk"}; t0 += KT) {{
    __syncthreads();  // every warp is done with the previous tile
    // Stage the tile (keys t0 on){"" if fl.half else ", rounded to TF32 here when staged_tf32"}.
{stage_k}
{stage_v}
    __syncthreads();
{body.scores}
    float x0 = NEG_INF, x1 = NEG_INF;
    const bool full = t0 + KT <= Sk;
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {{
#pragma unroll
      for (int e = 0; e < 2; ++e) {{
        const int key = t0 + n * 8 + 2 * tg + e;
        if (full || key < Sk) {{
          s[n][e] = {scaled("e", "a")};
          s[n][2 + e] = {scaled("2 + e", "b")};
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
    const float c0 = EXP2((m0 - base0) * LOG2E), c1 = EXP2((m1 - base1) * LOG2E);
    m0 = n0, m1 = n1, l0 *= c0, l1 *= c1;
#pragma unroll
    for (int n = 0; n < {nv}; ++n) o[n][0] *= c0, o[n][1] *= c0, o[n][2] *= c1, o[n][3] *= c1;
{body.probabilities(exponentials)}
  }}
{tail}#pragma unroll
  for (int k = 1; k < 4; k <<= 1) {{
    l0 += __shfl_xor_sync(0xffffffffu, l0, k);
    l1 += __shfl_xor_sync(0xffffffffu, l1, k);
  }}
{_normalise(guarded)}  {body.out_type}* out = static_cast<{body.out_type}*>(a.out[0]);
  const long long rowa = TRANSPOSED ? (b * Sq + qa) * H + h : bh * Sq + qa;
  const long long rowb = TRANSPOSED ? (b * Sq + qb) * H + h : bh * Sq + qb;
#pragma unroll
  for (int n = 0; n < {nv}; ++n) {{
    if (qa < Sq) *reinterpret_cast<{body.out_pair}*>(out + rowa * {dv} + n * 8 + 2 * tg) = {body.out_make}(o[n][0] * i0, o[n][1] * i0);
    if (qb < Sq) *reinterpret_cast<{body.out_pair}*>(out + rowb * {dv} + n * 8 + 2 * tg) = {body.out_make}(o[n][2] * i1, o[n][3] * i1);
  }}
}}
"""


def _fixed_columns(threads: int, cols: int, rows: int) -> bool:
    """Whether a block staging `rows` rows of `cols` floats 4 at a time keeps each thread on the
    same 4 columns in every pass, every pass whole."""
    per_row = cols // 4
    return threads % per_row == 0 and rows % (threads // per_row) == 0


def _stage_rows(dst: str, dst_stride: str, src: str, src_stride: str, rows: int, cols: int, threads: int,
                limit: str | None, fl: Flavor, bias: str = "") -> str:
    """Code staging a tile of `rows` × `cols` elements from `src` (rows `src_stride` apart) into
    shared `dst` (rows `dst_stride` apart), 4 elements per load, rounded with STAGE; rows from
    `limit` on are zeros (None: every row is there). With fixed columns (_fixed_columns) each
    thread's rows are a compile-time sequence: the loads of a whole tile are issued unrolled,
    unguarded where the tile is whole."""
    round_, vec = fl.round4(), fl.vec4
    if not _fixed_columns(threads, cols, rows):
        guard = f"r < {limit}" if limit else "true"
        return f"""    for (int i = t; i < {rows} * {cols} / 4; i += THREADS) {{
      const int r = i / ({cols} / 4), c = (i % ({cols} / 4)) * 4;
      {vec} x = {fl.zero4};
      if ({guard}) {{
        x = *reinterpret_cast<const {vec}*>({src} + (long long)r * {src_stride} + c);{bias}
      }}
      {round_}
      *reinterpret_cast<{vec}*>({dst} + r * {dst_stride} + c) = x;
    }}"""
    step = threads // (cols // 4)

    def passes(load: str) -> str:
        return f"""#pragma unroll
      for (int p = 0; p < {rows // step}; ++p) {{
        {vec} x = {fl.zero4};
        {load}
        {round_}
        *reinterpret_cast<{vec}*>(d + p * {step} * {dst_stride}) = x;
      }}"""

    read = f"x = *reinterpret_cast<const {vec}*>(s + (long long)p * {step} * {src_stride});{bias}"
    stage = passes(read)
    if limit is not None:
        stage = f"""if ({rows} <= {limit}) {{
      {stage}
      }} else {{
      {passes(f"if (row0 + p * {step} < {limit}) {{ {read} }}")}
      }}"""
    return f"""    {{
      const int c = (t % {cols // 4}) * 4, row0 = t / {cols // 4};
      const {fl.elem}* s = {src} + (long long)row0 * {src_stride} + c;
      {fl.elem}* d = {dst} + row0 * {dst_stride} + c;
      {stage}
    }}"""


def _operand_code(m: attention.Match, projected: bool, biased: bool, threads: int, kt: int, fl: Flavor):
    """Code that differs between operands q [b, h, Sq, D], kᵀ [b, h, D, Sk], v [b, h, Sk, D] and
    operands read from projections [b, S, W] at a head's columns (docs/abi.md): the pointers
    (rows QW and VW elements apart), the K tile's staging, its fragment reads, and the biases."""
    e = fl.elem
    if m.kv_group > 1:
        return _grouped_operands(m, threads, kt, fl)
    if not projected:
        dv = "DV" if m.value_dim else "D"  # V's head width (generate's constants)
        operands = f"""  const {e}* q = static_cast<const {e}*>(a.in[0]) + bh * Sq * D;
  const {e}* kt = static_cast<const {e}*>(a.in[1]) + bh * D * Sk;
  const {e}* v = static_cast<const {e}*>(a.in[2]) + bh * Sk * {dv};
  constexpr int QW = D, VW = {dv};"""
        whole = _stage_rows("Ks", "KS", "kt + t0", "Sk", m.head_dim, kt, threads, None, fl)
        stage_k = """    if ((Sk & 3) == 0 && t0 + KT <= Sk) {
""" + whole + f"""
    }} else {{
      for (int i = t; i < D * KT; i += THREADS) {{
        const int dd = i / KT, j = i % KT;
        Ks[dd * KS + j] = t0 + j < Sk ? STAGE(kt[(long long)dd * Sk + t0 + j]) : {fl.zero};
      }}
    }}"""
        k_frag = flavors.key_fragments(False) if fl.half else \
            "FRAG(Ks[(k * 8 + tg) * KS + n * 8 + g]), FRAG(Ks[(k * 8 + tg + 4) * KS + n * 8 + g])"
        return operands, stage_k, k_frag, "", lambda _i: ""
    offq, offk, offv = (p.offset for p in m.projections)
    # Rows of the projections (the runtime passes their widths in strides[0..2][0]); head h's
    # columns start at offset + h·D; the biases are inputs 3..5.
    operands = f"""  const long long QW = a.strides[0][0], KW = a.strides[1][0], VW = a.strides[2][0];
  const {e}* q = static_cast<const {e}*>(a.in[0]) + b * Sq * QW + {offq} + h * D;
  const {e}* k = static_cast<const {e}*>(a.in[1]) + b * Sk * KW + {offk} + h * D;
  const {e}* v = static_cast<const {e}*>(a.in[2]) + b * Sk * VW + {offv} + h * D;"""
    # Where each thread's K and V columns are the same from tile to tile (_fixed_columns), its
    # bias values are loaded once per block (H200, BERT: 15.8 against 19.9 µs with a load per
    # staged vector).
    hoisted = _fixed_columns(threads, m.head_dim, kt)
    if biased:
        operands += f"""
  const {e}* bq = static_cast<const {e}*>(a.in[3]) + h * D;
  const {e}* bk = static_cast<const {e}*>(a.in[4]) + h * D;
  const {e}* bv = static_cast<const {e}*>(a.in[5]) + h * D;"""
        if hoisted:
            operands += f"""
  const float4 ek = {fl.bias4("bk + (t % (D / 4)) * 4")};
  const float4 ev = {fl.bias4("bv + (t % (D / 4)) * 4")};"""

    def add_bias(bias: str) -> str:
        if not biased:
            return ""
        e = "e" + bias[1]
        load = "" if hoisted else f" const float4 {e} = {fl.bias4(bias + ' + c')};"
        return f"{load}{fl.add4(e)}"

    stage_k, k_frag = _key_rows(m, threads, kt, fl, add_bias("bk"))
    return operands, stage_k, k_frag, add_bias("bv"), (lambda i: f" + bq[{i}]" if biased else "")


def _key_rows(m: attention.Match, threads: int, kt: int, fl: Flavor, bias: str) -> tuple[str, str]:
    """K as rows [KT][KS] (`k`, rows KW apart): its staging and fragment reads. 4 elements along
    the head at a time (16 lanes read a key's row), and the fragment reads (key g, head slice tg)
    hit 32 banks: KS = D + 4 floats ≡ 4 (mod 8), or D + 8 halves (D/2 + 4 words)."""
    stage_k = _stage_rows("Ks", "KS", "k + (long long)t0 * KW", "KW", kt, m.head_dim, threads, "Sk - t0", fl, bias)
    k_frag = flavors.key_fragments(True) if fl.half else \
        "FRAG(Ks[(n * 8 + g) * KS + k * 8 + tg]), FRAG(Ks[(n * 8 + g) * KS + k * 8 + tg + 4])"
    return stage_k, k_frag


def _grouped_operands(m: attention.Match, threads: int, kt: int, fl: Flavor):
    """Grouped KV heads: q [b, H, Sq, D], K and V [b, H / G, Sk, D] (K as rows); q head h reads
    KV head h / G."""
    e = fl.elem
    operands = f"""  constexpr int G = {m.kv_group};  // q heads per KV head
  const long long kvh = b * (H / G) + h / G;
  const {e}* q = static_cast<const {e}*>(a.in[0]) + bh * Sq * D;
  const {e}* k = static_cast<const {e}*>(a.in[1]) + kvh * Sk * D;
  const {e}* v = static_cast<const {e}*>(a.in[2]) + kvh * Sk * D;
  constexpr int QW = D, KW = D, VW = D;"""
    stage_k, k_frag = _key_rows(m, threads, kt, fl, "")
    return operands, stage_k, k_frag, "", lambda _i: ""
