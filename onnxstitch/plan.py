"""The plan stage: which legal groups to fuse (choice), by integer linear program.

Design note
-----------
One binary per candidate group (candidates.py: legal; multi-node, or one node whose ORT kernel is
slow) and one per fusible node left alone (a singleton, run by ONNX Runtime as before). Every
fusible node is covered exactly once; the objective is the predicted time of the whole graph
(cost.py). Opaque nodes are fixed singletons: constant cost, but they carry paths, so they take
part in the cycle check.

Choosing legal groups independently can still produce a cyclic contracted graph: group A
feeds B and B feeds A, each entering the other at a node unconnected, inside it, to where it
leaves. Acyclicity is enforced in two layers:

* pairwise conflicts, up front: two disjoint candidates that reach each other both ways may
  not both be chosen (`x_A + x_B <= 1`), found with bitsets over candidates;
* lazy cycle cuts for longer cycles: solve, contract the chosen groups (opaque and unfused
  nodes as singletons), and for each cycle through groups G1..Gk add `sum x_Gi <= k - 1`;
  re-solve until the contraction is acyclic. The cut is valid for every solution: the node
  paths between the Gi exist whatever else is chosen, and contraction keeps paths.

A convex group cannot close a cycle by itself (the cycle would be a path leaving it and
coming back), so every cycle found involves at least two chosen groups.

If CBC fails or stops at the time limit, `Plan.status`/`Plan.message` say so and the best
acyclic solution found is used; with none, the plan fuses nothing and says why.
"""
from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass, field
from typing import Sequence

import mip

from .candidates import Candidates, enumerate_candidates, iter_bits
from .cost import CostModel, group_bytes, group_us, node_bytes, node_us
from .graph import FusionGraph
from .planned import Group, PackRefusal, Plan, Rejection  # noqa: F401 (the plan's types, re-exported)
from .schemes import registry

# Relative MIP gap. CBC's default (1e-4) would hide byte-level differences between plans with
# the same kernel count: one launch is ~4.5 µs, a 4 KB tensor ~0.0014 µs.
_MIP_GAP = 1e-7
# Beyond this many pairwise conflicts, leave the rest to the lazy cuts (still exact).
_MAX_CONFLICTS = 200_000


# ---------------------------------------------------------------------------------------------
# Conflicts and cycles.


def pairwise_conflicts(graph: FusionGraph, groups: Sequence[Sequence[int]],
                       limit: int = _MAX_CONFLICTS) -> list[tuple[int, int]]:
    """Pairs (a, b), a < b, of disjoint groups that reach each other both ways.

    Bitsets over *candidates*: `below[i]` holds the candidates touching a strict descendant of
    node i, `above[i]` those touching a strict ancestor. B conflicts with A when it touches
    both A's descendants and A's ancestors. At most `limit` pairs.
    """
    n = len(graph.nodes)
    at = [0] * n
    for c, members in enumerate(groups):
        for i in members:
            at[i] |= 1 << c
    below = [0] * n
    for i in reversed(range(n)):
        for s in graph.succs[i]:
            below[i] |= below[s] | at[s]
    above = [0] * n
    for i in range(n):
        for p in graph.preds[i]:
            above[i] |= above[p] | at[p]
    pairs: list[tuple[int, int]] = []
    for a, members in enumerate(groups):
        down = up = overlap = 0
        for i in members:
            down |= below[i]
            up |= above[i]
            overlap |= at[i]
        both = (down & up & ~overlap) >> (a + 1)  # symmetric: keep b > a only
        for b in iter_bits(both):
            pairs.append((a, a + 1 + b))
            if len(pairs) >= limit:
                return pairs
    return pairs


def contract(graph: FusionGraph, chosen: Sequence[Sequence[int]]) -> tuple[list[int], list[set[int]]]:
    """Group id of every node (chosen groups first, then one id per remaining node) and the
    contracted adjacency: the data edges, and for a node left to ONNX Runtime its reads of
    shapes and axes too (`Node.after`: ORT runs it after them; a fused group reads none)."""
    owner = [-1] * len(graph.nodes)
    for g, members in enumerate(chosen):
        for i in members:
            owner[i] = g
    nxt = len(chosen)
    for i in range(len(owner)):
        if owner[i] < 0:
            owner[i] = nxt
            nxt += 1
    adj: list[set[int]] = [set() for _ in range(nxt)]
    for i, succs in enumerate(graph.succs):
        for s in succs:
            if owner[i] != owner[s]:
                adj[owner[i]].add(owner[s])
    for i, n in enumerate(graph.nodes):
        if owner[i] >= len(chosen):
            for t in n.after:
                p = graph.producer.get(t)
                if p is not None and owner[p] != owner[i]:
                    adj[owner[p]].add(owner[i])
    return owner, adj


