"""`onnxstitch zoo`: a model zoo's CI run — `check` on every model of a manifest, spread over the
GPUs (or CPU cores) of a machine, or over a Ray cluster, into one report whose exit status is
CI's verdict.

The manifest (ZOO.json) is the corpus manifest's form:

    {"schema": 1, "models": [
      {"name": "bert", "file": "bert.onnx", "shapes": {"batch": [8], "sequence": [128]},
       "options": {"epilogues": false}, "baseline": "baselines/bert.json"}, ...]}

`file` (or `path`) and `baseline` are relative to the manifest; `shapes` are read as `--shape`
is (sizes.py), `values` as `--value` (inputs that take one value: a sample rate); `options` are
optimize's (pipeline.Options fields); a model without a baseline is
checked for numerics only, and `--update-baselines` writes one for every model that passes.

Each model is one task: `gate.run_check` in a child process of its own (so a crash or a killed
worker costs that model alone), one per GPU at a time with CUDA_VISIBLE_DEVICES set, or one per
CPU core where there is no GPU. A task whose process dies is run again once, and the report says
so; one that dies again is reported as died. With Ray installed (`onnxstitch[fleet]`) tasks are
Ray tasks (`num_gpus=1` each on GPU machines): a local Ray is started unless `--address` names a
cluster to join. Without Ray, or with `--local`, local processes run them. Kernel caches and
measured costs live in `$ONNXSTITCH_CACHE`, shared by the tasks of one machine.

The longest models start first (`_longest_first`: the last report's times, else node counts);
`--shard K/N` takes every Nth model of the manifest from its Kth, for a zoo split across CI jobs.

Exit status: 0 when every model passed, 1 when any regressed, failed or died, 2 for a manifest
or an address that is wrong.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import ortio
from .errors import BadInputError, first_line, read_json

SCHEMA = 1
REPORT_SCHEMA = 1
OK, REGRESSED, ERROR, INTERNAL, DIED = "ok", "regressed", "error", "internal", "died"
FAILING = (REGRESSED, ERROR, INTERNAL, DIED)
# A task whose process dies is run this many times in all before it is reported as died.
ATTEMPTS = 2


@dataclass(frozen=True)
class ZooModel:
    """One model of the manifest: its file, sizes, optimize options and baseline file."""

    name: str
    path: Path
    shapes: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    baseline: Path | None = None
    values: Mapping[str, float] = field(default_factory=dict)  # inputs that take one value (--value)


def read_manifest(path: str | os.PathLike) -> list[ZooModel]:
    """The models of a zoo manifest. Raises BadInputError naming what is wrong in it."""
    from .pipeline import Options

    path = Path(path)
    data = read_json(path, "zoo manifest")
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise BadInputError(f"{path}: a zoo manifest is an object with a list of \"models\"")
    fields = set(Options.__dataclass_fields__) - {"shapes", "cost", "custom_op_libraries", "values"}
    out: list[ZooModel] = []
    for k, m in enumerate(data["models"]):
        where = f"{path}: models[{k}]"
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise BadInputError(f"{where}: each model needs a \"name\"")
        file = m.get("file", m.get("path"))
        if not isinstance(file, str):
            raise BadInputError(f"{where} ({m['name']}): no \"file\"")
        options = m.get("options", {})
        if not isinstance(options, dict) or set(options) - fields:
            bad = sorted(set(options) - fields) if isinstance(options, dict) else options
            raise BadInputError(f"{where} ({m['name']}): unknown options {bad} (optimize takes {sorted(fields)})")
        base = m.get("baseline")
        values = m.get("values") or {}
        if not isinstance(values, dict) or not all(isinstance(v, (int, float, bool)) for v in values.values()):
            raise BadInputError(f"{where} ({m['name']}): \"values\" maps input names to numbers")
        out.append(ZooModel(m["name"], path.parent / file, dict(m.get("shapes") or {}), dict(options),
                            path.parent / base if isinstance(base, str) else None, dict(values)))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise BadInputError(f"{path}: model names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return out


@dataclass(frozen=True)
class ZooResult:
    """What one model's check found, and how its task ran."""

    name: str
    status: str  # OK, REGRESSED, ERROR (bad input), INTERNAL, DIED
    device: str = ""
    seconds: float = 0.0
    attempts: int = 1
    speedup: float | None = None
    baseline_speedup: float | None = None
    kernels_before: int | None = None
    kernels_after: int | None = None
    regressions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    error: str = ""
    worker: str = ""  # where it ran: host (and GPU)
    # Kernels of one run of the model's If/Loop/Scan bodies, before and after (None: no body stitched).
    body_kernels: tuple[int, int] | None = None
    # Where the model's time went: optimize's stages, check's "numerics" and "timing" (seconds).
    stage_seconds: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- one task (in its own process)


