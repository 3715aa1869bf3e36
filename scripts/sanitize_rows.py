#!/usr/bin/env python3
"""A workload for compute-sanitizer (racecheck, memcheck): one stitched model per rows scheme —
a few lanes per row, a warp per row, a block per row (shared-memory reduction), and the loop
path (rows longer than planned), a group norm — and the shared-memory tile of a layout view that moves the
innermost axis (whole and partial tiles, alone and packed with Q and V), and kernels reading boxes
of their inputs (folded Slice/Split: a box's reads must stay inside it) or windows of a Concat's
output (reads only inside the window), and attention kernels (K/V tiles shared by the block, the decode form,
probabilities per warp; ragged tiles; float32, and float16 whose kernels keep the probabilities
in registers and stage 8-byte vectors — bfloat16's differ from float16's only in the
conversion and product instructions), each run once on small inputs through ONNX Runtime.

    compute-sanitizer --tool racecheck --target-processes all python3 scripts/sanitize_rows.py [NAME-PART]

(NAME-PART: only the cases whose name holds it, e.g. `attention`.)
"""
from __future__ import annotations

import sys
from pathlib import Path

import dataclasses

import numpy as np
from onnx import TensorProto as TP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402
from tests.layout_models import attention_projections, attention_split  # noqa: E402
from tests.attention_models import CORES, PROJECTED, Decoder, core_model, decoder_model, projected_model  # noqa: E402
from tests.concat_models import concat_models  # noqa: E402
from tests.slice_models import slice_models  # noqa: E402
from tests.row_models import dynamic_row_model, group_norm_models, long_row_model, row_models, trailing_models  # noqa: E402


def cases():
    for cols in (7, 768, 5000):  # few lanes, a warp, a block per row
        for name, model, _ in row_models(3, cols, dtype=TP.FLOAT):
            if name in ("Softmax", "LayerNormalization-bias", "ReduceMax"):
                yield f"{name}-c{cols}", model, {"batch": [5]}, {"batch": 5}
    for name, model, _ in trailing_models(300, dtype=TP.FLOAT16):
        if name.startswith("ReduceSum-2axes"):
            yield name, model, {"batch": [5]}, {"batch": 5}
    model, _ = dynamic_row_model(TP.FLOAT)
    yield "dynamic-loop-path", model, {"batch": [5]}, {"batch": 3, "cols": 40000}
    for name, model, _ in row_models(3, 20000, dtype=TP.FLOAT):  # split rows: clusters of 4 blocks per row
        if name in ("Softmax", "LayerNormalization-bias"):
            yield f"split-{name}", model, {"batch": [3]}, {"batch": 7}
    model, _ = long_row_model(TP.FLOAT)
    yield "split-loop-path", model, {"batch": [3], "cols": [20000]}, {"batch": 4, "cols": 30001}
    for name, model, _ in group_norm_models(64, 8, (9, 11), TP.FLOAT16):  # a row over two axes, γ per element
        if name == "exported":
            yield f"group-norm-{name}", model, {"batch": [2]}, {"batch": 2}
    for heads, head_dim in ((12, 64), (4, 12)):
        model, _ = attention_split(heads, head_dim, (0, 2, 3, 1))
        yield f"key-transpose-tile-{head_dim}", model, {"batch": [2], "seq": [40]}, {"batch": 2, "seq": 40}
        model, _ = attention_projections(heads, head_dim, TP.FLOAT16)
        yield f"packed-qkv-{head_dim}", model, {"batch": [2], "seq": [40]}, {"batch": 2, "seq": 40}
    for cols in (10, 64):
        for name, model, _ in slice_models(cols, TP.FLOAT16):
            yield f"boxes-{name}-c{cols}", model, {"batch": [2], "seq": [40]}, {"batch": 3, "seq": 40}
        for name, model, _ in concat_models(cols, TP.FLOAT16):  # windowed reads stay in their windows
            yield f"windows-{name}-c{cols}", model, {"batch": [2], "seq": [40]}, {"batch": 3, "seq": 40}
    for dtype in (TP.FLOAT, TP.FLOAT16):
        for core in CORES[1:4] + CORES[6:7]:  # ragged tiles, masks broadcast three ways, heads of 8
            core = dataclasses.replace(core, dtype=dtype)
            yield f"attention-{core.id}", core_model(core), {}, {}
        for p in PROJECTED[1:]:  # q, kᵀ, v read from projections: a Split, cross attention, column offsets
            p = dataclasses.replace(p, core=dataclasses.replace(p.core, dtype=dtype))
            yield f"attention-projected-{p.id}", projected_model(p, np.random.default_rng(0)), {}, {}
        # The decode form (split keys, merged; K as rows and as kᵀ) and grouped heads with causal masks.
        for c in (Decoder(2, 8, 4, 1, 700, 64, "dynamo"), Decoder(1, 4, 1, 2, 300, 32, "ts", padding="input"),
                  Decoder(1, 6, 3, 70, 70, 32, "dynamo")):
            c = dataclasses.replace(c, dtype=dtype)
            yield f"attention-decoder-{c.id}", decoder_model(c), {}, {}


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for name, model, plan, run in cases():
        if only not in name:
            continue
        res = onnxstitch.optimize(model, shapes=plan, verify=False, reductions=True)
        sess = onnxstitch.session(res.model)
        feeds = random_feeds(model, 0, run)
        outs = sess.run(None, feeds)
        print(f"{name}: ran, outputs finite: {all(np.isfinite(o.astype(np.float64)).all() for o in outs)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
