"""The pack stage: independent groups over one iteration space share one launch.

Design note
-----------
FusionStitching's kernel packing: groups that do not depend on each other run in one kernel,
so the GPU pays one launch and one ramp-up/tail instead of several. The case that matters is
the attention projections: Q, K and V each end in bias + Reshape + Transpose over the same
[batch, seq, hidden] space, read different tensors, and at BERT sizes each kernel is a few
microseconds of launch latency around under a microsecond of traffic.

The elementwise scheme packs for free: the union of the groups' nodes is one grid-stride loop
over the shared iteration space computing every part's outputs (each written through its own
view), so no ABI change is needed. Legality (`refusal`), apart from choice:

1. both groups use the elementwise scheme (row kernels pack their reductions per row, a
   different launch shape: not done);
2. the same iteration shape, every dim known or a named symbolic dim (so equal at run time);
3. the same level in the contracted graph (longest path from the graph's inputs, every
   opaque node and group one vertex). Equal levels mean neither reaches the other, so the
   packed node closes no cycle, and packing keeps every other vertex's level;
4. the union within the kernel ABI's input and output limits;
5. at most one tile: outputs whose view moves the innermost axis go through the shared-memory
   tile of the first such view; a second, different one would be stored element by element;
6. at most one Concat, and its windows still hold over the union (concats.layout: the other
   group may read a windowed input unshifted).

Choice: in topological order, each group joins the first pack of its (level, shape) that
accepts it. Packing always saves a launch in the cost model; it changes neither bytes nor
the groups the ILP chose.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from .folds import concats, views
from .cost import CostModel
from .graph import MAX_INPUTS, MAX_OUTPUTS, FusionGraph
from .plan import Group, PackRefusal, Plan, contract, make_group, topological_groups
from .shapes import fmt
from .schemes import ELEMENTWISE


def levels(graph: FusionGraph, groups: Sequence[Sequence[int]]) -> list[int]:
    """Each group's level: the longest path (in vertices) from a source of the graph with
    `groups` contracted, every other node a vertex of its own."""
    _, adj = contract(graph, groups)
    level = [0] * len(adj)
    indeg = [0] * len(adj)
    for succs in adj:
        for w in succs:
            indeg[w] += 1
    ready = [v for v in range(len(adj)) if indeg[v] == 0]
    for v in ready:  # grows while iterating: Kahn's order
        for w in adj[v]:
            level[w] = max(level[w], level[v] + 1)
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return level[:len(groups)]


def _tile(graph: FusionGraph, grp: Group) -> tuple | None:
    """The tile the group's kernel would use (views.tile_key), if any."""
    return views.tile_key(views.group_views(graph, frozenset(grp.nodes), grp.outputs))


def refusal(graph: FusionGraph, a: Group, b: Group, level_a: int, level_b: int) -> str | None:
    """None when groups `a` and `b` may share one launch, else why not (rules 1–6)."""
    other = next((g.scheme for g in (a, b) if g.scheme != ELEMENTWISE), None)
    if other is not None:
        return f"{other} kernels are not packed (only elementwise groups share a launch)"
    if a.iteration_shape != b.iteration_shape:
        return f"iteration shapes differ: {fmt(a.iteration_shape)} and {fmt(b.iteration_shape)}"
    if a.iteration_shape is None or any(d is None for d in a.iteration_shape):
        return f"iteration shape {fmt(a.iteration_shape)} has unknown dims: equal only by name"
    if level_a != level_b:
        return f"levels differ ({level_a}, {level_b}): one may depend on the other"
    ins, outs = graph.boundary(frozenset(a.nodes) | frozenset(b.nodes))
    if len(ins) > MAX_INPUTS:
        return f"together {len(ins)} inputs exceed the kernel limit of {MAX_INPUTS}"
    if len(outs) > MAX_OUTPUTS:
        return f"together {len(outs)} outputs exceed the kernel limit of {MAX_OUTPUTS}"
    windows = concats.layout(graph, frozenset(a.nodes) | frozenset(b.nodes), ins)
    if isinstance(windows, str):
        return windows
    ta, tb = _tile(graph, a), _tile(graph, b)
    if ta is not None and tb is not None and ta != tb:
        return "both transpose their innermost axis differently: one kernel holds one tile"
    return None


@dataclass
class _Pack:
    parts: list[Group]
    level: int

    def as_group(self, graph: FusionGraph, cost: CostModel) -> Group:
        if len(self.parts) == 1:
            return self.parts[0]
        nodes = tuple(sorted(i for g in self.parts for i in g.nodes))
        return dataclasses.replace(make_group(graph, cost, self.parts[0].name, nodes),
                                   parts=tuple(g.nodes for g in self.parts))


def pack(graph: FusionGraph, plan: Plan, cost: CostModel = CostModel()) -> Plan:
    """`plan` with independent elementwise groups of one level and iteration shape packed into
    single kernels (see the design note). Groups are renamed g0.. in topological order."""
    lv = levels(graph, [g.nodes for g in plan.groups])
    packs: list[_Pack] = []
    refused: list[PackRefusal] = []
    for grp, level in zip(plan.groups, lv):
        home = None
        for p in packs:
            if p.level != level or p.parts[0].iteration_shape != grp.iteration_shape:
                continue
            merged = p.as_group(graph, cost)
            why = refusal(graph, merged, grp, p.level, level)
            if why is None:
                home = p
                break
            refused.append(PackRefusal((p.parts[0].name, grp.name), why))
        if home is None:
            packs.append(_Pack([grp], level))
        else:
            home.parts.append(grp)
    if len(packs) == len(plan.groups):
        return dataclasses.replace(plan, pack_refusals=tuple(refused))
    merged = [p.as_group(graph, cost) for p in packs]
    order = topological_groups(graph, [g.nodes for g in merged])
    groups = tuple(dataclasses.replace(merged[c], name=f"g{k}") for k, c in enumerate(order))
    saved = sum(g.predicted_us for g in plan.groups) - sum(g.predicted_us for g in groups)
    return dataclasses.replace(
        plan, groups=groups, predicted_us_after=plan.predicted_us_after - saved,
        kernels_after=plan.kernels_after - (len(plan.groups) - len(groups)), pack_refusals=tuple(refused))
