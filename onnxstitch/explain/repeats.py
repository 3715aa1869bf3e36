"""Repeated layers drawn once: a transformer's 12 encoder layers are planned alike, so the
picture shows the first in full and the next 11 as one box "× 11 identical layers".

Layers are found by the module scope of their nodes (outline.scope_of: "encoder/layer/3/..."):
every scope token that is a number after a prefix is a candidate index for that prefix. Two
layers are identical when their boxes, in graph order, have the same kinds, schemes and op
types, i.e. the same plan; the layer drawn in full may hold more boxes than those it stands
for (a mask computed once, inside the first layer). Only runs of consecutive identical layers are collapsed, and only
in a graph too large to read whole (a CNN of a hundred boxes is drawn whole)."""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence

from .view import GROUP, LAYERS, Collapsed, PlanView, Unit

# At most this many boxes are drawn whole; above it repeated layers are collapsed.
MAX_WHOLE = 60
# A run is collapsed only when at least this many identical layers follow the one drawn.
MIN_HIDDEN = 2
# Prefixes tried, one per round (an encoder's and a decoder's stacks are two prefixes).
_ROUNDS = 4


@dataclass(frozen=True)
class _Run:
    """Layers `indices` of `prefix`, each planned like the one before `indices[0]`."""

    prefix: tuple[str, ...]
    indices: tuple[int, ...]
    units: frozenset[int]  # the boxes of those layers


def collapse(view: PlanView, max_whole: int = MAX_WHOLE) -> PlanView:
    """`view` with its runs of identical layers each drawn as one LAYERS box, when it has more
    than `max_whole` boxes; unchanged otherwise or when no run of repeats is found."""
    for _ in range(_ROUNDS):
        if len(view.units) <= max_whole:
            break
        runs = [r for prefix in _prefixes(view) for r in _runs(view, prefix)]
        if not runs:
            break
        best = max(_by_prefix(runs).values(), key=lambda rs: (sum(len(r.units) for r in rs), -len(rs[0].prefix)))
        view = _apply(view, best)
    return view


def _prefixes(view: PlanView) -> set[tuple[str, ...]]:
    """Scope prefixes followed by a number in at least three nodes' scopes with distinct numbers,
    among nodes not yet collapsed."""
    seen: dict[tuple[str, ...], set[str]] = collections.defaultdict(set)
    for u in view.units:
        if u.kind == LAYERS:
            continue
        for i in u.nodes:
            tokens = view.outline.nodes[i].scope.split("/")
            for k in range(1, len(tokens)):
                if tokens[k].isdigit():
                    seen[tuple(tokens[:k])].add(tokens[k])
    return {p for p, idx in seen.items() if len(idx) >= 3}


def _layer(scope: str, prefix: tuple[str, ...]) -> int | None:
    tokens = scope.split("/")
    n = len(prefix)
    if len(tokens) > n and tuple(tokens[:n]) == prefix and tokens[n].isdigit():
        return int(tokens[n])
    return None


def _runs(view: PlanView, prefix: tuple[str, ...]) -> list[_Run]:
    """The runs of `prefix`'s consecutive layers planned alike, past the first of each."""
    layers: dict[int, list[Unit]] = collections.defaultdict(list)
    for u in view.units:
        if u.kind == LAYERS:
            continue
        votes = collections.Counter(x for i in u.nodes
                                    if (x := _layer(view.outline.nodes[i].scope, prefix)) is not None)
        if votes:
            layers[votes.most_common(1)[0][0]].append(u)
    order = sorted(layers)
    sig = {k: tuple((u.kind, u.scheme, u.ops) for u in layers[k]) for k in order}
    runs, start = [], 0
    for end in range(1, len(order) + 1):
        if end < len(order) and order[end] == order[end - 1] + 1 and _alike(sig, order, start, end):
            continue
        hidden = order[start + 1:end]
        if len(hidden) >= MIN_HIDDEN:
            runs.append(_Run(prefix, tuple(hidden), frozenset(u.id for k in hidden for u in layers[k])))
        start = end
    return runs


def _alike(sig: dict[int, tuple], order: Sequence[int], start: int, end: int) -> bool:
    """Whether layer order[end] continues the run drawn from order[start]: the layers after the
    first are identical, and the first may hold more (work done once for all layers, such as
    the attention mask, is often exported inside the first layer)."""
    first, follower = sig[order[start]], sig[order[end]]
    if end > start + 1:
        return follower == sig[order[start + 1]]
    rest = iter(first)
    return all(any(x == y for y in rest) for x in follower)  # a subsequence of the first


def _by_prefix(runs: Sequence[_Run]) -> dict[tuple[str, ...], list[_Run]]:
    out: dict[tuple[str, ...], list[_Run]] = collections.defaultdict(list)
    for r in runs:
        out[r.prefix].append(r)
    return out


def _apply(view: PlanView, runs: Sequence[_Run]) -> PlanView:
    """`view` with each run's boxes, and those on paths between them, as one LAYERS box."""
    gone: set[int] = set()
    boxes = []
    for run in runs:
        inside = _hull(view, run.units) - gone
        gone |= inside
        boxes.append(_box(view, run, [view.units[k] for k in sorted(inside)]))
    kept = [u for u in view.units if u.id not in gone] + boxes
    kept.sort(key=lambda u: u.nodes[0])
    return view.with_units(kept)


def _hull(view: PlanView, units: frozenset[int]) -> set[int]:
    """`units` and every box on a path between two of them (so the collapsed box closes no cycle)."""
    succ: dict[int, list[int]] = collections.defaultdict(list)
    pred: dict[int, list[int]] = collections.defaultdict(list)
    for a, b in view.edges:
        succ[a].append(b)
        pred[b].append(a)

    def reach(adj: dict[int, list[int]]) -> set[int]:
        seen, todo = set(units), list(units)
        while todo:
            for v in adj[todo.pop()]:
                if v not in seen and view.units[v].kind != LAYERS:
                    seen.add(v)
                    todo.append(v)
        return seen

    return reach(succ) & reach(pred)


def _box(view: PlanView, run: _Run, inside: Sequence[Unit]) -> Unit:
    """The LAYERS box standing for `inside`."""
    groups = [u for u in inside if u.kind == GROUP and not u.dropped]
    name = ".".join(run.prefix)
    info = Collapsed(len(run.indices), f"{name}.{run.indices[0]}", f"{name}.{run.indices[-1]}", len(groups),
                     dict(collections.Counter(str(u.scheme) for u in groups)),
                     sum(len(u.nodes) for u in inside if u.kind != GROUP or u.dropped))
    nodes = tuple(sorted(i for u in inside for i in u.nodes))
    return Unit(0, LAYERS, nodes, (), (), f"{info.first} … {info.last}",
                predicted_bytes=sum(u.predicted_bytes for u in groups),
                predicted_us=sum(u.predicted_us for u in groups), collapsed=info)
