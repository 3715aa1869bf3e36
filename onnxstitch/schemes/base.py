"""The interface every kernel scheme implements (docs/architecture.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import onnx

from ..graph import FusionGraph
from ..planned import Group, Plan
from .source import KernelSource


class Scheme(Protocol):
    """One kind of kernel. Which groups it runs is decided before it is asked: the plan's
    legality (candidates.py) and cost (cost.py) for elementwise and rows groups, the scheme's
    own `matcher` for attention chains and library epilogues; a group carries its scheme's name
    and what the scheme matched (`Group.scheme`, `Group.payload`)."""

    name: str
    # How it finds its own groups (base.Matcher), or None where the plan's candidates are its.
    matcher: "Matcher | None"
    # The fused node's fallback function is the group's nodes exactly as they were (rather than
    # rebuilt around folded Slices, layout views and runtime shapes).
    fallback_verbatim: bool
    # How nodes its plan leaves to ONNX Runtime run in its own layout (base.Relayout), or None.
    relayout: "Relayout | None"
    # (Optional, False where absent: registry.plans_per_shape.) Its library chooses engines per
    # input shape at a session's first run.
    # plans_per_shape: bool

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        """Whether it runs the plan's candidate group over `nodes` (registry.candidate_scheme:
        exactly one scheme without a matcher claims each; a matcher's scheme claims none)."""
        ...

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        """The group's kernel source, its entries named after `name`."""
        ...

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        """How the kernel is launched, for the report (scheme, block, its own geometry)."""
        ...

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        """The fused node's attributes the runtime reads for this scheme (docs/abi.md)."""
        ...


class Found(Protocol):
    """What a matcher found over a graph: its matches (each with `describe()`) and the
    near-misses, one line each with why."""

    matches: tuple[Any, ...]
    refusals: tuple[str, ...]


@dataclass(frozen=True)
class Matcher:
    """How a scheme that finds its own groups (attention chains, GEMM and convolution epilogues)
    takes part in planning: the pipeline asks every registered matcher in turn, names no scheme.

    - `enabled(options)`: whether optimize's options ask for it (pipeline.Options, read by field);
    - `find(graph, weights, options)`: its matches and refusals (a Found), reported under `stage`;
    - `group_of(graph, cost, name, match)`: a match as a candidate group of the one ILP, named
      `prefix` + its index;
    - `settle(graph, cost, plan, found)`: after the plan, the plan as the scheme needs it and the
      matches to plan again without (None when it is settled);
    - `chosen(found, plan)`: the matches the plan took, the rest refused with why;
    - `linked(groups)`: groups that are fused all together or not at all."""

    stage: str
    prefix: str
    enabled: Callable[[Any], bool]
    find: Callable[[FusionGraph, Any, Any], Found]
    group_of: Callable[[FusionGraph, Any, str, Any], Group]
    chosen: Callable[[Found, Plan], Found]
    settle: Callable[[FusionGraph, Any, Plan, Found], "tuple[Plan, Found | None]"] = \
        lambda _g, _cost, plan, _found: (plan, None)
    linked: Callable[[Iterable[Group]], set[str]] = lambda _groups: set()


@dataclass(frozen=True)
class NodeRewrite:
    """A node left to ONNX Runtime as the rewrite writes it instead (one node or a few), and the
    constants they read."""

    nodes: tuple[onnx.NodeProto, ...]
    constants: tuple[onnx.TensorProto, ...] = ()


@dataclass(frozen=True)
class Relayout:
    """How a scheme runs some nodes left to ONNX Runtime in a layout of its own (conv: NHWC
    between its groups; the plan lists them in `Plan.relaid`). The rewrite asks it, naming no
    scheme:

    - `node(graph, i, node)`: node `i` (`node` in the model) as it runs in that layout;
    - `bridge(nodes, available)`: nodes and constants making each tensor the rewritten `nodes`
      read in the other layout than made (`available`: the graph's inputs and initializers);
    - `info(graph, t)`: type and shape of a tensor the scheme names in its layout (a fused output
      the graph does not describe), None for any other name;
    - `holds(t)`: the graph's tensor that such a name holds in the scheme's layout, None for any
      other name, and `restored(t, value)`: its value in the graph's layout (verification compares
      a group's output held so with the original's)."""

    node: Callable[[FusionGraph, int, onnx.NodeProto], NodeRewrite]
    bridge: Callable[[list[onnx.NodeProto], set[str]], "tuple[list[onnx.NodeProto], list[onnx.TensorProto]]"]
    info: Callable[[FusionGraph, str], Any]
    holds: Callable[[str], "str | None"]
    restored: Callable[[str, Any], Any]
