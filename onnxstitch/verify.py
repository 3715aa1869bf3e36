"""The verify stage: the stitched model checked against the original before anything is written.

Both models run on the same seeded random inputs, with every fused group's outputs exposed as
graph outputs, so a mismatch names the first group that went wrong. On a machine with a GPU
and onnxruntime-gpu the stitched model runs its real kernels (reference: the original on
stock ORT CUDA); elsewhere it runs through its fallback functions on ORT CPU, which checks the
rewrite's wiring rather than the kernels.
"""
from __future__ import annotations

import logging
import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from . import standalone
from .schemes import registry
from .sessions import Runner, library_domains
from .errors import SIZE_HINT, BadInputError, StitchError, first_line
from .graph import FusionGraph
from .inputs import random_feeds
from .planned import Group
from .shapes import DEFAULT_SYMBOLIC_DIM, input_symbols
from .weights import Weights

log = logging.getLogger(__name__)

# Symbolic dims take this small odd value while verifying: fast on CPU, and it exercises the
# kernels' broadcast and tail paths (the planning sizes stay what --shape said).
VERIFY_DIM = 3
# Symbolic image sizes (height and width of an input a convolution or pooling reads) run at up to
# this on the CPU instead: at 3 × 3 a detector's feature maps collapse to one pixel and run only by
# accident of broadcasting ([1, 96, 1, 1] against [1, 96, 4, 4] in PP-OCR's detector), hiding
# faults that show at real sizes. 64 survives five stride-2 stages (64 / 32 = 2 pixels).
VERIFY_SPATIAL_DIM = 64
# On the GPU every size is verified as planned but the batch (the symbolic dims at axis 0 of the
# inputs), which verifies at most this: a batch of 8 made EfficientNet's verification copy and
# compare ~10 GB of activations (25–30 s on an H200), and the kernels take the same paths per row.
VERIFY_GPU_BATCH = 2
_SPATIAL_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "Resize", "Upsample"})


