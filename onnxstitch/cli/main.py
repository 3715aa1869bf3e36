"""Entry point: `onnxstitch optimize | bench | check | zoo | explain | build-library`."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import click
import onnx
from rich.console import Console
from rich.table import Table

from onnxstitch import __version__, bundle, ortio, sizes
from onnxstitch import explain as explain_mod
from onnxstitch.errors import BadInputError, read_json
from onnxstitch.load import save

from .options import custom_ops_option, shape_option, value_option, verbosity

console = Console(stderr=False)
progress_console = Console(stderr=True)  # spinners stay off stdout, which --json keeps machine-readable


@click.group()
@click.version_option(__version__, prog_name="onnxstitch")
def main() -> None:
    """Fuse memory-bound ONNX operators into generated CUDA kernels for ONNX Runtime."""
    _fewer_malloc_arenas()


# glibc's mallopt parameter M_ARENA_MAX, and the arenas a CLI process keeps.
M_ARENA_MAX, ARENAS = -8, 2


def _fewer_malloc_arenas() -> None:
    """At most ARENAS malloc arenas in this process (glibc; nothing elsewhere): optimize makes
    ONNX Runtime sessions in threads, and each thread's arena kept what its session freed.
    BERT-base optimize on an H200 host (16 cores): peak RSS 4.34 -> 3.79 GB, wall time the
    same (10.84 / 10.76 s). Only the command line does this: a library must not set its
    caller's allocator."""
    if not sys.platform.startswith("linux") or os.environ.get("MALLOC_ARENA_MAX"):
        return
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, ARENAS)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        pass


