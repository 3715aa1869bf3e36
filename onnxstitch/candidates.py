"""The candidates stage: which node sets MAY become one fused kernel (legality only).

Design note
-----------
Legality is decided here and nowhere else; whether a legal group is worth fusing is the plan's
business (plan.py). A node set is legal when

1. every node is fusible (ops.py's lattice: elementwise/broadcast ops with supported dtypes);
2. it is connected through tensors passed between its members. One node alone is legal (the
   same kernel as with neighbours), but enumeration offers one alone only where ORT's own
   kernel for it is measured slower than the roofline (cost.ORT_BANDWIDTH_SHARE);
3. it is convex: no path leaves the set and comes back. Such a path would run through an
   outside node that both needs the kernel's result and feeds the kernel — a cycle;
4. its iteration shape (broadcast of all member output shapes) is provable, every boundary
   output has exactly that shape (the kernel writes each output over the whole iteration
   space), and the broadcast of its runtime input shapes is that shape too (the custom op
   derives the iteration shape from its inputs at run time, docs/abi.md);
5. it has at most MAX_INPUTS runtime inputs and MAX_OUTPUTS outputs (the kernel ABI);
6. reductions reduce one run of consecutive axes, the same for all (the rows scheme:
   trailing rows, or columns when axes follow the run);
7. layout ops (Reshape, Flatten, Squeeze, Unsqueeze, Transpose) appear only as tails from a
   member's output to a group output, at most one Transpose per chain, never after a
   reduction, and a chain that only reshapes is refused (ORT relabels it without a kernel);
   each chain must fold into the kernel's stores (views.py). Expand is broadcasting: rule 4
   already refuses one that widens beyond every input;
8. Slice/Split (with constant parameters, slices.py) appear only at the inputs of elementwise
   kernels: their input comes from outside the group and all their outputs are read inside,
   where the kernel reads each as a box of that input;
9. a Concat (sizes along its axis known, concats.py) joins only elementwise kernels, one per
   kernel; the members computing an operand, and the inputs they read, stay in that operand's
   window of the Concat's output (rule 4 counts their size along the axis as the Concat's).

Internal nodes of a smaller shape are fine: they are recomputed per element.

Reachability is held as Python-int bitsets (bit j of `desc[i]`: node j is reachable from i),
so convexity of a set S is one expression: `desc(S) & anc(S) & ~S == 0`.

Candidates offered to the plan: (a) for each fusible connected component, maximal legal groups
grown greedily in topological order (a chain of any length becomes one candidate); (b) small
connected subgraphs grown from every seed node, so the plan can trade when the maximal groups
conflict. Every neighbour refused while growing (a) is recorded with its reason.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .cost import ort_share
from .folds import concats, views
from . import rowplan as rows_mod
from .planned import Rejection
from .graph import MAX_INPUTS, MAX_OUTPUTS, FusionGraph, reduced_shape, row_run
from .ops import OpKind
from .shapes import Shape, TensorInfo, broadcast_shapes, fmt


@dataclass(frozen=True)
class Reachability:
    """Strict descendants and ancestors of every node, as bitsets over node ids."""

    desc: tuple[int, ...]
    anc: tuple[int, ...]


def reachability(graph: FusionGraph) -> Reachability:
    """Bitset reachability over the whole graph (opaque nodes included: paths run through
    them). Relies on `graph.nodes` being in topological order."""
    n = len(graph.nodes)
    desc = [0] * n
    for i in reversed(range(n)):
        d = 0
        for s in graph.succs[i]:
            d |= desc[s] | (1 << s)
        desc[i] = d
    anc = [0] * n
    for i in range(n):
        a = 0
        for p in graph.preds[i]:
            a |= anc[p] | (1 << p)
        anc[i] = a
    return Reachability(tuple(desc), tuple(anc))


@dataclass(frozen=True)
class Candidates:
    """Legal groups (sorted node ids, deduplicated; one node alone only where ORT's kernel for it
    is slow, cost.ort_share) and the refusals met growing them."""

    groups: tuple[tuple[int, ...], ...]
    rejections: tuple[Rejection, ...]
    reach: Reachability = field(repr=False, compare=False)

    def to_json(self) -> dict:
        """A JSON-ready dict, for debugging dumps."""
        return {"groups": [list(g) for g in self.groups],
                "rejections": [r.to_json() for r in self.rejections]}


# ---------------------------------------------------------------------------------------------
# Group state: everything legality needs, updatable one node at a time.


def iter_bits(mask: int) -> Iterable[int]:
    """The set bits of a bitset, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _escapes(graph: FusionGraph, tensor: str, mask: int) -> bool:
    """Whether `tensor` is needed outside the node set `mask` (so the kernel must write it)."""
    if tensor in graph.graph_outputs:
        return True
    return any(not (mask >> c) & 1 for c in graph.consumers.get(tensor, ()))


