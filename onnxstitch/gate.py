"""`onnxstitch check`: a regression gate for CI. Re-optimizes a model, verifies numerics
against stock ONNX Runtime, and compares the plan (and, on a GPU, the measured speedup) with
a baseline file. Anything worse than the baseline is a regression.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx

from . import edit, ortio, sizes
from .version import __version__
from .errors import BadInputError, first_line, read_json
from .inputs import random_feeds
from .pipeline import optimize
from .rewrite import DOMAIN
from .sessions import Runner, runtime_session
from .verify import OutputCheck, compare_elementwise, gpu_usable, judge_outputs

BASELINE_SCHEMA = 1
BYTES_SLACK = 0.01  # predicted bytes may grow by 1% (symbolic-dim defaults, rounding) before it counts
# A speedup below the baseline's floor is measured again, up to this many readings in all, and
# the best kept: a regression must reproduce. Launch-bound models spread by 20% or more from
# run to run (a 20-node chain at batch 64 on an H200 read 9.76× and 7.48× back to back).
SPEED_READINGS = 3
# Seconds of runs per model and configuration a speed reading may take (bench's time_budget_s):
# a table-recognition model whose Loop decodes hundreds of steps took 111 s in a zoo run.
CHECK_TIME_BUDGET_S = 3.0


@dataclass(frozen=True)
class CheckResult:
    """Everything `check` measured, and the regressions found against the baseline."""

    model: str
    device: str  # "gpu" or "cpu"
    plan: Mapping[str, Any]
    outputs: tuple[OutputCheck, ...]
    speedup: float | None  # stock median / stitched median (GPU only)
    regressions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # Where the check's time went: optimize's stages, then "numerics" and "timing" (seconds).
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.regressions

    def baseline(self) -> dict[str, Any]:
        """The JSON a later run compares against (--update-baseline writes it)."""
        return {"schema": BASELINE_SCHEMA, "onnxstitch": __version__, "model": self.model, "plan": dict(self.plan),
                "speedup": self.speedup, "device": self.device}

    def to_json(self) -> dict[str, Any]:
        return {**self.baseline(), "outputs": [asdict(o) for o in self.outputs], "ok": self.ok,
                "regressions": list(self.regressions), "notes": list(self.notes),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


def _plan_summary(report) -> dict[str, Any]:
    p = report.plan
    out = {"kernels_before": p.kernels_before, "kernels_after": p.kernels_after,
           "bytes_before": p.bytes_before, "bytes_after": p.bytes_after,
           "groups": [list(g.labels) for g in p.groups]}
    bodies = report.notes.get("bodies")
    if bodies is not None and bodies.figures:  # If/Loop/Scan bodies: kernels of one run of each
        out |= {"body_kernels_before": int(bodies.figures["kernels_before"]),
                "body_kernels_after": int(bodies.figures["kernels_after"])}
    return out


def _fuses(model: onnx.ModelProto) -> bool:
    """Whether any node of `model`, subgraphs included, is one of ours."""
    def fuses(graph: onnx.GraphProto) -> bool:
        return any(n.domain == DOMAIN or any(fuses(sub) for sub in edit.subgraphs(n)) for n in graph.node)
    return fuses(model.graph)


def _verified_outputs(original: onnx.ModelProto, v: Any) -> tuple[OutputCheck, ...] | None:
    """Each output as optimize's verification judged it, where that ran the kernels on this GPU
    at these sizes and passed (a zoo run verifies before it checks): the same judgement as
    check's own, without two more sessions and runs of the model. None otherwise."""
    if v is None or not v.kernels_ran or not v.outputs:
        return None
    stats = {s.name: s for s in v.outputs}
    # (outputs without figures are integers, shapes or NaN patterns, which verification held exact)
    return tuple(OutputCheck(o.name, True, stats[o.name].max_abs_err, stats[o.name].max_rel_err)
                 if o.name in stats else OutputCheck(o.name, True, 0.0, 0.0) for o in original.graph.output)


def _numerics(model_path: str, stitched: onnx.ModelProto, original: onnx.ModelProto, gpu: bool, seed: int,
              given: sizes.Sizes, atol: float | None, rtol: float | None,
              libraries: Sequence[str], values: Mapping[str, float], tf32: bool = False) -> tuple[OutputCheck, ...]:
    """Each output of the stitched model against stock ORT's on seeded random inputs: with
    `atol`/`rtol` every element within them, else as verification judges (verify.judge_outputs)."""
    feeds = random_feeds(original, seed, given.dims, given.inputs, values)
    names = [o.name for o in original.graph.output]
    try:
        ref = ortio.run(runtime_session(model_path, gpu, stitched=False, libraries=libraries), names, feeds)
    except Exception as e:  # the model itself does not run on these inputs: the user's to size or value
        raise BadInputError(f"{model_path}: stock ONNX Runtime cannot run the model on random inputs at these sizes "
                            f"({first_line(e)}): give sizes with --shape and fixed input values with --value") from e
    got = ortio.run(runtime_session(stitched.SerializeToString(), gpu, stitched=True, libraries=libraries), names, feeds)
    if atol is None and rtol is None:
        # Judged as optimize's verification judges: within what the model itself moves under
        # ORT's own rounding. A fixed elementwise 1e-4 fails deep networks on the GPU whose
        # stock outputs differ from themselves by more (TF32 convolutions and GEMMs).
        return judge_outputs(original, dict(zip(names, got)), dict(zip(names, ref)), feeds,
                             Runner(gpu, None, tuple(libraries)), tf32)
    return tuple(compare_elementwise(o.name, g, r, atol, rtol) for o, g, r in zip(original.graph.output, got, ref))


