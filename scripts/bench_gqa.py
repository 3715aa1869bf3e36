#!/usr/bin/env python3
"""onnxstitch's attention against ONNX Runtime's own fused GroupQueryAttention (com.microsoft,
its CUDA kernel: what ORT's LLaMA export and model builder use) on a LLaMA-style decode step in
float16 (issue 22). ORT's transformers optimizer finds no attention to fuse in transformers'
exports of LLaMA (either exporter), so the comparison is at the attention core:

  stock      the core as the dynamo exporter writes it — q/k/v heads split, the new K/V
             concatenated to the cache (present_key/value are outputs), repeat_kv's
             Unsqueeze/Expand/Reshape, MatMul, scale, Softmax, MatMul, heads merged — on ORT;
  stitched   the same model after onnxstitch.optimize (the attention chain one kernel: the
             decode form at these shapes);
  ort-gqa    one GroupQueryAttention node with the same inputs and outputs (seqlens_k and
             total_sequence_length added).

Each model runs with its inputs bound on the GPU, timed round by round (onnxstitch.bench's
loop), plain: ORT cannot capture GroupQueryAttention in a CUDA graph without a shared cache
buffer. Outputs are compared against the stock model's.

    python3 scripts/bench_gqa.py [--out bench_gqa.json] [--iters 200]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import bench  # noqa: E402
from onnxstitch.runtime import session as stitch_session  # noqa: E402

# (batch, new tokens, cached tokens): LLaMA-style widths of build_llama_layer.py (TinyLlama: 32 q
# heads, 4 KV heads of 64) and LLaMA-3-8B's (32 and 8 of 128).
CASES = [(4, 1, 1024, 32, 4, 64), (4, 1, 4096, 32, 4, 64), (4, 1, 4096, 32, 8, 128), (1, 1, 4096, 32, 8, 128)]


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def core_model(b: int, s: int, p: int, h: int, hkv: int, d: int) -> onnx.ModelProto:
    """The decode step's attention as the dynamo exporter writes it (static shapes)."""
    vi, mk, f16 = helper.make_tensor_value_info, helper.make_node, TP.FLOAT16
    g, t = h // hkv, p + s
    inits = [_ints("q4", [b, s, h, d]), _ints("kv4", [b, s, hkv, d]), _ints("ax2", [2]),
             _ints("exp", [b, hkv, g, t, d]), _ints("rep", [b, h, t, d]), _ints("o3", [b, s, h * d]),
             numpy_helper.from_array(np.array(d ** -0.5, np.float16), "scale")]
    nodes = [mk("Reshape", ["query", "q4"], ["q_s"]), mk("Transpose", ["q_s"], ["q"], perm=[0, 2, 1, 3])]
    for x in ("key", "value"):
        nodes += [mk("Reshape", [x, "kv4"], [f"{x}_s"]), mk("Transpose", [f"{x}_s"], [f"{x}_h"], perm=[0, 2, 1, 3]),
                  mk("Concat", [f"past_{x}", f"{x}_h"], [f"present_{x}"], axis=2),
                  mk("Unsqueeze", [f"present_{x}", "ax2"], [f"{x}_u"]), mk("Expand", [f"{x}_u", "exp"], [f"{x}_e"]),
                  mk("Reshape", [f"{x}_e", "rep"], [f"{x}_r"])]
    nodes += [mk("Transpose", ["key_r"], ["kt"], perm=[0, 1, 3, 2]), mk("MatMul", ["q", "kt"], ["scores"]),
              mk("Mul", ["scores", "scale"], ["scaled"]), mk("Softmax", ["scaled"], ["probs"], axis=-1),
              mk("MatMul", ["probs", "value_r"], ["ctx"]), mk("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              mk("Reshape", ["ctx_t", "o3"], ["output"])]
    ins = [vi("query", f16, [b, s, h * d]), vi("key", f16, [b, s, hkv * d]), vi("value", f16, [b, s, hkv * d]),
           vi("past_key", f16, [b, hkv, p, d]), vi("past_value", f16, [b, hkv, p, d])]
    outs = [vi("output", f16, [b, s, h * d]), vi("present_key", f16, [b, hkv, t, d]),
            vi("present_value", f16, [b, hkv, t, d])]
    model = helper.make_model(helper.make_graph(nodes, "decode_core", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def gqa_model(b: int, s: int, p: int, h: int, hkv: int, d: int) -> onnx.ModelProto:
    """The same step as one com.microsoft GroupQueryAttention node."""
    vi, f16 = helper.make_tensor_value_info, TP.FLOAT16
    t = p + s
    node = helper.make_node("GroupQueryAttention", ["query", "key", "value", "past_key", "past_value", "seqlens_k",
                                                    "total_sequence_length"], ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=h, kv_num_heads=hkv, scale=d ** -0.5)
    ins = [vi("query", f16, [b, s, h * d]), vi("key", f16, [b, s, hkv * d]), vi("value", f16, [b, s, hkv * d]),
           vi("past_key", f16, [b, hkv, p, d]), vi("past_value", f16, [b, hkv, p, d]),
           vi("seqlens_k", TP.INT32, [b]), vi("total_sequence_length", TP.INT32, [])]
    outs = [vi("output", f16, [b, s, h * d]), vi("present_key", f16, [b, hkv, t, d]),
            vi("present_value", f16, [b, hkv, t, d])]
    model = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def main() -> int:
    """Time every case; prints a table and writes JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_gqa.json"))
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    import onnxruntime as ort

    bench.require_gpu("bench_gqa")
    config = bench.BenchConfig(warmup=20, iters=args.iters)
    rows = []
    rng = np.random.default_rng(0)
    print(f"{'case':<28} {'stock ms':>9} {'stitched ms':>12} {'ort-gqa ms':>11} {'vs stock':>9} {'vs gqa':>7} "
          f"{'err stitched':>13} {'err gqa':>8} form")
    with tempfile.TemporaryDirectory() as tmp:
        for b, s, p, h, hkv, d in CASES:
            label = f"b{b} s{s} past{p} h{h}/{hkv} d{d}"
            core, gqa = core_model(b, s, p, h, hkv, d), gqa_model(b, s, p, h, hkv, d)
            res = onnxstitch.optimize(core)
            stitched = Path(tmp) / "stitched.onnx"
            res.save(stitched)
            form = [k for k in res.report.kernels if k["scheme"] == "attention"]
            feeds = {n: rng.standard_normal(shape).astype(np.float16) for n, shape in
                     (("query", (b, s, h * d)), ("key", (b, s, hkv * d)), ("value", (b, s, hkv * d)),
                      ("past_key", (b, hkv, p, d)), ("past_value", (b, hkv, p, d)))}
            extra = {"seqlens_k": np.full((b,), p + s - 1, np.int32), "total_sequence_length": np.array(p + s, np.int32)}
            cuda = ["CUDAExecutionProvider"]
            sessions = {"stock": (ort.InferenceSession(core.SerializeToString(), providers=cuda), feeds),
                        "stitched": (stitch_session(str(stitched), providers=cuda), feeds),
                        "ort-gqa": (ort.InferenceSession(gqa.SerializeToString(), providers=cuda), feeds | extra)}
            bounds = {k: bench._Bound(sess, f, None) for k, (sess, f) in sessions.items()}
            times = bench._time(bounds, config)
            med = {k: float(np.median(v)) for k, v in times.items()}
            outs = {k: bound.outputs() for k, bound in bounds.items()}
            err = {k: bench._errors(outs[k], outs["stock"])[0] for k in ("stitched", "ort-gqa")}
            kind = ",".join(f"{k['dtype']}{'+decode' if k.get('decode_rows') else ''}" for k in form) or "none"
            rows.append({"case": label, "ms": med, "max_abs_err": err, "attention": kind})
            print(f"{label:<28} {med['stock']:>9.4f} {med['stitched']:>12.4f} {med['ort-gqa']:>11.4f} "
                  f"{med['stock'] / med['stitched']:>8.2f}× {med['ort-gqa'] / med['stitched']:>6.2f}× "
                  f"{err['stitched']:>13.2e} {err['ort-gqa']:>8.2e} {kind}", flush=True)
    args.out.write_text(json.dumps({"device": bench.gpu_name(), "driver": bench.driver_version(),
                                    "versions": bench.package_versions(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
