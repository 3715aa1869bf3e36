"""compile.py's handling of NVRTC: --arch values, and a transient NVRTC failure tried again."""
from __future__ import annotations

import pytest

from onnxstitch import compile as nvrtc_compile
from onnxstitch.errors import BadInputError, CompileError


@pytest.mark.parametrize("arch,number", [("sm_80", 80), ("sm_90", 90), ("sm_90a", 90), ("sm_100", 100)])
def test_arch_number(arch: str, number: int) -> None:
    assert nvrtc_compile.arch_number(arch) == number


@pytest.mark.parametrize("arch", ["90", "sm_", "compute_90", "sm_9x"])
def test_bad_arch_is_the_users_error(arch: str) -> None:
    with pytest.raises(BadInputError, match=f"--arch {arch}: expected a value like sm_90"):
        nvrtc_compile.arch_number(arch)


def _failing(outcomes: list[str]):
    calls: list[str] = []

    def attempt(src, target, want_ptx, program):
        calls.append(program)
        outcome = outcomes[len(calls) - 1]
        if outcome != "ok":
            raise CompileError(f"kernel k failed to compile for {target}: {outcome}")
        return b"image"
    return attempt, calls


def test_a_transient_nvrtc_failure_is_tried_again_under_another_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvrtc_compile, "_BACKOFF_S", 0.0)
    attempt, calls = _failing([nvrtc_compile._TRANSIENT, nvrtc_compile._TRANSIENT, "ok"])
    monkeypatch.setattr(nvrtc_compile, "_compile_try", attempt)
    src = type("Src", (), {"name": "k"})()
    assert nvrtc_compile._compile_one(src, "sm_90", False) == b"image"
    assert len(calls) == 3 and len(set(calls)) == 3


@pytest.mark.parametrize("outcomes,tries", [(["NVRTC_ERROR_COMPILATION (6)"], 1),
                                            ([nvrtc_compile._TRANSIENT] * nvrtc_compile._TRIES, nvrtc_compile._TRIES)])
def test_other_failures_and_the_last_transient_one_are_reported(monkeypatch: pytest.MonkeyPatch, outcomes, tries) -> None:
    monkeypatch.setattr(nvrtc_compile, "_BACKOFF_S", 0.0)
    attempt, calls = _failing(outcomes)
    monkeypatch.setattr(nvrtc_compile, "_compile_try", attempt)
    src = type("Src", (), {"name": "k"})()
    with pytest.raises(CompileError, match=outcomes[-1].split(" ")[0]):
        nvrtc_compile._compile_one(src, "sm_90", False)
    assert len(calls) == tries


def _source(name: str, code: str):
    from onnxstitch.schemes.source import KernelSource, Spec

    return KernelSource(name, code, 1, ("x",), ("y",), (0,), (1,), Spec())


def test_what_was_compiled_ahead_is_not_compiled_again(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """compile_all takes the images of the kernels an Ahead started (waiting for them) and
    compiles the rest once each; an Ahead for other targets is not used."""
    monkeypatch.setenv("ONNXSTITCH_CACHE", str(tmp_path))
    calls: list[tuple[str, str]] = []

    def compile_one(src, target, want_ptx):
        calls.append((src.source, target))
        return f"{src.source}@{target}".encode()

    monkeypatch.setattr(nvrtc_compile, "_compile_one", compile_one)
    monkeypatch.setattr(nvrtc_compile, "_cores", lambda: nvrtc_compile.AHEAD_MIN_CORES)
    monkeypatch.setattr(nvrtc_compile, "_nvrtc", lambda: type("N", (), {"getVersion": staticmethod(lambda: (13, 0))}))
    early, late = _source("a", "__global__ void a() {}"), _source("b", "__global__ void b() { int x; }")
    ahead = nvrtc_compile.Ahead(("sm_80", "sm_90"))
    ahead.submit([early])
    got = nvrtc_compile.compile_all([late, early], ("sm_90", "sm_80"), ahead)
    ahead.close()
    assert sorted(calls) == sorted((s.source, t) for s in (early, late) for t in ("sm_80", "sm_90", "compute_80"))
    assert got[1].images == (b"__global__ void a() {}@sm_80", b"__global__ void a() {}@sm_90")
    assert got[0].ptx == b"__global__ void b() { int x; }@compute_80"
    calls.clear()
    other = nvrtc_compile.Ahead(("sm_90",))
    nvrtc_compile.compile_all([_source("c", "__global__ void c() {}")], ("sm_80", "sm_90"), other)
    other.close()
    assert len(calls) == 3


def test_nothing_is_compiled_ahead_on_a_small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvrtc_compile, "_cores", lambda: 2)
    ahead = nvrtc_compile.Ahead(("sm_90",))
    ahead.submit([_source("a", "__global__ void a() {}")])
    ahead.close()
    assert ahead.take("__global__ void a() {}", "sm_90") is None
