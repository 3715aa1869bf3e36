"""Tolerances by dtype for comparing a stitched model's outputs with a reference: shared by the
tests and the fuzzer (models/fuzz.py), which the tests import and which imports nothing of them."""
from __future__ import annotations

import numpy as np


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) by dtype: float16/bfloat16 results are computed in float32 then rounded."""
    name = np.dtype(dtype).name
    if name in ("float16", "bfloat16"):
        return 1e-2, 1e-2
    if name == "float32":
        return 1e-5, 1e-6
    if name == "float64":
        return 1e-12, 1e-12
    return 0.0, 0.0


def chain_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for outputs at the end of long op chains: rounding differences compound
    (about one ulp per op, amplified by cancellation), so a few dozen float32 ops need ~1e-4."""
    name = np.dtype(dtype).name
    if name in ("float16", "bfloat16"):
        return 2e-2, 2e-2
    if name == "float32":
        return 1e-4, 1e-4
    return tolerance(dtype)
