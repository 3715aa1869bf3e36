"""The fuzz models of tests/test_fuzz.py with the real kernels (marker `gpu`): each drawn model
is stitched and run through onnxstitch.session on the CUDA EP (outputs poisoned first, IO
binding: tests/gpu/test_stitched_gpu.run_gpu) against the original on ORT CPU.

Tolerances by dtype (models.fuzz.tolerant_mismatch): float32 chains within chain_tolerance
with NaN/Inf at the same positions; float64 likewise; float16 against the float32 model
(half-precision kernels compute in float32) by relative norm ≤ 1e-2; ints and bools exact
(up to 1% of elements in models with float16 math, where a threshold can round either way).
ONNXSTITCH_FUZZ_EXAMPLES / ONNXSTITCH_FUZZ_RANDOM as for the CPU test.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, event, given, note, settings

import onnxstitch
from models.fuzz import (FuzzCase, cases, float32_feeds, float32_reference, fused_nodes, run_cpu,
                         tolerant_mismatch)

from .test_stitched_gpu import run_gpu, stitch

pytestmark = pytest.mark.gpu

EXAMPLES = int(os.environ.get("ONNXSTITCH_FUZZ_EXAMPLES", "60"))
RANDOM = os.environ.get("ONNXSTITCH_FUZZ_RANDOM", "") not in ("", "0")


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(case=cases())
def test_fuzz_model_kernels_match_cpu(case: FuzzCase) -> None:
    note(onnx.printer.to_text(case.model))
    note(f"run-time dims {dict(case.dims)}, feeds seed {case.seed}, overrides {list(case.overrides)}")
    stitched = stitch(case.model, shapes=case.plan_shapes).model
    n = len(fused_nodes(stitched))
    event("outcome: improved" if n else "outcome: unchanged")
    if not n:
        return  # nothing runs on a kernel; the CPU fuzz test covers the unchanged model
    feeds = case.feeds()
    half = case.has_float16
    # Half-precision kernels compute in float32: the reference is the float32 model on CPU.
    ref = run_cpu(float32_reference(case.model), float32_feeds(feeds)) if half else run_cpu(case.model, feeds)
    dtypes = [np.dtype(onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type)) for o in case.model.graph.output]
    like = [r.astype(d) for r, d in zip(ref, dtypes)]
    skip = _empty_reduction_quirks(stitched, feeds, like)
    try:
        got = run_gpu(stitched, feeds, like)
    except RuntimeError:
        # A node left to ORT's CUDA EP that it cannot run (Gelu over a scalar): fine when the
        # model as given fails there too.
        with pytest.raises(RuntimeError):
            run_gpu(case.model, feeds, like)
        event("outcome: ORT's CUDA EP refuses the model")
        return
    for k, (out, a, b) in enumerate(zip(case.model.graph.output, got, ref)):
        if k in skip:
            continue
        why = tolerant_mismatch(a, b, half)
        assert why is None, f"output {out.name}: {why}"


def _ort_keeps_empty_reductions() -> bool:
    """ONNX Runtime before 1.32 returns an empty tensor for a keepdims reduction over a run of
    size 0 of an all-empty input, where ONNX (and ORT 1.32's CPU kernels) give one identity
    value per row; the kernels follow ONNX (tests/test_host_kernels.py checks that rule
    against ORT 1.32)."""
    major, minor = (int(v) for v in ort.__version__.split(".")[:2])
    return (major, minor) < (1, 32)


def _empty_reduction_quirks(stitched: onnx.ModelProto, feeds: dict, like: list) -> set[int]:
    """Outputs where an older ORT reference is empty and the stitched model is not: they are
    bound at the stitched model's shape and not compared (`like` is updated in place)."""
    if not any(r.size == 0 for r in like) or not _ort_keeps_empty_reductions():
        return set()
    shapes = [o.shape for o in onnxstitch.session(stitched.SerializeToString()).run(None, feeds)]
    out = set()
    for k, (r, s) in enumerate(zip(like, shapes)):
        if r.size == 0 and tuple(s) != r.shape:
            event("reference from ORT < 1.32 keeps an empty reduced dim; the kernel gives ONNX's identity")
            like[k] = np.zeros(s, r.dtype)
            out.add(k)
    return out