@dataclass(frozen=True)
class _State:
    """A node set with its boundary, reach and iteration shape, kept consistent as it grows."""

    mask: int
    members: tuple[int, ...]  # sorted
    desc: int
    anc: int
    shape: Shape | None  # None once the outputs stop broadcasting: no superset can fix that
    ins: tuple[str, ...]
    outs: tuple[str, ...]

    @property
    def mask_set(self) -> frozenset[int]:
        return frozenset(self.members)

    @staticmethod
    def of(graph: FusionGraph, reach: Reachability, members: Sequence[int]) -> _State:
        """The state of an arbitrary node set, boundary taken from `graph.boundary`."""
        mask = desc = anc = 0
        for i in members:
            mask |= 1 << i
            desc |= reach.desc[i]
            anc |= reach.anc[i]
        ins, outs = graph.boundary(frozenset(members))
        return _State(mask, tuple(sorted(members)), desc, anc, graph.iteration_shape(members, ins), ins, outs)

    def add(self, graph: FusionGraph, reach: Reachability, v: int) -> _State:
        """This set plus node `v`, boundary updated from `v`'s tensors only."""
        node = graph.nodes[v]
        mask = self.mask | (1 << v)
        members = tuple(sorted(self.members + (v,)))
        if any(graph.nodes[i].kind == OpKind.CONCAT for i in members):
            return _State.of(graph, reach, members)  # windows move with every member: afresh
        shape = None if self.shape is None else broadcast_shapes([self.shape] + graph.node_space(v))
        if any(graph.nodes[i].kind == OpKind.SLICE for i in members):
            # A member Slice/Split's outputs are inputs (boxes) while read inside: the
            # incremental rule below does not hold, so the boundary is taken afresh.
            ins, outs = graph.boundary(frozenset(members))
            return _State(mask, members, self.desc | reach.desc[v], self.anc | reach.anc[v], shape, ins, outs)
        produced = set(node.outputs)
        # Tensors `v` produces are no longer read from outside.
        ins = [t for t in self.ins if t not in produced]
        for t in node.inputs:
            p = graph.producer.get(t)
            if t and t not in ins and not (p is not None and (mask >> p) & 1) and not graph.is_baked(t):
                ins.append(t)
        consumed = set(node.inputs)
        # An output `v` reads may now be needed only inside.
        outs = [t for t in self.outs if t not in consumed or _escapes(graph, t, mask)]
        outs += [t for t in node.outputs if t and _escapes(graph, t, mask)]
        return _State(mask, members, self.desc | reach.desc[v], self.anc | reach.anc[v], shape,
                      tuple(ins), tuple(outs))


def _input_shape(graph: FusionGraph, lay: concats.Layout | str | None, t: str) -> Shape | None:
    """A boundary input's shape as the iteration sees it (a windowed one at the Concat's size)."""
    s = graph.shape(t)
    return lay.lift(s) if isinstance(lay, concats.Layout) and t in lay.input_window else s


def _labels(graph: FusionGraph, nodes: Iterable[int], limit: int = 3) -> str:
    nodes = list(nodes)
    text = ", ".join(graph.nodes[i].label for i in nodes[:limit])
    return text + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")


# Rows longer than this with fewer rows than FEW_ROWS need a split reduction (rows.split_factor,
# rows.column_split_factor for columns): one block per row would leave most of the GPU idle.
# ArgMax/ArgMin are not split.
LONG_ROW, FEW_ROWS = 65536, 1024


