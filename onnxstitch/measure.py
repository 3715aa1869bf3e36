"""Measured costs: every fused group timed on the GPU it will run on, against the ONNX Runtime
nodes it replaces, so that a group that does not pay goes back to ONNX Runtime.

The plan's costs are a model (cost.py: one launch plus the bytes at copy bandwidth), and a
model can be wrong: a GRN layer's column reduction planned as a gain ran ConvNeXt V2 at 0.45× of
stock ORT. So, where a GPU is present, each distinct group is timed twice at the planning sizes,
as a model of its own (standalone.py) run by ONNX Runtime's CUDA EP in a CUDA graph: its
original nodes (stock ORT) and its fused node (the stitched kernel). Several copies of the group
run side by side in one graph, so a few-microsecond kernel is not lost in the replay's own cost,
which is measured once on an empty graph and taken off.

Figures are cached on disk by what determines them — the group's structure and sizes (or its
kernel), the device's name and ONNX Runtime's version — so a model planned again, or a layer
repeated, is measured once. `--costs FILE` exports and imports the cache: a machine without a GPU
then judges groups by figures measured on the target GPU.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import ortio, rowplan as rows, standalone
from .errors import BadInputError, first_line
from .graph import FusionGraph
from .inputs import index_inputs, random_feeds
from .planned import Group
from .schemes import registry
from .sessions import runtime_session
from .shapes import shape_output, symbolic_value
from .weights import is_stub

if TYPE_CHECKING:  # (bench itself is imported where it is used, as elsewhere in the package)
    from .bench import BenchConfig

log = logging.getLogger(__name__)

CACHE_SCHEMA = 1
# A group pays when its kernel takes less than the nodes it replaces by more than this share
# (measured figures spread by a few percent from run to run).
MARGIN = 0.03
# Figures both under this many microseconds say nothing about which is faster: what a run costs
# besides its kernels is subtracted from each, and the remainders are within its spread.
RESOLUTION_US = 1.0
# Copies of a group timed side by side: enough that the copies take about this long together.
TARGET_US = 60.0
MAX_COPIES = 16
MAX_PLANNED_COPIES = 4
# Random values drawn per input of a timed model, repeated to fill it (times do not depend on
# them; drawing ResNet-50's activations in full took 9 s).
DRAWN = 1 << 16
_INTEGERS = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
                       onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


@dataclass(frozen=True)
class GroupCost:
    """A group's predicted and measured times, in microseconds per run: its fused kernel
    (`ours`) and the stock ONNX Runtime nodes it replaces (`stock`). Measured figures are None
    where nothing was measured (no GPU, no cached figure), and `why` then says why."""

    group: str
    predicted_us: float
    predicted_stock_us: float
    ours_us: float | None = None
    stock_us: float | None = None
    source: str = ""  # "measured", "cache" or "" (not measured)
    why: str = ""
    # Why the group stays although it measured slower alone ("" where it does not): the whole
    # model ran faster with it (timed in the model, the standalone figure is overruled).
    overruled: str = ""

    @property
    def measured(self) -> bool:
        return self.ours_us is not None and self.stock_us is not None

    @property
    def resolved(self) -> bool:
        """Whether the measured figures say something: taken, and not both below the timer's
        resolution (a run's overhead, subtracted, can leave 0.0 for both on a busy GPU)."""
        return self.measured and max(self.ours_us, self.stock_us) >= RESOLUTION_US  # type: ignore[type-var]

    @property
    def pays(self) -> bool:
        """Whether the group is worth fusing by its measured figures (True where they are not
        resolved: the plan's prediction stands)."""
        if not self.resolved or self.overruled:
            return True
        return self.ours_us < self.stock_us * (1 - MARGIN)  # type: ignore[operator]

    @property
    def gain_us(self) -> float:
        """Microseconds the group saves per run, measured where resolved, else predicted."""
        if self.resolved:
            return self.stock_us - self.ours_us  # type: ignore[operator]
        return self.predicted_stock_us - self.predicted_us

    @property
    def stock_time_us(self) -> float:
        """The replaced nodes' time per run, measured where resolved, else predicted."""
        return self.stock_us if self.resolved else self.predicted_stock_us  # type: ignore[return-value]

    def to_json(self) -> dict:
        return {**asdict(self), "pays": self.pays}


class CostCache:
    """Measured microseconds by key, kept in a JSON file (`path`; None: in memory only)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.entries: dict[str, float] = {}
        if path is not None and path.is_file():
            self.merge(path)

    def merge(self, path: Path) -> None:
        """Add the figures of a cache file (`--costs FILE`); BadInputError if it is not one."""
        try:
            data = json.loads(Path(path).read_text())
            entries = data["entries"] if data.get("schema") == CACHE_SCHEMA else None
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
            raise BadInputError(f"--costs {path}: not an onnxstitch cost file ({first_line(e)})") from None
        if not isinstance(entries, dict):
            raise BadInputError(f"--costs {path}: not an onnxstitch cost file (schema {data.get('schema')!r})")
        self.entries.update({str(k): float(v) for k, v in entries.items()})

    def get(self, key: str) -> float | None:
        return self.entries.get(key)

    def put(self, key: str, us: float) -> None:
        self.entries[key] = float(us)

    def save(self, path: Path | None = None) -> None:
        """Write the figures to `path` (default the cache's own file), atomically, merged with
        what the file holds by then: several optimizes on one machine (a zoo run's tasks) share
        it, and none loses the others' figures."""
        target = path or self.path
        if target is None:
            return
        if target.is_file():
            try:
                old = json.loads(target.read_text())
                if old.get("schema") == CACHE_SCHEMA and isinstance(old.get("entries"), dict):
                    self.entries = {**{str(k): float(v) for k, v in old["entries"].items()}, **self.entries}
            except (OSError, ValueError, TypeError, AttributeError):
                pass  # a torn or foreign file is replaced
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"schema": CACHE_SCHEMA, "entries": self.entries}, indent=1, sort_keys=True))
        tmp.replace(target)