def _regressions(current: "CheckResult", baseline: Mapping[str, Any], max_slowdown_pct: float) -> list[str]:
    out = []
    bp, cp = baseline.get("plan", {}), current.plan
    if cp["kernels_after"] > bp.get("kernels_after", cp["kernels_after"]):
        out.append(f"kernels after fusion rose from {bp['kernels_after']} to {cp['kernels_after']}")
    if cp["bytes_after"] > bp.get("bytes_after", cp["bytes_after"]) * (1 + BYTES_SLACK):
        out.append(f"predicted bytes moved rose from {bp['bytes_after']:,} to {cp['bytes_after']:,}")
    base_speed = baseline.get("speedup")
    if current.speedup is not None and base_speed:
        floor = base_speed * (1 - max_slowdown_pct / 100)
        if current.speedup < floor:
            out.append(f"speedup fell from {base_speed:.2f}× to {current.speedup:.2f}× "
                       f"(more than {max_slowdown_pct:g}% below the baseline)")
    return out


def run_check(model_path: str | os.PathLike, baseline_path: str | os.PathLike | None, *,
              shapes: Mapping[str, Sequence[int]] | None = None, max_slowdown_pct: float = 10.0,
              atol: float | None = None, rtol: float | None = None, seed: int = 0, iters: int = 50,
              custom_op_libraries: Sequence[str] = (), options: Mapping[str, Any] | None = None,
              values: Mapping[str, float] | None = None) -> CheckResult:
    """Optimize `model_path` (with optimize's `options`), check its numerics against stock ORT
    (GPU when present, else CPU through the fallback), time it on a GPU, and compare with the
    baseline JSON if given."""
    from . import load

    original = load.load(model_path)
    baseline = None
    if baseline_path is not None and Path(baseline_path).exists():
        baseline = read_json(baseline_path, "baseline")
        schema = baseline.get("schema") if isinstance(baseline, dict) else None
        if schema != BASELINE_SCHEMA:
            raise BadInputError(f"{baseline_path}: baseline schema {schema} is not {BASELINE_SCHEMA}")
    given = sizes.resolve(original, shapes)  # a wrong --shape fails here, before any work
    libraries = tuple(custom_op_libraries)
    values = dict(values or {})
    sizes.check_values(original, values)
    # check compares the outputs itself (a zoo run verifies too)
    settings = {"verify": False, **(options or {}), "values": values}
    res = optimize(original, shapes=shapes, seed=seed, custom_op_libraries=libraries,
                   **{k: v for k, v in settings.items() if k != "seed"})
    seconds = dict(res.report.stage_seconds)
    t0 = time.perf_counter()
    gpu = gpu_usable()
    outputs = _verified_outputs(original, res.report.verification) if gpu and atol is None and rtol is None else None
    if outputs is None:
        outputs = _numerics(str(model_path), res.model, original, gpu, seed, given, atol, rtol, libraries, values,
                            tf32=any(grp.tf32 for grp in res.report.plan.groups))
    notes = [] if gpu else ["no GPU here (or no built custom-op library): numerics ran on CPU through the fallback "
                               "functions, and speed was not measured"]
    seconds["numerics"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    speedup = None
    if gpu and not _fuses(res.model):
        # Nothing fused: optimize wrote the model as given, so it runs as fast as itself. Timing
        # it would report run-to-run spread (a 1-node model read 0.33× on a shared host).
        speedup = 1.0
        notes.append("nothing fused: the model as given (speedup 1.00× by identity, not timed)")
    elif gpu:
        from .bench import BenchConfig, run as bench_run

        base_speed = (baseline or {}).get("speedup")
        floor = base_speed * (1 - max_slowdown_pct / 100) if base_speed else None
        readings: list[float] = []
        with tempfile.TemporaryDirectory() as tmp:
            stitched = Path(tmp) / "stitched.onnx"
            load.save(res.model, stitched)
            while not readings or (floor is not None and max(readings) < floor and len(readings) < SPEED_READINGS):
                config = BenchConfig(warmup=10, iters=iters, custom_op_libraries=libraries, values=values,
                                     time_budget_s=CHECK_TIME_BUDGET_S)
                readings.append(bench_run(model_path, stitched, config=config,
                                          shapes=shapes).speedup)
        speedup = max(readings)
        if len(readings) > 1:
            notes.append("speedup below the baseline's floor, measured again: "
                         + ", ".join(f"{r:.2f}×" for r in readings) + " (the best counts)")
    if speedup is not None:
        seconds["timing"] = time.perf_counter() - t0
    result = CheckResult(str(model_path), "gpu" if gpu else "cpu", _plan_summary(res.report), outputs, speedup,
                         notes=tuple(notes), seconds=seconds)
    regressions = [f"output '{o.name}': {o.detail}" for o in outputs if not o.ok]
    if baseline is not None:
        regressions += _regressions(result, baseline, max_slowdown_pct)
    return dataclasses.replace(result, regressions=tuple(regressions))


