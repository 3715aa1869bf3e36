#!/usr/bin/env python3
"""The zoo report: every zoo model, float32 and float16, stock ORT CUDA EP vs onnxstitch (and
ORT's transformers optimizer where it applies), with and without CUDA graphs. Writes
zoo.json, zoo.md (a Markdown table) and zoo.png (speedups) into bench/results/<gpu>/.

    python scripts/zoo_report.py --zoo build/zoo --build        # on the GPU machine
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import bench, load  # noqa: E402
from onnxstitch.errors import first_line  # noqa: E402

# ORT's transformers optimizer knows these architectures: (model_type, heads, hidden); gpt2
# and vit need the sizes given (it cannot read them off the graph).
ORT_MODEL_TYPES = {"bert-base": ("bert", 0, 0), "gpt2": ("gpt2", 12, 768), "gpt2-block": ("gpt2", 12, 768),
                   "t5-small-encoder": ("t5", 0, 0), "vit-b16": ("vit", 12, 768)}


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def _entry(label: str, res: bench.BenchResult | None, err: str = "") -> dict:
    if res is None:
        return {"label": label, "error": err}
    return {"label": label, **{k: v.median_ms for k, v in res.configs.items()},
            "launches": {k: v.launches_per_run for k, v in res.configs.items()},
            "speedup": res.speedup, "max_abs_err": res.max_abs_err, "result": res.to_json()}


def measure(item: dict, iters: int, tmp: Path, reductions: bool = True, merge: bool = True,
            attention: bool = True, epilogues: bool = True, modes: tuple[str, ...] = ("plain", "graphs"),
            peers: bool = True) -> dict:
    """Optimize one zoo model and time it in each of `modes` (plain, graphs: with CUDA graphs),
    ORT's transformers optimizer too where it applies and `peers`; errors are recorded, not raised."""
    row: dict = {"model": item["name"], "dtype": item["dtype"], "shapes": item["shapes"], "epilogues": epilogues}
    shapes = {k: [v] for k, v in item["shapes"].items()}
    try:
        t0 = time.perf_counter()
        res = onnxstitch.optimize(item["path"], shapes=shapes, reductions=reductions, merge=merge,
                                    attention=attention, epilogues=epilogues)
        row["optimize_s"] = time.perf_counter() - t0
        row["plan"] = {"kernels_before": res.report.plan.kernels_before, "kernels_after": res.report.plan.kernels_after,
                       "groups": len(res.report.plan.groups)}
        row["verification"] = res.report.verification.to_json() if res.report.verification else None
        stitched = tmp / f"{item['name']}-{item['dtype']}.stitched.onnx"
        load.save(res.model, stitched)
    except Exception as e:
        row["error"] = f"optimize: {type(e).__name__}: {first_line(e)}"
        return row
    peers = {}
    model_type = ORT_MODEL_TYPES.get(item["name"]) if peers else None
    if model_type:
        try:
            peers["ORT transformers optimizer"] = str(bench.ort_transformers_optimized(
                item["path"], model_type[0], tmp / f"{item['name']}-{item['dtype']}.ort.onnx", *model_type[1:]))
        except Exception as e:
            row["peer_error"] = f"{type(e).__name__}: {first_line(e)}"
    row["runs"] = []
    for graphs in [m == "graphs" for m in modes]:
        label = "cuda graphs" if graphs else "plain"
        try:
            cfg = bench.BenchConfig(warmup=5, iters=iters, cuda_graph=graphs, profile_runs=2)
            r = bench.run(item["path"], stitched, config=cfg, shapes=item["shapes"], peers=peers)
            row["runs"].append(_entry(label, r))
        except Exception as e:
            row["runs"].append(_entry(label, None, f"{type(e).__name__}: {first_line(e)}"))
    return row


def symbol_values(entry: dict) -> dict[str, int]:
    """A zoo manifest entry's default benchmark shape, as values of its inputs' symbolic dims."""
    return {d: v for i in entry["inputs"] for d, v in zip(i["dims"], i["shape"]) if isinstance(d, str)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: list[dict], gpu: str, driver: str, ort_version: str) -> str:
    """The report table: one line per model, dtype and mode."""
    lines = [f"# onnxstitch zoo report — {gpu}", "",
             f"driver {driver}, onnxruntime {ort_version}, onnxstitch {onnxstitch.__version__}, "
             f"{time.strftime('%Y-%m-%d')}. Median latency in ms; speedup = stock / onnxstitch; "
             "launches = CUDA EP node executions per run."
             + (" Optimized with `--no-epilogues` (no GEMMs or convolutions through cuBLASLt/cuDNN)."
                if not all(r.get("epilogues", True) for r in rows) else ""), "",
             "| model | dtype | mode | stock ms | onnxstitch ms | speedup | ORT optimizer ms | launches stock → stitched | note |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    speedups: dict[str, list[float]] = {"plain": [], "cuda graphs": []}
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['dtype']} | — | | | | | | {row['error']} |")
            continue
        for run in row["runs"]:
            if "error" in run:
                lines.append(f"| {row['model']} | {row['dtype']} | {run['label']} | | | | | | {run['error'][:90]} |")
                continue
            speedups[run["label"]].append(run["speedup"])
            peer = run.get("ORT transformers optimizer")
            la = run["launches"]
            lines.append(f"| {row['model']} | {row['dtype']} | {run['label']} | {run[bench.STOCK]:.3f} | "
                         f"{run[bench.STITCHED]:.3f} | {run['speedup']:.2f}× | {'' if peer is None else f'{peer:.3f}'} | "
                         f"{la[bench.STOCK]:.0f} → {la[bench.STITCHED]:.0f} | |")
    lines += ["", "Geometric-mean speedup: " + ", ".join(f"{k} {geomean(v):.3f}× over {len(v)} runs"
                                                        for k, v in speedups.items() if v), ""]
    return "\n".join(lines)


