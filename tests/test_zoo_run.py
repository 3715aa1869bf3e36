"""`onnxstitch zoo`: a manifest's models checked in local processes into one report, failures
first and the exit status CI's verdict; a worker that dies is run again once and the report says
so; a wrong manifest or an unreachable Ray address is one line and exit status 2."""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from models.elementwise import chain
from onnxstitch import zoo
from onnxstitch.cli.main import main
from onnxstitch.errors import BadInputError


def _zoo(tmp_path: Path, extra: list[dict] | None = None) -> Path:
    onnx.save(chain(8, shape=("batch", 64)), str(tmp_path / "chain.onnx"))
    onnx.save(chain(3, shape=("batch", 16)), str(tmp_path / "short.onnx"))
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    models = [{"name": "chain", "file": "chain.onnx", "shapes": {"batch": [4]}, "baseline": "base/chain.json"},
              {"name": "short", "file": "short.onnx", "shapes": {"batch": [2]}, "options": {"pack": False}},
              {"name": "broken", "file": "broken.onnx"}] + (extra or [])
    manifest = tmp_path / "zoo.json"
    manifest.write_text(json.dumps({"schema": 1, "models": models}))
    return manifest


def test_a_zoo_runs_in_local_processes_into_one_report(tmp_path: Path) -> None:
    manifest = _zoo(tmp_path)
    out = tmp_path / "report"
    res = CliRunner().invoke(main, ["zoo", str(manifest), "--out", str(out), "--local", "--jobs", "2",
                                    "--update-baselines"])
    assert res.exit_code == 1, res.output  # the broken file fails the run
    doc = json.loads((out / "zoo.json").read_text())
    rows = {r["name"]: r for r in doc["models"]}
    assert rows["chain"]["status"] == "ok" and rows["short"]["status"] == "ok"
    assert rows["broken"]["status"] == "error" and "broken.onnx" in rows["broken"]["error"]
    assert doc["models"][0]["name"] == "broken"  # failures first
    assert rows["chain"]["kernels_after"] < rows["chain"]["kernels_before"] and rows["chain"]["device"] == "cpu"
    # where each model's time went: optimize's stages, then check's numerics (no timing on a CPU)
    took = rows["chain"]["stage_seconds"]
    assert {"plan", "compile", "numerics"} <= set(took) and "timing" not in took
    assert sum(took.values()) <= rows["chain"]["seconds"]
    assert (tmp_path / "base" / "chain.json").exists()  # --update-baselines
    md = (out / "zoo.md").read_text()
    assert "| broken | error |" in md and "3 models:" in md and "local process" in md
    assert "error: broken" in res.output


def test_a_regression_against_the_baseline_fails_the_run(tmp_path: Path) -> None:
    manifest = _zoo(tmp_path)
    data = json.loads(manifest.read_text())
    data["models"] = data["models"][:1]
    manifest.write_text(json.dumps(data))
    assert CliRunner().invoke(main, ["zoo", str(manifest), "--out", str(tmp_path / "r"), "--local",
                                     "--update-baselines", "-q"]).exit_code == 0
    base = tmp_path / "base" / "chain.json"
    old = json.loads(base.read_text())
    old["plan"]["kernels_after"] = 0  # a baseline that fused better than today's plan can
    base.write_text(json.dumps(old))
    res = CliRunner().invoke(main, ["zoo", str(manifest), "--out", str(tmp_path / "r"), "--local"])
    assert res.exit_code == 1 and "regressed: chain" in res.output
    assert json.loads((tmp_path / "r" / "zoo.json").read_text())["models"][0]["status"] == "regressed"


def _killed_once(tmp_path: Path, name: str) -> Path:
    """A worker command that dies (SIGKILL) on its first task for model `name` and runs every
    other task, and that one again, as `python -m onnxstitch.zoo` would."""
    marker = tmp_path / f"{name}-killed-once"
    killer = tmp_path / "killer.py"
    killer.write_text(f"""import json, os, signal, sys
if json.load(open(sys.argv[1]))["name"] == {name!r} and not os.path.exists({str(marker)!r}):
    open({str(marker)!r}, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
from onnxstitch.zoo import main
sys.exit(main(sys.argv[1:]))
""")
    return killer


