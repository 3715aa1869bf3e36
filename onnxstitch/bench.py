"""`onnxstitch bench`: stock ONNX Runtime against the stitched model (and optional peers), side
by side in one process, on the same seeded inputs, through IO binding on the GPU.

Every configuration runs the same feeds, timed in interleaved rounds (all sessions loaded at
once); outputs are compared with the stock run's. Kernel
launches per run come from ORT's profiler (CUDA EP node executions, onnxstitch.profile); with
`profile`, each configuration's profile (top op types and GPU kernels) is kept in the result.
With `cuda_graph`, every configuration runs through ORT's CUDA graphs (captured on the first
run, replayed after). Without the CUDA EP in the providers it all runs on ORT's CPU EP, the
stitched model through its fallback functions: a check of the plumbing, not of the kernels.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from . import ortio, sizes as sizes_mod
from .errors import BadInputError, StitchError, first_line
from .inputs import random_feeds
from .profile import DEFAULT_TOP, Profile, record

# v2: several configurations, percentiles, throughput, device/driver, CUDA graphs.
# v3: `profiles` (with profile=True), CPU-only runs (stock labelled STOCK_CPU).
# v4: each configuration says whether it ran through CUDA graphs (`cuda_graph`, `note`).
SCHEMA_VERSION = 4
log = logging.getLogger(__name__)
STOCK = "ORT CUDA EP"
STOCK_CPU = "ORT CPU EP"
STITCHED = "onnxstitch"
CUDA = "CUDAExecutionProvider"
# ORT's CUDA EP replays a captured graph without its executor, so a replayed run records no nodes.
GRAPH_PROFILE_NOTE = "ORT's profiler records no nodes in CUDA graph replays: profiled without CUDA graphs"


@dataclass(frozen=True)
class BenchConfig:
    """How to run: warm-up and timed iterations, providers, CUDA graphs, seed."""

    warmup: int = 20
    iters: int = 100
    providers: tuple[str, ...] = ("CUDAExecutionProvider", "CPUExecutionProvider")
    cuda_graph: bool = False
    seed: int = 0
    profile_runs: int = 5
    profile: bool = False  # keep each configuration's profile in the result (BenchResult.profiles)
    # Custom-op libraries the model's own ops need, registered in every session (both models).
    custom_op_libraries: tuple[str, ...] = ()
    # cuDNN's convolution algorithm search in every CUDA session (None: ORT's default, an
    # exhaustive search at the first run; "HEURISTIC": seconds less per CNN session, both models
    # alike: optimize's gate, which compares them).
    conv_algo_search: str | None = None
    # Inputs that take one value (`--value`), as optimize's verification gives them.
    values: Mapping[str, float] = field(default_factory=dict)
    # Seconds of warm-up and of timed runs each configuration may take, where set: a model whose
    # run is long (a Loop of hundreds of steps) gets fewer runs, never under MIN_TIMED.
    time_budget_s: float | None = None
    # Build every session at once in threads before the first runs (optimize's gate, which times
    # runs, not session building; ORT builds mostly outside the GIL): each configuration's
    # startup figure then includes waiting for the others.
    build_together: bool = False

    @property
    def on_gpu(self) -> bool:
        return CUDA in self.providers


@dataclass(frozen=True)
class Timing:
    """Latency of one configuration over `iters` runs, in milliseconds."""

    median_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    mean_ms: float
    iters: int
    runs_per_s: float
    samples_per_s: float  # runs/s × batch (the first dim of the first input)
    launches_per_run: float  # node executions per run on the first provider, from ORT's profile
    fused_nodes_on_cuda: int  # FusedKernel nodes that ORT's profile shows on the CUDA EP
    max_abs_err: float = 0.0  # against the stock configuration's outputs
    max_rel_err: float = 0.0
    # Session creation and first run, in seconds: what a user waits before the first result
    # (library GEMM/conv plans are chosen there; a CUDA graph is captured there).
    startup_s: float = 0.0
    # Of which the first run alone, after the session was made (a user's first inference): what
    # library plans loaded or chosen at the first run cost.
    first_run_s: float = 0.0
    # Whether the runs went through a CUDA graph: with BenchConfig.cuda_graph, a model ORT
    # cannot capture (TorchScript exports' shape arithmetic on the CPU, control flow) is timed
    # plain instead, and `note` says why.
    cuda_graph: bool = False
    note: str = ""


@dataclass(frozen=True)
class BenchResult:
    """All configurations' timings; `speedup` is stock median over stitched median."""

    model: str
    device: str
    driver: str
    ort_version: str
    onnxstitch_version: str
    providers: tuple[str, ...]
    cuda_graph: bool
    inputs: Mapping[str, list[int]]
    configs: Mapping[str, Timing] = field(default_factory=dict)
    # Installed versions of the packages the figures depend on (package_versions()).
    versions: Mapping[str, str] = field(default_factory=dict)
    # Each configuration's ORT profile (BenchConfig.profile), without CUDA graphs.
    profiles: Mapping[str, Profile] = field(default_factory=dict)

    @property
    def stock(self) -> Timing:
        return self.configs[STOCK if STOCK in self.configs else STOCK_CPU]

    @property
    def stitched(self) -> Timing:
        return self.configs[STITCHED]

    @property
    def speedup(self) -> float:
        return self.stock.median_ms / self.stitched.median_ms

    @property
    def max_abs_err(self) -> float:
        return self.stitched.max_abs_err

    @property
    def max_rel_err(self) -> float:
        return self.stitched.max_rel_err

    def to_json(self, top: int = DEFAULT_TOP) -> dict[str, Any]:
        """The result in the versioned JSON schema (`schema`); profiles as their top `top`."""
        out = asdict(self)
        out["configs"] = {k: asdict(v) for k, v in self.configs.items()}
        out.pop("profiles")
        if self.profiles:
            out["profiles"] = {k: p.summary(top) for k, p in self.profiles.items()}
            if self.cuda_graph:
                out["profile_note"] = GRAPH_PROFILE_NOTE
        return {"schema": SCHEMA_VERSION, **out, "speedup": self.speedup}