def _sccs(adj: Sequence[set[int]]) -> list[list[int]]:
    """Strongly connected components with more than one vertex (iterative Tarjan)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in range(len(adj)):
        if root in index:
            continue
        work = [(root, iter(adj[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on_stack.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
            elif w not in index:
                index[w] = low[w] = counter
                counter += 1
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(adj[w])))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return out


def _cycle_in(adj: Sequence[set[int]], comp: list[int], start: int) -> list[int]:
    """A shortest cycle through `start` inside one strongly connected component (BFS)."""
    inside = set(comp)
    parent = {start: start}
    queue = [start]
    for v in queue:
        for w in adj[v]:
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            if w in inside and w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError("no cycle in a strongly connected component")


def find_cycles(graph: FusionGraph, chosen: Sequence[Sequence[int]]) -> list[list[int]]:
    """One cycle per nontrivial strongly connected component of the graph with each chosen
    group contracted to a vertex, as lists of indices into `chosen` (the groups on it)."""
    _, adj = contract(graph, chosen)
    cycles = []
    for comp in _sccs(adj):
        start = min(comp)  # a chosen group when there is one: they get the lowest ids
        cycles.append(sorted(g for g in _cycle_in(adj, comp, start) if g < len(chosen)))
    return cycles


def topological_groups(graph: FusionGraph, chosen: Sequence[Sequence[int]]) -> list[int]:
    """Indices into `chosen` in a topological order of the (acyclic) contraction, ties broken
    by smallest node id."""
    owner, adj = contract(graph, chosen)
    first = [len(owner)] * len(adj)
    for i, g in enumerate(owner):
        first[g] = min(first[g], i)
    indeg = [0] * len(adj)
    for succs in adj:
        for w in succs:
            indeg[w] += 1
    ready = [(first[g], g) for g in range(len(adj)) if indeg[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for w in adj[g]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, (first[w], w))
    if len(order) != len(adj):
        raise ValueError("the contracted graph has a cycle")
    return [g for g in order if g < len(chosen)]


# ---------------------------------------------------------------------------------------------
# The ILP.


@dataclass
class _Outcome:
    chosen: list[int] = field(default_factory=list)  # candidate indices
    status: str = "optimal"
    message: str = ""
    conflicts: int = 0
    cuts: int = 0
    rounds: int = 0


def _status_text(status: mip.OptimizationStatus) -> str:
    return {mip.OptimizationStatus.OPTIMAL: "optimal",
            mip.OptimizationStatus.FEASIBLE: "feasible (time limit)"}.get(status, status.name.lower())


def _solve(graph: FusionGraph, groups: Sequence[tuple[int, ...]], cost: CostModel,
           time_limit_s: float, max_rounds: int, use_conflicts: bool,
           prices: Sequence[float | None]) -> _Outcome:
    """Set partitioning over fusible nodes with conflict constraints and lazy cycle cuts.
    `prices`, one per group: its time where its scheme set it, else None (cost.py's)."""
    deadline = time.perf_counter() + time_limit_s
    model = mip.Model(sense=mip.MINIMIZE, solver_name=mip.CBC)
    model.verbose = 0
    model.max_mip_gap = _MIP_GAP
    x = [model.add_var(var_type=mip.BINARY, obj=group_us(graph, cost, frozenset(g)) if p is None else p)
         for g, p in zip(groups, prices)]
    covering: dict[int, list[mip.Var]] = {}
    for var, g in zip(x, groups):
        for i in g:
            covering.setdefault(i, []).append(var)
    for i, vars_ in covering.items():
        alone = model.add_var(var_type=mip.BINARY, obj=node_us(graph, cost, i))
        model.add_constr(mip.xsum(vars_) + alone == 1)
    out = _Outcome()
    if use_conflicts:
        for a, b in pairwise_conflicts(graph, groups):
            model.add_constr(x[a] + x[b] <= 1)
            out.conflicts += 1
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return _give_up(out, "time limit reached before an acyclic plan was found")
        status = model.optimize(max_seconds=left)
        out.rounds += 1
        if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
            return _give_up(out, f"CBC returned {status.name}")
        chosen = [c for c, var in enumerate(x) if var.x is not None and var.x > 0.5]
        cycles = find_cycles(graph, [groups[c] for c in chosen])
        if not cycles:
            out.chosen, out.status = chosen, _status_text(status)
            if status == mip.OptimizationStatus.FEASIBLE:
                out.message = f"CBC stopped at the {time_limit_s:g} s limit; the plan may not be optimal"
            return out
        if out.rounds >= max_rounds:
            return _give_up(out, f"still cyclic after {max_rounds} solver rounds")
        for cyc in cycles:
            if not cyc:  # impossible for a topologically sorted graph and convex groups
                raise ValueError("a cycle through no fused group: the graph is not a DAG in node order")
            model.add_constr(mip.xsum(x[chosen[g]] for g in cyc) <= len(cyc) - 1)
            out.cuts += 1


def _give_up(out: _Outcome, why: str) -> _Outcome:
    out.chosen, out.status = [], "no plan"
    out.message = f"{why}; no acyclic solution, so nothing is fused"
    return out


def make_group(graph: FusionGraph, cost: CostModel, name: str, members: tuple[int, ...]) -> Group:
    """The plan's group over `members`, run by the scheme that claims it (a rows kernel where it
    holds a row reduction, else an elementwise one)."""
    s = frozenset(members)
    ins, outs = graph.boundary(s)
    return Group(name, members, ins, outs, graph.iteration_shape(s), group_bytes(graph, s),
                 group_us(graph, cost, s), tuple(graph.nodes[i].label for i in members),
                 scheme=registry.candidate_scheme(graph, s))


def unfused_totals(graph: FusionGraph, cost: CostModel) -> dict[str, float | int]:
    """A plan's "before" figures: every node of `graph` its own kernel."""
    every = range(len(graph.nodes))
    return {"predicted_us_before": sum(node_us(graph, cost, i) for i in every),
            "bytes_before": sum(node_bytes(graph, i) for i in every), "kernels_before": len(graph.nodes)}


def _with_proposals_taken(graph: FusionGraph, cands: Candidates, proposed: Sequence[Group], max_size: int,
                          per_seed: int) -> Candidates:
    """`cands` and the groups legal around the proposals once they are taken. Candidates are
    grown to maximal groups (and small ones up to `max_size`) over the fusible nodes; with a
    proposal's nodes free, the maximal groups beside it reach into it (a mask's arithmetic into
    an attention chain's Add and Softmax) and the ones that stop at its edge, which the plan
    needs when it takes the proposal, are no longer grown."""
    owner = {i: grp for grp in proposed for i in grp.nodes}
    nodes = tuple(dataclasses.replace(n, reason=f"in the {owner[n.index].scheme} kernel {owner[n.index].name}")
                  if n.index in owner and n.fusible else n for n in graph.nodes)
    around = enumerate_candidates(dataclasses.replace(graph, nodes=nodes), max_size, per_seed)
    groups = tuple(dict.fromkeys(cands.groups + around.groups))
    return dataclasses.replace(cands, groups=groups)


def make_plan(graph: FusionGraph, cost: CostModel = CostModel(), *, time_limit_s: float = 30.0,
              max_size: int = 6, per_seed: int = 8, max_rounds: int = 200,
              pairwise: bool = True, candidates: Candidates | None = None,
              proposed: Sequence[Group] = ()) -> Plan:
    """Choose the fusion groups of `graph` minimising predicted time.

    `time_limit_s` bounds all solver rounds together; `max_size`/`per_seed` bound the small
    candidates (see `enumerate_candidates`); `pairwise=False` leaves acyclicity to the lazy
    cuts alone (for tests); `candidates` reuses an enumeration already made. `proposed` are
    groups a scheme's own matcher found (attention chains), priced by that scheme: they compete
    in the same program with the elementwise and rows candidates over their nodes.
    """
    cands = candidates or enumerate_candidates(graph, max_size, per_seed)
    if proposed and candidates is None:
        cands = _with_proposals_taken(graph, cands, proposed, max_size, per_seed)
    every = list(cands.groups) + [grp.nodes for grp in proposed]
    prices = [None] * len(cands.groups) + [grp.predicted_us for grp in proposed]
    start = time.perf_counter()
    if every:
        out = _solve(graph, every, cost, time_limit_s, max_rounds, pairwise, prices)
    else:
        out = _Outcome(message="no legal group: nothing to fuse")
    seconds = time.perf_counter() - start
    chosen = [every[c] for c in out.chosen]
    order = topological_groups(graph, chosen)

    def group(k: int, c: int) -> Group:
        index = out.chosen[c] - len(cands.groups)
        if index >= 0:  # a scheme's own group, as it made it
            return dataclasses.replace(proposed[index], name=f"g{k}")
        return make_group(graph, cost, f"g{k}", chosen[c])

    groups = tuple(group(k, c) for k, c in enumerate(order))
    fused = {i for g in groups for i in g.nodes}
    rest = [i for i in range(len(graph.nodes)) if i not in fused]
    return Plan(
        groups=groups, status=out.status, message=out.message, solve_seconds=seconds,
        num_candidates=len(every),
        **unfused_totals(graph, cost),
        predicted_us_after=sum(g.predicted_us for g in groups) + sum(node_us(graph, cost, i) for i in rest),
        bytes_after=sum(g.predicted_bytes for g in groups) + sum(node_bytes(graph, i) for i in rest),
        kernels_after=len(groups) + len(rest),
        rejections=cands.rejections, conflicts=out.conflicts, cuts=out.cuts, rounds=out.rounds)