def default_cache() -> CostCache:
    """The on-disk cache beside the compiled kernels (`$ONNXSTITCH_CACHE/costs.json`)."""
    from .compile import cache_dir

    return CostCache(cache_dir() / "costs.json")


class Timer(Protocol):
    """Times standalone models on a device: microseconds per copy."""

    device: str  # the device's name, part of every cache key
    runtime: str  # the runtime's version, part of every cache key

    def time_us(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                outputs: Mapping[str, tuple[int, tuple[int, ...]]], stitched: bool, copies: int) -> float:
        """Microseconds per copy of one run of `model` (`outputs`: name → (dtype, shape))."""
        ...


def _structure(model: onnx.ModelProto) -> str:
    """What determines a standalone model's time, names aside: its nodes (op, attributes, wiring
    by position), input and output types and shapes, initializers' types and shapes (and the
    values of small ones: a Pow's exponent, a scalar), the functions it calls. Layers alike
    give one key."""
    canon = _namer("t")
    h = hashlib.sha256()
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        h.update(f"in {canon(vi.name)} {tt.elem_type} {[d.dim_value for d in tt.shape.dim]}\n".encode())
    for t in model.graph.initializer:
        h.update(f"init {canon(t.name)} {t.data_type} {list(t.dims)}\n".encode())
        if int(np.prod(t.dims)) <= 64:
            h.update(onnx.numpy_helper.to_array(t).tobytes())
    _nodes(h, model.graph.node, canon)
    for vi in model.graph.output:
        h.update(f"out {canon(vi.name)}\n".encode())
    for f in model.functions:
        h.update(f"function {f.domain} {len(f.input)} {len(f.output)}\n".encode())
        _nodes(h, f.node, _namer("f"))
    return h.hexdigest()[:32]


def _namer(prefix: str) -> Callable[[str], str]:
    """Names in order of first use (`prefix`0, 1, …): wiring by position, names aside."""
    names: dict[str, str] = {}
    return lambda t: "" if not t else names.setdefault(t, f"{prefix}{len(names)}")


# A fused node's attributes that carry its group's name (its kernel's, in the images' symbols):
# layers alike differ only there. The PTX stands for the code, its kernel name replaced.
_NAMED_ATTRS = frozenset({"kernel_name", "images", "images_sha256", "image_sizes", "ptx"})


def _nodes(h, nodes: Iterable[onnx.NodeProto], canon: Callable[[str], str]) -> None:
    """Hash `nodes` names aside: op, wiring by position, attributes; a fused node's code by its
    PTX with the kernel's name replaced (the group names differ between layers alike)."""
    for n in nodes:
        ours = n.domain == standalone.DOMAIN
        h.update(f"node {n.domain} {n.op_type} {'' if ours else n.overload} {[canon(t) for t in n.input]} "
                 f"{[canon(t) for t in n.output]}\n".encode())
        attrs = {a.name: a for a in n.attribute}
        for name in sorted(attrs):
            a = attrs[name]
            if ours and name in _NAMED_ATTRS:
                continue
            if a.type == onnx.AttributeProto.TENSOR:  # a Constant's value, its tensor's name aside
                a = onnx.AttributeProto()
                a.CopyFrom(attrs[name])
                a.t.name = ""
            h.update(name.encode() + a.SerializeToString())
        if ours and "ptx" in attrs:
            kernel = attrs["kernel_name"].s if "kernel_name" in attrs else b""
            ptx = attrs["ptx"].s
            h.update(b"ptx " + (ptx.replace(kernel, b"K") if kernel else ptx))


def key(model: onnx.ModelProto, timer_device: str, runtime: str, stitched: bool) -> str:
    """The cache key of a standalone model's time on a device under a runtime."""
    return f"{'ours' if stitched else 'stock'}:{_structure(model)}:{timer_device}:{runtime}"


def _concrete(graph: FusionGraph, tensor: str) -> tuple[int, tuple[int, ...]] | None:
    info = graph.tensors.get(tensor)
    if info is None:  # a tensor a scheme names in a layout of its own (conv's NHWC ones)
        info = registry.relaid_info(graph, tensor)
    if info is None or info.shape is None or any(d is None for d in info.shape):
        return None
    dims = tuple(d if isinstance(d, int) else symbolic_value(d, graph.dim_values) for d in info.shape)
    return info.dtype, dims


@dataclass(frozen=True)
class _Standalone:
    model: onnx.ModelProto
    outputs: Mapping[str, tuple[int, tuple[int, ...]]]
    key: str


