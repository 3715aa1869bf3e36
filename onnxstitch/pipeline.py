"""The pipeline as a short list of named stages: load → shapes → simplify → merge → normalize →
graph → attention → epilogues → plan → pack → codegen → compile → rewrite → measure → validate →
verify → gate. `optimize` is the library entry point; the CLI wraps it."""
from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
import logging
import os
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import onnx

from . import compile as nvrtc_compile, graph as graph_mod, load, normalize as normalize_mod
from . import pack as pack_mod, rewrite, siblings, simplify as simplify_mod
from . import bodies as bodies_mod, cost as cost_mod, measure as measure_mod, ortio, probe as probe_mod, verify as verify_mod
from . import shapes as shapes_mod, sizes as sizes_mod
from .cost import CostModel
from .explain.outline import GraphOutline, outline
from .errors import BadInputError, StitchError, first_line
from .plan import Group, Plan, make_plan, unfused_totals
from .schemes import registry, source as source_mod
from .weights import Weights

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageNotes:
    """What one stage rewrote or matched (one line each) and what it refused, with why."""

    rewrites: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    # Figures of the stage's own, by name (bodies: kernels before and after, summed over bodies).
    figures: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """What `optimize` did, in numbers (printed by the CLI, written by --report)."""

    plan: Plan
    nodes_before: int
    nodes_after: int
    archs: tuple[str, ...]
    dim_values: Mapping[str, int]
    stage_seconds: Mapping[str, float]
    kernels: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)
    verification: verify_mod.Verification | None = None
    # Groups verification refused and left to ONNX Runtime: {"group", "reason"} each.
    dropped: tuple[Mapping[str, str], ...] = field(default_factory=tuple)
    # What each rewriting or matching stage did and refused, by stage (STAGE_NOTES): exact
    # rewrites of exported forms (simplify), group norms (normalize), sibling GEMMs (merge),
    # attention chains, GEMM and convolution epilogues.
    notes: Mapping[str, StageNotes] = field(default_factory=dict)
    # The planned graph's nodes and edges (the groups' node ids index it): for plan pictures.
    graph: GraphOutline | None = None
    # Each group's predicted and measured costs (measure.py), the written model timed against
    # stock ORT, and the groups given back to ONNX Runtime because they did not pay.
    costs: tuple[measure_mod.GroupCost, ...] = ()
    timing: measure_mod.ModelTiming | None = None
    given_back: tuple[Mapping[str, str], ...] = ()
    gate_note: str = ""
    # Where the plan was made again at measured prices: the plans timed whole, and which one was
    # written (pipeline._chosen_plan).
    plan_choice: str = ""

    def _notes(self, stage: str) -> StageNotes:
        return self.notes.get(stage, StageNotes())

    # Each stage's notes by the names the report has always had.
    simplified = property(lambda self: self._notes("simplify").rewrites)
    normalized = property(lambda self: self._notes("normalize").rewrites)
    normalize_refusals = property(lambda self: self._notes("normalize").refusals)
    merged = property(lambda self: self._notes("merge").rewrites)
    merge_refusals = property(lambda self: self._notes("merge").refusals)
    attention = property(lambda self: self._notes("attention").rewrites)
    attention_refusals = property(lambda self: self._notes("attention").refusals)
    epilogues = property(lambda self: self._notes("epilogues").rewrites)
    epilogue_refusals = property(lambda self: self._notes("epilogues").refusals)
    conv_epilogues = property(lambda self: self._notes("conv epilogues").rewrites)
    conv_refusals = property(lambda self: self._notes("conv epilogues").refusals)

    @property
    def fused_groups(self) -> int:
        """Groups fused in the written model."""
        left = {d["group"] for d in self.dropped} | {d["group"] for d in self.given_back}
        return sum(g.name not in left for g in self.plan.groups)

    @property
    def wall_seconds(self) -> float:
        return sum(self.stage_seconds.values())

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form of the report. Each plan group carries its kernel (scheme, launch
        shape) and the refusals met growing it (why a neighbouring node was left out)."""
        plan = self.plan.to_json()
        kernels = {k["group"]: k for k in self.kernels}
        dropped = {d["group"]: d["reason"] for d in self.dropped}
        back = {d["group"]: d["reason"] for d in self.given_back}
        costs = {c.group: c.to_json() for c in self.costs}
        for grp in plan["groups"]:
            if grp["name"] in back:
                grp["given_back"] = back[grp["name"]]
            if grp["name"] in costs:
                grp["measured"] = costs[grp["name"]]
            parts = [set(p) for p in grp.get("packed_from", [grp["nodes"]])]
            grp["kernel"] = kernels.get(grp["name"])
            grp["left_out"] = [r for r in plan["rejections"] if set(r["group"]) in parts]
            if grp["name"] in dropped:
                grp["dropped_by_verification"] = dropped[grp["name"]]
        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "archs": list(self.archs),
            "symbolic_dims_for_cost": dict(self.dim_values),
            "default_symbolic_dim": shapes_mod.DEFAULT_SYMBOLIC_DIM,
            "stage_seconds": {k: round(v, 4) for k, v in self.stage_seconds.items()},
            "wall_seconds": round(self.wall_seconds, 4),
            "kernels": list(self.kernels),
            "verification": self.verification.to_json() if self.verification else None,
            "dropped_groups": list(self.dropped),
            "bodies": {"rewrites": list(self._notes("bodies").rewrites),
                       "refusals": list(self._notes("bodies").refusals), **self._notes("bodies").figures},
            "simplify": {"rewrites": list(self.simplified)},
            "normalize": {"rewrites": list(self.normalized), "refusals": list(self.normalize_refusals)},
            "merge": {"rewrites": list(self.merged), "refusals": list(self.merge_refusals)},
            "attention": {"kernels": list(self.attention), "refusals": list(self.attention_refusals)},
            "epilogues": {"gemms": list(self.epilogues), "refusals": list(self.epilogue_refusals),
                          "convs": list(self.conv_epilogues), "conv_refusals": list(self.conv_refusals)},
            "plan": plan,
            "graph": self.graph.to_json() if self.graph else None,
            "measured": {"groups": [c.to_json() for c in self.costs], "summary": measure_mod.summary(self.costs),
                         "model": self.timing.to_json() if self.timing else None, "note": self.gate_note,
                         "plan_choice": self.plan_choice,
                         "given_back": list(self.given_back),
                         "planned_again": list(self._notes("measure").rewrites)},
        }


@dataclass(frozen=True)
class OptimizeResult:
    """The stitched model and the report of how it was made. The model is held as its graph
    (`graph_model`, large weights as stubs) and their payloads (`weights`): `model` puts them
    together on first use; `save` writes them without a whole copy in memory."""

    graph_model: onnx.ModelProto
    report: Report
    weights: Weights = field(default_factory=Weights)

    @cached_property
    def model(self) -> onnx.ModelProto:
        """The stitched model, weights inside."""
        return self.weights.attach(self.graph_model)

    def save(self, path: str | os.PathLike) -> None:
        """Write the stitched model to `path`, its weights in `<name>.data` beside it when the
        whole would pass protobuf's 2 GiB limit."""
        external = self.graph_model.ByteSize() + self.weights.bytes_in(self.graph_model) > load.PROTOBUF_LIMIT
        self.weights.save(self.graph_model, path, external)


