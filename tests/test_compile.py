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