class VerifyError(StitchError):
    """The stitched model's outputs differ from the original's. `groups` names every fused
    group found wrong on its own inputs in this run (the message describes the first); empty
    when the difference cannot be pinned on a group. `group` is the first of them."""

    def __init__(self, message: str, groups: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.groups = tuple(groups)

    @property
    def group(self) -> str | None:
        return self.groups[0] if self.groups else None


class CannotVerify(StitchError):
    """Verification could not run the original model at any size it tried (a fault of the
    model, or of the sizes given): nothing fused may be written unverified."""


@dataclass(frozen=True)
class Verification:
    """What was checked: where it ran, how many tensors, the worst relative error seen."""

    device: str  # "gpu" or "cpu"
    tensors_checked: int
    worst_relative_error: float
    skipped: str = ""  # why verification could not run, when it could not
    # Each graph output's figures (verify.OutputStat): error, tolerance, the envelope behind it.
    outputs: tuple = ()

    @property
    def kernels_ran(self) -> bool:
        """Whether the generated kernels themselves ran: on the GPU. On the CPU the fused nodes
        run their fallback functions, which checks the rewrite's wiring, not the kernels."""
        return self.device == "gpu" and not self.skipped

    def summary(self) -> str:
        """One line saying what was checked, and where."""
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.kernels_ran:
            return (f"kernels ran on the GPU: {self.tensors_checked} tensors checked, "
                    f"worst rel. err {self.worst_relative_error:.1e}")
        return (f"rewrite checked on the CPU through the fallback functions, kernels not run: "
                f"{self.tensors_checked} tensors")

    def to_json(self) -> dict:
        return {"device": self.device, "kernels_ran": self.kernels_ran, "tensors_checked": self.tensors_checked,
                "worst_relative_error": self.worst_relative_error, "skipped": self.skipped,
                "summary": self.summary(), "outputs": [o.to_json() for o in self.outputs]}


# Products on TF32 tensor cores (schemes/attention) against ONNX Runtime's own TF32 GEMMs: each
# rounds its inputs to 10 mantissa bits (unit roundoff 2^-11 ≈ 4.9e-4), in its own order; the
# two differ by ~5e-4 relative at BERT's sizes (scripts/probe_attention.py), so 8 unit roundoffs.
TF32_TOLERANCE = 4e-3


# Rounding units of float32 at the inputs' scale that an isolated group's output may differ by
# whatever its own norm (cancellation: its values can be far smaller than what they came from).
SCALE_ULPS = 8
# Graph outputs and group outputs downstream of other kernels carry the rounding differences of
# every kernel before them, amplified by the network (a 25-block CNN: ~5e-4). Where every group
# is right on its own inputs, end-to-end differences up to this are that accumulation.
ACCUMULATED_TOLERANCE = 1e-2


def _relative_tolerance(dtype: np.dtype) -> float:
    # Half precision: fused kernels keep float32 intermediates where ORT rounds every op's
    # output to half, and values in half's subnormal range (layer scales of 1e-6) carry few
    # bits either way; measured up to 2% relative norm on ConvNeXt and YOLO (H200), so 5%.
    name = np.dtype(dtype).name
    return 5e-2 if name in ("float16", "bfloat16") else 1e-4


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" or a.dtype.name == "bfloat16"


def _special_mismatch(a: np.ndarray, b: np.ndarray) -> str | None:
    """Why two tensors cannot match whatever the tolerance: shape, dtype, integer values,
    NaN or infinity positions (None when none of these differ)."""
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if not _is_float(b):
        bad = int(np.count_nonzero(a != b))
        return f"{bad} of {a.size} elements differ" if bad else None
    if b.dtype.name != "bfloat16" and np.isfinite(a).all() and np.isfinite(b).all():
        return None  # (the common case, without float64 copies: BERT's 86 tensors took 0.8 s)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return f"NaN at {int(np.count_nonzero(nan_a ^ nan_b))} positions where the original has none (or the reverse)"
    if (np.isinf(a64) != np.isinf(b64)).any() or (np.isinf(b64) & (a64 != b64)).any():
        return "infinities differ"
    return None


def compare(actual: np.ndarray, expected: np.ndarray, half_inputs: bool = False,
            tf32: bool = False, input_scale: float = 0.0) -> tuple[bool, float, str]:
    """(ok, relative error, why) for one tensor: exact for integers and bools; for floats the
    same NaN/Inf positions and ‖a − b‖ ≤ tol·‖b‖ over finite values (tol 1e-4, or 5e-2 for
    half precision, or TF32_TOLERANCE for float32 values downstream of TF32 products): the
    norm suits values at the end of long chains. `input_scale` (the RMS of the values that
    produced the tensor) adds a floor of a few float32 rounding units at that scale, so an
    output that cancels to near zero (x − mean, SiLU of values near 0) is not judged by its
    own tiny norm."""
    a, b = np.asarray(actual), np.asarray(expected)
    why = _special_mismatch(a, b)
    if why is not None:
        return False, float("inf"), why
    if not _is_float(b):
        return True, 0.0, ""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    finite = np.isfinite(b64)
    count = int(finite.sum())
    if count < b64.size:  # (masks copy: only where something is not finite)
        a64, b64 = a64[finite], b64[finite]
    d = a64 - b64
    diff, ref = float(np.sqrt(d @ d)), float(np.sqrt(b64 @ b64))
    floor = SCALE_ULPS * float(np.finfo(np.float32).eps) * input_scale * np.sqrt(max(count, 1))
    diff = max(diff - floor, 0.0)
    rel = diff / ref if ref > 0 else diff
    # A float32 output computed from half-precision inputs is only as certain as they are:
    # ORT may evaluate it in another order (its own fusions), differing by half's rounding.
    tol = _relative_tolerance(np.dtype(np.float16) if half_inputs else a.dtype)
    if tf32 and a.dtype == np.float32:
        tol = max(tol, TF32_TOLERANCE)
    return rel <= tol, rel, f"relative error {rel:.3g} > {tol:g}"


@dataclass(frozen=True)
class OutputCheck:
    """One output compared element by element with its reference."""

    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    detail: str = ""


def compare_elementwise(name: str, got: np.ndarray, ref: np.ndarray, atol: float | None = None,
                        rtol: float | None = None) -> OutputCheck:
    """Every element within atol + rtol·|ref| (defaults by dtype: 1e-4 for float32/64, 5e-2
    for half), besides the exact rules of `compare` for shapes, integers, NaN and Inf."""
    g, r = np.asarray(got), np.asarray(ref)
    why = _special_mismatch(g, r)
    if why is not None:
        return OutputCheck(name, False, float("inf"), float("inf"), why)
    if not _is_float(r):
        return OutputCheck(name, True, 0.0, 0.0)
    tol = _relative_tolerance(r.dtype)
    atol, rtol = (tol if atol is None else atol), (tol if rtol is None else rtol)
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    finite = np.isfinite(r64)
    diff = np.abs(g64 - r64)[finite]
    mag = np.abs(r64[finite])
    abs_err = float(diff.max()) if diff.size else 0.0
    rel_err = float((diff / np.maximum(mag, 1e-12)).max()) if diff.size else 0.0
    ok = bool(np.all(diff <= atol + rtol * mag))
    return OutputCheck(name, ok, abs_err, rel_err, "" if ok else f"exceeds atol {atol:g} + rtol {rtol:g}")


def _expose(model: onnx.ModelProto, graph: FusionGraph, names: Sequence[str],
            more: Mapping[str, int] | None = None) -> onnx.ModelProto:
    """`model` with the tensors `names` (and `more`: name → dtype, for names the graph does not
    describe) as graph outputs too."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for t, dtype in [(t, graph.tensors[t].dtype) for t in names] + list((more or {}).items()):
        if t not in have:
            # Typed, not shaped: an inferred shape ORT disagrees with must not stop the run.
            out.graph.output.append(helper.make_tensor_value_info(t, dtype, None))
            have.add(t)
    return out


def gpu_usable() -> bool:
    """True when stitched models can run their kernels here: CUDA EP and a built library."""
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return False
        from .runtime import library_path

        library_path(build=False)
        return True
    except Exception:
        return False


# ORT's words for a graph that is invalid in itself (its types or shapes disagree), whatever
# the device and sizes. Anything else failing at load (no kernel on this device, memory, the
# driver) is not the model's fault.
_INVALID_GRAPH = ("Type Error", "ShapeInferenceError", "TypeInferenceError", "INVALID_GRAPH")


def _load_fault(model: onnx.ModelProto, runner: Runner) -> str | None:
    """Why ONNX Runtime cannot load `model` as given at all (a type or graph error, whatever the
    sizes), or None when it loads or fails for another reason."""
    try:
        runner.open(model, False)
    except Exception as e:  # ORT's load errors: the model's own fault only where its graph is invalid
        text = first_line(e)
        return text if any(w in text for w in _INVALID_GRAPH) else None
    return None


def verify(original: onnx.ModelProto, stitched: onnx.ModelProto, graph: FusionGraph,
           groups: Sequence[Group], *, seed: int = 0, dim_values: Mapping[str, int] | None = None,
           device: str = "auto", source: onnx.ModelProto | None = None,
           weights: Weights | None = None, libraries: Sequence[str] = (),
           values: Mapping[str, float] | None = None) -> Verification:
    """Run both models on seeded random inputs and judge the stitched one in two ways:

    - every fused group (`groups`, in the plan's topological order) on its own inputs: its
      original subgraph runs on the very values the stitched model gave it (all groups in one
      session), and its outputs must match to the rounding of its dtype (TF32's for groups on
      tensor cores). Raises VerifyError naming every group wrong there, so one run finds them
      all;
    - every graph output against the original's, within the model's own numerical envelope:
      where every group is right on its own inputs, an end-to-end difference is rounding the
      network amplified, accepted up to ENVELOPE_MARGIN times what the original itself moves
      when ORT's GEMMs and convolutions round to TF32 (stock ORT's default on the GPU), and
      never less than ACCUMULATED_TOLERANCE. Beyond that it raises VerifyError naming no group.

    `source`: the model as the user gave it, when `original` is its normalized form
    (normalize.py); the graph outputs are then compared against it as well. `weights`: the
    payloads of the models' stubs (weights.py); `libraries`: custom-op libraries the model's
    own ops need, registered in every session.

    Symbolic dims run small on the CPU (VERIFY_DIM; an image's height and width
    VERIFY_SPATIAL_DIM); where the original does not run at those sizes (a CNN whose height and
    width must survive its strides), at the planning sizes. On the GPU only the batch runs small
    (VERIFY_GPU_BATCH), and nothing where a group's library chooses its engines per shape
    (registry.plans_per_shape). Raises CannotVerify when the original runs at neither."""
    if not groups and source is None:  # with bodies stitched (source), the whole model is still compared
        return Verification("none", 0, 0.0, skipped="nothing was fused")
    gpu = gpu_usable() if device == "auto" else device == "gpu"
    runner = Runner(gpu, weights, tuple(str(x) for x in libraries))
    planned = {d: DEFAULT_SYMBOLIC_DIM for d in input_symbols(original.graph)}
    planned.update(dim_values or {})
    spatial = _spatial_dims(original)
    if gpu and any(registry.plans_per_shape(grp.scheme) for grp in groups):
        # Library plans are chosen per shape at the first run (seconds a network): at the
        # planning sizes, the gate and the user's sessions find them made (the runtime's cache).
        small = dict(planned)
    elif gpu:  # the batch small, every other size as planned (the kernels' paths at those sizes)
        batch = _batch_dims(original)
        small = {d: min(v, VERIFY_GPU_BATCH) if d in batch else v for d, v in planned.items()}
    else:
        small = {d: min(v, VERIFY_SPATIAL_DIM if d in spatial else VERIFY_DIM) for d, v in planned.items()}
    sizes = [small] + ([planned] if planned != small else [])
    exposed = [t for grp in groups for t in grp.outputs]
    stitched_names = {t for n in stitched.graph.node for t in n.output} | {i.name for i in stitched.graph.input}
    # A conv group's output kept NHWC for the next conv group (schemes/conv) is in the stitched
    # model under a name of that layout: exposed so, and compared in the graph's layout.
    held = {t: (s, r) for s in stitched_names for r in registry.relayouts()
            if (t := r.holds(s)) is not None and t not in stitched_names}
    groups = [dataclasses.replace(grp, outputs=tuple(t for t in grp.outputs if t in stitched_names or t in held))
              for grp in groups]
    exposed = [t for t in exposed if t in stitched_names or t in held]
    graph_inputs = {i.name for i in original.graph.input}
    reads = [t for t in dict.fromkeys(t for grp in groups for t in standalone.group_reads(original, graph, grp))
             if t not in exposed and t not in graph_inputs and t in graph.tensors]
    ref_model = _expose(original, graph, exposed + reads)
    new_model = _expose(stitched, graph, [t for t in exposed if t not in held] + [t for t in reads if t in stitched_names],
                        {s: graph.tensors[t].dtype for t, (s, _) in held.items() if t in exposed})
    failures = []
    # The original, the stitched model with its groups' tensors exposed and as written, and the
    # model as given run on the same inputs, independent of one another: at once where they can.
    jobs = [(ref_model, False), (new_model, True), (stitched, True)] + ([(source, False)] if source is not None else [])
    for dims in sizes:
        feeds = random_feeds(original, seed, dims, values=values)
        ran = list(runner.run_together(jobs, feeds))
        if isinstance(ran[1], dict):  # (outputs held in a scheme's layout, in the graph's)
            ran[1] = {**ran[1], **{t: r.restored(s, ran[1][s]) for t, (s, r) in held.items() if s in ran[1]}}
        if not isinstance(ran[0], Exception):
            expected, runs = ran[0], _Runs(*ran[1:3], ran[3] if source is not None else None)
            break
        failures.append(f"{_sizes(dims)}: {first_line(ran[0])}")  # the original cannot run at these sizes
    else:
        where = "GPU (CUDA EP)" if gpu else "CPU"
        custom = sorted(library_domains(original))
        hint = f" (its ops of {', '.join(custom)} need their library: --custom-op-library)" \
            if custom and not runner.libraries else ""
        fault = _load_fault(source if source is not None else original, runner)
        if fault is not None:
            raise BadInputError(f"ONNX Runtime cannot load the model as given ({fault}): the model itself is "
                                f"invalid (a fault of its export), so neither it nor a stitched form can run")
        raise CannotVerify(f"verification cannot run the original model on ONNX Runtime {where} "
                           f"({'; '.join(failures)}){hint}: {SIZE_HINT}")
    judge = _Judge(original, feeds, expected, runner, any(grp.tf32 for grp in groups))
    checked = _compare_runs(runs, original, graph, groups, feeds, runner, expected, judge)
    _as_written(runs.written, original, runner, judge)
    return dataclasses.replace(checked, outputs=judge.stats())


@dataclass(frozen=True)
class _Runs:
    """What verification's runs of the stitched model gave (outputs by name, or the exception
    the run raised): with its groups' tensors exposed, as written, and the model as given
    (before normalization; None where the original is the model as given)."""

    exposed: dict[str, np.ndarray] | Exception
    written: dict[str, np.ndarray] | Exception
    given: dict[str, np.ndarray] | Exception | None


def _outputs(ran: dict[str, np.ndarray] | Exception) -> dict[str, np.ndarray]:
    """A run's outputs, or its exception raised again."""
    if isinstance(ran, Exception):
        raise ran
    return ran


