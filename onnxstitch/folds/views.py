"""Layout folding: a fused group whose output goes through Reshape/Flatten/Squeeze/Unsqueeze
and at most one Transpose writes the end of that chain directly (docs/abi.md, `output_views`).

The kernel computes the value over its iteration space as before; what changes is where each
element lands. A chain from `source` (a member's output, over the iteration shape S) to the
group's output is always: reshape S to S1 (`split`), permute S1's axes (`perm`) giving T,
reshape T to F (`final`). Reshapes keep the row-major order, so an element's offset in F is
its offset in T; only the permutation moves data. Sizes are stated relative to the shape
they reshape (numbers, copies of a dim, one remainder), so dynamic dims such as BERT's
batch and sequence stay dynamic.

Legality (why a chain cannot fold) is decided here; candidates.py asks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import ops
from ..graph import FusionGraph
from ..shapes import Shape, fmt

REST = -1  # the dim whose size makes the element counts agree


def copy_of(k: int) -> int:
    """The spec entry for "the size of dim k of the shape reshaped"."""
    return -(k + 2)


@dataclass(frozen=True)
class View:
    """How a group writes output `tensor`: `source` reshaped to `split`, permuted by `perm`,
    reshaped to `final`. Spec entries: >= 0 a fixed size, REST, or copy_of(k)."""

    tensor: str
    source: str
    chain: tuple[int, ...]  # the layout nodes, source side first
    split: tuple[int, ...]  # relative to the iteration shape
    perm: tuple[int, ...]
    final: tuple[int, ...]  # relative to the permuted shape

    @property
    def permutes(self) -> bool:
        return self.perm != tuple(range(len(self.perm)))

    @property
    def moves_innermost(self) -> bool:
        """The source's innermost axis is not the output's innermost (stores need a tile)."""
        return self.perm[-1] != len(self.split) - 1

    def encode(self) -> list[int]:
        """This view in the `output_views` attribute (docs/abi.md)."""
        return [len(self.split), *self.split, *self.perm, len(self.final), *self.final]


def spec(src: Shape, dst: Shape) -> tuple[int, ...] | None:
    """`dst` in terms of `src`: fixed sizes, copies of a `src` dim (same symbolic name), and at
    most one REST. None when two dims of `dst` are neither."""
    out: list[int] = []
    for d in dst:
        if isinstance(d, int):
            out.append(d)
        elif d is not None and d in src:
            out.append(copy_of(list(src).index(d)))
        elif REST in out:
            return None
        else:
            out.append(REST)
    return tuple(out)


def _perm(graph: FusionGraph, i: int, rank: int) -> tuple[int, ...]:
    perm = graph.nodes[i].attrs.get("perm")
    return tuple(int(p) % rank for p in perm) if perm else tuple(reversed(range(rank)))  # type: ignore[union-attr]


def _shape(graph: FusionGraph, t: str) -> Shape:
    info = graph.tensors[t]
    assert info.shape is not None, t  # graph refuses layout nodes of unknown shape
    return info.shape


def view_of(graph: FusionGraph, members: frozenset[int] | set[int], tensor: str,
            iteration: Shape) -> View | str:
    """The view through which a group writes `tensor` (the output of a layout member), or why
    the chain leading to it cannot fold."""
    chain: list[int] = []
    t = tensor
    while (p := graph.producer.get(t)) is not None and p in members and graph.nodes[p].kind == ops.OpKind.INJECTIVE:
        chain.insert(0, p)
        t = graph.nodes[p].inputs[0]
    head = graph.nodes[chain[0]]
    p = graph.producer.get(t)
    if p is None or p not in members:
        return (f"{head.label} reads '{t}' from outside the group: a layout op folds only into the "
                f"output of the kernel that computes its input (views on inputs are not implemented)")
    if _shape(graph, t) != iteration:
        return (f"{head.label} reshapes '{t}' of shape {fmt(_shape(graph, t))}, not the group's "
                f"iteration shape {fmt(iteration)}")
    if not _shape(graph, tensor):
        return f"the layout chain to '{tensor}' ends in a scalar; nothing to fold"
    transposes = [i for i in chain if graph.nodes[i].op_type == "Transpose"]
    if len(transposes) > 1:
        return (f"{graph.nodes[transposes[1]].label} is a second Transpose after {graph.nodes[transposes[0]].label}: "
                f"a folded layout chain holds one")
    s1 = _shape(graph, graph.nodes[transposes[0]].inputs[0]) if transposes else _shape(graph, tensor)
    perm = _perm(graph, transposes[0], len(s1)) if transposes else tuple(range(len(s1)))
    t_shape = tuple(s1[p] for p in perm)
    split, final = spec(iteration, s1), spec(t_shape, _shape(graph, tensor))
    if split is None or final is None:
        bad = (iteration, s1) if split is None else (t_shape, _shape(graph, tensor))
        return (f"the layout chain to '{tensor}' reshapes {fmt(bad[0])} to {fmt(bad[1])}: more than "
                f"one size is not known relative to the input's dims")
    return View(tensor, t, tuple(chain), split, perm, final)


def group_views(graph: FusionGraph, members: frozenset[int], outputs: Sequence[str]) -> list[View | None]:
    """Each output's view in a legal group (None where the kernel writes it over the iteration
    space as is)."""
    shape = graph.iteration_shape(members)
    out: list[View | None] = []
    for t in outputs:
        v = view_of(graph, members, t, shape) if graph.nodes[graph.producer[t]].kind == ops.OpKind.INJECTIVE else None
        assert not isinstance(v, str), v  # candidates.legality checked every chain
        out.append(v)
    return out


def tile_key(vs: Sequence[View | None]) -> tuple | None:
    """(split, output-innermost axis) of the first view that moves the innermost axis: the
    kernel's one shared-memory tile serves the views that agree on both (schemes/elementwise/view_code.py)."""
    lead = next((v for v in vs if v is not None and v.moves_innermost), None)
    return None if lead is None else (lead.split, lead.perm[-1])


