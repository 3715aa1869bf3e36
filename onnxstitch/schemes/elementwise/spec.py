"""The elementwise scheme's launch facts (docs/abi.md, shape rule "broadcast")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import ELEMENTWISE
from ..source import Spec


@dataclass(frozen=True)
class ElementwiseSpec(Spec):
    """Entries `_v32` (vectorized, 32-bit indices) and `_s64` (scalar, 64-bit); outputs written
    through views (views.encode_all, the `output_views` attribute), empty when none is."""

    scheme: ClassVar[str] = ELEMENTWISE
    shape_rule: ClassVar[str] = "broadcast"
    entry_suffixes: ClassVar[tuple[str, ...]] = ("_v32", "_s64")
    output_views: tuple[int, ...] = ()
