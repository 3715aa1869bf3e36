"""The interface every kernel scheme implements (docs/architecture.md)."""
from __future__ import annotations

from typing import Any, Protocol

import onnx

from ..graph import FusionGraph
from ..planned import Group
from .source import KernelSource


class Scheme(Protocol):
    """One kind of kernel. Which groups it runs is decided before it is asked: the plan's
    legality (candidates.py) and cost (cost.py) for elementwise and rows groups, the scheme's
    own matcher for attention chains; a group carries its scheme's name and what the scheme
    matched (`Group.scheme`, `Group.payload`)."""

    name: str
    # The fused node's fallback function is the group's nodes exactly as they were (rather than
    # rebuilt around folded Slices, layout views and runtime shapes).
    fallback_verbatim: bool

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        """The group's kernel source, its entries named after `name`."""
        ...

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        """How the kernel is launched, for the report (scheme, block, its own geometry)."""
        ...

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        """The fused node's attributes the runtime reads for this scheme (docs/abi.md)."""
        ...
