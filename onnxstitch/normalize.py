"""The normalize stage: rewrites that put known decompositions into shapes the planner can stitch. Each
keeps the model's values: the same ops run on the same elements, only shapes are relabelled.

Group normalization. Exporters write GroupNorm as Reshape(x [N, C, *S] → [N, G, -1]) →
InstanceNormalization → Reshape(back to x's shape) → Mul(γ [C, 1, …]) → Add(β) (torch.onnx,
both exporters), and ONNX's GroupNormalization-21 is the same computation. There
the affine part lives in another shape than the normalization, and the Reshape between them is
a layout op no row kernel writes through. Rewritten, the work runs in [N, G, C/G, prod(S)]:
the InstanceNormalization reduces axes 2 and 3 (the same elements as before), γ and β become
[G, C/G, 1] constants, and the Reshape back to x's shape sinks below the elementwise ops that
follow (SiLU), which are computed in the 4-D space too. ONNX Runtime runs a Reshape without
copying, so the stitched group reads x once and writes its result once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import edit, ops
from .edit import implicit_inputs
from .graph import node_attrs
from .shapes import Shape, TensorInfo, infer

SUFFIX = "~gn"  # names of tensors in the group-norm space


@dataclass(frozen=True)
class Normalized:
    """The rewritten model (the input itself when nothing applied) and its inferred tensor
    facts, one line per rewrite, and the patterns seen but left as they were, with why."""

    model: onnx.ModelProto
    tensors: Mapping[str, TensorInfo]
    rewrites: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()


@dataclass
class _Space:
    """One group norm's [N, G, C/G, P] space: its input x's shape, the group count, and the
    tensor holding x's shape (what the Reshape back to x's space takes)."""

    shape: Shape
    groups: int
    shape_tensor: str

    @property
    def channels(self) -> int:
        return int(self.shape[1])  # type: ignore[arg-type]


@dataclass
class _Rewrite:
    """Work collected before the node list is rebuilt."""

    replace: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # node → its replacement
    twin: dict[str, str] = field(default_factory=dict)  # tensor in x's space → its 4-D twin
    space: dict[str, _Space] = field(default_factory=dict)  # twin → its space
    constants: dict[str, onnx.TensorProto] = field(default_factory=dict)
    # Where the Reshape back to x's space of a twin goes (after the node that made it, or
    # where the original Reshape was), for tensors something outside the space still reads.
    anchor: dict[str, int] = field(default_factory=dict)


def normalize(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo]) -> Normalized:
    """Rewrite every group normalization of `model`'s main graph into its stitchable form
    (module docstring); `tensors` are the inferred tensor facts of `model`, inferred again for
    a rewritten model."""
    index = edit.ModelIndex.of(model)
    work, done, refused = _Rewrite(), [], []
    for i, n in enumerate(index.nodes):
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type == "InstanceNormalization":
            why = _decomposed(i, index, tensors, work)
        elif n.op_type == "GroupNormalization":
            why = _native(i, n, tensors, index.constants, work)
        else:
            continue
        if why is None:
            done.append(f"group norm at {n.name or n.op_type} ({n.op_type}) runs in [N, G, C/G, P]")
        elif why:
            refused.append(f"{n.name or n.op_type} ({n.op_type}): {why}")
    if not work.replace:
        return Normalized(model, tensors, (), tuple(refused))
    _sink(index, tensors, work)
    out = _rebuild(index, work)
    return Normalized(out, infer(out)[1], tuple(done), tuple(refused))


def _shape_values(t: str, constants: Mapping[str, onnx.TensorProto]) -> list[int] | None:
    return [int(v) for v in numpy_helper.to_array(constants[t]).reshape(-1)] if t in constants else None


def _group_reason(x: Shape | None, groups: int) -> str | None:
    if x is None or len(x) < 3:
        return "its input is not of known rank >= 3"
    if not isinstance(x[1], int) or x[1] <= 0:
        return "its channel count is not fixed in the model"
    if groups <= 0 or x[1] % groups:
        return f"{x[1]} channels do not split into {groups} groups"
    return None


def _decomposed(i: int, index: edit.ModelIndex, tensors: Mapping[str, TensorInfo], work: _Rewrite) -> str | None:
    """Reshape → InstanceNormalization → Reshape back, as exporters write GroupNorm. Returns
    None when rewritten, "" when this InstanceNormalization is not such a pattern, else why."""
    nodes, producer, consumers, constants = index.nodes, index.producer, index.readers, index.constants
    norm = nodes[i]
    r1_out = norm.input[0]
    if r1_out not in producer or nodes[producer[r1_out]].op_type != "Reshape":
        return ""
    r1 = nodes[producer[r1_out]]
    after = consumers.get(norm.output[0], [])
    if len(after) != 1 or nodes[after[0]].op_type != "Reshape" or norm.output[0] in index.outputs:
        return ""
    r2 = nodes[after[0]]
    x, y = r1.input[0], r2.output[0]
    xs = tensors[x].shape if x in tensors else None
    mid = tensors[r1_out].shape if r1_out in tensors else None
    if mid is None or len(mid) != 3 or not isinstance(mid[1], int):
        return "the normalized tensor is not [N, G, L] with a fixed G"
    why = _group_reason(xs, mid[1])
    if why:
        return why
    assert xs is not None
    groups = int(mid[1])
    back = tensors[y].shape if y in tensors else None
    made_by = nodes[producer[r2.input[1]]] if r2.input[1] in producer else None
    shape_of_x = made_by is not None and made_by.op_type == "Shape" and made_by.input[0] == x and not made_by.attribute
    if tuple(back or ()) != tuple(xs) and not shape_of_x:
        return "the Reshape after it does not restore its input's shape"
    target = _shape_values(r1.input[1], constants)
    lead_ok = target is not None and len(target) == 3 and target[0] in (0, xs[0]) and target[1] == groups
    if not (lead_ok and (target[2] == -1 or (all(isinstance(d, int) for d in xs) and  # type: ignore[index]
                                            target[2] * groups == math.prod(xs[1:])))):  # type: ignore[index,arg-type]
        return "the Reshape before it is not to [N, G, -1]"
    if len(consumers.get(r1_out, [])) != 1 or r1_out in index.outputs:
        return "the grouped input has other readers"
    space = _Space(tuple(xs), groups, r2.input[1])
    shape4 = f"{r1_out}{SUFFIX}_shape"
    work.constants[shape4] = numpy_helper.from_array(np.array([0, groups, xs[1] // groups, -1], np.int64), shape4)
    grouped, normed = f"{r1_out}{SUFFIX}", f"{norm.output[0]}{SUFFIX}"
    work.replace[producer[r1_out]] = [_node("Reshape", [x, shape4], [grouped], r1.name)]
    copy = onnx.NodeProto()
    copy.CopyFrom(norm)
    copy.input[0], copy.output[0] = grouped, normed
    work.replace[i] = [copy]
    work.replace[after[0]] = []  # re-added where y is read outside the space (_rebuild)
    work.twin[y] = normed
    work.space[normed] = space
    work.anchor[normed] = after[0]
    return None


def _native(i: int, n: onnx.NodeProto, tensors: Mapping[str, TensorInfo], constants, work: _Rewrite) -> str | None:
    """ONNX GroupNormalization-21: scale and bias per channel, constant or computed (then
    reshaped by a Reshape node, which ONNX Runtime runs as a view). Opsets 18–20 had them per
    group; onnx.checker rejects those models, so they never get here."""
    attrs = node_attrs(n)
    groups = int(attrs.get("num_groups", 0))  # type: ignore[call-overload]
    x, out = n.input[0], n.output[0]
    xs = tensors[x].shape if x in tensors else None
    why = _group_reason(xs, groups)
    if why:
        return why
    assert xs is not None
    c = int(xs[1])  # type: ignore[arg-type]
    sizes = [TensorInfo(t, 0, tensors[t].shape).numel() if t in tensors and tensors[t].is_static() else None
             for t in n.input[1:3]]
    if sizes != [c, c]:
        return f"scale/bias of {sizes[0]}/{sizes[1]} values for {c} channels"
    view = (groups, c // groups, 1)
    names = {k: f"{out}{SUFFIX}_{k}" for k in ("shape4", "view", "ones", "zeros", "in", "norm", "scaled", "xshape")}
    dt = helper.tensor_dtype_to_np_dtype(tensors[x].dtype)
    for k, v in (("shape4", np.array([0, groups, c // groups, -1], np.int64)), ("view", np.array(view, np.int64)),
                 ("ones", np.ones(groups, dt)), ("zeros", np.zeros(groups, dt))):
        work.constants[names[k]] = numpy_helper.from_array(v, names[k])
    base = n.name or out  # node names must stay unique (ORT refuses a model with two alike)
    params, reshapes = [], []
    for role, t in zip(("scale", "bias"), n.input[1:3]):
        name = f"{out}{SUFFIX}_{role}"
        if t in constants:
            work.constants[name] = numpy_helper.from_array(numpy_helper.to_array(constants[t]).reshape(view), name)
        else:
            reshapes.append(_node("Reshape", [t, names["view"]], [name], f"{base}~{role}_view"))
        params.append(name)
    twin = f"{out}{SUFFIX}"
    norm = _node("InstanceNormalization", [names["in"], names["ones"], names["zeros"]], [names["norm"]], base)
    norm.attribute.append(helper.make_attribute("epsilon", float(attrs.get("epsilon", 1e-5))))  # type: ignore[arg-type]
    work.replace[i] = [_node("Shape", [x], [names["xshape"]], f"{base}~shape"), *reshapes,
                       _node("Reshape", [x, names["shape4"]], [names["in"]], f"{base}~group"), norm,
                       _node("Mul", [names["norm"], params[0]], [names["scaled"]], f"{base}~scale"),
                       _node("Add", [names["scaled"], params[1]], [twin], f"{base}~bias")]
    work.twin[out] = twin
    work.space[twin] = _Space(tuple(xs), groups, names["xshape"])
    work.anchor[twin] = i
    return None


def _node(op: str, inputs: list[str], outputs: list[str], name: str) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=name)


def _sink(index: edit.ModelIndex, tensors: Mapping[str, TensorInfo], work: _Rewrite) -> None:
    """Move each space's Reshape back below the elementwise ops that read it: such an op is
    computed in the 4-D space when its other inputs are constants that map there, or tensors
    whose dims are all 1 (the same broadcast in either space)."""
    for i, n in enumerate(index.nodes):
        if i in work.replace or not any(t in work.twin for t in n.input):
            continue
        spaces = {id(work.space[work.twin[t]]) for t in n.input if t in work.twin}
        space = work.space[work.twin[next(t for t in n.input if t in work.twin)]]
        spec = ops.spec(n.op_type, n.domain)
        outs = [t for t in n.output if t]
        if len(spaces) != 1 or spec.kind not in (ops.OpKind.ELEMENTWISE, ops.OpKind.BROADCAST) or \
                n.op_type in ops.SHAPE_INPUTS or len(outs) != 1 or implicit_inputs(n):
            continue
        # Only ops that keep x's shape (a wider broadcast would leave the space).
        if outs[0] not in tensors or tuple(tensors[outs[0]].shape or ()) != tuple(space.shape):
            continue
        mapped = [_map_input(t, space, tensors, index.constants, work) for t in n.input]
        if any(m is None for m in mapped):
            continue
        twin = f"{outs[0]}{SUFFIX}"
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        del copy.input[:]
        copy.input.extend(mapped)  # type: ignore[arg-type]
        copy.output[0] = twin
        work.replace[i] = [copy]
        work.twin[outs[0]] = twin
        work.space[twin] = space
        work.anchor[twin] = i


def _map_input(t: str, space: _Space, tensors: Mapping[str, TensorInfo], constants, work: _Rewrite) -> str | None:
    """The name an input of a sunk op takes in the 4-D space, or None when it has none there."""
    if not t or t in work.twin:
        return work.twin.get(t, t)
    shape = tensors[t].shape if t in tensors else None
    if t not in constants:
        # All-ones dims broadcast the same way in both spaces (up to rank 4).
        return t if shape is not None and len(shape) <= 4 and all(d == 1 for d in shape) else None
    value = numpy_helper.to_array(constants[t])
    rank = len(space.shape)
    if value.ndim > rank:
        return None
    dims = (1,) * (rank - value.ndim) + value.shape
    c, g, spatial = space.channels, space.groups, tuple(space.shape[2:])
    if dims[0] != 1 or dims[1] not in (1, c) or not (all(d == 1 for d in dims[2:]) or dims[2:] == spatial):
        return None
    p = math.prod(dims[2:])
    view = ((g, c // g) if dims[1] == c else (1, 1)) + (p,)
    name = f"{t}{SUFFIX}{g}"
    work.constants.setdefault(name, numpy_helper.from_array(value.reshape(view), name))
    return name


def _rebuild(index: edit.ModelIndex, work: _Rewrite) -> onnx.ModelProto:
    """The model with replacements in place and a Reshape back to x's space for every twin that
    something outside the space reads (or that is a graph output), right after its anchor.
    Constants only the replaced nodes read (the old shape, γ and β) go with them."""
    replaced = set(work.replace)
    back: dict[int, list[onnx.NodeProto]] = {}
    for t, twin in work.twin.items():
        readers = [j for j in index.readers.get(t, ()) if j not in replaced or not _reads(work.replace[j], twin)]
        if readers or t in index.outputs:
            node = _node("Reshape", [twin, work.space[twin].shape_tensor], [t], f"{t}{SUFFIX}_back")
            back.setdefault(work.anchor[twin], []).append(node)
    return edit.spliced(index, work.replace, after=back, initializers=work.constants.values())


def _reads(nodes: list[onnx.NodeProto], t: str) -> bool:
    return any(t in n.input for n in nodes)