def _standalones(original: onnx.ModelProto, stitched: onnx.ModelProto, graph: FusionGraph, grp: Group,
                 copies: int, device: str, runtime: str) -> tuple[_Standalone, _Standalone] | str:
    """The group's stock and stitched forms as models of `copies` copies each, or why not."""
    reads = standalone.group_reads(original, graph, grp)
    tensors = {t: _concrete(graph, t) for t in (*reads, *grp.outputs)}
    if any(v is None for v in tensors.values()):
        return "a tensor's size is not known at the planning sizes"
    # An integer input that is no Gather's index is a shape or a count computed at run time:
    # random values would not do. Where it is computed from shapes alone (a Reshape's target,
    # BERT's heads), its value at the planning sizes is baked into both forms; otherwise the group
    # keeps its prediction.
    probe = standalone.model_of([standalone.original_piece(original, graph, grp)], original,  # type: ignore[list-item]
                                {t: (d, list(s)) for t, (d, s) in tensors.items()})  # type: ignore[misc]
    counts = [t for t in reads if tensors[t][0] in _INTEGERS and t not in index_inputs(probe)]  # type: ignore[index]
    values = count_values(original, graph, counts) if counts else {}
    if values is None:
        return f"it reads {counts[0]}, a count computed at run time from values, not only shapes"
    forms = []
    for stitched_form in (False, True):
        pieces = []
        for c in range(copies):
            prefix = f"~c{c}~"
            piece = standalone.fused_piece(stitched, grp.name, prefix) if stitched_form else \
                standalone.original_piece(original, graph, grp, prefix)
            if piece is None:
                return "its nodes hold subgraphs" if not stitched_form else "it has no fused node"
            pieces.append(piece)
        more = {t: _concrete(graph, t) for p in pieces for t in p.reads + p.outputs if t not in tensors}
        if any(v is None for v in more.values()):
            return "a tensor's size is not known at the planning sizes"
        types = {t: (d, list(s)) for t, (d, s) in {**tensors, **more}.items()}  # type: ignore[misc]
        source = stitched if stitched_form else original
        m = _baked(standalone.model_of(pieces, source, types, f"{grp.name}_{'ours' if stitched_form else 'stock'}"),
                   {p.prefix + t: v for p in pieces for t, v in values.items()})
        outs = {p.prefix + t: types[t] for p in pieces for t in p.outputs}
        forms.append(_Standalone(m, {k: (v[0], tuple(v[1])) for k, v in outs.items()},
                                 key(_one_copy(m, pieces), device, runtime, stitched_form)))
    return forms[0], forms[1]


# Ops a shape computation is made of; Shape and Size themselves are read off the planning shapes.
_SHAPE_OPS = frozenset({"Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
                        "Neg", "Abs", "Floor", "Ceil", "Sqrt", "Max", "Min", "Equal", "Less", "Greater", "Not", "And",
                        "Or", "Where", "Constant", "ConstantOfShape", "Range", "Reshape", "Expand", "Identity",
                        "ReduceProd", "ReduceSum"})
MAX_SHAPE_NODES = 256


def count_values(original: onnx.ModelProto, graph: FusionGraph, counts: Sequence[str]) -> dict[str, np.ndarray] | None:
    """The values at the planning sizes of `counts`, integer tensors computed at run time: their
    producers back to Shape and Size nodes, whose results are the planning shapes, run on ONNX
    Runtime's CPU. None where one depends on a tensor's values, not only on shapes (a graph input
    read other than through Shape, an op that computes no shape, a cone over MAX_SHAPE_NODES)."""
    producer = {t: n for n in original.graph.node for t in n.output if t}
    inits = {i.name: i for i in original.graph.initializer}
    keep: set[int] = set()
    shapes: list[onnx.TensorProto] = []
    seen: set[str] = set()
    stack = list(counts)
    while stack:
        t = stack.pop()
        if not t or t in seen:
            continue
        seen.add(t)
        if t in inits:
            if is_stub(inits[t]):
                return None
            continue
        n = producer.get(t)
        if n is None:
            return None  # a graph input's values
        if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx"):
            got = _concrete(graph, n.input[0])
            if got is None:
                return None
            dims = np.array(got[1], np.int64)
            value = shape_output(n, dims) if n.op_type == "Shape" else np.array(dims.prod())
            shapes.append(numpy_helper.from_array(np.asarray(value, np.int64), n.output[0]))
            continue
        if (n.op_type not in _SHAPE_OPS or n.domain not in ("", "ai.onnx") or len(keep) >= MAX_SHAPE_NODES
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)):
            return None
        keep.add(id(n))
        stack += list(n.input)
    nodes = [n for n in original.graph.node if id(n) in keep]
    used = {x for n in nodes for x in n.input}
    outs = [helper.make_tensor_value_info(t, graph.tensors[t].dtype, None) for t in counts]
    g = helper.make_graph(nodes, "counts", [], outs, shapes + [inits[x] for x in sorted(used) if x in inits])
    m = helper.make_model(g, opset_imports=list(original.opset_import), ir_version=original.ir_version)
    try:
        got = ortio.run(runtime_session(m.SerializeToString(), gpu=False, stitched=False), list(counts), {})
    except Exception:  # noqa: BLE001 - the group keeps its prediction
        return None
    return dict(zip(counts, got))


def _with_values(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its weight stubs (weights.py: payloads held apart while optimize works) made
    zeros of their type and shape: a session needs values, and a kernel's time does not depend
    on them."""
    if not any(is_stub(t) for t in model.graph.initializer):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, t in enumerate(out.graph.initializer):
        if is_stub(t):
            zeros = np.zeros(tuple(t.dims), helper.tensor_dtype_to_np_dtype(t.data_type))
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(zeros, t.name))
    return out


def not_paying(costs: Iterable[GroupCost], linked: Iterable[str] = ()) -> set[str]:
    """The groups to give back to ONNX Runtime by their measured figures. Linked groups (conv
    groups sharing NHWC tensors: fused all together or not at all) are judged together, as what
    one of them costs depends on its neighbours' layouts: kept when their gains (measured where
    they were) add up to more than MARGIN of the nodes' time, else all given back."""
    costs = list(costs)
    linked = set(linked)
    slow = {c.group for c in costs if not c.pays}
    if slow & linked:
        chain = [c for c in costs if c.group in linked]
        base = sum(c.stock_time_us for c in chain)
        slow = slow - linked if sum(c.gain_us for c in chain) > MARGIN * base else slow | linked
    return slow


