#!/usr/bin/env python3
"""The corpus report: `onnxstitch.optimize` on every model of the real-model corpus
(scripts/build_corpus.py), each in a child process with a timeout, recording its status,
verification, optimize time per stage, peak memory and nodes and kernels before and after;
with --gpu (and a CUDA GPU with onnxruntime-gpu), stock ORT CUDA EP against the stitched
model too, with and without CUDA graphs. Writes corpus.json and corpus.md into --out.

    python scripts/corpus_report.py --slice cpu                     # CI's check (CPU)
    python scripts/corpus_report.py --models bert-ts,gpt2-dynamo --out /tmp/corpus
    python scripts/corpus_report.py --gpu                           # on the GPU machine

A spinner on a terminal says which model is at work; --quiet prints only the models that failed.

Exits 1 if any model met an internal error (an exception that is not a StitchError, one whose
message starts with "internal error", a crash or a timeout) or was written unverified (kernels
fused but verification skipped), so `--slice cpu` serves as a CI check.
"""
from __future__ import annotations

import argparse
import dataclasses
import contextlib
import json
import math
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OK, ERROR, INTERNAL = "ok", "error", "internal"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def _peak_rss_mb() -> float:
    """Peak resident memory of this process and its children, in MiB (ru_maxrss is KiB on Linux)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, kids) / 1024, 1)


def repro(path: str, shapes: Mapping[str, list[int]]) -> str:
    """The CLI command that reproduces one model's optimize."""
    shape = ",".join(f"{k}={'x'.join(str(v) for v in dims)}" for k, dims in shapes.items())
    # Quoted: paddle2onnx names dims "?", a shell wildcard.
    return f"onnxstitch optimize {shlex.quote(path)}" + (f" --shape {shlex.quote(shape)}" if shape else "") + " -v"


# ---------------------------------------------------------------- the child process


def _where(e: BaseException) -> str:
    """The innermost onnxstitch frame of an exception, file:line (function)."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "onnxstitch" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.name})"


def _bench_runs(job: Mapping[str, Any], stitched: Path) -> list[dict[str, Any]]:
    """Stock ORT CUDA EP against the stitched model, plain and with CUDA graphs (as
    scripts/zoo_report.py times the zoo)."""
    from onnxstitch import bench
    from onnxstitch.errors import first_line

    runs = []
    for graphs in (False, True):
        label = "cuda graphs" if graphs else "plain"
        try:
            cfg = bench.BenchConfig(warmup=10, iters=job["iters"], cuda_graph=graphs, profile_runs=2)
            r = bench.run(job["path"], stitched, config=dataclasses.replace(cfg, values=job.get("values", {})),
                          shapes=job["shapes"])
            if graphs and not r.stock.cuda_graph and not r.stitched.cuda_graph:
                # Neither side captured: bench timed both plain again, a second reading of the
                # plain row (tashkeel-bilstm-int8, CPU-bound: 1.05x plain, then 0.89x), not a mode.
                runs.append({"label": label, "na": "neither stock ORT nor the stitched model captures a CUDA graph"})
                continue
            runs.append({"label": label, "stock_ms": r.stock.median_ms, "stitched_ms": r.stitched.median_ms,
                         "speedup": r.speedup, "max_abs_err": r.max_abs_err,
                         "launches": {k: v.launches_per_run for k, v in r.configs.items()}})
        except Exception as e:
            if graphs and "graph capture" in str(e) and "stock ONNX Runtime" in str(e):
                # Stock ORT itself cannot capture this model (nodes on the CPU): nothing to compare.
                runs.append({"label": label, "na": "stock ORT cannot capture a CUDA graph of this model"})
            else:
                runs.append({"label": label, "error": f"{type(e).__name__}: {first_line(e)}"})
    return runs


def as_given(row: Mapping[str, Any]) -> bool:
    """Whether optimize wrote the model as it was given (nothing fused: every group given back,
    or none found): its speed is stock ORT's by construction, and a timing of it only measures
    the bench's noise (a CPU-EP-bound int8 LSTM read 0.89× and 1.04× of itself beside other jobs)."""
    return row.get("status") == OK and not row.get("fused_kernels") and not row.get("attention_kernels") and \
        row.get("nodes_after") == row.get("nodes_before")


