"""Fusion inside If, Loop and Scan: every subgraph body of the main graph is optimized as a model
of its own, and the stitched body goes back into its node.

A body becomes a model whose inputs are its own (a Loop's iteration number, condition and
carried values; a Scan's state and slices; none for an If branch) followed by the outer tensors
it reads, typed and shaped as the outer graph's inference found them (a loop-carried dim stays
symbolic). That model goes through the whole pipeline — its own plan, kernels, rewrite and
verification, which runs every branch of an If on its own inputs whichever branch the model's
inputs would take — and, nested bodies included, comes back with FusedKernel nodes whose
fallback functions hold its original nodes. The body's extra inputs are dropped again (inside
the node they are the outer tensors they name), its groups renamed after the node and branch so
no two bodies' kernels share a name, and its functions join the model's.

A body that cannot be optimized (a type the outer inference does not know, a verification that
cannot run it) stays as it was, with the reason among the stage's refusals.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import onnx
from onnx import helper, numpy_helper

from .edit import implicit_inputs, reads, subgraphs
from .errors import SIZE_HINT, StitchError, first_line
from .rewrite import DOMAIN, IR_VERSION, OP_TYPE
from .shapes import TensorInfo, infer
from .weights import is_stub

log = logging.getLogger(__name__)

# Control-flow ops whose graph attributes are bodies, and the attributes that hold them.
BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
# Bodies with fewer compute nodes than this have nothing to fuse.
MIN_NODES = 2

# optimize(body model, shapes) → (the stitched body model, weights inside; its report)
Optimizer = Callable[[onnx.ModelProto, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Bodies:
    """The main model with its bodies stitched, and what was done: a line per body stitched,
    a line per body left as it was (with why)."""

    model: onnx.ModelProto
    rewrites: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    # output name of the control-flow node → {attribute: stitched body}, to apply to another copy
    bodies: Mapping[str, Mapping[str, onnx.GraphProto]] = field(default_factory=dict)
    functions: tuple[onnx.FunctionProto, ...] = ()
    # Kernels of the stitched bodies before and after, summed (one run of each body).
    kernels_before: int = 0
    kernels_after: int = 0
    sunk: bool = False  # a tail was copied into an If's branches (`sink_tails`): the main graph changed


def has_bodies(model: onnx.ModelProto) -> bool:
    """Whether the main graph has an If, Loop or Scan node."""
    return any(n.op_type in BODIES and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _compute_nodes(g: onnx.GraphProto) -> int:
    return sum(1 for n in g.node if n.op_type not in ("Constant", "Identity"))


def outer_constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The main graph's initializers whose payload is in the model (not the large weights kept
    apart, weights.py): a body reading one gets it as an initializer of its own while it is
    optimized, since its value can decide shapes (a Split's sizes), and drops it again after."""
    return {t.name: t for t in model.graph.initializer if not is_stub(t)}


def body_model(body: onnx.GraphProto, node: onnx.NodeProto, model: onnx.ModelProto,
               infos: Mapping[str, TensorInfo]) -> onnx.ModelProto | str:
    """`body` (an attribute of `node` in `model`'s main graph) as a model: its inputs, then the
    outer tensors it reads; or why it cannot be one."""
    g = onnx.GraphProto()
    g.CopyFrom(body)
    outer = []
    defined = {i.name for i in body.input} | {t.name for t in body.initializer}
    constants = outer_constants(model)
    probe = onnx.NodeProto()
    probe.attribute.add().CopyFrom(helper.make_attribute("body", body))
    for t in implicit_inputs(probe):
        if t in defined:
            continue
        if t in constants:  # split sizes, shapes, axes: their values, not random ones, in verification
            g.initializer.append(constants[t])
            continue
        info = infos.get(t)
        if info is None or not info.dtype:
            return f"it reads {t}, whose type the outer graph's inference does not know"
        outer.append(helper.make_tensor_value_info(t, info.dtype, None if info.shape is None else list(info.shape)))
    g.input.extend(outer)
    for vi in list(g.input) + list(g.output):
        if not vi.type.tensor_type.elem_type:
            return f"its {'input' if vi in g.input else 'output'} {vi.name} has no type"
    g.name = f"{node.name or node.output[0]}_body"
    m = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))
    m.functions.extend(model.functions)
    return m