def test_a_worker_that_dies_is_run_again_once(tmp_path: Path) -> None:
    """The child command dies (SIGKILL) on its first task for 'chain', runs normally after."""
    manifest = _zoo(tmp_path)
    killer = _killed_once(tmp_path, "chain")
    run = zoo.LocalExecutor(jobs=2, gpus=0, command=[sys.executable, str(killer)])
    report = zoo.run_zoo(manifest, out=tmp_path / "r", run=run)
    rows = {r.name: r for r in report.results}
    assert rows["chain"].status == "ok" and rows["chain"].attempts == 2
    assert rows["short"].attempts == 1
    assert "run again after their worker died" in report.summary()


def test_a_worker_that_dies_twice_is_reported_as_died(tmp_path: Path) -> None:
    manifest = _zoo(tmp_path)
    killer = tmp_path / "always.py"
    killer.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    report = zoo.run_zoo(manifest, run=zoo.LocalExecutor(jobs=2, gpus=0, command=[sys.executable, str(killer)]))
    assert {r.status for r in report.results} == {"died"} and {r.attempts for r in report.results} == {2}
    assert all("signal 9" in r.error for r in report.results)


@pytest.mark.parametrize("content, message", [
    ("{models", "not a JSON zoo manifest"),
    ("[]", "a list of \"models\""),
    ('{"models": [{"file": "a.onnx"}]}', "needs a \"name\""),
    ('{"models": [{"name": "a", "file": "a.onnx", "options": {"turbo": true}}]}', "unknown options ['turbo']"),
    ('{"models": [{"name": "a", "file": "a.onnx"}, {"name": "a", "file": "b.onnx"}]}', "names repeat"),
])
def test_a_wrong_manifest_is_one_line_exit_2(tmp_path: Path, content: str, message: str) -> None:
    manifest = tmp_path / "zoo.json"
    manifest.write_text(content)
    res = CliRunner().invoke(main, ["zoo", str(manifest), "--local"])
    assert res.exit_code == 2 and message in res.output, res.output


def test_an_unreachable_ray_address_is_one_line_exit_2() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BadInputError, match=f"--address 127.0.0.1:{port}: no Ray cluster answers there"):
        zoo.check_address(f"127.0.0.1:{port}")
    with pytest.raises(BadInputError, match="expected HOST:PORT"):
        zoo.check_address("nowhere")