def why_not_paying(costs: Iterable[GroupCost], linked: Iterable[str] = ()) -> dict[str, str]:
    """Each group of `not_paying` and why, in words for the report."""
    costs = list(costs)
    linked = set(linked)
    slow = not_paying(costs, linked)
    chain = [c for c in costs if c.group in linked]
    gain, base = sum(c.gain_us for c in chain), sum(c.stock_time_us for c in chain)
    out = {}
    for c in costs:
        if c.group not in slow:
            continue
        if c.group in linked:
            out[c.group] = (f"one of {len(chain)} linked conv groups (NHWC between them), which together gain "
                            f"{gain:.1f} µs of {base:.1f} µs: under {MARGIN:.0%}")
        else:
            out[c.group] = f"measured {c.ours_us:.1f} µs against stock ORT's {c.stock_us:.1f} µs for its nodes"
    return out


def _baked(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """`model` with the inputs named in `values` made initializers of those values."""
    if not values:
        return model
    kept = [vi for vi in model.graph.input if vi.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in values.items())
    return model


def _one_copy(model: onnx.ModelProto, pieces: Sequence[standalone.Piece]) -> onnx.ModelProto:
    """The first copy of a model of copies: what its key describes (the copies repeat it)."""
    first = pieces[0].prefix
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node if all(t.startswith(first) for t in n.output if t)]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    for field_ in (out.graph.input, out.graph.output):
        kept = [vi for vi in field_ if vi.name.startswith(first)]
        del field_[:]
        field_.extend(kept)
    read = {t for n in keep for t in n.input}
    inits = [t for t in out.graph.initializer if t.name in read]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    return out