def optimize(model: onnx.ModelProto | str | os.PathLike, options: "Options | None" = None, *,
             progress: Progress | None = None, **settings: Any) -> OptimizeResult:
    """Fuse the memory-bound parts of `model` (a ModelProto or a path) into generated CUDA
    kernels, as `options` says (Options; its fields may also be given as keywords, which
    override it: `optimize(path, shapes={"batch": [8]}, verify=False)`). `progress` hears each
    stage's name as it starts. Raises BadInputError for unusable input (a wrong size, a custom-op
    library that does not load) and CompileError when NVRTC rejects a kernel."""
    opts = dataclasses.replace(options or Options(), **settings)
    if opts.values and isinstance(model, onnx.ModelProto):
        sizes_mod.check_values(model, opts.values)
    if opts.custom_op_libraries:
        opts = dataclasses.replace(opts, custom_op_libraries=ortio.custom_op_libraries(opts.custom_op_libraries))
    stage = _Stages(progress)
    def body_optimizer(body: onnx.ModelProto, shapes: Mapping[str, Any]) -> "OptimizeResult":
        # A body is a model of its own: planned, verified (both branches of an If, each on its
        # own inputs) and written; the whole model is timed by the outer gate.
        names = {i.name for i in body.graph.input}
        values = {k: v for k, v in opts.values.items() if k in names}
        return optimize(body, dataclasses.replace(opts, shapes=shapes, values=values, gate=False, costs_file=None),
                        progress=progress)

    given = _prepare(model, opts.shapes, stage, opts.custom_op_libraries,
                     body_optimizer if opts.control_flow else None)
    ahead = nvrtc_compile.Ahead(opts.archs)
    try:
        return _optimized(model, given, opts, stage, ahead)
    finally:
        ahead.close()


def _optimized(model: onnx.ModelProto | str | os.PathLike, given: _Given, opts: Options, stage: _Stages,
               ahead: nvrtc_compile.Ahead) -> OptimizeResult:
    """optimize after load → shapes → bodies → simplify: plan (again with measured costs),
    codegen, compile (taking what `ahead` compiled while the plan was made), measure, write."""
    meas = _Measuring.of(opts)
    measured: dict[frozenset[str], float] = {}
    replanned: list[str] = []
    graphs: dict[frozenset[str], _Graphed] = {}  # what replanning at measured prices reuses
    first: _Round | None = None  # the first plan, which the last is timed against
    for round_ in range(REPLAN_ROUNDS + 1):
        # Planned again with what the GPU measured of the groups that did not pay: the plan may
        # find other groups over their nodes that do, which are measured in turn.
        costed = dataclasses.replace(opts, cost=dataclasses.replace(opts.cost, measured=dict(measured)))
        planned = _plan(given, costed if measured else opts, stage, graphs, ahead)
        g, plan = planned.graph, planned.plan
        sources = stage("codegen", lambda g=g, plan=plan: [
            source_mod.named_by_code(generate_kernel(g, source_mod.PLACEHOLDER, grp)) for grp in plan.groups])
        kernels = stage("compile", lambda sources=sources: nvrtc_compile.compile_all(sources, opts.archs, ahead))
        built = list(zip(plan.groups, kernels))
        costs = _measured(given, planned, built, opts, stage, meas)
        first = first or _Round(planned, built, costs)
        giving_back = measure_mod.not_paying(costs, _linked(built))
        slow = [c for c in costs if c.resolved and c.group in giving_back]
        learned = _measured_prices(g, plan, slow, opts.cost)
        if not slow or round_ == REPLAN_ROUNDS or learned.keys() <= measured.keys() or not _worth_replanning(slow, costs):
            break
        measured |= learned
        replanned += [f"{c.group}: planned again at its measured {c.ours_us:.1f} µs against ORT's {c.stock_us:.1f} µs"
                      for c in slow]
    choice = ""
    if replanned and first is not None:
        chosen, choice = _chosen_plan(given, first, _Round(planned, built, costs), opts, stage, meas)
        planned, built, costs = chosen.planned, chosen.built, chosen.costs
        g, plan = planned.graph, planned.plan
    try:
        written = _written(given, planned, built, opts, stage, costs, meas)
    except BadInputError as e:  # verification found the model itself unloadable: name the file
        if isinstance(model, (str, os.PathLike)):
            raise BadInputError(f"{model}: {e}") from e
        raise
    kinfo = tuple({"group": grp.name, "kernel": k.source.name,
                   **registry.get(k.source.scheme).describe(g, grp, k.source),
                   "input_kinds": ["full" if x == source_mod.FULL else "broadcast" for x in k.source.input_kinds],
                   "image_bytes": sum(len(i) for i in k.images) + len(k.ptx)}
                  for grp, k in written.built)
    merged, normal = planned.merged, planned.normal
    # Nodes counted alike before and after: Constant nodes are data (initializers once loaded),
    # and a model that goes out unchanged keeps its own.
    notes = {"bodies": given.bodies or StageNotes(), "measure": StageNotes(tuple(replanned)),
             "simplify": StageNotes(given.simple.rewrites),
             "normalize": StageNotes(normal.rewrites, normal.refusals),
             "merge": StageNotes(tuple(x.describe() for x in merged.merges), merged.refusals + planned.undone),
             **{m.stage: StageNotes(tuple(x.describe() for x in planned.found[name].matches),
                                    planned.found[name].refusals)
                for name, m in registry.matchers() if name in planned.found}}
    report = Report(plan=_kernels_written(g, plan, written.model), nodes_before=_compute_nodes(given.model),
                    nodes_after=_compute_nodes(written.model),
                    archs=next((k.archs for k in kernels if k.images), opts.archs), dim_values=g.dim_values,
                    stage_seconds=stage.times, kernels=kinfo, verification=written.verification,
                    dropped=written.dropped, notes=notes, graph=outline(g, planned.normal.model), costs=written.costs,
                    timing=written.timing, given_back=written.given_back, gate_note=written.gate_note,
                    plan_choice=choice)
    return OptimizeResult(written.model, report, given.weights)