@pytest.mark.xdist_group("ray")  # one local Ray at a time on the machine
def test_the_same_run_through_a_local_ray_retries_a_dead_worker(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")  # the test extra installs it; `onnxstitch[fleet]` for users
    manifest = _zoo(tmp_path)
    killer = _killed_once(tmp_path, "short")
    try:
        run = zoo.RayExecutor(command=[sys.executable, str(killer)])
        assert run.describe().startswith("Ray (")
        report = zoo.run_zoo(manifest, out=tmp_path / "r", run=run)
    finally:
        ray.shutdown()
    rows = {r.name: r for r in report.results}
    assert rows["chain"].status == "ok" and rows["broken"].status == "error"
    assert rows["short"].status == "ok" and rows["short"].attempts == 2
    assert "Ray" in json.loads((tmp_path / "r" / "zoo.json").read_text())["executor"]


class _Recorder:
    """An executor that runs nothing and keeps the order the tasks came in."""

    order: list[str] = []

    def describe(self) -> str:
        return "a recorder"

    def run(self, tasks, done) -> None:
        self.order = [t["name"] for t in tasks]


def test_the_models_the_last_run_timed_longest_start_first(tmp_path: Path) -> None:
    """A report already in --out orders the next run: its slowest model starts first, the models
    it does not list after, in the manifest's order."""
    manifest = _zoo(tmp_path)
    out = tmp_path / "report"
    out.mkdir()
    (out / "zoo.json").write_text(json.dumps({"models": [{"name": "chain", "seconds": 1.0},
                                                          {"name": "short", "seconds": 40.0}]}))

    rec = _Recorder()
    zoo.run_zoo(manifest, out=out, run=rec)
    assert rec.order == ["short", "chain", "broken"]
    zoo.run_zoo(manifest, out=tmp_path / "fresh", run=rec)  # no report yet: the manifest's order
    assert rec.order == ["chain", "short", "broken"]


def test_a_first_run_starts_the_biggest_models_first(tmp_path: Path) -> None:
    """With no report yet, expected time is the node count (bodies included): a big model last
    in the manifest starts first. With one, models it did not time are priced at its seconds per
    node, so a new big model still starts before small ones it timed."""
    onnx.save(chain(40, shape=("batch", 64)), str(tmp_path / "big.onnx"))
    manifest = _zoo(tmp_path, [{"name": "big", "file": "big.onnx", "shapes": {"batch": [4]}}])

    rec = _Recorder()
    zoo.run_zoo(manifest, out=tmp_path / "fresh", run=rec)
    assert rec.order == ["big", "chain", "short", "broken"]
    out = tmp_path / "report"
    out.mkdir()
    (out / "zoo.json").write_text(json.dumps({"models": [{"name": "chain", "seconds": 2.0},
                                                          {"name": "short", "seconds": 3.0}]}))
    zoo.run_zoo(manifest, out=out, run=rec)
    assert rec.order[0] == "big" and rec.order.index("short") < rec.order.index("chain")


def test_shards_take_every_model_once(tmp_path: Path) -> None:
    """--shard K/N takes every Nth model from the Kth, by the manifest alone; the report says
    which shard it is; a malformed shard is one line and exit status 2."""
    manifest = _zoo(tmp_path)
    models = zoo.read_manifest(manifest)
    parts = [zoo.shard_of(models, (k, 2)) for k in (1, 2)]
    assert [m.name for m in parts[0]] == ["chain", "broken"] and [m.name for m in parts[1]] == ["short"]
    out = tmp_path / "r2"
    res = CliRunner().invoke(main, ["zoo", str(manifest), "--out", str(out), "--local", "--jobs", "1",
                                    "--shard", "2/2"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "zoo.json").read_text())
    assert [r["name"] for r in doc["models"]] == ["short"] and doc["shard"] == "2/2"
    assert "(shard 2/2)" in doc["summary"]
    for bad in ("3/2", "0/2", "x", "1/0"):
        res = CliRunner().invoke(main, ["zoo", str(manifest), "--shard", bad])
        assert res.exit_code == 2 and "--shard" in res.output and "Traceback" not in res.output, (bad, res.output)


def test_workers_share_the_hosts_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two workers on an 8-core host: each holds ORT's and BLAS's pools to 4 threads (the child
    # writes what it was given and fails its task, so the report carries it back).
    monkeypatch.setattr(zoo.os, "cpu_count", lambda: 8)
    manifest = _zoo(tmp_path)
    spy = tmp_path / "spy.py"
    spy.write_text("import os, sys\nsys.stderr.write(os.environ.get('ONNXSTITCH_THREADS', '-') + ' '"
                   " + os.environ.get('OMP_NUM_THREADS', '-'))\nsys.exit(3)\n")
    report = zoo.run_zoo(manifest, run=zoo.LocalExecutor(jobs=2, gpus=0, command=[sys.executable, str(spy)]))
    assert {r.error.rsplit(": ", 1)[-1] for r in report.results} == {"4 4"}, [r.error for r in report.results]
    alone = zoo.run_zoo(manifest, run=zoo.LocalExecutor(jobs=1, gpus=0, command=[sys.executable, str(spy)]))
    assert {r.error.rsplit(": ", 1)[-1].split()[0] for r in alone.results} == {"-"}, [r.error for r in alone.results]


def test_the_thread_share_reaches_ort_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    from onnxstitch import ortio

    monkeypatch.setenv(ortio.THREADS_ENV, "3")
    so = ortio.with_custom_ops(ort.SessionOptions(), ())
    assert so.intra_op_num_threads == 3 and so.inter_op_num_threads == 1
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    monkeypatch.delenv(ortio.THREADS_ENV)
    assert ortio.with_custom_ops(ort.SessionOptions(), ()).intra_op_num_threads == 0