# An end-to-end difference is accepted up to this many times what the original model itself
# moves under ORT's own rounding (per output), where every group is right on its own inputs.
ENVELOPE_MARGIN = 2.0


@dataclass(frozen=True)
class OutputStat:
    """One graph output's comparison with the original (Polygraphy-style statistics): the
    relative norm error, the largest absolute and elementwise relative differences, the
    tolerance it was held to and the envelope that set it (0 where none was measured)."""

    name: str
    relative_error: float
    max_abs_err: float
    max_rel_err: float
    tolerance: float
    envelope: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class _Judge:
    """Judges graph outputs against the original's, within the model's envelope: what the
    original's outputs move under ORT's own rounding, measured once (one more run of the
    original, only when an output needs it)."""

    def __init__(self, original: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                 expected: Mapping[str, np.ndarray], runner: Runner, tf32: bool) -> None:
        self.original, self.feeds, self.expected, self.runner = original, feeds, expected, runner
        self.tf32 = tf32  # the stitched model runs TF32 kernels (attention)
        self.scale = _scale(feeds)
        self._envelope: dict[str, float] | None = None
        self._user_run: dict[str, np.ndarray] = {}  # the envelope's run: the original as a user runs it
        self._stats: dict[str, OutputStat] = {}

    def envelope(self) -> dict[str, float]:
        """Relative norm difference of each graph output between the original as a user's
        session runs it (no tensor exposed, so ORT fuses across them; on the GPU with TF32 in
        its GEMMs and convolutions, stock ORT's default) and the reference run (tensors exposed,
        TF32 off): what stock ORT's own rounding does to this model. A detector whose TopK
        picks among near-equal scores moves by half its output there (a YOLO from PyPI, on the
        CPU), and so may the stitched model."""
        if self._envelope is None:
            self._envelope = {o.name: 0.0 for o in self.original.graph.output}
            try:
                other = dataclasses.replace(self.runner, tf32=True).run(self.original, False, self.feeds)
                self._user_run = other
                self._envelope = {o.name: compare(other[o.name], self.expected[o.name],
                                                  input_scale=self.scale)[1] for o in self.original.graph.output}
            except Exception as e:  # no envelope: the fixed tolerance stands
                log.info("the envelope run failed: %s", first_line(e))
        return self._envelope

    def output(self, name: str, actual: np.ndarray, against: np.ndarray | None = None) -> str | None:
        """Why graph output `name` of the stitched model is beyond rounding (None when it is
        not), against the original's value (or `against`): beyond ACCUMULATED_TOLERANCE, then
        beyond the envelope. The difference is floored at the scale of the model's float inputs
        as `compare` does: a detector's probabilities on a random image are all near 0 (sigmoids
        of large negative logits, 1e-13 to 1e-7 in PP-OCRv3), and a 1e-7 rounding difference
        there is not 100% of anything."""
        want = self.expected[name] if against is None else against
        ok, rel, why = compare(actual, want, tf32=self.tf32, input_scale=self.scale)
        tolerance, envelope = ACCUMULATED_TOLERANCE, 0.0
        if not ok and rel > ACCUMULATED_TOLERANCE and why and not why.startswith("relative error"):
            return why  # shapes, NaN positions, integers: no envelope covers those
        if not ok and rel > ACCUMULATED_TOLERANCE:
            envelope = self.envelope().get(name, 0.0)
            tolerance = max(ACCUMULATED_TOLERANCE, ENVELOPE_MARGIN * envelope)
            if against is None and name in self._user_run:
                # as close to the original as a user's session runs it: that is the original too
                near, rel_user, _ = compare(actual, self._user_run[name], tf32=self.tf32, input_scale=self.scale)
                if rel_user < rel:
                    ok, rel, want = near, rel_user, self._user_run[name]
        if against is None:
            self._record(name, actual, want, rel, tolerance, envelope)
        if ok or rel <= tolerance:
            return None
        env = f", {ENVELOPE_MARGIN:g}× the {envelope:.3g} the original itself moves under ORT's own rounding" \
            if envelope else ""
        return f"relative error {rel:.3g} > {tolerance:.3g} (the model's envelope{env})"

    def _record(self, name: str, actual: np.ndarray, want: np.ndarray, rel: float, tolerance: float,
                envelope: float) -> None:
        a, b = np.asarray(actual), np.asarray(want)
        abs_err = rel_err = 0.0
        if _is_float(b) and a.shape == b.shape and b.size:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            finite = np.isfinite(a64) & np.isfinite(b64)
            diff = np.abs(a64 - b64)[finite]
            if diff.size:
                abs_err = float(diff.max())
                rel_err = float((diff / np.maximum(np.abs(b64[finite]), 1e-12)).max())
        old = self._stats.get(name)
        if old is None or rel > old.relative_error:
            self._stats[name] = OutputStat(name, rel, abs_err, rel_err, tolerance,
                                           envelope or (self._envelope or {}).get(name, 0.0))

    def stats(self) -> tuple[OutputStat, ...]:
        return tuple(self._stats[o.name] for o in self.original.graph.output if o.name in self._stats)


