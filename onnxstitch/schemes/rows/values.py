"""The values a rows kernel computes: its steps (rowplan.py's micro-steps, each per element or
per row), their C types, the expressions of a step over its operands, the per-element cone a
pass needs, and the per-row variables defined so far (`row_vars`, which the printer saves and
restores around each row). Pure text: the printer (printer.py) places what these return."""
from __future__ import annotations

from typing import Callable, Mapping

from ... import ops
from ... import rowplan as rows
from ...graph import FusionGraph
from ...rowplan import Operand, Step
from ..source import baked_arg, load_expr
from .layout import RowInput


class RowValues:
    """The steps of the group over `nodes`, read from inputs `ins` (layout.RowLayout)."""

    def __init__(self, *, graph: FusionGraph, nodes: tuple[int, ...], ins: list[RowInput]) -> None:
        self.g, self.ins = graph, ins
        raw = [s for i in nodes for s in rows.expand(graph, i)]
        self.level = rows.levels(raw, {x.name: x.level for x in ins})
        self.steps = rows.reciprocals(raw, self.level)
        self.by_out = {s.out: s for s in self.steps}
        self.dtype = {s.out: s.dtype for s in self.steps} | {x.name: x.dtype for x in ins}
        self.row_vars: dict[str, ops.Arg] = {}

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

    def cone_inputs(self, targets: list[str], stop: Mapping[str, str] = {}) -> list[RowInput]:
        used = {x for s in self.cone(targets, stop) for x in s.inputs if isinstance(x, str)} | set(targets)
        return [x for x in self.ins if x.level == "elem" and x.name in used and x.name not in stop]

    def element_lines(self, targets: list[str], raw: Callable[[RowInput], str], ind: str,
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

    def row_steps(self, ind: str, done: set[str]) -> list[str]:
        """Every per-row elementwise step whose inputs are ready, as variables (added to
        `done` and `row_vars`)."""
        lines = []
        for s in self.steps:
            if s.out in done or s.reduces or self.level[s.out] != "row":
                continue
            if all(not isinstance(x, str) or not x or x in self.row_vars or x not in self.level for x in s.inputs):
                name = f"r{len(self.row_vars)}"
                expr = self.expr(s, {})
                root = self.by_out.get(s.inputs[0]) if s.op == "Reciprocal" and isinstance(s.inputs[0], str) else None
                if root is not None and root.op == "Sqrt" and self.ctype(s.out) == "float" and \
                        self.ctype(root.out) == "float" and isinstance(root.inputs[0], str) and \
                        root.inputs[0] in self.row_vars:
                    # A norm's 1/sqrt(var + eps), once a row on the latency-bound path: rsqrtf (2 ulp)
                    # rather than an IEEE square root and division (about 40 instructions, branches)
                    expr = f"rsqrtf({self.row_vars[root.inputs[0]].expr})"
                lines.append(f"{ind}const {self.ctype(s.out)} {name} = {expr};  // {s.op} -> {s.out}")
                self.row_vars[s.out] = ops.Arg(name, self.ctype(s.out), s.dtype)
                done.add(s.out)
        return lines

    def cached(self) -> str | None:
        """The tensor the register path holds for the whole row: the first reduction's input."""
        reducers = [s for s in self.steps if s.reduces]
        first = reducers[0].inputs[0] if reducers else None
        return first if isinstance(first, str) and self.level.get(first) == "elem" else None