def speedup(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """The row's speedup over stock ORT: with CUDA graphs where stock ORT can capture the
    model, else plain; 1 for a model written as given ("as given"); None when it was not timed."""
    by = {x["label"]: x for x in row.get("runs", [])}
    if as_given(row) and any("speedup" in x for x in by.values()):
        return "as given", 1.0
    for label in ("cuda graphs", "plain"):
        if "speedup" in by.get(label, {}):
            return label, by[label]["speedup"]
        if label == "cuda graphs" and "error" in by.get(label, {}):
            return None
    return None


def child(job: Mapping[str, Any]) -> dict[str, Any]:
    """Optimize one model (in the child process) and describe what happened."""
    import onnxstitch
    from onnxstitch.errors import StitchError, first_line
    from onnxstitch.measure import summary as measure_summary

    row: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        res = onnxstitch.optimize(job["path"], shapes=job["shapes"], values=job.get("values", {}),
                                  **job.get("options", {}))
    except Exception as e:
        msg = first_line(e)
        internal = not isinstance(e, StitchError) or msg.startswith("internal error")
        row.update(status=INTERNAL if internal else ERROR, error=f"{type(e).__name__}: {msg}", where=_where(e),
                   optimize_s=round(time.perf_counter() - t0, 2), peak_rss_mb=_peak_rss_mb())
        return row
    rep = res.report
    ver = rep.verification
    row.update(status=OK, optimize_s=round(time.perf_counter() - t0, 2),
               stage_seconds={k: round(v, 3) for k, v in rep.stage_seconds.items()},
               nodes_before=rep.nodes_before, nodes_after=rep.nodes_after,
               kernels_before=rep.plan.kernels_before, kernels_after=rep.plan.kernels_after,
               fused_kernels=len(rep.kernels), attention_kernels=len(rep.attention),
               verification=ver.to_json() if ver else None,
               dropped=list(rep.dropped), given_back=list(rep.given_back), plan_choice=rep.plan_choice,
               gate=rep.timing.to_json() if rep.timing else rep.gate_note or None,
               measured=measure_summary(rep.costs), measured_groups=_measured_groups(rep),
               # Written with generated kernels that no check compared against the original.
               unverified=bool(rep.kernels) and (ver is None or bool(ver.skipped) or ver.tensors_checked == 0))
    row["peak_rss_mb"] = _peak_rss_mb()
    if job.get("keep"):  # timed later, one model at a time (main's timing phase)
        res.save(job["keep"])
    return row


def _measured_groups(rep: Any) -> list[dict[str, Any]]:
    """Each group the GPU timed, with what the cost model predicted of it and its scheme and
    bytes: the rows a calibration of the cost model fits (docs/next-steps.md, ninth session:
    the reports kept only per-model medians, and only the CNN reports kept their groups)."""
    planned = {g.name: g for g in rep.plan.groups}
    rows = []
    for c in rep.costs:
        g = planned.get(c.group)
        if not c.measured or g is None:
            continue
        rows.append({"group": c.group, "scheme": g.scheme, "bytes": g.predicted_bytes, "nodes": len(g.nodes),
                     "predicted_us": round(c.predicted_us, 3), "predicted_stock_us": round(c.predicted_stock_us, 3),
                     "ours_us": round(c.ours_us, 3), "stock_us": round(c.stock_us, 3), "source": c.source})
    return rows


def time_child(job: Mapping[str, Any]) -> dict[str, Any]:
    """Time one optimized model (in the child process): stock against stitched."""
    return {"runs": _bench_runs(job, Path(job["keep"]))}


# ---------------------------------------------------------------- the parent


def _job(entry: Mapping[str, Any], corpus: Path, gpu: bool, iters: int, keep: Path | None,
         options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"path": str(corpus / entry["file"]), "shapes": entry["shapes"], "options": dict(options or {}),
            "values": dict(entry.get("values", {})),
            "input_names": [i["name"] for i in entry["inputs"]], "gpu": gpu, "iters": iters,
            "keep": str(keep / f"{entry['name']}.stitched.onnx") if keep else ""}


def _timing_env(device: int) -> dict[str, str]:
    """The environment of a child on GPU `device`: that GPU alone, and the file jobs sharing it
    hold while they time (measure.timing_lock)."""
    from onnxstitch import ortio

    lock = Path(tempfile.gettempdir()) / f"onnxstitch-timing-gpu{device}.lock"
    return dict(os.environ, CUDA_VISIBLE_DEVICES=str(device), **{ortio.TIMING_LOCK_ENV: str(lock)})


def _in_child(kind: str, job: Mapping[str, Any], timeout: float, device: int | None = None) -> dict[str, Any]:
    """Run `child` (kind "optimize") or `time_child` ("time") in a fresh process (on GPU `device`
    alone when given); a timeout or a crash of the child is an internal error."""
    with tempfile.TemporaryDirectory() as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "row.json"
        job_file.write_text(json.dumps(job))
        t0 = time.perf_counter()
        try:
            env = None if device is None else _timing_env(device)
            done = subprocess.run([sys.executable, __file__, "--child", kind, str(job_file), str(out_file)],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"status": INTERNAL, "error": f"timeout: {kind} ran past {timeout:.0f} s",
                    "optimize_s": round(time.perf_counter() - t0, 1)}
        if out_file.exists():
            return json.loads(out_file.read_text())
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": INTERNAL, "error": f"crashed ({kind}): exit status {done.returncode}: {tail}",
            "optimize_s": round(time.perf_counter() - t0, 1)}


