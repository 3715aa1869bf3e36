"""Layered (Sugiyama) layout of the boxes, top to bottom: python-igraph finds the layers and the
order within each layer (the crossing minimisation), a small linear program places them.

Why igraph: its wheels (abi3, Linux/macOS/Windows) carry the compiled C core, so it installs
from PyPI on Python 3.10-3.13 with no compiler and no system binary (Graphviz's `dot` would be
one); it is actively released, lays out the 400-node graphs here in milliseconds, and returns the
dummy points of long edges, so edges can be routed around the boxes. The pure-Python grandalf
has had no release since 2023; an ELK/dagre layout in JavaScript would leave the plain SVG (and
the tests' geometry checks) without coordinates.

igraph places every vertex, a long edge's dummies too, on a grid of equal slots, which makes a
graph with many long edges (a detector's head) several metres wide. So its x coordinates serve
only as the order within each layer; the x positions come from Graphviz's program (Gansner et
al., "A technique for drawing directed graphs", 1993): keep each layer's order with a box's or a
dummy's own width between neighbours, and pull each edge straight, long edges hardest. It is a
linear program of a few thousand variables, solved by CBC through `mip` (already the planner's).

Each layer is a band as tall as its tallest box; an edge runs vertically through the bands it
crosses (at its own box's or dummy's x) and bends only in the gaps between bands, so no edge
crosses a box and no two boxes overlap."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import igraph
import mip

DUMMY_GAP = 12.0  # between a long edge's vertical run and its neighbours in a band
# Gansner's weights for an edge segment between two boxes, a box and a dummy, two dummies:
# long edges are pulled straightest.
_WEIGHTS = (1.0, 2.0, 8.0)


@dataclass(frozen=True)
class Box:
    """A box's top-left corner and size, in pixels."""

    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class Route:
    """An edge's path: from the bottom of `src`'s box to the top of `dst`'s, as cubic Bézier
    segments (`points` is start, then three points per segment)."""

    src: int
    dst: int
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Layout:
    """Boxes (by unit id), edge routes and the drawing's size."""

    boxes: tuple[Box, ...]
    routes: tuple[Route, ...]
    width: float
    height: float


@dataclass
class _Placed:
    """Pixel x of each vertex's centre and of each edge's bends (x, layer), and layers."""

    x: list[float]
    layer: list[int]
    bends: list[list[tuple[float, int]]]


def layered(sizes: Sequence[tuple[float, float]], edges: Sequence[tuple[int, int]], gap_x: float = 25.0,
            gap_y: float = 34.0, top: float = 0.0, margin: float = 20.0) -> Layout:
    """Boxes of `sizes` (width, height) in layers `gap_y` pixels apart and at least `gap_x` apart
    within a layer, starting `top` pixels down; edges (src, dst) routed between them."""
    if not sizes:
        return Layout((), (), 2 * margin, top + margin)
    p = _place([w for w, _ in sizes], edges, gap_x)
    heights = [0.0] * (max(p.layer) + 1)
    for (_, h), k in zip(sizes, p.layer):
        heights[k] = max(heights[k], h)
    band = [top]
    for h in heights[:-1]:
        band.append(band[-1] + h + gap_y)
    boxes = tuple(Box(margin + x - w / 2, band[k] + (heights[k] - h) / 2, w, h)
                  for x, k, (w, h) in zip(p.x, p.layer, sizes))
    routes = []
    for (a, b), bends in zip(edges, p.bends):
        ka, kb = p.layer[a], p.layer[b]
        down = kb >= ka
        inner = sorted(bends, key=lambda q: q[1] if down else -q[1])
        # Downward edges leave a box's bottom and enter the next one's top; an edge igraph had
        # to reverse (a cycle) runs upward, leaving the top and entering the bottom.
        xa, xb = margin + p.x[a], margin + p.x[b]
        stops = [(xa, boxes[a].y + (boxes[a].h if down else 0.0)), (xa, band[ka] + (heights[ka] if down else 0.0))]
        for x, k in inner:
            near, far = (band[k], band[k] + heights[k]) if down else (band[k] + heights[k], band[k])
            stops += [(margin + x, near), (margin + x, far)]
        stops += [(xb, band[kb] + (0.0 if down else heights[kb])), (xb, boxes[b].y + (0.0 if down else boxes[b].h))]
        routes.append(Route(a, b, _curve(stops)))
    right = max([b.x + b.w for b in boxes] + [margin + x for r in p.bends for x, _ in r])
    return Layout(boxes, tuple(routes), right + margin, band[-1] + heights[-1] + margin)