@dataclass(frozen=True)
class Options:
    """What `optimize` is asked to do. Every field has its default; the CLI's options map onto
    them one to one."""

    # Planning sizes, read as sizes.py says: graph input → dims, or symbolic dim → [value]; the
    # stitched model keeps its dynamic dims.
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    archs: tuple[str, ...] = nvrtc_compile.DEFAULT_ARCHS  # cubins embedded (plus PTX for the lowest)
    cost: CostModel = field(default_factory=CostModel)
    time_limit_s: float = 30.0  # the ILP solver's limit
    # Run the stitched model against the original on seeded random inputs (on the GPU when
    # there is one); a group whose outputs differ is left to ONNX Runtime (the report's
    # `dropped`), or with `strict` the first mismatch raises VerifyError naming the group.
    verify: bool = True
    seed: int = 0
    strict: bool = False
    # Reductions over a run of consecutive axes, Softmax, LogSoftmax, LayerNormalization,
    # InstanceNormalization, ArgMax/ArgMin and global pools stitched with their neighbours.
    reductions: bool = True
    pack: bool = True  # independent elementwise groups over one iteration space in one kernel
    merge: bool = True  # sibling MatMuls by constant weights as one GEMM (siblings.py)
    # Each attention core — MatMul → scale → masks → Softmax → MatMul [→ Transpose] — as one
    # kernel on tensor cores (with `reductions`; schemes/attention).
    attention: bool = True
    # MatMul/Gemm and Conv with their bias, activation and residual as one cuBLASLt call or cuDNN
    # graph (schemes/gemm, schemes/conv), where the plan (and, on a GPU, the measured costs) say
    # they pay.
    epilogues: bool = True
    # GEMMs generated with their epilogue inside (CUTLASS, built by nvcc; schemes/gemm/generated.py):
    # "auto" where this machine's GPU runs them (compute capability 9.0), "on" wherever nvcc
    # and CUTLASS are here (a plan for a Hopper GPU made elsewhere), "all" as "on" with one beside
    # every cuBLASLt GEMM too (the faster kept, as timed), "off".
    generated_gemms: str = "auto"
    # Custom-op libraries the model's own ops need (onnxruntime-extensions, the user's own),
    # registered in every session verification opens.
    custom_op_libraries: tuple[str, ...] = ()
    # Seconds verification may spend looking for a group to leave to ORT when the outputs differ
    # and no group is wrong on its own inputs; past it the suspects left all go to ORT.
    verify_budget_s: float = 120.0
    # Measured costs (measure.py): where a GPU is present, each group is timed against the
    # nodes it replaces and the whole model against stock ORT; what does not pay goes back to
    # ONNX Runtime. Off: the plan as planned.
    gate: bool = True
    # A cost file to import before planning (figures measured on the target GPU) and to write
    # the figures to after.
    costs_file: str | None = None
    # Seconds the groups may be timed for when their figures are not cached yet; the groups the
    # cost model is surest of are left unmeasured first.
    measure_budget_s: float = 10.0
    # Fuse inside the bodies of If, Loop and Scan, each body planned as a model of its own.
    control_flow: bool = True
    # Inputs that take one value wherever onnxstitch makes inputs (verification, timing): a
    # sample rate or a flag a model branches on, where random values would not run it.
    values: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:  # library callers pass lists and None alike
        object.__setattr__(self, "shapes", dict(self.shapes or {}))
        object.__setattr__(self, "values", dict(self.values or {}))
        object.__setattr__(self, "archs", tuple(self.archs))
        if self.generated_gemms not in ("auto", "on", "all", "off"):
            raise BadInputError(f"generated GEMMs: auto, on, all or off, not {self.generated_gemms!r}")
        object.__setattr__(self, "custom_op_libraries", tuple(str(x) for x in self.custom_op_libraries))

    @property
    def clusters(self) -> bool:
        """Split rows need thread-block clusters: planned only when an sm_90+ image is built."""
        return any(nvrtc_compile.arch_number(a) >= 90 for a in self.archs)


class _Stages:
    """Runs stages, announcing each (`progress`) and adding up its seconds (the report's
    stage_seconds; verification may run some stages several times)."""

    def __init__(self, progress: Progress | None) -> None:
        self.say = progress or (lambda _msg: None)
        self.times: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        self.say(name)
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        self.times[name] = self.times.get(name, 0.0) + took
        log.info("stage %s took %.2f s%s", name, took, _memory())
        return out


def _memory() -> str:
    """The process's resident memory now, for -v's stage lines (Linux; '' elsewhere): where
    optimize's peak grows, anonymous (our arrays, ORT's sessions) apart from file-backed (mapped
    libraries: CUDA's are large)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                  if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
    except (OSError, ValueError):
        return ""
    gb = {k: v / 2**20 for k, v in kb.items()}
    return (f"; rss {gb.get('VmRSS', 0):.2f} GB (anon {gb.get('RssAnon', 0):.2f}, "
            f"file {gb.get('RssFile', 0):.2f}), peak {gb.get('VmHWM', 0):.2f} GB")


@dataclass(frozen=True)
class _Given:
    """The model as given, after load → shapes → simplify."""

    loaded: onnx.ModelProto  # as read, large weights as stubs: what goes out when nothing is fused
    model: onnx.ModelProto  # constants as initializers, dynamic dims named
    tensors: Mapping[str, shapes_mod.TensorInfo]
    dim_values: Mapping[str, int]
    weights: Weights
    refusal: str | None  # why the model is left unchanged (an opset the project does not know)
    simple: simplify_mod.Simplified
    # The model before its If/Loop/Scan bodies were stitched (None when none were): what the
    # written model's outputs are verified against, and what the bodies stage did.
    original: onnx.ModelProto | None = None
    bodies: "StageNotes" = None  # type: ignore[assignment]
    path: str | None = None  # the file `loaded` was read from, where `loaded` is that file's model
    # The main graph as given and its facts, where Ifs were inlined before the bodies stage (else
    # None: `model` is it), and the nodes those Ifs ran: what "before" counts.
    counted: tuple[onnx.ModelProto, Mapping[str, shapes_mod.TensorInfo]] | None = None
    inlined_before: int = 0


def _as_given(given: _Given) -> onnx.ModelProto | None:
    """What the written model is verified against where the bodies stage or the Ifs inlined
    before it changed the main graph: the model before either (a failure to load it is then the
    user's model's, not a rewrite of ours), else None."""
    return given.counted[0] if given.counted is not None else given.original


def _prepare(model: onnx.ModelProto | str | os.PathLike, shapes: Mapping[str, Sequence[int]],
             stage: _Stages, libraries: Sequence[str] = (), body_optimizer: bodies_mod.Optimizer | None = None) -> _Given:
    """load → shapes → bodies → simplify. With custom-op `libraries`, the shapes of custom ops'
    outputs that inference cannot know are read off runs of the model (probe.py); with a
    `body_optimizer`, the bodies of If, Loop and Scan nodes are stitched (bodies.py)."""
    loaded, weights = stage("load", lambda: load.load_detached(model))
    m = load.constants_to_initializers(loaded)
    m, dim_values = sizes_mod.resolve_shapes(m, shapes)
    refusal = graph_mod.opset_refusal(m)
    if refusal:
        log.warning("%s: the model is left unchanged", refusal)
    _, infos = stage("shapes", lambda: shapes_mod.infer(m))
    pending = probe_mod.custom_outputs(m, infos) if libraries else []
    if pending:
        probed = stage("shapes", lambda: probe_mod.probe(m, pending, dim_values, libraries, weights))
        if probed.shapes:
            m = probe_mod.with_shapes(m, probed)
            dim_values |= probed.dim_values
            _, infos = stage("shapes", lambda: shapes_mod.infer(m))
    dim_values |= stage("shapes", lambda: shapes_mod.derived_dims(m, infos, dim_values))
    done, original, counted, inlined_before = None, None, None, 0
    if refusal is None and body_optimizer is not None and bodies_mod.has_bodies(m):
        # Ifs decided by construction are their branches before bodies are planned: a tail copied
        # into an If's branches (bodies.sink_tails) must not carry an If whose condition is a
        # constant only the outer graph can see (silero-vad's state check).
        has_if = any(n.op_type == "If" for n in m.graph.node)  # (only Ifs are inlined)
        pre = stage("simplify", lambda: simplify_mod.simplify(m, infos)) if has_if else None
        if pre is not None and pre.inlined_nodes:
            counted, inlined_before = (m, infos), pre.inlined_nodes
            m, infos = pre.model, pre.tensors
        done = stage("bodies", lambda: bodies_mod.stitch_bodies(m, infos, dim_values, body_optimizer))
        if done.bodies:
            original, m, loaded = m, done.model, bodies_mod.apply(loaded, done)
            if done.sunk:  # (the main graph changed: its tensors' facts with it)
                _, infos = stage("shapes", lambda: shapes_mod.infer(m))
    simple = simplify_mod.Simplified(m, infos)
    if refusal is None:
        simple = stage("simplify", lambda: simplify_mod.simplify(m, infos))
    notes = StageNotes(done.rewrites, done.refusals, {"kernels_before": done.kernels_before,
                                                      "kernels_after": done.kernels_after}) if done else StageNotes()
    path = str(model) if isinstance(model, (str, os.PathLike)) and original is None else None
    return _Given(loaded, m, infos, dim_values, weights, refusal, simple, original, notes, path, counted, inlined_before)


@dataclass(frozen=True)
class _Planned:
    """merge → normalize → graph → the schemes' matchers → plan → pack, and what was left apart."""

    merged: siblings.Merged
    normal: normalize_mod.Normalized
    graph: graph_mod.FusionGraph
    plan: Plan
    # Each matcher scheme's matches as the plan took them (the rest refused with why), by scheme.
    found: Mapping[str, Any] = field(default_factory=dict)
    undone: tuple[str, ...] = ()  # sibling merges undone, with why