# optimize's options as the command line says them, for the repro line.
FLAGS = {("epilogues", False): "--no-epilogues", ("gate", False): "--no-gate"}


def measure(entry: Mapping[str, Any], corpus: Path, timeout: float, gpu: bool, iters: int,
            keep: Path | None = None, options: Mapping[str, Any] | None = None,
            device: int | None = None) -> dict[str, Any]:
    """Optimize one manifest entry in a fresh process with `options` (optimize's keywords; the
    stitched model written into `keep` when given, for timing later), on GPU `device` if given."""
    path = str(corpus / entry["file"])
    row: dict[str, Any] = {"model": entry["name"], "source": entry["source"], "exporter": entry["exporter"],
                           "opset": entry.get("opset"), "bytes": entry["bytes"], "shapes": entry["shapes"],
                           "repro": repro(path, entry["shapes"]) + "".join(
                               f" {flag}" for (k, v), flag in FLAGS.items() if (options or {}).get(k, not v) == v)}
    return row | _in_child("optimize", _job(entry, corpus, gpu, iters, keep, options), timeout, device)


def _verification(row: Mapping[str, Any]) -> str:
    ver = row.get("verification")
    if ver is None:
        return "none"
    if ver["skipped"]:
        return f"skipped: {ver['skipped']}"
    back = f"; {len(row['given_back'])} given back" if row.get("given_back") else ""
    return f"{ver['tensors_checked']} tensors on {ver['device']}, worst {ver['worst_relative_error']:.1e}{back}"


