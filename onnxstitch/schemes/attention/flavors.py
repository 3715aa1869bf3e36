"""The attention kernel's code that depends on its element type (codegen.py holds the rest).

float32 runs both products as TF32 mma.sync m16n8k8 (codegen.py's original kernel: the
probabilities go through a per-warp shared buffer into A fragments). float16 and bfloat16 run
them as mma.sync m16n8k16 with float32 accumulation: the operands stay in their type (two
elements per 32-bit register, the lower-indexed in the low half), the scores, the online
Softmax and the context are float32, and the probabilities stay in registers as the second
product's A operand — the m16n8k16 C fragments of two neighbouring 8-key blocks of scores are,
element for element, the A fragment of one 16-key slice (FlashAttention-2's register trick):
lane (g, t) holds scores (g, 2t..2t+1) and (g+8, 2t..2t+1) of each block, and A's four
registers are (g, 2t..), (g+8, 2t..), (g, 8+2t..), (g+8, 8+2t..) of the slice. A head size
that is not a multiple of 16 pads its last slice with zeros.

Tiles are staged 4 elements at a time (16 bytes of float32, 8 of half), so the alignment the
runtime checks (docs/abi.md: column offsets and widths multiples of 4) serves both.
"""
from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto as TP

from ... import ops


@dataclass(frozen=True)
class Flavor:
    """An element type's pieces of code."""

    dtype: int
    elem: str  # C type of an element in memory
    vec4: str  # 4 elements, one load
    zero4: str
    zero: str  # one element

    @property
    def half(self) -> bool:
        return self.dtype != TP.FLOAT

    def load(self, x: str) -> str:
        """Element `x` as a float."""
        return f"CVT({x})" if self.half else x

    def round4(self) -> str:
        """The statement after a 4-vector `x` is loaded: TF32 rounding where staged (STAGE)."""
        return "" if self.half else "x.x = STAGE(x.x), x.y = STAGE(x.y), x.z = STAGE(x.z), x.w = STAGE(x.w);"

    def bias4(self, pointer: str) -> str:
        """4 bias values at `pointer` as a float4."""
        if self.half:
            return f"stitch_unpack4(*reinterpret_cast<const uint2*>({pointer}))"
        return f"*reinterpret_cast<const float4*>({pointer})"

    def add4(self, e: str) -> str:
        """The statement adding float4 `e` to the loaded 4-vector `x`."""
        add = f"f.x += {e}.x, f.y += {e}.y, f.z += {e}.z, f.w += {e}.w;"
        if self.half:
            return f" {{ float4 f = stitch_unpack4(x); {add} x = stitch_pack4(f); }}"
        return " " + add.replace("f.", "x.")


FLOAT = Flavor(TP.FLOAT, "float", "float4", "make_float4(0.f, 0.f, 0.f, 0.f)", "0.f")
FLOAT16 = Flavor(TP.FLOAT16, "unsigned short", "uint2", "make_uint2(0u, 0u)", "(unsigned short)0")
BFLOAT16 = Flavor(TP.BFLOAT16, "unsigned short", "uint2", "make_uint2(0u, 0u)", "(unsigned short)0")
FLAVORS = {f.dtype: f for f in (FLOAT, FLOAT16, BFLOAT16)}

_PTX_TYPE = {TP.FLOAT16: "f16", TP.BFLOAT16: "bf16"}


