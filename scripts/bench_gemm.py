#!/usr/bin/env python3
"""GEMM epilogues at BERT-base's shapes (M = 1024 rows, K/N = 768/768, 768/3072, 3072/768,
768/2304; float32 (TF32) and float16), the issue's kernel-level criterion: each cuBLASLt
epilogue within 5% of the same call without one.

Per shape and dtype, fifteen models, each `--copies` independent products of one A (weights of
their own, so they are read from memory as in a model) — stock ONNX Runtime's MatMul, + Add(bias),
+ ReLU, + GELU (tanh form, as exporters write it), + Add(residual); and FusedKernel gemm nodes,
one per product, with the epilogue none, bias, relu_bias, gelu_bias, bias + residual, each with
its algorithm timed at the first call (gemm_timed, as the optimizer writes them) and with the
heuristic's first — timed together round by round (onnxstitch.bench's loop) with CUDA graphs; ms
per product is the median run over the copies. Outputs of each node model are checked against
its stock twin. The criterion compares timed nodes: an epilogue node against the plain one; each
row also compares it with the plain node plus reading the epilogue's bias and residual at the
device's copy bandwidth (bench.read_us), since those reads are traffic, not elementwise work.

    python3 scripts/bench_gemm.py [--out bench_gemm.json] [--iters 200] [--copies 16]
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

from onnxstitch import bench  # noqa: E402
from onnxstitch.runtime import session as stitch_session  # noqa: E402
from onnxstitch.schemes.gemm.spec import GemmSpec  # noqa: E402
from tests.gemm_models import activation_nodes  # noqa: E402

M = 1024
SHAPES = ((768, 768), (768, 3072), (3072, 768), (768, 2304))
# (label, stock activation written out, epilogue, residual)
EPILOGUES = (("none", None, "none", False), ("bias", "", "bias", False), ("relu", "relu", "relu_bias", False),
             ("gelu", "gelu_tanh_pow", "gelu_bias", False), ("residual", "", "bias", True))
WITHIN = 1.05  # the criterion: an epilogue costs at most 5% over the plain call


def _weights(k: int, n: int, dtype: int, copies: int, seed: int) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    out = []
    for i in range(copies):
        out.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_dtype), f"w{i}"))
        out.append(numpy_helper.from_array((rng.standard_normal(n) * 0.5).astype(np_dtype), f"b{i}"))
    return out


def _model(nodes: list, inits: list, k: int, n: int, dtype: int, copies: int, residual: bool,
           custom: bool) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info("a", dtype, [M, k])]
    if residual:
        ins.append(helper.make_tensor_value_info("r", dtype, [M, n]))
    outs = [helper.make_tensor_value_info(f"y{i}", dtype, [M, n]) for i in range(copies)]
    opsets = [helper.make_opsetid("", 20)] + ([helper.make_opsetid("com.onnxstitch", 1)] if custom else [])
    return helper.make_model(helper.make_graph(nodes, "gemms", ins, outs, inits), opset_imports=opsets, ir_version=10)


def stock_model(k: int, n: int, dtype: int, copies: int, activation: str | None, residual: bool) -> onnx.ModelProto:
    """`copies` products of a: MatMul [+ Add(bias) [+ activation] [+ Add(r)]] each."""
    nodes, inits = [], _weights(k, n, dtype, copies, 0)
    for i in range(copies):
        x = f"p{i}"
        nodes.append(helper.make_node("MatMul", ["a", f"w{i}"], [x]))
        if activation is not None:
            nodes.append(helper.make_node("Add", [x, f"b{i}"], [f"l{i}"]))
            x = f"l{i}"
        if residual:
            nodes.append(helper.make_node("Add", [x, "r"], [f"s{i}"]))
            x = f"s{i}"
        if activation:
            act, consts = activation_nodes(activation, x, f"act{i}", dtype)
            nodes += act
            inits += consts
            x = f"act{i}"
        for node in nodes:  # the chain's last tensor is the output
            node.output[:] = [f"y{i}" if t == x else t for t in node.output]
            node.input[:] = [f"y{i}" if t == x else t for t in node.input]
    used = {t for node in nodes for t in node.input}
    return _model(nodes, [t for t in inits if t.name in used], k, n, dtype, copies, residual, False)


def node_model(k: int, n: int, dtype: int, copies: int, spec: GemmSpec) -> onnx.ModelProto:
    """`copies` gemm FusedKernel nodes (docs/abi.md) over a, their weights, biases and r."""
    nodes, inits = [], _weights(k, n, dtype, copies, 0)
    for i in range(copies):
        ins = ["a", f"w{i}"] + ([f"b{i}"] if spec.biased else []) + (["r"] if spec.residual else [])
        nodes.append(helper.make_node("FusedKernel", ins, [f"y{i}"], name=f"gemm{i}", domain="com.onnxstitch",
                                      kernel_name=f"cublaslt_bench_{spec.epilogue}", vec_width=1,
                                      input_kinds=[1] * len(ins), output_dtypes=[dtype], shape_rule="gemm",
                                      **spec.attributes()))
    return _model(nodes, [t for t in inits if spec.biased or t.name.startswith("w")], k, n, dtype, copies,
                  spec.residual, True)


def shape_case(k: int, n: int, dtype: int, copies: int, config: bench.BenchConfig) -> list[dict]:
    """Every epilogue of one shape, stock and node, timed round by round together."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    feeds = {"a": rng.standard_normal((M, k)).astype(np_dtype), "r": rng.standard_normal((M, n)).astype(np_dtype)}
    like = [np.zeros((M, n), np_dtype)] * copies
    providers = bench._provider_list(config)
    bounds = {}
    for label, act, epilogue, residual in EPILOGUES:
        given = {k_: v for k_, v in feeds.items() if k_ == "a" or residual}
        stock = stock_model(k, n, dtype, copies, act, residual)
        bounds[f"stock-{label}"] = bench._Bound(ort.InferenceSession(stock.SerializeToString(), providers=providers),
                                                given, like)
        for prefix, timed in (("node", True), ("heuristic", False)):
            node = node_model(k, n, dtype, copies, GemmSpec(epilogue, residual, dtype, dtype == TP.FLOAT, timed=timed))
            bounds[f"{prefix}-{label}"] = bench._Bound(stitch_session(node.SerializeToString(), providers=providers),
                                                       given, like)
    for b in bounds.values():
        b.run()  # warm-up run, then the CUDA graph's capture
        b.run()
    errors = {}
    for label, *_ in EPILOGUES:
        got, want = bounds[f"node-{label}"].outputs(), bounds[f"stock-{label}"].outputs()
        errors[label] = max(float(np.linalg.norm(g.astype(np.float64) - w) / max(np.linalg.norm(w.astype(np.float64)), 1e-30))
                            for g, w in zip(got, want))
    times = bench._time(bounds, config)
    per = {label: float(np.median(t)) / copies for label, t in times.items()}
    rows = []
    device = bench.gpu_name()
    itemsize = helper.tensor_dtype_to_np_dtype(dtype).itemsize
    for label, _, epilogue, residual in EPILOGUES:
        node, plain = per[f"node-{label}"], per["node-none"]
        extra = itemsize * (n * (epilogue != "none") + M * n * residual)
        reads = plain + bench.read_us(extra, device) / 1e3  # ms
        first, first_plain = per[f"heuristic-{label}"], per["heuristic-none"]
        rows.append({"dtype": "float16" if dtype == TP.FLOAT16 else "float32", "m": M, "k": k, "n": n,
                     "epilogue": label, "stock_ms": per[f"stock-{label}"], "node_ms": node,
                     "heuristic_first_ms": first, "heuristic_first_over_plain": first / first_plain,
                     "node_over_plain_node": node / plain, "within_5pct": node <= WITHIN * plain,
                     "node_over_plain_plus_reads": node / reads, "within_5pct_with_reads": node <= WITHIN * reads,
                     "stock_over_node": per[f"stock-{label}"] / node, "relative_error_vs_stock": errors[label]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_gemm.json"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--copies", type=int, default=16, help="products per model (amortizes a run's host cost)")
    ap.add_argument("--dtypes", default="float32,float16")
    args = ap.parse_args()
    bench.require_gpu("bench_gemm")
    config = bench.BenchConfig(warmup=20, iters=args.iters, cuda_graph=True)
    rows = []
    for name in args.dtypes.split(","):
        dtype = {"float32": TP.FLOAT, "float16": TP.FLOAT16}[name]
        for k, n in SHAPES:
            got = shape_case(k, n, dtype, args.copies, config)
            rows += got
            for r in got:
                print(f"{r['dtype']:8} M {M} K {k:4} N {n:4} {r['epilogue']:9} node {r['node_ms'] * 1e3:8.2f} µs "
                      f"({r['node_over_plain_node']:.3f}× plain node{'' if r['within_5pct'] else ' > 1.05'}; "
                      f"{r['node_over_plain_plus_reads']:.3f}× with its reads)  "
                      f"heuristic's first {r['heuristic_first_ms'] * 1e3:8.2f} µs "
                      f"({r['heuristic_first_over_plain']:.3f}×)  "
                      f"stock {r['stock_ms'] * 1e3:8.2f} µs ({r['stock_over_node']:.2f}× node)  "
                      f"err {r['relative_error_vs_stock']:.1e}", flush=True)
    summary = {"within_5pct": all(r["within_5pct"] for r in rows),
               "worst_epilogue_over_plain": max(r["node_over_plain_node"] for r in rows),
               "within_5pct_with_reads": sum(r["within_5pct_with_reads"] for r in rows), "rows": len(rows)}
    print(f"every epilogue within 5% of the plain cuBLASLt call: {summary['within_5pct']} "
          f"(worst {summary['worst_epilogue_over_plain']:.3f}×)")
    args.out.write_text(json.dumps({"device": bench.gpu_name(), "driver": bench.driver_version(),
                                    "copies": args.copies, "iters": args.iters, "cuda_graph": True,
                                    "rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
