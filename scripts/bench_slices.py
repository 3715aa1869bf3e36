#!/usr/bin/env python3
"""Benchmark: folded Slice/Split (kernels reading boxes of their inputs) and stitched Concat
(operands read in windows of its output) — GPT-2's fused QKV projection split into heads, a
gated linear unit, LLaMA's rotary embedding — stock ORT against the stitched model, end to
end, plain and with CUDA graphs, float32 and float16, one run.

    python scripts/bench_slices.py --out slices.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import onnx
from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import bench  # noqa: E402
from tests.concat_models import rope  # noqa: E402
from tests.slice_models import glu, qkv_split  # noqa: E402


def measure(label: str, model: onnx.ModelProto, plan: dict, run: dict, iters: int) -> dict:
    res = onnxstitch.optimize(model, shapes=plan, verify=False)
    row: dict = {"case": label, "nodes_before": len(model.graph.node), "nodes_after": len(res.model.graph.node)}
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "m.onnx", Path(tmp) / "m.stitched.onnx"
        onnx.save(model, src)
        onnx.save(res.model, dst)
        for graphs in (False, True):
            b = bench.run(src, dst, config=bench.BenchConfig(warmup=20, iters=iters, cuda_graph=graphs), shapes=run)
            row["cuda_graphs" if graphs else "plain"] = {
                "stock_ms": b.stock.median_ms, "stitched_ms": b.stitched.median_ms, "speedup": b.speedup,
                "launches_stock": b.stock.launches_per_run, "launches_stitched": b.stitched.launches_per_run,
                "max_abs_err": b.max_abs_err}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_slices.json"))
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for dt in (TP.FLOAT, TP.FLOAT16):
        name = TP.DataType.Name(dt).lower()
        dims = {"batch": 8, "seq": 128}
        rows.append(measure(f"GPT-2 QKV split {name} [8,128,2304]", qkv_split(12, 64, dt)[0],
                            {k: [v] for k, v in dims.items()}, dims, args.iters))
        rows.append(measure(f"GLU {name} [8192, 2x2048]", glu(2048, dt)[0], {"batch": [8192]}, {"batch": 8192},
                            args.iters))
        dims = {"batch": 4, "seq": 512}
        rows.append(measure(f"LLaMA RoPE {name} [4,32,512,128]", rope(32, 128, dt)[0],
                            {k: [v] for k, v in dims.items()}, dims, args.iters))
    args.out.write_text(json.dumps({"gpu": bench.gpu_name(), "cases": rows}, indent=2))
    print(f"GPU {bench.gpu_name()}")
    print(f"{'case':36} {'mode':12} {'stock ms':>9} {'stitched ms':>11} {'speedup':>8} {'launches':>10}")
    for r in rows:
        for mode in ("plain", "cuda_graphs"):
            m = r[mode]
            print(f"{r['case']:36} {mode:12} {m['stock_ms']:9.4f} {m['stitched_ms']:11.4f} {m['speedup']:8.2f} "
                  f"{m['launches_stock']:4.0f} → {m['launches_stitched']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