def judge_outputs(original: onnx.ModelProto, got: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                  feeds: Mapping[str, np.ndarray], runner: Runner, tf32: bool = False) -> tuple[OutputCheck, ...]:
    """Each graph output of a stitched model (`got`) judged against the original's (`expected`,
    both run on `feeds`) as optimize's verification judges it: by relative norm within the
    model's own envelope (what the original moves under TF32 on the GPU), with the exact rules
    for shapes, integers, NaN and Inf. `tf32`: the stitched model runs TF32 kernels."""
    judge = _Judge(original, feeds, expected, runner, tf32)
    reasons = {o.name: judge.output(o.name, got[o.name]) for o in original.graph.output}
    stats = {s.name: s for s in judge.stats()}  # (none for a shape, integer or NaN mismatch)
    out = []
    for name, why in reasons.items():
        stat = stats.get(name)
        abs_err, rel_err = (stat.max_abs_err, stat.max_rel_err) if stat else (float("inf"), float("inf"))
        out.append(OutputCheck(name, why is None, abs_err, rel_err, why or ""))
    return tuple(out)


def _as_written(written: dict[str, np.ndarray] | Exception, original: onnx.ModelProto, runner: Runner,
                judge: _Judge) -> None:
    """The stitched model once more as it will be written, with no tensor exposed: ORT then
    optimizes the graph around the fused nodes as a user's session will (fusions the exposed
    tensors held back), and that graph must run and give the same outputs too. A failure here
    names no group (VerifyError.groups is empty)."""
    where = runner.where
    try:
        actual = _outputs(written)
    except Exception as e:
        raise VerifyError(f"verification failed on {where}: the stitched model as written does not run: "
                          f"{first_line(e)}") from e
    for o in original.graph.output:
        why = judge.output(o.name, actual[o.name])
        if why:
            raise VerifyError(f"verification failed on {where}: graph output '{o.name}' of the stitched model as "
                              f"written: {why}")