@dataclass(frozen=True)
class _Graphed:
    """merge → normalize → graph → the schemes' matchers, for one set of siblings left apart:
    nothing here depends on the prices, so planning again at measured prices starts after it."""

    merged: siblings.Merged
    normal: normalize_mod.Normalized
    graph: graph_mod.FusionGraph
    matchers: tuple[tuple[str, Any], ...]
    found: Mapping[str, Any]


def _graphed(given: _Given, opts: Options, stage: _Stages, skip: frozenset[str],
             ahead: nvrtc_compile.Ahead | None = None) -> _Graphed:
    simple, refusal = given.simple, given.refusal
    merged = siblings.Merged(simple.model, simple.tensors)
    if refusal is None and opts.merge:
        merged = stage("merge", lambda: siblings.merge(simple.model, simple.tensors, skip, given.weights))
    normal = normalize_mod.Normalized(merged.model, merged.tensors)
    if refusal is None and opts.reductions:
        normal = stage("normalize", lambda: normalize_mod.normalize(merged.model, merged.tensors))
    # Dims the passes' own inference named anew (onnxruntime numbers its Flatten_… and unk__…
    # names per run) get planning values too, as the loaded model's did: else they are planned
    # at DEFAULT_SYMBOLIC_DIM, and a causal mask sized by them cannot be evaluated (Marian's).
    dims = dict(given.dim_values)
    if normal.model is not given.model:
        dims |= stage("shapes", lambda: shapes_mod.derived_dims(normal.model, normal.tensors, dims))
    g = stage("graph", lambda: graph_mod.build(normal.model, normal.tensors, dims, opts.reductions, opts.clusters))
    matchers = tuple((name, m) for name, m in registry.matchers() if refusal is None and m.enabled(opts))
    found = {}
    for name, m in matchers:
        found[name] = stage(m.stage, lambda m=m: m.find(g, given.weights, opts))
        if ahead is not None and ahead.enabled:  # its kernels compile beside the other matchers and the plan
            ahead.submit(_candidate_sources(g, opts, m, found[name]))
    return _Graphed(merged, normal, g, matchers, found)


def _candidate_sources(g: graph_mod.FusionGraph, opts: Options, m, found) -> list[source_mod.KernelSource]:
    """The kernel sources of a matcher's candidates, as codegen names them (by their code), for
    compiling ahead; a candidate whose code cannot be made here is left to codegen, which
    reports it if the plan takes it."""
    out = []
    for k, x in enumerate(found.matches):
        try:
            grp = m.group_of(g, opts.cost, f"{m.prefix}{k}", x)
            out.append(source_mod.named_by_code(generate_kernel(g, source_mod.PLACEHOLDER, grp)))
        except Exception as e:  # (ahead of time only: the compile stage does the real work)
            log.debug("not compiled ahead: %s: %s", getattr(m, "stage", "?"), first_line(e))
    return out


def _planned_once(given: _Given, opts: Options, stage: _Stages, skip: frozenset[str],
                  graphs: dict[frozenset[str], _Graphed], ahead: nvrtc_compile.Ahead | None = None) -> _Planned:
    """One pass of merge → normalize → graph → matchers → plan → pack, siblings into `skip` left
    apart (the passes before the plan taken from `graphs` where they ran already). Every scheme
    that finds its own groups (schemes/registry.matchers) proposes them as candidates of the one
    program, against the rows and elementwise groups over the same nodes and ORT's own kernels;
    after the plan each may settle it (conv: NHWC between its groups) and have it planned again
    without some of its matches."""
    if skip not in graphs:
        graphs[skip] = _graphed(given, opts, stage, skip, ahead)
    merged, normal, g, matchers = graphs[skip].merged, graphs[skip].normal, graphs[skip].graph, graphs[skip].matchers
    found = dict(graphs[skip].found)
    while True:
        ours = [m.group_of(g, opts.cost, f"{m.prefix}{k}", x) for name, m in matchers
                for k, x in enumerate(found[name].matches)]
        plan = stage("plan", lambda ours=ours: make_plan(g, opts.cost, time_limit_s=opts.time_limit_s, proposed=ours))
        if opts.pack:
            plan = stage("pack", lambda plan=plan: pack_mod.pack(g, plan, opts.cost))
        again = False
        for name, m in matchers:
            plan, fewer = m.settle(g, opts.cost, plan, found[name])
            if fewer is not None:
                found[name], again = fewer, True
        if not again:
            break
    return _Planned(merged, normal, g, plan, {name: m.chosen(found[name], plan) for name, m in matchers})


