"""Stage 6, stitched form: one kernel for a group that reduces the last axis of its iteration
space (ReduceSum/Mean/Max/…, Softmax, LogSoftmax, LayerNormalization) together with the
elementwise work before and after the reductions (FusionStitching's block composition).

A block walks a row at a time. Every tensor of the group is either per-element (varies along
the row) or per-row (constant along it). Each reduction is one pass over the row: the block
recomputes the reduction's per-element input from its loads, accumulates in registers, then
combines through warp shuffles and shared memory; every thread gets the row's value. Per-row
steps run as soon as their inputs exist; a last pass computes and stores per-element outputs,
and thread 0 stores per-row outputs. Passes re-read the row, which L1/L2 hold for rows of a
few thousand elements, so device memory sees about one read (docs/next-reductions.md).

Kernel ABI: docs/abi.md, shape_rule "rows", one entry `<name>_rows`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

from . import ops
from .codegen import ARGS_STRUCT, BROADCAST, FULL, KernelSource, _load_expr, _store_expr
from .graph import FusionGraph, constant_value

ROW_OUTPUT, FULL_OUTPUT = 1, 0
Operand = Union[str, float]  # a tensor name, or a literal in the step's compute type


@dataclass(frozen=True)
class Step:
    """One micro-operation: an elementwise op of the table, or a row reduction."""

    out: str
    dtype: int
    op: str
    inputs: tuple[Operand, ...]
    attrs: Mapping[str, object] = field(default_factory=dict)

    @property
    def reduces(self) -> bool:
        return self.op in ops.REDUCERS


def _expand(graph: FusionGraph, i: int) -> list[Step]:
    """A node as steps; Softmax, LogSoftmax and LayerNormalization become reductions plus
    elementwise steps (synthetic tensors are named after the node's output)."""
    n = graph.nodes[i]
    out = n.outputs[0]
    if n.op_type in ops.REDUCERS:
        return [Step(out, graph.tensors[out].dtype, n.op_type, (n.inputs[0],))]
    if n.op_type in ("Softmax", "LogSoftmax"):
        x, d = n.inputs[0], graph.tensors[out].dtype
        steps = [Step(f"{out}~max", d, "ReduceMax", (x,)), Step(f"{out}~shift", d, "Sub", (x, f"{out}~max")),
                 Step(f"{out}~exp", d, "Exp", (f"{out}~shift",)), Step(f"{out}~sum", d, "ReduceSum", (f"{out}~exp",))]
        if n.op_type == "Softmax":
            return steps + [Step(out, d, "Div", (f"{out}~exp", f"{out}~sum"))]
        return steps + [Step(f"{out}~log", d, "Log", (f"{out}~sum",)), Step(out, d, "Sub", (f"{out}~shift", f"{out}~log"))]
    if n.op_type == "LayerNormalization":
        x, scale = n.inputs[0], n.inputs[1]
        bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
        d = graph.tensors[out].dtype
        eps = float(n.attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
        steps = [Step(f"{out}~mean", d, "ReduceMean", (x,)), Step(f"{out}~dev", d, "Sub", (x, f"{out}~mean")),
                 Step(f"{out}~sq", d, "Mul", (f"{out}~dev", f"{out}~dev")),
                 Step(f"{out}~var", d, "ReduceMean", (f"{out}~sq",)), Step(f"{out}~veps", d, "Add", (f"{out}~var", eps)),
                 Step(f"{out}~std", d, "Sqrt", (f"{out}~veps",)),
                 Step(f"{out}~norm", d, "Div", (f"{out}~dev", f"{out}~std")),
                 Step(out if bias is None else f"{out}~scaled", d, "Mul", (f"{out}~norm", scale))]
        return steps + ([Step(out, d, "Add", (f"{out}~scaled", bias))] if bias else [])
    return [Step(t, graph.tensors[t].dtype, n.op_type, tuple(n.inputs), n.attrs) for t in n.outputs if t]


class _RowPrinter:
    """Prints the body of one rows kernel; tracks levels and variable names as it goes."""

    def __init__(self, graph: FusionGraph, nodes: tuple[int, ...], inputs: tuple[str, ...],
                 outputs: tuple[str, ...], kinds: tuple[int, ...], rank: int, last_dim: object) -> None:
        self.g, self.inputs, self.outputs, self.kinds, self.rank = graph, inputs, outputs, kinds, rank
        self.steps = [s for i in nodes for s in _expand(graph, i)]
        self.by_out = {s.out: s for s in self.steps}
        self.dtype = {s.out: s.dtype for s in self.steps} | {t: graph.tensors[t].dtype for t in inputs}
        # An input varies along the row when its (right-aligned) last dim is the row's extent.
        self.elem_inputs = {t for t in inputs if (graph.tensors[t].shape or (1,))[-1] == last_dim
                            and len(graph.tensors[t].shape or ()) > 0}
        self.level: dict[str, str] = {t: ("elem" if t in self.elem_inputs else "row") for t in inputs}
        for s in self.steps:
            elem = any(isinstance(x, str) and x and self.level.get(x) == "elem" for x in s.inputs)
            self.level[s.out] = "row" if s.reduces or not elem else "elem"
        self.row_vars: dict[str, ops.Arg] = {}
        self.lines: list[str] = []

    # -- operands -----------------------------------------------------------------------
    def ctype(self, t: str) -> str:
        return ops.CTYPES[self.dtype[t]][1]

    def literal(self, value: object, ctype: str) -> ops.Arg:
        return ops.Arg(ops.literal(value, ctype), ctype, 0)  # type: ignore[arg-type]

    def arg(self, x: Operand, scope: Mapping[str, ops.Arg], ctype: str) -> ops.Arg:
        if not isinstance(x, str):
            return self.literal(x, ctype)
        if not x:
            return ops.Arg("", "", 0)
        if x in scope:
            return scope[x]
        if x in self.row_vars:
            return self.row_vars[x]
        d = self.g.tensors[x].dtype  # a baked scalar constant
        return ops.Arg(ops.literal(constant_value(self.g, x).item(), ops.CTYPES[d][1]), ops.CTYPES[d][1], d)

    def expr(self, s: Step, scope: Mapping[str, ops.Arg]) -> str:
        ct = self.ctype(s.out)
        spec = ops.spec(s.op, "")
        assert spec.printer is not None, s.op
        args = [self.arg(x, scope, ct) for x in s.inputs]
        return spec.printer(args, s.attrs, ct)

    def load(self, t: str, elem: bool) -> str:
        k = self.inputs.index(t)
        st = ops.CTYPES[self.dtype[t]][0]
        index = "base + c" if self.kinds[k] == FULL else (f"ro{k} + c * (I)a.strides[{k}][{self.rank - 1}]" if elem else f"ro{k}")
        return _load_expr(self.dtype[t], f"static_cast<const {st}*>(a.in[{k}])[{index}]")

    # -- passes -------------------------------------------------------------------------
    def cone(self, targets: list[str]) -> list[Step]:
        """Per-element steps needed for `targets`, in order (per-row values are variables)."""
        need: set[str] = set()
        stack = [t for t in targets if self.level.get(t) == "elem"]
        while stack:
            t = stack.pop()
            if t in need or t not in self.by_out:
                continue
            need.add(t)
            stack += [x for x in self.by_out[t].inputs if isinstance(x, str) and self.level.get(x) == "elem"]
        return [s for s in self.steps if s.out in need]

    def element_pass(self, targets: list[str], ind: str) -> tuple[list[str], dict[str, ops.Arg]]:
        """Loads and steps of one pass over the row computing `targets` per element."""
        scope: dict[str, ops.Arg] = {}
        lines = []
        steps = self.cone(targets)
        used = {x for s in steps for x in s.inputs if isinstance(x, str)} | set(targets)
        for t in self.inputs:
            if t in used and self.level[t] == "elem":
                k = self.inputs.index(t)
                lines.append(f"{ind}const {self.ctype(t)} x{k} = {self.load(t, True)};")
                scope[t] = ops.Arg(f"x{k}", self.ctype(t), self.dtype[t])
        for j, s in enumerate(steps):
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

    def body(self) -> str:
        ind = "    "
        bcast = [k for k, t in enumerate(self.inputs) if self.kinds[k] == BROADCAST]
        if bcast:
            zero = ", ".join(f"ro{k} = 0" for k in bcast)
            acc = " ".join(f"ro{k} += c * (I)a.strides[{k}][d];" for k in bcast)
            self.lines.append(f"{ind}I rr = row, {zero};")
            self.lines.append("#pragma unroll")
            self.lines.append(f"{ind}for (int d = {self.rank - 2}; d >= 0; --d) "
                              f"{{ const I c = rr % (I)a.dims[d]; rr /= (I)a.dims[d]; {acc} }}")
        for k, t in enumerate(self.inputs):
            if self.level[t] == "row":
                self.lines.append(f"{ind}const {self.ctype(t)} x{k} = {self.load(t, False)};")
                self.row_vars[t] = ops.Arg(f"x{k}", self.ctype(t), self.dtype[t])
        done: set[str] = set()
        self.row_steps(ind, done)
        for j, s in enumerate(x for x in self.steps if x.reduces):
            red = ops.REDUCERS[s.op]
            ct = self.ctype(s.out)
            (src,) = s.inputs
            lines, scope = self.element_pass([src], ind + "  ")
            value = self.arg(src, scope, ct).expr
            value = ops.REDUCE_ELEMENT.get(s.op, "{x}").format(x=f"(({ct})({value}))")
            ident = red.identity.replace("T", ct)
            self.lines.append(f"{ind}{ct} acc{j} = {ident};")
            self.lines.append(f"{ind}for (I c = threadIdx.x; c < C; c += blockDim.x) {{")
            self.lines += lines
            self.lines.append(f"{ind}  {{ const {ct} u = acc{j}, v = {value}; acc{j} = {red.combine}; }}")
            self.lines.append(f"{ind}}}")
            combine = f"[]({ct} u, {ct} v) {{ return {red.combine}; }}"
            self.lines.append(f"{ind}acc{j} = stitch_block_reduce<{ct}>(acc{j}, {combine}, {ident}, "
                              f"reinterpret_cast<{ct}*>(stitch_smem));")
            name = f"r{len(self.row_vars)}"
            final = red.finalize.replace("T(", f"({ct})(").replace("acc", f"acc{j}")
            self.lines.append(f"{ind}const {ct} {name} = {final};  // {s.op} -> {s.out}")
            self.row_vars[s.out] = ops.Arg(name, ct, s.dtype)
            done.add(s.out)
            self.row_steps(ind, done)
        elem_outs = [t for t in self.outputs if self.level[t] == "elem"]
        if elem_outs:
            lines, scope = self.element_pass(elem_outs, ind + "  ")
            self.lines.append(f"{ind}for (I c = threadIdx.x; c < C; c += blockDim.x) {{")
            self.lines += lines
            self.lines += [self.store(t, "base + c", self.arg(t, scope, self.ctype(t)).expr, ind + "  ") for t in elem_outs]
            self.lines.append(f"{ind}}}")
        row_outs = [t for t in self.outputs if self.level[t] == "row"]
        if row_outs:
            self.lines.append(f"{ind}if (threadIdx.x == 0) {{")
            self.lines += [self.store(t, "row", self.row_vars[t].expr, ind + "  ") for t in row_outs]
            self.lines.append(f"{ind}}}")
        return "\n".join(self.lines)

    def store(self, t: str, index: str, value: str, ind: str) -> str:
        """The store of output `t` at `index` (per element, or per row)."""
        st = ops.CTYPES[self.dtype[t]][0]
        return f"{ind}static_cast<{st}*>(a.out[{self.outputs.index(t)}])[{index}] = {_store_expr(self.dtype[t], value)};"


ROWS_PRELUDE = r"""
// Every thread of the block gets the block's total; smem holds one partial per warp.
template <typename T, typename F>
__device__ __forceinline__ T stitch_block_reduce(T v, F f, T ident, T* smem) {
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : ident;
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // the next reduction may overwrite smem
  return v;
}
"""


def has_rows(graph: FusionGraph, nodes: tuple[int, ...]) -> bool:
    """True when the group needs the rows scheme (it contains a REDUCE-kind node)."""
    return any(graph.nodes[i].kind == ops.OpKind.REDUCE for i in nodes)


def generate_rows(graph: FusionGraph, name: str, nodes: tuple[int, ...]) -> KernelSource:
    """CUDA source of a legal group with reductions over the last axis (see candidates)."""
    inputs, outputs = graph.boundary(frozenset(nodes))
    shape = graph.iteration_shape(frozenset(nodes))
    assert shape, f"group {name}: a rows kernel needs an iteration shape of rank >= 1"
    kinds = tuple(FULL if graph.tensors[t].shape == shape else BROADCAST for t in inputs)
    p = _RowPrinter(graph, tuple(nodes), inputs, outputs, kinds, len(shape), shape[-1])
    body = p.body()
    out_kinds = tuple(ROW_OUTPUT if p.level[t] == "row" else FULL_OUTPUT for t in outputs)
    src = f"""// generated by onnxstitch: group {name}, {len(nodes)} nodes, rows scheme
{ops.PRELUDE}
{ARGS_STRUCT}
{ROWS_PRELUDE}
template <typename I>
__device__ __forceinline__ void {name}_body(const StitchArgs& a) {{
  __shared__ double stitch_smem[32];  // one partial per warp; double-sized for every accumulator
  const I C = (I)a.dims[{len(shape) - 1}];
  I rows = 1;
  for (int d = 0; d < {len(shape) - 1}; ++d) rows *= (I)a.dims[d];
  for (I row = blockIdx.x; row < rows; row += gridDim.x) {{
    const I base = row * C;
    (void)base;
{body}
  }}
}}
extern "C" __global__ void __launch_bounds__(256) {name}_rows(const StitchArgs a) {{ {name}_body<long long>(a); }}
"""
    return KernelSource(name, src, 1, inputs, outputs, kinds, tuple(graph.tensors[t].dtype for t in outputs),
                        "rows", out_kinds)