def tiled(vs: Sequence[View | None]) -> list[int]:
    """The outputs the tile serves: views that agree with tile_key (the others that move the
    innermost axis are stored element by element)."""
    key = tile_key(vs)
    return [k for k, v in enumerate(vs) if v is not None and key == (v.split, v.perm[-1])]


def encode_all(views: Sequence[View | None]) -> list[int]:
    """The `output_views` attribute: each output's view, or [0] for a plain output."""
    out: list[int] = []
    for v in views:
        out += v.encode() if v is not None else [0]
    return out


def describe(vs: Sequence[View | None]) -> list[dict]:
    """Each viewed output for the plan report: its permutation and how the kernel stores it
    ("vector" when the innermost axis stays, "tile" through the shared-memory tile, "element"
    for a moving view that does not share the tile's axes)."""
    in_tile = tiled(vs)
    return [{"output": v.tensor, "perm": list(v.perm),
             "stores": "tile" if k in in_tile else "element" if v.moves_innermost else "vector"}
            for k, v in enumerate(vs) if v is not None]


def onnx_shape(entries: Sequence[int]) -> list[int] | None:
    """A spec as an ONNX Reshape shape (0 copies the dim at the same position, allowzero=0),
    or None when a copy is from another position or a fixed size is 0."""
    out = []
    for j, e in enumerate(entries):
        if e == REST or e > 0:
            out.append(e)
        elif e <= -2 and -e - 2 == j:
            out.append(0)
        else:
            return None
    return out


def fallback_nodes(view: View) -> list[onnx.NodeProto]:
    """ONNX nodes computing `view.tensor` from `view.source` as the kernel does (for the fused
    node's function body, which cannot read the original chain's runtime shape tensors)."""
    nodes = []
    t = view.source
    for step, entries, perm in (("split", view.split, None), ("perm", None, view.perm), ("final", view.final, None)):
        if perm is not None and not view.permutes:
            continue
        out = view.tensor if step == "final" else f"{view.tensor}~{step}"
        if perm is not None:
            nodes.append(helper.make_node("Transpose", [t], [out], perm=list(perm)))
        else:
            shape = onnx_shape(entries)  # type: ignore[arg-type]
            assert shape is not None, view  # checked by foldable()
            nodes.append(helper.make_node("Constant", [], [out + "~shape"],
                                          value=numpy_helper.from_array(np.array(shape, np.int64))))
            nodes.append(helper.make_node("Reshape", [t, out + "~shape"], [out]))
        t = out
    return nodes


def foldable(view: View) -> str | None:
    """Why a derived view still cannot be written as a fused node's ONNX function (None if it can)."""
    for name, entries in (("reshape", view.split), ("reshape after the Transpose", view.final)):
        if onnx_shape(entries) is None:
            return (f"the layout chain to '{view.tensor}': its {name} moves a dynamic dim to another "
                    f"position or makes a dim of 0, which the fused node's ONNX function cannot state")
    return None