def save_atomic(model: onnx.ModelProto | Callable[[Path], None], path: Path) -> list[Path]:
    """Write into a temporary folder beside the target, then rename into place (external data
    first, the model last): a failure never leaves a half-written model. `model`: a model
    (over 2 GiB it goes out with its external data in `<name>.data` beside it), or what
    writes one to a path (OptimizeResult.save). Returns the files written, the model last."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    written: list[Path] = []
    try:
        if callable(model):
            model(tmp / path.name)
        else:
            save(model, tmp / path.name)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == path.name):
            os.replace(f, path.parent / f.name)
            written.append(path.parent / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


def _summary(report, out: Path) -> Table:
    p = report.plan
    t = Table(title=f"onnxstitch → {out}", show_header=True, header_style="bold")
    t.add_column("")
    t.add_column("before", justify="right")
    t.add_column("after", justify="right")
    t.add_row("nodes", str(report.nodes_before), str(report.nodes_after))
    t.add_row("kernels", str(p.kernels_before), str(p.kernels_after))
    t.add_row("predicted bytes moved", f"{p.bytes_before / 1e6:,.1f} MB", f"{p.bytes_after / 1e6:,.1f} MB")
    t.add_row("predicted time", f"{p.predicted_us_before:,.1f} µs", f"{p.predicted_us_after:,.1f} µs")
    left = f" ({len(report.dropped)} left to ONNX Runtime by verification)" if report.dropped else ""
    if report.given_back:
        negligible = any(d.get("round") == "negligible" for d in report.given_back)
        left += f" ({len(report.given_back)} given back to ONNX Runtime: " \
                f"{'too little to gain' if negligible else 'measured slower'})"
    packed = [g for g in p.groups if g.parts]
    if packed:
        left += f" ({len(packed)} packed from {sum(len(g.parts) for g in packed)} independent groups)"
    t.add_row("fused groups", "", f"{report.fused_groups}{left}")
    body = report.notes.get("bodies")
    if body and (body.rewrites or body.refusals):
        done, left = len(body.rewrites), len(body.refusals)
        k = body.figures
        kernels = f" ({int(k['kernels_before'])} → {int(k['kernels_after'])} kernels a run)" if done and k else ""
        t.add_row("control flow", "", f"{done} {'body' if done == 1 else 'bodies'} stitched{kernels}"
                  + (f", {left} left as {'it was' if left == 1 else 'they were'}" if left else ""))
    if report.simplified:
        t.add_row("simplified", "", f"{len(report.simplified)} exact rewrites of exported forms")
    if report.normalized:
        t.add_row("group norms", "", f"{len(report.normalized)} rewritten into [N, G, C/G, P]")
    if report.merged:
        t.add_row("merged GEMMs", "", f"{len(report.merged)} (from sibling MatMuls)")
    if report.attention:
        kinds = Counter(f"{k['dtype']}{' + decode form' if k.get('decode_rows') else ''}"
                        for k in report.kernels if k.get("scheme") == "attention")
        detail = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        t.add_row("attention kernels", "", f"{len(report.attention)} ({detail or 'tensor cores'})")
    if report.epilogues:
        made = sum(", generated (" in e for e in report.epilogues)
        t.add_row("GEMM epilogues", "",
                  f"{len(report.epilogues) - made} (cuBLASLt)" + (f", {made} generated (CUTLASS)" if made else ""))
    if report.conv_epilogues:
        t.add_row("conv epilogues", "", f"{len(report.conv_epilogues)} (cuDNN, NHWC)")
    t.add_row("solver", "", f"{p.status} in {p.solve_seconds:.2f} s ({p.num_candidates} candidates)")
    measured = [c for c in report.costs if c.measured]
    if measured:
        fresh = sum(c.source == "measured" for c in measured)
        pred = sum(c.predicted_us for c in measured)
        got = sum(c.ours_us for c in measured)
        stock = sum(c.stock_us for c in measured)
        again = report.notes.get("measure")
        replanned = f"; planned again after {len(again.rewrites)} did not pay" if again and again.rewrites else ""
        t.add_row("measured groups", "", f"{len(measured)} of {len(report.costs)} ({fresh} timed now): "
                  f"{got:,.1f} µs against stock ORT's {stock:,.1f} µs (predicted {pred:,.1f}){replanned}")
    if report.plan_choice:
        t.add_row("plans timed whole", "", report.plan_choice.removeprefix("plans timed whole: "))
    if report.timing is not None:
        tm = report.timing
        t.add_row("measured model", f"{tm.stock_ms:.3f} ms", f"{tm.stitched_ms:.3f} ms ({tm.speedup:.2f}×, {tm.mode})")
    elif report.gate_note:
        t.add_row("measured model", "", report.gate_note)
    v = report.verification
    if v is not None:
        t.add_row("verified", "", v.summary())
    t.add_row("wall time", "", f"{report.wall_seconds:.2f} s")
    return t


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Stitched model (default MODEL.stitched.onnx).")
@shape_option("Planning sizes: input=8x128 (a graph input's shape), then batch=8,seq=128 (symbolic dims).")
@click.option("--report", type=click.Path(path_type=Path), help="Write the plan as JSON.")
@click.option("--plan-picture", "picture", type=click.Path(path_type=Path),
              help="Draw the plan (fused groups coloured by scheme, why neighbours were left out) as .html or .svg.")
@click.option("--bundle", "bundle_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write a deployable folder: the stitched model, the custom-op library, a README.")
@click.option("--arch", "archs", multiple=True, default=("sm_80", "sm_90"), show_default=True,
              help="GPU architectures to embed cubins for (repeatable).")
@click.option("--time-limit", "time_limit_s", type=float, default=30.0, show_default=True,
              help="ILP solver time limit (s).")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Run the stitched model against the original before writing it.")
@click.option("--gate/--no-gate", default=True, show_default=True,
              help="On a GPU, time each fused group against the ONNX Runtime nodes it replaces and the stitched model "
                   "against stock ORT; what is not faster goes back to ONNX Runtime (--no-gate: the plan as planned).")
@click.option("--costs", "costs_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Measured costs to plan with (imported if the file exists) and to write the figures measured "
                   "here to: take them from the target GPU to a machine without one.")
@click.option("--measure-budget", "measure_budget_s", type=click.FloatRange(0), default=10.0, show_default=True,
              help="Seconds the fused groups may be timed for on the GPU when their figures are not cached yet "
                   "(the groups the cost model is surest of are left unmeasured first).")
@click.option("--verify-budget", "verify_budget_s", type=click.FloatRange(0), default=120.0, show_default=True,
              help="Seconds verification may spend finding the group behind an end-to-end difference that no "
                   "group explains on its own inputs; past it the suspects left all go to ONNX Runtime.")
@click.option("--strict-verify", "strict", is_flag=True,
              help="Write nothing if any fused group differs (default: leave such groups to ONNX Runtime).")
@click.option("--reductions/--no-reductions", default=True, show_default=True,
              help="Stitch reductions, Softmax, LayerNormalization and global pools with their neighbours.")
@click.option("--pack/--no-pack", default=True, show_default=True,
              help="Run independent elementwise groups over one iteration space in one kernel.")
@click.option("--merge-matmuls/--no-merge-matmuls", "merge", default=True, show_default=True,
              help="Run MatMuls of one activation by constant weights (Q/K/V, gate/up) as one GEMM.")
@click.option("--attention/--no-attention", default=True, show_default=True,
              help="Run each attention core (MatMul, scale, masks, Softmax, MatMul) as one kernel on tensor cores "
                   "(TF32 for float32), with a split-KV form for decode shapes.")
@click.option("--control-flow/--no-control-flow", default=True, show_default=True,
              help="Fuse inside the bodies of If, Loop and Scan, each body planned and verified as a model of its own.")
@click.option("--epilogues/--no-epilogues", default=True, show_default=True,
              help="Run Conv (depthwise too) [+ bias] [+ residual] [+ activation] as one cuDNN graph in NHWC, "
                   "tensors between them NHWC (ResNet-50 1.7-2.0x, MobileNetV3 1.6-1.7x, a YOLOv8-style net "
                   "1.39x over stock ORT with CUDA graphs on an H200; cuDNN's engines are compiled at optimize "
                   "time in worker processes and cached), and MatMul/Gemm + bias [+ ReLU or tanh GELU] "
                   "[+ residual] as one cuBLASLt call, where the plan and the measured costs find it cheaper.")
@click.option("--generated-gemms", type=click.Choice(["auto", "on", "all", "off"]), default="auto", show_default=True,
              help="With --arch sm_90 alone: MatMul + bias + exact (erf) GELU as one generated GEMM (CUTLASS, built by "
                   "nvcc: about a minute per configuration, cached; it runs on compute capability 9.0 only). auto: "
                   "where this machine's GPU is a Hopper. all: also a generated GEMM beside every cuBLASLt one, the "
                   "faster of the two kept per shape as timed at its first run (on an H200 it gained nothing at "
                   "BERT's or a LLaMA layer's shapes, and costs more nvcc builds).")
@value_option
@custom_ops_option
@verbosity
def optimize(model: Path, output: Path | None, report: Path | None, bundle_dir: Path | None, picture: Path | None,
             verbose: bool, quiet: bool, **settings: Any) -> None:
    """Fuse MODEL and write the stitched model."""
    from onnxstitch import Options, optimize as run_optimize

    # Every other option is a field of Options under its own name: a new flag is a field there
    # and an option here, nothing else.
    options = Options(**{k: str(v) if isinstance(v, Path) else v for k, v in settings.items()})
    if picture:
        explain_mod.format_of(picture)  # a wrong suffix fails before the work, not after
    library = None
    if bundle_dir is not None:
        if output is not None:
            raise BadInputError(f"-o {output} and --bundle {bundle_dir}: the bundle names its model; give one of them")
        library = bundle.find_library()  # before the work, which it would waste
        output = bundle_dir / (model.stem + ".stitched.onnx")
    out = output or model.with_name(model.stem + ".stitched.onnx")
    if out.resolve() == model.resolve():
        raise BadInputError(f"{out}: refusing to overwrite the input model")
    status = None if quiet else progress_console.status("optimizing…")

    def progress(stage: str) -> None:
        if status is not None:
            status.update(f"{stage}…")

    with status or contextlib.nullcontext():
        result = run_optimize(model, options, progress=progress)
    written = save_atomic(result.save, out)
    made = bundle.write_bundle(out, written, library) if library is not None else None
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(result.report.to_json(), indent=2))
    if picture:
        explain_mod.write(result.report.to_json(), picture, title=model.name)
    if not quiet:
        console.print(_summary(result.report, out))
        if result.report.plan.message:
            console.print(f"[yellow]{result.report.plan.message}[/yellow]")
        # One line per reason: a model verification cannot run gives every group the same one.
        reasons = Counter(d["reason"] for d in result.report.dropped)
        for why, n in reasons.items():
            console.print(f"[yellow]left to ONNX Runtime{f' ({n} groups)' if n > 1 else ''}: {why}[/yellow]")
        if made is not None:
            files = ", ".join(p.name for p in (made.model, *made.data, made.library, made.readme))
            console.print(f"bundle: {made.directory} ({files}); {made.readme.name} says how to load it")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--stitched", type=click.Path(path_type=Path), help="Stitched model (optimized now if omitted).")
@shape_option("Input sizes, as optimize reads them: input=8x128 (a graph input's shape), then batch=8 "
              "(symbolic dims).")
@click.option("--warmup", type=click.IntRange(0), default=20, show_default=True)
@click.option("--iters", type=click.IntRange(1), default=100, show_default=True)
@click.option("--providers", default="CUDAExecutionProvider,CPUExecutionProvider", show_default=True,
              help="ONNX Runtime execution providers, in order (without the CUDA EP everything runs on the "
                   "CPU, the stitched model through its fallbacks: a check of the plumbing, not of the kernels).")
@click.option("--cuda-graph", is_flag=True, help="Run every configuration through ORT's CUDA graphs.")
@click.option("--peer-ort-optimizer", "peer_type", metavar="MODEL_TYPE",
              help="Also time the model after ORT's transformers optimizer (bert, gpt2, t5, vit, …).")
@click.option("--profile", is_flag=True, help="Also show where the time goes: ORT's profile of the stock and the "
                                              "stitched model, top op types (and GPU kernels) side by side.")
@click.option("--top", type=click.IntRange(1), default=15, show_default=True, help="Rows per --profile table.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (schema in the result).")
@value_option
@custom_ops_option
@verbosity
def bench(model: Path, stitched: Path | None, shapes: dict, warmup: int, iters: int, providers: str,
          cuda_graph: bool, peer_type: str | None, profile: bool, top: int, as_json: bool,
          values: dict, custom_op_libraries: tuple[Path, ...], verbose: bool, quiet: bool) -> None:
    """Time MODEL on ONNX Runtime's CUDA EP against its stitched version."""
    from onnxstitch import bench as bench_mod
    from onnxstitch import load, optimize as run_optimize

    from . import bench_view

    sizes.resolve(load.load(model), shapes)  # bad input fails here, before any GPU work
    plist = tuple(p.strip() for p in providers.split(",") if p.strip())
    if not plist:
        raise BadInputError(f"--providers {providers!r}: name at least one execution provider")
    if bench_mod.CUDA in plist:
        bench_mod.require_gpu("onnxstitch bench")
    elif cuda_graph or peer_type:
        raise BadInputError(f"--{'cuda-graph' if cuda_graph else 'peer-ort-optimizer'} needs CUDAExecutionProvider "
                            f"in --providers")
    libraries = ortio.custom_op_libraries(custom_op_libraries)
    config = bench_mod.BenchConfig(warmup=warmup, iters=iters, providers=plist, cuda_graph=cuda_graph,
                                   profile=profile, profile_runs=10 if profile else 5, custom_op_libraries=libraries,
                                   values=values)
    status = None if (quiet or as_json) else progress_console.status("benchmarking…")

    def say(msg: str) -> None:
        if status is not None:
            status.update(msg)

    with tempfile.TemporaryDirectory() as tmp, (status or contextlib.nullcontext()):
        if stitched is None:
            say("optimizing")
            stitched = Path(tmp) / "stitched.onnx"
            save_atomic(run_optimize(model, shapes=shapes, custom_op_libraries=libraries, values=values).save, stitched)
        peers = {}
        if peer_type:
            say("running ORT's transformers optimizer")
            peers["ORT transformers optimizer"] = bench_mod.ort_transformers_optimized(model, peer_type, Path(tmp) / "peer.onnx")
        res = bench_mod.run(model, stitched, config=config, shapes=shapes, peers=peers, progress=say)
    if as_json:
        click.echo(json.dumps(res.to_json(top), indent=2))
        return
    if quiet:
        return
    graphs = ", CUDA graphs" if cuda_graph else ""
    console.print(bench_view.timings(res, f"{model} on {res.device} (driver {res.driver}, "
                                          f"onnxruntime {res.ort_version}{graphs})"))
    for label, tm in res.configs.items():
        if tm.note:
            console.print(f"[yellow]{label}: {tm.note}[/yellow]")
    for part in bench_view.profile_tables(res, top, console.width) if profile else ():
        console.print(part)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), required=True, help="Baseline JSON to compare with.")
