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