def _sizes(dims: Mapping[str, int]) -> str:
    return "at " + (", ".join(f"{k}={v}" for k, v in sorted(dims.items())) if dims else "its fixed sizes")


def _isolated_all(model: onnx.ModelProto, graph: FusionGraph, groups: Sequence[Group],
                  values: Mapping[str, np.ndarray], runner: Runner) -> dict[str, tuple[dict, dict]]:
    """Every group's original subgraph run on `values` (its inputs as the stitched model
    computed them), all in one session: group name → (its outputs, its inputs). Groups that
    cannot be renamed into the shared model, or whose inputs are missing, are run alone
    (`_isolated`); a group that does not run alone is left out of the result."""
    shared: list[standalone.Piece] = []
    named: dict[str, standalone.Piece] = {}
    alone: list[Group] = []
    for k, grp in enumerate(groups):
        piece = standalone.original_piece(model, graph, grp, f"~g{k}~")
        if piece is None or any(t not in values or t not in graph.tensors for t in piece.reads):
            alone.append(grp)
            continue
        shared.append(piece)
        named[grp.name] = piece
    out: dict[str, tuple[dict, dict]] = {}
    if shared:
        types = {t: (graph.tensors[t].dtype, None) for p in shared for t in p.reads + p.outputs}
        m = standalone.model_of(shared, model, types, "groups_alone")
        feeds = {p.prefix + t: values[t] for p in shared for t in p.reads}
        try:
            got = runner.run(m, False, feeds)
        except Exception as e:  # one group that does not run alone spoils the batch: each alone
            log.info("the groups do not run together on their own inputs (%s): each runs alone", first_line(e))
            alone, named = list(groups), {}
        for name, p in named.items():
            out[name] = ({t: got[p.prefix + t] for t in p.outputs}, {t: values[t] for t in p.reads})
    for grp in alone:
        got1 = _isolated(model, graph, grp, values, runner)
        if got1 is not None:
            out[grp.name] = got1
    return out


