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
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch.schemes.gemm import generated as g  # noqa: E402

# Float32: bias, bias + residual, bias + exact GELU, ReLU (the GPU tests' chains), both tiles;
# float16: the exact GELU only (where cuBLASLt cannot run it).
CONFIGS = [g.Config(TP.FLOAT, a, True, r, t) for t in (g.WIDE, g.NARROW)
           for a, r in (("", False), ("", True), ("gelu_erf", False), ("relu", False))]
CONFIGS += [g.Config(TP.FLOAT16, "gelu_erf", True, False, t) for t in (g.WIDE, g.NARROW)]


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