def _plan(given: _Given, opts: Options, stage: _Stages, graphs: dict[frozenset[str], _Graphed],
          ahead: nvrtc_compile.Ahead | None = None) -> _Planned:
    """The plan, planned again without the merged siblings whose Slice it left to ORT, its
    "before" figures those of the model as given. `graphs`: the passes before the plan already
    run, by siblings left apart (filled here)."""
    skip: frozenset[str] = frozenset()
    undone: list[str] = []
    while True:
        planned = _planned_once(given, opts, stage, skip, graphs, ahead)
        # A merged sibling pays only when its Slice folds into a kernel; otherwise ONNX Runtime
        # would copy its columns apart again, so it is left apart and the model planned again.
        g, plan = planned.graph, planned.plan
        grouped = {g.nodes[i].name for grp in plan.groups for i in grp.nodes}
        unfolded = [(x, t) for x in planned.merged.merges for t in x.outputs if x.slice_node(t) not in grouped]
        if not unfolded:
            break
        undone += [f"MatMul into {t} (of '{x.activation}'): left apart, the plan left its Slice to ONNX Runtime"
                   for x, t in unfolded]
        if {t for _, t in unfolded} <= skip:  # (planned apart already: nothing new to leave apart)
            break
        skip |= {t for _, t in unfolded}
    if planned.normal.model is not given.model or given.counted is not None:
        # "Before" is the model as given, not its rewritten form (k MatMuls, not one and k
        # Slices; a group norm's Reshapes as they were), sized as the plan is: with the facts of
        # the simplified model's inference where it has the tensor (PP-OCRv5's recognizer
        # reshapes by an Identity of a constant, unknown until simplify reads the constant: its
        # five dims at DEFAULT_SYMBOLIC_DIM made "before" 68 GB and 26.8 ms, a 22x gain).
        model, facts = given.counted or (given.model, given.tensors)
        before = graph_mod.build(model, {**facts, **given.tensors, **given.simple.tensors},
                                 {**given.dim_values, **g.dim_values}, opts.reductions, opts.clusters)
        totals = unfused_totals(before, opts.cost)
        totals["kernels_before"] += given.simple.inlined_nodes + given.inlined_before  # (what inlined Ifs ran)
        plan = dataclasses.replace(plan, **totals)
    return dataclasses.replace(planned, plan=plan, undone=tuple(undone))


@dataclass(frozen=True)
class _Written:
    """The stitched model as written, with the groups it fuses, those verification dropped, and
    what was measured: each group's costs, the whole model against stock ORT, the groups given
    back to ONNX Runtime because they did not pay."""

    model: onnx.ModelProto
    verification: verify_mod.Verification | None
    built: list  # (Group, CompiledKernel) fused in `model`
    dropped: tuple[dict[str, str], ...]
    costs: tuple[measure_mod.GroupCost, ...] = ()
    timing: measure_mod.ModelTiming | None = None
    given_back: tuple[dict[str, str], ...] = ()
    gate_note: str = ""  # why the whole model was not timed, where it was not


# Rounds of planning again with measured costs after the first plan (each measures the groups
# that are new to it).
REPLAN_ROUNDS = 2
# ... only where the groups that did not pay lose at least this share of the fused nodes' time:
# below it, giving them back is as good (BERT-base planned twice more, 2 s cold on an H200, for
# 24 LayerNorm groups 0.5 µs slower than ORT's, 0.3% of its time).
REPLAN_MIN_LOSS = 0.01


@dataclass(frozen=True)
class _Round:
    """One round of planning: the plan, its groups as built, and their measured costs."""

    planned: "_Planned"
    built: list  # (Group, CompiledKernel)
    costs: tuple[measure_mod.GroupCost, ...]


# The first plan replaces the one made again at measured prices only where the whole model runs
# at least this much faster with it (else the replanned one, whose groups each pay, stands).
CHOICE_MARGIN = 0.01
# ... and only for models of at most this many bytes of weights: each plan timed is a model
# written out and loaded (a 2 GB decoder took 13 s to write on the CPU machine).
CHOICE_MAX_WEIGHTS = 1 << 30


def _chosen_plan(given: _Given, first: _Round, last: _Round, opts: Options, stage: _Stages,
                 meas: _Measuring) -> tuple[_Round, str]:
    """Which plan to write, timed as whole models in the same rounds on this GPU: the plan made
    again at measured prices (`last`), the first plan as planned, and the first with its slow
    groups given back. A group timed alone can be slower than the nodes it replaces and still
    make the model faster (BERT-base float16 on an H200: Add + Add + LayerNorm in one row kernel
    3.3 µs alone against ORT's 2.6 µs; the model 0.710 ms as planned, 0.746 ms replanned), so
    the standalone figures decide only what the whole model confirms. Returns the round to write
    (where the first plan as planned wins, its slow groups' figures marked overruled) and what
    was timed, for the report ("" where nothing could be)."""
    if meas.timer is None:
        return last, ""
    weights = given.weights.bytes_in(given.loaded)
    if weights > CHOICE_MAX_WEIGHTS:
        return last, (f"plans not timed whole: {weights / 2**30:.1f} GiB of weights, three more models to write "
                      f"and load (at most {CHOICE_MAX_WEIGHTS / 2**30:.0f} GiB)")
    slow_first = measure_mod.not_paying(first.costs, _linked(first.built))
    slow_last = measure_mod.not_paying(last.costs, _linked(last.built))
    candidates = {"replanned": (last, [b for b in last.built if b[0].name not in slow_last]),
                  "as planned": (first, first.built),
                  "given back": (first, [b for b in first.built if b[0].name not in slow_first])}
    models = {label: _rewritten(given, r.planned, subset, _linked(r.built), stage)
              for label, (r, subset) in candidates.items()}
    timing, why = _gate_timing(given, models.pop("replanned"), opts, stage, alternatives=models)
    if timing is None:
        return last, f"plans not timed whole: {why}"
    ms = {"replanned": timing.stitched_ms, **timing.alternatives_ms}
    best = min(ms, key=lambda k: ms[k])
    if ms[best] >= ms["replanned"] * (1 - CHOICE_MARGIN):
        best = "replanned"
    note = (f"plans timed whole: {', '.join(f'{k} {v:.3f} ms' for k, v in ms.items())} "
            f"(stock ORT {timing.stock_ms:.3f} ms); the plan {best} is written")
    log.info(note)
    if best == "replanned":
        return last, note
    if best == "given back":
        return first, note
    why = (f"measured slower alone, but the model ran {ms[best]:.3f} ms with it as planned against "
           f"{ms['replanned']:.3f} ms replanned")
    costs = tuple(dataclasses.replace(c, overruled=why) if c.group in slow_first else c for c in first.costs)
    return _Round(first.planned, first.built, costs), note


def _worth_replanning(slow: Sequence[measure_mod.GroupCost], costs: Sequence[measure_mod.GroupCost]) -> bool:
    """Whether the groups measured slower lose enough to plan again (REPLAN_MIN_LOSS)."""
    loss = sum(c.ours_us - c.stock_us for c in slow)  # type: ignore[operator]
    base = sum(c.stock_time_us for c in costs)
    worth = loss >= REPLAN_MIN_LOSS * base
    if not worth:
        log.info("not planned again: %d groups lose %.1f µs of %.1f µs", len(slow), loss, base)
    return worth


