#!/usr/bin/env python3
"""Where a model's time goes on ORT's CUDA EP, node by node: ORT's profiler over a few runs of
the stock model and of its stitched model, the top nodes of each by total time.

    python3 scripts/node_profile.py model.onnx model.stitched.onnx --dims batch=8,samples=16000
    python3 scripts/node_profile.py silero.onnx silero.stitched.onnx --shape input=8x512,state=2x8x128 --value sr=16000
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

from onnxstitch import bench  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402
from onnxstitch.profile import Profile, record  # noqa: E402


def profile(path: Path, stitched: bool, feeds: dict, runs: int) -> Profile:
    """ORT's profile of `runs` runs after one warm-up (onnxstitch.profile reads it)."""
    import onnxruntime as ort

    from onnxstitch.runtime import session

    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def start(so):
        sess = session(str(path), providers=providers, sess_options=so) if stitched else \
            ort.InferenceSession(str(path), so, providers=providers)
        return bench._Bound(sess, feeds, None)

    return record(start, runs=runs, warmup=1)


def main() -> None:
    """Print each model's top nodes by total time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("stitched", type=Path)
    ap.add_argument("--dims", default="", help="symbolic dims: name=value,...")
    ap.add_argument("--shape", default="", help="input shapes: name=AxB,... (silero: input=8x512)")
    ap.add_argument("--value", default="", help="input values: name=v,... (silero: sr=16000)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.dims.split(",") if kv)}
    shapes = {k: tuple(int(d) for d in v.split("x")) for k, v in (kv.split("=") for kv in args.shape.split(",") if kv)}
    values = {k: float(v) for k, v in (kv.split("=") for kv in args.value.split(",") if kv)}
    feeds = random_feeds(onnx.load(str(args.model), load_external_data=False), 0, dims, shapes, values)
    for label, path, stitched in (("stock", args.model, False), ("stitched", args.stitched, True)):
        prof = profile(path, stitched, feeds, args.runs)
        print(f"== {label}: {prof.node_us_per_run:.0f} µs of node time per run, {len(prof.nodes)} nodes")
        print("   by op: " + ", ".join(f"{r.name} {r.us_per_run:.0f}" for r in prof.by_op(8)))
        for e in sorted(prof.nodes, key=lambda e: -e.total_us)[:args.top]:
            where = e.provider.replace("ExecutionProvider", "")
            print(f"   {e.total_us / prof.runs:9.1f} µs  {where:<5} {e.op_type:<16} {e.name[:70]}")


if __name__ == "__main__":
    main()
