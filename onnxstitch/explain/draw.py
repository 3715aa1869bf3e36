"""The plan as SVG: one box per fused group (coloured by scheme, with its ops, predicted bytes
and time, and the fusible neighbours it left out with why), per node left to ONNX Runtime,
and per run of collapsed layers; edges between them, those to a refused neighbour dashed red.
Every box carries its full text in a <title> (a tooltip in a browser) and its facts as data-*
attributes, so the picture can be checked by reading the SVG."""
from __future__ import annotations

import collections
import re
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from html import escape
from typing import Sequence

from .layout import Box, Route, layered
from .view import GROUP, LAYERS, ORT, SINGLE, PlanView, Refusal, Unit

WIDE = 300.0  # a fused group's or collapsed layers' box
NARROW = 210.0  # a single node's box
GAP_X = 25.0  # between boxes side by side
GAP = 34.0  # between layers, where the edges bend
FONT = 11.0
LINE = 14.0
PAD = 6.0
GLYPH = FONT * 0.64  # a monospace glyph is 0.6 em wide; cairo draws DejaVu Sans Mono at 0.63
HEADER = 108.0
MAX_REFUSALS = 3

# (fill, stroke) per scheme or kind; a scheme not listed gets OTHER.
COLOURS = {"elementwise": ("#dbeafe", "#2563eb"), "rows": ("#dcfce7", "#16a34a"),
           "attention": ("#ffedd5", "#ea580c"), ORT: ("#f3f4f6", "#9ca3af"), SINGLE: ("#ffffff", "#6b7280"),
           LAYERS: ("#ede9fe", "#7c3aed"), "dropped": ("#fee2e2", "#dc2626")}
OTHER = ("#fae8ff", "#a21caf")
_GENERIC = " is not an op onnxstitch fuses"
# candidates.py's convexity refusal.
_CYCLE = re.compile(r"not convex: a path leaves the group through (.+) and comes back, so fusing would create a cycle$")


@dataclass(frozen=True)
class Text:
    """A box's visible lines (the first bold, those from `warn_from` on red: what was left out),
    and the full text of its tooltip."""

    lines: tuple[str, ...]
    tooltip: str
    width: float
    warn_from: int | None = None


def svg(view: PlanView, title: str) -> str:
    """The plan of `view` as a standalone SVG document."""
    texts = [_text(u) for u in view.units]
    sizes = [(t.width, 2 * PAD + LINE * len(t.lines)) for t in texts]
    lay = layered(sizes, view.edges, GAP_X, GAP, top=HEADER)
    root = ET.Element("svg", xmlns="http://www.w3.org/2000/svg",
                      style=f"font-family: DejaVu Sans Mono, Menlo, Consolas, monospace; font-size: {FONT:g}px")
    _defs(root)
    ET.SubElement(root, "rect", width="100%", height="100%", fill="#ffffff")
    width = _n(max(lay.width, _caption(root, view, title)))
    root.attrib |= {"width": width, "height": _n(lay.height), "viewBox": f"0 0 {width} {_n(lay.height)}"}
    refused = _refused_edges(view)
    edges = ET.SubElement(root, "g", {"class": "edges"})
    for r in lay.routes:
        _edge(edges, r, refused.get((r.src, r.dst)) or refused.get((r.dst, r.src)))
    boxes = ET.SubElement(root, "g", {"class": "units"})
    for u, t, b in zip(view.units, texts, lay.boxes):
        _box(boxes, u, t, b)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode")


def html(view: PlanView, title: str) -> str:
    """The SVG inside a self-contained HTML page (nothing fetched to view it)."""
    style = ("body { margin: 0; background: #fff; } .unit:hover rect { stroke-width: 3; } "
             "p { font: 13px sans-serif; margin: 8px 20px; }")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>" + escape(title)
            + f"</title><style>{style}</style></head>\n<body>\n<p>Hover a box for all its nodes and every reason; hover "
            "a red edge for why it was not fused.</p>\n" + svg(view, title) + "\n</body>\n</html>\n")


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _wrap(text: str, lines: int, width: float = WIDE, indent: str = "\u00a0\u00a0") -> list[str]:
    """`text` in at most `lines` lines of a box `width` wide, the last cut with an ellipsis; lines
    after the first indented (by no-break spaces: SVG collapses leading plain ones)."""
    chars = int((width - 2 * PAD) / GLYPH)
    out = textwrap.wrap(text, chars, subsequent_indent=indent, break_on_hyphens=False) or [""]
    if len(out) > lines:
        out = out[:lines]
        out[-1] = out[-1][:chars - 1].rstrip() + "…"
    return out