def _renamed(result: onnx.ModelProto, prefix: str) -> onnx.ModelProto:
    """The stitched body with its fused groups renamed `prefix + name` (nodes and functions)."""
    out = onnx.ModelProto()
    out.CopyFrom(result)
    for n in _all_nodes(out.graph):
        if n.op_type == OP_TYPE and n.domain == DOMAIN:
            n.overload = prefix + n.overload
            n.name = prefix + n.name if n.name else n.name
    for f in out.functions:
        if f.domain == DOMAIN:
            f.overload = prefix + f.overload
    return out


# The most nodes a tail copied into an If's branches may have (each branch gets one copy).
MAX_TAIL = 400


def _produced(g: onnx.GraphProto) -> set[str]:
    """Every name a graph and the graphs nested in it make: node outputs, inputs, initializers."""
    found = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        found.update(o for o in n.output if o)
        for sub in subgraphs(n):
            found |= _produced(sub)
    return found


def _rename_graph(g: onnx.GraphProto, names: Mapping[str, str], suffix: str) -> None:
    """Rename, in place and through nested graphs, every tensor in `names` and every node."""
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        vi.name = names.get(vi.name, vi.name)
    for t in g.initializer:
        t.name = names.get(t.name, t.name)
    for n in g.node:
        n.input[:] = [names.get(t, t) for t in n.input]
        n.output[:] = [names.get(t, t) for t in n.output]
        if n.name:
            n.name += suffix
        for sub in subgraphs(n):
            _rename_graph(sub, names, suffix)


def _implied_sizes(g: onnx.GraphProto, node: onnx.NodeProto, infos: Mapping[str, TensorInfo]) -> dict[str, int]:
    """The size an If's then branch implies for a symbolic dim: {dim: n} where its condition is
    Equal(Shape(t)[k], n) (through Casts and Squeezes) and dim k of t is that symbol. The branch
    is planned and verified at that size: silero-vad's `x.squeeze(-1) if x.size(-1) == 1` runs
    its then branch, with the tail copied into it, only at a length of 1, where random lengths
    fail its Squeeze."""
    made = {o: n for n in g.node for o in n.output if o}
    consts = {t.name: t for t in g.initializer}

    def source(t: str) -> tuple[str, onnx.NodeProto | None]:
        n = made.get(t)
        while n is not None and n.op_type in ("Cast", "Identity", "Squeeze", "Unsqueeze") and n.input:
            t, n = n.input[0], made.get(n.input[0])
        return t, n

    def scalar(t: str) -> int | None:
        t, _ = source(t)
        if t not in consts:
            return None
        v = numpy_helper.to_array(consts[t]).reshape(-1)
        return int(v[0]) if v.size == 1 and v.dtype.kind in "iu" else None

    _, eq = source(node.input[0]) if node.input else ("", None)
    if eq is None or eq.op_type != "Equal" or len(eq.input) != 2:
        return {}
    for a, b in ((eq.input[0], eq.input[1]), (eq.input[1], eq.input[0])):
        _, gather = source(a)
        value = scalar(b)
        if value is None or gather is None or gather.op_type != "Gather" or len(gather.input) != 2:
            continue
        shape = made.get(gather.input[0])
        k = scalar(gather.input[1])
        info = infos.get(shape.input[0]) if shape is not None and shape.op_type == "Shape" and shape.input else None
        if k is None or info is None or info.shape is None or not -len(info.shape) <= k < len(info.shape):
            continue
        dim = info.shape[k]
        if isinstance(dim, str) and len(shape.attribute) == 0:  # (a Shape without start/end)
            return {dim: value}
    return {}