def _isolated(model: onnx.ModelProto, graph: FusionGraph, grp: Group, values: Mapping[str, np.ndarray],
              runner: Runner) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """The group's original subgraph run alone on `values` (its inputs as the stitched model
    computed them): (its outputs, its inputs); None when it cannot run alone."""
    piece = standalone.original_piece(model, graph, grp)
    assert piece is not None  # no prefix: nothing to rename
    if any(t not in values or t not in graph.tensors for t in piece.reads):
        return None
    types = {t: (graph.tensors[t].dtype, None) for t in piece.reads + piece.outputs}
    feeds = {t: values[t] for t in piece.reads}
    try:
        return runner.run(standalone.model_of([piece], model, types, f"{grp.name}_alone"), False, feeds), feeds
    except Exception as e:  # judged at fault, as if it had differed on its own
        log.info("group %s does not run alone: %s", grp.name, first_line(e))
        return None


def _scale(feeds: Mapping[str, np.ndarray]) -> float:
    """RMS of a group's finite floating-point inputs (0 when it has none)."""
    total, count = 0.0, 0
    for v in feeds.values():
        if _is_float(v):
            x = np.asarray(v, np.float64)
            x = x[np.isfinite(x)]
            total, count = total + float(np.square(x).sum()), count + x.size
    return float(np.sqrt(total / count)) if count else 0.0


