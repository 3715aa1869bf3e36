"""The plan as boxes to draw, read from --report's JSON: each fused group is one box, each node
left to ONNX Runtime (or left alone by the plan) one more, and the data edges between boxes."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import BadInputError
from .outline import GraphOutline

GROUP = "group"  # a fused kernel of the plan
ORT = "ort"  # a node ONNX Runtime runs: not an op onnxstitch fuses
SINGLE = "single"  # a fusible node the plan left alone
LAYERS = "layers"  # repeated identical layers drawn as one box (repeats.py)


@dataclass(frozen=True)
class Refusal:
    """A fusible neighbour left out of a group, and why (the report's `left_out`)."""

    node: int
    name: str
    op: str
    reason: str


@dataclass(frozen=True)
class Collapsed:
    """What a LAYERS box stands for: `count` layers identical to the one drawn in full."""

    count: int
    first: str  # the first and last layer's scope, "encoder.layer.1"
    last: str
    groups: int  # fused groups inside, and their schemes
    schemes: Mapping[str, int]
    ort_nodes: int


@dataclass(frozen=True)
class Unit:
    """One box: a fused group, one node, or collapsed layers."""

    id: int
    kind: str
    nodes: tuple[int, ...]
    ops: tuple[str, ...]  # op types of `nodes`, in order
    names: tuple[str, ...]  # node names of `nodes`
    name: str = ""  # the group's name ("g3") or the node's
    scheme: str | None = None
    predicted_bytes: int = 0
    predicted_us: float = 0.0
    refusals: tuple[Refusal, ...] = ()
    reason: str | None = None  # why ONNX Runtime keeps the node, or why verification dropped the group
    dropped: bool = False
    collapsed: Collapsed | None = None
    kernel: str = ""  # the group's kernel and launch shape, from the report ("" when none)


@dataclass(frozen=True)
class Totals:
    """The plan's before/after figures, for the picture's caption."""

    kernels_before: int
    kernels_after: int
    us_before: float
    us_after: float
    bytes_before: int
    bytes_after: int
    groups: int
    # Nodes not drawn: those whose results are read only as shapes, and those reading
    # constants only (ONNX Runtime folds them when the session starts).
    shape_only: int = 0
    constant: int = 0


@dataclass(frozen=True)
class PlanView:
    """Boxes, their edges (unit id → unit id, deduplicated) and the plan's totals."""

    outline: GraphOutline
    units: tuple[Unit, ...]
    edges: tuple[tuple[int, int], ...]
    totals: Totals

    def with_units(self, units: Sequence[Unit]) -> PlanView:
        """The view over `units` (renumbered in order), edges recomputed from the nodes'."""
        units = [dataclasses.replace(u, id=k) for k, u in enumerate(units)]
        return dataclasses.replace(self, units=tuple(units), edges=unit_edges(self.outline, units))


def unit_edges(outline: GraphOutline, units: Sequence[Unit]) -> tuple[tuple[int, int], ...]:
    """The node edges between distinct units, once each, in a stable order."""
    owner = {i: u.id for u in units for i in u.nodes}
    pairs = {(owner[a], owner[b]) for a, b in outline.edges if a in owner and b in owner}
    return tuple(sorted((a, b) for a, b in pairs if a != b))


def from_report(report: Mapping[str, Any]) -> PlanView:
    """The view of a report's JSON (`Report.to_json`). BadInputError when it has no graph
    outline (a report written before pictures existed) or is not a report at all."""
    if not report.get("graph") or "plan" not in report:
        raise BadInputError("the report has no 'graph' section: write it again with "
                            "`onnxstitch optimize MODEL --report REPORT.json`")
    try:
        outline = GraphOutline.from_json(report["graph"])
        plan = report["plan"]
        units = _group_units(outline, plan["groups"])
        totals = Totals(int(plan["kernels_before"]), int(plan["kernels_after"]), float(plan["predicted_us_before"]),
                        float(plan["predicted_us_after"]), int(plan["bytes_before"]), int(plan["bytes_after"]),
                        sum(1 for u in units if not u.dropped))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BadInputError(f"the report's plan or graph is malformed ({type(e).__name__}: {e})") from None
    grouped = {i for u in units for i in u.nodes}
    live = _reaching_outputs(outline)
    for i, n in enumerate(outline.nodes):
        if i not in grouped and i in live and not n.constant:
            units.append(Unit(0, ORT if n.ort_reason else SINGLE, (i,), (n.op,), (n.name,), n.name,
                              reason=n.ort_reason))
    # Boxes in the order of their first node: the graph's own (topological) order.
    units.sort(key=lambda u: u.nodes[0])
    drawn = {i for u in units for i in u.nodes}
    constant = sum(1 for i, n in enumerate(outline.nodes) if i not in drawn and i in live and n.constant)
    totals = dataclasses.replace(totals, shape_only=len(outline.nodes) - len(drawn) - constant, constant=constant)
    return PlanView(outline, (), (), totals).with_units(units)


def _reaching_outputs(outline: GraphOutline) -> set[int]:
    """Nodes with a data path to a graph output. The others (a Shape → Gather → Concat chain
    whose result only a Reshape's shape input reads: most of a TorchScript export) are left
    out of the picture, which says how many. All nodes when the outline names no outputs."""
    if not outline.outputs:
        return set(range(len(outline.nodes)))
    preds: dict[int, list[int]] = {}
    for a, b in outline.edges:
        preds.setdefault(b, []).append(a)
    seen, todo = set(outline.outputs), list(outline.outputs)
    while todo:
        for p in preds.get(todo.pop(), ()):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def _group_units(outline: GraphOutline, groups: Sequence[Mapping[str, Any]]) -> list[Unit]:
    """One unit per plan group, with the fusible neighbours it left out (the ORT ones say why
    in their own boxes)."""
    units = []
    for grp in groups:
        nodes = tuple(sorted(int(i) for i in grp["nodes"]))
        refusals: dict[int, Refusal] = {}
        for r in grp.get("left_out", []):
            k = int(r["node"])
            if k not in nodes and outline.nodes[k].ort_reason is None:
                refusals.setdefault(k, Refusal(k, outline.nodes[k].name, outline.nodes[k].op, str(r["reason"])))
        dropped = grp.get("dropped_by_verification")
        units.append(Unit(0, GROUP, nodes, tuple(outline.nodes[i].op for i in nodes),
                          tuple(outline.nodes[i].name for i in nodes), str(grp["name"]), str(grp.get("scheme")),
                          int(grp.get("predicted_bytes") or 0), float(grp.get("predicted_us") or 0.0),
                          tuple(refusals.values()), dropped, dropped is not None, kernel=_kernel(grp.get("kernel"))))
    return units


def _kernel(info: Mapping[str, Any] | None) -> str:
    """"stitch_ab12: block 256, vec_width 4": the kernel's name and launch facts."""
    if not info:
        return ""
    facts = ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("group", "kernel", "scheme", "input_kinds"))
    return f"{info.get('kernel', '')}: {facts}"