def _forget_shapes(g: onnx.GraphProto) -> None:
    """Drop the shapes a copied body declares for its outputs and tensors, through nested bodies
    (types stay): an exporter's shapes for one rank of what the body reads (silero-vad's branches
    declare [1, d, 128] for an Unsqueeze that gives rank 4 when the copy's input is rank 3),
    which ONNX Runtime would merge with what it infers, warning at every session."""
    for vi in list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):  # (reading tensor_type of an untyped one would set it)
            vi.type.tensor_type.ClearField("shape")
    for n in g.node:
        for sub in subgraphs(n):
            _forget_shapes(sub)


def sink_tails(model: onnx.ModelProto, infos: Mapping[str, TensorInfo]) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """`model` with the tail of each If whose outputs' rank depends on the branch taken copied
    into both its branches, where an If in that tail branches on what it computes.

    TorchScript writes `x.squeeze(-1) if x.size(-1) == 1 else x` as an If whose branches give a
    rank 2 and a rank 3 tensor, and Python's later `if y.dim() == 2:` as Ifs on Size(Shape(y)):
    silero-vad runs three such Ifs around its LSTM on every inference, each a subgraph call with
    host cost, all decided by the first If's own condition. Inside each branch the rank is
    known, so each copy's Ifs fold (simplify: an If on a condition known by construction), and
    the copies are optimized as bodies with the rest. The tail is every node computed from the
    If's outputs (as `edit.reads`, bodies' reads included), its copies renamed per branch; the
    new If, after every other node, gives the graph outputs the tail gave. At most MAX_TAIL
    nodes are copied."""
    g = model.graph
    nodes = list(g.node)
    graph_outputs = [o.name for o in g.output]
    for i, n in enumerate(nodes):
        if n.op_type != "If" or n.domain not in ("", "ai.onnx"):
            continue
        outs = [o for o in n.output if o]
        if all(infos.get(o) is not None and infos[o].shape is not None for o in outs):
            continue  # (the rank is the same whichever branch runs: shapes.py)
        made, tail = set(outs), []
        for j in range(i + 1, len(nodes)):
            if any(t in made for t in reads(nodes[j])):
                tail.append(j)
                made.update(o for o in nodes[j].output if o)
        deciding = [j for j in tail if nodes[j].op_type == "If" and nodes[j].input and nodes[j].input[0] in made]
        if not deciding or len(tail) > MAX_TAIL:
            continue
        given = [o for o in graph_outputs if o in made]
        if any(infos.get(o) is None or not infos[o].dtype or infos[o].shape is None for o in given):
            continue  # (a branch's outputs need a type and a rank)
        branches = {}
        for attr in n.attribute:
            if attr.name not in ("then_branch", "else_branch"):
                continue
            suffix = f"~{attr.name.split('_')[0]}"
            body = onnx.GraphProto()
            body.CopyFrom(attr.g)
            copied = [onnx.NodeProto.FromString(nodes[j].SerializeToString()) for j in tail]
            inner = _produced(body) | {o for c in copied for o in c.output if o} | \
                {t for c in copied for sub in subgraphs(c) for t in _produced(sub)}
            names = {t: t + suffix for t in inner}
            # The tail reads the If's outputs: here they are the branch's own.
            names |= {o: names.get(b.name, b.name) for o, b in zip(n.output, attr.g.output) if o}
            for c in copied:
                body.node.append(c)
            del body.output[:]
            body.output.extend(helper.make_tensor_value_info(o, infos[o].dtype, list(infos[o].shape)) for o in given)
            _rename_graph(body, names, suffix)  # (its outputs, the graph outputs, with the rest)
            for c in body.node[len(attr.g.node):]:
                for sub in subgraphs(c):
                    _forget_shapes(sub)
            branches[attr.name] = body
        if len(branches) != 2:
            continue
        sunk = helper.make_node("If", [n.input[0]], given, name=n.name or f"{outs[0]}~if",
                                then_branch=branches["then_branch"], else_branch=branches["else_branch"])
        out = onnx.ModelProto()
        out.CopyFrom(model)
        kept = set(tail)
        del out.graph.node[:]
        # (last: the tail may read what nodes after the If make that do not depend on it)
        out.graph.node.extend([m for j, m in enumerate(nodes) if j != i and j not in kept] + [sunk])
        gone = made - set(given)
        live_info = [vi for vi in out.graph.value_info if vi.name not in gone]
        del out.graph.value_info[:]
        out.graph.value_info.extend(live_info)
        line = (f"If {n.name or outs[0]}: its branches give outputs of different ranks, and {len(deciding)} If(s) after "
                f"it branch on them; the {len(tail)} nodes after it run inside each branch")
        return out, (line,)
    return model, ()


