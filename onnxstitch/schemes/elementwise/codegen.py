"""Code generation, elementwise scheme: one CUDA kernel per fused group, printed from the op table.

The kernel follows docs/abi.md: one `StitchArgs` parameter, two entries sharing one templated
body — vectorized with 32-bit indices (the fast path) and scalar with 64-bit indices (any size,
any alignment). Two, not four: NVRTC time grows with every instantiation. FULL inputs and all outputs are
read and written with 16-byte accesses in the vectorized entries; BROADCAST inputs are
indexed through runtime strides over a compile-time rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ... import ops
from ...folds import concats, views
from ...graph import FusionGraph, Node
from ...shapes import dtype_size
from ..source import ARGS_STRUCT, BROADCAST, FULL, KernelSource, baked_arg, half_only, load_expr, store_expr
from . import view_code
from .index import decompose
from .spec import ElementwiseSpec

@dataclass(frozen=True)
class KernelOptions:
    """Code-generation choices (benchmarks compare them; defaults are what optimize uses)."""

    prefetch: bool = True  # load the next grid-stride iteration's FULL inputs before computing
    # (+1 to +2 points of copy bandwidth on H200 once the math is lean: docs/perf-notes.md)
    fast_half: bool = True  # approximate exp/log/sqrt/tanh/div where all floats are half precision
    vector_broadcast: bool = True  # 16-byte loads of broadcast inputs along the trailing axes


def _ident(i: int, prefix: str = "v") -> str:
    return f"{prefix}{i}"


class _Printer:
    """Prints one group's body; holds the tensor → C variable map while it runs."""

    def __init__(self, graph: FusionGraph, nodes: tuple[int, ...], inputs: tuple[str, ...],
                 outputs: tuple[str, ...], kinds: tuple[int, ...], vectored: frozenset[int] = frozenset(),
                 windows: tuple[concats.Window | None, ...] = (), layout: concats.Layout | None = None) -> None:
        self.g, self.nodes, self.inputs, self.outputs, self.kinds = graph, nodes, inputs, outputs, kinds
        self.vectored = vectored  # BROADCAST inputs gathered per vector into bv{k}
        # Per input: its Concat window (loaded only where the element `ca` lies in it).
        self.windows = windows or (None,) * len(inputs)
        self.layout = layout  # the group's Concat, if any
        self.var: dict[str, ops.Arg] = {}
        self.lines: list[str] = []
        self.count = 0  # values printed so far (v0, v1, ...)

    def dtype(self, t: str) -> int:
        return self.g.tensors[t].dtype

    def operand(self, t: str) -> ops.Arg:
        if not t:
            return ops.Arg("", "", 0)
        if t in self.var:
            return self.var[t]
        # Only baked scalars reach here: everything else is an input or an earlier value.
        return baked_arg(self.g, t)

    def body(self) -> str:
        ind = " " * 6
        for k, t in enumerate(self.inputs):
            d = self.dtype(t)
            st = ops.CTYPES[d][0]
            raw = (f"in{k}.v[e]" if self.kinds[k] == FULL else f"bv{k}.v[e]" if k in self.vectored
                   else f"static_cast<const {st}*>(a.in[{k}])[o{k}]")
            ct = ops.CTYPES[d][1]
            self.var[t] = ops.Arg(f"x{k}", ct, d)
            load = load_expr(d, raw)
            win = self.windows[k] if k not in self.vectored else None  # (a vector load guards itself)
            if win is not None:  # outside its window the offset points nowhere: not loaded
                load = f"(ca >= {win.origin} && ca < {win.origin + win.size}) ? {load} : ({ct})0"
            self.lines.append(f"{ind}const {ct} x{k} = {load};")
        for i in self.nodes:
            n = self.g.nodes[i]
            s = ops.spec(n.op_type, n.domain)
            if s.kind == ops.OpKind.INJECTIVE:
                self.var[n.outputs[0]] = self.var[n.inputs[0]]  # same values, stored through a view
                continue
            if s.kind == ops.OpKind.SLICE:
                continue  # its outputs are inputs, read through boxes
            if s.kind == ops.OpKind.CONCAT:
                self.concat(n)
                continue
            assert s.printer is not None, n.label
            args = [self.operand(t) for t in n.inputs]
            for t in n.outputs:
                if not t:
                    continue
                d = self.dtype(t)
                ct = ops.CTYPES[d][1]
                self.emit(t, ct, d, s.printer(args, n.attrs, ct), n.op_type)
        for k, t in enumerate(self.outputs):
            self.lines.append(f"{ind}out{k}.v[e] = {store_expr(self.dtype(t), self.var[t].expr)};")
        return "\n".join(self.lines)

    def concat(self, n: Node) -> None:
        """The operand whose window holds the element `ca` (each was computed in its window)."""
        assert self.layout is not None and self.layout.concat == n.index, n.label
        t = n.outputs[0]
        d = self.dtype(t)
        ct = ops.CTYPES[d][1]
        lay = self.layout
        expr = self.operand(n.inputs[-1]).expr
        for k in reversed(range(len(n.inputs) - 1)):
            expr = f"(ca < {lay.origins[k] + lay.sizes[k]} ? {self.operand(n.inputs[k]).expr} : {expr})"
        self.emit(t, ct, d, expr, "Concat")

    def emit(self, t: str, ct: str, d: int, expr: str, op: str) -> None:
        name = _ident(self.count)
        self.count += 1
        self.lines.append(f"      const {ct} {name} = {expr};  // {op} -> {t}")
        self.var[t] = ops.Arg(name, ct, d)


