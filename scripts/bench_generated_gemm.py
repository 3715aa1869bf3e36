#!/usr/bin/env python3
"""Generated GEMMs and K-major weights (issue 38) against cuBLASLt at BERT-base's and a LLaMA
layer's shapes.

Per shape, dtype and epilogue (bias; bias + residual; bias + exact GELU), one model of `--copies`
products of one A (weights of their own, read from memory as in a model), and what runs it:

- stock ONNX Runtime's nodes, and its MatMul alone (`plain`: the product without its epilogue);
- onnxstitch's default (`kmajor`: a cuBLASLt epilogue, on the weight stored [N, K] in float32;
  for the exact GELU, cuBLASLt's bias epilogue and a stitched GELU kernel);
- the same nodes on the weight as the model stores it, [K, N] (`rowmajor`);
- with --arch sm_90 --generated-gemms all (`generated`: for the exact GELU, the GELU inside a
  CUTLASS kernel, in float32 only; for the others, a CUTLASS kernel beside cuBLASLt, the node
  keeping the faster of the two as timed at its first call).

All timed together, round by round, in CUDA graphs (onnxstitch.bench); µs per product are the
median run over the copies. Outputs are compared with the stock model's. TFLOP/s against the
card's dense peak (TF32 494.7, FP16 989.4 on H100/H200). (bench/results/nvidia-h200/wave3k was
taken with this script at 1fbcc67, when bias and residual chains carried a CUTLASS kernel too:
its `off` column is `rowmajor` here, its `cublaslt` column `kmajor`.)

    python3 scripts/bench_generated_gemm.py [--out generated_gemm.json] [--copies 8] [--iters 100]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch import Options, bench, optimize  # noqa: E402
from onnxstitch.runtime import session as stitch_session  # noqa: E402
from onnxstitch.schemes.gemm.match import FP16_TFLOPS, TF32_TFLOPS  # noqa: E402
from tests.gemm_models import activation_nodes  # noqa: E402

# (M, K, N): BERT-base at batch 8 × 128, then a LLaMA-style layer (2048 rows; TinyLlama's widths).
SHAPES = ((1024, 768, 2304), (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768),
          (2048, 2048, 2560), (2048, 2048, 2048), (2048, 2048, 11264), (2048, 5632, 2048))
EPILOGUES = ("bias", "residual", "gelu_erf")
WITHIN = 1.05


def stock_model(m: int, k: int, n: int, dtype: int, copies: int, epilogue: str | None) -> onnx.ModelProto:
    """`copies` products of a: MatMul [+ Add(bias) [+ Add(r) | + exact GELU]]; epilogue None: the product alone."""
    rng = np.random.default_rng(0)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    nodes, inits = [], []
    for i in range(copies):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_dtype), f"w{i}"))
        y = f"y{i}"
        nodes.append(helper.make_node("MatMul", ["a", f"w{i}"], [y if epilogue is None else f"p{i}"]))
        if epilogue is None:
            continue
        inits.append(numpy_helper.from_array((rng.standard_normal(n) * 0.5).astype(np_dtype), f"b{i}"))
        biased = f"l{i}" if epilogue != "bias" else y
        nodes.append(helper.make_node("Add", [f"p{i}", f"b{i}"], [biased]))
        if epilogue == "residual":
            nodes.append(helper.make_node("Add", [biased, "r"], [y]))
        elif epilogue == "gelu_erf":
            act, consts = activation_nodes("gelu_erf", biased, y, dtype)
            nodes += act
            inits += consts
    ins = [helper.make_tensor_value_info("a", dtype, [m, k])]
    if epilogue == "residual":
        ins.append(helper.make_tensor_value_info("r", dtype, [m, n]))
    outs = [helper.make_tensor_value_info(f"y{i}", dtype, [m, n]) for i in range(copies)]
    return helper.make_model(helper.make_graph(nodes, "gemms", ins, outs, inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def row_major(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every gemm node that reads a K-major weight (`<w>~kmajor`) reading it as
    stored, [K, N] (gemm_trans_b 0)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    for node in out.graph.node:
        if node.domain == "com.onnxstitch" and len(node.input) > 1 and node.input[1].endswith("~kmajor"):
            name = node.input[1][:-len("~kmajor")]
            if name not in inits:
                inits[name] = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(inits[node.input[1]]).T),
                                                      name)
                out.graph.initializer.append(inits[name])
            node.input[1] = name
            for a in node.attribute:
                if a.name == "gemm_trans_b":
                    a.i = 0
    return out


def libraries_of(report: dict) -> list[str]:
    return sorted({k.get("library", k.get("scheme", "")) for k in report.get("kernels", [])})


def case(m: int, k: int, n: int, dtype: int, epilogue: str, copies: int, config: bench.BenchConfig) -> dict:
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    feeds = {"a": rng.standard_normal((m, k)).astype(np_dtype)}
    if epilogue == "residual":
        feeds["r"] = rng.standard_normal((m, n)).astype(np_dtype)
    like = [np.zeros((m, n), np_dtype)] * copies
    providers = bench._provider_list(config)
    stock = stock_model(m, k, n, dtype, copies, epilogue)
    plain = stock_model(m, k, n, dtype, copies, None)
    made: dict = {}
    for label, gen in (("off", "off"), ("on", "all")):
        # (merge off: the copies' products of one A would be joined into one GEMM)
        res = optimize(stock, Options(archs=("sm_90",), generated_gemms=gen, gate=False, verify=False, merge=False))
        made[label] = (res.model, res.report.to_json())
    models = {"kmajor": made["off"][0], "rowmajor": row_major(made["off"][0])}
    if "on" in made:
        models["generated"] = made["on"][0]
    bounds = {"stock": bench._Bound(ort.InferenceSession(stock.SerializeToString(), providers=providers), feeds, like),
              "plain": bench._Bound(ort.InferenceSession(plain.SerializeToString(), providers=providers),
                                    {"a": feeds["a"]}, like)}
    for label, model in models.items():
        bounds[label] = bench._Bound(stitch_session(model.SerializeToString(), providers=providers), feeds, like)
    for b in bounds.values():
        b.run()  # the first run (each gemm node times its libraries), then the graph's capture
        b.run()
    want = [w.astype(np.float64) for w in bounds["stock"].outputs()]
    errors = {label: max(float(np.linalg.norm(g.astype(np.float64) - w) / max(np.linalg.norm(w), 1e-30))
                         for g, w in zip(bounds[label].outputs(), want)) for label in models}
    times = bench._time(bounds, config)
    us = {label: float(np.median(t)) * 1e3 / copies for label, t in times.items()}
    flops = 2.0 * m * k * n
    peak = FP16_TFLOPS if dtype == TP.FLOAT16 else TF32_TFLOPS
    best = min(us[label] for label in models)
    return {"dtype": "float16" if dtype == TP.FLOAT16 else "float32", "m": m, "k": k, "n": n, "epilogue": epilogue,
            "us": us, "errors": errors, "libraries": {k_: libraries_of(r) for k_, (_, r) in made.items()},
            "tflops": {label: flops / (t * 1e6) for label, t in us.items()},
            "peak_share_best": flops / (best * 1e6) / peak,
            "kmajor_over_rowmajor": us["kmajor"] / us["rowmajor"],
            "generated_over_kmajor": us["generated"] / us["kmajor"] if "generated" in us else None,
            "best_over_plain": best / us["plain"], "best_within_5pct_of_plain": best <= WITHIN * us["plain"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("generated_gemm.json"))
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--shapes", default="all", help="all, bert or llama")
    args = ap.parse_args()
    bench.require_gpu("bench_generated_gemm")
    config = bench.BenchConfig(warmup=10, iters=args.iters, cuda_graph=True)
    shapes = SHAPES[:4] if args.shapes == "bert" else SHAPES[4:] if args.shapes == "llama" else SHAPES
    rows = []
    for name in args.dtypes.split(","):
        dtype = {"float32": TP.FLOAT, "float16": TP.FLOAT16}[name]
        for m, k, n in shapes:
            for epilogue in EPILOGUES:
                try:
                    r = case(m, k, n, dtype, epilogue, args.copies, config)
                except Exception as e:  # noqa: BLE001 - reported per row, the rest still run
                    print(f"{name} {m}x{k}x{n} {epilogue}: failed: {str(e).splitlines()[0][:300]}", flush=True)
                    rows.append({"dtype": name, "m": m, "k": k, "n": n, "epilogue": epilogue, "error": str(e)[:2000]})
                    continue
                rows.append(r)
                t = "  ".join(f"{lbl} {v:7.2f}" for lbl, v in r["us"].items())
                gen = r["generated_over_kmajor"]
                print(f"{name} M {m} K {k:5} N {n:5} {epilogue:8} µs: {t}  kmajor/rowmajor {r['kmajor_over_rowmajor']:.3f}"
                      + (f"  generated/kmajor {gen:.3f}" if gen is not None else "")
                      + f"  best/plain {r['best_over_plain']:.3f} ({r['peak_share_best']:.0%} of peak)"
                      f"  err {max(r['errors'].values()):.1e}", flush=True)
    args.out.write_text(json.dumps({"device": bench.gpu_name(), "driver": bench.driver_version(),
                                    "copies": args.copies, "iters": args.iters, "cuda_graph": True, "rows": rows},
                                   indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
