#!/usr/bin/env python3
"""The generated kernel sources of a set of models, for comparing two versions of the code
byte for byte (a restructuring must leave them as they were, or explain the difference).

    python3 scripts/dump_kernels.py --corpus build/corpus --out /tmp/kernels-before [MODEL.onnx ...]
    python3 scripts/dump_kernels.py --compare /tmp/kernels-before /tmp/kernels-after

Each model is optimized without verification (codegen is all that matters here); every source
handed to the compiler is written to OUT/<model>/<kernel>.cu and indexed in OUT/index.json, with
the digest of the written model (key "<written model>"), so a restructuring of the rewrite is
compared too. `--epilogues` plans GEMM and convolution epilogues (their layouts included).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _compile_module():
    """The module whose compile_all the pipeline calls, wherever the package keeps it."""
    import importlib

    for name in ("onnxstitch.backend.compile", "onnxstitch.compile"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("no onnxstitch compile module")


WRITTEN = "<written model>"


def dump(models: list[tuple[str, Path, dict]], out: Path, options: dict | None = None) -> dict:
    import onnxstitch

    module = _compile_module()
    real = module.compile_all
    seen: list = []

    def recording(sources, *args, **kwargs):
        sources = list(sources)
        seen.extend(sources)
        return real(sources, *args, **kwargs)

    module.compile_all = recording
    index: dict = {}
    try:
        for name, path, shapes in models:
            seen.clear()
            try:
                res = onnxstitch.optimize(path, shapes=shapes, verify=False, **(options or {}))
            except Exception as e:  # noqa: BLE001  (recorded: the comparison shows it)
                index[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                continue
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            index[name] = {}
            for src in seen:
                (folder / f"{src.name}.cu").write_text(src.source)
                index[name][src.name] = hashlib.sha256(src.source.encode()).hexdigest()
            index[name][WRITTEN] = hashlib.sha256(res.model.SerializeToString(deterministic=True)).hexdigest()
            print(f"{name}: {len(index[name]) - 1} kernels", flush=True)
    finally:
        module.compile_all = real
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    return index


def compare(a: Path, b: Path) -> int:
    left, right = (json.loads((p / "index.json").read_text()) for p in (a, b))
    same = differ = 0
    for model in sorted(set(left) | set(right)):
        x, y = left.get(model), right.get(model)
        if x == y:
            same += 1
            continue
        differ += 1
        print(f"{model}: differs")
        if x is None or y is None:
            print(f"  only in {'after' if x is None else 'before'}")
            continue
        for k in sorted(set(x) ^ set(y)):
            print(f"  {'before' if k in x else 'after '} only: {k}")
        for k in sorted(k for k in set(x) & set(y) if x[k] != y[k]):
            print(f"  {k}: different")
    kernels = sum(len([k for k in v if k != WRITTEN]) for v in left.values() if "error" not in v)
    print(f"{same} models identical, {differ} differ ({kernels} kernels before)")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, help="more .onnx files (planned at their default sizes)")
    ap.add_argument("--corpus", type=Path, help="a corpus folder with manifest.json (scripts/build_corpus.py)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--epilogues", action="store_true", help="plan GEMM and convolution epilogues")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("--out is required")
    models: list[tuple[str, Path, dict]] = []
    if args.corpus:
        manifest = json.loads((args.corpus / "manifest.json").read_text())
        models += [(e["name"], args.corpus / e["file"], e["shapes"]) for e in manifest["models"]]
    models += [(p.stem, p, {}) for p in args.models]
    args.out.mkdir(parents=True, exist_ok=True)
    dump(models, args.out, {"epilogues": True} if args.epilogues else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