def _row_verdict(graph: FusionGraph, st: _State, reducers: list[int]) -> str | None:
    """Rules of a group with reductions: one row (the same run of axes) for every reduction,
    each over the whole iteration space; reduced-away outputs leave the group."""
    assert st.shape is not None
    if not st.shape:
        return "a group with reductions needs an iteration shape of rank 1 or more"
    runs = {row_run(graph, i) for i in reducers}
    if len(runs) > 1:
        rank = len(st.shape)
        text = ", ".join(f"{stop - start} axes with {rank - stop} after" for start, stop in sorted(runs))
        return f"its reductions reduce different runs of axes ({text}); a row kernel has one row"
    for i in reducers:
        n = graph.nodes[i]
        data = graph.shape(n.inputs[0])
        if data != st.shape:
            return (f"{n.label} reduces a tensor of shape {fmt(data)}, not the group's iteration shape "
                    f"{fmt(st.shape)}; a row kernel reduces axes of its iteration space")
        if n.attrs.get("keepdims", 1) == 0 and any((st.mask >> c) & 1 for c in graph.consumers.get(n.outputs[0], ())):
            return (f"{n.label} drops the reduced dims (keepdims=0) and is read inside the group; "
                    f"broadcasting its output there would not follow rows")
    start, stop = runs.pop()
    cols = TensorInfo("row", 1, st.shape[start:stop]).numel(graph.dim_values) or 0
    rows = TensorInfo("rows", 1, reduced_shape(st.shape, start, stop, False)).numel(graph.dim_values) or 0
    factor = rows_mod.split_factor(cols, rows) if stop == len(st.shape) else rows_mod.column_split_factor(cols, rows, 4)
    splits = rows_mod.splittable(graph, reducers) and factor > 1
    if cols > LONG_ROW and rows < FEW_ROWS and not splits:
        return (f"{rows} rows of {cols} elements: too few, too long rows for a row kernel "
                f"(rows split across blocks only on GPUs with thread-block clusters, sm_90 on, "
                f"and only without ArgMax/ArgMin)")
    return None


def _layout_verdict(graph: FusionGraph, st: _State, layout: list[int], reducers: list[int]) -> str | None:
    """Rules of layout members (views.py): only as tails that end in the group's outputs, each
    chain foldable into the kernel's stores."""
    assert st.shape is not None
    if reducers:
        return (f"{graph.nodes[layout[0]].label} after a reduction: layout tails of row kernels are "
                f"not implemented")
    for i in layout:
        t = graph.nodes[i].outputs[0]
        inside = [c for c in graph.consumers.get(t, ()) if (st.mask >> c) & 1]
        computes = [c for c in inside if graph.nodes[c].kind != OpKind.INJECTIVE]
        if computes:
            return (f"{graph.nodes[computes[0]].label} reads '{t}' after {graph.nodes[i].label}: a layout op "
                    f"folds only into a group's outputs (views on inputs are not implemented)")
        if t in st.outs or not inside:
            view = views.view_of(graph, st.mask_set, t, st.shape)
            reason = view if isinstance(view, str) else views.foldable(view)
            if reason:
                return reason
            if not view.permutes:  # type: ignore[union-attr]
                return (f"{graph.nodes[i].label} only reshapes '{t}': ONNX Runtime does that without a "
                        f"kernel, so a kernel writing it gains nothing")
    return None


def _slice_verdict(graph: FusionGraph, st: _State, slicers: list[int], reducers: list[int]) -> str | None:
    """Rules of Slice/Split members (slices.py): the kernel reads their outputs as boxes of
    an input, so that input comes from outside and every output they make is read inside."""
    for i in slicers:
        n = graph.nodes[i]
        if reducers:
            return (f"{n.label} feeds a row kernel: Slice/Split fold only into elementwise kernels "
                    f"(row kernels index their inputs by their static shapes)")
        if graph.producer.get(n.inputs[0]) in st.mask_set:
            return (f"{n.label} slices '{n.inputs[0]}', computed inside the group: a kernel reads boxes of "
                    f"its inputs only")
        for t in n.outputs:
            if t in st.outs:
                return (f"'{t}' of {n.label} is needed outside the group: the kernel reads that box of "
                        f"'{n.inputs[0]}' and does not write it")
    return None


