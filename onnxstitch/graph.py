"""The graph view every planning stage works on: nodes with their op kind and fusibility,
tensors with dtype and shape, producer/consumer maps. Built once from the inferred model;
protobuf stays at the edges (load and rewrite).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from . import load, ops
from .edit import implicit_inputs, reader_map
from .folds import channel_params, concats, slices
from .shapes import Shape, TensorInfo, broadcast_shapes

# Kernel ABI limits (docs/abi.md).
MAX_INPUTS = 32
MAX_OUTPUTS = 16
MAX_RANK = 8


@dataclass(frozen=True)
class Node:
    """One ONNX node as the planner sees it."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # "" marks an omitted optional input; subgraph reads are appended
    outputs: tuple[str, ...]
    attrs: Mapping[str, object]
    kind: ops.OpKind
    reason: str | None  # why it cannot join a fused group; None when it can
    # What it reads besides `inputs`: shapes and axes. No kernel reads them (a fused group takes
    # layouts from the inferred shapes), so `succs`/`preds` leave them out; but a node that ONNX
    # Runtime runs still waits for them: a Reshape of a LayerNorm's scale to Shape(x)[-1:] runs
    # after x (PP-OCRv3's recognizer). The plan's cycle check follows them (plan.contract).
    after: tuple[str, ...] = ()

    @property
    def fusible(self) -> bool:
        return self.reason is None

    @property
    def label(self) -> str:
        return f"{self.name or self.op_type + '#' + str(self.index)} ({self.op_type})"