def half_prelude(dtype: int) -> str:
    """Device forms of the m16n8k16 product and the packing of two floats (tests/host_cuda.h
    has host ones), and the conversions the kernel names CVT, PACK and MMA."""
    t = _PTX_TYPE[dtype]
    return ops.PRELUDE + rf"""
#if defined(__CUDA_ARCH__)
// c (16×8, f32) += a (16×16, {t}, row) · b (16×8, {t}, col); fragments as the PTX ISA lays
// them out for lane (g = lane / 4, t = lane % 4), two elements a register, the lower-indexed
// in the low half: a = (g, 2t..2t+1), (g+8, 2t..2t+1), (g, 2t+8..2t+9), (g+8, 2t+8..2t+9);
// b = (2t..2t+1, g), (2t+8..2t+9, g); c = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void stitch_mma_{t}(float* c, const unsigned* a, unsigned b0, unsigned b1) {{
  asm("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}}
// Four 8×8 matrices of 16-bit elements from shared memory, a register each: lane 8i + j gives
// row j of matrix i (16 bytes, 16-byte aligned); lane (g, t) receives its (g, 2t..2t+1) of
// each, or with _trans its (2t..2t+1, g): B fragments of two neighbouring 8-wide blocks at once.
__device__ __forceinline__ void stitch_ldsm_x4(unsigned* r, const unsigned short* row) {{
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}}
__device__ __forceinline__ void stitch_ldsm_x4_trans(unsigned* r, const unsigned short* row) {{
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}}
// lo and hi rounded to nearest even as one register, lo in the low half (cvt's first source
// goes to the high half).
__device__ __forceinline__ unsigned stitch_pack_{t}(float lo, float hi) {{
  unsigned d;
  asm("cvt.rn.{t}x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}}
#endif
#define CVT {"stitch_h2f" if dtype == TP.FLOAT16 else "stitch_bf2f"}
#define PACK stitch_pack_{t}
#define MMA stitch_mma_{t}
// Two elements p[0] and p[stride] as one register (a B fragment across rows of a tile).
__device__ __forceinline__ unsigned stitch_pair(const unsigned short* p, int stride) {{
  return (unsigned)p[0] | ((unsigned)p[stride] << 16);
}}
__device__ __forceinline__ float4 stitch_unpack4(uint2 v) {{
  return make_float4(CVT((unsigned short)(v.x & 0xffffu)), CVT((unsigned short)(v.x >> 16)),
                     CVT((unsigned short)(v.y & 0xffffu)), CVT((unsigned short)(v.y >> 16)));
}}
__device__ __forceinline__ uint2 stitch_pack4(float4 f) {{ return make_uint2(PACK(f.x, f.y), PACK(f.z, f.w)); }}
"""


def query_fragments(biased: bool) -> str:
    """The warp's queries as m16n8k16 A fragments, NK = ceil(D / 16) slices, read once from
    global memory (pairs of neighbouring head columns, 4-byte aligned as D and the projections'
    offsets are even); with `biased` q's bias added in float32 and rounded back."""
    if biased:
        pair = ("PACK(CVT(q[(long long){r} * QW + {c}]) + CVT(bq[{c}]), "
                "CVT(q[(long long){r} * QW + {c} + 1]) + CVT(bq[{c} + 1]))")
    else:
        pair = "*reinterpret_cast<const unsigned*>(q + (long long){r} * QW + {c})"
    return f"""  // The warp's queries as A fragments, read once from global memory; a head size that is not
  // a multiple of 16 pads the last slice with zeros.
  unsigned qf[NK][4];
#pragma unroll
  for (int k = 0; k < NK; ++k) {{
    const int c0 = k * 16 + 2 * tg, c1 = c0 + 8;
    const bool whole = k * 16 + 8 < D;
    qf[k][0] = qa < Sq ? {pair.format(r="qa", c="c0")} : 0u;
    qf[k][1] = qb < Sq ? {pair.format(r="qb", c="c0")} : 0u;
    qf[k][2] = whole && qa < Sq ? {pair.format(r="qa", c="c1")} : 0u;
    qf[k][3] = whole && qb < Sq ? {pair.format(r="qb", c="c1")} : 0u;
  }}"""


