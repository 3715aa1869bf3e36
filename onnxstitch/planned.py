"""What a plan is: its fused groups (`Group`), the neighbours each left out with why
(`Rejection`), the independent groups pack.py did not pack (`PackRefusal`), and the plan itself
(`Plan`). Plain data in a module of its own, low in the house: the stages that make a plan
(candidates.py, plan.py, pack.py) and the schemes that generate a group's kernel both read it,
and neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schemes import ELEMENTWISE
from .shapes import Shape


@dataclass(frozen=True)
class Rejection:
    """A neighbour left out of a group, and why (printable, names the node)."""

    group: tuple[int, ...]
    node: int
    reason: str

    def to_json(self) -> dict:
        """A JSON-ready dict."""
        return {"group": list(self.group), "node": self.node, "reason": self.reason}


@dataclass(frozen=True)
class Group:
    """One fused kernel of the plan."""

    name: str
    nodes: tuple[int, ...]  # topological
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    iteration_shape: Shape | None
    predicted_bytes: int
    predicted_us: float
    labels: tuple[str, ...] = ()  # node labels, for reports
    parts: tuple[tuple[int, ...], ...] = ()  # packed groups (pack.py), empty when not packed
    # Its products round their inputs to TF32 as ONNX Runtime's float32 GEMMs do by default
    # (schemes/attention): verified at TF32's accuracy, not float32's.
    tf32: bool = False
    # The kernel scheme that runs it (schemes/registry.py) and what that scheme matched (an
    # attention chain), so that no later stage has to find out again.
    scheme: str = ELEMENTWISE
    payload: Any = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        """A JSON-ready dict."""
        out = {"name": self.name, "nodes": list(self.nodes), "labels": list(self.labels),
               "inputs": list(self.inputs), "outputs": list(self.outputs),
               "iteration_shape": None if self.iteration_shape is None else list(self.iteration_shape),
               "predicted_bytes": self.predicted_bytes, "predicted_us": self.predicted_us}
        if self.parts:
            out["packed_from"] = [list(p) for p in self.parts]
        if self.tf32:
            out["tf32"] = True
        out["scheme"] = self.scheme
        return out


@dataclass(frozen=True)
class PackRefusal:
    """Two groups of one level and iteration shape that pack.py did not pack, and why."""

    groups: tuple[str, str]
    reason: str

    def to_json(self) -> dict:
        """A JSON-ready dict."""
        return {"groups": list(self.groups), "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """The chosen fusion plan and how it was found. Totals cover every node of the graph
    (opaque ones at their fixed cost).

    `status`: "optimal"; "feasible (time limit)" (CBC stopped early with an acyclic plan);
    "no plan" (no acyclic solution in time or rounds, or a solver failure: nothing is fused,
    `message` says why).
    """

    groups: tuple[Group, ...]  # fused groups, in a topological order of the contraction
    status: str
    message: str
    solve_seconds: float
    num_candidates: int
    predicted_us_before: float
    predicted_us_after: float
    bytes_before: int
    bytes_after: int
    kernels_before: int
    kernels_after: int
    rejections: tuple[Rejection, ...] = ()
    conflicts: int = 0  # pairwise constraints added up front
    cuts: int = 0  # lazy cycle cuts added
    rounds: int = 0  # solver calls
    pack_refusals: tuple[PackRefusal, ...] = ()  # pack.py: same level and shape, not packed
    # Nodes left to ONNX Runtime that a scheme runs in a layout of its own, with the scheme's name
    # (conv: channel Concat/Split, elementwise work and poolings in NHWC between its groups).
    relaid: tuple[tuple[int, str], ...] = ()

    def to_json(self) -> dict:
        """A JSON-ready dict for `--report`."""
        return {
            "status": self.status, "message": self.message, "solve_seconds": self.solve_seconds,
            "num_candidates": self.num_candidates, "conflicts": self.conflicts, "cuts": self.cuts,
            "rounds": self.rounds,
            "predicted_us_before": self.predicted_us_before, "predicted_us_after": self.predicted_us_after,
            "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
            "kernels_before": self.kernels_before, "kernels_after": self.kernels_after,
            "groups": [g.to_json() for g in self.groups],
            "rejections": [r.to_json() for r in self.rejections],
            "pack_refusals": [r.to_json() for r in self.pack_refusals],
        }