def vec_width(graph: FusionGraph, full_tensors: list[str]) -> int:
    """Elements per thread so the widest FULL tensor moves 16 bytes at a time."""
    widest = max((dtype_size(graph.tensors[t].dtype) for t in full_tensors), default=4)
    return max(1, 16 // widest)


def _block_pattern(shape: tuple, full: tuple) -> tuple[int, int] | None:
    """(p, q) when a broadcast input varies exactly over iteration axes p..q-1 (equal dims
    there, 1 elsewhere): then its offset is (i / inner) % span, one division or two instead
    of one per axis. Bias vectors ([C] over [..., C]) and per-channel tensors ([C, 1, 1])."""
    aligned = (1,) * (len(full) - len(shape)) + tuple(shape)
    varying = [d for d, v in enumerate(aligned) if v != 1]
    if not varying or varying != list(range(varying[0], varying[-1] + 1)):
        return None
    if any(aligned[d] != full[d] for d in varying):
        return None
    return varying[0], varying[-1] + 1


Patterns = dict[int, tuple[int, int] | None]  # BROADCAST input → its block pattern


def block_patterns(graph: FusionGraph, inputs: tuple[str, ...], bcast: list[int], shape: tuple) -> Patterns:
    """Each BROADCAST input's block pattern (_block_pattern) against the iteration shape."""
    return {k: _block_pattern(tuple(graph.tensors[inputs[k]].shape or ()), tuple(shape)) for k in bcast}


def vectored_inputs(pats: Patterns, rank: int) -> frozenset[int]:
    """BROADCAST inputs that vary over a run of trailing axes (a bias [C] over [..., C]): a
    whole vector of them is contiguous, so it is loaded 16 bytes at a time, not element by
    element (checked per launch: whole vectors per run, contiguous strides, alignment)."""
    return frozenset(k for k, pq in pats.items() if pq is not None and pq[1] == rank)


def _broadcast_index(graph: FusionGraph, inputs: tuple[str, ...], pats: Patterns,
                     shape: tuple, vectored: frozenset[int] = frozenset(),
                     boxed: frozenset[int] = frozenset(),
                     windows: tuple[concats.Window | None, ...] = (), inner: str = "1") -> tuple[str, str, str]:
    """Index code for the BROADCAST inputs of `pats` (block_patterns): (per thread, per vector,
    per element).

    A vector's V elements stay inside one run of the innermost axis when that axis is a
    multiple of V (`runs`, uniform per launch): the vector's first element is decomposed once
    and the rest step by the innermost stride. Inputs with a block pattern whose strides are
    the contiguous ones (checked once per thread) skip the decomposition. Otherwise every
    element is decomposed over all axes. `vectored` inputs (vectored_inputs) are gathered
    per vector into bv{k}: one vector load when the launch allows it, else element by element.
    `boxed` inputs (boxes of a wider source, slices.py) also load whole vectors where the
    source's strides keep them contiguous; so do vectored `windows` inputs (concats.py) where
    a vector stays in one window, and only there (`inner`: the element count after the
    Concat's axis, the divisor of its coordinate)."""
    bcast = list(pats)
    if not bcast:
        return "", "", ""
    rank = len(shape)
    setup = [f"  const bool runs = (I)a.dims[{rank - 1}] % V == 0;"]
    for k, pq in pats.items():
        if pq is None:
            continue
        p, q = pq
        # contiguous strides over p..q-1, zero (or a dim of 1) elsewhere
        setup.append(f"  I inner{k} = 1, span{k} = 1; bool pat{k} = true;")
        setup.append("#pragma unroll")
        setup.append(f"  for (int d = {rank - 1}; d >= 0; --d) {{ const I n = (I)a.dims[d], st = (I)a.strides[{k}][d]; "
                     f"if (d >= {q}) {{ inner{k} *= n; pat{k} = pat{k} && (st == 0 || n == 1); }} "
                     f"else if (d >= {p}) {{ pat{k} = pat{k} && (st == span{k} || n == 1); span{k} *= n; }} "
                     f"else pat{k} = pat{k} && (st == 0 || n == 1); }}")
    windows = windows or (None,) * len(inputs)
    for k in sorted(vectored):
        st = ops.CTYPES[graph.tensors[inputs[k]].dtype][0]
        whole = [f"pat{k}"] if pats[k] is not None else []
        if k in boxed or windows[k] is not None:
            # A box of a wider input, or an input the size of its window: whole vectors in
            # memory when the innermost stride is 1 and every other stride a multiple of V
            # (the source's row pitch).
            setup.append(f"  bool bs{k} = (I)a.strides[{k}][{rank - 1}] == 1;")
            setup.append("#pragma unroll")
            setup.append(f"  for (int d = 0; d < {rank - 1}; ++d) bs{k} = bs{k} && (I)a.strides[{k}][d] % V == 0;")
            whole.append(f"bs{k}")
        win = windows[k]
        if win is not None:
            # Strides that are the iteration's own (a window of a tensor of the iteration's
            # shape: LLaMA's rotate_half reads q's halves): the offset is the linear index.
            setup.append(f"  bool lin{k} = true;")
            setup.append(f"  {{ I c = 1;\n#pragma unroll\n  for (int d = {rank - 1}; d >= 0; --d) "
                         f"{{ lin{k} = lin{k} && ((I)a.strides[{k}][d] == c || a.dims[d] == 1); c *= (I)a.dims[d]; }} }}")
        cond = f"({' || '.join(whole)})" if len(whole) > 1 else whole[0]
        if win is not None and len(graph.tensors[inputs[k]].shape or ()) - win.axis == 1:
            cond += f" && {win.origin} % V == 0 && {win.size} % V == 0"  # a vector in one window
        setup.append(f"  const bool bw{k} = runs && {cond} && "
                     f"reinterpret_cast<unsigned long long>(a.in[{k}]) % (V * sizeof({st})) == 0;")
    linear = [k for k in bcast if windows[k] is not None and k in vectored]  # lin{k}: no decomposition
    general = [k for k in bcast if pats[k] is None and k not in linear]
    need = " || ".join(["true"] * bool(general) + [f"!pat{k}" for k, pq in pats.items() if pq is not None]
                       + [f"!lin{k}" for k in linear])
    zero = ", ".join(f"ob{k} = 0" for k in bcast)
    vec = [f"    I {zero};",
           f"    if (runs && ({need})) {{",
           "      I r = w * V;",
           decompose("r", rank - 1, 0, {k: f"ob{k}" for k in bcast}, "      "),
           "    }"]
    for k, pq in pats.items():
        if pq is not None:
            vec.append(f"    if (runs && pat{k}) ob{k} = (w * V / inner{k}) % span{k};")
    vec += [f"    if (runs && lin{k}) ob{k} = w * V;" for k in linear]
    vec += _vector_loads(graph, inputs, vectored, windows, inner, rank)
    rest = [k for k in bcast if k not in vectored]
    if not rest:
        return "\n".join(setup) + "\n", "\n".join(vec) + "\n", ""
    elem = _element_offsets(pats, rest, rank)
    return "\n".join(setup) + "\n", "\n".join(vec) + "\n", "\n".join(elem) + "\n"


def _vector_loads(graph: FusionGraph, inputs: tuple[str, ...], vectored: frozenset[int],
                  windows: tuple[concats.Window | None, ...], inner: str, rank: int) -> list[str]:
    """Per vector: each `vectored` input's V elements gathered into bv{k}, with one vector load
    where the launch allows it (bw{k}), else element by element; a windowed input only inside
    its window (zeros elsewhere: never selected)."""
    vec: list[str] = []
    for k in sorted(vectored):
        st = ops.CTYPES[graph.tensors[inputs[k]].dtype][0]
        win = windows[k]
        if win is None:
            load = [f"    if (bw{k}) bv{k} = static_cast<const StitchVec<V, {st}>*>(a.in[{k}])[ob{k} / V];",
                    "    else {"]
            gather = [f"        bv{k}.v[e] = static_cast<const {st}*>(a.in[{k}])[o];"]
        else:  # loaded only inside its window (zeros elsewhere: never selected)
            inside = f"cw >= {win.origin} && cw < {win.origin + win.size}"
            load = [f"    if (bw{k}) {{",
                    f"      const I cw = (w * V / {inner}) % {win.total};",
                    f"      if ({inside}) bv{k} = static_cast<const StitchVec<V, {st}>*>(a.in[{k}])[ob{k} / V];",
                    "      else {",
                    "#pragma unroll",
                    f"        for (int e = 0; e < V; ++e) bv{k}.v[e] = ({st})0;",
                    "      }",
                    "    } else {"]
            gather = [f"        const I cw = (w * V + e) / {inner} % {win.total};",
                      f"        bv{k}.v[e] = {inside} ? static_cast<const {st}*>(a.in[{k}])[o] : ({st})0;"]
        vec += [f"    StitchVec<V, {st}> bv{k};", *load,
                "#pragma unroll",
                "      for (int e = 0; e < V; ++e) {",
                "        I o = 0, r = w * V + e;",
                decompose("r", rank - 1, 0, {k: "o"}, "        "),
                *gather,
                "      }",
                "    }"]
    return vec


def _element_offsets(pats: Patterns, rest: list[int], rank: int) -> list[str]:
    """Per element: the offsets o{k} of the broadcast inputs not loaded per vector, stepping
    from the vector's first element along the innermost axis, or decomposed."""
    elem = [f"      I {', '.join(f'o{k}' for k in rest)};", "      if (runs) {"]
    for k in rest:
        pq = pats[k]
        step = f"(I)a.strides[{k}][{rank - 1}]"
        if pq is not None:
            step = f"(pat{k} ? (I){int(pq[1] == rank)} : {step})"
        elem.append(f"        o{k} = ob{k} + (I)e * {step};")
    elem += ["      } else {", f"        I r = i; {'; '.join(f'o{k} = 0' for k in rest)};",
             decompose("r", rank - 1, 0, {k: f"o{k}" for k in rest}, "        "),
             "      }"]
    return elem


def generate(graph: FusionGraph, name: str, nodes: tuple[int, ...],
             options: KernelOptions = KernelOptions()) -> KernelSource:
    """CUDA source for a legal group (see candidates.legality) with topologically sorted nodes."""
    inputs, outputs = graph.boundary(frozenset(nodes))
    shape = graph.iteration_shape(frozenset(nodes), inputs)
    assert shape is not None, f"group {name}: iteration shape must be known"
    # A boxed input is strided (its source's row pitch), whatever its shape.
    boxes = tuple(graph.boxes.get(t) if graph.producer.get(t) in nodes else None for t in inputs)
    lay = concats.layout(graph, frozenset(nodes), inputs)
    assert not isinstance(lay, str), lay
    windows = tuple(lay.window(t, graph.tensors[t]) if lay else None for t in inputs)
    # A windowed input is shifted along the Concat's axis, whatever its shape.
    kinds = tuple(FULL if graph.tensors[t].shape == shape and b is None and w is None else BROADCAST
                  for t, b, w in zip(inputs, boxes, windows))
    full = [t for t, k in zip(inputs, kinds) if k == FULL] + list(outputs)
    vw = vec_width(graph, full)
    bcast = [k for k in range(len(inputs)) if kinds[k] == BROADCAST]
    pats = block_patterns(graph, inputs, bcast, shape)
    vectored = vectored_inputs(pats, len(shape)) if options.vector_broadcast else frozenset()
    if options.vector_broadcast:  # windowed inputs too, where a vector stays in one window
        vectored |= frozenset(k for k, w in enumerate(windows) if w is not None)
    p = _Printer(graph, tuple(nodes), inputs, outputs, kinds, vectored, windows, lay)
    compute = p.body()

    def vtype(t: str) -> str:
        return f"StitchVec<V, {ops.CTYPES[graph.tensors[t].dtype][0]}>"

    full_in = [(k, t) for k, t in enumerate(inputs) if kinds[k] == FULL]
    if options.prefetch:
        # Two loads in flight per thread: the next iteration's inputs arrive while this one computes.
        first = "\n".join(f"  {vtype(t)} in{k};\n  if (w0 < work) in{k} = static_cast<const {vtype(t)}*>(a.in[{k}])[w0];"
                          for k, t in full_in)
        loads = "\n".join(["    const I wn = w + step;"] + [
            f"    {vtype(t)} nx{k};\n    if (wn < work) nx{k} = static_cast<const {vtype(t)}*>(a.in[{k}])[wn];"
            for k, t in full_in]) if full_in else ""
        rotate = "\n".join(f"    in{k} = nx{k};" for k, _ in full_in)
    else:
        first, rotate = "", ""
        loads = "\n".join(f"    const {vtype(t)} in{k} = static_cast<const {vtype(t)}*>(a.in[{k}])[w];"
                          for k, t in full_in)
    fast = "  STITCH_FAST_HALF\n" if options.fast_half and half_only(graph, nodes, inputs) else ""
    decls = "\n".join(f"    {vtype(t)} out{k};" for k, t in enumerate(outputs))
    out_views = views.group_views(graph, frozenset(nodes), outputs)
    view_setup, view_stores = view_code.view_code(graph, outputs, out_views)
    store = {k: view_stores.get(k, f"    static_cast<{vtype(t)}*>(a.out[{k}])[w] = out{k};")
             for k, t in enumerate(outputs)}
    stores = "\n".join(store.values())
    cat_setup, cat_index, cat_inner = _concat_coordinate(lay, shape)
    setup, per_vector, index = _broadcast_index(graph, inputs, pats, shape, vectored,
                                                frozenset(k for k, b in enumerate(boxes) if b is not None),
                                                windows, cat_inner)
    elements = f"""{per_vector}#pragma unroll
    for (int e = 0; e < V; ++e) {{
      const I i = w * V + e;
      (void)i;
{cat_index}{index}{compute}
    }}"""
    loop = f"""{first}
  for (I w = w0; w < work; w += step) {{
{loads}
{decls}
{elements}
{stores}
{rotate}
  }}"""
    tiled = views.tiled(out_views)
    if tiled:  # outputs whose view moves the innermost axis go through a shared-memory tile
        direct = "\n".join(f"    const {vtype(t)} in{k} = static_cast<const {vtype(t)}*>(a.in[{k}])[w];"
                           for k, t in full_in)
        plain = "\n".join(code for k, code in store.items() if k not in tiled)
        tile = view_code.tiled_loop(graph, outputs, out_views, tiled, f"{direct}\n{decls}\n{elements}", plain)
        loop = f"  if (vr{tiled[0]}) {{\n{tile}\n  }} else {{\n{loop}\n  }}"
    src = f"""// generated by onnxstitch: group {name}, {len(nodes)} nodes
{ops.PRELUDE}
{ARGS_STRUCT}
template <typename I, int V>
__device__ __forceinline__ void {name}_body(const StitchArgs& a) {{
{fast}  const I work = (I)(a.n / V);
  const I step = (I)gridDim.x * (I)blockDim.x;
  const I w0 = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
{setup}{cat_setup}{view_setup}{loop}
}}
extern "C" __global__ void __launch_bounds__(256) {name}_v32(const StitchArgs a) {{ {name}_body<int, {vw}>(a); }}
extern "C" __global__ void __launch_bounds__(256) {name}_s64(const StitchArgs a) {{ {name}_body<long long, 1>(a); }}
"""
    return KernelSource(name, src, vw, inputs, outputs, kinds,
                        tuple(graph.tensors[t].dtype for t in outputs),
                        ElementwiseSpec(tuple(views.encode_all(out_views)) if any(out_views) else ()),
                        input_boxes=boxes if any(boxes) else (),
                        input_windows=windows if any(windows) else ())


def _concat_coordinate(lay: concats.Layout | None, shape: tuple) -> tuple[str, str, str]:
    """(per thread, per element) code for `ca`, the element's coordinate along the Concat's
    axis, and its divisor (the element count after the axis): a constant where the axes after
    it are fixed at optimize time."""
    if lay is None:
        return "", "", "1"
    axis = len(shape) - lay.from_end
    after = shape[axis + 1:]
    if all(isinstance(d, int) for d in after):
        inner = str(math.prod(after))  # type: ignore[arg-type]
        setup = ""
    else:
        inner = "cinner"
        setup = (f"  I cinner = 1;\n#pragma unroll\n"
                 f"  for (int d = {axis + 1}; d < {len(shape)}; ++d) cinner *= (I)a.dims[d];\n")
    return setup, f"      const I ca = (i / {inner}) % {lay.total};\n", inner