@dataclass(frozen=True)
class FusionGraph:
    """Nodes in topological order plus tensor facts. Node ids are indices into `nodes`."""

    nodes: tuple[Node, ...]
    tensors: Mapping[str, TensorInfo]
    graph_inputs: frozenset[str]
    graph_outputs: frozenset[str]
    # Initializers that are not graph inputs: their values are fixed.
    constants: Mapping[str, onnx.TensorProto]
    dim_values: Mapping[str, int] = field(default_factory=dict)
    opset: int = 17  # the model's ai.onnx opset (row ops' default axes depend on it)
    # Whether the target GPUs have thread-block clusters (an sm_90+ arch among the targets):
    # then few long rows are split across blocks (rows.split_geometry).
    clusters: bool = True
    # Outputs of foldable Slice/Split nodes: the box of their input each one is (slices.py).
    boxes: Mapping[str, slices.Box] = field(default_factory=dict)

    @cached_property
    def producer(self) -> dict[str, int]:
        return {t: n.index for n in self.nodes for t in n.outputs if t}

    @cached_property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {}
        for n in self.nodes:
            for t in dict.fromkeys(n.inputs):
                if t:
                    out.setdefault(t, []).append(n.index)
        return {t: tuple(v) for t, v in out.items()}

    def only_reader(self, tensor: str) -> int | None:
        """The node reading `tensor` when it is the only one and the tensor is no graph output."""
        readers = self.consumers.get(tensor, ())
        return readers[0] if len(readers) == 1 and tensor not in self.graph_outputs else None

    @cached_property
    def succs(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(c for t in n.outputs for c in self.consumers.get(t, ())) for n in self.nodes)

    @cached_property
    def preds(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(self.producer[t] for t in n.inputs if t in self.producer) for n in self.nodes)

    @cached_property
    def axes_constants(self) -> frozenset[str]:
        """Constants read only as reductions' axes: compiled into the kernel, never loaded."""
        def reduces(n: Node) -> bool:
            return n.kind == ops.OpKind.REDUCE and n.op_type.startswith("Reduce")

        as_axes = {t for n in self.nodes if reduces(n) for t in n.inputs[1:2] if t in self.constants}
        as_data = {t for n in self.nodes for k, t in enumerate(n.inputs) if not (reduces(n) and k == 1)}
        return frozenset(as_axes - as_data)

    def is_baked(self, tensor: str) -> bool:
        """A fixed value the kernel carries instead of reading it: a scalar (as a literal) or a
        reduction's axes (as the row's shape)."""
        c = self.constants.get(tensor)
        if c is None:
            return False
        if tensor in self.axes_constants:
            return True
        n = 1
        for d in c.dims:
            n *= d
        return n == 1

    def boundary(self, group: frozenset[int] | set[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(inputs, outputs) of a node set: tensors read from outside (baked scalars excluded)
        and tensors used outside or leaving the graph, each in first-use order. A member
        Slice/Split contributes its outputs read inside as inputs: the kernel reads them as
        boxes of the node's input (slices.py), which is not an input itself."""
        ins: dict[str, None] = {}
        outs: dict[str, None] = {}
        for i in sorted(group):
            n = self.nodes[i]
            if n.kind == ops.OpKind.SLICE:
                ins.update((t, None) for t in n.outputs if t and any(c in group for c in self.consumers.get(t, ())))
            for t in () if n.kind == ops.OpKind.SLICE else n.inputs:
                if t and self.producer.get(t) not in group and not self.is_baked(t):
                    ins[t] = None
            for t in n.outputs:
                if t and (t in self.graph_outputs or any(c not in group for c in self.consumers.get(t, ()))):
                    outs[t] = None
        return tuple(ins), tuple(outs)

    def node_space(self, i: int) -> list[Shape | None]:
        """The shapes node `i` iterates over: its outputs', or for a reduction its data input's
        (its output is row-shaped, with or without the reduced dims)."""
        n = self.nodes[i]
        if n.kind == ops.OpKind.INJECTIVE:
            return []  # a layout tail: its source, a group member's output, has the group's shape
        names = n.inputs[:1] if n.kind == ops.OpKind.REDUCE else n.outputs
        return [self.tensors[t].shape if t in self.tensors else None for t in names if t]

    def iteration_shape(self, group: frozenset[int] | set[int], ins: Sequence[str] | None = None) -> Shape | None:
        """Broadcast of every node's space in the group (None if not provable); members that
        compute in a Concat's window count at the Concat's size along its axis (concats.py).
        `ins`: the group's boundary inputs, when the caller has them."""
        lifted: Mapping[int, int] = {}
        lay = None
        if any(self.nodes[i].kind == ops.OpKind.CONCAT for i in group):
            lay = concats.layout(self, frozenset(group), self.boundary(group)[0] if ins is None else ins)
            if isinstance(lay, concats.Layout):  # with the Slices whose boxes a window reads
                lifted = {**lay.node_window, **{self.producer[t]: k for t, k in lay.input_window.items()
                                                if self.producer.get(t) in group}}
        return broadcast_shapes([lay.lift(s) if i in lifted else s  # type: ignore[union-attr]
                                 for i in group for s in self.node_space(i)])

    def shape(self, tensor: str) -> Shape | None:
        """A tensor's inferred shape; None when it or its rank is unknown."""
        info = self.tensors.get(tensor)
        return None if info is None else info.shape

    def tensor_bytes(self, tensor: str) -> int:
        """Bytes of a tensor for the cost model (symbolic dims at their planning values)."""
        info = self.tensors.get(tensor)
        nb = info.nbytes(self.dim_values) if info is not None else None
        return nb if nb is not None else 0


def node_attrs(node: onnx.NodeProto) -> dict[str, object]:
    """A node's attributes by name as Python values (strings decoded)."""
    out: dict[str, object] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def row_axes(n: onnx.NodeProto | Node, attrs: Mapping[str, object], constants: Mapping[str, onnx.TensorProto],
             opset: int, rank: int) -> list[int] | None:
    """The axes a row op (REDUCE kind) works on, normalized to 0..rank-1 and sorted; None when
    they are not constant. Empty Reduce* axes mean every axis (noop_with_empty_axes aside)."""
    inputs = n.inputs if isinstance(n, Node) else n.input
    if n.op_type in ("Softmax", "LogSoftmax"):
        axis = int(attrs.get("axis", -1 if opset >= 13 else 1)) % rank  # type: ignore[arg-type]
        # Before opset 13 the input is coerced to 2-D at `axis`: every axis from there on.
        return [axis] if opset >= 13 else list(range(axis, rank))
    if n.op_type == "LayerNormalization":
        return list(range(int(attrs.get("axis", -1)) % rank, rank))  # type: ignore[arg-type]
    if n.op_type == "InstanceNormalization" or n.op_type in ops.GLOBAL_POOLS:
        return list(range(2, rank))  # every spatial axis
    if n.op_type in ops.ARG_REDUCERS:
        return [int(attrs.get("axis", 0)) % rank]  # type: ignore[arg-type]
    if "axes" in attrs:
        axes = [int(a) for a in attrs["axes"]]  # type: ignore[union-attr]
    elif len(inputs) > 1 and inputs[1]:
        if inputs[1] not in constants:
            return None
        axes = [int(a) for a in numpy_helper.to_array(constants[inputs[1]]).reshape(-1)]
    else:
        axes = []
    return sorted({a % rank for a in axes}) if axes else list(range(rank))


def row_run(graph: "FusionGraph", i: int) -> tuple[int, int]:
    """[start, stop) of the axes REDUCE-kind node `i` reduces (its row is their product):
    stop is the rank for a row over trailing axes, less for a column reduction; only
    meaningful for nodes `_row_reason` accepted."""
    n = graph.nodes[i]
    rank = len(graph.tensors[n.inputs[0]].shape or ())
    axes = row_axes(n, n.attrs, graph.constants, graph.opset, rank) or []
    return (axes[0], axes[-1] + 1) if axes else (rank, rank)


def reduced_shape(shape: Shape, start: int, stop: int, keepdims: bool) -> Shape:
    """`shape` with the axes [start, stop) reduced: kept as 1s, or dropped."""
    return tuple(shape[:start]) + ((1,) * (stop - start) if keepdims else ()) + tuple(shape[stop:])


def _row_reason(n: onnx.NodeProto, tensors: Mapping[str, TensorInfo], attrs: Mapping[str, object],
                constants: Mapping[str, onnx.TensorProto], opset: int) -> str | None:
    """Why a REDUCE-kind node cannot be stitched: its axes must be one run of consecutive axes
    (the row: trailing, or followed by other axes for a column reduction); keepdims either
    way; no extra outputs."""
    shape = tensors[n.input[0]].shape or ()
    if not shape:
        return f"{n.op_type} of a scalar"
    axes = row_axes(n, attrs, constants, opset, len(shape))
    if axes is None:
        return f"{n.op_type}'s axes are not constant"
    if n.op_type.startswith("Reduce") and attrs.get("noop_with_empty_axes", 0) and "axes" not in attrs and \
            (len(n.input) < 2 or not n.input[1] or numpy_helper.to_array(constants[n.input[1]]).size == 0):
        return f"{n.op_type} with noop_with_empty_axes=1 and no axes is an identity"
    if not axes or axes != list(range(axes[0], axes[0] + len(axes))):
        return (f"{n.op_type} over axes {axes} of a rank-{len(shape)} tensor: only one run of consecutive "
                f"axes is stitched")
    keep = attrs.get("keepdims", 1) if n.op_type.startswith(("Reduce", "Arg")) else 1
    expected = reduced_shape(tuple(shape), axes[0], axes[-1] + 1, bool(keep))
    if n.op_type in ops.ROW_COMPOSITES and not n.op_type.startswith("Reduce"):
        expected = tuple(shape)
    if n.op_type == "InstanceNormalization" and len(shape) < 3:
        return "InstanceNormalization needs an input of rank >= 3"
    got = tensors[n.output[0]].shape if n.output[0] in tensors else None
    if got is not None and tuple(got) != expected and not (0 in shape and tuple(got) == tuple(shape)):
        return (f"the inferred shape {list(got)} of '{n.output[0]}' is not the reduction's {list(expected)} "
                f"(shape inference disagrees; left to ONNX Runtime)")
    if n.op_type == "LayerNormalization" and any(t for t in n.output[1:]):
        return "LayerNormalization's Mean/InvStdDev outputs are not stitched"
    return None


def _node_reason(n: onnx.NodeProto, tensors: Mapping[str, TensorInfo], attrs: Mapping[str, object],
                 constants: Mapping[str, onnx.TensorProto] | None = None, opset: int = 17) -> str | None:
    def dtype(t: str) -> int | None:
        info = tensors.get(t)
        return info.dtype if info is not None else None

    in_dt = [dtype(t) if t else 0 for t in n.input]
    # Omitted optional inputs (Clip's min/max) carry no dtype.
    reason = ops.unsupported_reason(n.op_type, n.domain, [d for d, t in zip(in_dt, n.input) if t],
                                    [dtype(t) for t in n.output])
    if reason:
        return reason
    for t in list(ops.data_inputs(n.op_type, n.domain, n.input)) + list(n.output):
        if not t:
            continue
        info = tensors.get(t)
        if info is None or info.shape is None:
            return f"shape of '{t}' is unknown"
        if len(info.shape) > MAX_RANK:
            return f"rank of '{t}' exceeds {MAX_RANK}"
    if n.op_type == "Cast" and attrs.get("saturate", 1) != 1:
        return "Cast with saturate=0 is not supported"
    if n.op_type == "Mod" and not attrs.get("fmod", 0) and in_dt and in_dt[0] in ops.FLOATS:
        # Opset 28 gave floating-point Mod a floor-division form the kernels do not implement.
        return "Mod of floating-point values with fmod=0 (floor modulo) is not stitched"
    if ops.spec(n.op_type, n.domain).kind == ops.OpKind.REDUCE:
        return _row_reason(n, tensors, attrs, constants or {}, opset)
    return None


# ai.onnx opsets whose elementwise semantics the op table follows (Clip's attributes before 11
# are handled). Outside this range the model is left unchanged, with a warning.
MIN_OPSET, MAX_OPSET = 7, load.LATEST_OPSET


def opset_refusal(model: onnx.ModelProto) -> str | None:
    """Why no node of `model` may be fused because of its ai.onnx opset (None if it may)."""
    version = load.ai_onnx_opset(model)
    if not MIN_OPSET <= version <= MAX_OPSET:
        return f"ai.onnx opset {version} is outside the supported range {MIN_OPSET}–{MAX_OPSET}"
    return None


# Row reductions can be left to ONNX Runtime (optimize --no-reductions).
REDUCTIONS_OFF = "row reductions are turned off (--no-reductions)"


def build(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo],
          dim_values: Mapping[str, int] | None = None, reductions: bool = True, clusters: bool = True) -> FusionGraph:
    """The FusionGraph of an (inferred) model's main graph. Every node is refused fusion when
    the model's opset is outside the supported range; REDUCE-kind nodes unless `reductions`.
    `clusters`: the target GPUs have thread-block clusters (sm_90 on)."""
    g = model.graph
    refusal = opset_refusal(model)
    opset = load.ai_onnx_opset(model)
    input_names = frozenset(i.name for i in g.input)
    constants = {i.name: i for i in g.initializer if i.name not in input_names}
    infos = dict(tensors)
    nodes = []
    boxes: dict[str, slices.Box] = {}
    for idx, n in enumerate(g.node):
        attrs = node_attrs(n)
        implicit = tuple(t for t in implicit_inputs(n) if t not in n.input)
        kind = ops.spec(n.op_type, n.domain).kind
        off = REDUCTIONS_OFF if kind == ops.OpKind.REDUCE and not reductions else None
        inputs, reason = tuple(n.input), refusal or off or _node_reason(n, tensors, attrs, constants, opset)
        if kind == ops.OpKind.SLICE and reason is None:
            cut = slices.boxes(n, attrs, tensors, constants)
            if isinstance(cut, str):
                reason = cut
            else:
                boxes.update((b.tensor, b) for b in cut)
        if kind == ops.OpKind.CONCAT and reason is None:
            reason = concats.node_reason(n, attrs, tensors)
        if n.op_type in channel_params.OPS and n.domain in ("", "ai.onnx") and reason is None:
            folded = channel_params.fold(n, attrs, tensors, constants)
            reason = folded.reason
            if folded.constants:
                inputs = folded.inputs
                for name, c in folded.constants.items():
                    constants[name] = c
                    infos[name] = TensorInfo(name, c.data_type, tuple(c.dims))
        # Shape/axes inputs are not data: the kernel takes layouts and broadcasts from the
        # inferred shapes (views.py, broadcast strides) and reads none of them.
        inputs = tuple(ops.data_inputs(n.op_type, n.domain, inputs))
        after = tuple(t for t in dict.fromkeys(n.input) if t and t not in inputs)
        nodes.append(Node(idx, n.name, n.op_type, n.domain, inputs + implicit, tuple(n.output), attrs, kind, reason,
                          after))
    left = ort_keeps(g, infos)
    nodes = [dataclasses.replace(n, reason=left[n.index]) if n.index in left and n.reason is None else n for n in nodes]
    return FusionGraph(tuple(nodes), infos, input_names, frozenset(o.name for o in g.output),
                       constants, dict(dim_values or {}), opset, clusters, boxes)


DEAD = "its results reach no graph output (dead code; ONNX Runtime removes it)"
SHAPES_ONLY = "its results are read only as shapes or axes, which the plan does not follow"


def ort_keeps(g: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> dict[int, str]:
    """Nodes that are ONNX Runtime's to handle, by index, with why: dead code and what only
    shapes read, shape arithmetic it keeps on the CPU, work on constants it folds, and what it
    merges into a Conv. The first reason found is kept."""
    constant = constant_nodes(g)
    found: dict[int, str] = {}
    for reasons in (_unread(g), {k: CPU_PLACED for k in cpu_placed(g, tensors)},
                    {k: CONSTANT_FOLDED for k in constant_folded(g, constant)}, conv_epilogues(g, tensors, constant)):
        for k, why in reasons.items():
            found.setdefault(k, why)
    return found


CPU_PLACED = "shape arithmetic on values ONNX Runtime keeps on the CPU (it would place a fused kernel there too)"
# ONNX Runtime's CUDA EP runs a node on the CPU when every input is a CPU tensor (an output of
# Shape or Size, or of such a node), a graph input or an initializer of at most this many elements.
SMALL_INITIALIZER = 100
# Inputs the CUDA EP's kernels read from host memory (shapes, sizes, axes), besides those of
# ops.SHAPE_INPUTS: a CPU tensor there does not move the node to the CPU.
_HOST_INPUTS: dict[str, Sequence[int]] = {
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "Tile": (1,), "Pad": (1, 2, 3), "Resize": (1, 2, 3),
    "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "Trilu": (1,), "CumSum": (1,),
    **{r: (1,) for r in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")}}


def cpu_placed(g: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> set[int]:
    """Indices of the nodes ONNX Runtime's CUDA EP places on the CPU as shape computation
    (its GetCpuPreferredNodes): consumers of CPU tensors all of whose data inputs are CPU
    tensors, graph inputs or small initializers, none half precision. A fused node made of
    them would be placed there too, where the library has no kernel, and the session fails."""
    inits = {i.name: i for i in g.initializer}
    graph_inputs = {i.name for i in g.input}
    cpu: set[str] = set()
    placed: set[int] = set()
    half = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    constant_outputs = {t for n in g.node if n.op_type == "Constant" for t in n.output}

    def small_or_cpu(t: str) -> bool:
        info = tensors.get(t)
        if info is not None and info.dtype in half:
            return False
        if t in inits and t not in graph_inputs:
            return int(np.prod(inits[t].dims)) <= SMALL_INITIALIZER
        if t in constant_outputs:  # ORT loads Constant nodes as initializers
            return info is not None and (info.numel() or 0) <= SMALL_INITIALIZER
        return t in cpu or t in graph_inputs

    for idx, n in enumerate(g.node):
        if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx"):
            cpu.update(n.output)
            continue
        on_host = _HOST_INPUTS.get(n.op_type, range(1, len(n.input)) if n.op_type in ops.SHAPE_INPUTS else ())
        data = [t for k, t in enumerate(n.input) if t and k not in on_host]
        shape_inputs = [t for k, t in enumerate(n.input) if t and k in on_host]
        if not any(t in cpu for t in data) or any(t in cpu for t in shape_inputs):
            continue  # not a consumer of a CPU tensor, or its kernel reads that tensor on the CPU
        if all(small_or_cpu(t) for t in data + shape_inputs):
            placed.add(idx)
            cpu.update(n.output)
    return placed


CONSTANT_FOLDED = "computed from constants alone: ONNX Runtime folds it once, when the session starts"
# Views and broadcasts: of a constant, they cost the kernel that reads them nothing.
_FREE_ON_CONSTANTS = ops.SHAPE_INPUTS
# Ops whose value is not a function of their inputs: never constant.
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"}


def constant_nodes(g: onnx.GraphProto) -> set[int]:
    """Indices of the nodes computed from initializers (no graph inputs) alone."""
    inputs = {i.name for i in g.input}
    known = {t.name for t in g.initializer if t.name not in inputs}
    constant: set[int] = set()
    for idx, n in enumerate(g.node):
        reads = [t for t in list(n.input) + implicit_inputs(n) if t]
        if n.op_type not in _NONDETERMINISTIC and n.domain in ("", "ai.onnx") and all(t in known for t in reads):
            known.update(t for t in n.output if t)
            constant.add(idx)
    return constant


def constant_folded(g: onnx.GraphProto, constant: set[int]) -> set[int]:
    """Of the nodes computed from constants alone (`constant`, from constant_nodes), those ONNX
    Runtime's constant folding should compute once at session start (weight norm's norm, layer
    scales), where a fused kernel would compute them on every run."""
    # A view or broadcast of a constant read by live computation costs that kernel nothing
    # (it reads the smaller tensor): it stays stitchable. Anything else computed from
    # constants alone (silero-vad's LSTM weights sliced and concatenated) is ORT's to fold.
    live_reads = {t for k, n in enumerate(g.node) if k not in constant for t in list(n.input) + implicit_inputs(n)}
    return {k for k in constant
            if not (g.node[k].op_type in _FREE_ON_CONSTANTS and any(t in live_reads for t in g.node[k].output))}


def conv_epilogues(g: onnx.GraphProto, tensors: Mapping[str, TensorInfo], constant: set[int]) -> dict[int, str]:
    """Nodes ONNX Runtime itself merges into the Conv before them, by index, with why: a
    BatchNormalization, or a Mul/Add by a per-channel constant, folded into the Conv's weights
    (its level-1 ConvBNFusion/ConvMulFusion/ConvAddFusion), then a Relu fused into the
    convolution (its CUDA FusedConv), each the only reader of what comes before. Stitched, they
    would cost a kernel of their own after a Conv that ORT would have run alone (onnx's
    Inception-v2: Conv → Mul → Add → Relu, 0.90× on the H100). `constant`: what constant_nodes
    finds."""
    readers = reader_map(g.node)
    outputs = {o.name for o in g.output}
    # What ORT knows at session start: initializers (no graph inputs) and what they alone compute.
    inputs = {i.name for i in g.input}
    constants = ({t.name for t in g.initializer if t.name not in inputs}
                 | {t for k in constant for t in g.node[k].output if t})

    def only_reader(t: str) -> int | None:
        r = readers.get(t, ())
        return r[0] if len(r) == 1 and t not in outputs else None

    def per_channel(n: onnx.NodeProto, channels: int | None, rank: int) -> bool:
        other = [t for t in n.input if t not in constants]
        if len(other) != 1 or not channels:
            return False
        info = tensors.get(next(t for t in n.input if t in constants))
        if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
            return False
        dims = list(info.shape)
        size = int(np.prod(dims)) if dims else 1
        return size == 1 or (size == channels and len(dims) <= rank and len(dims) >= rank - 1
                             and dims[len(dims) - (rank - 1)] == channels)

    out: dict[int, str] = {}
    for n in g.node:
        if n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or len(n.input) < 2 or n.input[1] not in constants:
            continue
        info = tensors.get(n.output[0])
        if info is None or info.shape is None or len(info.shape) < 3:
            continue
        channels = info.shape[1] if isinstance(info.shape[1], int) else None
        t = n.output[0]
        while (k := only_reader(t)) is not None:
            nxt = g.node[k]
            if nxt.op_type == "BatchNormalization" and all(x in constants for x in nxt.input[1:5]) and len(nxt.output) == 1:
                out[k] = "ONNX Runtime folds this BatchNormalization into the Conv before it"
            elif nxt.op_type in ("Mul", "Add") and per_channel(nxt, channels, len(info.shape)):
                out[k] = f"ONNX Runtime folds this {nxt.op_type} by a per-channel constant into the Conv before it"
            elif nxt.op_type == "Relu":
                out[k] = "ONNX Runtime fuses this Relu into the Conv before it"
                break
            else:
                break
            t = nxt.output[0]
    return out


def _unread(g: onnx.GraphProto) -> dict[int, str]:
    """Nodes whose results reach no graph output, by index, with why. Dead code (exporters
    leave it, torch.onnx's TorchScript exporter among them): a group of it would have no
    outputs, and ONNX Runtime removes it anyway. Results read only as shapes or axes: the plan
    sees data edges alone (FusionGraph's inputs leave shape inputs out), so a group holding such
    a node could close a cycle through the shape edge."""
    def live(inputs_of) -> set[int]:
        reached = {o.name for o in g.output}
        found: set[int] = set()
        for k in range(len(g.node) - 1, -1, -1):  # topological order: readers come later
            n = g.node[k]
            if any(t in reached for t in n.output if t):
                found.add(k)
                reached.update(t for t in list(inputs_of(n)) + implicit_inputs(n) if t)
        return found

    by_data = live(lambda n: ops.data_inputs(n.op_type, n.domain, n.input))
    by_any = live(lambda n: n.input)
    return {k: DEAD if k not in by_any else SHAPES_ONLY for k in range(len(g.node)) if k not in by_data}


def constant_value(graph: FusionGraph, tensor: str) -> object:
    """The scalar value of a baked constant."""
    return numpy_helper.to_array(graph.constants[tensor]).reshape(())[()]