def chart(rows: list[dict], path: Path, gpu: str) -> None:
    """Bar chart of speedups per model and dtype (plain and CUDA-graph runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, plain, graphs = [], [], []
    for row in rows:
        if "error" in row:
            continue
        by = {r["label"]: r.get("speedup", float("nan")) for r in row["runs"]}
        labels.append(f"{row['model']}\n{row['dtype']}")
        plain.append(by.get("plain", float("nan")))
        graphs.append(by.get("cuda graphs", float("nan")))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels)), 4.5))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], plain, width=0.4, label="plain")
    ax.bar([x + 0.2 for x in xs], graphs, width=0.4, label="CUDA graphs")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("speedup over stock ORT CUDA EP")
    ax.set_title(f"onnxstitch on {gpu}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, default=Path("build/zoo"), help="folder with manifest.json")
    ap.add_argument("--build", action="store_true", help="build the zoo first (needs torch, transformers)")
    ap.add_argument("--models", default="", help="comma-separated subset")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--deadline", type=float, default=0, help="stop starting new models after this many seconds")
    ap.add_argument("--append", action="store_true", help="add to an existing zoo.json instead of starting over")
    ap.add_argument("--no-reductions", dest="reductions", action="store_false",
                    help="leave row reductions to ONNX Runtime (optimize --no-reductions)")
    ap.add_argument("--no-merge-matmuls", dest="merge", action="store_false",
                    help="keep sibling MatMuls apart (optimize --no-merge-matmuls)")
    ap.add_argument("--no-attention", dest="attention", action="store_false",
                    help="leave attention chains to the other stages (optimize --no-attention)")
    ap.add_argument("--epilogues", action=argparse.BooleanOptionalAction, default=True,
                    help="run GEMMs and convolutions with their epilogues through cuBLASLt/cuDNN (optimize's default)")
    ap.add_argument("--modes", default="plain,graphs", help="comma-separated: plain, graphs (with CUDA graphs)")
    ap.add_argument("--no-peers", dest="peers", action="store_false", help="skip ORT's transformers optimizer")
    args = ap.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or set(modes) - {"plain", "graphs"}:
        ap.error(f"--modes {args.modes}: plain and/or graphs")
    started = time.monotonic()
    bench.require_gpu("the zoo report")
    if args.build:
        from scripts.build_zoo import main as build_zoo  # the zoo builder (torch, transformers)

        build_args = ["--out", str(args.zoo), "--dtypes", args.dtypes] + (["--models", args.models] if args.models else [])
        build_zoo(build_args)
    manifest = json.loads((args.zoo / "manifest.json").read_text())
    wanted = {m for m in args.models.split(",") if m}
    items = []
    for m in manifest["models"]:
        if (wanted and m["name"] not in wanted) or m["dtype"] not in args.dtypes.split(","):
            continue
        items.append({"name": m["name"], "dtype": m["dtype"], "path": str(args.zoo / m["path"]),
                      "shapes": symbol_values(m)})
    gpu = bench.gpu_name()
    out = args.out / _slug(gpu)
    out.mkdir(parents=True, exist_ok=True)
    rows = json.loads((out / "zoo.json").read_text()) if args.append and (out / "zoo.json").exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        for item in items:
            if args.deadline and time.monotonic() - started > args.deadline:
                print(f"deadline reached: {item['name']} {item['dtype']} and later models not measured", flush=True)
                break
            print(f"… {item['name']} {item['dtype']}", flush=True)
            try:
                rows.append(measure(item, args.iters, Path(tmp), args.reductions, args.merge,
                                    args.attention, args.epilogues, modes, args.peers))
            except Exception:
                traceback.print_exc()
                rows.append({"model": item["name"], "dtype": item["dtype"], "error": "crashed (see log)"})
            (out / "zoo.json").write_text(json.dumps(rows, indent=2, default=str))
    import onnxruntime as ort

    (out / "zoo.md").write_text(markdown(rows, gpu, bench.driver_version(), ort.__version__))
    chart(rows, out / "zoo.png", gpu)
    print((out / "zoo.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
