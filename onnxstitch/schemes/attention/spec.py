"""The attention scheme's launch facts (docs/abi.md, shape rule "attention")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import ATTENTION
from ..source import Spec

ENTRY_SUFFIX = "_attn"


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

    @property
    def projected(self) -> bool:
        return self.heads > 0

    def encode(self) -> list[int]:
        """The `attention` attribute the runtime reads (docs/abi.md: positional)."""
        out = [self.head_size, self.queries, self.threads, self.shared_bytes, self.masks, int(self.transposed)]
        if self.projected:
            out += [self.heads, *self.column_offsets, int(self.biases)]
        return out
