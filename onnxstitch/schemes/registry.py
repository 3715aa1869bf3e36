"""Every kernel scheme, by name. Adding a scheme: a folder under schemes/ with its spec, code
generator and `SCHEME` (schemes/base.py's interface), its launch in the runtime library, and
one line here (docs/architecture.md)."""
from __future__ import annotations

from .attention.scheme import SCHEME as ATTENTION
from ..graph import FusionGraph
from .base import Matcher, Relayout, Scheme
from .conv.scheme import SCHEME as CONV
from .elementwise.scheme import SCHEME as ELEMENTWISE
from .gemm.scheme import SCHEME as GEMM
from .rows.scheme import SCHEME as ROWS

SCHEMES: dict[str, Scheme] = {s.name: s for s in (ELEMENTWISE, ROWS, ATTENTION, GEMM, CONV)}


def matchers() -> list[tuple[str, Matcher]]:
    """The schemes that find their own groups, by name, in the order they are asked."""
    return [(name, s.matcher) for name, s in SCHEMES.items() if s.matcher is not None]


def candidate_scheme(graph: FusionGraph, nodes: frozenset[int]) -> str:
    """The scheme that runs the plan's candidate group over `nodes`: the one that claims it."""
    names = [name for name, s in SCHEMES.items() if s.matcher is None and s.claims(graph, nodes)]
    if len(names) != 1:
        raise ValueError(f"{len(names)} schemes claim the group over nodes {sorted(nodes)}: {names}")
    return names[0]


def relayouts() -> list[Relayout]:
    """The schemes' ways of running nodes left to ONNX Runtime in layouts of their own."""
    return [s.relayout for s in SCHEMES.values() if s.relayout is not None]


def relaid_info(graph: FusionGraph, tensor: str):
    """Type and shape (shapes.TensorInfo) of a tensor a scheme names in a layout of its own
    (Relayout.info: conv's NHWC tensors), None for any other name."""
    return next((i for r in relayouts() if (i := r.info(graph, tensor)) is not None), None)


def plans_per_shape(name: str) -> bool:
    """Whether the scheme's library chooses its engines per input shape at a session's first
    run (cuDNN compiles and times several: seconds a network) rather than ahead of time: such
    groups' plans are compiled in worker processes before they are timed alone (measure.py), and
    verification runs them at the planning sizes, whose choices the gate and the user's sessions
    then load (runtime/csrc/plan_cache.h)."""
    return bool(getattr(get(name), "plans_per_shape", False))


def get(name: str) -> Scheme:
    """The scheme called `name` (a group's or a kernel source's `scheme`)."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"no kernel scheme {name!r} (known: {', '.join(SCHEMES)})") from None
