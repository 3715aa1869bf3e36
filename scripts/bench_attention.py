#!/usr/bin/env python3
"""Attention kernels on the GPU: each generated variant (codegen_attention.AttentionOptions)
launched alone from its cubin — time per launch (CUDA events around back-to-back launches) and
relative error against float64 numpy — then the attention core end to end, stock ONNX Runtime
against onnxstitch with CUDA graphs, per shape (BERT-base's with both mask shapes exporters
write, a 512-token sequence, ViT-B/16's 197 tokens without a mask; BERT's core reading q, kᵀ
and v from its merged Q/K/V product with their biases, as the pipeline plans it), in float32
and (cases named so) float16 and bfloat16: the half kernels' m16n8k16 products with the
probabilities in registers (TF32 staging variants do not apply to them and are skipped).

    python3 scripts/bench_attention.py [--out bench_attention.json] [--reps 200]
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch import bench, compile as nvrtc  # noqa: E402

from onnxstitch.schemes.attention import match as attention  # noqa: E402

from onnxstitch.schemes.attention import codegen as codegen_attention  # noqa: E402
from onnxstitch import graph as graph_mod  # noqa: E402
from scripts.bench_elementwise import launch_ms  # noqa: E402
from tests.host_kernels import attention_args  # noqa: E402
from tests.attention_models import (Core, Projected, attention_graph, core_feeds, core_model,  # noqa: E402
                                    core_reference, projected_feeds, projected_model, projected_reference,
                                    projected_values, relative_error)

CASES = {
    "bert-mask-bqk": Core((8, 12), 128, 128, 64, (8, 1, 128, 128)),
    "bert-mask-bk": Core((8, 12), 128, 128, 64, (8, 1, 1, 128)),
    "seq512": Core((8, 12), 512, 512, 64, (8, 1, 1, 512)),
    "vit": Core((8, 12), 197, 197, 64, None),
    "bert-projected-bqk": Projected(Core((8, 12), 128, 128, 64, (8, 1, 128, 128))),
    "bert-mask-bk-float16": Core((8, 12), 128, 128, 64, (8, 1, 1, 128), dtype=TP.FLOAT16),
    "bert-mask-bk-bfloat16": Core((8, 12), 128, 128, 64, (8, 1, 1, 128), dtype=TP.BFLOAT16),
    "seq512-float16": Core((8, 12), 512, 512, 64, (8, 1, 1, 512), dtype=TP.FLOAT16),
    "vit-float16": Core((8, 12), 197, 197, 64, None, dtype=TP.FLOAT16),
    "bert-projected-bqk-float16": Projected(Core((8, 12), 128, 128, 64, (8, 1, 128, 128), dtype=TP.FLOAT16)),
    # BERT-base float16 as the pipeline plans it: the exported mask simplified to [b, 1, 1, s].
    "bert-projected-bk-float16": Projected(Core((8, 12), 128, 128, 64, (8, 1, 1, 128), dtype=TP.FLOAT16)),
}

VARIANTS = {f"keys={k},staged_tf32={int(st)}": codegen_attention.AttentionOptions(keys=k, staged_tf32=st)
            for k, st in ((64, True), (64, False), (128, True))}  # each fixed, not by shape
# The defaults (keys and rounding by shape, ldmatrix for half heads of 16s, query-broadcast masks
# staged per tile) against each of the last two left out.
VARIANTS |= {"default": codegen_attention.AttentionOptions(),
             "no-ldmatrix": codegen_attention.AttentionOptions(ldmatrix=False),
             "no-staged-masks": codegen_attention.AttentionOptions(staged_masks=False),
             "neither": codegen_attention.AttentionOptions(ldmatrix=False, staged_masks=False)}


def chain(model: onnx.ModelProto) -> tuple[graph_mod.FusionGraph, attention.Match]:
    g, found = attention_graph(model)
    (match,) = found.matches
    return g, match


def case_data(case: Core | Projected) -> tuple[onnx.ModelProto, dict, dict, np.ndarray]:
    """(model, its random inputs, every tensor the kernel may read by name, float64 context)."""
    rng = np.random.default_rng(0)
    if isinstance(case, Core):
        feeds = core_feeds(case, rng)
        return core_model(case), feeds, feeds, core_reference(case, feeds)
    model = projected_model(case, rng)
    feeds = projected_feeds(case, rng)
    return model, feeds, projected_values(case, model, feeds), projected_reference(case, model, feeds)


def _device(x: np.ndarray):
    """`x` on the GPU (cupy has no bfloat16: its bits as uint16)."""
    import cupy as cp

    return cp.asarray(x.view(np.uint16) if x.dtype.name == "bfloat16" else x)


def _dtype(case: Core | Projected) -> int:
    return (case if isinstance(case, Core) else case.core).dtype


def kernel_alone(case: Core | Projected, options: codegen_attention.AttentionOptions, reps: int) -> dict:
    """One variant's kernel: µs per launch and relative error against float64."""
    import cupy as cp

    model, _, values, want = case_data(case)
    g, match = chain(model)
    src = codegen_attention.generate(g, "stitch_bench", match, options)
    image = nvrtc.compile_kernel(src, (f"sm_{cp.cuda.Device().compute_capability}",)).images[0]
    cuda = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)) == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, src.entries[0].encode()) == 0
    shared = src.spec.shared_bytes
    assert cuda.cuFuncSetAttribute(fn, 8, shared) == 0  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    dev = {k: _device(v) for k, v in values.items()}  # named as the model's tensors, src.inputs
    typed = onnx.helper.tensor_dtype_to_np_dtype(src.spec.dtype)
    out = _device(np.full(want.shape, np.nan, typed))  # poisoned
    args, blocks = attention_args(src, [dev[t].shape for t in src.inputs], [dev[t].data.ptr for t in src.inputs],
                                  out.shape, out.data.ptr)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(args))

    def launch():
        r = cuda.cuLaunchKernel(fn, blocks, 1, 1, src.spec.threads, 1, 1, shared, None, params, None)
        assert r == 0, f"cuLaunchKernel: {r}"

    launch()
    cp.cuda.runtime.deviceSynchronize()
    err = relative_error(out.get().view(typed), want)
    for _ in range(20):
        launch()
    return {"kernel_us": launch_ms(launch, reps) * 1e3, "relative_error_vs_float64": err, "shared_bytes": shared,
            "blocks": blocks}


