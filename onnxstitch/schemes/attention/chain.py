"""The attention chain as the scheme's modules share it: what a match holds (`Match`, its
projections and select mask), the head sizes and dtypes the kernels take, and the planning sizes
and arithmetic of a chain. match.py finds chains, decoder.py reads their decoder forms (grouped
KV heads, causal masks) and decode.py prices the split-KV decode form; all three build on this
module, and none on another's."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto as TP
from onnx import helper

from ...graph import FusionGraph, constant_value
from ...shapes import symbolic_value

MIN_HEAD, MAX_HEAD = 8, 128
# Terms added to the scaled scores (a mask; T5 adds a position bias first): the kernel reads
# each through its own strides (docs/abi.md).
MAX_MASKS = 2
# The element types the kernel is generated for (codegen.py: TF32 m16n8k8 for float32,
# m16n8k16 for the half types).
DTYPES = {TP.FLOAT: "float32", TP.FLOAT16: "float16", TP.BFLOAT16: "bfloat16"}
# Dense tensor-core peaks of H100 SXM (NVIDIA's datasheet; H200 has the same SMs), TFLOP/s:
# half-precision products run at twice TF32's rate.
TENSOR_TFLOPS = {TP.FLOAT: 494.7, TP.FLOAT16: 989.4, TP.BFLOAT16: 989.4}


def c_float(x: float) -> str:
    """`x` as a CUDA float literal, exactly (hexadecimal); NaN as its bit pattern."""
    return f"{float.hex(float(x))}f" if x == x else "__int_as_float(0x7fc00000)"


@dataclass(frozen=True)
class Projection:
    """An operand read straight from a projection's output `x` [b, s, w]: head j's columns are
    offset + j·d .. offset + (j+1)·d, plus `bias` [h·d] where the chain adds one; `nodes` are the
    Transpose, Reshape, Add and Slice/Split between x and the operand."""

    x: str
    offset: int
    bias: str | None
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Select:
    """A boolean mask on the scores: Where(mask, scores, fill) keeps a score where the mask is
    true (`keep` True), Where(mask, fill, scores) where it is false; `fill` elsewhere."""

    mask: str
    keep: bool
    fill: float
    # Applied before the added terms rather than after them: GPT-Neo writes
    # Where(causal, scores, fill) + padding mask.
    first: bool = False

    def applied(self, kept: str, scored: str, value: str, terms: str) -> str:
        """The kernels' score (C): `value` (the `scored` product with the added `terms`, '' for
        none) where the mask's element `kept` keeps it, FILL elsewhere; with `first`, the mask
        comes before the terms, which are added to the fill too."""
        test = f"{kept} {'!=' if self.keep else '=='} 0"
        if self.first:
            return f"({test} ? {scored} : FILL)" + (f" + ({terms})" if terms else "")
        return f"({test} ? {value} : FILL)"


@dataclass(frozen=True)
class Match:
    """One attention chain: its nodes and what the kernel needs to know of them."""

    # topological: [the projections' nodes], [q's, kᵀ's Mul|Div], MatMul, [Mul|Div], [Add, [Add]],
    # [Where], Softmax, [IsNaN, Where], MatMul, [Transpose]
    nodes: tuple[int, ...]
    q: str  # [L..., Sq, D]
    kt: str  # [L..., D, Sk]: the first MatMul's second operand, keys already transposed
    v: str  # [L..., Sk, D]
    masks: tuple[str, ...]  # added to the scaled scores in this order; each broadcasts to [L..., Sq, Sk]
    scale: float  # the scores' multiplier: the product of the scales on q, kᵀ and the product (1 when none)
    output: str  # the context, [L..., Sq, D], or [b, Sq, h, D] when `transposed`
    transposed: bool
    head_dim: int
    # q, kᵀ and v read from their projections (all three or none), with `heads` heads.
    projections: tuple[Projection, ...] = ()
    heads: int = 0
    select: Select | None = None  # a boolean mask, applied after the added terms (or before: Select.first)
    guarded: bool = False  # Where(IsNaN(p), 0, p): rows without a finite score give zeros
    softmax: str = ""  # the Softmax's name, for reports
    dtype: int = TP.FLOAT  # of q, kᵀ, v, the additive terms and the context (DTYPES)
    # Decoder forms (decoder.py): with kv_group g > 1, `kt` and `v` are K and V [b, H / g, Sk, D]
    # before their repeat_kv (K as rows); with causal, keys above query + Sk − Sq score
    # causal_fill in the kernel; decoder_note says why a causal mask is still read.
    kv_group: int = 1
    causal: bool = False
    causal_fill: float = -math.inf
    decoder_note: str = ""
    # The plan found the decode kernel (decode.py) cheaper at the planning shapes: the node
    # carries its entries besides the tiled one.
    decode: bool = False
    # Half q, k and v with the scores, the added terms and the context in float32 (TorchScript's
    # SDPA in a half model with a float32 mask: the product and V cast to float32).
    upcast: bool = False
    # Scores soft-capped before the terms: softcap · tanh(product · scale), Gemma 2's logit cap
    # (the chain's division by the cap folded into `scale`); 0 for none.
    softcap: float = 0.0
    # V's and the context's head width where it differs from q's and kᵀ's (`head_dim`): LeViT's
    # values are two or four times as wide as its keys. 0 when they are alike.
    value_dim: int = 0

    @property
    def values(self) -> int:
        """The head width of V and of the context."""
        return self.value_dim or self.head_dim

    def scored(self, product: str) -> str:
        """The kernels' score (C) of `product` before the added terms: scaled, and capped."""
        if self.softcap:
            return f"{c_float(self.softcap)} * tanhf({product} * SCALE)"
        return f"{product} * SCALE"

    def score(self, product: str, terms: str, kept: str) -> str:
        """The tiled and decode kernels' score (C) of `product` before the causal fill: scored,
        the added `terms` ('' for none), then the boolean mask whose element is `kept`
        (Select.applied; ignored without a select)."""
        scored = self.scored(product)
        value = (f"{scored} + {terms}" if self.softcap else f"fmaf({product}, SCALE, {terms})") if terms else scored
        return self.select.applied(kept, scored, value, terms) if self.select is not None else value

    @property
    def term_dtype(self) -> int:
        """The element type of the added terms and the context."""
        return TP.FLOAT if self.upcast else self.dtype

    @property
    def biased(self) -> bool:
        return any(p.bias for p in self.projections)

    @property
    def mask_inputs(self) -> tuple[str, ...]:
        """The kernel's mask inputs: the added terms, then the boolean mask."""
        return self.masks + ((self.select.mask,) if self.select else ())

    @property
    def inputs(self) -> tuple[str, ...]:
        """The kernel's inputs: q, kᵀ, v (or the projections' outputs, then their biases), then
        the masks (docs/abi.md)."""
        if not self.projections:
            return (self.q, self.kt, self.v) + self.mask_inputs
        biases = tuple(p.bias for p in self.projections if p.bias)
        return tuple(p.x for p in self.projections) + biases + self.mask_inputs

    def describe(self) -> str:
        """One line for reports."""
        mask = "".join(f" + '{t}'" for t in self.masks)
        if self.select:
            mask += (f" where '{self.select.mask}' is {str(self.select.keep).lower()} (else {self.select.fill:g})"
                     + (", before the terms" if self.select.first else ""))
        read = ""
        if self.projections:
            cols = ", ".join(f"'{p.x}'[{p.offset}:]" for p in self.projections)
            read = f"; q, kᵀ, v read from {cols}{' with their biases' if self.biased else ''}"
        if self.kv_group > 1:
            read += f"; K and V read un-expanded, {self.kv_group} q heads per KV head"
        if self.causal:
            mask += f", causal (fill {self.causal_fill:g})"
        if self.softcap:
            mask = f" capped at {self.softcap:g} (tanh)" + mask
        kind = "" if self.dtype == TP.FLOAT else f" in {DTYPES[self.dtype]}"
        if self.upcast:
            kind += " (terms and context float32)"
        if self.decode:
            read += "; decode kernel (split keys) for up to 16 rows per KV head"
        return (f"attention{kind} at '{self.softmax}': '{self.q}' · '{self.kt}' × {self.scale:g}{mask} → Softmax"
                f"{' (NaN-guarded)' if self.guarded else ''} → · '{self.v}' → '{self.output}'"
                f"{' (transposed)' if self.transposed else ''}, heads of {self.head_dim}"
                f"{f' (values {self.value_dim})' if self.value_dim else ''}{read}")