def gpu_name() -> str:
    """The GPU's name as the CUDA runtime reports it, or 'unknown'."""
    try:
        # (cupy's runtime module alone: the cupy package's import costs 0.6 s of the GIL, which
        # optimize's timer thread would take from planning)
        from cupy_backends.cuda.api import runtime

        name = runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown"


def read_us(nbytes: int, device: str) -> float:
    """Microseconds to read `nbytes` at the measured copy bandwidth of `device` (a GPU name, as
    gpu_name gives it; cost.py's anchors: H200, else H100) — what an epilogue's extra operand
    (a residual, a bias) costs a memory-bound kernel at best, for the kernel benchmarks."""
    from .cost import H100_BANDWIDTH_GBS, H200_BANDWIDTH_GBS

    gbs = H200_BANDWIDTH_GBS if "H200" in device else H100_BANDWIDTH_GBS
    return nbytes / (gbs * 1e3)


def driver_version() -> str:
    """The NVIDIA driver's version from nvidia-smi, or 'unknown'."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except Exception:
        return "unknown"


def require_gpu(what: str) -> None:
    """Raise a one-line StitchError unless onnxruntime's CUDA EP is usable here."""
    import onnxruntime as ort

    from .errors import StitchError

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise StitchError(f"{what} needs an NVIDIA GPU and onnxruntime-gpu (this onnxruntime "
                          f"{ort.__version__} offers {', '.join(ort.get_available_providers())})")