def _ops(ops: Sequence[str]) -> str:
    """"Add×2, Div, Erf, Mul×2": op types in order of first use, with counts."""
    return ", ".join(f"{op}×{k}" if k > 1 else op for op, k in collections.Counter(ops).items())


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _text(u: Unit) -> Text:
    """What a box says, by kind."""
    if u.kind == GROUP:
        return _group_text(u)
    if u.kind == LAYERS:
        return _layers_text(u)
    head = f"{u.ops[0]} · " + ("ONNX Runtime" if u.kind == ORT else "left alone")
    lines = [head, *_wrap(u.name, 1, NARROW)]
    if u.kind == ORT and u.reason and not u.reason.endswith(_GENERIC):
        lines += _wrap(u.reason, 2, NARROW)
    why = u.reason if u.kind == ORT else "fusible, but the plan found no group that pays for it"
    return Text(tuple(lines), f"{u.name} ({u.ops[0]})\n{why}", NARROW)


def _layers_text(u: Unit) -> Text:
    c = u.collapsed
    assert c is not None
    schemes = ", ".join(f"{s} {k}" for s, k in sorted(c.schemes.items()))
    fused = [*_wrap(f"{_count(c.groups, 'fused group')} ({schemes})", 2),
             f"{_size(u.predicted_bytes)} · {u.predicted_us:,.1f} µs fused"] if c.groups else ["0 fused groups"]
    lines = [f"× {c.count} identical layers", f"{c.first} … {c.last}", *fused,
             f"{_count(c.ort_nodes, 'node')} left to ONNX Runtime"]
    return Text(tuple(lines), "\n".join(lines) + "\neach planned like the layer drawn before the box", WIDE)


def _group_text(u: Unit) -> Text:
    lines = [f"{u.name} · {u.scheme} · {len(u.nodes)} ops", *_wrap(_ops(u.ops), 3),
             f"{_size(u.predicted_bytes)} · {u.predicted_us:,.1f} µs predicted"]
    warn_from = len(lines)
    tip = [lines[0], f"predicted {u.predicted_bytes:,} bytes, {u.predicted_us:.2f} µs",
           *([f"kernel {u.kernel}"] if u.kernel else []), "nodes:",
           *(f"  {n} ({op})" for n, op in zip(u.names, u.ops))]
    if u.dropped:
        lines += _wrap(f"✗ left to ONNX Runtime by verification: {u.reason}", 2)
        tip.append(f"left to ONNX Runtime by verification: {u.reason}")
    for r in u.refusals[:MAX_REFUSALS]:
        lines += _wrap(f"✗ {_refusal(r)}", 4)
    if len(u.refusals) > MAX_REFUSALS:
        lines.append(f"(+{len(u.refusals) - MAX_REFUSALS} more left out: hover)")
    tip += [f"left out {r.name} ({r.op}): {r.reason}" for r in u.refusals]
    return Text(tuple(lines), "\n".join(tip), WIDE, warn_from)


def _refusal(r: Refusal) -> str:
    """"<neighbour> (Op) left out: <why>", the reason's own leading mention of the node dropped."""
    why = r.reason
    for said in (f"{r.name} ({r.op}) ", f"{r.name} "):
        if why.startswith(said):
            why = why[len(said):]
            break
    # The convexity refusal says what matters last; the box may cut it off.
    cycle = _CYCLE.match(why)
    if cycle:
        why = f"would close a cycle (not convex): a path leaves through {cycle[1]} and comes back"
    return f"{r.name} ({r.op}) left out: {why}"


def _refused_edges(view: PlanView) -> dict[tuple[int, int], str]:
    """(group unit, neighbour unit) → why the neighbour was left out."""
    owner = {i: u.id for u in view.units for i in u.nodes}
    out: dict[tuple[int, int], str] = {}
    for u in view.units:
        for r in u.refusals:
            out.setdefault((u.id, owner[r.node]), f"{u.name} did not take {r.name}: {r.reason}")
    return out


def _defs(root: ET.Element) -> None:
    defs = ET.SubElement(root, "defs")
    for name, colour in (("arrow", "#9ca3af"), ("arrow-refused", "#dc2626")):
        m = ET.SubElement(defs, "marker", id=name, viewBox="0 0 8 8", refX="8", refY="4", markerWidth="7",
                          markerHeight="7", orient="auto")
        ET.SubElement(m, "path", d="M0,0 L8,4 L0,8 z", fill=colour)