def run_task(task: Mapping[str, Any]) -> dict:
    """One model's check, as the child process runs it: a ZooResult as a dict."""
    from .gate import run_check

    t0 = time.perf_counter()
    name = task["name"]
    try:
        baseline = Path(task["baseline"]) if task.get("baseline") else None
        res = run_check(task["path"], baseline if baseline and baseline.exists() and not task.get("update") else None,
                        shapes=task.get("shapes") or None, max_slowdown_pct=task.get("max_slowdown", 10.0),
                        options=task.get("options") or {}, values=task.get("values") or {})
        numerics_ok = all(o.ok for o in res.outputs)
        if task.get("update") and baseline is not None and numerics_ok:
            baseline.parent.mkdir(parents=True, exist_ok=True)
            baseline.write_text(json.dumps(res.baseline(), indent=2) + "\n")
        old = json.loads(baseline.read_text()) if baseline and baseline.exists() else {}
        return ZooResult(name, OK if res.ok else REGRESSED, res.device, time.perf_counter() - t0, 1, res.speedup,
                         old.get("speedup"), res.plan.get("kernels_before"), res.plan.get("kernels_after"),
                         tuple(res.regressions), tuple(res.notes),
                         body_kernels=(res.plan["body_kernels_before"], res.plan["body_kernels_after"])
                         if "body_kernels_before" in res.plan else None,
                         stage_seconds={k: round(v, 3) for k, v in res.seconds.items()}).to_json()
    except Exception as e:  # every failure becomes the model's row, never the run's
        from .errors import StitchError

        internal = not isinstance(e, StitchError) or first_line(e).startswith("internal error")
        status = INTERNAL if internal else ERROR
        return ZooResult(name, status, seconds=time.perf_counter() - t0,
                         error=f"{type(e).__name__}: {first_line(e)}").to_json()


def _task(model: ZooModel, update: bool, max_slowdown: float) -> dict:
    # optimize as a user runs it: verified before written (check alone compares outputs only)
    options = {"verify": True, **model.options}
    return {"name": model.name, "path": str(model.path), "shapes": dict(model.shapes), "options": options,
            "values": dict(model.values),
            "baseline": str(model.baseline) if model.baseline else "", "update": update, "max_slowdown": max_slowdown}


def child_command() -> list[str]:
    """The command a task's process runs (`python -m onnxstitch.zoo TASK OUT`)."""
    return [sys.executable, "-m", "onnxstitch.zoo"]


def run_in_child(task: Mapping[str, Any], env: Mapping[str, str] | None = None, timeout: float = 3600.0,
                 command: Sequence[str] | None = None) -> dict:
    """`run_task` in a fresh process; a process that dies (signal, non-zero exit without a
    result, timeout) gives a DIED row with why."""
    with tempfile.TemporaryDirectory(prefix="onnxstitch-zoo-") as tmp:
        job, out = Path(tmp) / "task.json", Path(tmp) / "result.json"
        job.write_text(json.dumps(task))
        t0 = time.perf_counter()
        try:
            done = subprocess.run([*(command or child_command()), str(job), str(out)], capture_output=True, text=True,
                                  env={**os.environ, **(env or {})}, timeout=timeout)
        except subprocess.TimeoutExpired:
            return ZooResult(task["name"], DIED, seconds=time.perf_counter() - t0,
                             error=f"ran past {timeout:.0f} s").to_json()
        if out.exists():
            return json.loads(out.read_text())
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        return ZooResult(task["name"], DIED, seconds=time.perf_counter() - t0, error=f"{how}: {tail[:300]}").to_json()


# ---------------------------------------------------------------- executors