@dataclass(frozen=True)
class _Measuring:
    """Where one optimize's costs are measured: this machine's GPU (None without one) and the
    figures already known (the on-disk cache, with a --costs file merged in)."""

    starting: Future | None  # the timer (None without a GPU), made in a thread
    cache: measure_mod.CostCache

    @staticmethod
    def of(opts: Options) -> "_Measuring":
        """The cache now; the timer started in a thread (CUDA and ORT's libraries loaded: about
        1.8 s on an H200 host) while the plan is made and compiled, which need neither. (Started
        while the model loaded, it slowed shape inference by as much: Python imports on both.)"""
        cache = measure_mod.default_cache() if opts.gate else measure_mod.CostCache()
        if opts.costs_file and Path(opts.costs_file).is_file():
            cache.merge(Path(opts.costs_file))
        if not opts.gate:
            return _Measuring(None, cache)
        pool = ThreadPoolExecutor(1, thread_name_prefix="onnxstitch-timer")
        starting = pool.submit(measure_mod.gpu_timer)
        pool.shutdown(wait=False)  # (the task runs on; its future holds the timer)
        return _Measuring(starting, cache)

    @property
    def timer(self) -> Any:
        return self.starting.result() if self.starting is not None else None

    @property
    def active(self) -> bool:
        return self.timer is not None or bool(self.cache.entries)


def _linked(built: list) -> set[str]:
    """Groups a scheme links (conv groups sharing NHWC tensors): fused all together or not at all."""
    return set().union(*(m.linked(grp for grp, _ in built) for _, m in registry.matchers()))


def _measured(given: _Given, planned: _Planned, built: list, opts: Options, stage: _Stages,
              meas: _Measuring) -> tuple[measure_mod.GroupCost, ...]:
    """Each built group's predicted and measured costs (measure.py), where the gate is on and
    there is a GPU or measured figures."""
    if not (opts.gate and built and meas.active):
        return ()
    g = planned.graph
    stitched = _rewritten(given, planned, built, _linked(built), stage)
    stock_us = {grp.name: sum(cost_mod.node_us(g, opts.cost, i) for i in grp.nodes) for grp, _ in built}
    return stage("measure", lambda: measure_mod.measure(planned.normal.model, stitched, g, [grp for grp, _ in built],
                                                         stock_us, meas.timer, meas.cache, opts.measure_budget_s,
                                                         stage.say))


def _measured_prices(g: graph_mod.FusionGraph, plan: Plan, slow: Sequence[measure_mod.GroupCost],
                     cost: CostModel) -> dict[frozenset[str], float]:
    """What the plan should price each slow group (each part of a packed one) at: its nodes'
    prices scaled by the measured ratio of its kernel to ORT's nodes."""
    by_name = {grp.name: grp for grp in plan.groups}
    out: dict[frozenset[str], float] = {}
    for c in slow:
        grp = by_name[c.group]
        ratio = c.ours_us / max(c.stock_us, 1e-3)  # type: ignore[operator]
        for part in grp.parts or (grp.nodes,):
            out[cost_mod.node_key(g, part)] = ratio * sum(cost_mod.node_us(g, cost, i) for i in part)
    return out