def end_to_end(case: Core | Projected, reps: int) -> dict:
    """The core as a model: stock ONNX Runtime against onnxstitch, CUDA graphs."""
    import onnxstitch

    with tempfile.TemporaryDirectory() as tmp:
        model, stitched = Path(tmp) / "core.onnx", Path(tmp) / "core.stitched.onnx"
        onnx.save(case_data(case)[0], model)
        res = onnxstitch.optimize(str(model))
        onnx.save(res.model, stitched)
        r = bench.run(model, stitched, config=bench.BenchConfig(iters=reps, cuda_graph=True))
        out = r.to_json()
        out["verification"] = res.report.verification.to_json() if res.report.verification else None
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_attention.json"))
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ap.add_argument("--variants", default=";".join(VARIANTS), help="semicolon-separated, of: " + "; ".join(VARIANTS))
    ap.add_argument("--no-end-to-end", action="store_true", help="kernels alone only (for ncu)")
    ap.add_argument("--rounds", type=int, default=1, help="time the variants this many times, alternating (the best counts)")
    args = ap.parse_args()
    bench.require_gpu("bench_attention")
    result: dict = {"gpu": bench.gpu_name(), "cases": {}, "probe_tf32_kernel_us": []}
    for case in args.cases.split(","):
        core = CASES[case]
        row: dict = {"core": dataclasses.asdict(core), "variants": {}}
        for r in range(args.rounds):
            if case == "bert-mask-bk":  # the hand-written probe at the same shape: how the machine runs now
                from scripts.probe_attention import TC_KERNEL, TC_SHARED, probe_kernel
                ref = probe_kernel(TC_KERNEL, "attention_tc", TC_SHARED, args.reps)["kernel_us"]
                result["probe_tf32_kernel_us"].append(ref)
                print(f"{case:14} {'probe_attention.py TF32 kernel':40} round {r}: {ref:8.2f} µs", flush=True)
            for label in args.variants.split(";"):
                if _dtype(core) != TP.FLOAT and VARIANTS[label].staged_tf32 is False:
                    continue  # the same half kernel as staged_tf32=1
                v = kernel_alone(core, VARIANTS[label], args.reps)
                best = row["variants"].setdefault(label, v)
                best["rounds_us"] = best.get("rounds_us", []) + [v["kernel_us"]]
                best["kernel_us"] = min(best["rounds_us"])
                print(f"{case:14} {label:40} round {r}: {v['kernel_us']:8.2f} µs  rel. err "
                      f"{v['relative_error_vs_float64']:.1e}", flush=True)
        result["cases"][case] = row
        if args.no_end_to_end:
            continue
        row["end_to_end"] = end_to_end(core, args.reps)
        cfg = row["end_to_end"]["configs"]
        print(f"{case:14} end to end, CUDA graphs: " +
              "  ".join(f"{k}: {v['median_ms'] * 1e3:.2f} µs ({v['launches_per_run']:.0f} launches)"
                        for k, v in cfg.items()), flush=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
