"""The rows scheme's printer: the body of one rows kernel (codegen.py puts it in its kernel),
its per-row variables tracked as it prints. The design note is codegen.py's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ... import ops
from ...graph import FusionGraph
from ...shapes import dtype_size
from ..source import FULL, baked_arg, load_expr, store_expr
from ... import rowplan as rows
from ...rowplan import Operand, RowGeometry, Step

FULL_OUTPUT, ROW_OUTPUT, ROW_DROPPED_OUTPUT = 0, 1, 2
# Registers the next row's prefetched inputs may take (BERT's rows need 8–16).
PREFETCH_REGISTERS = 64
# Registers the loop path's chunk of 16-byte loads may take (the rest load element by element),
# and how many chunks it unrolls (LOOP_UNROLL × 8 registers of loads in flight per thread).
LOOP_VECTOR_REGISTERS = 8
LOOP_UNROLL, LOOP_UNROLL_INPUTS = 4, 4
# Registers a thread may give to inputs the same for every row (LayerNorm's scale and bias),
# loaded once before its row loop instead of once per row (after the reductions, where each
# row waits for them). Within this budget float32 kernels keep their registers (LayerNorm f32
# × 768: 3 chunks × 2 inputs × 4 = 24 registers), float16 LayerNorm × 768 hoists its 8.
INVARIANT_REGISTERS = 8
# Whether split rows (a cluster per row) load their next row ahead, as other row kernels do:
# no — their clusters mostly take one row or two, prefetch measured the same within 3% on H200
# (bench_rows.py --split-sweep), and its registers made 32-element slices spill.
SPLIT_PREFETCH = False


@dataclass(frozen=True)
class _Input:
    """How the kernel reads one group input: its row-local offset rule."""

    index: int
    name: str
    dtype: int
    level: str  # "elem" or "row"
    access: str  # "full" (base + c), "contig" (ro + c), "mixed" (ro + decomposed c), "row"

    @property
    def vectorizable(self) -> bool:
        return self.access in ("full", "contig")


class RowPrinter:
    """Prints the body of one rows kernel; tracks per-row variables as it goes."""

    def __init__(self, *, graph: FusionGraph, nodes: tuple[int, ...], inputs: tuple[str, ...],
                 outputs: tuple[str, ...], kinds: tuple[int, ...], out_kinds: tuple[int, ...], shape: tuple,
                 geo: RowGeometry, full_chunks: bool = False, inner: int = 0, split: int = 1) -> None:
        self.g, self.outputs, self.rank, self.geo, self.shape = graph, outputs, len(shape), geo, shape
        # A split row (rows.split_factor): KS blocks per row, block `rank` takes the row's
        # elements [cb, cb + Cs); rows are indexed by cluster.
        self.split = split > 1
        self.cb = "cb + " if self.split else ""
        self.first_row, self.row_step = (("(I)(blockIdx.x / KS)", "(I)(gridDim.x / KS)") if self.split else
                                         ("(I)blockIdx.x * per_block", "(I)gridDim.x * per_block"))
        # The row's axes [start, stop); a column reduction has `inner` axes after them, and its
        # elements lie S apart (S: the product of those axes' dims).
        self.start, self.stop, self.inner = len(shape) - geo.span - inner, len(shape) - inner, inner
        # Rows fixed in the model that fill every chunk: only rows past the end are empty,
        # and their sums are never stored, so reductions skip the per-element bounds test.
        self.full_chunks = full_chunks
        self._kinds, self._out_kinds = kinds, out_kinds
        run = tuple(shape[self.start:self.stop])
        self.ins: list[_Input] = []
        for idx, t in enumerate(inputs):
            tail = rows.row_tail(tuple(graph.tensors[t].shape or ()), self.rank, self.start, self.stop)
            if all(d == 1 for d in tail):
                access, level = "row", "row"
            else:
                level = "elem"
                # (a column's elements are S apart in every input: never contiguous)
                access = "full" if kinds[idx] == FULL else ("contig" if tail == run and not inner else "mixed")
            self.ins.append(_Input(idx, t, graph.tensors[t].dtype, level, access))
        raw = [s for i in nodes for s in rows.expand(graph, i)]
        self.level = rows.levels(raw, {x.name: x.level for x in self.ins})
        self.steps = rows.reciprocals(raw, self.level)
        self.by_out = {s.out: s for s in self.steps}
        self.dtype = {s.out: s.dtype for s in self.steps} | {x.name: x.dtype for x in self.ins}
        self.row_vars: dict[str, ops.Arg] = {}
        self.lines: list[str] = []
        self.held: list[_Input] = []  # inputs of the next row loaded ahead (row_loop decides)
        self.invariant: frozenset[str] = frozenset()  # inputs loaded once before the row loop

    # -- operands -----------------------------------------------------------------------
    def ctype(self, t: str) -> str:
        return ops.CTYPES[self.dtype[t]][1]

    def stype(self, t: str) -> str:
        return ops.CTYPES[self.dtype[t]][0]

    def arg(self, x: Operand, scope: Mapping[str, ops.Arg], ctype: str) -> ops.Arg:
        if not isinstance(x, str):
            return ops.Arg(ops.literal(x, ctype), ctype, 0)
        if not x:
            return ops.Arg("", "", 0)
        if x in scope:
            return scope[x]
        if x in self.row_vars:
            return self.row_vars[x]
        return baked_arg(self.g, x)

    def expr(self, s: Step, scope: Mapping[str, ops.Arg]) -> str:
        ct = self.ctype(s.out)
        spec = ops.spec(s.op, "")
        assert spec.printer is not None, s.op
        return spec.printer([self.arg(x, scope, ct) for x in s.inputs], s.attrs, ct)

    def offset(self, x: _Input, c: str, p: str = "") -> str:
        """Element offset of input `x` at row position `c` (of the row whose variables carry
        prefix `p`: "" the current row, "n_" the next one)."""
        if x.access == "full":
            return f"{p}base + {self.along(c)}"
        if x.access == "contig":
            return f"{p}ro{x.index} + {c}"
        if x.access == "mixed":
            return f"{p}ro{x.index} + {self.trail_offset(x, c)}"
        # Per-row: a FULL input is per-row only when rows have one element, at `base`.
        return f"{p}base" if self._kinds[x.index] == FULL else f"{p}ro{x.index}"

    def along(self, c: str) -> str:
        """Offset of row position `c` from the row's first element: c, or c·S in a column."""
        return f"({c}) * S" if self.inner else c

    def trail_offset(self, x: _Input, c: str) -> str:
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

    def ptr(self, x: _Input) -> str:
        return f"static_cast<const {ops.CTYPES[x.dtype][0]}*>(a.in[{x.index}])"

    # -- per-element passes -------------------------------------------------------------
    def cone(self, targets: list[str], stop: Mapping[str, str] = {}) -> list[Step]:
        """Per-element steps needed for `targets`, in order (per-row values are variables;
        tensors in `stop`, already held in registers, are not recomputed)."""
        need: set[str] = set()
        stack = [t for t in targets if self.level.get(t) == "elem" and t not in stop]
        while stack:
            t = stack.pop()
            if t in need or t not in self.by_out:
                continue
            need.add(t)
            stack += [x for x in self.by_out[t].inputs if isinstance(x, str) and self.level.get(x) == "elem" and x not in stop]
        return [s for s in self.steps if s.out in need]

    def cone_inputs(self, targets: list[str], stop: Mapping[str, str] = {}) -> list[_Input]:
        used = {x for s in self.cone(targets, stop) for x in s.inputs if isinstance(x, str)} | set(targets)
        return [x for x in self.ins if x.level == "elem" and x.name in used and x.name not in stop]

    def element_lines(self, targets: list[str], raw: Callable[[_Input], str], ind: str,
                      cached: Mapping[str, str] = {}) -> tuple[list[str], dict[str, ops.Arg]]:
        """Loads (through `raw`, the storage-typed expression of an input at this element) and
        steps computing `targets` for one element; `cached` tensors are read from their
        row-long register arrays."""
        scope: dict[str, ops.Arg] = {t: ops.Arg(f"{regs}[i].v[jj]", self.ctype(t), self.dtype[t])
                                     for t, regs in cached.items()}
        lines = []
        for x in self.cone_inputs(targets, cached):
            lines.append(f"{ind}const {self.ctype(x.name)} x{x.index} = {load_expr(x.dtype, raw(x))};")
            scope[x.name] = ops.Arg(f"x{x.index}", self.ctype(x.name), x.dtype)
        for j, s in enumerate(self.cone(targets, cached)):
            lines.append(f"{ind}const {self.ctype(s.out)} e{j} = {self.expr(s, scope)};  // {s.op} -> {s.out}")
            scope[s.out] = ops.Arg(f"e{j}", self.ctype(s.out), s.dtype)
        return lines, scope

    def row_steps(self, ind: str, done: set[str]) -> None:
        """Emit every per-row elementwise step whose inputs are ready."""
        for s in self.steps:
            if s.out in done or s.reduces or self.level[s.out] != "row":
                continue
            if all(not isinstance(x, str) or not x or x in self.row_vars or x not in self.level for x in s.inputs):
                name = f"r{len(self.row_vars)}"
                self.lines.append(f"{ind}const {self.ctype(s.out)} {name} = {self.expr(s, {})};  // {s.op} -> {s.out}")
                self.row_vars[s.out] = ops.Arg(name, self.ctype(s.out), s.dtype)
                done.add(s.out)

    # -- the two paths ------------------------------------------------------------------
    # The register path walks the thread's chunks: chunk i of lane l holds row elements
    # (i·T + l)·V … +V-1, read with one 16-byte access per input when `vec` holds. The first
    # reduction's input is computed once into registers `hr` (one read of the row); later
    # passes start from it, and inputs only they need are read chunk by chunk.
    def chunk_loads(self, xs: list[_Input], ind: str, p: str = "", declare: bool = True, size: str = "NCH") -> None:
        """Chunk i of each input in `xs`, into xr<k>[i] (row variables with prefix `p`; arrays
        of `size` chunks when declared here)."""
        for x in xs:
            st = ops.CTYPES[x.dtype][0]
            if declare:
                self.lines.append(f"{ind}StitchVec<V, {st}> xr{x.index}[{size}];")
            scalar = (f"{ind}  for (int j = 0; j < V; ++j) xr{x.index}[i].v[j] = c0 + j < {p}Cr ? "
                      f"{self.ptr(x)}[{self.offset(x, 'c0 + j', p)}] : ({st})0;")
            if x.vectorizable:
                self.lines.append(f"{ind}if (vec) {{ if (c0 < {p}Cr) xr{x.index}[i] = "
                                  f"*reinterpret_cast<const StitchVec<V, {st}>*>({self.ptr(x)} + {self.offset(x, 'c0', p)}); }}")
                self.lines.append(f"{ind}else {{")
            else:
                self.lines.append(f"{ind}{{")
            self.lines.append("#pragma unroll")
            self.lines.append(scalar)
            self.lines.append(f"{ind}}}")

    def chunks(self, targets: list[str], ind: str, cached: Mapping[str, str],
               body: Callable[[dict[str, ops.Arg]], list[str]], guard: bool, after: Callable[[], list[str]] | None = None,
               held: frozenset[str] = frozenset(), loop: bool = False, prologue: list[str] | None = None) -> None:
        """for each chunk i: `prologue`, its loads (but not of `held` inputs, already in
        registers); for each element jj: the cone of `targets`, then `body` (inside `c < Cr`
        when `guard`); then `after` once per chunk. The register path walks its NCH chunks; the
        loop path (`loop`) walks the whole row a chunk at a time, re-reading it from memory."""
        loads = [x for x in self.cone_inputs(targets, cached) if x.name not in held]
        # A loop pass of many inputs is not unrolled: their hoisted loads would spill (16
        # float16 inputs × 8192 at 1024 threads: 152 bytes, ptxas).
        unroll = LOOP_UNROLL if len(loads) <= LOOP_UNROLL_INPUTS else 1
        if loop:  # 16-byte loads for the first few inputs; the rest element by element
            loads = self.loop_vectors(loads)

        if not loop:  # inputs the same for every row are already in registers
            held = held | self.invariant
            loads = [x for x in loads if x.name not in self.invariant]

        def raw(x: _Input) -> str:
            return f"xr{x.index}[i].v[jj]" if x in loads or x.name in held else \
                f"{self.ptr(x)}[{self.offset(x, 'c0 + jj')}]"

        lines, scope = self.element_lines(targets, raw, ind + ("      " if guard else "    "), cached)
        if loop:
            # Unrolled so that several chunks' loads are in flight per thread: a long row of a
            # few rows (a group norm: 64 rows of 40 960) has one block per SM to hide latency.
            self.lines += [f"#pragma unroll {unroll}", f"{ind}for (I c0 = {self.cb}(I)lane * V; c0 < Cr; c0 += (I)T * V) {{",
                           f"{ind}  constexpr int i = 0;"]
        else:
            self.lines += ["#pragma unroll", f"{ind}for (int i = 0; i < NCH; ++i) {{",
                           f"{ind}  const I c0 = {self.cb}((I)i * T + lane) * V;"]
        self.lines += prologue or []
        self.chunk_loads(loads, ind + "  ", size="1" if loop else "NCH")
        self.lines += ["#pragma unroll", f"{ind}  for (int jj = 0; jj < V; ++jj) {{"]
        if guard:
            self.lines += [f"{ind}    if (c0 + jj < Cr) {{"] + lines + body(scope) + [f"{ind}    }}"]
        else:
            self.lines += lines + body(scope)
        self.lines.append(f"{ind}  }}")
        self.lines += after() if after else []
        self.lines.append(f"{ind}}}")

    def loop_vectors(self, xs: list[_Input]) -> list[_Input]:
        """The inputs the loop path reads a chunk at a time (16-byte accesses): vectorizable
        ones, within LOOP_VECTOR_REGISTERS (16 float16 inputs × 8 per chunk spilled 3.3 KB
        per thread at 1024 threads, ptxas)."""
        out, budget = [], LOOP_VECTOR_REGISTERS
        for x in xs:
            regs = max(1, self.geo.vec * dtype_size(x.dtype) // 4)
            if x.vectorizable and regs <= budget:
                out.append(x)
                budget -= regs
        return out

    def held_loads(self, held: list[_Input], ind: str, p: str) -> None:
        """Every chunk of the `held` inputs, into their row-long registers (row prefix `p`)."""
        self.lines += ["#pragma unroll", f"{ind}for (int i = 0; i < NCH; ++i) {{",
                       f"{ind}  const I c0 = {self.cb}((I)i * T + lane) * V;"]
        self.chunk_loads(held, ind + "  ", p, declare=False)
        self.lines.append(f"{ind}}}")

    def cache_pass(self, src: str, ind: str, held: list[_Input]) -> None:
        """hr = the first reduction's input, from the row's registers; then the next row's
        loads are issued, to arrive while this row reduces (one row ahead per thread)."""
        ct = self.ctype(src)
        self.lines.append(f"{ind}StitchVec<V, {ct}> hr[NCH];")
        names = frozenset(x.name for x in held)
        self.chunks([src], ind, {}, lambda scope: [f"{ind}    hr[i].v[jj] = {self.arg(src, scope, ct).expr};"], False,
                    held=names)
        self.row_setup("n_", f"row0 + {self.row_step}", ind)
        self.held_loads(held, ind, "n_")

    def arg_pass(self, j: int, s: Step, regs: bool, ind: str, cached: Mapping[str, str]) -> str:
        """ArgMax/ArgMin: a (value, position) pair per thread, then across the row's threads;
        ties go to the first position (the last with select_last_index). Returns the index."""
        (src,) = s.inputs
        assert isinstance(src, str)
        vt = self.ctype(src)
        last = "true" if s.attrs.get("select_last_index", 0) else "false"
        better = ops.ARG_REDUCERS[s.op]
        self.lines.append(f"{ind}{vt} accv{j} = ({vt})0; long long acci{j} = -1;")

        def take(scope: Mapping[str, ops.Arg], pad: str, pos: str) -> list[str]:
            v = f"(({vt})({self.arg(src, scope, vt).expr}))"
            tie = f" || v == accv{j}" if last == "true" else ""  # the last of equal values wins
            return [f"{pad}{{ const {vt} v = {v}; if (acci{j} < 0 || v {better} accv{j}{tie}) {{ accv{j} = v; "
                    f"acci{j} = (long long)({pos}); }} }}"]

        self.chunks([src], ind, cached, lambda scope: take(scope, ind + "      ", "c0 + jj"),
                    not (regs and self.full_chunks), loop=not regs)
        is_max = "true" if s.op == "ArgMax" else "false"
        self.lines.append(f"{ind}stitch_row_argreduce<T, {is_max}, {last}>(accv{j}, acci{j}, reinterpret_cast<{vt}*>(stitch_smem));")
        return f"acci{j}"

    def reduce_pass(self, j: int, s: Step, regs: bool, ind: str, cached: Mapping[str, str],
                    keep: str | None = None) -> None:
        """Reduction j over the row; with `keep`, its per-element input also goes to the
        register array of that name, for later passes to read instead of recomputing."""
        red = ops.REDUCERS[s.op]
        ct = self.ctype(s.out)
        (src,) = s.inputs
        assert isinstance(src, str)
        ident = red.identity.replace("T", ct)
        self.lines.append(f"{ind}{ct} acc{j} = {ident};")
        if keep:
            self.lines.append(f"{ind}StitchVec<V, {self.ctype(src)}> {keep}[NCH];")

        def combine(scope: Mapping[str, ops.Arg], pad: str) -> list[str]:
            value = ops.REDUCE_ELEMENT.get(s.op, "{x}").format(x=f"(({ct})({self.arg(src, scope, ct).expr}))")
            held = [f"{pad}{keep}[i].v[jj] = {self.arg(src, scope, self.ctype(src)).expr};"] if keep else []
            return held + [f"{pad}{{ const {ct} u = acc{j}, v = {value}; acc{j} = {red.combine}; }}"]

        self.chunks([src], ind, cached, lambda scope: combine(scope, ind + "      "),  # type: ignore[list-item]
                    not (regs and self.full_chunks), loop=not regs)
        fn = f"[]({ct} u, {ct} v) {{ return {red.combine}; }}"
        self.lines.append(f"{ind}acc{j} = stitch_row_reduce<T>(acc{j}, {fn}, {ident}, reinterpret_cast<{ct}*>(stitch_smem));")
        if self.split:  # then across the cluster's blocks
            self.lines.append(f"{ind}acc{j} = stitch_cluster_reduce<KS>(acc{j}, {fn}, "
                              f"reinterpret_cast<{ct}*>(&stitch_slots[trip][{j}]));")

    def output_pass(self, elem_outs: list[str], regs: bool, ind: str, cached: Mapping[str, str]) -> None:
        """The per-element outputs, a chunk at a time: computed into vectors, stored with one
        16-byte access each when `vec` holds (element by element otherwise)."""
        pad = ind + ("    " if regs else "      ")

        def body(scope: Mapping[str, ops.Arg]) -> list[str]:
            return [f"{pad}o{self.outputs.index(t)}.v[jj] = "
                    f"{store_expr(self.dtype[t], self.arg(t, scope, self.ctype(t)).expr)};" for t in elem_outs]

        def stores() -> list[str]:
            out = []
            for t in elem_outs:
                m, st = self.outputs.index(t), self.stype(t)
                ptr = f"static_cast<{st}*>(a.out[{m}])"
                out.append(f"{ind}  if (vec) {{ if (c0 < Cr) *reinterpret_cast<StitchVec<V, {st}>*>({ptr} + base + {self.along('c0')}) = o{m}; }}")
                out.append(f"{ind}  else {{ for (int jj = 0; jj < V; ++jj) if (c0 + jj < Cr) {ptr}[base + {self.along('c0 + jj')}] = o{m}.v[jj]; }}")
            return out

        decl = [f"{ind}  StitchVec<V, {self.stype(t)}> o{self.outputs.index(t)};" for t in elem_outs]
        # The loop path tests each element (its last chunk may be partial); the register
        # path computes whole chunks and bounds only the stores.
        self.chunks(elem_outs, ind, cached, body, not regs, stores, loop=not regs, prologue=decl)  # type: ignore[arg-type]

    def cached(self) -> str | None:
        """The tensor the register path holds for the whole row: the first reduction's input."""
        reducers = [s for s in self.steps if s.reduces]
        first = reducers[0].inputs[0] if reducers else None
        return first if isinstance(first, str) and self.level.get(first) == "elem" else None

    def path(self, regs: bool, ind: str) -> None:
        """Every reduction, then the per-element outputs; from registers or re-reading the row."""
        saved = dict(self.row_vars)
        done = set(self.row_vars)
        reducers = [s for s in self.steps if s.reduces]
        elem_outs = [t for t in self.outputs if self.level[t] == "elem"]
        first = self.cached() if regs else None
        cached: dict[str, str] = {}
        if first:
            self.cache_pass(first, ind, self.held)
            cached[first] = "hr"
        for j, s in enumerate(reducers):
            ct = self.ctype(s.out)
            name = f"r{len(self.row_vars)}"
            if s.op in ops.ARG_REDUCERS:
                final = self.arg_pass(j, s, regs, ind, cached)
            else:
                # Softmax's exp feeds the sum and the output: computed once, held in registers.
                later = [str(r.inputs[0]) for r in reducers[j + 1:]] + elem_outs
                src = s.inputs[0]
                keep = (f"hk{j}" if regs and src not in cached and
                        any(st.out == src for st in self.cone(later, cached)) else None)
                self.reduce_pass(j, s, regs, ind, cached, keep)
                if keep:
                    cached[str(src)] = keep
                final = ops.REDUCERS[s.op].finalize.replace("T(", f"({ct})(").replace("acc", f"acc{j}")
            self.lines.append(f"{ind}const {ct} {name} = {final};  // {s.op} -> {s.out}")
            self.row_vars[s.out] = ops.Arg(name, ct, s.dtype)
            done.add(s.out)
            self.row_steps(ind, done)
        if elem_outs:
            self.output_pass(elem_outs, regs, ind, cached)
        self.row_outputs(ind)
        self.row_vars = saved

    def row_outputs(self, ind: str) -> None:
        row_outs = [t for t in self.outputs if self.level[t] == "row"]
        if not row_outs:
            return
        # (a split row: block 0 of the cluster stores)
        self.lines.append(f"{ind}if (lane == 0 && {'rank == 0 && ' if self.split else ''}active) {{")
        for t in row_outs:
            st = self.stype(t)
            store = (f"static_cast<{st}*>(a.out[{self.outputs.index(t)}])[row] = "
                     f"{store_expr(self.dtype[t], self.row_vars[t].expr)};")
            # (an empty row stores the reduction's identity, as ONNX and ORT's CPU kernels do)
            self.lines.append(f"{ind}  {store}")
        self.lines.append(f"{ind}}}")

    def row_setup(self, p: str, row0: str, ind: str) -> None:
        """Variables of the row at group start `row0` (prefix `p`): the thread's row, whether it
        exists, its length (0 past the end), its first element and broadcast inputs' offsets."""
        kinds = self._kinds
        # A column's row r is column r % S of the r / S-th block of C·S elements.
        base = f"({p}row / S) * C * S + {p}row % S" if self.inner else f"{p}row * C"
        self.lines += [f"{ind}const I {p}row = {row0} + sub;", f"{ind}const bool {p}active = {p}row < rows;",
                       f"{ind}const I {p}Cr = {p}active ? {'(C < cb + Cs ? C : cb + Cs)' if self.split else 'C'} : 0, "
                       f"{p}base = {base};",
                       f"{ind}(void){p}base; (void){p}Cr;"]
        bcast = [x.index for x in self.ins if x.access in ("contig", "mixed") or (x.access == "row" and kinds[x.index] != FULL)]
        self.lines += self.row_offsets(p, bcast, ind)

    def row_offsets(self, p: str, bcast: list[int], ind: str) -> list[str]:
        """Row offsets of broadcast inputs. Only the row axes where some input has a dim other
        than 1 are decomposed (a dim of 1 in the model is 1 at run time, so its stride is 0):
        inputs the same for every row (LayerNorm's scale and bias) start at 0 with no per-row
        division, and an attention mask [B, 1, 1, S] over rows [B, H, S] costs one division per
        row instead of a division and a remainder per axis. The outermost row axis needs no
        remainder (the row index is in range)."""
        # The axes a row index runs over: those before the row (and, in a column reduction,
        # those after it), in order.
        axes = [d for d in range(self.rank) if not self.start <= d < self.stop]
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

    def row_loop(self, regs: bool, ind: str) -> None:
        """Every group of T threads takes the same number of trips, so shuffles and barriers
        see all their threads; a trip past the last row runs with an empty row. The register
        path holds the next row's loads in xr (issued during this row)."""
        held = self.cone_inputs([self.cached()]) if regs and self.cached() else []  # type: ignore[list-item]
        if not self.prefetch_fits(held) or (self.split and not SPLIT_PREFETCH):
            held = []  # loaded when the row starts instead: no registers held across the row
        self.held = held
        start = self.first_row
        if regs and self.static_row and not self.split:
            self.hoist_invariant(held, ind)
            # (one the first reduction reads is held no longer: it does not change between rows)
            held = self.held = [x for x in held if x.name not in self.invariant]
        if held:
            for x in held:
                self.lines.append(f"{ind}StitchVec<V, {ops.CTYPES[x.dtype][0]}> xr{x.index}[NCH];")
            self.lines.append(f"{ind}{{")
            self.row_setup("", start, ind + "  ")
            self.held_loads(held, ind + "  ", "")
            self.lines.append(f"{ind}}}")
        self.lines.append(f"{ind}for (I row0 = {start}; row0 < rows; row0 += {self.row_step}) {{")
        inner = ind + "  "
        if self.split:  # cluster slots alternate between a block's consecutive rows
            self.lines.append(f"{inner}const int trip = (int)((row0 / {self.row_step}) & 1);")
        self.row_setup("", "row0", inner)
        saved = dict(self.row_vars)
        for x in self.ins:
            if x.level == "row":
                load = load_expr(x.dtype, f"{self.ptr(x)}[{self.offset(x, '0')}]")
                self.lines.append(f"{inner}const {self.ctype(x.name)} x{x.index} = active ? {load} : "
                                  f"({self.ctype(x.name)})0;")
                self.row_vars[x.name] = ops.Arg(f"x{x.index}", self.ctype(x.name), x.dtype)
        self.row_steps(inner, set())
        self.path(regs, inner)
        self.row_vars = saved
        self.lines.append(f"{ind}}}")
        if self.split:
            self.lines.append(f"{ind}stitch_cluster_done<KS>();")

    def hoist_invariant(self, held: list[_Input], ind: str) -> None:
        """Load the per-element inputs that are the same for every row (no row axis where they
        vary) into registers once, when they fit INVARIANT_REGISTERS beside the prefetch."""
        axes = [d for d in range(self.rank) if not self.start <= d < self.stop]
        inv = [x for x in self.ins if x.access == "contig" and
               all(rows.aligned(self.g.tensors[x.name].shape, self.rank)[d] == 1 for d in axes)]
        regs = sum(max(1, self.geo.vec * dtype_size(x.dtype) // 4) for x in inv) * self.geo.chunks
        if not inv or regs > INVARIANT_REGISTERS or not self.prefetch_fits(held + [x for x in inv if x not in held]):
            return
        self.invariant = frozenset(x.name for x in inv)
        for x in inv:
            self.lines.append(f"{ind}StitchVec<V, {ops.CTYPES[x.dtype][0]}> xr{x.index}[NCH];")
        self.lines += [f"{ind}{{  // the same for every row: loaded once",
                       f"{ind}  const I Cr = C, {', '.join(f'ro{x.index} = 0' for x in inv)};"]
        self.held_loads(inv, ind + "  ", "")
        self.lines.append(f"{ind}}}")

    def prefetch_fits(self, held: list[_Input]) -> bool:
        """Whether holding the next row's `held` inputs (NCH chunks each) leaves the register
        path within PREFETCH_REGISTERS and the launch's register bound. Many per-element
        inputs would otherwise spill (8 float32 inputs × 8192 columns: 600 bytes of spills at
        512 threads, ptxas) or cut occupancy (8 inputs × 4096: 182 registers, one block per SM)."""
        geo = self.geo
        chunk_regs = sum(max(1, geo.vec * dtype_size(x.dtype) // 4) for x in held) * max(geo.chunks, 1)
        return chunk_regs <= PREFETCH_REGISTERS and rows.fits_registers(geo.vec, max(geo.chunks, 1), geo.block, chunk_regs)

    def body(self, static_row: bool) -> str:
        """The row loops; a row length fixed in the model that fits the registers needs no
        loop path (smaller image, faster compile)."""
        ind = "  "
        self.static_row = static_row
        if self.geo.chunks and static_row:
            self.lines.append(f"{ind}// the row length is fixed in the model and fits the registers: no loop path")
            self.row_loop(True, ind)
        elif self.geo.chunks:
            length = "Cs" if self.split else "C"
            self.lines.append(f"{ind}if ({length} <= (I)(NCH * T * V)) {{  // uniform: every row of the launch takes one path")
            self.row_loop(True, ind + "  ")
            self.lines.append(f"{ind}}} else {{")
            self.row_loop(False, ind + "  ")
            self.lines.append(f"{ind}}}")
        else:
            self.row_loop(False, ind)
        return "\n".join(self.lines)

    def vec_condition(self) -> str:
        """Whether 16-byte accesses are legal this launch: whole chunks and aligned pointers."""
        terms = ["C % V == 0"]
        for x in self.ins:
            if x.level == "elem" and x.vectorizable:
                terms.append(f"stitch_aligned(a.in[{x.index}], V * sizeof({ops.CTYPES[x.dtype][0]}))")
        for m, t in enumerate(self.outputs):
            if self.level[t] == "elem":
                terms.append(f"stitch_aligned(a.out[{m}], V * sizeof({self.stype(t)}))")
        return " && ".join(terms)
