"""The compile stage: NVRTC compilation of generated kernels, on the CPU machine (no GPU needed).

Cubins for each target architecture plus one PTX for the driver to JIT elsewhere. Results are
cached on disk keyed by source, options and NVRTC version (Triton-style), so re-optimizing an
unchanged model compiles nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .schemes.source import KernelSource, code_of
from .errors import BadInputError, CompileError, first_line

log = logging.getLogger(__name__)

DEFAULT_ARCHS = ("sm_80", "sm_90")
_BASE_OPTIONS = ("-std=c++17",)  # no fast-math: NaN/Inf and rounding stay as ONNX Runtime's


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel's images: one cubin per arch (parallel tuples) and a PTX fallback."""

    source: KernelSource
    archs: tuple[str, ...]
    images: tuple[bytes, ...]
    ptx: bytes
    ptx_arch: str


def cache_dir() -> Path:
    """Where onnxstitch keeps compiled kernels and the runtime library."""
    return Path(os.environ.get("ONNXSTITCH_CACHE", Path.home() / ".cache" / "onnxstitch"))


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:  # pragma: no cover - depends on the install
        raise CompileError("NVRTC is unavailable: install cupy-cuda13x and nvidia-cuda-nvrtc") from e
    return nvrtc


# NVRTC now and then fails a valid program with BUILTIN_OPERATION_FAILURE while other processes
# compile at the same time (seen on a loaded 2-core machine: the same call passes when repeated);
# such a failure is tried again, under a name of its own, before it is reported.
_TRANSIENT = "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE"
_TRIES = 5
_BACKOFF_S = 0.1  # doubled after each failed try (seen here: three immediate tries all failing)


def _compile_one(src: KernelSource, target: str, want_ptx: bool) -> bytes:
    for attempt in range(_TRIES):
        try:
            return _compile_try(src, target, want_ptx, f"{src.name}_{os.getpid()}_{attempt}.cu")
        except CompileError as e:
            if _TRANSIENT not in str(e) or attempt == _TRIES - 1:
                raise
            log.info("NVRTC failed %s for %s (%s); trying again", src.name, target, e.log.strip()[:200])
            time.sleep(_BACKOFF_S * 2 ** attempt)
    raise AssertionError("unreachable")


def _compile_try(src: KernelSource, target: str, want_ptx: bool, program: str) -> bytes:
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(src.source, program, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={target}", *_BASE_OPTIONS])
        except Exception as e:
            log = nvrtc.getProgramLog(prog)
            path = cache_dir() / "failed" / f"{src.name}.cu"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(src.source)
            raise CompileError(
                f"kernel {src.name} failed to compile for {target}: {first_line(e)}; "
                f"reproduce with: nvcc -std=c++17 --cubin -arch={target.replace('compute', 'sm')} {path}",
                log=log, source=src.source) from e
        return nvrtc.getPTX(prog) if want_ptx else nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _cached(src: KernelSource, target: str, want_ptx: bool) -> bytes:
    version = ".".join(map(str, _nvrtc().getVersion()))
    key = hashlib.sha256("\0".join([src.source, target, *_BASE_OPTIONS, version]).encode()).hexdigest()[:32]
    path = cache_dir() / "kernels" / f"{key}.{'ptx' if want_ptx else 'cubin'}"
    if path.exists():
        return path.read_bytes()
    began = time.perf_counter()
    data = _compile_one(src, target, want_ptx)
    log.debug("compiled %s for %s in %.2f s", src.name, target, time.perf_counter() - began)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)
    return data


def arch_number(arch: str) -> int:
    """"sm_90" (or "sm_90a") → 90, as the runtime compares it with the device's major*10+minor;
    a value of another form is the user's error."""
    digits = arch[3:].rstrip("a") if arch.startswith("sm_") else ""
    if not digits.isdigit():
        raise BadInputError(f"--arch {arch}: expected a value like sm_90")
    return int(digits)