class _Bound:
    """A session with its inputs on its device (the GPU where it has the CUDA EP) and outputs
    bound, ready for run_with_iobinding."""

    def __init__(self, sess, feeds: Mapping[str, np.ndarray],
                 outputs_like: Mapping[str, Any] | Sequence[Any] | None) -> None:
        self.sess = sess
        self.io = sess.io_binding()
        self.keep = []
        self.device = device = "cuda" if CUDA in sess.get_providers() else "cpu"
        # Outputs ORT allocates whose computed shape is not the one the model declares (ddddocr's
        # old recognizer declares [1, seqlen] and gives [w/8, 1, 8210]): ORT keeps the first run's
        # buffer bound and then refuses it as a wrong preallocated output, so they are bound anew
        # before every run. Stock ORT's plain run accepts such a model with a warning.
        self.rebind: list[str] = []
        self.allocated = outputs_like is None  # ORT allocates the outputs: checked after the first run
        self.first_run_s = 0.0  # (set by _loaded)
        for name, arr in feeds.items():
            ov = ortio.to_ortvalue(arr, device, 0)
            self.keep.append(ov)
            self.io.bind_ortvalue_input(name, ov)
        for i, out in enumerate(sess.get_outputs()):
            if outputs_like is None:
                self.io.bind_output(out.name, device, 0)
            else:  # CUDA graphs replay fixed addresses: outputs must be preallocated (by name or order)
                like = outputs_like[out.name] if isinstance(outputs_like, Mapping) else outputs_like[i]
                ov = ortio.empty(like.shape, like.dtype, device, 0)
                self.keep.append(ov)
                self.io.bind_ortvalue_output(out.name, ov)

    def run(self) -> None:
        for name in self.rebind:
            self.io.bind_output(name, self.device, 0)
        self.sess.run_with_iobinding(self.io)
        if self.allocated:
            self.allocated = False
            for out, got in zip(self.sess.get_outputs(), self.io.get_outputs()):
                if not _fits(out.shape, got.shape()):
                    self.rebind.append(out.name)

    def end_profiling(self) -> str:
        return self.sess.end_profiling()

    def outputs(self) -> list[np.ndarray]:
        return [ortio.to_numpy(o) for o in self.io.get_outputs()]


def _fits(declared, shape: Sequence[int]) -> bool:
    """Whether a computed shape is what the model declares (an unknown or symbolic dim fits
    anything; an undeclared shape fits every shape)."""
    if declared is None:
        return True
    return len(declared) == len(shape) and all(not isinstance(d, int) or d == n for d, n in zip(declared, shape))


def _provider_list(config: BenchConfig) -> list:
    cuda = {"enable_cuda_graph": "1"} if config.cuda_graph else {}
    if config.conv_algo_search:
        cuda["cudnn_conv_algo_search"] = config.conv_algo_search
    return [(p, dict(cuda)) if p == CUDA and cuda else p for p in config.providers]


def capture_refusal(stitched_path: str | os.PathLike, config: BenchConfig = BenchConfig()) -> str:
    """What ONNX Runtime says when it refuses to capture the stitched model at `stitched_path`
    in a CUDA graph, its session made as `run` makes it (the onnxstitch library registered,
    `config`'s providers, CUDA graphs on): ORT refuses as the session is made (a node it places
    on the CPU). "" where the session is made, or fails for another reason (a run says what)."""
    import onnxruntime as ort

    from .runtime import session as stitch_session

    so = ortio.with_custom_ops(ort.SessionOptions(), config.custom_op_libraries)
    so.log_severity_level = 4  # (ORT logs its refusal as an error line too: the caller reports it)
    try:
        stitch_session(str(stitched_path), sess_options=so,
                       providers=_provider_list(dataclasses.replace(config, cuda_graph=True)))
    except Exception as e:  # noqa: BLE001 - ORT's refusal is a RuntimeException with its words
        text = first_line(e)
        return text if "graph capture" in text.lower() else ""
    return ""


# Timed runs are taken in this many rounds, each configuration in turn, so that a drift of the
# host (another process, clocks, a plain run's host-bound launches) falls on all of them alike.
ROUNDS = 10


# Timed runs per configuration that a time budget leaves at the least.
MIN_TIMED = 10


def _warm(bound: _Bound, config: BenchConfig) -> float:
    """Warm-up runs (fewer where the budget runs out); seconds the last one took."""
    start = last = time.perf_counter()
    took = 0.0
    for i in range(config.warmup):
        bound.run()
        now = time.perf_counter()
        took, last = now - last, now
        if config.time_budget_s and i >= 1 and now - start > config.time_budget_s:
            break
    return took


