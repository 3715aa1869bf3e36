#!/usr/bin/env python3
"""Summarise an `ncu --csv --metrics gpu__time_duration.sum` log: GPU time per kernel name and
per kind (GEMM, onnxstitch, other), per model run. The workload is scripts/run_model.py with
--iters N; the first `--skip` runs (warm-up) are dropped.

    ncu --csv --clock-control none --metrics gpu__time_duration.sum python3 scripts/run_model.py M \\
        --iters 3 > prof.csv
    python3 scripts/kernel_profile.py prof.csv --runs 3 --skip 1 --json prof.json
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import defaultdict
from pathlib import Path


def kind(name: str) -> str:
    low = name.lower()
    if name.startswith("stitch_"):
        return "onnxstitch"
    if any(k in low for k in ("gemm", "cutlass", "sm90_xmma", "cublas", "xmma", "ampere_sgemm", "gemv", "nvjet")):
        return "GEMM"
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--runs", type=int, required=True, help="model runs in the log")
    ap.add_argument("--skip", type=int, default=1, help="leading runs to drop")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    text = args.csv.read_text(errors="replace")
    start = text.find('"ID"')
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Metric Name") == "gpu__time_duration.sum"]
    per_run = len(rows) // args.runs
    kept = rows[per_run * args.skip:]
    runs = args.runs - args.skip
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "msecond": 1e3, "ms": 1e3}
    by_name: dict[str, list[float]] = defaultdict(list)
    for r in kept:
        us = float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", "ns").strip(), 1e-3)
        by_name[r["Kernel Name"]].append(us)
    by_kind: dict[str, float] = defaultdict(float)
    count_kind: dict[str, int] = defaultdict(int)
    for name, v in by_name.items():
        by_kind[kind(name)] += sum(v) / runs
        count_kind[kind(name)] += len(v) // runs
    total = sum(by_kind.values())
    print(f"{per_run} kernels per run, {total:.1f} µs of GPU time per run")
    for k in sorted(by_kind, key=by_kind.get, reverse=True):
        print(f"  {k:12} {by_kind[k]:9.1f} µs  {count_kind[k]:4d} kernels")
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    for name, v in top:
        print(f"  {sum(v) / runs:9.1f} µs  {len(v) // runs:4d}×  {name[:110]}")
    if args.json:
        args.json.write_text(json.dumps({"kernels_per_run": per_run, "total_us": total, "by_kind": by_kind,
                                         "count_by_kind": count_kind,
                                         "by_name": {n: {"us": sum(v) / runs, "count": len(v) // runs}
                                                     for n, v in by_name.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
