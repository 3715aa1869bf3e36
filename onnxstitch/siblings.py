"""The merge stage: sibling MatMuls merged into one GEMM.

Transformers project one activation several times with constant weights: attention's Q, K and
V (BERT, LLaMA), a gated MLP's gate and up projections. Run apart, each projection is a GEMM
too small to fill an H100/H200 (BERT-base at 1024 tokens: 96 tiles of 64 × 128 for 132 SMs)
and its own launch. Merged, `MatMul(x, W1) … MatMul(x, Wk)` becomes `MatMul(x, [W1 | … | Wk])`
and one Slice per original output, its columns of the wider product: one GEMM with k times
the columns. A Slice costs nothing when it folds into the kernel that reads its output
(slices.py: the output is a box of the merged product; one Slice per sibling rather than a
Split lets each fold into its own kernel, whatever the others' shapes). So a sibling is merged
only when everything reading its product is stitchable elementwise or layout work; one whose
product feeds another GEMM or a row reduction directly is left alone (the Slice would copy).
The pipeline also undoes the merge of a sibling whose Slice the plan left to ONNX Runtime.

Values are unchanged up to the GEMM's summation order (cuBLAS may tile the wider product
differently); verification compares against the model as given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import edit, ops
from .shapes import TensorInfo, infer
from .weights import Weights

SUFFIX = "~merged"
# What may read a sibling's product for its Slice to fold into the reader's kernel (module docstring).
_STITCHABLE = frozenset({ops.OpKind.ELEMENTWISE, ops.OpKind.BROADCAST, ops.OpKind.INJECTIVE})


@dataclass(frozen=True)
class Merge:
    """One merged set: the activation the siblings share, their MatMul outputs in order (each
    now a Slice's output) and their column counts."""

    activation: str
    outputs: tuple[str, ...]
    sizes: tuple[int, ...]

    def slice_node(self, output: str) -> str:
        """The name of the Slice node that yields `output` from the merged product."""
        return f"{output}{SUFFIX}_slice"

    def describe(self) -> str:
        return (f"MatMuls of '{self.activation}' into {', '.join(self.outputs)} run as one GEMM of "
                f"{sum(self.sizes)} columns, sliced {list(self.sizes)}")


@dataclass(frozen=True)
class Merged:
    """The rewritten model (the input itself when nothing merged) and its tensor facts, the
    merges made, and the sibling sets seen but left as they were, with why."""

    model: onnx.ModelProto
    tensors: Mapping[str, TensorInfo]
    merges: tuple[Merge, ...] = ()
    refusals: tuple[str, ...] = ()


def merge(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo], skip: Collection[str] = (),
          weights: Weights | None = None) -> Merged:
    """Merge MatMuls of `model`'s main graph that multiply one activation by constant 2-D weights
    of one dtype (module docstring). `tensors` are the inferred facts of `model`; MatMuls whose
    output is in `skip` are left alone (the pipeline's undo). `weights`: the store holding the
    payloads of `model`'s stubs (weights.py), which also takes the concatenated weights."""
    index = edit.ModelIndex.of(model)
    g, constants, outputs = model.graph, index.constants, index.outputs
    siblings: dict[tuple[str, int], list[int]] = {}
    for i, n in enumerate(g.node):
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and n.input[1] in constants \
                and len(constants[n.input[1]].dims) == 2 and n.output[0] not in skip:
            siblings.setdefault((n.input[0], constants[n.input[1]].data_type), []).append(i)
    merges: list[tuple[Merge, list[int]]] = []
    refusals: list[str] = []
    for (activation, _), members in siblings.items():
        if len(members) < 2:
            continue
        kept = []
        for i in members:
            why = _reader_reason(g.node[i].output[0], index, outputs)
            if why:
                refusals.append(f"{g.node[i].name or g.node[i].output[0]} (MatMul of '{activation}'): {why}")
            else:
                kept.append(i)
        if len(kept) >= 2:
            sizes = tuple(int(constants[g.node[i].input[1]].dims[1]) for i in kept)
            merges.append((Merge(activation, tuple(g.node[i].output[0] for i in kept), sizes), kept))
    if not merges:
        return Merged(model, tensors, (), tuple(refusals))
    out = _rebuild(index, merges, weights if weights is not None else Weights())  # (an empty store is falsy)
    return Merged(out, infer(out)[1], tuple(m for m, _ in merges), tuple(refusals))


def _reader_reason(product: str, index: edit.ModelIndex, outputs: Collection[str]) -> str | None:
    """Why a sibling's product should stay its own GEMM's: something reads it (directly or
    through reshapes, which are judged by what they feed) that no stitched kernel can read a
    box for, or it is a graph output: the Slice would be a copy of its own. None when every
    reader is stitchable work."""
    if product in outputs:
        return "its product is a graph output (the Slice would copy it)"
    for n in index.readers_of(product):
        spec = ops.TABLE.get(n.op_type) if n.domain in ("", "ai.onnx") else None
        if spec is None or spec.kind not in _STITCHABLE:
            return f"{n.op_type} {n.name or n.output[0]} reads its product (the Slice would copy it)"
        if n.op_type in ops.RESHAPES:
            # A reshape costs nothing; what it feeds decides.
            why = _reader_reason(n.output[0], index, outputs)
            if why:
                return why
    return None


def _rebuild(index: edit.ModelIndex, merges: list[tuple[Merge, list[int]]], weights: Weights) -> onnx.ModelProto:
    """The model with each merged set's MatMuls replaced, where the first of them stood, by one
    MatMul over the concatenated weights and a Slice of its columns per original output."""
    nodes, constants = index.nodes, index.constants
    replace: dict[int, list[onnx.NodeProto]] = {}
    params: list[onnx.TensorProto] = []
    # One wide weight per distinct list of weights: layers sharing their weights (ALBERT, and
    # TorchScript's aliases of equal initializers once simplify reads them as one) share it too.
    joined: dict[tuple[str, ...], str] = {}
    for merged, members in merges:
        first = nodes[members[0]]
        product = f"{first.output[0]}{SUFFIX}"
        key = tuple(nodes[i].input[1] for i in members)
        w = joined.get(key, "")
        if not w:
            w = f"{key[0]}{SUFFIX}"
            if w in joined.values():  # another list that starts with the same weight
                w = f"{w}{len(joined)}"
            joined[key] = w
            # Joined lazily: the store makes the wide weight only where it is read (weights.py).
            params.append(weights.concat([constants[t] for t in key], 1, w))
        made = [helper.make_node("MatMul", [merged.activation, w], [product], name=f"{first.name or product}{SUFFIX}")]
        start = 0
        for out, size in zip(merged.outputs, merged.sizes):
            node, consts = _slice(product, out, merged.slice_node(out), start, start + size, index.opset)
            made.append(node)
            params += consts
            start += size
        replace |= {i: [] for i in members}
        replace[members[0]] = made
    # The old products' value_info stays valid (the Slices yield the same tensors).
    return edit.spliced(index, replace, initializers=params)


def _slice(product: str, out: str, name: str, start: int, stop: int,
           opset: int) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """Columns [start, stop) of the merged product's last axis; before opset 10 the bounds are
    attributes."""
    if opset < 10:
        return helper.make_node("Slice", [product], [out], name=name, starts=[start], ends=[stop], axes=[-1]), []
    consts = [numpy_helper.from_array(np.array([v], np.int64), f"{name}_{what}")
              for what, v in (("starts", start), ("ends", stop), ("axes", -1))]
    return helper.make_node("Slice", [product, *(c.name for c in consts)], [out], name=name), consts
