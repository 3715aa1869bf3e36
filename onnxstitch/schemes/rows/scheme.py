"""The rows scheme behind the common interface (schemes/base.py)."""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ... import rowplan
from ...graph import FusionGraph
from ...planned import Group
from .. import ROWS
from ..source import KernelSource
from . import codegen


class Rows:
    matcher = None  # its groups are the plan's candidates (candidates.py)
    relayout = None
    name = ROWS
    fallback_verbatim = False

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        return rowplan.has_rows(graph, nodes)

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        return codegen.generate_rows(graph, name, group.nodes)

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        spec = src.spec
        return {"scheme": self.name, "vec_width": src.vec_width, "row_axes": spec.row_axes,
                "threads_per_row": spec.row_threads, "block": spec.block_threads,
                "rows_per_block": spec.block_threads // spec.row_threads,
                **({"blocks_per_row": spec.row_split} if spec.row_split > 1 else {})}

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        return [helper.make_attribute("output_kinds", list(src.spec.output_kinds), attr_type=onnx.AttributeProto.INTS),
                helper.make_attribute("row_geometry", src.spec.geometry())]


SCHEME = Rows()