def _verdict(graph: FusionGraph, st: _State) -> str | None:
    """Rules 3–5 of the design note on a connected set of fusible nodes."""
    between = st.desc & st.anc & ~st.mask
    if between:
        return (f"not convex: a path leaves the group through {_labels(graph, iter_bits(between))} "
                f"and comes back, so fusing would create a cycle")
    slicers = [i for i in st.members if graph.nodes[i].kind == OpKind.SLICE]
    if slicers:  # before the shape: a slice of a value computed inside has a different one
        reducers = [i for i in st.members if graph.nodes[i].kind == OpKind.REDUCE]
        reason = _slice_verdict(graph, st, slicers, reducers)
        if reason:
            return reason
    lay = concats.layout(graph, st.mask_set, st.ins)
    if isinstance(lay, str):
        return lay
    if lay is not None and any(graph.nodes[i].kind == OpKind.REDUCE for i in st.members):
        return (f"{graph.nodes[lay.concat].label} in a row kernel: Concat folds only into elementwise "
                f"kernels")
    if st.shape is None:
        shapes = sorted({fmt(s) for i in st.members for s in graph.node_space(i)})
        return f"iteration shape not provable: output shapes {', '.join(shapes)} do not broadcast"
    reducers = [i for i in st.members if graph.nodes[i].kind == OpKind.REDUCE]
    layout = [i for i in st.members if graph.nodes[i].kind == OpKind.INJECTIVE]
    if layout:
        reason = _layout_verdict(graph, st, layout, reducers)
        if reason:
            return reason
    row_shapes: tuple[Shape, ...] = ()
    if reducers:
        reason = _row_verdict(graph, st, reducers)
        if reason:
            return reason
        start, stop = row_run(graph, reducers[0])
        row_shapes = (reduced_shape(st.shape, start, stop, True), reduced_shape(st.shape, start, stop, False))
    for t in st.outs:
        s = graph.shape(t)
        if graph.nodes[graph.producer[t]].kind == OpKind.INJECTIVE:
            continue  # written through its view (checked above)
        if s != st.shape and s not in row_shapes:
            rows = f" or its row shapes {' / '.join(fmt(r) for r in row_shapes)}" if row_shapes else ""
            return (f"output '{t}' of {graph.nodes[graph.producer[t]].label} has shape {fmt(s)}, "
                    f"not the iteration shape {fmt(st.shape)}{rows}; a kernel writes every output "
                    f"over the whole iteration space")
        if row_shapes and s == row_shapes[1] and s != row_shapes[0] \
                and graph.nodes[graph.producer[t]].kind != OpKind.REDUCE:
            return (f"output '{t}' of {graph.nodes[graph.producer[t]].label} has the reduced shape "
                    f"{fmt(s)} but is not a reduction's output")
    if not st.ins:
        return ("the group reads no runtime tensor (only baked constants): a constant subgraph, "
                "left to ONNX Runtime's constant folding")
    from_inputs = broadcast_shapes([_input_shape(graph, lay, t) for t in st.ins])
    if from_inputs != st.shape:
        widen = "an Expand or baked constants widen it" if any(
            graph.nodes[i].op_type == "Expand" for i in st.members) else "baked constants widen it"
        return (f"the broadcast of the group's inputs is {fmt(from_inputs)}, not its iteration "
                f"shape {fmt(st.shape)} ({widen}); the kernel derives its "
                f"iteration shape from its inputs")
    if len(st.ins) > MAX_INPUTS:
        return f"{len(st.ins)} inputs exceed the kernel limit of {MAX_INPUTS}"
    if len(st.outs) > MAX_OUTPUTS:
        return f"{len(st.outs)} outputs exceed the kernel limit of {MAX_OUTPUTS}"
    return None


def _unconnected_part(graph: FusionGraph, members: Sequence[int]) -> list[int]:
    """Members not reachable (undirected, through member-to-member tensors) from the first."""
    inside = set(members)
    seen = {members[0]}
    stack = [members[0]]
    while stack:
        i = stack.pop()
        for j in graph.succs[i] | graph.preds[i]:
            if j in inside and j not in seen:
                seen.add(j)
                stack.append(j)
    return sorted(inside - seen)


def legality(graph: FusionGraph, nodes: frozenset[int] | set[int],
             reach: Reachability | None = None) -> str | None:
    """None if `nodes` may be one fused kernel, else why not (naming the nodes concerned).

    `reach` (from `reachability(graph)`) saves recomputing reachability for repeated calls.
    """
    members = sorted(nodes)
    for i in members:
        n = graph.nodes[i]
        if not n.fusible:
            return f"{n.label} is not fusible: {n.reason}"
    if not members:
        return "a fused group needs a node"
    apart = _unconnected_part(graph, members)
    if apart:
        return f"not connected: {_labels(graph, apart)} share no tensor with the rest of the group"
    return _verdict(graph, _State.of(graph, reach or reachability(graph), members))


