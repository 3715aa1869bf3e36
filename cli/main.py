"""Entry point: `onnxstitch optimize | bench | build-library`."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import click
import onnx
from rich.console import Console
from rich.table import Table

from onnxstitch import __version__
from onnxstitch.errors import BadInputError
from onnxstitch.load import save

from .options import parse_shapes, verbosity

console = Console(stderr=False)


@click.group()
@click.version_option(__version__, prog_name="onnxstitch")
def main() -> None:
    """Fuse memory-bound ONNX operators into generated CUDA kernels for ONNX Runtime."""


def save_atomic(model: onnx.ModelProto, path: Path) -> None:
    """Write into a temporary folder beside the target, then rename into place (external data
    first, the model last): a failure never leaves a half-written model. Models over 2 GiB go
    out with their external data in `<name>.data` beside them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save(model, tmp / path.name)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == path.name):
            os.replace(f, path.parent / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    t.add_row("fused groups", "", str(len(p.groups)))
    t.add_row("solver", "", f"{p.status} in {p.solve_seconds:.2f} s ({p.num_candidates} candidates)")
    v = report.verification
    if v is not None:
        t.add_row("verified", "", f"skipped: {v.skipped}" if v.skipped else
                  f"{v.tensors_checked} tensors on {v.device}, worst rel. err {v.worst_relative_error:.1e}")
    t.add_row("wall time", "", f"{report.wall_seconds:.2f} s")
    return t


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Stitched model (default MODEL.stitched.onnx).")
@click.option("--shape", "shape", multiple=True, help="Planning sizes: batch=8,seq=128 or input=8x128.")
@click.option("--report", type=click.Path(path_type=Path), help="Write the plan as JSON.")
@click.option("--arch", "archs", multiple=True, default=("sm_80", "sm_90"), show_default=True,
              help="GPU architectures to embed cubins for (repeatable).")
@click.option("--time-limit", type=float, default=30.0, show_default=True, help="ILP solver time limit (s).")
@click.option("--no-verify", is_flag=True, help="Skip running the stitched model against the original.")
@verbosity
def optimize(model: Path, output: Path | None, shape: tuple[str, ...], report: Path | None,
             archs: tuple[str, ...], time_limit: float, no_verify: bool, verbose: bool, quiet: bool) -> None:
    """Fuse MODEL and write the stitched model."""
    from onnxstitch import optimize as run_optimize

    shapes = parse_shapes(shape)
    out = output or model.with_name(model.stem + ".stitched.onnx")
    if out.resolve() == model.resolve():
        raise BadInputError(f"{out}: refusing to overwrite the input model")
    progress = None if quiet else (lambda msg: console.print(f"[dim]… {msg}[/dim]") if verbose else None)
    result = run_optimize(model, shapes=shapes, archs=archs, time_limit_s=time_limit, progress=progress,
                          verify=not no_verify)
    save_atomic(result.model, out)
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(result.report.to_json(), indent=2))
    if not quiet:
        console.print(_summary(result.report, out))
        if result.report.plan.message:
            console.print(f"[yellow]{result.report.plan.message}[/yellow]")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--stitched", type=click.Path(path_type=Path), help="Stitched model (optimized now if omitted).")
@click.option("--shape", "shape", multiple=True, help="Input sizes: batch=8,seq=128 or input=8x128.")
@click.option("--warmup", type=int, default=20, show_default=True)
@click.option("--iters", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@verbosity
def bench(model: Path, stitched: Path | None, shape: tuple[str, ...], warmup: int, iters: int,
          as_json: bool, verbose: bool, quiet: bool) -> None:
    """Time MODEL on ONNX Runtime's CUDA EP against its stitched version."""
    from onnxstitch import bench as bench_mod
    from onnxstitch import load, optimize as run_optimize

    shapes = parse_shapes(shape)
    load.load(model)  # bad input fails here, before any GPU work
    sym = {k: v[0] for k, v in shapes.items() if len(v) == 1}
    overrides = {k: tuple(v) for k, v in shapes.items() if len(v) != 1}
    with tempfile.TemporaryDirectory() as tmp:
        if stitched is None:
            stitched = Path(tmp) / "stitched.onnx"
            save_atomic(run_optimize(model, shapes=shapes).model, stitched)
        res = bench_mod.run(model, stitched, warmup=warmup, iters=iters, dim_values=sym, overrides=overrides)
    if as_json:
        click.echo(json.dumps(res.to_json(), indent=2))
        return
    t = Table(title=f"{model} on {res.device} (onnxruntime {res.ort_version})")
    for col in ("", "median ms", "p90 ms", "CUDA nodes/run"):
        t.add_column(col, justify="right" if col else "left")
    for label, tm in (("ORT CUDA EP", res.stock), ("onnxstitch", res.stitched)):
        t.add_row(label, f"{tm.median_ms:.3f}", f"{tm.p90_ms:.3f}", f"{tm.launches_per_run:.0f}")
    console.print(t)
    console.print(f"speedup {res.speedup:.2f}×   max abs err {res.max_abs_err:.3g}   max rel err {res.max_rel_err:.3g}")


@main.command("build-library")
@verbosity
def build_library(verbose: bool, quiet: bool) -> None:
    """Build (or find) the custom-op library and print its path."""
    from onnxstitch import library_path

    click.echo(str(library_path()))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
