"""GPU detection: tests marked `gpu` are skipped where no GPU and CUDA EP are usable. A failing
test's report names the random seeds it drew (stitching.fresh_seed), so it can be replayed."""
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


@pytest.fixture(autouse=True)
def _seeds():
    from .stitching import SEEDS

    SEEDS.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when == "call":
        from .stitching import SEEDS

        if SEEDS:
            report.sections.append(("random seeds", f"drew {SEEDS}; replay with ONNXSTITCH_SEED={SEEDS[0]} "
                                                    f"python3 -m pytest '{item.nodeid}'"))
