"""The attention scheme's launch facts (docs/abi.md, shape rule "attention")."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from onnx import TensorProto as TP

from .. import ATTENTION
from ..source import Spec

ENTRY_SUFFIX = "_attn"
ATTRIBUTE_PREFIX = "attention_"
_PROJECTION = ("heads", "column_offsets", "biases")


@dataclass(frozen=True)
class AttentionSpec(Spec):
    """One block of `threads` per (batch, head) and `queries` queries; with `heads` > 0, q, kᵀ
    and v are read from their projections (column offsets of each, biases added in the
    kernel)."""

    scheme: ClassVar[str] = ATTENTION
    shape_rule: ClassVar[str] = "attention"
    entry_suffixes: ClassVar[tuple[str, ...]] = (ENTRY_SUFFIX,)
    head_size: int
    queries: int  # per block
    threads: int
    shared_bytes: int  # dynamic shared memory of a launch
    masks: int  # 0-2
    transposed: bool  # output written as [b, s, h, d]
    heads: int = 0  # projected: heads per projection row; 0 when q, kᵀ, v come as they are
    column_offsets: tuple[int, ...] = ()  # projected: where q, k and v start in their rows
    biases: bool = False  # projected: each projection's bias is an input
    # Compiled into the kernel, not read by the runtime: the last of the `masks` inputs is
    # boolean (Where(mask, scores, fill); the runtime's element strides serve it as they are),
    # and a row with no finite score gives zeros (the exporters' Where(IsNaN(p), 0, p)).
    boolean_mask: bool = False
    guarded: bool = False
    # The operands' and context's element type (ONNX TensorProto: FLOAT, FLOAT16, BFLOAT16):
    # float32 runs on TF32 mma.sync m16n8k8, half types on m16n8k16 with float32 accumulation.
    # Compiled in; the launch is the same (its shared memory is in shared_bytes).
    dtype: int = TP.FLOAT
    # Grouped KV heads (read by the runtime; 1 when absent): with g > 1, K and V come as
    # [b, H / g, Sk, D] (K as rows, not kᵀ) and q head h reads KV head h // g.
    kv_group: int = 1
    # Compiled in: keys after query + Sk − Sq are masked in the kernel (tiles wholly after the
    # block's queries skipped).
    causal: bool = False
    # Decode entries (decode.py; 0: none): launches with kv_group · Sq ≤ decode_rows run
    # `_attn_decode` (tiles of decode_keys keys, decode_shared_bytes of shared memory) and, with
    # more than one split, `_attn_merge`.
    decode_rows: int = 0
    decode_keys: int = 0
    decode_shared_bytes: int = 0
    # V's and the context's head width where it differs from head_size (LeViT); 0 when alike,
    # and then not written (the runtime reads head_size for both when it is absent).
    value_size: int = 0

    @property
    def projected(self) -> bool:
        return self.heads > 0

    @property
    def half(self) -> bool:
        """float16 or bfloat16 operands (m16n8k16 products)."""
        return self.dtype != TP.FLOAT

    def attributes(self) -> dict[str, int | list[int]]:
        """The node attributes the runtime reads (docs/abi.md): `attention_<field>` per field,
        booleans as 0/1; the projection's fields only when projected, value_size only where V's
        heads are not head_size wide."""
        out: dict[str, int | list[int]] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name in _PROJECTION and not self.projected) or (f.name == "value_size" and not value):
                continue
            out[ATTRIBUTE_PREFIX + f.name] = list(value) if isinstance(value, tuple) else int(value)
        return out
