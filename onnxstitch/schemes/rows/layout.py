"""Where a rows kernel's elements live: each input's access rule (read at the row's base, at its
own row offset, decomposed within the row, or once per row), the offset of a row position, and
the per-row variables that locate a row (its index, length, first element and the broadcast
inputs' offsets). Pure text: the printer (printer.py) places what these return."""
from __future__ import annotations

from dataclasses import dataclass

from ... import ops
from ... import rowplan as rows
from ...graph import FusionGraph
from ..source import FULL


@dataclass(frozen=True)
class RowInput:
    """How the kernel reads one group input: its row-local offset rule."""

    index: int
    name: str
    dtype: int
    level: str  # "elem" or "row"
    access: str  # "full" (base + c), "contig" (ro + c), "mixed" (ro + decomposed c), "row"

    @property
    def vectorizable(self) -> bool:
        return self.access in ("full", "contig")


class RowLayout:
    """The addressing of one rows kernel over iteration `shape`, whose row is the axes
    [start, stop) followed by `inner` others (a column reduction: elements S apart)."""

    def __init__(self, *, graph: FusionGraph, inputs: tuple[str, ...], kinds: tuple[int, ...], shape: tuple,
                 span: int, inner: int, split: bool) -> None:
        self.g, self.shape, self.rank, self.kinds, self.split = graph, shape, len(shape), kinds, split
        self.start, self.stop, self.inner = len(shape) - span - inner, len(shape) - inner, inner
        run = tuple(shape[self.start:self.stop])
        self.ins: list[RowInput] = []
        for idx, t in enumerate(inputs):
            tail = rows.row_tail(tuple(graph.tensors[t].shape or ()), self.rank, self.start, self.stop)
            if all(d == 1 for d in tail):
                access, level = "row", "row"
            else:
                level = "elem"
                # (a column's elements are S apart in every input: never contiguous)
                access = "full" if kinds[idx] == FULL else ("contig" if tail == run and not inner else "mixed")
            self.ins.append(RowInput(idx, t, graph.tensors[t].dtype, level, access))

    def offset(self, x: RowInput, c: str, p: str = "") -> str:
        """Element offset of input `x` at row position `c` (of the row whose variables carry
        prefix `p`: "" the current row, "n_" the next one)."""
        if x.access == "full":
            return f"{p}base + {self.along(c)}"
        if x.access == "contig":
            return f"{p}ro{x.index} + {c}"
        if x.access == "mixed":
            return f"{p}ro{x.index} + {self.trail_offset(x, c)}"
        # Per-row: a FULL input is per-row only when rows have one element, at `base`.
        return f"{p}base" if self.kinds[x.index] == FULL else f"{p}ro{x.index}"

    def along(self, c: str) -> str:
        """Offset of row position `c` from the row's first element: c, or c·S in a column."""
        return f"({c}) * S" if self.inner else c

    def trail_offset(self, x: RowInput, c: str) -> str:
        """Offset at row position `c` of an input broadcast inside the row: only the row axes
        where it varies (a dim of 1 in the model is 1 at run time), the outermost without a
        remainder (c is within the row), and dims fixed in the model as constants, so the
        divisions fold into shifts or multiplies (a group norm's γ [G, C/G, 1] over rows
        [C/G, H·W]: one shift per element instead of two divisions and two remainders)."""
        aligned = rows.aligned(self.g.tensors[x.name].shape, self.rank)
        dim = self.dim
        terms = []
        for d in range(self.start, self.stop):
            if aligned[d] == 1:
                continue
            inner = [dim(e) for e in range(d + 1, self.stop) if self.shape[e] != 1]
            q = f"({c}) / ({' * '.join(inner)})" if inner else f"({c})"
            q = f"({q}) % {dim(d)}" if d > self.start else q
            terms.append(f"({q}) * (I)a.strides[{x.index}][{d}]")
        return "(" + " + ".join(terms) + ")" if terms else "(I)0"

    def dim(self, d: int) -> str:
        """Iteration dim d: a constant when the model fixes it, else read at run time."""
        v = self.shape[d]
        return f"(I){v}" if isinstance(v, int) else f"(I)a.dims[{d}]"

    def ptr(self, x: RowInput) -> str:
        return f"static_cast<const {ops.CTYPES[x.dtype][0]}*>(a.in[{x.index}])"

    def row_axes(self) -> list[int]:
        """The axes a row index runs over: those before the row (and, in a column reduction,
        those after it), in order."""
        return [d for d in range(self.rank) if not self.start <= d < self.stop]

    def row_setup(self, p: str, row0: str, ind: str) -> list[str]:
        """Variables of the row at group start `row0` (prefix `p`): the thread's row, whether it
        exists, its length (0 past the end), its first element and broadcast inputs' offsets."""
        # A column's row r is column r % S of the r / S-th block of C·S elements.
        base = f"({p}row / S) * C * S + {p}row % S" if self.inner else f"{p}row * C"
        lines = [f"{ind}const I {p}row = {row0} + sub;", f"{ind}const bool {p}active = {p}row < rows;",
                 f"{ind}const I {p}Cr = {p}active ? {'(C < cb + Cs ? C : cb + Cs)' if self.split else 'C'} : 0, "
                 f"{p}base = {base};",
                 f"{ind}(void){p}base; (void){p}Cr;"]
        bcast = [x.index for x in self.ins
                 if x.access in ("contig", "mixed") or (x.access == "row" and self.kinds[x.index] != FULL)]
        return lines + self.row_offsets(p, bcast, ind)

    def row_offsets(self, p: str, bcast: list[int], ind: str) -> list[str]:
        """Row offsets of broadcast inputs. Only the row axes where some input has a dim other
        than 1 are decomposed (a dim of 1 in the model is 1 at run time, so its stride is 0):
        inputs the same for every row (LayerNorm's scale and bias) start at 0 with no per-row
        division, and an attention mask [B, 1, 1, S] over rows [B, H, S] costs one division per
        row instead of a division and a remainder per axis. The outermost row axis needs no
        remainder (the row index is in range)."""
        axes = self.row_axes()
        varying: dict[int, list[int]] = {}
        for k in bcast:
            aligned = rows.aligned(self.g.tensors[self.ins[k].name].shape, self.rank)
            for d in axes:
                if aligned[d] != 1:
                    varying.setdefault(d, []).append(k)
        moving = [k for k in bcast if any(k in ks for ks in varying.values())]
        fixed = [k for k in bcast if k not in moving]
        lines = [f"{ind}const I {', '.join(f'{p}ro{k} = 0' for k in fixed)};"] if fixed else []
        if not moving:
            return lines
        hi, lo = max(varying), min(varying)
        inner = " * ".join(f"(I)a.dims[{d}]" for d in axes if d > hi)
        # (markers for tests/test_rows_index.py, which runs this code on the host)
        lines += [f"{ind}// row offsets", f"{ind}I {p}rr = {p}active ? {p}row : 0, {', '.join(f'{p}ro{k} = 0' for k in moving)};"]
        if inner:
            lines.append(f"{ind}{p}rr /= {inner};")
        for d in [d for d in reversed(axes) if lo <= d <= hi]:
            q = f"{p}rr" if d == axes[0] else f"{p}rr % (I)a.dims[{d}]"
            step = f" {p}rr /= (I)a.dims[{d}];" if d > lo else ""
            acc = " ".join(f"{p}ro{k} += q * (I)a.strides[{k}][{d}];" for k in varying.get(d, []))
            lines.append(f"{ind}{{ const I q = {q};{step} {acc} }}")
        return lines + [f"{ind}// end row offsets"]

    def invariant_inputs(self) -> list[RowInput]:
        """Per-element inputs the same for every row (no row axis where they vary: LayerNorm's
        scale and bias), read contiguously."""
        axes = self.row_axes()
        return [x for x in self.ins if x.access == "contig" and
                all(rows.aligned(self.g.tensors[x.name].shape, self.rank)[d] == 1 for d in axes)]