# ---------------------------------------------------------------------------------------------
# Enumeration.


def _fusible_neighbours(graph: FusionGraph) -> list[tuple[int, ...]]:
    return [tuple(sorted(j for j in graph.succs[i] | graph.preds[i] if graph.nodes[j].fusible))
            if graph.nodes[i].fusible else () for i in range(len(graph.nodes))]


def _components(graph: FusionGraph, nbrs: list[tuple[int, ...]]) -> list[list[int]]:
    """Connected components of the subgraph induced by fusible nodes, each sorted."""
    seen: set[int] = set()
    comps = []
    for start in range(len(graph.nodes)):
        if start in seen or not graph.nodes[start].fusible:
            continue
        seen.add(start)
        comp, stack = [start], [start]
        while stack:
            for j in nbrs[stack.pop()]:
                if j not in seen:
                    seen.add(j)
                    comp.append(j)
                    stack.append(j)
        comps.append(sorted(comp))
    return comps


def _forced(graph: FusionGraph, st: _State, free: set[int]) -> list[int]:
    """Nodes that every legal superset of `st` must contain, when all of them are `free`
    (else none): the nodes on paths between members (a convex superset holds them all), or
    the outside consumers of an output smaller than the iteration shape (it must become
    internal). A layout tail's layout consumers are offered too: a chain that only reshapes
    becomes foldable once it reaches its Transpose."""
    between = list(iter_bits(st.desc & st.anc & ~st.mask))
    if between:
        return between if all(j in free for j in between) else []
    if st.shape is None:
        return []
    need: list[int] = []
    for t in st.outs:
        if graph.nodes[graph.producer[t]].kind == OpKind.SLICE:
            # A box the kernel reads: whoever else reads it must join.
            need += [c for c in graph.consumers.get(t, ()) if not (st.mask >> c) & 1]
            if t in graph.graph_outputs:
                return []
            continue
        if graph.nodes[graph.producer[t]].kind == OpKind.INJECTIVE:
            # A layout tail may become foldable once the chain reaches its Transpose.
            need += [c for c in graph.consumers.get(t, ())
                     if not (st.mask >> c) & 1 and graph.nodes[c].kind == OpKind.INJECTIVE]
            continue
        if graph.shape(t) != st.shape:
            if t in graph.graph_outputs:
                return []
            need += [c for c in graph.consumers.get(t, ()) if not (st.mask >> c) & 1]
    return need if all(j in free for j in need) else []


def _try_add(graph: FusionGraph, reach: Reachability, st: _State, v: int,
             free: set[int]) -> tuple[_State | None, str | None]:
    """`st` plus `v` and whatever that forces in (a node whose output feeds the far side of a
    diamond can only join together with it): (new state, None), or (None, why `v` alone
    does not fit)."""
    new = st.add(graph, reach, v)
    first = reason = _verdict(graph, new)
    while reason is not None:
        need = [j for j in _forced(graph, new, free) if not (new.mask >> j) & 1]
        if not need:
            return None, first
        for j in need:
            new = new.add(graph, reach, j)
        reason = _verdict(graph, new)
    return new, None


def _grow_one(graph: FusionGraph, reach: Reachability, nbrs: list[tuple[int, ...]], seed: int,
              free: set[int]) -> tuple[_State, dict[int, str]]:
    """Grow a legal group from `seed` over `free` nodes, smallest topological index first.
    Once the frontier runs dry, refused nodes get one more try against the grown group.
    Returns the group and the nodes still refused, with why."""
    st = _State.of(graph, reach, [seed])
    frontier = [j for j in nbrs[seed] if j in free]
    heapq.heapify(frontier)
    refused: dict[int, str] = {}
    while True:
        while frontier:
            v = heapq.heappop(frontier)
            if (st.mask >> v) & 1:
                continue
            new, reason = _try_add(graph, reach, st, v, free)
            if new is None:
                refused[v] = reason or ""
                continue
            for j in iter_bits(new.mask & ~st.mask):
                refused.pop(j, None)
                frontier += [k for k in nbrs[j] if k in free and not (new.mask >> k) & 1]
            heapq.heapify(frontier)
            st = new
        again = {v: _try_add(graph, reach, st, v, free) for v in sorted(refused) if not (st.mask >> v) & 1}
        ok = [v for v, (new, _) in again.items() if new is not None]
        if not ok:
            return st, {v: r or "" for v, (_, r) in again.items()}
        frontier = ok[:1]  # take one; the loop re-checks the others against the larger group


