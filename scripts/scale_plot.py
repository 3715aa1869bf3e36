#!/usr/bin/env python3
"""Optimize time and peak memory against model size: the corpus's rows (corpus.json from
scripts/corpus_report.py) and synthetic transformer-like stacks of 10^2 to 10^4 nodes optimized
here, each in a child process. Writes scaling.json and scaling.png into --out.

    python scripts/scale_plot.py --corpus bench/results/nvidia-h100/corpus/corpus.json \\
        --out bench/results/cpu/scaling
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def stack(blocks: int, width: int = 64) -> "onnx.ModelProto":  # noqa: F821 (imported in the body)
    """`blocks` × [MatMul, bias Add, LayerNorm-like Sub/Mul/Add, Sigmoid, Mul, residual Add,
    ReduceMean]: 10 nodes a block, each with its own small weights."""
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for b in range(blocks):
        w, bias = f"w{b}", f"b{b}"
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32), w),
                  numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), bias)]
        p = f"t{b}_"
        nodes += [helper.make_node("MatMul", [x, w], [p + "m"]), helper.make_node("Add", [p + "m", bias], [p + "a"]),
                  helper.make_node("ReduceMean", [p + "a"], [p + "mu"], axes=[-1]),
                  helper.make_node("Sub", [p + "a", p + "mu"], [p + "c"]), helper.make_node("Mul", [p + "c", p + "c"], [p + "q"]),
                  helper.make_node("ReduceMean", [p + "q"], [p + "v"], axes=[-1]),
                  helper.make_node("Add", [p + "v", p + "c"], [p + "n"]), helper.make_node("Sigmoid", [p + "n"], [p + "s"]),
                  helper.make_node("Mul", [p + "n", p + "s"], [p + "g"]), helper.make_node("Add", [p + "g", x], [p + "o"])]
        x = p + "o"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", width])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def measure(path: Path, timeout: float) -> dict:
    """Optimize `path` in a child process: wall seconds and peak resident MB."""
    code = ("import resource, sys, onnxstitch; onnxstitch.optimize(sys.argv[1], shapes={'batch': [8]}); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    peak_kb = int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0
    return {"seconds": round(time.perf_counter() - t0, 2), "peak_mb": round(peak_kb / 1024, 1),
            "ok": done.returncode == 0, "error": (done.stderr.strip().splitlines() or [""])[-1][:200]}


def main() -> None:
    """Measure the synthetic stacks, merge the corpus rows, plot."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, action="append", default=[], help="corpus.json (repeatable)")
    ap.add_argument("--blocks", default="10,100,1000", help="synthetic stack sizes, in blocks of 10 nodes")
    ap.add_argument("--points", type=Path, action="append", default=[],
                    help="a JSON list of points measured elsewhere (model, source, nodes, bytes, seconds, peak_mb)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=Path("bench/results/cpu/scaling"))
    args = ap.parse_args()
    import onnx

    args.out.mkdir(parents=True, exist_ok=True)
    points = []
    for blocks in (int(b) for b in args.blocks.split(",") if b):
        with tempfile.TemporaryDirectory() as tmp:
            model = stack(blocks)
            path = Path(tmp) / "stack.onnx"
            onnx.save(model, str(path))
            size = path.stat().st_size
            got = measure(path, args.timeout)
        points.append({"model": f"stack-{blocks}", "source": "synthetic (CPU machine)", "nodes": len(model.graph.node),
                       "bytes": size, **got})
        print(points[-1], flush=True)
    for corpus in args.corpus:
        for r in json.loads(corpus.read_text()):
            if r.get("status") == "ok":
                points.append({"model": r["model"], "source": f"corpus ({corpus.parent.parent.name})",
                               "nodes": r["nodes_before"], "bytes": r["bytes"], "seconds": r["optimize_s"],
                               "peak_mb": r["peak_rss_mb"], "ok": True})
    for extra in args.points:
        points += [p | {"ok": True} for p in json.loads(extra.read_text())]
    (args.out / "scaling.json").write_text(json.dumps(points, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for source in sorted({p["source"] for p in points}):
        sel = [p for p in points if p["source"] == source and p["ok"]]
        a.scatter([p["nodes"] for p in sel], [p["seconds"] for p in sel], label=source, s=18)
        b.scatter([p["bytes"] / 2**20 for p in sel], [p["peak_mb"] for p in sel], label=source, s=18)
    a.set(xscale="log", yscale="log", xlabel="nodes", ylabel="optimize wall time, s (child process)")
    b.set(xscale="log", yscale="log", xlabel="model size, MiB", ylabel="peak resident memory, MiB")
    a.legend(fontsize=8)
    fig.suptitle("onnxstitch optimize: time and memory against model size")
    fig.tight_layout()
    fig.savefig(args.out / "scaling.png", dpi=110)
    print(f"wrote {args.out / 'scaling.png'} and {args.out / 'scaling.json'}")


if __name__ == "__main__":
    main()
