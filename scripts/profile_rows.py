#!/usr/bin/env python3
"""A workload for ncu: one row-kernel case of scripts/bench_rows.py at a forced (or the
planner's) threads per row, launched a few times from its cubin.

    ncu --kernel-name regex:stitch --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python3 scripts/profile_rows.py softmax float16 512 --threads 32
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_elementwise import copy_bandwidth  # noqa: E402
from scripts.bench_rows import B, kernel_alone, layernorm, softmax  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["softmax", "layernorm"])
    ap.add_argument("dtype", choices=["float32", "float16"])
    ap.add_argument("size", type=int, help="softmax: sequence length; layernorm: rows")
    ap.add_argument("--threads", type=int, help="threads per row (default: the planner's)")
    args = ap.parse_args()
    dt = TP.FLOAT if args.dtype == "float32" else TP.FLOAT16
    model, dims = ((softmax(dt, args.size), {"batch": B}) if args.case == "softmax"
                   else (layernorm(dt, False), {"rows": args.size}))
    _, alone = kernel_alone(model, dims, copy_bandwidth(1 << 26), threads=args.threads)
    print(f"{args.case} {args.dtype} {args.size} T={args.threads or 'planner'}: {alone['kernel_ms'] * 1e3:.2f} us, "
          f"{alone['fraction_of_copy']:.1%} of copy, geometry {alone['row_geometry']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