def _maximal_groups(graph: FusionGraph, reach: Reachability, nbrs: list[tuple[int, ...]],
                    comp: list[int]) -> tuple[list[tuple[int, ...]], list[Rejection]]:
    """Partition one fusible component into greedily grown maximal legal groups."""
    free = set(comp)
    groups: list[tuple[int, ...]] = []
    rejections: list[Rejection] = []
    for seed in comp:
        if seed not in free:
            continue
        st, refused = _grow_one(graph, reach, nbrs, seed, free)
        free -= set(st.members)
        if len(st.members) > 1:
            groups.append(st.members)
        rejections += [Rejection(st.members, v, r) for v, r in sorted(refused.items())]
        rejections += _opaque_neighbours(graph, st.members)
    return groups, rejections


def _opaque_neighbours(graph: FusionGraph, members: tuple[int, ...]) -> list[Rejection]:
    """Non-fusible nodes next to a group, with their own reason (Inductor style: every
    refused fusion says why)."""
    near = sorted({j for i in members for j in graph.succs[i] | graph.preds[i]
                   if not graph.nodes[j].fusible})
    return [Rejection(members, j, f"{graph.nodes[j].label} is not fusible: {graph.nodes[j].reason}")
            for j in near]


def _small_groups(graph: FusionGraph, reach: Reachability, nbrs: list[tuple[int, ...]], seed: int,
                  max_size: int, per_seed: int) -> list[tuple[int, ...]]:
    """Legal connected sets whose smallest node is `seed`, smallest first, up to `max_size`
    nodes and `per_seed` results. Illegal sets are still extended (a diamond is convex only
    once both arms are in), within a budget of explored sets."""
    budget = 4 * per_seed * max_size
    found: list[tuple[int, ...]] = []
    level = {1 << seed: _State.of(graph, reach, [seed])}
    for _ in range(max_size - 1):
        nxt: dict[int, _State] = {}
        for st in level.values():
            for v in sorted({j for i in st.members for j in nbrs[i] if j > seed}):
                mask = st.mask | (1 << v)
                if (st.mask >> v) & 1 or mask in nxt:
                    continue
                new = st.add(graph, reach, v)
                budget -= 1
                if new.shape is not None:  # an unprovable shape stays unprovable: prune
                    nxt[mask] = new
                    if _verdict(graph, new) is None:
                        found.append(new.members)
                        if len(found) >= per_seed:
                            return found
                if budget <= 0:
                    return found
        level = nxt
    return found


def enumerate_candidates(graph: FusionGraph, max_size: int = 6, per_seed: int = 8,
                         reach: Reachability | None = None) -> Candidates:
    """The legal groups worth offering the plan — multi-node ones, and single nodes whose ORT
    kernel is measured slow (cost.ORT_BANDWIDTH_SHARE) — and the refusals met on the way.

    `max_size` bounds the small subgraphs grown from each seed (not the maximal groups, which
    are unbounded), `per_seed` how many of them each seed contributes.
    """
    reach = reach or reachability(graph)
    nbrs = _fusible_neighbours(graph)
    groups: dict[tuple[int, ...], None] = {}
    rejections: list[Rejection] = []
    for comp in _components(graph, nbrs):
        maximal, rej = _maximal_groups(graph, reach, nbrs, comp)
        groups.update(dict.fromkeys(maximal))
        rejections += rej
        for seed in comp:
            groups.update(dict.fromkeys(_small_groups(graph, reach, nbrs, seed, max_size, per_seed)))
            # A node whose ORT kernel is measured slower than the roofline is worth a kernel
            # of ours even with nothing to fuse it with.
            if ort_share(graph, seed) < 1.0 and legality(graph, {seed}, reach) is None:
                groups[(seed,)] = None
    return Candidates(tuple(groups), tuple(dict.fromkeys(rejections)), reach)
