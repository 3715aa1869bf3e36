#!/usr/bin/env python3
"""Where a model's time goes on ORT's CUDA EP, node by node: ORT's profiler over a few runs of
the stock model and of its stitched model, the top nodes of each by total time.

    python3 scripts/node_profile.py model.onnx model.stitched.onnx --dims batch=8,samples=16000
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

from onnxstitch.inputs import random_feeds  # noqa: E402


def profile(path: Path, stitched: bool, feeds: dict, runs: int) -> dict[tuple[str, str], list[float]]:
    """(op, node) → durations in µs over `runs` runs after one warm-up."""
    import onnxruntime as ort

    from onnxstitch.runtime import session

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "prof")
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        sess = session(str(path), providers=providers, sess_options=so) if stitched else \
            ort.InferenceSession(str(path), so, providers=providers)
        for _ in range(runs + 1):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            times[(e["args"].get("op_name", "?"), e["name"][:-len("_kernel_time")])].append(float(e["dur"]))
    return times


def main() -> None:
    """Print each model's top nodes by total time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("stitched", type=Path)
    ap.add_argument("--dims", default="", help="symbolic dims: name=value,...")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.dims.split(",") if kv)}
    feeds = random_feeds(onnx.load(str(args.model), load_external_data=False), 0, dims)
    for label, path, stitched in (("stock", args.model, False), ("stitched", args.stitched, True)):
        times = profile(path, stitched, feeds, args.runs)
        total = sum(sum(v) for v in times.values()) / (args.runs + 1)
        print(f"== {label}: {total:.0f} µs of node time per run, {len(times)} nodes")
        by_op: dict[str, float] = defaultdict(float)
        for (op, _), v in times.items():
            by_op[op] += sum(v) / len(v)
        print("   by op: " + ", ".join(f"{op} {t:.0f}" for op, t in sorted(by_op.items(), key=lambda x: -x[1])[:8]))
        for (op, name), v in sorted(times.items(), key=lambda x: -sum(x[1]) / len(x[1]))[:args.top]:
            print(f"   {sum(v) / len(v):9.1f} µs  {op:<16} {name[:70]}")


if __name__ == "__main__":
    main()