def _targets(archs: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """`archs` sorted and checked, and the PTX target (the lowest arch's virtual one)."""
    archs = tuple(sorted(set(archs), key=arch_number))
    return archs, f"compute_{arch_number(archs[0])}"


def compile_kernel(src: KernelSource, archs: Sequence[str] = DEFAULT_ARCHS) -> CompiledKernel:
    """Compile one kernel to cubins for `archs` (e.g. "sm_90") and PTX for the lowest."""
    archs, ptx_arch = _targets(archs)
    images = tuple(_cached(src, a, False) for a in archs)
    return CompiledKernel(src, archs, images, _cached(src, ptx_arch, True), ptx_arch)


def _unique(sources: Iterable[KernelSource]) -> list[KernelSource]:
    """One source per distinct code (the first of each), sources without code left out."""
    return list({code_of(s.source): s for s in reversed(list(sources)) if s.source}.values())


def _tasks(sources: Iterable[KernelSource], archs: tuple[str, ...], ptx_arch: str) -> list[tuple[KernelSource, str, bool]]:
    """(source, target, PTX or not) for each distinct code of `sources` and each target."""
    unique = [s for s in _unique(sources) if not s.spec.builds_own_image]
    return [(s, a, False) for s in unique for a in archs] + [(s, ptx_arch, True) for s in unique]


# Cores a machine needs for Ahead to compile anything (the stages beside it keep one busy).
AHEAD_MIN_CORES = 8


def _cores() -> int:
    """The cores this process may run on (its affinity where the OS says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Ahead:
    """Kernels compiled ahead of the compile stage, in threads of their own: candidates whose
    code is known before the plan chooses among them (an attention kernel, 1.3-1.5 s of NVRTC on
    an H200 host, the compile stage's longest, then overlaps the epilogue matchers and the
    plan). `compile_all` takes what is done, or waits for what is under way; a candidate the plan
    does not take was compiled for nothing, and its failure is never raised. `close` lets the
    optimize that made it go on without waiting."""

    def __init__(self, archs: Sequence[str] = DEFAULT_ARCHS) -> None:
        self.archs, self.ptx_arch = _targets(archs)
        # Nothing on a machine of fewer than AHEAD_MIN_CORES cores, where the compiles would only
        # slow the stages beside them (2 cores: BERT-base's epilogues and plan 0.40 -> 1.16 s,
        # the compile stage no shorter); callers need not make sources for it then.
        self.enabled = _cores() >= AHEAD_MIN_CORES
        self._pool = ThreadPoolExecutor(max_workers=_cores(), thread_name_prefix="onnxstitch-nvrtc")
        self._futures: dict[tuple[str, str], Future] = {}

    def submit(self, sources: Iterable[KernelSource]) -> None:
        """Start compiling `sources` (those with code) for every target, longest first (nothing
        where not `enabled`)."""
        if not self.enabled:
            return
        tasks = sorted(_tasks(sources, self.archs, self.ptx_arch), key=lambda job: -len(job[0].source))
        for job in tasks:
            key = (code_of(job[0].source), job[1])
            if key not in self._futures:
                self._futures[key] = self._pool.submit(_cached, *job)

    def take(self, code: str, target: str) -> Future | None:
        """The compile of `code` for `target` started here, if one was."""
        return self._futures.get((code, target))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def compile_all(sources: Iterable[KernelSource], archs: Sequence[str] = DEFAULT_ARCHS,
                ahead: Ahead | None = None) -> list[CompiledKernel]:
    """Compile several kernels concurrently (NVRTC runs outside the GIL), every (kernel, target)
    pair a task of its own so that a few kernels still fill the cores; sources whose code is
    the same (comments aside, codegen.named_by_code) are compiled once and share the images.
    A source without code (a library call: the gemm scheme) gets no image. What `ahead`
    compiles already is taken from it (waited for where it is under way)."""
    sources = list(sources)
    if not sources:
        return []
    archs, ptx_arch = _targets(archs)
    # Kernels their scheme builds itself (nvcc: a minute each) start first, beside NVRTC's.
    own = {code_of(s.source): s for s in _unique(s for s in sources if s.spec.builds_own_image)}
    own_pool = ThreadPoolExecutor(max_workers=max(1, min(len(own), _cores())), thread_name_prefix="onnxstitch-own")
    own_built = {code: own_pool.submit(s.spec.build_image, s.source, s.name, cache_dir()) for code, s in own.items()}
    own_pool.shutdown(wait=False)
    sources_all, sources = sources, [s for s in sources if not s.spec.builds_own_image]
    unique = _unique(sources)
    usable = ahead is not None and (ahead.archs, ahead.ptx_arch) == (archs, ptx_arch)
    started, tasks = {}, []
    for job in _tasks(unique, archs, ptx_arch):
        key = (code_of(job[0].source), job[1])
        future = ahead.take(*key) if usable else None
        if future is not None:
            started[key] = future
        else:
            tasks.append(job)
    # Longest sources first: the stage lasts as long as its last compile, and a long one (an
    # attention kernel, 1.3-1.5 s on an H200 host against ~0.2 s for most) submitted last
    # would start when the cores are already free of the rest.
    tasks.sort(key=lambda job: -len(job[0].source))
    images: dict = {}
    if tasks:
        with ThreadPoolExecutor(max_workers=min(len(tasks), os.cpu_count() or 1)) as pool:
            images = dict(zip(((code_of(s.source), t) for s, t, _ in tasks), pool.map(lambda job: _cached(*job), tasks)))
    images |= {key: f.result() for key, f in started.items()}
    if started:
        log.info("compile: %d of %d compiles taken from those started ahead", len(started), len(started) + len(tasks))
    done = {code: CompiledKernel(s, archs, tuple(images[code, a] for a in archs), images[code, ptx_arch], ptx_arch)
            for code, s in ((code_of(s.source), s) for s in unique)}
    for code, future in own_built.items():
        target, image = future.result()
        done[code] = CompiledKernel(own[code], (target,), (image,), b"", "")
    return [dataclasses.replace(done[code_of(s.source)], source=s) if s.source else CompiledKernel(s, (), (), b"", "")
            for s in sources_all]