def _place(widths: Sequence[float], edges: Sequence[tuple[int, int]], gap: float) -> _Placed:
    """Layers and x positions. Each weakly connected part is laid out alone and the parts put
    side by side, largest first: igraph 1.0 gives a graph of several parts' edges the wrong
    bends (edge_routing)."""
    n = len(widths)
    parts = sorted(igraph.Graph(n=n, edges=list(edges), directed=True).connected_components(mode="weak"),
                   key=lambda c: (-len(c), min(c)))
    out = _Placed([0.0] * n, [0] * n, [[] for _ in edges])
    left = 0.0
    for part in parts:
        local = {v: k for k, v in enumerate(part)}
        ids = [e for e, (a, _) in enumerate(edges) if a in local]
        lay = igraph.Graph(n=len(part), edges=[(local[edges[e][0]], local[edges[e][1]]) for e in ids],
                           directed=True).layout_sugiyama(hgap=1, vgap=1, maxiter=200)
        slots = [tuple(c) for c in lay.coords[:len(part)]]
        routed = [[tuple(q) for q in r] for r in lay.edge_routing]
        xs, bxs = _positions(slots, routed, [widths[v] for v in part],
                             [(local[edges[e][0]], local[edges[e][1]]) for e in ids], gap)
        lo = min([x - widths[v] / 2 for v, x in zip(part, xs)] + [x for r in bxs for x in r])
        for v, x, (_, y) in zip(part, xs, slots):
            out.x[v], out.layer[v] = x - lo + left, round(y)
        for e, r, rx in zip(ids, routed, bxs):
            out.bends[e] = [(x - lo + left, round(y)) for x, (_, y) in zip(rx, r)]
        left = max([out.x[v] + widths[v] / 2 for v in part] + [x for e in ids for x, _ in out.bends[e]]) + gap
    return out


def _positions(slots: Sequence[tuple[float, float]], routed: Sequence[Sequence[tuple[float, float]]],
               widths: Sequence[float], edges: Sequence[tuple[int, int]], gap: float
               ) -> tuple[list[float], list[list[float]]]:
    """x of each vertex and bend: the linear program of the module's docstring, over one
    connected part (vertices 0..n-1, bends after them) with igraph's order in each layer."""
    n = len(slots)
    items = [(x, round(y), widths[v]) for v, (x, y) in enumerate(slots)]
    index = []
    for r in routed:
        index.append(list(range(len(items), len(items) + len(r))))
        items += [(x, round(y), 0.0) for x, y in r]
    model = mip.Model(sense=mip.MINIMIZE, solver_name=mip.CBC)
    model.verbose = 0
    # Whole pixels: with integral widths the program's vertices are integral anyway (its rows are
    # differences), and CBC prints its LP log on stdout whatever `verbose` says unless a variable
    # is integer.
    x = [model.add_var(lb=0.0, obj=1e-4, var_type=mip.INTEGER) for _ in items]
    rows: dict[int, list[int]] = {}
    for k, (_sx, layer, _) in sorted(enumerate(items), key=lambda t: (t[1][1], t[1][0], t[0])):
        rows.setdefault(layer, []).append(k)
    for row in rows.values():
        for i, j in zip(row, row[1:]):
            wi, wj = items[i][2], items[j][2]
            space = gap if wi and wj else DUMMY_GAP
            model.add_constr(x[j] - x[i] >= round((wi + wj) / 2 + space))
    for (a, b), chain in zip(edges, index):
        path = [a, *chain, b]
        for i, j in zip(path, path[1:]):
            t = model.add_var(lb=0.0, obj=_WEIGHTS[(i >= n) + (j >= n)])
            model.add_constr(t >= x[i] - x[j])
            model.add_constr(t >= x[j] - x[i])
    status = model.optimize()
    if status != mip.OptimizationStatus.OPTIMAL:  # pragma: no cover - an LP this shape is always feasible
        raise RuntimeError(f"layout: CBC returned {status.name}")
    pos = [v.x for v in x]
    return pos[:n], [[pos[k] for k in chain] for chain in index]


def _curve(stops: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Straight vertical runs through bands, S-bends across the gaps: each step between two
    stops at different x becomes a Bézier segment with vertical tangents."""
    out = [stops[0]]
    for p, q in zip(stops, stops[1:]):
        if p[0] == q[0]:
            out += [p, q, q]  # a straight segment, as a degenerate curve
        else:
            mid = (p[1] + q[1]) / 2
            out += [(p[0], mid), (q[0], mid), q]
    return tuple(out)
