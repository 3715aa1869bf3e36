"""ONNX Runtime's profile traces (SessionOptions.enable_profiling, end_profiling's JSON), read
once for every user: bench's launch counts, `bench --profile`'s "where the time goes" and
scripts/gpu_timeline.py.

A trace is a list of Chrome-trace events. Each `Run` is a "Session" event named "model_run";
every node execution is a "Node" event named `<node>_kernel_time` (besides `_fence_before` /
`_fence_after` markers on some providers), with the op type and provider in its args. ORT
builds with CUDA profiling add "Kernel" events, one per GPU kernel, named by the kernel.
An event belongs to the last run that began at or before it (GPU kernel timestamps may trail
the host's end of the run); the first `skip_runs` runs are warm-up and are left out.
"""
from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence, Union

from .errors import StitchError

NODE_SUFFIX = "_kernel_time"
# ORT inlines a model-local function where no kernel is registered for it (a stitched model on
# the CPU): its nodes are named `_inlfunc_<function>_<node>`, the function being FusedKernel.
INLINED_FUSED_PREFIX = "_inlfunc_FusedKernel_"
FUSED_FALLBACK = "FusedKernel (fallback)"
DEFAULT_TOP = 15


@dataclass(frozen=True)
class ProfileEntry:
    """One node or GPU kernel (by name) over the counted runs: total time and executions."""

    name: str
    op_type: str
    provider: str
    total_us: float
    calls: int


@dataclass(frozen=True)
class Row:
    """One line of a top list, per run: time, share of the run's total, executions."""

    name: str
    us_per_run: float
    share: float
    calls_per_run: float


@dataclass(frozen=True)
class Profile:
    """A trace's counted runs: every node and (where recorded) every GPU kernel, by name."""

    runs: int
    skipped_runs: int
    nodes: tuple[ProfileEntry, ...]
    kernels: tuple[ProfileEntry, ...] = ()

    @property
    def node_us_per_run(self) -> float:
        """Total node time per run (host-side on the CUDA EP: launches, not GPU time)."""
        return sum(e.total_us for e in self.nodes) / self.runs

    @property
    def kernel_us_per_run(self) -> float:
        """Total GPU kernel time per run (0 where the trace has no Kernel events)."""
        return sum(e.total_us for e in self.kernels) / self.runs

    def nodes_per_run(self, provider: str | None = None) -> float:
        """Node executions per run, on `provider` if given."""
        return sum(e.calls for e in self.nodes if provider in (None, e.provider)) / self.runs

    @property
    def kernels_per_run(self) -> float:
        return sum(e.calls for e in self.kernels) / self.runs

    def node_names(self, op_type: str, provider: str | None = None) -> set[str]:
        """The names of the nodes of `op_type` (on `provider` if given) that ran."""
        return {e.name for e in self.nodes if e.op_type == op_type and provider in (None, e.provider)}

    def by_op(self, top: int | None = None, with_provider: bool | None = None) -> list[Row]:
        """Node time per op type, most first; named `provider:op` if `with_provider` (by default
        where several providers ran nodes: a Memcpy or shape node on the CPU beside the CUDA EP)."""
        if with_provider is None:
            with_provider = len({e.provider for e in self.nodes}) > 1
        return _rows(self.nodes, lambda e: f"{e.provider.replace('ExecutionProvider', '')}:{e.op_type}"
                     if with_provider else e.op_type, self.runs, top)

    def by_kernel(self, top: int | None = None) -> list[Row]:
        """GPU kernel time per kernel name, most first (empty without Kernel events)."""
        return _rows(self.kernels, lambda e: e.name, self.runs, top)

    def summary(self, top: int = DEFAULT_TOP) -> dict[str, Any]:
        """The machine-readable form: totals per run and the top `top` op types and kernels."""
        return {"runs": self.runs, "skipped_runs": self.skipped_runs,
                "node_us_per_run": round(self.node_us_per_run, 2), "nodes_per_run": self.nodes_per_run(),
                "kernel_us_per_run": round(self.kernel_us_per_run, 2), "kernels_per_run": self.kernels_per_run,
                "by_op": [_row_json(r) for r in self.by_op(top)],
                "by_kernel": [_row_json(r) for r in self.by_kernel(top)]}


def _rows(entries: Iterable[ProfileEntry], key: Callable[[ProfileEntry], str], runs: int,
          top: int | None) -> list[Row]:
    us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in entries:
        us[key(e)] += e.total_us
        calls[key(e)] += e.calls
    total = sum(us.values()) or 1.0
    ranked = sorted(us, key=lambda k: (-us[k], k))[:top]
    return [Row(k, us[k] / runs, us[k] / total, calls[k] / runs) for k in ranked]


def _row_json(r: Row) -> dict[str, Any]:
    return {"name": r.name, "us_per_run": round(r.us_per_run, 2), "share": round(r.share, 4),
            "calls_per_run": r.calls_per_run}


Trace = Union[str, os.PathLike, Sequence[dict]]


def read_trace(trace: Trace, skip_runs: int = 0) -> Profile:
    """The Profile of an ORT trace (a file or its parsed events), leaving out the events of
    the first `skip_runs` runs and of the session's setup before the first run."""
    events = trace if isinstance(trace, Sequence) and not isinstance(trace, str) else _load(Path(trace))
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(starts) <= skip_runs:
        raise StitchError(f"ORT's profile has {len(starts)} runs (model_run events), "
                          f"not more than the {skip_runs} warm-up runs to leave out")

    def counted(e: dict) -> bool:  # the last run that began at or before it is a counted one
        return bisect.bisect_right(starts, e.get("ts", 0)) - 1 >= skip_runs

    nodes: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    kernels: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        cat, name = e.get("cat"), e.get("name", "")
        if cat == "Node" and name.endswith(NODE_SUFFIX) and counted(e):
            node = name[:-len(NODE_SUFFIX)]
            args = e.get("args", {})
            op = FUSED_FALLBACK if node.startswith(INLINED_FUSED_PREFIX) else args.get("op_name", "?")
            nodes[(node, op, args.get("provider", "?"))].append(float(e.get("dur", 0)))
        elif cat == "Kernel" and counted(e):
            kernels[(name, e.get("args", {}).get("op_name", "?"))].append(float(e.get("dur", 0)))
    runs = len(starts) - skip_runs
    return Profile(runs, skip_runs,
                   tuple(ProfileEntry(n, op, p, sum(d), len(d)) for (n, op, p), d in nodes.items()),
                   tuple(ProfileEntry(n, op, "CUDAExecutionProvider", sum(d), len(d)) for (n, op), d in kernels.items()))


def _load(path: Path) -> list[dict]:
    try:
        events = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StitchError(f"{path}: not a readable ONNX Runtime profile ({e})") from e
    # ORT writes a JSON array; Chrome-trace objects keep theirs under traceEvents.
    return events.get("traceEvents", []) if isinstance(events, dict) else events


class Runner(Protocol):
    """A session ready to run with its inputs bound (bench's _Bound)."""

    def run(self) -> None: ...

    def end_profiling(self) -> str: ...


def record(start: Callable[[Any], Runner], *, runs: int, warmup: int = 1) -> Profile:
    """Profile `warmup` + `runs` runs of a fresh session and read its trace, warm-up left out.
    `start(session_options)` makes the session with those options (profiling on), ready to run."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "prof")
        runner = start(so)
        for _ in range(warmup + runs):
            runner.run()
        return read_trace(runner.end_profiling(), skip_runs=warmup)
