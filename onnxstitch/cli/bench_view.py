"""`onnxstitch bench`'s tables: the timings, and with --profile where the time goes (the top op
types and GPU kernels of the stock and the stitched model, side by side)."""
from __future__ import annotations

from itertools import zip_longest

from rich.table import Table

from onnxstitch.bench import CUDA, GRAPH_PROFILE_NOTE, STITCHED, BenchResult
from onnxstitch.profile import Profile, Row


def timings(res: BenchResult, title: str) -> Table:
    """One row per configuration: latency percentiles, throughput, launches, error, speedup."""
    t = Table(title=title)
    where = res.providers[0].replace("ExecutionProvider", "")
    for col in ("", "median ms", "p90 ms", "p99 ms", "samples/s", f"{where} nodes/run", "max abs err", "speedup"):
        t.add_column(col, justify="right" if col else "left")
    for label, tm in res.configs.items():
        if res.cuda_graph:  # which rows ran through CUDA graphs: ORT cannot capture every model
            label += " (CUDA graph)" if tm.cuda_graph else " (plain: not capturable)"
        t.add_row(label, f"{tm.median_ms:.3f}", f"{tm.p90_ms:.3f}", f"{tm.p99_ms:.3f}", f"{tm.samples_per_s:,.0f}",
                  f"{tm.launches_per_run:.0f}", f"{tm.max_abs_err:.2g}", f"{res.stock.median_ms / tm.median_ms:.2f}×")
    return t


# Below this console width the stock and stitched tables are printed one above the other.
SIDE_BY_SIDE_WIDTH = 110


def _tables(title: str, what: str, stock: list[Row], stitched: list[Row], width: int) -> list[Table]:
    """The two top lists side by side in one table, or one table each on a narrow console."""
    sides = {"stock": stock, "stitched": stitched}
    if width < SIDE_BY_SIDE_WIDTH:
        return [_table(f"{side}: {title}", [side], what, [rows]) for side, rows in sides.items()]
    return [_table(title, list(sides), what, list(sides.values()))]


def _table(title: str, sides: list[str], what: str, columns: list[list[Row]]) -> Table:
    t = Table(title=title, show_header=True, header_style="bold")
    for side in sides:
        t.add_column(f"{side} {what}", no_wrap=True, overflow="ellipsis", min_width=12, max_width=60)
        for col, width in (("µs/run", 9), ("share", 6), ("calls/run", 9)):  # whole: a long name gives way first
            t.add_column(col, justify="right", no_wrap=True, min_width=width)
    for rows in zip_longest(*columns):
        cells: list[str] = []
        for r in rows:
            cells += ["", "", "", ""] if r is None else \
                [r.name, f"{r.us_per_run:,.1f}", f"{r.share:.1%}", f"{r.calls_per_run:g}"]
        t.add_row(*cells)
    return t


def _summary_line(name: str, p: Profile) -> str:
    line = f"{name}: {p.node_us_per_run:,.1f} µs of node time per run, {p.nodes_per_run():g} nodes/run"
    if p.kernels:
        line += f"; {p.kernel_us_per_run:,.1f} µs of GPU kernels, {p.kernels_per_run:g} launches/run"
    return line


def profile_tables(res: BenchResult, top: int, width: int) -> list[Table | str]:
    """What `bench --profile` prints after the timings: a note, the by-op (and by-kernel) tables
    (stock and stitched side by side where `width` allows) and one summary line per side."""
    stock, stitched = res.profiles[next(iter(res.configs))], res.profiles[STITCHED]
    out: list[Table | str] = [f"[bold]where the time goes[/bold]: ONNX Runtime's profile of {stock.runs} runs "
                              f"each (after {stock.skipped_runs} warm-up)"]
    if res.cuda_graph:
        out.append(f"[yellow]note:[/yellow] {GRAPH_PROFILE_NOTE}")
    out += _tables(f"top {top} op types by node time", "op", stock.by_op(top),
                   stitched.by_op(top), width)
    if stock.kernels or stitched.kernels:
        out += _tables(f"top {top} GPU kernels", "kernel", stock.by_kernel(top), stitched.by_kernel(top), width)
    elif res.providers[0] == CUDA:
        out.append("(this ORT build records no GPU kernel events: node times only, which on the CUDA EP "
                   "are host time, launches included)")
    else:
        out.append("(CPU run: the stitched model runs its fallback functions, listed as 'FusedKernel (fallback)')")
    out.append(_summary_line(f"stock {next(iter(res.configs))}", stock))
    out.append(_summary_line(f"stitched {STITCHED}", stitched))
    return out
