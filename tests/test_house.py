"""The house's structure: no import cycle anywhere in the package, function-level imports
included (a cycle hidden inside functions once tied the attention matcher to its decoder
forms), and the direction of flow that pyproject's import-linter contracts state holds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (the planner's own finder)."""
    from onnxstitch.plan import _sccs

    mods = sorted(graph.modules)
    at = {m: k for k, m in enumerate(mods)}
    adj = [{at[w] for w in graph.find_modules_directly_imported_by(m)} for m in mods]
    return sorted(sorted(mods[k] for k in comp) for comp in _sccs(adj) if len(comp) > 1)


def test_no_import_cycle_in_the_package() -> None:
    graph = grimp.build_graph("onnxstitch", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b"]]


def test_the_import_contracts_hold() -> None:
    res = subprocess.run([sys.executable, "-m", "importlinter.cli", "--config", str(ROOT / "pyproject.toml")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_the_kernel_abi_struct_agrees_in_its_three_places() -> None:
    """StitchArgs is written in the runtime's header (stitch_abi.h), in the generated kernels'
    prelude (schemes/source.py) and as ctypes for the host kernels (tests/host_kernels.py): the
    same members in the same order, the same limits, and the ctypes offsets the header pins."""
    import re

    from onnxstitch.schemes import source

    from .host_kernels import _Args as StitchArgs

    header = (ROOT / "onnxstitch" / "runtime" / "csrc" / "stitch_abi.h").read_text()

    def members(text: str) -> list[str]:
        body = re.search(r"struct StitchArgs \{(.*?)\};", text, re.S).group(1)  # type: ignore[union-attr]
        return [ln.strip() for ln in body.strip().splitlines()]

    def limits(text: str) -> dict[str, int]:
        return {k: int(v) for k, v in re.findall(r"#define (STITCH_MAX_\w+) (\d+)", text)}

    assert members(source.ARGS_STRUCT) == members(header)
    assert limits(source.ARGS_STRUCT) == limits(header)
    pinned = {k: int(v) for k, v in re.findall(r"offsetof\(StitchArgs, (\w+)\) == (\d+)", header)}
    ctypes_names = {"in": "inp"}  # `in` is a Python keyword
    assert {k: getattr(StitchArgs, ctypes_names.get(k, k)).offset for k in pinned} == pinned
    import ctypes

    assert ctypes.sizeof(StitchArgs) == int(re.search(r"sizeof\(StitchArgs\) == (\d+)", header).group(1))  # type: ignore[union-attr]
    names = [m.split("[")[0].split()[-1].rstrip(";") for m in members(header)]
    assert [f[0] for f in StitchArgs._fields_] == [ctypes_names.get(n, n) for n in names]