def gpu_ids() -> list[str]:
    """The NVIDIA GPUs this process may use: those CUDA_VISIBLE_DEVICES names where it is set
    (so `CUDA_VISIBLE_DEVICES=0 onnxstitch zoo` runs on one GPU of many), else every GPU
    nvidia-smi lists; none where there are none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        listed = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        listed = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not listed:
        return listed
    return [d.strip() for d in visible.split(",") if d.strip()][:len(listed)]


class LocalExecutor:
    """Tasks in local processes: one per GPU at a time (CUDA_VISIBLE_DEVICES), or `jobs` at a
    time on the CPU."""

    name = "local processes"

    def __init__(self, jobs: int | None = None, gpus: int | None = None,
                 command: Sequence[str] | None = None) -> None:
        self.ids = gpu_ids() if gpus is None else [str(i) for i in range(gpus)]
        self.gpus = len(self.ids)
        self.slots = self.gpus or max(1, jobs or os.cpu_count() or 1)
        self.command = command

    def describe(self) -> str:
        return f"{self.slots} local process{'es' if self.slots > 1 else ''}" + \
            (", one per GPU" if self.gpus else " on the CPU")

    def run(self, tasks: Sequence[dict], done: Callable[[dict], None]) -> None:
        free = list(range(self.slots))

        # Workers share the host's cores: each gets its share for ORT's and BLAS's thread pools,
        # which otherwise start one thread per core each (4 workers on a 64-core host ran every
        # model 38% slower than one alone).
        share = str(max(1, (os.cpu_count() or 1) // self.slots))
        threads = {k: share for k in (ortio.THREADS_ENV, "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS")} if self.slots > 1 else {}

        def one(task: dict, slot: int) -> dict:
            env = {"CUDA_VISIBLE_DEVICES": self.ids[slot] if self.gpus else "", **threads}
            if self.gpus:  # (workers sharing a GPU time one at a time: measure.timing_lock)
                env[ortio.TIMING_LOCK_ENV] = str(Path(tempfile.gettempdir()) / f"onnxstitch-timing-gpu{self.ids[slot]}.lock")
            row = run_in_child(task, env, command=self.command)
            row["worker"] = f"{socket.gethostname()}" + (f" GPU {self.ids[slot]}" if self.gpus else f" slot {slot}")
            return row

        pending = list(tasks)
        attempts = {t["name"]: 0 for t in tasks}
        with ThreadPoolExecutor(self.slots) as pool:
            running: dict[Future, tuple[dict, int]] = {}
            while pending or running:
                while pending and free:
                    task, slot = pending.pop(0), free.pop(0)
                    attempts[task["name"]] += 1
                    running[pool.submit(one, task, slot)] = (task, slot)
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    task, slot = running.pop(fut)
                    free.append(slot)
                    row = fut.result()
                    if row["status"] == DIED and attempts[task["name"]] < ATTEMPTS:
                        pending.insert(0, task)  # its worker died: once more
                        continue
                    row["attempts"] = attempts[task["name"]]
                    done(row)


def check_address(address: str) -> None:
    """A Ray cluster's address must answer: BadInputError in one line where nothing listens."""
    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise BadInputError(f"--address {address}: expected HOST:PORT or ray://HOST:PORT of a Ray cluster")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            pass
    except (OSError, ValueError) as e:
        raise BadInputError(f"--address {address}: no Ray cluster answers there ({first_line(e)})") from None