def markdown(rows: list[dict[str, Any]], where: str, summary: str) -> str:
    """The report table: one line per model; GPU timings when measured."""
    import onnxstitch

    timed = any(r.get("runs") for r in rows)
    head = "| model | source | exporter | opset | MB | status | nodes | kernels | fused | verification | optimize s | peak MB |"
    rule = "| --- | --- | --- | ---: | ---: | --- | --- | --- | ---: | --- | ---: | ---: |"
    if timed:
        head += " stock ms | stitched ms | graphs: stock ms | graphs: stitched ms | speedup |"
        rule += " ---: | ---: | ---: | ---: | ---: |"
    lines = [f"# onnxstitch corpus report — {where}", "",
             f"onnxstitch {onnxstitch.__version__}, {time.strftime('%Y-%m-%d')}. {summary}", "", head, rule]
    for r in rows:
        status = r["status"] if r["status"] == OK else f"{r['status'].upper()}: {r['error'][:120]}"
        if r.get("unverified"):
            status += " (UNVERIFIED)"
        if r.get("dropped"):
            status += f" ({len(r['dropped'])} dropped)"
        ok = r["status"] == OK
        nodes = f"{r['nodes_before']} → {r['nodes_after']}" if ok else ""
        kernels = f"{r['kernels_before']} → {r['kernels_after']}" if ok else ""
        line = (f"| {r['model']} | {r['source']} | {r['exporter']} | {r['opset'] or ''} | {r['bytes'] / 2**20:.1f} | "
                f"{status.replace('|', '/')} | {nodes} | {kernels} | {r.get('fused_kernels', '')} | "
                f"{_verification(r) if ok else ''} | {r.get('optimize_s', '')} | {r.get('peak_rss_mb', '')} |")
        if timed:
            by = {x["label"]: x for x in r.get("runs", [])}
            cells = []
            for label in ("plain", "cuda graphs"):
                x = by.get(label, {})
                cells += ([f"{x['stock_ms']:.3f}", f"{x['stitched_ms']:.3f}"] if "stock_ms" in x else
                          ["n/a", "n/a"] if "na" in x else ["error", "error"] if "error" in x else ["", ""])
            got = speedup(r)
            timed_as = "; ".join(f"{x['label']} {x['speedup']:.2f}×" for x in r.get("runs", []) if x.get("speedup"))
            note = {"plain": " (plain)", "as given": f" (written as given; timed {timed_as})"}.get(got[0], "") if got else ""
            cells.append(f"{got[1]:.2f}×{note}" if got else "")
            line += " " + " | ".join(cells) + " |"
        lines.append(line)
    return "\n".join(lines) + "\n"


# A model timed under this fraction of stock ORT's speed counts as slower (timing noise aside).
SLOWER = 0.97


def _summary(rows: list[dict[str, Any]]) -> str:
    count = {s: sum(r["status"] == s for r in rows) for s in (OK, ERROR, INTERNAL)}
    unverified = sum(bool(r.get("unverified")) for r in rows)
    out = (f"{len(rows)} models, {count[OK]} ok, {count[ERROR]} errors, {count[INTERNAL]} internal errors, "
           f"{unverified} unverified writes")
    timed = [s for r in rows if (s := speedup(r)) is not None]
    if timed:
        values = [v for _, v in timed]
        geo = math.exp(sum(math.log(v) for v in values) / len(values))
        given = sum(how == "as given" for how, _ in timed)
        out += (f"; timed {len(timed)} (with CUDA graphs where stock ORT captures them, else plain"
                f"{f'; {given} written as given count 1.00×' if given else ''}): "
                f"geometric mean {geo:.2f}×, {sum(v >= 1.05 for v in values)} ≥ 1.05×, "
                f"{sum(v < SLOWER for v in values)} under {SLOWER}×")
    return out


