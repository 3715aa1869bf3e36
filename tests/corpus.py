"""The real-model corpus (scripts/build_corpus.py) as tests use it: a model's manifest entry, or
a skip where this machine's corpus lacks it (CI builds only the CPU slice, without torch)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "build" / "corpus"


def corpus_entry(name: str) -> dict[str, Any]:
    """`name`'s manifest entry (its `file` relative to CORPUS), or skip the calling test."""
    manifest = CORPUS / "manifest.json"
    if not manifest.exists():
        pytest.skip("needs build/corpus (scripts/build_corpus.py)")
    entries = {m["name"]: m for m in json.loads(manifest.read_text())["models"]}
    if name not in entries:
        pytest.skip(f"{name} is not in build/corpus (scripts/build_corpus.py builds it with torch)")
    return entries[name]