def scalar(g: FusionGraph, tensor: str) -> float | None:
    c = g.constants.get(tensor)
    if c is None or math.prod(c.dims) != 1 or c.data_type not in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16, TP.BFLOAT16):
        return None
    return float(np.asarray(constant_value(g, tensor)))


def same(a: object, b: object) -> bool:
    """Dims known equal: the same number or the same symbol."""
    return a is not None and a == b


def planned_dim(g: FusionGraph, t: str, axis: int) -> int:
    """Dim `axis` of `t` at the planning sizes (0 where unknown)."""
    dims = g.shape(t) or ()
    d = dims[axis] if dims else None
    return d if isinstance(d, int) else (symbolic_value(d, g.dim_values) or 0) if d else 0


def planned_keys(g: FusionGraph, m: Match) -> int:
    """The chain's key count at the planning sizes: kᵀ's last dim, or K's rows when grouped."""
    return planned_dim(g, m.kt, -2 if m.kv_group > 1 else -1)


def context_elements(g: FusionGraph, m: Match) -> float:
    """B·H·Sq·D: the context's elements at the planning sizes."""
    return g.tensor_bytes(m.output) / np.dtype(helper.tensor_dtype_to_np_dtype(m.term_dtype)).itemsize


def flops(g: FusionGraph, m: Match) -> float:
    """The two products' arithmetic: 2·Sq·Sk·D (the scores over q's width, the context over
    V's) per (batch, head), at the planned sizes."""
    return 2.0 * context_elements(g, m) * planned_keys(g, m) * (1.0 + m.head_dim / m.values)


