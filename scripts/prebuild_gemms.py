#!/usr/bin/env python3
"""Build the generated GEMMs (schemes/gemm/generated.py) the GPU scripts' models use, here on the
CPU machine (nvcc and the nvidia-cutlass wheel), into a cache folder to carry to the GPU machine
(gpu_wave.sh generated copies them into its ONNXSTITCH_CACHE): nvcc there would take a minute a
configuration out of the device time. The cache key is the source, the flags and the toolchain's
versions, so an object built here is used there only where nvcc's release and CUTLASS agree.

    python3 scripts/prebuild_gemms.py [--cache .carry/gcache] [--jobs 2] [--set default|stream-k|persistent|extra]

Sets: `default` what the optimizer generates for BERT-base and a LLaMA layer; `stream-k` bias and bias + residual (float32 and
float16) and float32 bias + exact GELU with the stream-K scheduler in both tiles; `persistent`
the bias epilogues on the persistent scheduler (scripts/bench_cutlass_configs.py compares the
three); `extra` the other epilogues in both dtypes (for benchmarks that force them).
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch.schemes.gemm import generated as g  # noqa: E402

# What the optimizer generates (schemes/gemm/match.py), both tiles: float32 bias + exact GELU; beside
# cuBLASLt, float32 bias and bias + residual (K-major weights), and half products with and without
# a bias and a residual (weights as stored), the ones BERT-base and a LLaMA layer use first.
DEFAULT = [g.Config(TP.FLOAT16, "", b, r, t, b_kmajor=False)
           for b, r, t in ((True, False, g.NARROW), (True, True, g.NARROW), (False, False, g.WIDE), (False, True, g.WIDE))]
DEFAULT += [g.Config(TP.FLOAT, "gelu_erf", True, False, t) for t in (g.WIDE, g.NARROW)]
DEFAULT += [g.Config(TP.FLOAT, "", True, r, t) for t in (g.WIDE, g.NARROW) for r in (False, True)]
DEFAULT += [g.Config(TP.FLOAT16, "", b, r, t, b_kmajor=False) for t in (g.WIDE, g.NARROW) for b in (True, False)
            for r in (False, True)]
DEFAULT = list(dict.fromkeys(DEFAULT))
SETS = {
    "default": DEFAULT,
    "stream-k": [g.Config(d, a, True, r, t, stream_k=True) for d in (TP.FLOAT, TP.FLOAT16) for t in (g.WIDE, g.NARROW)
                 for a, r in (("", False), ("", True), ("gelu_erf", False)) if d == TP.FLOAT or a == ""],
    "persistent": [g.Config(d, "", True, r, t) for d in (TP.FLOAT, TP.FLOAT16) for t in (g.WIDE, g.NARROW)
                   for r in (False, True)],
    "extra": [g.Config(d, a, True, r, t) for d in (TP.FLOAT, TP.FLOAT16) for t in (g.WIDE, g.NARROW)
              for a, r in (("", False), ("", True), ("relu", False), ("gelu_erf", False))
              if (d, a) != (TP.FLOAT, "gelu_erf")],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(".carry/gcache"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--set", action="append", choices=sorted(SETS), help="configurations to build (default: default)")
    args = ap.parse_args()
    configs = list(dict.fromkeys(c for name in (args.set or ["default"]) for c in SETS[name]))
    with ThreadPoolExecutor(args.jobs) as pool:
        built = pool.map(lambda c: g.build(g.source(c), c.name, args.cache), configs)
        for c, image in zip(configs, built):
            print(f"{c.name}: {len(image)} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
