"""Index arithmetic shared by the kernel printers (the elementwise, rows and view code printers)."""
from __future__ import annotations

from typing import Mapping


def decompose(index: str, hi: int, lo: int, offsets: Mapping[int | str, str], ind: str,
              dims: str = "(I)a.dims") -> str:
    """An unrolled loop that walks the mutable index variable `index` over dims `hi` down to
    `lo` (innermost first; `dims` the array, the iteration dims by default), adding each
    coordinate times a stride to an offset variable: `offsets[k]` for input k's strides, or
    for a string key (an array of strides) `offsets[array]`."""
    acc = " ".join(f"{o} += q * {k if isinstance(k, str) else f'(I)a.strides[{k}]'}[d];" for k, o in offsets.items())
    return (f"#pragma unroll\n{ind}for (int d = {hi}; d >= {lo}; --d) "
            f"{{ const I q = {index} % {dims}[d]; {index} /= {dims}[d]; {acc} }}")