@click.option("--update-baseline", is_flag=True, help="Write the current results as the new baseline.")
@click.option("--max-slowdown", type=click.FloatRange(0, 100), default=10.0, show_default=True,
              help="Allowed drop of the measured speedup below the baseline, in percent (GPU only).")
@click.option("--atol", type=float, help="Absolute tolerance per element (default: judged as optimize verifies, by relative norm "
              "within what the model itself moves under ORT's rounding).")
@click.option("--rtol", type=float, help="Relative tolerance per element (default: as for --atol).")
@shape_option("Input sizes, as optimize reads them: input=8x128 (a graph input's shape), then batch=8 "
              "(symbolic dims).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@value_option
@custom_ops_option
@verbosity
def check(model: Path, baseline: Path, update_baseline: bool, max_slowdown: float, atol: float | None,
          rtol: float | None, shapes: dict, as_json: bool, values: dict, custom_op_libraries: tuple[Path, ...],
          verbose: bool, quiet: bool) -> None:
    """Re-optimize MODEL and fail (exit 1) if numerics, plan or speed regressed against BASELINE."""
    from onnxstitch.gate import run_check

    if not update_baseline and not baseline.exists():
        raise BadInputError(f"{baseline}: no baseline yet; create it with --update-baseline")
    status = None if (quiet or as_json) else progress_console.status("checking…")
    with status or contextlib.nullcontext():
        res = run_check(model, None if update_baseline else baseline, shapes=shapes,
                        max_slowdown_pct=max_slowdown, atol=atol, rtol=rtol,
                        custom_op_libraries=ortio.custom_op_libraries(custom_op_libraries), values=values)
    numerics_ok = all(o.ok for o in res.outputs)
    if update_baseline and numerics_ok:
        baseline.parent.mkdir(parents=True, exist_ok=True)
        baseline.write_text(json.dumps(res.baseline(), indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(res.to_json(), indent=2))
    elif not quiet:
        t = Table(title=f"onnxstitch check {model} ({res.device})")
        for col in ("output", "ok", "max abs err", "max rel err", ""):
            t.add_column(col)
        for o in res.outputs:
            t.add_row(o.name, "yes" if o.ok else "[red]NO[/red]", f"{o.max_abs_err:.2g}", f"{o.max_rel_err:.2g}", o.detail)
        console.print(t)
        p = res.plan
        speed = f", speedup {res.speedup:.2f}×" if res.speedup is not None else ""
        console.print(f"kernels {p['kernels_before']} → {p['kernels_after']}, predicted bytes "
                      f"{p['bytes_before']:,} → {p['bytes_after']:,}{speed}")
        for n in res.notes:
            console.print(f"[yellow]note:[/yellow] {n}")
        for r in res.regressions:
            console.print(f"[red]regression:[/red] {r}")
        if update_baseline and numerics_ok:
            console.print(f"baseline written to {baseline}")
    failed = not numerics_ok or (res.regressions and not update_baseline)
    if failed and quiet and not as_json:  # quiet prints errors only: what failed, one line each
        for r in res.regressions:
            click.echo(f"onnxstitch: error: regression: {r}", err=True)
    if failed:
        sys.exit(1)


@main.command("zoo")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("zoo-report"), show_default=True,
              help="Folder for the report (zoo.md, zoo.json), written as results arrive.")
@click.option("--address", help="A Ray cluster to join (HOST:PORT or ray://HOST:PORT); default: a local Ray where "
                                "Ray is installed, else local processes.")
@click.option("--local", is_flag=True, help="Local processes even where Ray is installed.")
@click.option("--jobs", type=click.IntRange(1), help="Models at once on a machine without GPUs (default: its cores).")
@click.option("--update-baselines", is_flag=True, help="Write each passing model's baseline file.")
@click.option("--max-slowdown", type=click.FloatRange(0, 100), default=10.0, show_default=True,
              help="Allowed drop of a model's measured speedup below its baseline, in percent (GPU only).")
@click.option("--shard", metavar="K/N", help="Check only shard K of N (every Nth model of the manifest, from "
                                            "its Kth): a zoo split across CI jobs.")
@verbosity
def zoo(manifest: Path, out: Path, address: str | None, local: bool, jobs: int | None, update_baselines: bool,
        max_slowdown: float, shard: str | None, verbose: bool, quiet: bool) -> None:
    """Check every model of a zoo MANIFEST (optimize, verify, time) across GPUs or a Ray cluster;
    exit 1 if any regressed or failed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from onnxstitch import zoo as zoo_mod

    part = zoo_mod.parse_shard(shard) if shard else None
    models = zoo_mod.shard_of(zoo_mod.read_manifest(manifest), part)  # a wrong manifest fails before anything starts
    run = zoo_mod.executor(address, jobs, local)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=progress_console, disable=quiet, transient=True)
    with bar:
        task = bar.add_task(f"checking {len(models)} models on {run.describe()}", total=len(models))

        def arrived(r, k: int, n: int) -> None:
            bar.advance(task)
            if not quiet:
                speed = f" {r.speedup:.2f}×" if r.speedup else ""
                again = " (run again: its worker died)" if r.attempts > 1 else ""
                bar.console.print(f"{r.name}: {r.status}{speed}{again}" + (f" — {r.error}" if r.error else ""))

        report = zoo_mod.run_zoo(manifest, out=out, run=run, update=update_baselines, max_slowdown=max_slowdown,
                                 progress=arrived, shard=part)
    if not quiet:
        console.print(report.summary())
        console.print(f"report: {out / 'zoo.md'}, {out / 'zoo.json'}")
    for r in report.failed:
        click.echo(f"onnxstitch: {r.status}: {r.name}: " + "; ".join([*r.regressions, r.error][:3]).strip("; "),
                   err=True)
    if report.failed:
        sys.exit(1)


@main.command("explain")
@click.argument("report", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The picture: .html (self-contained page) or .svg.")
@click.option("--title", help="Title above the picture (default: the report's file name).")
@verbosity
def explain(report: Path, output: Path, title: str | None, verbose: bool, quiet: bool) -> None:
    """Draw the plan of REPORT (a JSON written by `optimize --report`) as a picture."""
    explain_mod.format_of(output)
    data = read_json(report, "report")
    if not isinstance(data, dict):
        raise BadInputError(f"{report}: not an onnxstitch report (expected a JSON object)")
    try:
        explain_mod.write(data, output, title=title or report.name)
    except BadInputError as e:
        raise BadInputError(f"{report}: {e}") from None
    if not quiet:
        console.print(f"plan picture written to {output}")


@main.command("build-library")
@verbosity
def build_library(verbose: bool, quiet: bool) -> None:
    """Build (or find) the custom-op library and print its path."""
    from onnxstitch import library_path

    click.echo(str(library_path()))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
