#!/usr/bin/env python3
"""Build the generated GEMMs (schemes/gemm/generated.py) the GPU scripts' models use, here on the
CPU machine (nvcc and the nvidia-cutlass wheel), into a cache folder to carry to the GPU machine
(gpu_wave.sh generated copies them into its ONNXSTITCH_CACHE): nvcc there would take a minute a
configuration out of the device time. The cache key is the source, the flags and the toolchain's
versions, so an object built here is used there only where nvcc's release and CUTLASS agree.

    python3 scripts/prebuild_gemms.py [--cache .carry/gcache] [--jobs 2]
"""
from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch.schemes.gemm import generated as g  # noqa: E402

# What the optimizer generates (schemes/gemm/match.py): float32 bias + exact GELU, both tiles.
# EXTRA=1 adds the other epilogues in both dtypes (for benchmarks that force them).
CONFIGS = [g.Config(TP.FLOAT, "gelu_erf", True, False, t) for t in (g.WIDE, g.NARROW)]
if os.environ.get("EXTRA") == "1":
    CONFIGS += [g.Config(d, a, True, r, t) for d in (TP.FLOAT, TP.FLOAT16) for t in (g.WIDE, g.NARROW)
                for a, r in (("", False), ("", True), ("relu", False), ("gelu_erf", False))
                if (d, a) != (TP.FLOAT, "gelu_erf")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(".carry/gcache"))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with ThreadPoolExecutor(args.jobs) as pool:
        built = pool.map(lambda c: g.build(g.source(c), c.name, args.cache), CONFIGS)
        for c, image in zip(CONFIGS, built):
            print(f"{c.name}: {len(image)} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
