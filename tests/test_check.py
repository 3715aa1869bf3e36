"""`onnxstitch check` as CI uses it: create a baseline, pass against it, fail (exit 1, with a
readable reason) when the plan regresses or numerics break; CPU-only runs say so."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxstitch.cli.main import main
from models.elementwise import random_graph
from onnxstitch.verify import compare_elementwise


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    p = tmp_path / "m.onnx"
    onnx.save(random_graph(30, seed=5, shape=("batch", 16), opaque_every=11), p)
    return p


@pytest.mark.parametrize("content, message", [
    ("nope", "not a JSON baseline"),
    (b"\xff\xfe", "not a JSON baseline"),
    ("[1]", "baseline schema None is not 1"),
    ('{"schema": 0}', "baseline schema 0 is not 1"),
])
def test_a_wrong_baseline_is_one_line_exit_2(tmp_path: Path, model_path: Path, content: str | bytes,
                                              message: str) -> None:
    base = tmp_path / "baseline.json"
    base.write_bytes(content if isinstance(content, bytes) else content.encode())
    res = _invoke("check", str(model_path), "--baseline", str(base))
    assert res.exit_code == 2 and res.output.count("\n") == 1 and f"{base}: {message}" in res.output, res.output


def test_baseline_round_trip_and_plan_regression(tmp_path: Path, model_path: Path) -> None:
    base = tmp_path / "baseline.json"
    res = _invoke("check", str(model_path), "--baseline", str(base))
    assert res.exit_code == 2 and "--update-baseline" in res.output  # no baseline yet
    res = _invoke("check", str(model_path), "--baseline", str(base), "--update-baseline")
    assert res.exit_code == 0, res.output
    data = json.loads(base.read_text())
    assert data["schema"] == 1 and data["plan"]["kernels_after"] < data["plan"]["kernels_before"]
    res = _invoke("check", str(model_path), "--baseline", str(base))
    assert res.exit_code == 0, res.output
    assert "no GPU here" in res.output or "speedup" in res.output
    # A baseline that fused better than today's plan: today is a regression.
    data["plan"]["kernels_after"] -= 1
    data["plan"]["bytes_after"] = data["plan"]["bytes_after"] // 2
    base.write_text(json.dumps(data))
    res = _invoke("check", str(model_path), "--baseline", str(base))
    assert res.exit_code == 1
    assert "kernels after fusion rose" in res.output and "predicted bytes moved rose" in res.output


def test_json_output_is_machine_readable(tmp_path: Path, model_path: Path) -> None:
    base = tmp_path / "b.json"
    _invoke("check", str(model_path), "--baseline", str(base), "--update-baseline", "-q")
    res = _invoke("check", str(model_path), "--baseline", str(base), "--json")
    out = json.loads(res.output)
    assert out["ok"] and out["regressions"] == [] and all(o["ok"] for o in out["outputs"])


def test_elementwise_comparison_rules() -> None:
    rng = np.random.default_rng()
    x = rng.standard_normal(64).astype(np.float32)
    assert compare_elementwise("y", x, x.copy()).ok
    assert not compare_elementwise("y", x + 1e-3, x).ok
    assert compare_elementwise("y", x + 1e-3, x, atol=1e-2).ok
    inf = x.copy()
    inf[0] = np.inf
    assert not compare_elementwise("y", x, inf).ok and compare_elementwise("y", inf, inf.copy()).ok
    assert not compare_elementwise("y", x.astype(np.float16), x).ok  # dtype differs


def test_default_judgement_is_verifications(model_path: Path) -> None:
    # Without --atol/--rtol, check judges as optimize verifies: by relative norm within the model's
    # envelope (on the CPU none is measured: 1e-2), so rounding passes and a planted 3% error fails.
    from onnxstitch.sessions import Runner
    from onnxstitch.verify import judge_outputs

    model = onnx.load(str(model_path))
    out = model.graph.output[0].name
    del model.graph.output[1:]
    rng = np.random.default_rng()
    want = rng.standard_normal((4, 16)).astype(np.float32)
    rounding = want * (1 + rng.uniform(-3e-4, 3e-4, want.shape)).astype(np.float32)
    (ok,) = judge_outputs(model, {out: rounding}, {out: want}, {}, Runner(False))
    assert ok.ok and 0 < ok.max_rel_err < 1e-3 and not compare_elementwise(out, rounding, want).ok
    wrong = want.copy()
    wrong[0] *= 1.3
    (bad,) = judge_outputs(model, {out: wrong}, {out: want}, {}, Runner(False))
    assert not bad.ok and "relative error" in bad.detail


def test_broken_numerics_fail_check(tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxstitch import rewrite

    real = rewrite._function

    def corrupt(model, graph, grp):
        fn = real(model, graph, grp)
        for node in fn.node:
            if node.op_type == "Add":
                node.op_type = "Sub"
        return fn

    base = tmp_path / "b.json"
    _invoke("check", str(model_path), "--baseline", str(base), "--update-baseline", "-q")
    monkeypatch.setattr(rewrite, "_function", corrupt)
    res = _invoke("check", str(model_path), "--baseline", str(base))
    assert res.exit_code == 1 and "regression: output" in res.output


@pytest.mark.parametrize("readings,regressed", [([3.0, 4.8], False), ([3.0, 3.1, 3.2], True), ([4.9], False)])
def test_speed_below_the_floor_is_measured_again(tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 readings: list[float], regressed: bool) -> None:
    # A reading under the floor (baseline 5× less 10%) counts only if it reproduces; the GPU
    # and its timings are stood in for: what is checked is how readings become a verdict.
    from types import SimpleNamespace

    from onnxstitch import bench, gate

    base = tmp_path / "b.json"
    _invoke("check", str(model_path), "--baseline", str(base), "--update-baseline", "-q")
    data = json.loads(base.read_text())
    base.write_text(json.dumps({**data, "speedup": 5.0}))
    left = list(readings)
    monkeypatch.setattr(gate, "gpu_usable", lambda: True)
    monkeypatch.setattr(gate, "_numerics", lambda *a, **k: ())
    monkeypatch.setattr(bench, "run", lambda *a, **k: SimpleNamespace(speedup=left.pop(0)))
    res = gate.run_check(model_path, base)
    assert not left  # every reading taken, none more
    assert res.speedup == max(readings)
    assert (not res.ok) == regressed, res.regressions
    assert any("measured again" in n for n in res.notes) == (len(readings) > 1)


def test_a_model_nothing_fuses_is_not_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Optimize writes such a model as given: its speedup is 1.00× by identity, and timing it
    # would only report run-to-run spread (the GPU and its bench are stood in for).
    from types import SimpleNamespace

    from onnx import TensorProto, helper

    from onnxstitch import bench, gate

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], np.eye(8, dtype=np.float32).ravel())
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one", [x], [y], [w])
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    monkeypatch.setattr(gate, "gpu_usable", lambda: True)
    monkeypatch.setattr(gate, "_numerics", lambda *a, **k: ())
    monkeypatch.setattr(bench, "run", lambda *a, **k: SimpleNamespace(speedup=0.3))
    res = gate.run_check(path, None)
    assert res.speedup == 1.0 and res.ok and any("nothing fused" in n for n in res.notes), res


def test_a_check_after_gpu_verification_takes_its_judgement(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A zoo run optimizes with verification: where that ran the kernels on this GPU and passed,
    # check reports its per-output figures rather than running both models again; with its own
    # tolerances, or where verification ran on the CPU, check compares the outputs itself (the
    # GPU, verification's verdict and the timing are stood in for).
    from types import SimpleNamespace

    from onnxstitch import bench, gate, pipeline
    from onnxstitch.verify import OutputStat, Verification

    model = onnx.load(str(model_path))
    outs = [o.name for o in model.graph.output]
    stats = tuple(OutputStat(n, 1e-6, 2e-6, 3e-6, 1e-4, 0.0) for n in outs[:1])
    real = pipeline.optimize

    def verified(device: str):
        def run(*a, **k):
            res = real(*a, **k)
            v = Verification(device, 5, 1e-6, outputs=stats)
            return SimpleNamespace(model=res.model, report=SimpleNamespace(**{
                name: getattr(res.report, name) for name in ("plan", "notes", "stage_seconds")}, verification=v))
        return run

    ran: list[bool] = []
    monkeypatch.setattr(gate, "gpu_usable", lambda: True)
    monkeypatch.setattr(gate, "_numerics", lambda *a, **k: ran.append(True) or ())
    monkeypatch.setattr(bench, "run", lambda *a, **k: SimpleNamespace(speedup=1.5))
    monkeypatch.setattr(gate, "optimize", verified("gpu"))
    res = gate.run_check(model_path, None)
    assert not ran and [o.name for o in res.outputs] == outs and all(o.ok for o in res.outputs)
    assert res.outputs[0].max_abs_err == 2e-6 and res.speedup == 1.5
    gate.run_check(model_path, None, atol=1e-3)  # its own tolerances: compared again
    monkeypatch.setattr(gate, "optimize", verified("cpu"))
    gate.run_check(model_path, None)  # verified through the fallbacks only: compared again
    assert len(ran) == 2