def _time(bounds: Mapping[str, _Bound], config: BenchConfig) -> dict[str, list[float]]:
    """Milliseconds per run of every configuration, interleaved round by round; as many runs
    as config.iters, or as fit config.time_budget_s (MIN_TIMED at the least)."""
    slowest = max((_warm(bound, config) for bound in bounds.values()), default=0.0)
    iters = config.iters
    if config.time_budget_s and slowest > 0:
        iters = max(min(MIN_TIMED, iters), min(iters, int(config.time_budget_s / slowest)))
    times: dict[str, list[float]] = {label: [] for label in bounds}
    rounds = max(1, min(ROUNDS, iters))
    for r in range(rounds):
        share = iters // rounds + (1 if r < iters % rounds else 0)
        for label, bound in bounds.items():
            for _ in range(share):
                t0 = time.perf_counter()
                bound.run()  # Run synchronizes the CUDA EP's stream before returning
                times[label].append((time.perf_counter() - t0) * 1e3)
    return times


def _profile(make_session: Callable, feeds, outputs_like, runs: int) -> Profile:
    """ORT's profile of `runs` runs of a fresh session without CUDA graphs (a replayed run
    records no nodes), after one warm-up run (first allocations) that is left out."""
    return record(lambda so: _Bound(make_session(so, graphs=False), feeds, outputs_like), runs=runs, warmup=1)