def copies_for(predicted_us: float) -> int:
    """Copies of a group to time side by side: about TARGET_US in all."""
    return max(1, min(MAX_COPIES, int(TARGET_US // max(predicted_us, 1.0))))


@dataclass(frozen=True)
class Job:
    """One standalone model to time: its inputs and the shapes of its outputs."""

    model: onnx.ModelProto
    feeds: Mapping[str, np.ndarray]
    outputs: Mapping[str, tuple[int, tuple[int, ...]]]
    stitched: bool
    copies: int


# Groups predicted to save less than this share of the nodes' time are measured; above it, the
# cost model's gain is clear enough to stand (measuring every group cost BERT-base 8-9 s cold
# and EfficientNet at B7 widths 35 s on an H200, for a model as fast to 1-3%).
CLEAR_GAIN = 1.5


# ONNX Runtime fuses these with an Add before them when it makes a session (SkipLayerNormalization,
# BiasSoftmax, BiasGelu): the cost model prices the unfused nodes, so a group holding such a pair
# is never a clear gain. BERT's residual + LayerNorm rows groups were predicted 3.4× faster than
# ORT's nodes and measured 0.9× against its SkipLayerNormalization (5.6 against 5.0 µs, H200).
ORT_FUSED_AFTER_ADD = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "Softmax", "Erf", "Gelu"})


def _ort_fuses(graph: FusionGraph, grp: Group) -> bool:
    """Whether the group holds an Add that ORT would fuse into the node it feeds."""
    members = set(grp.nodes)
    for i in grp.nodes:
        n = graph.nodes[i]
        if n.op_type in ORT_FUSED_AFTER_ADD and any(
                graph.producer.get(t) in members and graph.nodes[graph.producer[t]].op_type == "Add" for t in n.inputs):
            return True
    return False


def _risk(graph: FusionGraph, grp: Group, base: GroupCost) -> float | None:
    """How unsure the cost model is of a group, for the order of measuring, or None where its
    predicted gain is clear: a column reduction or a split row (the cost model's known misses),
    the library and attention schemes and an Add that ORT fuses into what it feeds
    (ORT_FUSED_AFTER_ADD) always count; other groups where their predicted gain is under
    CLEAR_GAIN, the smaller first."""
    score = 5.0 if _ort_fuses(graph, grp) else 0.0
    if grp.scheme == "rows" and rows.has_rows(graph, grp.nodes):
        plan = rows.row_plan(graph, frozenset(grp.nodes))
        score += 10.0 if plan.inner or plan.split > 1 else 0.0
    if grp.scheme not in ("elementwise", "rows"):
        score += 5.0
    ratio = base.predicted_stock_us / max(base.predicted_us, 1e-6)
    if score == 0.0 and ratio >= CLEAR_GAIN:
        return None
    return score + 4.0 / max(ratio, 0.25) + (2.0 if base.predicted_us < 10.0 else 0.0)


def time_all(timer: Timer, jobs: Sequence[Job]) -> list[float | Exception]:
    """Microseconds per copy of each job, or the exception that stopped it: through the timer's
    own batch method where it has one (sessions made in parallel), else one at a time."""
    batch = getattr(timer, "time_many", None)
    if batch is not None:
        return batch(jobs)
    out: list[float | Exception] = []
    for job in jobs:
        try:
            out.append(timer.time_us(job.model, job.feeds, job.outputs, job.stitched, job.copies))
        except Exception as e:  # noqa: BLE001 - reported per group
            out.append(e)
    return out


def measure(original: onnx.ModelProto, stitched: onnx.ModelProto, graph: FusionGraph, groups: Sequence[Group],
            predicted_stock: Mapping[str, float], timer: Timer | None, cache: CostCache,
            budget_s: float = 60.0, say: Callable[[str], None] | None = None) -> tuple[GroupCost, ...]:
    """Each group's costs: cached figures, else (with a `timer`) measured now and cached. Groups
    alike (a repeated layer) are measured once. `predicted_stock`: the plan's prediction for the
    nodes each group replaces. Models are timed in batches while `budget_s` lasts (the groups
    left keep their predictions)."""
    device = timer.device if timer is not None else _cached_device(cache)
    runtime = timer.runtime if timer is not None else _cached_runtime(cache)
    bases: dict[str, GroupCost] = {}
    forms: dict[str, tuple[_Standalone, _Standalone, int]] = {}
    risks: dict[str, float] = {}
    for grp in groups:
        base = GroupCost(grp.name, grp.predicted_us, predicted_stock.get(grp.name, 0.0))
        bases[grp.name] = base
        if device is None:
            bases[grp.name] = _why(base, "no GPU here and no measured costs for this device (--costs)")
        elif (risk := _risk(graph, grp, base)) is None:  # decided before its standalone models are built
            ratio = base.predicted_stock_us / max(base.predicted_us, 1e-6)
            bases[grp.name] = _why(base, f"not measured: predicted {ratio:.1f}× faster than the nodes it replaces, "
                                         f"a clear gain (the written model is timed whole)")
        else:
            copies = copies_for(grp.predicted_us)
            if registry.plans_per_shape(grp.scheme):
                # Each stock copy searches its convolution algorithms at its first run (ORT's
                # default, per node): fewer copies of these kernels of several microseconds.
                copies = min(copies, MAX_PLANNED_COPIES)
            got = _standalones(original, stitched, graph, grp, copies, device, runtime or "")
            if isinstance(got, str):
                bases[grp.name] = _why(base, got)
            else:
                forms[grp.name] = (*got, copies)
                risks[grp.name] = risk
    # Every key not cached yet, once (layers alike share their keys), as a job; the groups the cost
    # model is least sure of first, so that a budget that runs out leaves the safest unmeasured.
    jobs: dict[str, Job] = {}
    drawn: dict[str, list[np.ndarray]] = {}
    pool: dict[int, np.ndarray] = {}  # (every job's feeds views of one buffer a dtype)
    for name in sorted(forms, key=lambda n: -risks[n]):
        stock, ours, copies = forms[name]
        if timer is None or all(f.key in jobs or cache.get(f.key) is not None for f in (stock, ours)):
            continue  # (a layer like one already queued: no feeds drawn for it again)
        # One set of inputs for both forms, drawn for the stock form, whose Gathers show which
        # inputs are indices (in the fused form they hide inside its function). Layers alike have
        # one stock form (one key) under names of their own: its arrays are drawn once and given
        # to each by position.
        stock_names = [vi.name for vi in stock.model.graph.input]
        if stock.key not in drawn:
            first = random_feeds(stock.model, seed=0, drawn=DRAWN, pool=pool)
            drawn[stock.key] = [first[n] for n in stock_names]
        shared = dict(zip(stock_names, drawn[stock.key]))
        for form, flag in ((stock, False), (ours, True)):
            if form.key in jobs or cache.get(form.key) is not None:
                continue
            names = list(dict.fromkeys(vi.name for vi in form.model.graph.input))
            feeds = {n: shared[n] for n in names if n in shared}
            if len(feeds) < len(names):
                feeds |= random_feeds(form.model, seed=0, only=[n for n in names if n not in feeds], drawn=DRAWN,
                                      pool=pool)
            jobs[form.key] = Job(_with_values(form.model), feeds, form.outputs, flag, copies)
    failed: dict[str, str] = {}
    if jobs and timer is not None:
        # Library plans chosen per shape (cuDNN compiles each candidate engine, a second or more,
        # one at a time in a process) are compiled first in worker processes side by side; the
        # timing sessions then load them.
        schemes = {grp.name: grp.scheme for grp in groups}
        planned_per_shape = list({forms[n][1].key: jobs[forms[n][1].key].model for n in forms
                                  if registry.plans_per_shape(schemes[n]) and forms[n][1].key in jobs}.values())
        prepare = getattr(timer, "prepare", None)
        if prepare is not None and len(planned_per_shape) > 1:
            if say:
                say(f"compiling library plans ({len(planned_per_shape)} forms)")
            began = time.monotonic()
            # (Not from the measuring budget: verification would compile them anyway, one at a time.)
            ran = prepare(planned_per_shape, timeout_s=PREPARE_BUDGET_S)
            log.info("library plans of %d of %d forms compiled in workers in %.1f s", ran, len(planned_per_shape),
                     time.monotonic() - began)
        deadline = time.monotonic() + budget_s
        keys = list(jobs)
        for start in range(0, len(keys), BATCH):
            if time.monotonic() > deadline:
                failed |= {k: f"the measuring budget of {budget_s:g} s ran out" for k in keys[start:]}
                break
            if say:
                say(f"measuring groups ({start + 1}–{min(start + BATCH, len(keys))} of {len(keys)} forms)")
            chunk = keys[start:start + BATCH]
            for k, got in zip(chunk, time_all(timer, [jobs[k] for k in chunk])):
                if isinstance(got, Exception):
                    failed[k] = f"cannot be timed alone: {first_line(got)}"
                else:
                    cache.put(k, got)
    out: list[GroupCost] = []
    for grp in groups:
        if grp.name not in forms:
            out.append(bases[grp.name])
            continue
        stock, ours, _ = forms[grp.name]
        why = failed.get(stock.key) or failed.get(ours.key)
        s_us, o_us = cache.get(stock.key), cache.get(ours.key)
        if why or s_us is None or o_us is None:
            out.append(_why(bases[grp.name], why or "not in the measured costs (--costs) for this device"))
            continue
        fresh = stock.key in jobs or ours.key in jobs
        out.append(GroupCost(grp.name, grp.predicted_us, bases[grp.name].predicted_stock_us, o_us, s_us,
                             "measured" if fresh else "cache"))
    return tuple(out)


# Standalone models whose sessions are made at once (in parallel), then timed one by one.
BATCH = 16


def _why(base: GroupCost, why: str) -> GroupCost:
    return GroupCost(base.group, base.predicted_us, base.predicted_stock_us, why=why)


def _cached_device(cache: CostCache) -> str | None:
    """On a machine without a GPU: the device the imported figures were measured on (the one
    device of the cache's keys), or None."""
    devices = {k.split(":")[2] for k in cache.entries if k.count(":") >= 3}
    return devices.pop() if len(devices) == 1 else None


def _cached_runtime(cache: CostCache) -> str | None:
    runtimes = {k.split(":", 3)[3] for k in cache.entries if k.count(":") >= 3}
    return runtimes.pop() if len(runtimes) == 1 else None


@contextlib.contextmanager
def timing_lock() -> Iterator[None]:
    """Holds the file named by ortio.TIMING_LOCK_ENV, where set, for the duration (a no-op
    without it)."""
    path = os.environ.get(ortio.TIMING_LOCK_ENV, "")
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        began = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        if time.monotonic() - began > 0.1:
            log.info("waited %.1f s for the GPU's timing lock", time.monotonic() - began)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class OrtCudaTimer:
    """Times standalone models on ONNX Runtime's CUDA EP in CUDA graphs (plain runs where ORT
    cannot capture one, for both forms alike), inputs and outputs bound on the device."""

    def __init__(self, runs: int = 25, warmup: int = 3) -> None:
        import onnxruntime as ort

        from .bench import gpu_name

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        self.ort = ort
        self.runs, self.warmup = runs, warmup
        self.device = gpu_name().replace(":", " ")
        self.runtime = ort.__version__
        self._overhead: dict[bool, float] = {}

    def _session(self, model: onnx.ModelProto, stitched: bool, graphs: bool):
        from .runtime import session

        so = self.ort.SessionOptions()
        so.log_severity_level = 3
        # Everything runs on the GPU: no CPU thread pools to start for each of many sessions.
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        cuda = [("CUDAExecutionProvider", {"enable_cuda_graph": "1" if graphs else "0"}), "CPUExecutionProvider"]
        src = model.SerializeToString()
        if stitched:
            return session(src, providers=cuda, sess_options=so)
        return self.ort.InferenceSession(src, so, providers=cuda)

    def _run_us(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                outputs: Mapping[str, tuple[int, tuple[int, ...]]], stitched: bool, graphs: bool) -> float:
        return self._timed(*self._bound(model, feeds, outputs, stitched, graphs))

    def _bound(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
               outputs: Mapping[str, tuple[int, tuple[int, ...]]], stitched: bool, graphs: bool):
        """A session of `model` with its inputs and outputs bound on the device."""
        from . import ortio
        from onnx import helper

        sess = self._session(model, stitched, graphs)
        io = sess.io_binding()
        keep = []
        for name, arr in feeds.items():
            v = ortio.to_ortvalue(arr, "cuda", 0)
            keep.append(v)
            io.bind_ortvalue_input(name, v)
        for name, (dtype, shape) in outputs.items():
            v = ortio.empty(shape, helper.tensor_dtype_to_np_dtype(dtype), "cuda", 0)
            keep.append(v)
            io.bind_ortvalue_output(name, v)
        return sess, io, keep

    def _timed(self, sess, io, keep) -> float:
        """Median microseconds of a bound session's runs, after warm-up runs (the first of
        which captures the CUDA graph)."""
        for _ in range(self.warmup):
            sess.run_with_iobinding(io)
        times = []
        for _ in range(self.runs):
            t0 = time.perf_counter()
            sess.run_with_iobinding(io)  # synchronizes the stream before returning
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    def overhead_us(self, graphs: bool) -> float:
        """A run of an empty graph (one Identity of one float): what every run costs besides
        its kernels."""
        if graphs not in self._overhead:
            from onnx import TensorProto, helper

            g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "empty",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
            self._overhead[graphs] = self._run_us(m, {"x": np.ones(1, np.float32)},
                                                  {"y": (TensorProto.FLOAT, (1,))}, False, graphs)
        return self._overhead[graphs]

    def prepare(self, models: Sequence[onnx.ModelProto], timeout_s: float = 60.0) -> int:
        """Compiles the library plans (cuDNN engines) of stitched `models` in worker processes side
        by side, into the plan cache the timing sessions load from; how many ran. Where one fails
        or time runs out, its plans are chosen at its first timed run instead."""
        return prepare_plans(models, timeout_s=timeout_s)

    def time_us(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                outputs: Mapping[str, tuple[int, tuple[int, ...]]], stitched: bool, copies: int) -> float:
        (got,) = self.time_many([Job(model, feeds, outputs, stitched, copies)])
        if isinstance(got, Exception):
            raise got
        return got

    def time_many(self, jobs: Sequence[Job]) -> list[float | Exception]:
        """Each job's microseconds per copy (or its exception), one at a time, so that nothing
        else runs on the GPU while one is timed. (Sessions made and first run in threads aborted
        the process on an H200 with larger models, cause not found; one at a time it is.)"""
        def make(job: Job):
            try:
                return self._bound(job.model, job.feeds, job.outputs, job.stitched, True)
            except Exception as e:  # noqa: BLE001 - reported per job
                return e

        began = time.monotonic()
        bound = [make(job) for job in jobs]
        log.info("%d sessions to time made in %.2f s", len(jobs), time.monotonic() - began)
        with timing_lock():
            return self._timed_each(jobs, bound)

    def _timed_each(self, jobs: Sequence[Job], bound: list) -> list[float | Exception]:
        out: list[float | Exception] = []
        for job, b in zip(jobs, bound):
            began = time.monotonic()
            try:
                if isinstance(b, Exception):
                    raise b
                try:
                    total, graphs = self._timed(*b), True
                except Exception as e:  # ORT could not capture it: plain runs (launches included)
                    log.info("timed without a CUDA graph: %s", first_line(e))
                    total, graphs = self._timed(*self._bound(job.model, job.feeds, job.outputs, job.stitched,
                                                             False)), False
                out.append(max(total - self.overhead_us(graphs), 0.0) / job.copies)
            except Exception as e:  # noqa: BLE001 - reported per job
                out.append(e)
            log.info("%s timed in %.2f s", job.model.graph.name, time.monotonic() - began)
        return out


def plan_workers() -> int:
    """Worker processes for compiling library plans: half the cores (each runs cuDNN's compiler
    on one), at most PLAN_WORKERS."""
    return max(1, min(PLAN_WORKERS, (os.cpu_count() or 2) // 2))


# Each worker holds a CUDA context (about half a GB of GPU memory) for its few seconds.
PLAN_WORKERS = 8
# How long the workers may take in all (ResNet-50's 26 shapes: about 40 s in one process).
PREPARE_BUDGET_S = 120.0


def prepare_plans(models: Sequence[onnx.ModelProto], workers: int | None = None, timeout_s: float = 60.0,
                  providers: Sequence[str] = ("CUDAExecutionProvider", "CPUExecutionProvider")) -> int:
    """Runs each stitched model once in worker processes with ONNXSTITCH_PLAN_PREPARE=1, so that
    the library compiles the candidate plans of its shapes and saves them untimed (the workers
    share the GPU); how many ran. Failures are logged and left to the timed run."""
    import multiprocessing
    import tempfile

    if not models:
        return 0
    n = min(len(models), workers or plan_workers())
    ran = 0
    with tempfile.TemporaryDirectory(prefix="onnxstitch-plans-") as tmp:
        paths = []
        for i, m in enumerate(models):
            path = Path(tmp) / f"{i}.onnx"
            path.write_bytes(m.SerializeToString())
            paths.append(str(path))
        # spawn: this process may hold a CUDA context already, which a fork cannot share.
        pool = multiprocessing.get_context("spawn").Pool(n, initializer=_preparing)
        try:
            pending = [pool.apply_async(_prepare_one, (p, list(providers))) for p in paths]
            deadline = time.monotonic() + timeout_s
            for i, r in enumerate(pending):
                try:
                    why = r.get(timeout=max(deadline - time.monotonic(), 0.01))
                except multiprocessing.TimeoutError:
                    log.info("compiling library plans: %d models left after %g s", len(pending) - i, timeout_s)
                    break
                except Exception as e:  # noqa: BLE001 - a worker that died: left to the timed run
                    why = first_line(e)
                if why:
                    log.info("a plan worker failed: %s", why)
                else:
                    ran += 1
        finally:
            pool.terminate()  # (a worker still compiling is stopped: its plans are chosen later)
            pool.join()
    return ran


def _preparing() -> None:
    os.environ["ONNXSTITCH_PLAN_PREPARE"] = "1"


def _prepare_one(path: str, providers: list[str]) -> str:
    """A worker's model run once on the GPU (its plans compiled and saved): "" or why not."""
    try:
        import onnxruntime as ort

        from .runtime import session

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        model = onnx.load(path)
        # (Without CUDA the fused nodes run their fallback functions: nothing to prepare, as in
        # the host tests of these workers.)
        make = session if "CUDAExecutionProvider" in providers else ort.InferenceSession
        sess = make(model.SerializeToString(), providers=providers, sess_options=so)
        sess.run(None, random_feeds(model, seed=0, drawn=DRAWN))
        return ""
    except Exception as e:  # noqa: BLE001 - reported to the parent, which chooses the plans itself
        return first_line(e)


def gpu_timer() -> OrtCudaTimer | None:
    """A timer on this machine's GPU, or None without a usable one (CUDA EP and the library)."""
    from .verify import gpu_usable

    if not gpu_usable():
        return None
    try:
        return OrtCudaTimer()
    except Exception as e:
        log.info("no GPU timer: %s", first_line(e))
        return None


def summary(costs: Iterable[GroupCost]) -> dict:
    """Figures for the report: groups measured, given back, and the cost model's error."""
    costs = list(costs)
    measured = [c for c in costs if c.measured]
    errors = [abs(c.predicted_us - c.ours_us) / c.ours_us for c in measured if c.ours_us]  # type: ignore[operator]
    return {"groups": len(costs), "measured": len(measured),
            "from_cache": sum(c.source == "cache" for c in measured),
            "not_paying": [c.group for c in costs if not c.pays],
            "median_prediction_error": statistics.median(errors) if errors else None}




# The stitched model must beat stock ORT by at least this share to be written as planned.
GATE_MARGIN = 0.01
# Seconds of runs per model the gate's timing may take: a model whose Loop decodes hundreds of
# steps per run is timed over fewer runs (bench.MIN_TIMED at the least).
GATE_TIME_BUDGET_S = 2.0
# A model that gains less than this through CUDA graphs is timed plain too (as sessions without
# CUDA graphs run it, most users' way): slower there by more than PLAIN_SLACK, it is not faster.
# Models that gain more than this through graphs are not timed twice (BERT-base: 1.5x).
PLAIN_CHECK_BELOW = 1.15
PLAIN_SLACK = 0.02


@dataclass(frozen=True)
class ModelTiming:
    """Stock ORT and the stitched model timed in interleaved rounds, in milliseconds per run,
    and how each ran (through a CUDA graph where ORT can capture the model, else plain)."""

    stock_ms: float
    stitched_ms: float
    stock_graphs: bool
    stitched_graphs: bool
    # Both timed plain as well, where the gain through CUDA graphs is small (PLAIN_CHECK_BELOW).
    plain_stock_ms: float | None = None
    plain_stitched_ms: float | None = None
    # Other stitched models timed in the same rounds, by label (compare_models' alternatives).
    alternatives_ms: Mapping[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.stock_ms / self.stitched_ms if self.stitched_ms else 0.0

    @property
    def _faster_as_timed(self) -> bool:
        """Faster in the first comparison (through CUDA graphs where ORT captured each)."""
        return self.stitched_ms < self.stock_ms * (1 - GATE_MARGIN)

    @property
    def faster(self) -> bool:
        if not self._faster_as_timed:
            return False
        return self.plain_stitched_ms is None or self.plain_stitched_ms <= self.plain_stock_ms * (1 + PLAIN_SLACK)

    @property
    def wants_plain(self) -> bool:
        """Whether to time the models plain as well: both ran through CUDA graphs and the
        stitched one gains little there."""
        return self.stock_graphs and self.stitched_graphs and self.plain_stock_ms is None and \
            self.faster and self.speedup < PLAIN_CHECK_BELOW

    def verdict(self) -> str:
        """What the timing found, for the report: the slower mode's figures."""
        if self._faster_as_timed and self.plain_stitched_ms is not None:
            return (f"the stitched model ran {self.plain_stitched_ms:.3f} ms against stock ORT's "
                    f"{self.plain_stock_ms:.3f} ms without CUDA graphs ({self.stitched_ms:.3f} against "
                    f"{self.stock_ms:.3f} ms with them)")
        return f"the stitched model ran {self.stitched_ms:.3f} ms against stock ORT's {self.stock_ms:.3f} ms ({self.mode})"

    @property
    def mode(self) -> str:
        def how(graphs: bool) -> str:
            return "CUDA graph" if graphs else "plain"
        if self.stock_graphs == self.stitched_graphs:
            return how(self.stock_graphs)
        return f"stock {how(self.stock_graphs)}, stitched {how(self.stitched_graphs)}"

    def to_json(self) -> dict:
        return {**asdict(self), "speedup": self.speedup, "mode": self.mode}


def _gate_config(libraries: Sequence[str], **timing: Any) -> "BenchConfig":
    """How the gate's sessions are made (the custom-op libraries, cuDNN's heuristic convolution
    algorithms: the convolutions are ORT's in both models, and an exhaustive search would cost
    seconds per session and change neither side's share), with `timing`'s fields."""
    from .bench import BenchConfig

    return BenchConfig(custom_op_libraries=tuple(libraries), conv_algo_search="HEURISTIC", **timing)


def capture_refusal(stitched: str | os.PathLike, libraries: Sequence[str] = ()) -> str:
    """What ONNX Runtime says when it refuses to capture the stitched model in a CUDA graph,
    its session made as `compare_models` makes it; "" where it accepts it (bench.capture_refusal)."""
    from .bench import capture_refusal as refusal

    return refusal(stitched, _gate_config(libraries))


def compare_models(original: str | os.PathLike, stitched: str | os.PathLike, shapes: Mapping[str, Sequence[int]],
                   libraries: Sequence[str] = (), values: Mapping[str, float] | None = None,
                   iters: int = 40, cuda_graph: bool = True, outputs: Mapping[str, Any] | None = None,
                   alternatives: Mapping[str, str | os.PathLike] | None = None) -> ModelTiming:
    """Stock ORT's CUDA EP against the stitched model at the planning sizes (bench.py's
    interleaved rounds, no profile), through CUDA graphs where ORT captures each (`cuda_graph`;
    else both plain), sessions made as `_gate_config` says. `outputs`: the outputs' shapes at
    these sizes where known (bench.OutputLike by name): no reference session. `alternatives`:
    other stitched models (label → path) timed in the same rounds (`ModelTiming.alternatives_ms`)."""
    from .bench import STITCHED, run

    config = _gate_config(libraries, warmup=5, iters=iters, cuda_graph=cuda_graph, profile_runs=0,
                          values=dict(values or {}), time_budget_s=GATE_TIME_BUDGET_S, build_together=True)
    with timing_lock():
        res = run(original, stitched, config=config, shapes=shapes, outputs=outputs, stitched_peers=alternatives)
    return ModelTiming(res.stock.median_ms, res.configs[STITCHED].median_ms, res.stock.cuda_graph,
                       res.configs[STITCHED].cuda_graph,
                       alternatives_ms={k: res.configs[k].median_ms for k in alternatives or {}})