def key_fragments(projected: bool) -> str:
    """The first product's B fragment (head slice k, keys block n) from the staged K tile: Kᵀ
    [D][KS] (pairs across its rows) or, read from a projection, K's rows [KT][KS] (a register
    each); 0 past the head size."""
    if projected:
        return ("*reinterpret_cast<const unsigned*>(Ks + (n * 8 + g) * KS + k * 16 + 2 * tg), "
                "k * 16 + 8 < D ? *reinterpret_cast<const unsigned*>(Ks + (n * 8 + g) * KS + k * 16 + 8 + 2 * tg) : 0u")
    return ("stitch_pair(Ks + (k * 16 + 2 * tg) * KS + n * 8 + g, KS), "
            "k * 16 + 8 < D ? stitch_pair(Ks + (k * 16 + 8 + 2 * tg) * KS + n * 8 + g, KS) : 0u")


def probabilities(exponentials: str, ldsm: bool = False, blocks: str = "NT") -> str:
    """The tile's probabilities packed into A fragments in registers (module docstring) and the
    second product over them, 16 keys a step, into the context's `blocks` blocks of 8 columns;
    with `ldsm` V's B fragments of two neighbouring head blocks come from one ldmatrix.x4.trans
    (lane offset `vofs`, key_products_ldsm)."""
    if ldsm:
        product = f"""#pragma unroll
      for (int n = 0; n < {blocks}; n += 2) {{
        unsigned vb[4];
        stitch_ldsm_x4_trans(vb, Vs + vofs + k * 16 * VS + n * 8);
        MMA(o[n], pf[k], vb[0], vb[1]);
        MMA(o[n + 1], pf[k], vb[2], vb[3]);
      }}"""
    else:
        product = f"""#pragma unroll
      for (int n = 0; n < {blocks}; ++n)
        MMA(o[n], pf[k], stitch_pair(Vs + (k * 16 + 2 * tg) * VS + n * 8 + g, VS),
            stitch_pair(Vs + (k * 16 + 8 + 2 * tg) * VS + n * 8 + g, VS));"""
    return f"""    unsigned pf[KT / 16][4];  // block n's C fragment is half of slice n / 2's A fragment
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {{
{exponentials}
      pf[n / 2][(n & 1) * 2] = PACK(e0, e1);
      pf[n / 2][(n & 1) * 2 + 1] = PACK(e2, e3);
    }}
#pragma unroll
    for (int k = 0; k < KT / 16; ++k) {{
{product}
    }}"""


def key_products_ldsm(projected: bool) -> str:
    """The first product's loops with K's B fragments of two neighbouring key blocks from one
    ldmatrix.x4: from K's rows [KT][KS] as they are, from Kᵀ [D][KS] transposed. Needs head
    slices of 16 (D % 16 == 0); `kofs` and `vofs` are this lane's row offsets (lane 8i + j
    addresses row j of matrix i: matrices 0/1 the block's two halves along the head (K) or the
    keys (Kᵀ, V), 2/3 the next block's)."""
    address = "Ks + kofs + n * 8 * KS + k * 16" if projected else "Ks + kofs + k * 16 * KS + n * 8"
    load = "stitch_ldsm_x4" if projected else "stitch_ldsm_x4_trans"
    return f"""#pragma unroll
    for (int k = 0; k < NK; ++k) {{
#pragma unroll
      for (int n = 0; n < KT / 8; n += 2) {{
        unsigned kb[4];
        {load}(kb, {address});
        MMA(s[n], qf[k], kb[0], kb[1]);
        MMA(s[n + 1], qf[k], kb[2], kb[3]);
      }}
    }}"""


def ldsm_offsets(projected: bool) -> str:
    """This lane's row offsets into the K and V tiles for the ldmatrix reads (key_products_ldsm)."""
    k = ("((lane >> 4) * 8 + (lane & 7)) * KS + ((lane >> 3) & 1) * 8" if projected
         else "(((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (lane >> 4) * 8")
    return f"""  const int kofs = {k};
  const int vofs = (((lane >> 3) & 1) * 8 + (lane & 7)) * VS + (lane >> 4) * 8;
"""