def _compare_runs(runs: _Runs, original: onnx.ModelProto, graph: FusionGraph, groups: Sequence[Group],
                  feeds: dict, runner: Runner, expected: dict[str, np.ndarray], judge: _Judge) -> Verification:
    """Judge the stitched model's run (`runs.exposed`): every group on its own inputs and the
    graph outputs within the model's envelope (`judge`); where the model as given was run
    (`runs.given`, before normalization) its graph outputs are compared with the stitched run too."""
    where = runner.where
    try:
        actual = _outputs(runs.exposed)
    except Exception as e:
        raise VerifyError(f"verification failed on {where}: the stitched model does not run: {first_line(e)}") from e
    values = {**feeds, **expected, **actual}
    alone = _isolated_all(original, graph, groups, values, runner)
    worst = 0.0
    faulty: list[str] = []
    message = ""
    # The plan's groups come in a topological order, so every group a TF32 group's rounding can
    # reach comes after it: once one has run, later float32 values end to end are held to TF32's
    # accuracy (for the end-to-end check of a group that cannot run alone).
    tf32 = False
    for grp in groups:
        tf32 = tf32 or grp.tf32
        half = _half_inputs(graph, grp)
        if grp.name not in alone:
            # It does not run alone: judged end to end, at fault where it differs there.
            for t in grp.outputs:
                ok, rel, why = compare(actual[t], expected[t], half, tf32)
                if not ok:
                    faulty.append(grp.name)
                    message = message or f"verification failed on {where}: group {grp.name} output '{t}': {why}"
                    break
            continue
        outs, ins = alone[grp.name]
        for o in grp.outputs:
            ok, rel, why_alone = compare(actual[o], outs[o], half, grp.tf32, _scale(ins))
            if not ok:
                faulty.append(grp.name)
                message = message or (f"verification failed on {where}: group {grp.name} "
                                      f"({', '.join(grp.labels[:4])}{', …' if len(grp.labels) > 4 else ''}) "
                                      f"output '{o}': {why_alone} on its own inputs")
                break
            worst = max(worst, rel)
    if faulty:
        raise VerifyError(message, faulty)
    for o in original.graph.output:
        why = judge.output(o.name, actual[o.name])
        if why:
            raise VerifyError(f"verification failed on {where}: graph output '{o.name}': {why}, though every "
                              f"fused group is right on its own inputs")
    if runs.given is not None:
        given = _outputs(runs.given)
        for name in (o.name for o in original.graph.output):
            why = judge.output(name, actual[name], against=given[name])
            if why:
                raise VerifyError(f"verification failed on {where}: graph output '{name}' against the model as given "
                                  f"(before normalization): {why}")
    worst = max([worst] + [s.relative_error for s in judge.stats()])
    checked = len({t for grp in groups for t in grp.outputs} | {o.name for o in original.graph.output})
    return Verification(where, checked, worst)


def _half_inputs(graph: FusionGraph, grp: Group) -> bool:
    return any(graph.tensors[t].dtype in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) for t in grp.inputs
               if t in graph.tensors)


def _batch_dims(model: onnx.ModelProto) -> set[str]:
    """Symbolic dims at axis 0 of the graph inputs: the batch, as exporters write it."""
    return {vi.type.tensor_type.shape.dim[0].dim_param for vi in model.graph.input
            if len(vi.type.tensor_type.shape.dim) and vi.type.tensor_type.shape.dim[0].dim_param}


def _spatial_dims(model: onnx.ModelProto) -> set[str]:
    """Symbolic dims that are an image's height or width: axes 2 and up of a graph input of
    rank 3 to 5, in a model with a convolution, pooling or resize (NCHW, as ONNX's ops read)."""
    if not any(n.op_type in _SPATIAL_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return set()
    out = set()
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if 3 <= len(dims) <= 5:
            out |= {d.dim_param for d in dims[2:] if d.dim_param}
    return out