class RayExecutor:
    """Tasks as Ray tasks (`num_gpus=1` each where the cluster has GPUs), each running the model in
    a child process as the local executor does; a task whose Ray worker dies is run again once."""

    name = "Ray"

    def __init__(self, address: str | None = None, command: Sequence[str] | None = None) -> None:
        import ray

        if address:
            check_address(address)
        self.ray = ray
        self.command = list(command) if command else None
        if not ray.is_initialized():
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True, configure_logging=False)
        self.gpus = int(ray.cluster_resources().get("GPU", 0))

    def describe(self) -> str:
        res = self.ray.cluster_resources()
        return f"Ray ({int(res.get('CPU', 0))} CPUs, {self.gpus} GPUs)"

    def run(self, tasks: Sequence[dict], done: Callable[[dict], None]) -> None:
        ray = self.ray

        command = self.command

        @ray.remote(max_retries=0, num_gpus=1 if self.gpus else 0, num_cpus=1)
        def remote(task: dict) -> dict:
            ids = ray.get_gpu_ids()
            env = {"CUDA_VISIBLE_DEVICES": ",".join(str(int(i)) for i in ids)} if ids else {"CUDA_VISIBLE_DEVICES": ""}
            row = run_in_child(task, env, command=command)
            row["worker"] = f"{socket.gethostname()}" + (f" GPU {ids[0]}" if ids else "")
            return row

        attempts = {t["name"]: 1 for t in tasks}
        refs = {remote.remote(t): t for t in tasks}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                task = refs.pop(ref)
                try:
                    row = ray.get(ref)
                except Exception as e:  # the Ray worker died (or the node): once more, then reported
                    row = ZooResult(task["name"], DIED, error=f"Ray worker died: {first_line(e)}").to_json()
                if row["status"] == DIED and attempts[task["name"]] < ATTEMPTS:
                    attempts[task["name"]] += 1
                    refs[remote.remote(task)] = task
                    continue
                row["attempts"] = attempts[task["name"]]
                done(row)


def executor(address: str | None = None, jobs: int | None = None, local: bool = False):
    """Ray where it is installed (and not `local`), joining `address` if given; else local
    processes. An `address` without Ray installed is the user's error."""
    if not local:
        try:
            import ray  # noqa: F401
        except ImportError:
            if address:
                raise BadInputError(f"--address {address}: Ray is not installed (pip install 'onnxstitch[fleet]')") from None
        else:
            return RayExecutor(address)
    return LocalExecutor(jobs)


# ---------------------------------------------------------------- the run and its report


@dataclass(frozen=True)
class ZooReport:
    """Every model's result, how the run was spread, its wall time."""

    manifest: str
    results: tuple[ZooResult, ...]
    executor: str
    seconds: float
    shard: str = ""  # "K/N" when the run took one shard of the manifest (shard_of)

    @property
    def failed(self) -> list[ZooResult]:
        return [r for r in self.results if r.status in FAILING]

    @property
    def geomean(self) -> float | None:
        speeds = [r.speedup for r in self.results if r.speedup]
        return math.exp(sum(math.log(s) for s in speeds) / len(speeds)) if speeds else None

    def to_json(self) -> dict:
        return {"schema": REPORT_SCHEMA, "manifest": self.manifest, "shard": self.shard or None, "executor": self.executor,
                "seconds": round(self.seconds, 2), "geomean_speedup": self.geomean,
                "summary": self.summary(), "models": [r.to_json() for r in _ordered(self.results)]}

    def summary(self) -> str:
        counts = {s: sum(r.status == s for r in self.results) for s in (OK, REGRESSED, ERROR, INTERNAL, DIED)}
        retried = sum(r.attempts > 1 for r in self.results)
        geo = f"; geometric mean speedup {self.geomean:.2f}×" if self.geomean else ""
        which = f" (shard {self.shard})" if self.shard else ""
        return (f"{len(self.results)} models{which}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) +
                (f" ({retried} run again after their worker died)" if retried else "") +
                f"{geo}; {self.seconds:.0f} s on {self.executor}")

    def markdown(self) -> str:
        lines = [f"# onnxstitch zoo — {Path(self.manifest).name}", "", self.summary(), "",
                 "| model | status | device | kernels | speedup | baseline | runs | notes |",
                 "| --- | --- | --- | --- | ---: | ---: | ---: | --- |"]
        for r in _ordered(self.results):
            kernels = f"{r.kernels_before} → {r.kernels_after}" if r.kernels_before is not None else ""
            if r.body_kernels:
                kernels += f" (bodies {r.body_kernels[0]} → {r.body_kernels[1]})"
            notes = "; ".join([*r.regressions, *( [r.error] if r.error else []), *r.notes])
            lines.append(f"| {r.name} | {r.status} | {r.device} | {kernels} | "
                         f"{f'{r.speedup:.2f}×' if r.speedup else ''} | "
                         f"{f'{r.baseline_speedup:.2f}×' if r.baseline_speedup else ''} | {r.attempts} | "
                         f"{notes.replace('|', '/')[:300]} |")
        return "\n".join(lines) + "\n"


