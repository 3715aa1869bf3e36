"""bench's timed runs: a time budget caps the runs of a slow model (a Loop of many steps) and
leaves a fast one its full count."""
from __future__ import annotations

import time

from onnxstitch import bench


class _Sleeps:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def run(self) -> None:
        self.calls += 1
        time.sleep(self.seconds)


def test_a_time_budget_caps_the_runs_of_a_slow_model() -> None:
    # Runs of 20 ms against a 0.1 s budget: warm-up stops once over it (two runs at the least)
    # and MIN_TIMED runs are timed instead of 100.
    slow = _Sleeps(0.02)
    times = bench._time({"a": slow}, bench.BenchConfig(warmup=20, iters=100, time_budget_s=0.1))
    assert len(times["a"]) == bench.MIN_TIMED and slow.calls < 20 + bench.MIN_TIMED
    assert min(times["a"]) >= 20


def test_without_a_budget_every_run_is_timed() -> None:
    fast = _Sleeps(0.0)
    assert len(bench._time({"a": fast, "b": _Sleeps(0.0)}, bench.BenchConfig(warmup=2, iters=100))["a"]) == 100
    assert fast.calls == 102


def test_sessions_built_together_are_each_used_once() -> None:
    """optimize's gate builds its sessions at once (BenchConfig.build_together): each maker's
    first plain call takes its own session from the threads, the reference's takes the plain
    one, and any other call (the plain fallback after a failed CUDA-graph build) builds anew."""
    calls: list[tuple[str, dict]] = []

    def maker(label: str):
        def make(so=None, **kw):
            calls.append((label, kw))
            if label == "broken" and not kw:
                raise RuntimeError("cannot capture")
            return (label, dict(kw))
        return make

    makers, reference = bench._built_together({"stock": maker("stock"), "broken": maker("broken")}, maker("ref"))
    assert reference(graphs=False) == ("ref", {"graphs": False})
    assert makers["stock"]() == ("stock", {})
    try:
        makers["broken"]()
    except RuntimeError as e:
        assert "cannot capture" in str(e)
    else:
        raise AssertionError("the build's failure was not raised")
    assert makers["broken"](graphs=False) == ("broken", {"graphs": False})  # built anew, plain
    assert makers["stock"]() == ("stock", {})  # a second call builds anew
    assert sorted(label for label, _ in calls) == ["broken", "broken", "ref", "stock", "stock"]


def test_no_session_built_together_is_handed_out_before_all_are_built() -> None:
    """A session handed out is run at once (its CUDA graph captured, in ORT's global mode): one
    still being built beside it then fails (its external-data loader synchronizes a stream). So
    the first session handed out waits for the slowest build."""
    import threading
    import time

    done: set[str] = set()
    lock = threading.Lock()

    def maker(label: str, seconds: float):
        def make(so=None, **kw):
            time.sleep(seconds)
            with lock:
                done.add(label)
            return label
        return make

    makers, reference = bench._built_together({"fast": maker("fast", 0.0), "slow": maker("slow", 0.3)},
                                              maker("ref", 0.0))
    assert reference(graphs=False) == "ref"
    assert done == {"fast", "slow", "ref"}
    assert makers["fast"]() == "fast" and makers["slow"]() == "slow"


def test_known_output_shapes_spare_the_reference_session(tmp_path, monkeypatch) -> None:
    """With the outputs' shapes given (optimize's gate), no plain stock session is made for
    reference outputs: one session a model, and no error figures."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from models.elementwise import chain

    path = tmp_path / "m.onnx"
    onnx.save(chain(3, shape=(4, 8)), path)
    made: list[str] = []
    real = ort.InferenceSession

    def counting(source, *a, **kw):
        made.append(str(source))
        return real(source, *a, **kw)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    cpu = bench.BenchConfig(warmup=1, iters=3, providers=("CPUExecutionProvider",), profile_runs=0)
    out = onnx.load(path).graph.output[0].name
    res = bench.run(path, path, config=cpu, outputs={out: bench.OutputLike((4, 8), np.dtype(np.float32))})
    assert len(made) == 2 and res.stock.max_abs_err == 0.0
    made.clear()
    bench.run(path, path, config=cpu)
    assert len(made) == 3  # the reference's too


def test_other_stitched_models_are_timed_in_the_same_rounds(tmp_path) -> None:
    """`stitched_peers` (optimize's gate choosing between plans): each is loaded as the stitched
    model is and gets a row of its own; a peer that does not run is named in the error."""
    import onnx
    import pytest

    from models.elementwise import chain
    from onnxstitch.errors import StitchError

    path, other = tmp_path / "m.onnx", tmp_path / "other.onnx"
    onnx.save(chain(3, shape=(4, 8)), path)
    onnx.save(chain(5, shape=(4, 8)), other)
    cpu = bench.BenchConfig(warmup=1, iters=3, providers=("CPUExecutionProvider",), profile_runs=0)
    res = bench.run(path, path, config=cpu, stitched_peers={"other plan": other})
    assert set(res.configs) == {bench.STOCK_CPU, bench.STITCHED, "other plan"}
    assert all(t.median_ms > 0 for t in res.configs.values())
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(StitchError, match="broken.onnx"):
        bench.run(path, path, config=cpu, stitched_peers={"broken": broken})
