"""The elementwise scheme behind the common interface (schemes/base.py)."""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ...folds import views
from ... import rowplan
from ...graph import FusionGraph
from ...planned import Group
from .. import ELEMENTWISE
from ..source import KernelSource
from . import codegen


class Elementwise:
    matcher = None  # its groups are the plan's candidates (candidates.py)
    relayout = None
    name = ELEMENTWISE
    fallback_verbatim = False

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        return not rowplan.has_rows(graph, nodes)

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        return codegen.generate(graph, name, group.nodes)

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        out: dict[str, Any] = {"scheme": self.name, "vec_width": src.vec_width, "block": 256}
        if src.spec.output_views:
            out["views"] = views.describe(views.group_views(graph, frozenset(group.nodes), src.outputs))
        if src.input_boxes:
            out["boxes"] = [{"input": b.tensor, "source": b.source, "axis": b.axis, "start": b.start, "stop": b.stop}
                            for b in src.input_boxes if b is not None]
        if src.input_windows:
            out["windows"] = [{"input": t, "axis": w.axis, "origin": w.origin, "size": w.size, "total": w.total}
                              for t, w in zip(src.inputs, src.input_windows) if w is not None]
        return out

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        if not src.spec.output_views:
            return []
        return [helper.make_attribute("output_views", list(src.spec.output_views))]


SCHEME = Elementwise()
