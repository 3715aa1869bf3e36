"""GPU detection: tests marked `gpu` are skipped where no GPU and CUDA EP are usable."""
from __future__ import annotations

import pytest


def gpu_available() -> bool:
    """True when a CUDA device and onnxruntime's CUDA EP are both usable."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and onnxruntime-gpu (scripts/gpu_check.sh runs these)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