def stitch_bodies(model: onnx.ModelProto, infos: Mapping[str, TensorInfo], dim_values: Mapping[str, int],
                  optimize: Optimizer) -> Bodies:
    """Every body of `model`'s main graph optimized by `optimize` (nested bodies by its own
    recursion), stitched bodies in place; first, the tails that an If decides are copied into
    its branches (`sink_tails`)."""
    model, sunk = sink_tails(model, infos)
    if sunk:
        infos = infer(model)[1]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rewrites: list[str] = list(sunk)
    refusals: list[str] = []
    bodies: dict[str, dict[str, onnx.GraphProto]] = {}
    functions: dict[tuple[str, str, str], onnx.FunctionProto] = {}
    before = after = 0
    for node in out.graph.node:
        for attr in node.attribute:
            if node.op_type not in BODIES or attr.name not in BODIES[node.op_type] or not attr.HasField("g"):
                continue
            where = f"{node.op_type} {node.name or node.output[0]}: {attr.name}"
            if _compute_nodes(attr.g) < MIN_NODES:
                continue
            m = body_model(attr.g, node, out, infos)
            if isinstance(m, str):
                refusals.append(f"{where}: left as it is: {m}")
                continue
            named = {d.dim_param for vi in m.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
            sizes = {k: v for k, v in dim_values.items() if k in named}
            if node.op_type == "If" and attr.name == "then_branch":  # (it runs only where they hold)
                sizes |= {k: v for k, v in _implied_sizes(out.graph, node, infos).items() if k in named}
            held: list[logging.LogRecord] = []  # the first try's warnings, said if it stands
            try:
                with _scoped(where, held):
                    result = optimize(m, {k: [v] for k, v in sizes.items()})
                if _unrunnable(result) and sizes:
                    # A branch for another input length (silero-vad's 8 kHz branch wants 256
                    # samples where the model is planned at 512): half the sizes, once.
                    with _scoped(where):
                        again = optimize(m, {k: [max(1, v // 2)] for k, v in sizes.items()})
                    if _fused(again.model):
                        result, held = again, []
            except StitchError as e:
                refusals.append(f"{where}: left as it is: {first_line(e)}")
                continue
            finally:
                for record in held:
                    logging.getLogger(record.name).handle(record)
            stitched = result.model
            fused = _fused(stitched)
            if not fused:
                dropped = result.report.dropped
                why = (f"its {len(dropped)} group(s) left to ONNX Runtime: {dropped[0]['reason']}" if dropped
                       else result.report.plan.message or "no group pays")
                refusals.append(f"{where}: nothing fused ({why})")
                continue
            prefix = f"{(node.name or node.output[0]).replace('/', '_')}.{attr.name}."
            stitched = _renamed(stitched, prefix)
            g = onnx.GraphProto()
            g.CopyFrom(stitched.graph)
            formal = [i.name for i in attr.g.input]
            keep = [vi for vi in g.input if vi.name in formal]
            del g.input[:]
            g.input.extend(sorted(keep, key=lambda vi: formal.index(vi.name)))
            g.name = attr.g.name
            _unname_dims(g)
            lent = {t.name for t in m.graph.initializer} - {t.name for t in attr.g.initializer}
            kept = [t for t in g.initializer if t.name not in lent]
            del g.initializer[:]
            g.initializer.extend(kept)
            attr.g.CopyFrom(g)
            bodies.setdefault(node.output[0], {})[attr.name] = g
            for f in stitched.functions:
                if f.domain == DOMAIN:
                    functions[(f.domain, f.name, f.overload)] = f
            ver = result.report.verification
            left = len(result.report.dropped)
            p = result.report.plan
            before += p.kernels_before
            after += p.kernels_after
            rewrites.append(f"{where}: {fused} fused kernel(s), {p.kernels_before} → {p.kernels_after} kernels a run"
                            + (f", {left} left to ONNX Runtime by its verification" if left else "")
                            + f" ({ver.summary() if ver else 'not verified'})")
    if functions:
        _add_functions(out, functions.values())
        _drop_unread_constants(out.graph)
    return Bodies(out, tuple(rewrites), tuple(refusals), bodies, tuple(functions.values()), before, after, bool(sunk))


# Loggers whose warnings while a body is optimized are about that body.
_BODY_LOGGERS = ("onnxstitch.pipeline", "onnxstitch.measure", "onnxstitch.verify")


class _Where(logging.Filter):
    """Prefixes a record with the body it is about; a hint to pass --shape, which sizes the
    model's inputs, not a branch's, names the branch's own sizes instead. With `held`, records
    are kept there instead of logged (the caller logs them if they still hold)."""

    def __init__(self, where: str, held: list[logging.LogRecord] | None = None) -> None:
        super().__init__()
        self.where, self.held = where, held

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage().replace(
            SIZE_HINT,
            "this body may run only at other sizes (a branch for another input length)")
        record.msg, record.args = f"{self.where}: {text}", ()
        if self.held is not None:
            self.held.append(record)
            return False
        return True


@contextmanager
def _scoped(where: str, held: list[logging.LogRecord] | None = None) -> Iterator[None]:
    """Warnings logged while the body at `where` is optimized name it (kept in `held`, where
    given, instead of logged)."""
    f = _Where(where, held)
    loggers = [logging.getLogger(n) for n in _BODY_LOGGERS]
    for lg in loggers:
        lg.filters.insert(0, f)  # before any enclosing body's: "outer: inner: message"
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(f)


def _fused(model: onnx.ModelProto) -> int:
    """FusedKernel nodes in `model`, in its bodies too."""
    return sum(1 for n in _all_nodes(model.graph) if n.op_type == OP_TYPE and n.domain == DOMAIN)


def _unrunnable(result: Any) -> bool:
    """Whether every group of a body was left to ONNX Runtime because verification could not
    run the body at its planning sizes."""
    dropped = result.report.dropped
    return bool(dropped) and not _fused(result.model) and \
        all("cannot run the original model" in d["reason"] for d in dropped)


def _unname_dims(g: onnx.GraphProto) -> None:
    """The body's value_info with its symbolic dims unnamed (their sizes unknown, as ONNX Runtime
    takes them): inference names a body's dims after whichever of several equal outer symbols it
    met first, which varies from run to run, so named they made two optimizations of one model
    write different bytes."""
    for v in g.value_info:
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.ClearField("dim_param")


def _drop_unread_constants(g: onnx.GraphProto) -> None:
    """Drop the initializers that only the fused-away body nodes read (a Split's sizes)."""
    read = {t for n in g.node for t in reads(n)} | {o.name for o in g.output} | {i.name for i in g.input}
    kept = [t for t in g.initializer if t.name in read or is_stub(t)]
    if len(kept) < len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(kept)


def _all_nodes(g: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `g` and of the graphs its nodes hold, at any depth."""
    for n in g.node:
        yield n
        for sub in subgraphs(n):
            yield from _all_nodes(sub)


def _add_functions(model: onnx.ModelProto, functions) -> None:
    have = {(f.domain, f.name, f.overload) for f in model.functions}
    model.functions.extend(f for f in functions if (f.domain, f.name, f.overload) not in have)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    model.ir_version = max(model.ir_version, IR_VERSION)


def apply(model: onnx.ModelProto, done: Bodies) -> onnx.ModelProto:
    """Another copy of the model (as loaded, before the stages' own rewrites) with the same
    bodies stitched: the nodes are found by their first output."""
    if not done.bodies:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        new = done.bodies.get(node.output[0]) if node.output else None
        for attr in node.attribute if new else ():
            if attr.name in new:
                attr.g.CopyFrom(new[attr.name])
    _add_functions(out, done.functions)
    _drop_unread_constants(out.graph)
    return out
