#!/usr/bin/env python3
"""Run a model N times on ONNX Runtime's CUDA EP (stitched models with the custom-op library)
with seeded random inputs: a workload for an external profiler (ncu) to watch.

    ncu --csv --metrics gpu__time_duration.sum python3 scripts/run_model.py model.onnx --iters 3
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

import onnxstitch  # noqa: E402
from onnxstitch import sizes  # noqa: E402
from onnxstitch import bench  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--shape", action="append", default=[], help="as onnxstitch bench: batch=8,sequence=128")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    model = onnx.load(str(args.model), load_external_data=False)
    given = sizes.resolve(model, sizes.parse(args.shape))
    bench.require_gpu("run_model")
    feeds = random_feeds(model, 0, given.dims, given.inputs)
    # The library registered either way: stock models run exactly as without it.
    sess = onnxstitch.session(str(args.model), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    for _ in range(args.iters):
        sess.run(None, feeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