def _written(given: _Given, planned: _Planned, built: list, opts: Options, stage: _Stages,
             costs: tuple[measure_mod.GroupCost, ...] = (), meas: _Measuring | None = None) -> _Written:
    """rewrite → validate → verify → gate: groups measured slower than the nodes they replace
    (`costs`) go back to ONNX Runtime first; groups verification finds wrong are left to ONNX
    Runtime and the rest verified again (only a verified model is written; `strict` stops
    instead); then the whole model is timed against stock ORT and, where it is not faster, the
    groups that gain least go back until it is (or none are left)."""
    m, g = planned.normal.model, planned.graph
    meas = meas or _Measuring(None, measure_mod.CostCache())
    linked = _linked(built)

    def attempt(subset: list) -> tuple[onnx.ModelProto, verify_mod.Verification | None]:
        """rewrite → validate → verify with the groups of `subset` fused."""
        made = _rewritten(given, planned, subset, linked, stage)
        if made is not given.loaded:
            stage("validate", lambda: _validate(given.weights.checkable(made), given.weights.checkable(m)))
        return made, stage("verify", lambda: verify_mod.verify(
            m, made, g, [grp for grp, _ in _linked_whole(subset, linked)], seed=opts.seed,
            dim_values=given.dim_values, weights=given.weights,
            source=_as_given(given) or (given.model if m is not given.model else None),
            libraries=opts.custom_op_libraries, values=opts.values)) if opts.verify else None

    timer, cache = meas.timer, meas.cache
    given_back: list[dict[str, str]] = []
    slow = measure_mod.why_not_paying(costs, linked)
    given_back += [{"group": name, "reason": why} for name, why in slow.items()]
    built = [(grp, k) for grp, k in built if grp.name not in slow]
    written = _verified(given, built, attempt, opts, linked)
    timing, note = None, ""
    if opts.gate and timer is not None and written.built:
        gains = {c.group: c.gain_us for c in costs}
        timing, note = _gate_timing(given, written.model, opts, stage)
        if timing is not None and timing.stock_graphs and not timing.stitched_graphs and written.built:
            # Stock ORT captures the model and the stitched one it does not: the groups with which
            # ORT refuses the capture go back first (the rest keep their gain in CUDA graphs).
            breakers = _capture_breakers(given, planned, written.built, linked, opts, stage)
            if breakers:
                given_back += [{"group": name, "reason": why, "round": "capture"} for name, why in breakers.items()]
                keep = [b for b in written.built if b[0].name not in breakers]
                written = _verified(given, keep, attempt, opts, linked) if keep else \
                    _Written(given.loaded, None, [], written.dropped)
                if keep:
                    timing, note = _gate_timing(given, written.model, opts, stage)
        negligible = _negligible(written.built, costs, timing)
        if negligible:
            given_back += [{"group": grp.name, "reason": negligible, "round": "negligible"} for grp, _ in written.built]
            written = _Written(given.loaded, None, [], written.dropped)
            timing, note = None, negligible  # (what was timed is not what is written)
        while timing is not None and not timing.faster and written.built:
            # Not faster as a whole: the groups that gain least go back (half of them, then
            # the rest), and the model is verified and timed again.
            ranked = sorted(written.built, key=lambda b: gains.get(b[0].name, b[0].predicted_us))
            back = ranked[:max(1, len(ranked) // 2)] if len(ranked) > 1 and not given_back_all(given_back) else ranked
            why = f"{timing.verdict()}; the groups that gain least go back"
            given_back += [{"group": grp.name, "reason": why, "round": "gate"} for grp, _ in back]
            keep = [b for b in written.built if b not in back]
            written = _verified(given, keep, attempt, opts, linked) if keep else \
                _Written(given.loaded, None, [], written.dropped)
            timing, note = _gate_timing(given, written.model, opts, stage) if keep else (timing, note)
            if not keep:
                break
    if opts.gate:
        try:
            cache.save()
            if opts.costs_file:
                cache.save(Path(opts.costs_file))
        except OSError as e:
            log.warning("measured costs not saved: %s", e)
    return dataclasses.replace(written, costs=costs, timing=timing, given_back=tuple(given_back), gate_note=note)


# Fused groups expected to save less than this share of the model's measured time go back
# whole: a gain that small cannot be told from the timing's noise, so writing them risks a
# slower model for nothing (PyPI int8 LSTMs whose time is the CPU EP's: 0.94-0.97× plain with
# groups predicted to save 0.4% of it, while the gate, beside other jobs, timed them faster).
NEGLIGIBLE_GAIN = 0.005


def _negligible(built: list, costs: Sequence[measure_mod.GroupCost],
                timing: measure_mod.ModelTiming | None) -> str:
    """Why the fused groups are not worth writing ("" when they are): at most NEGLIGIBLE_GAIN
    of the stock model's measured time saved, by the larger of each group's measured and
    predicted gains (its launches included)."""
    by = {c.group: c for c in costs}
    if timing is None or not built or any(grp.name not in by for grp, _ in built):
        return ""
    expected = sum(max(by[grp.name].gain_us, by[grp.name].predicted_stock_us - by[grp.name].predicted_us)
                   for grp, _ in built)
    stock_us = 1e3 * timing.stock_ms
    if expected >= NEGLIGIBLE_GAIN * stock_us:
        return ""
    return (f"the fused groups save at most {expected:.1f} µs of the model's {stock_us / 1e3:.3f} ms ({timing.mode}; under "
            f"{NEGLIGIBLE_GAIN:.1%}): too little to tell from timing noise, so the model is written as given")


# Sessions made at most to find the groups that keep ORT from capturing the stitched model.
CAPTURE_PROBES = 24


def _capture_breakers(given: _Given, planned: _Planned, built: list, linked, opts: Options,
                      stage: _Stages) -> dict[str, str]:
    """The fused groups with which ONNX Runtime refuses to capture the stitched model in a
    CUDA graph, and why (ORT's words), found by halving: ORT refuses when the session is made
    (a node it places on the CPU: marian-dynamo's stitched model moved an Unsqueeze's input to
    the GPU), so each probe is a session made, not run, from a file written as the gate writes
    its own (a session made otherwise, ORT's constant folding off for joined weights, was
    accepted where the gate's was not). Linked conv groups go together. {} where ORT accepts
    the model whole, or the probes run out (CAPTURE_PROBES)."""
    probes = [0]
    tmp = tempfile.TemporaryDirectory(prefix="onnxstitch-capture-")

    def refusal(units: list[list]) -> str:
        probes[0] += 1
        subset = [b for unit in units for b in unit]
        made = _rewritten(given, planned, subset, linked, stage)
        path = Path(tmp.name) / f"probe{probes[0]}.onnx"

        def probe() -> str:
            given.weights.save(made, path, True)  # (the weights as external data, which ORT maps)
            try:
                return measure_mod.capture_refusal(path, opts.custom_op_libraries)
            finally:
                for f in (path, path.with_name(path.name + ".data")):
                    f.unlink(missing_ok=True)
        return stage("gate", probe)

    def bad(units: list[list], why: str) -> list[tuple[list, str]]:
        if len(units) == 1:
            return [(units[0], why)]
        found = []
        for half in (units[:len(units) // 2], units[len(units) // 2:]):
            if probes[0] >= CAPTURE_PROBES:
                raise TimeoutError
            if (said := refusal(half)):
                found += bad(half, said)
        return found

    together = [b for b in built if b[0].name in linked]
    units = ([together] if together else []) + [[b] for b in built if b[0].name not in linked]
    with tmp:
        why = refusal(units)
        if not why:
            return {}
        try:
            found = bad(units, why)
        except TimeoutError:
            log.warning("gate: ORT cannot capture the stitched model in a CUDA graph (%s); the groups at fault were "
                        "not found in %d sessions", why, CAPTURE_PROBES)
            return {}
    out = {grp.name: f"with it fused, ORT cannot capture the model in a CUDA graph ({said})"
           for unit, said in found for grp, _ in unit}
    if not out:  # (only groups together break it: the gate's halving of the groups goes on as before)
        return {}
    log.info("gate: %d group(s) keep ORT from capturing the stitched model in a CUDA graph: %s (%d sessions made)",
             len(out), ", ".join(out), probes[0])
    return out


def given_back_all(given_back: list[dict[str, str]]) -> bool:
    """Whether the gate already gave groups back once (its second round gives back the rest)."""
    return any(d.get("round") == "gate" for d in given_back)


def _linked_whole(subset: list, linked: frozenset[str] | set[str]) -> list:
    """`subset` less its linked conv groups unless all of them are in it."""
    if linked and not linked <= {grp.name for grp, _ in subset}:
        return [(grp, k) for grp, k in subset if grp.name not in linked]
    return subset


def _rewritten(given: _Given, planned: _Planned, subset: list, linked, stage: _Stages) -> onnx.ModelProto:
    """The model with the groups of `subset` fused (linked conv groups all or none); the model
    as given where nothing is."""
    subset = _linked_whole(subset, linked)
    whole = linked and linked <= {grp.name for grp, _ in subset}
    fused = [rewrite.FusedGroup(grp.name, grp.nodes, k) for grp, k in subset]
    relaid = dict(planned.plan.relaid) if whole else {}
    m, g = planned.normal.model, planned.graph
    # Nothing fused: the model goes out exactly as it came in.
    return stage("rewrite", lambda: rewrite.rewrite(m, g, fused, relaid)) if fused else given.loaded


# Weights of at least this many bytes reach the gate's sessions as external data (mapped).
GATE_EXTERNAL_FROM = 64 << 20


def _gate_timing(given: _Given, stitched: onnx.ModelProto, opts: Options, stage: _Stages,
                 alternatives: Mapping[str, onnx.ModelProto] | None = None) -> tuple[measure_mod.ModelTiming | None, str]:
    """Stock ORT against the stitched model on this GPU (measure.compare_models), other
    stitched models (`alternatives`, by label) timed in the same rounds; or None and why it
    could not be timed."""
    def timed() -> measure_mod.ModelTiming:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="onnxstitch-gate-") as tmp:
            # Large weights reach both sessions as external data files, which ORT maps (BERT-base's
            # gate peaked at 2.47 GB with each session's copy of the 440 MB inside its file; the
            # files are copied by the kernel). Stock ORT runs the user's own file where the model
            # is that file and its large weights are external data already (mapped, not copied).
            own = bool(given.path) and given.weights.inside_bytes < GATE_EXTERNAL_FROM
            paths: list[str | Path] = [given.path] if own else []
            others = list((alternatives or {}).items())
            models = [("original.onnx", given.loaded), ("stitched.onnx", stitched)] + \
                [(f"alternative{k}.onnx", m) for k, (_, m) in enumerate(others, start=1)]
            for name, model in models[len(paths):]:
                path = Path(tmp) / name
                weights = given.weights.bytes_in(model)
                big = model.ByteSize() + weights > load.PROTOBUF_LIMIT
                given.weights.save(model, path, big or weights >= GATE_EXTERNAL_FROM)
                paths.append(path)
            log.info("gate: the models to time written in %.2f s", time.perf_counter() - began)
            outputs = _output_shapes(given)
            timing = measure_mod.compare_models(paths[0], paths[1], opts.shapes, opts.custom_op_libraries, opts.values,
                                                outputs=outputs,
                                                alternatives={label: p for (label, _), p in zip(others, paths[2:])})
            if timing.wants_plain and not others:  # a small gain through CUDA graphs: is it slower without them?
                plain = measure_mod.compare_models(paths[0], paths[1], opts.shapes, opts.custom_op_libraries,
                                                   opts.values, cuda_graph=False, outputs=outputs)
                timing = dataclasses.replace(timing, plain_stock_ms=plain.stock_ms, plain_stitched_ms=plain.stitched_ms)
            log.info("gate: %s", timing.verdict())
            return timing

    try:
        return stage("gate", timed), ""
    except Exception as e:  # the plan stands as verified; the report says it was not timed
        log.warning("the stitched model was not timed against stock ORT: %s", first_line(e))
        return None, f"not timed against stock ORT: {first_line(e)}"


def _output_shapes(given: _Given) -> dict[str, Any] | None:
    """Each graph output's shape and dtype at the planning sizes, where inference gives every
    dim as a number or as a dim of the inputs (whose planning values are the timed sizes); None
    otherwise (the gate then reads them off a plain stock run)."""
    from .bench import OutputLike

    inputs = shapes_mod.input_symbols(given.model.graph)
    out = {}
    for vi in given.model.graph.output:
        info = given.tensors.get(vi.name)
        if info is None or info.shape is None:
            return None
        dims = []
        for d in info.shape:
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, str) and d in inputs and d in given.dim_values:
                dims.append(int(given.dim_values[d]))
            else:
                return None
        out[vi.name] = OutputLike(tuple(dims), onnx.helper.tensor_dtype_to_np_dtype(info.dtype))
    return out


def _verified(given: _Given, built: list, attempt: Callable[[list], Any], opts: Options, linked) -> _Written:
    """rewrite → validate → verify until verification passes: groups wrong on their own inputs
    are left to ONNX Runtime and the rest verified again; a difference no group explains is
    bisected down to one group while the budget lasts; a model verification cannot run leaves
    every group to ONNX Runtime."""
    dropped: list[dict[str, str]] = []
    deadline = time.monotonic() + opts.verify_budget_s
    while True:
        try:
            out, checked = attempt(built)
            return _Written(out, checked, built, tuple(dropped))
        except (verify_mod.VerifyError, verify_mod.CannotVerify) as e:
            if opts.strict:
                raise
            if not built:
                # Nothing fused is left and the model still cannot be checked (its normalized or
                # body-stitched form is compared whole): it goes out as loaded, not tried again.
                log.warning("%s; the model is written as loaded", first_line(e))
                return _Written(given.loaded, None, [], tuple(dropped))
            at_fault = set(getattr(e, "groups", ()))
            if not at_fault and isinstance(e, verify_mod.VerifyError):
                at_fault = {grp.name for grp, _ in _bisect(built, attempt, deadline)}
                if len(at_fault) > 1:
                    e = verify_mod.VerifyError(f"{first_line(e)}; the verification budget of "
                                               f"{opts.verify_budget_s:g} s ran out before one group was found "
                                               f"(--verify-budget)")
            # (a verdict naming no group still fused leaves them all: every round drops one at least)
            at_fault = (at_fault & {grp.name for grp, _ in built}) or {grp.name for grp, _ in built}
            if at_fault & linked:
                at_fault |= linked
            log.warning("%s; %s left to ONNX Runtime", first_line(e),
                        "the group is" if len(at_fault) == 1 else f"{len(at_fault)} groups are")
            dropped += [{"group": grp.name, "reason": first_line(e)} for grp, _ in built if grp.name in at_fault]
            built = [(grp, k) for grp, k in built if grp.name not in at_fault]


def _bisect(built: list, attempt: Callable[[list], Any], deadline: float) -> list:
    """The group whose presence makes verification fail where no group is at fault on its own
    (an ORT rewrite around it, rounding it alone amplifies): halve the suspects, keeping a half
    that still fails, until one is left. Each step is one verification run; when `deadline`
    (time.monotonic) has passed, the suspects left are returned, all of them."""
    suspects = list(built)
    while len(suspects) > 1 and time.monotonic() < deadline:
        half = suspects[:len(suspects) // 2]
        try:
            attempt(half)
            suspects = suspects[len(suspects) // 2:]
        except (verify_mod.VerifyError, verify_mod.CannotVerify):
            suspects = half
    return suspects


def _kernels_written(g: graph_mod.FusionGraph, plan: Plan, model: onnx.ModelProto) -> Plan:
    """`plan` with its kernels after counted on the written model: nodes left to ONNX Runtime
    that the rewrite dropped as dead (the Shape chains sizing a Reshape that a fused kernel now
    does as a view: TorchScript's channel shuffles) are no kernels."""
    made = {o for n in model.graph.node for o in n.output}
    fused = {i for grp in plan.groups for i in grp.nodes}
    dropped = sum(1 for n in g.nodes if n.index not in fused and not any(o in made for o in n.outputs if o))
    return dataclasses.replace(plan, kernels_after=plan.kernels_after - dropped) if dropped else plan


def _compute_nodes(model: onnx.ModelProto) -> int:
    """The main graph's nodes other than Constant ones."""
    return sum(1 for n in model.graph.node if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx")))


def generate_kernel(g: graph_mod.FusionGraph, name: str, group: Group) -> source_mod.KernelSource:
    """The kernel of `group`, by the scheme it carries."""
    return registry.get(group.scheme).generate(g, name, group)


def _validate(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """onnx.checker's full check on the stitched model; where the original itself fails the full
    check (its strict shape inference), the stitched model is held to the plain check."""
    try:
        load.check(model, full_check=True)
        return
    except Exception as e:
        error = e
    try:
        load.check(original, full_check=True)
    except Exception:
        try:
            load.check(model)
            return
        except Exception as e:
            error = e
    # The original given the shapes inferred for it (the stitched model's value_info): where that
    # fails the same check, those shapes do not agree with the model's own — a model that does
    # not run as written (CANINE's TorchScript export multiplies [b, 4, s, 64] by [b, 64, s, 4],
    # and ONNX Runtime refuses it too), or shapes inferred wrong. Nothing fused can be trusted
    # then: verification's verdict, and everything goes back to ONNX Runtime.
    annotated = onnx.ModelProto()
    annotated.CopyFrom(original)
    made = {o for n in original.graph.node for o in n.output} - {v.name for v in original.graph.value_info}
    annotated.graph.value_info.extend(v for v in model.graph.value_info if v.name in made)
    try:
        load.check(annotated, full_check=True)
    except Exception as e:
        raise verify_mod.CannotVerify(f"the shapes inferred for the model do not agree with its own "
                                      f"({first_line(e)}): nothing fused can be checked") from error
    # A stitched model that fails where the original passes is our bug, not the user's.
    raise StitchError(f"internal error: the stitched model fails onnx.checker: {first_line(error)}") from error