def _caption(root: ET.Element, view: PlanView, title: str) -> float:
    """Title, totals and legend at the top; returns how wide they are."""
    t = view.totals
    speed = f" ({t.us_before / t.us_after:.2f}×)" if t.us_after > 0 else ""
    line = (f"kernels {t.kernels_before} → {t.kernels_after} · predicted {t.us_before:,.1f} µs → "
            f"{t.us_after:,.1f} µs{speed} · bytes moved {_size(t.bytes_before)} → {_size(t.bytes_after)} · "
            f"{t.groups} fused groups")
    hidden = [f"{_count(t.shape_only, 'node')} whose results are read only as shapes"] if t.shape_only else []
    hidden += [f"{_count(t.constant, 'node')} on constants only (ONNX Runtime folds them)"] if t.constant else []
    g = ET.SubElement(root, "g", {"class": "caption"})
    ET.SubElement(g, "text", x="20", y="26", style="font-size: 16px; font-weight: bold").text = title
    note = f"not drawn: {', '.join(hidden)}" if hidden else ""
    ET.SubElement(g, "text", x="20", y="46").text = line
    if note:
        ET.SubElement(g, "text", x="20", y="62").text = note
    x = 20.0
    for key, label in (("elementwise", "elementwise"), ("rows", "rows"), ("attention", "attention"),
                       (ORT, "ONNX Runtime"), (SINGLE, "fusible, left alone"), (LAYERS, "collapsed layers"),
                       ("dropped", "dropped by verification")):
        fill, stroke = COLOURS[key]
        ET.SubElement(g, "rect", x=_n(x), y="74", width="14", height="14", fill=fill, stroke=stroke)
        ET.SubElement(g, "text", x=_n(x + 19), y="85").text = label
        x += 19 + GLYPH * len(label) + 16
    ET.SubElement(g, "path", d=f"M{_n(x)},81 h24", stroke="#dc2626", fill="none",
                  **{"stroke-dasharray": "4 3", "stroke-width": "1.5"})
    ET.SubElement(g, "text", x=_n(x + 29), y="85").text = last = "not fused (why: in the box)"
    return max(x + 29 + GLYPH * len(last), 20 + GLYPH * max(len(line), len(note))) + 20


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _edge(parent: ET.Element, r: Route, refused: str | None) -> None:
    p = r.points
    d = f"M{_n(p[0][0])},{_n(p[0][1])} " + " ".join(
        f"C{_n(a[0])},{_n(a[1])} {_n(b[0])},{_n(b[1])} {_n(c[0])},{_n(c[1])}" for a, b, c in zip(p[1::3], p[2::3], p[3::3]))
    attrs = {"class": "edge refused" if refused else "edge", "d": d, "fill": "none",
             "data-from": f"u{r.src}", "data-to": f"u{r.dst}",
             "stroke": "#dc2626" if refused else "#9ca3af", "stroke-width": "1.5" if refused else "1",
             "marker-end": "url(#arrow-refused)" if refused else "url(#arrow)"}
    if refused:
        attrs["stroke-dasharray"] = "4 3"
    e = ET.SubElement(parent, "path", attrs)
    if refused:
        ET.SubElement(e, "title").text = refused


def _box(parent: ET.Element, u: Unit, t: Text, b: Box) -> None:
    key = "dropped" if u.dropped else u.scheme if u.kind == GROUP else u.kind
    fill, stroke = COLOURS.get(str(key), OTHER)
    attrs = {"class": f"unit {u.kind}", "id": f"u{u.id}", "data-kind": u.kind, "data-ops": " ".join(u.ops),
             "data-nodes": " ".join(map(str, u.nodes))}
    if u.kind == GROUP:
        attrs |= {"data-scheme": str(u.scheme), "data-name": u.name}
    if u.collapsed is not None:
        attrs["data-count"] = str(u.collapsed.count)
    g = ET.SubElement(parent, "g", attrs)
    ET.SubElement(g, "title").text = t.tooltip
    rect = {"x": _n(b.x), "y": _n(b.y), "width": _n(b.w), "height": _n(b.h), "rx": "5", "fill": fill,
            "stroke": stroke, "stroke-width": "2.5" if u.kind == LAYERS else "1.2"}
    if u.kind == SINGLE or u.dropped:
        rect["stroke-dasharray"] = "5 3"
    ET.SubElement(g, "rect", rect)
    for k, line in enumerate(t.lines):
        txt = ET.SubElement(g, "text", x=_n(b.x + PAD), y=_n(b.y + PAD + LINE * (k + 1) - 3.5))
        txt.text = line
        if k == 0:
            txt.set("font-weight", "bold")
        elif t.warn_from is not None and k >= t.warn_from:
            txt.set("fill", "#b91c1c")
