"""The rows scheme's printer: the body of one rows kernel (codegen.py puts it in its kernel) —
the passes over a row (loads a chunk at a time, reductions, per-element outputs, the next row's
loads held ahead) and the row loops of the register and loop paths. Where elements live is
layout.py's, what is computed from them values.py's. The design note is codegen.py's."""
from __future__ import annotations

from typing import Callable, Mapping

from ... import ops
from ...graph import FusionGraph
from ...shapes import dtype_size
from ..source import load_expr, store_expr
from ... import rowplan as rows
from ...rowplan import RowGeometry, Step
from .layout import RowInput, RowLayout
from .values import RowValues

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


class RowPrinter:
    """Prints the body of one rows kernel: its addressing (`at`, layout.RowLayout) and values
    (`v`, values.RowValues) placed into passes and row loops; `lines` grows as it prints."""

    def __init__(self, *, graph: FusionGraph, nodes: tuple[int, ...], inputs: tuple[str, ...],
                 outputs: tuple[str, ...], kinds: tuple[int, ...], out_kinds: tuple[int, ...], shape: tuple,
                 geo: RowGeometry, full_chunks: bool = False, inner: int = 0, split: int = 1) -> None:
        self.g, self.outputs, self.geo = graph, outputs, geo
        # A split row (rows.split_factor): KS blocks per row, block `rank` takes the row's
        # elements [cb, cb + Cs); rows are indexed by cluster.
        self.split = split > 1
        self.cb = "cb + " if self.split else ""
        # (a split row's cluster takes one row, per_block being 1; a split column kernel's
        # cluster takes the same per_block columns in each of its blocks)
        self.first_row, self.row_step = (("(I)(blockIdx.x / KS) * per_block", "(I)(gridDim.x / KS) * per_block")
                                         if self.split else ("(I)blockIdx.x * per_block", "(I)gridDim.x * per_block"))
        self.columns = inner > 0
        self.at = RowLayout(graph=graph, inputs=inputs, kinds=kinds, shape=shape, span=geo.span, inner=inner,
                            split=self.split)
        self.ins = self.at.ins
        self.v = RowValues(graph=graph, nodes=nodes, ins=self.ins)
        self.steps = self.v.steps
        # Rows fixed in the model that fill every chunk: only rows past the end are empty,
        # and their sums are never stored, so reductions skip the per-element bounds test.
        self.full_chunks = full_chunks
        self._out_kinds = out_kinds
        self.lines: list[str] = []
        self.held: list[RowInput] = []  # inputs of the next row loaded ahead (row_loop decides)
        self.invariant: frozenset[str] = frozenset()  # inputs loaded once before the row loop

    def dim(self, d: int) -> str:
        """Iteration dim d, as the kernel reads it (layout.RowLayout.dim)."""
        return self.at.dim(d)

    # -- the two paths ------------------------------------------------------------------
    # The register path walks the thread's chunks: chunk i of lane l holds row elements
    # (i·T + l)·V … +V-1, read with one 16-byte access per input when `vec` holds. The first
    # reduction's input is computed once into registers `hr` (one read of the row); later
    # passes start from it, and inputs only they need are read chunk by chunk.
    def chunk_loads(self, xs: list[RowInput], ind: str, p: str = "", declare: bool = True, size: str = "NCH") -> None:
        """Chunk i of each input in `xs`, into xr<k>[i] (row variables with prefix `p`; arrays
        of `size` chunks when declared here)."""
        for x in xs:
            st = ops.CTYPES[x.dtype][0]
            if declare:
                self.lines.append(f"{ind}StitchVec<V, {st}> xr{x.index}[{size}];")
            scalar = (f"{ind}  for (int j = 0; j < V; ++j) xr{x.index}[i].v[j] = c0 + j < {p}Cr ? "
                      f"{self.at.ptr(x)}[{self.at.offset(x, 'c0 + j', p)}] : ({st})0;")
            if x.vectorizable:
                self.lines.append(f"{ind}if (vec) {{ if (c0 < {p}Cr) xr{x.index}[i] = "
                                  f"*reinterpret_cast<const StitchVec<V, {st}>*>({self.at.ptr(x)} + {self.at.offset(x, 'c0', p)}); }}")
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
        loads = [x for x in self.v.cone_inputs(targets, cached) if x.name not in held]
        if self.columns and loop:
            assert not cached, "the loop path holds no row in registers"
            self.column_loop(targets, loads, ind, body, after, prologue)
            return
        # A loop pass of many inputs is not unrolled: their hoisted loads would spill (16
        # float16 inputs × 8192 at 1024 threads: 152 bytes, ptxas).
        unroll = LOOP_UNROLL if len(loads) <= LOOP_UNROLL_INPUTS else 1
        if loop:  # 16-byte loads for the first few inputs; the rest element by element
            loads = self.loop_vectors(loads)

        if not loop:  # inputs the same for every row are already in registers
            held = held | self.invariant
            loads = [x for x in loads if x.name not in self.invariant]

        def raw(x: RowInput) -> str:
            return f"xr{x.index}[i].v[jj]" if x in loads or x.name in held else \
                f"{self.at.ptr(x)}[{self.at.offset(x, 'c0 + jj')}]"

        lines, scope = self.v.element_lines(targets, raw, ind + ("      " if guard else "    "), cached)
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

    def column_loop(self, targets: list[str], loads: list[RowInput], ind: str,
                    body: Callable[[dict[str, ops.Arg]], list[str]], after: Callable[[], list[str]] | None,
                    prologue: list[str] | None) -> None:
        """The loop path of a column reduction (a thread per column, T = V = 1): the thread's
        slice [cb, Cr) in whole steps of UN elements, every load of a step issued before the
        first is used, then one step of the last few elements (loads and uses guarded). A
        `#pragma unroll` of the bounded loop left that to ptxas, which in the split kernels
        (a slice from a run-time `cb`) interleaved the loads with their uses: 3 loads issued
        before the first FFMA of 32, 292 instructions per step against the unsplit loop's 71
        (sm_90 SASS, NVRTC 13.0); and a tail of single elements would wait out a load's
        latency per element."""
        assert self.geo.threads == 1 and self.geo.vec == 1, "a column kernel's thread takes one element a step"
        # Loaded ahead: the first few inputs, UN elements each, within about COLUMN_UNROLL
        # registers in flight per thread (the bytes in flight rowplan.column_share prices).
        ahead = loads[:LOOP_UNROLL_INPUTS]
        steps = max(4, rows.COLUMN_UNROLL >> (len(ahead) - 1).bit_length()) if ahead else 1

        def raw(x: RowInput) -> str:
            return f"xl{x.index}[uu]" if x in ahead else f"{self.at.ptr(x)}[{self.at.offset(x, 'c0')}]"

        def fetch(x: RowInput) -> str:
            # (a full input's step from one pointer: the UN offsets are constants when S is)
            if x.access == "full":
                return f"({self.at.ptr(x)} + ({self.at.offset(x, 'cm')}))[(I)uu * S]"
            return f"{self.at.ptr(x)}[{self.at.offset(x, 'cm + (I)uu')}]"

        def step(guard: bool) -> list[str]:
            pad = ind + "    "
            lines, scope = self.v.element_lines(targets, raw, pad + "  ")
            out = []
            for x in ahead:
                st = ops.CTYPES[x.dtype][0]
                load = f"cm + (I)uu < Cr ? {fetch(x)} : ({st})0" if guard else fetch(x)
                out += [f"{pad}{st} xl{x.index}[UN];", "#pragma unroll",
                        f"{pad}for (int uu = 0; uu < UN; ++uu) xl{x.index}[uu] = {load};"]
            inner = (prologue or []) + lines + body(scope) + (after() if after else [])
            if guard:
                inner = [f"{pad}  if (c0 < Cr) {{"] + inner + [f"{pad}  }}"]
            return out + ["#pragma unroll", f"{pad}for (int uu = 0; uu < UN; ++uu) {{",
                          f"{pad}  const I c0 = cm + (I)uu; constexpr int jj = 0; (void)c0; (void)jj;"] + inner + [f"{pad}}}"]

        self.lines += [f"{ind}{{", f"{ind}  constexpr int UN = {steps};", f"{ind}  I cm = {self.cb}(I)0;",
                       f"{ind}  for (; cm + UN <= Cr; cm += UN) {{  // whole steps"]
        self.lines += step(False)
        self.lines += [f"{ind}  }}", f"{ind}  if (cm < Cr) {{  // the slice's last elements: one step, guarded"]
        self.lines += step(True)
        self.lines += [f"{ind}  }}", f"{ind}}}"]

    def loop_vectors(self, xs: list[RowInput]) -> list[RowInput]:
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

    def held_loads(self, held: list[RowInput], ind: str, p: str) -> None:
        """Every chunk of the `held` inputs, into their row-long registers (row prefix `p`)."""
        self.lines += ["#pragma unroll", f"{ind}for (int i = 0; i < NCH; ++i) {{",
                       f"{ind}  const I c0 = {self.cb}((I)i * T + lane) * V;"]
        self.chunk_loads(held, ind + "  ", p, declare=False)
        self.lines.append(f"{ind}}}")

    def cache_pass(self, src: str, ind: str, held: list[RowInput]) -> None:
        """hr = the first reduction's input, from the row's registers; then the next row's
        loads are issued, to arrive while this row reduces (one row ahead per thread)."""
        ct = self.v.ctype(src)
        self.lines.append(f"{ind}StitchVec<V, {ct}> hr[NCH];")
        names = frozenset(x.name for x in held)
        self.chunks([src], ind, {}, lambda scope: [f"{ind}    hr[i].v[jj] = {self.v.arg(src, scope, ct).expr};"], False,
                    held=names)
        self.lines += self.at.row_setup("n_", f"row0 + {self.row_step}", ind)
        self.held_loads(held, ind, "n_")

    def arg_pass(self, j: int, s: Step, regs: bool, ind: str, cached: Mapping[str, str]) -> str:
        """ArgMax/ArgMin: a (value, position) pair per thread, then across the row's threads;
        ties go to the first position (the last with select_last_index). Returns the index."""
        (src,) = s.inputs
        assert isinstance(src, str)
        vt = self.v.ctype(src)
        last = "true" if s.attrs.get("select_last_index", 0) else "false"
        better = ops.ARG_REDUCERS[s.op]
        self.lines.append(f"{ind}{vt} accv{j} = ({vt})0; long long acci{j} = -1;")

        def take(scope: Mapping[str, ops.Arg], pad: str, pos: str) -> list[str]:
            v = f"(({vt})({self.v.arg(src, scope, vt).expr}))"
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
        ct = self.v.ctype(s.out)
        (src,) = s.inputs
        assert isinstance(src, str)
        ident = red.identity.replace("T", ct)
        self.lines.append(f"{ind}{ct} acc{j} = {ident};")
        if keep:
            self.lines.append(f"{ind}StitchVec<V, {self.v.ctype(src)}> {keep}[NCH];")

        def combine(scope: Mapping[str, ops.Arg], pad: str) -> list[str]:
            value = ops.REDUCE_ELEMENT.get(s.op, "{x}").format(x=f"(({ct})({self.v.arg(src, scope, ct).expr}))")
            held = [f"{pad}{keep}[i].v[jj] = {self.v.arg(src, scope, self.v.ctype(src)).expr};"] if keep else []
            return held + [f"{pad}{{ const {ct} u = acc{j}, v = {value}; acc{j} = {red.combine}; }}"]

        self.chunks([src], ind, cached, lambda scope: combine(scope, ind + "      "),  # type: ignore[list-item]
                    not (regs and self.full_chunks), loop=not regs)
        fn = f"[]({ct} u, {ct} v) {{ return {red.combine}; }}"
        self.lines.append(f"{ind}acc{j} = stitch_row_reduce<T>(acc{j}, {fn}, {ident}, reinterpret_cast<{ct}*>(stitch_smem));")
        if self.split and self.columns:  # each thread's column, across the cluster's blocks
            self.lines.append(f"{ind}acc{j} = stitch_cluster_reduce<KS, true>(acc{j}, {fn}, "
                              f"reinterpret_cast<{ct}*>(&stitch_slots[trip][{j}][threadIdx.x]));")
        elif self.split:  # then across the cluster's blocks
            self.lines.append(f"{ind}acc{j} = stitch_cluster_reduce<KS>(acc{j}, {fn}, "
                              f"reinterpret_cast<{ct}*>(&stitch_slots[trip][{j}]));")

    def output_pass(self, elem_outs: list[str], regs: bool, ind: str, cached: Mapping[str, str]) -> None:
        """The per-element outputs, a chunk at a time: computed into vectors, stored with one
        16-byte access each when `vec` holds (element by element otherwise)."""
        pad = ind + ("    " if regs else "      ")

        def body(scope: Mapping[str, ops.Arg]) -> list[str]:
            return [f"{pad}o{self.outputs.index(t)}.v[jj] = "
                    f"{store_expr(self.v.dtype[t], self.v.arg(t, scope, self.v.ctype(t)).expr)};" for t in elem_outs]

        def stores() -> list[str]:
            out = []
            for t in elem_outs:
                m, st = self.outputs.index(t), self.v.stype(t)
                ptr = f"static_cast<{st}*>(a.out[{m}])"
                out.append(f"{ind}  if (vec) {{ if (c0 < Cr) *reinterpret_cast<StitchVec<V, {st}>*>({ptr} + base + {self.at.along('c0')}) = o{m}; }}")
                out.append(f"{ind}  else {{ for (int jj = 0; jj < V; ++jj) if (c0 + jj < Cr) {ptr}[base + {self.at.along('c0 + jj')}] = o{m}.v[jj]; }}")
            return out

        decl = [f"{ind}  StitchVec<V, {self.v.stype(t)}> o{self.outputs.index(t)};" for t in elem_outs]
        # The loop path tests each element (its last chunk may be partial); the register
        # path computes whole chunks and bounds only the stores.
        self.chunks(elem_outs, ind, cached, body, not regs, stores, loop=not regs, prologue=decl)  # type: ignore[arg-type]

    def moments(self, reducers: list[Step], first: str | None) -> int | None:
        """0 where the first two reductions are one pass's (stitch_row_moments): the mean of the
        row held in registers (`first`), then the mean of its squared deviations from it
        (LayerNorm's, decomposed or not), in float; only where every chunk is full and a row is
        one block or a group of lanes (no split, no columns). Else None."""
        if not (first and self.full_chunks and len(reducers) > 1) or self.split or self.columns:
            return None
        if self.geo.threads > 32 and (self.geo.threads % 32 or self.geo.threads != self.geo.block):
            return None
        mean, var = reducers[0], reducers[1]
        if (mean.op, var.op, mean.inputs) != ("ReduceMean", "ReduceMean", (first,)) or \
                self.v.ctype(mean.out) != "float" or self.v.ctype(var.out) != "float":
            return None
        made = self.v.by_out
        sq = made.get(var.inputs[0])  # type: ignore[arg-type]
        if sq is None or not (sq.op == "Mul" and sq.inputs[0] == sq.inputs[1] or
                              sq.op == "Pow" and len(sq.inputs) == 2 and sq.inputs[1] == 2.0):
            return None
        dev = made.get(sq.inputs[0])  # type: ignore[arg-type]
        return 0 if dev is not None and dev.op == "Sub" and dev.inputs == (first, mean.out) else None

    def moments_pass(self, j: int, ind: str) -> None:
        """Reductions j and j + 1 (moments) in one: each lane's sums of the row less one of its
        values, then stitch_row_moments; stitch_m{j} holds (mean, variance)."""
        self.lines += [f"{ind}float2 stitch_m{j};",
                       f"{ind}{{  // the mean and the variance in one reduction: sums less a value of the row",
                       f"{ind}  const float k = __shfl_sync(0xffffffffu, (float)(hr[0].v[0]), 0, T < 32 ? T : 32);",
                       f"{ind}  float s = 0.f, q = 0.f;", "#pragma unroll", f"{ind}  for (int i = 0; i < NCH; ++i) {{",
                       "#pragma unroll", f"{ind}    for (int jj = 0; jj < V; ++jj) {{",
                       f"{ind}      const float d = (float)(hr[i].v[jj]) - k;", f"{ind}      s += d; q += d * d;",
                       f"{ind}    }}", f"{ind}  }}",
                       f"{ind}  stitch_m{j} = stitch_row_moments<T, NCH * V>(k, s, q, "
                       "reinterpret_cast<float2*>(stitch_smem));", f"{ind}}}"]

    def path(self, regs: bool, ind: str) -> None:
        """Every reduction, then the per-element outputs; from registers or re-reading the row."""
        saved = dict(self.v.row_vars)
        done = set(self.v.row_vars)
        reducers = [s for s in self.steps if s.reduces]
        elem_outs = [t for t in self.outputs if self.v.level[t] == "elem"]
        first = self.v.cached() if regs else None
        cached: dict[str, str] = {}
        if first:
            self.cache_pass(first, ind, self.held)
            cached[first] = "hr"
        pair = self.moments(reducers, first)
        for j, s in enumerate(reducers):
            ct = self.v.ctype(s.out)
            name = f"r{len(self.v.row_vars)}"
            if s.op in ops.ARG_REDUCERS:
                final = self.arg_pass(j, s, regs, ind, cached)
            elif pair is not None and j in (pair, pair + 1):
                if j == pair:
                    self.moments_pass(j, ind)
                final = f"stitch_m{pair}.{'x' if j == pair else 'y'}"
            else:
                # Softmax's exp feeds the sum and the output: computed once, held in registers.
                later = [str(r.inputs[0]) for r in reducers[j + 1:]] + elem_outs
                src = s.inputs[0]
                keep = (f"hk{j}" if regs and src not in cached and
                        any(st.out == src for st in self.v.cone(later, cached)) else None)
                self.reduce_pass(j, s, regs, ind, cached, keep)
                if keep:
                    cached[str(src)] = keep
                final = ops.REDUCERS[s.op].finalize.replace("T(", f"({ct})(").replace("acc", f"acc{j}")
            self.lines.append(f"{ind}const {ct} {name} = {final};  // {s.op} -> {s.out}")
            self.v.row_vars[s.out] = ops.Arg(name, ct, s.dtype)
            done.add(s.out)
            self.lines += self.v.row_steps(ind, done)
        if elem_outs:
            self.output_pass(elem_outs, regs, ind, cached)
        self.row_outputs(ind)
        self.v.row_vars = saved

    def row_outputs(self, ind: str) -> None:
        row_outs = [t for t in self.outputs if self.v.level[t] == "row"]
        if not row_outs:
            return
        # (a split row: block 0 of the cluster stores)
        self.lines.append(f"{ind}if (lane == 0 && {'rank == 0 && ' if self.split else ''}active) {{")
        for t in row_outs:
            st = self.v.stype(t)
            store = (f"static_cast<{st}*>(a.out[{self.outputs.index(t)}])[row] = "
                     f"{store_expr(self.v.dtype[t], self.v.row_vars[t].expr)};")
            # (an empty row stores the reduction's identity, as ONNX and ORT's CPU kernels do)
            self.lines.append(f"{ind}  {store}")
        self.lines.append(f"{ind}}}")

    def row_loop(self, regs: bool, ind: str) -> None:
        """Every group of T threads takes the same number of trips, so shuffles and barriers
        see all their threads; a trip past the last row runs with an empty row. The register
        path holds the next row's loads in xr (issued during this row)."""
        held = self.v.cone_inputs([self.v.cached()]) if regs and self.v.cached() else []  # type: ignore[list-item]
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
            self.lines += self.at.row_setup("", start, ind + "  ")
            self.held_loads(held, ind + "  ", "")
            self.lines.append(f"{ind}}}")
        self.lines.append(f"{ind}for (I row0 = {start}; row0 < rows; row0 += {self.row_step}) {{")
        inner = ind + "  "
        if self.split:  # cluster slots alternate between a block's consecutive rows
            # (the step parenthesized: a column kernel's step is a product, and row0 / G * per_block
            # was even for every row at even per_block, so consecutive trips shared their slots)
            self.lines.append(f"{inner}const int trip = (int)((row0 / ({self.row_step})) & 1);")
        self.lines += self.at.row_setup("", "row0", inner)
        saved = dict(self.v.row_vars)
        for x in self.ins:
            if x.level == "row":
                load = load_expr(x.dtype, f"{self.at.ptr(x)}[{self.at.offset(x, '0')}]")
                self.lines.append(f"{inner}const {self.v.ctype(x.name)} x{x.index} = active ? {load} : "
                                  f"({self.v.ctype(x.name)})0;")
                self.v.row_vars[x.name] = ops.Arg(f"x{x.index}", self.v.ctype(x.name), x.dtype)
        self.lines += self.v.row_steps(inner, set())
        self.path(regs, inner)
        self.v.row_vars = saved
        self.lines.append(f"{ind}}}")
        if self.split:
            self.lines.append(f"{ind}stitch_cluster_done<KS>();")

    def hoist_invariant(self, held: list[RowInput], ind: str) -> None:
        """Load the per-element inputs that are the same for every row (no row axis where they
        vary) into registers once, when they fit INVARIANT_REGISTERS beside the prefetch."""
        inv = self.at.invariant_inputs()
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

    def prefetch_fits(self, held: list[RowInput]) -> bool:
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
            if self.v.level[t] == "elem":
                terms.append(f"stitch_aligned(a.out[{m}], V * sizeof({self.v.stype(t)}))")
        return " && ".join(terms)
