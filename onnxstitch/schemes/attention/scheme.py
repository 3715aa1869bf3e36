"""The attention scheme behind the common interface (schemes/base.py)."""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ...graph import FusionGraph
from ...planned import Group
from .. import ATTENTION
from ..base import Matcher
from ..source import KernelSource
from . import codegen, match


# (Looked up at each call, so that what the match module holds is what runs.)
MATCHER = Matcher(
    stage="attention", prefix="a", enabled=lambda o: o.reductions and o.attention,
    find=lambda g, _weights, _options: match.find(g), group_of=lambda *a: match.group_of(*a), chosen=lambda *a: match.chosen(*a))


class Attention:
    name = ATTENTION
    matcher = MATCHER
    relayout = None
    # The chain's nodes read their own shape and slice parameters (its projections' Slices and
    # Reshapes): its fallback is the chain as it is, its Transpose included.
    fallback_verbatim = True

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        return False  # its groups are its matcher's

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        return codegen.generate(graph, name, group.payload)

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        spec = src.spec
        out = {"scheme": self.name, "head_size": spec.head_size, "queries_per_block": spec.queries,
               "block": spec.threads, "shared_bytes": spec.shared_bytes, "transposed_output": spec.transposed,
               "tf32": not spec.half, "dtype": match.DTYPES[spec.dtype], "kv_group": spec.kv_group,
               "causal": spec.causal, "decode_rows": spec.decode_rows, "upcast": src.output_dtypes[0] != spec.dtype}
        if spec.projected:  # q, kᵀ, v read from their projections
            out |= {"heads": spec.heads, "column_offsets": list(spec.column_offsets), "biases": spec.biases}
        return out

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        return [helper.make_attribute(k, v) for k, v in src.spec.attributes().items()]


SCHEME = Attention()
