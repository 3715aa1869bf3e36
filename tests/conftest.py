"""GPU detection: tests marked `gpu` are skipped where no GPU and CUDA EP are usable. A failing
test's report names the random seeds it drew (stitching.fresh_seed), so it can be replayed."""
from __future__ import annotations

import pytest


def _spread_workers() -> None:
    """ONNXSTITCH_TEST_GPUS=N: xdist worker gwK runs on GPU K mod N, so that a host's GPUs share
    the GPU suite (set here, before any test starts CUDA)."""
    import os

    gpus = int(os.environ.get("ONNXSTITCH_TEST_GPUS") or 0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if gpus > 1 and worker.startswith("gw"):
        os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % gpus)


_spread_workers()


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


# The host-kernel sweeps (every op, dtype and shape of the generated kernels compiled with g++ and
# run a thread per CUDA thread: most of the suite's time) run one case in SWEEP_SAMPLE by default,
# the same cases on every run (by the test's id); ONNXSTITCH_FULL_SWEEP=1 runs them all
# (scripts/host_sweep.sh). Tests that plant a mistake are never sampled out.
SWEEP_MODULES = ("test_host_kernels.py", "test_attention_host.py", "test_attention_decoder.py")
SWEEP_SAMPLE = 3


def _sampled_out(item: pytest.Item) -> bool:
    import os
    import zlib

    if os.environ.get("ONNXSTITCH_FULL_SWEEP") or item.path.name not in SWEEP_MODULES:
        return False
    if not hasattr(item, "callspec") or "broken" in item.name or "mistake" in item.name:
        return False
    return zlib.crc32(item.nodeid.encode()) % SWEEP_SAMPLE != 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [item for item in items if not _sampled_out(item)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if _sampled_out(item)])
        items[:] = kept
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