def _spinner(text: str) -> Any:
    """A rich status line on stderr: animated on a terminal, nothing in a log."""
    from rich.console import Console

    return Console(stderr=True).status(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path("build/corpus"), help="folder with manifest.json")
    ap.add_argument("--slice", choices=("cpu",), help="only the models of the CPU slice")
    ap.add_argument("--models", default="", help="comma-separated subset")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per model (default 600)")
    ap.add_argument("--gpu", action="store_true", help="also time stock ORT CUDA EP against the stitched model")
    ap.add_argument("--iters", type=int, default=60, help="timed runs per configuration with --gpu")
    ap.add_argument("--out", type=Path, help="output folder (default bench/results/<gpu or cpu>/corpus)")
    ap.add_argument("--epilogues", action=argparse.BooleanOptionalAction, default=True,
                    help="optimize with GEMM and conv epilogues (optimize's default; --no-epilogues without)")
    ap.add_argument("--no-gate", dest="gate", action="store_false",
                    help="optimize without measured costs and the gate (optimize --no-gate): the plan as planned")
    ap.add_argument("--jobs", type=int, default=1, help="models optimized at once (timing stays one at a time)")
    ap.add_argument("--gpus", type=int, default=0,
                    help="spread the optimizing over this many GPUs (model i on GPU i mod N; timing stays on one), "
                         "so that concurrent jobs do not measure their kernels on one busy GPU")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the models that failed")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "JOB", "ROW"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, job = args.child[0], json.loads(Path(args.child[1]).read_text())
        row = child(job) if kind == "optimize" else time_child(job)
        Path(args.child[2]).write_text(json.dumps(row, default=str))
        return 0

    def say(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    gpu = False
    where = "cpu"
    if args.gpu:
        from onnxstitch import bench
        from onnxstitch.errors import StitchError

        try:
            bench.require_gpu("corpus timings")
            gpu, where = True, bench.gpu_name()
        except StitchError as e:
            say(f"{e}; optimizing only")
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    wanted = {m for m in args.models.split(",") if m}
    entries = [e for e in manifest["models"] if (not wanted or e["name"] in wanted)
               and (args.slice is None or e.get("slice") == args.slice)]
    missing = wanted - {e["name"] for e in entries}
    if missing:
        ap.error(f"not in {args.corpus / 'manifest.json'}: {', '.join(sorted(missing))}")
    out = args.out or Path("bench/results") / (_slug(where) if gpu else "cpu") / "corpus"
    out.mkdir(parents=True, exist_ok=True)

    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    status = contextlib.nullcontext() if args.quiet else _spinner(f"optimizing {len(entries)} models")
    with tempfile.TemporaryDirectory() as keep_dir, ThreadPoolExecutor(max(1, args.jobs)) as pool, status as spin:
        keep = Path(keep_dir) if gpu else None
        # Optimizing runs `--jobs` models at once; timings are taken one model at a time after.
        options = {"epilogues": args.epilogues, "gate": args.gate}
        def optimized(i: int) -> dict[str, Any]:
            return measure(entries[i], args.corpus, args.timeout, gpu, args.iters, keep, options,
                           i % args.gpus if args.gpus > 1 else None)

        for e, row in zip(entries, pool.map(optimized, range(len(entries)))):
            rows.append(row)
            note = row.get("error", "") + (" UNVERIFIED" if row.get("unverified") else "")
            say(f"{e['name']:<28} {row['status']:<9} {row.get('optimize_s', 0):>7.1f}s "
                f"{row.get('peak_rss_mb', 0):>7.0f}MB  {note[:150]}")
            if spin is not None:
                spin.update(f"optimized {len(rows)}/{len(entries)} models")
            (out / "corpus.json").write_text(json.dumps(rows, indent=1, default=str))  # partial results survive
        for e, row in zip(entries, rows):
            if keep is None or row["status"] != OK:
                continue
            if spin is not None:
                spin.update(f"timing {e['name']}")
            got = _in_child("time", _job(e, args.corpus, gpu, args.iters, keep), args.timeout)
            row.update(got if "runs" in got else {"runs": [{"label": "plain", "error": got.get("error", "")}]})
            speed = " ".join(f"{x['label']} {x['speedup']:.2f}x" if "speedup" in x else
                             f"{x['label']} {(x.get('error') or x.get('na', ''))[:80]}" for x in row["runs"])
            say(f"{e['name']:<28} {speed}")
            (out / "corpus.json").write_text(json.dumps(rows, indent=1, default=str))
    summary = _summary(rows)
    (out / "corpus.md").write_text(markdown(rows, where, summary))
    say(f"{summary} in {time.perf_counter() - started:.0f} s; wrote {out / 'corpus.json'} and {out / 'corpus.md'}")
    bad = [r for r in rows if r["status"] == INTERNAL or r.get("unverified")]
    for r in bad:
        print(f"{r['model']}: {r.get('error', 'unverified write')}\n    {r['repro']}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