def _errors(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> tuple[float, float]:
    abs_err, rel_err = 0.0, 0.0
    for a, b in zip(got, ref):
        a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a64.size:
            diff = np.abs(a64 - b64)
            diff[np.isnan(a64) & np.isnan(b64)] = 0.0
            abs_err = max(abs_err, float(np.max(diff)))
            rel_err = max(rel_err, float(np.max(diff / np.maximum(np.abs(b64), 1e-6))))
    return abs_err, rel_err


def _stats(times: list[float], prof: Profile, provider: str, batch: int, errs: tuple[float, float],
           startup_s: float = 0.0) -> Timing:
    q = np.percentile(times, [50, 90, 99])
    med = float(statistics.median(times))
    return Timing(med, float(q[1]), float(q[2]), min(times), float(np.mean(times)), len(times),
                  1e3 / med, 1e3 / med * batch, prof.nodes_per_run(provider),
                  len(prof.node_names("FusedKernel", CUDA)), errs[0], errs[1], startup_s)


@dataclass(frozen=True)
class OutputLike:
    """An output's shape and dtype at the benchmark's sizes, where the caller knows them."""

    shape: tuple[int, ...]
    dtype: np.dtype


def run(model_path: str | os.PathLike, stitched_path: str | os.PathLike, *, config: BenchConfig = BenchConfig(),
        shapes: sizes_mod.Given | None = None, peers: Mapping[str, str | os.PathLike] | None = None,
        progress: Callable[[str], None] | None = None,
        outputs: Mapping[str, OutputLike] | None = None,
        stitched_peers: Mapping[str, str | os.PathLike] | None = None) -> BenchResult:
    """Benchmark the stock model (ORT, default graph optimizations) against the stitched model
    (the onnxstitch library registered) and any `peers` (label → model path, run stock), at
    the input sizes `shapes` gives (read as optimize reads them: sizes.py). Without the CUDA
    EP in `config.providers` everything runs on ORT's CPU EP, the stitched model through its
    fallback functions. `outputs`: every output's shape at these sizes, where the caller knows
    them (optimize's gate, after verification): no plain stock session is made for reference
    outputs, and the rows carry no error figures (0). `stitched_peers`: other stitched models
    (label → path), run as the stitched one is (optimize's gate choosing between plans)."""
    import onnxruntime as ort

    from .version import __version__
    from .runtime import session as stitch_session

    say = progress or (lambda _m: None)
    if config.on_gpu:
        require_gpu("bench")
    elif config.cuda_graph:
        raise BadInputError("CUDA graphs need the CUDA EP among the providers")
    model = onnx.load(str(model_path), load_external_data=False)
    sizes = sizes_mod.resolve(model, shapes)
    sizes_mod.check_values(model, config.values)
    feeds = random_feeds(model, config.seed, sizes.dims, sizes.inputs, config.values)
    first = next(iter(feeds.values()), np.zeros(1))
    batch = int(first.shape[0]) if first.ndim else 1

    def options(so):
        return ortio.with_custom_ops(so or ort.SessionOptions(), config.custom_op_libraries)

    def stock_maker(path: str | os.PathLike):
        def make(so=None, graphs: bool = config.cuda_graph):
            cfg = config if graphs else dataclasses.replace(config, cuda_graph=False)
            return ort.InferenceSession(str(path), sess_options=options(so), providers=_provider_list(cfg))
        return make

    def stitched_maker(path: str | os.PathLike):
        if not config.on_gpu:  # on the CPU the library is not registered (CUDA kernels only): the fallbacks run
            return stock_maker(path)

        def make(so=None, graphs: bool = config.cuda_graph):
            cfg = config if graphs else dataclasses.replace(config, cuda_graph=False)
            return stitch_session(str(path), sess_options=options(so), providers=_provider_list(cfg))
        return make

    stock = STOCK if config.on_gpu else STOCK_CPU
    makers = {stock: stock_maker(model_path), STITCHED: stitched_maker(stitched_path)}
    makers.update({label: stitched_maker(p) for label, p in (stitched_peers or {}).items()})
    makers.update({label: stock_maker(p) for label, p in (peers or {}).items()})
    paths = {stock: model_path, STITCHED: stitched_path, **(stitched_peers or {}), **(peers or {})}
    # Reference outputs (and output shapes for CUDA-graph binding) from a plain stock run, unless
    # the caller knows the shapes and no profile is taken (a session less: the gate's time and
    # memory).
    wants_reference = outputs is None or config.profile_runs > 0
    reference_maker = stock_maker(model_path) if wants_reference else None
    if config.build_together:
        makers, reference_maker = _built_together(makers, reference_maker)
    reference: list[np.ndarray] | None = None
    if reference_maker is not None:
        reference, like = _reference_outputs(reference_maker, feeds, model_path)
    else:
        like = dict(outputs or {})
    like = like if config.cuda_graph else None
    bounds: dict[str, _Bound] = {}
    startup: dict[str, float] = {}
    graphs: dict[str, bool] = {}
    notes: dict[str, str] = {}
    for label, make in makers.items():
        say(f"loading {label}")
        try:
            bounds[label], startup[label] = _loaded(make, feeds, like)
            graphs[label] = config.cuda_graph
        except Exception as failed:
            err = failed
            where = paths[label]
            if config.cuda_graph and reference is None:
                # The caller's output shapes may not be what this run gives: bind what a plain
                # stock run gives, and try once more before taking it for a model ORT cannot capture.
                reference, like = _reference_outputs(stock_maker(model_path), feeds, model_path)
                try:
                    bounds[label], startup[label] = _loaded(make, feeds, like)
                    graphs[label] = True
                    continue
                except Exception as again:
                    err = again
            if config.cuda_graph:
                # ORT cannot capture this model (shape arithmetic placed on the CPU, control
                # flow): it is timed plain, and its row says so; it fails only if it cannot run.
                try:
                    bounds[label], startup[label] = _loaded(lambda make=make: make(graphs=False), feeds, None)
                except Exception:
                    pass
                else:
                    graphs[label] = False
                    notes[label] = f"timed without CUDA graphs: ORT cannot capture this model ({first_line(err)})"
                    log.warning("%s: %s", label, notes[label])
                    continue
            if label == stock:
                raise _stock_fault(model_path, err) from err
            raise StitchError(f"{where}: the {label} model does not run: {first_line(err)}") from err
    say(f"timing {', '.join(bounds)}")
    began = time.perf_counter()
    times = _time(bounds, config)
    log.info("bench: sessions built and first run in %s s; timed in %.2f s",
             {k: round(v, 2) for k, v in startup.items()}, time.perf_counter() - began)
    configs: dict[str, Timing] = {}
    profiles: dict[str, Profile] = {}
    for label, make in makers.items():
        errs = _errors(bounds[label].outputs(), reference) if reference is not None else (0.0, 0.0)
        if config.profile_runs:
            say(f"profiling {label}")
            profiles[label] = _profile(make, feeds, like, config.profile_runs)
        else:  # no profile asked for (optimize's gate): launches per run are not counted
            profiles[label] = Profile(runs=1, skipped_runs=0, nodes=())
        configs[label] = dataclasses.replace(
            _stats(times[label], profiles[label], config.providers[0], batch, errs, startup[label]),
            cuda_graph=graphs[label], note=notes.get(label, ""), first_run_s=bounds[label].first_run_s)
    device, driver = (gpu_name(), driver_version()) if config.on_gpu else ("CPU", "n/a")
    return BenchResult(str(model_path), device, driver, ort.__version__, __version__,
                       tuple(config.providers), config.cuda_graph, {k: list(v.shape) for k, v in feeds.items()},
                       configs, package_versions(), profiles if config.profile else {})


def _built_together(makers: Mapping[str, Callable],
                    reference: Callable | None) -> tuple[dict[str, Callable], Callable | None]:
    """`makers` and the reference's maker (None: no reference), whose sessions are being built
    at once in threads: each maker's first plain call (the reference's first call with
    graphs=False) takes its session from the threads (raising what building raised), once all
    of them are built; any other call builds anew. (Not before: a session run while another is
    built may capture a CUDA graph, in ORT's global mode, and the other's external-data loader
    synchronizing a stream then fails both — seen in BERT's gate on an H200.)"""
    pool = ThreadPoolExecutor(len(makers) + 1, thread_name_prefix="onnxstitch-bench")
    built = {label: pool.submit(make) for label, make in makers.items()}
    if reference is not None:
        built[None] = pool.submit(reference, graphs=False)
    pool.shutdown(wait=False)
    building = list(built.values())

    def first(label: str | None, make: Callable, plain: dict[str, Any]) -> Callable:
        def maker(so=None, **kw):
            future = built.pop(label, None) if so is None and kw == plain else None
            if future is None:
                return make(so, **kw)
            wait(building)
            return future.result()
        return maker

    return ({label: first(label, make, {}) for label, make in makers.items()},
            first(None, reference, {"graphs": False}) if reference is not None else None)


def _reference_outputs(make: Callable, feeds: Mapping[str, np.ndarray],
                       model_path: str | os.PathLike) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """A plain stock run's outputs, in order and by name (the shapes CUDA-graph runs bind)."""
    try:
        bound = _Bound(make(graphs=False), feeds, None)
        bound.run()
    except Exception as e:
        raise _stock_fault(model_path, e) from e
    got = bound.outputs()
    return got, {o.name: r for o, r in zip(bound.sess.get_outputs(), got)}


def _loaded(make: Callable, feeds: Mapping[str, np.ndarray], like) -> tuple[_Bound, float]:
    """A configuration's session bound to the feeds after its first run (where a CUDA graph is
    captured and a model that cannot run fails), and the seconds that took (the first run's
    alone in the bound's `first_run_s`)."""
    t0 = time.perf_counter()
    bound = _Bound(make(), feeds, like)
    t1 = time.perf_counter()
    bound.run()
    bound.first_run_s = time.perf_counter() - t1
    return bound, time.perf_counter() - t0


def _stock_fault(model_path: str | os.PathLike, e: Exception) -> BadInputError:
    """Stock ORT cannot run the model as given (a declared output rank its graph does not
    produce): the model's own fault, not a stitching error."""
    return BadInputError(f"{model_path}: the model does not run on stock ONNX Runtime: {first_line(e)}")


# What a timing depends on besides the code: recorded with every result.
RECORDED_PACKAGES = ("onnxruntime-gpu", "onnxruntime", "onnx", "numpy", "cupy-cuda13x", "nvidia-cuda-nvrtc", "mip")


def package_versions() -> dict[str, str]:
    """Installed version of each package in RECORDED_PACKAGES (absent ones left out)."""
    from importlib import metadata

    out = {}
    for name in RECORDED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def ort_transformers_optimized(model_path: str | os.PathLike, model_type: str, out_path: str | os.PathLike,
                               num_heads: int = 0, hidden_size: int = 0) -> Path:
    """The model after ONNX Runtime's transformers optimizer (its hand-written fused kernels:
    Attention, SkipLayerNormalization, BiasGelu…), the peer automatic fusion is measured against."""
    from onnxruntime.transformers import optimizer

    opt = optimizer.optimize_model(str(model_path), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                                   use_gpu=True, only_onnxruntime=False)
    opt.save_model_to_file(str(out_path))
    return Path(out_path)