def _ordered(results: Iterable[ZooResult]) -> list[ZooResult]:
    """Failures first (regressions, then errors, internal errors, deaths), then by name."""
    rank = {REGRESSED: 0, INTERNAL: 1, DIED: 2, ERROR: 3, OK: 4}
    return sorted(results, key=lambda r: (rank.get(r.status, 5), r.name))


def _nodes(path: Path) -> int:
    """Nodes of the model at `path`, its If/Loop/Scan bodies' included (0 if it cannot be read:
    its task reports why). Weights stay on disk."""
    import onnx

    from .edit import subgraphs

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - the task itself names what is wrong with the file
        return 0

    def count(g: onnx.GraphProto) -> int:
        return sum(1 + sum(count(b) for b in subgraphs(n)) for n in g.node)

    return count(model.graph)


def _longest_first(tasks: list[dict], out: Path | None, models: Sequence[ZooModel] = ()) -> list[dict]:
    """`tasks` by their expected time, longest first, so that no long model starts last while
    the other workers sit idle (slanet-table, started last in a first run on four GPUs, held one
    worker 50 s past the others). A model the last report in `out` timed is expected to take that
    long again; another, its node count times the seconds per node of the models timed (a first
    run: its node count), so that big models start early without any report."""
    try:
        last = json.loads((out / "zoo.json").read_text()) if out is not None else {}
        took = {r["name"]: float(r["seconds"]) for r in last.get("models", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        took = {}
    nodes = {m.name: _nodes(m.path) for m in models if m.name not in took}
    # (the timed models' files are read only when some model needs their rate)
    per_node = sorted(took[m.name] / n for m in models if nodes and m.name in took and (n := _nodes(m.path)) > 0)
    rate = per_node[len(per_node) // 2] if per_node else 1.0
    return sorted(tasks, key=lambda t: -took.get(t["name"], nodes.get(t["name"], 0) * rate))


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` (1 ≤ K ≤ N) as (K, N). Raises BadInputError for anything else."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise BadInputError(f"--shard {text}: expected K/N with 1 ≤ K ≤ N (1/2 and 2/2 split a zoo in two)")
    return k, n


def shard_of(models: Sequence[ZooModel], shard: tuple[int, int] | None) -> list[ZooModel]:
    """The models of shard K of N: every Nth of the manifest, from its Kth. The split depends on
    the manifest alone, so that CI jobs started at different times (with different reports in
    their --out) still take every model exactly once."""
    if shard is None:
        return list(models)
    k, n = shard
    return [m for i, m in enumerate(models) if i % n == k - 1]


def run_zoo(manifest: str | os.PathLike, *, out: Path | None = None, run: Any = None, update: bool = False,
            max_slowdown: float = 10.0, progress: Callable[[ZooResult, int, int], None] | None = None,
            shard: tuple[int, int] | None = None) -> ZooReport:
    """Check every model of `manifest` (of its shard (K, N) if given: `shard_of`) on `run` (an
    executor: `executor()`'s choice by default), writing `zoo.json` and `zoo.md` into `out` as
    results arrive."""
    models = shard_of(read_manifest(manifest), shard)
    run = run or executor()
    tasks = _longest_first([_task(m, update, max_slowdown) for m in models], out, models)
    results: list[ZooResult] = []
    label = f"{shard[0]}/{shard[1]}" if shard else ""
    where = run.describe()  # once: Ray's asks the cluster
    t0 = time.perf_counter()

    def done(row: dict) -> None:
        r = ZooResult(**{k: tuple(v) if isinstance(v, list) else v for k, v in row.items()
                         if k in ZooResult.__dataclass_fields__})
        results.append(r)
        if progress:
            progress(r, len(results), len(tasks))
        if out is not None:
            _write(ZooReport(str(manifest), tuple(results), where, time.perf_counter() - t0, label), out)

    run.run(tasks, done)
    report = ZooReport(str(manifest), tuple(results), where, time.perf_counter() - t0, label)
    if out is not None:
        _write(report, out)
    return report


def _write(report: ZooReport, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "zoo.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    (out / "zoo.md").write_text(report.markdown())


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m onnxstitch.zoo TASK OUT`: one task, its result written to OUT (a child process)."""
    task_file, out_file = (argv or sys.argv[1:])[:2]
    row = run_task(json.loads(Path(task_file).read_text()))
    Path(out_file).write_text(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
