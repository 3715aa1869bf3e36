"""The rows scheme's launch facts (docs/abi.md, shape rule "rows")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import ROWS
from ..source import Spec


@dataclass(frozen=True)
class RowsSpec(Spec):
    """How rows are laid over threads: entries `_rows` (32-bit indices) and `_rows64`, and with
    `row_split` > 1 also their cluster forms (`*_cl`) for GPUs with thread-block clusters."""

    scheme: ClassVar[str] = ROWS
    shape_rule: ClassVar[str] = "rows"
    entry_suffixes: ClassVar[tuple[str, ...]] = ("_rows", "_rows64")
    output_kinds: tuple[int, ...]  # per output: 0 full shape, 1 row shape (keepdims), 2 without the row
    row_axes: int  # axes that form a row
    row_threads: int  # threads per row
    block_threads: int  # threads per block (a multiple of row_threads)
    row_inner: int = 0  # axes after the row's (0: trailing rows; else columns)
    row_split: int = 1  # blocks per row on GPUs with clusters

    def geometry(self) -> list[int]:
        """The `row_geometry` attribute: trailing fields only where they are not the default."""
        return ([self.row_axes, self.row_threads, self.block_threads]
                + ([self.row_inner] if self.row_inner or self.row_split > 1 else [])
                + ([self.row_split] if self.row_split > 1 else []))
