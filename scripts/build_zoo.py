#!/usr/bin/env python3
"""Build the model zoo: export every zoo model (models/zoo.py) at each dtype to ONNX, print
a table of files, sizes and export times, and write <out>/manifest.json describing each file
(inputs with their symbolic dims, a default concrete shape, the valid range of integer inputs).

    python scripts/build_zoo.py --out build/zoo                        # everything, full size
    python scripts/build_zoo.py --out build/zoo --models bert-base,gpt2 --dtypes float16
    python scripts/build_zoo.py --size small --dtypes float32 --out models/small   # test models

Needs torch, transformers and onnxscript (pip install ".[zoo]"). Downloads nothing. Building
a subset keeps the manifest entries of other models whose files are still there. Exits 1 if
any export failed (the others are still written).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import zoo  # noqa: E402

MANIFEST = "manifest.json"
SCHEMA = 1


def _versions() -> dict[str, str]:
    import onnx
    import torch
    import transformers

    try:
        import onnxscript

        script = onnxscript.__version__
    except Exception:  # recorded, not required for reading the manifest
        script = "?"
    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnxscript": script,
            "onnx": onnx.__version__}


def _load_manifest(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()).get("models", []))
    except (OSError, ValueError):
        return []


def main(argv: list[str] | None = None) -> int:
    """Build the requested zoo models; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/zoo", help="output folder (default build/zoo)")
    ap.add_argument("--models", default=",".join(zoo.MODELS), help=f"comma-separated, of: {', '.join(zoo.MODELS)}")
    ap.add_argument("--dtypes", default=",".join(zoo.DTYPES), help="comma-separated: float32,float16")
    ap.add_argument("--size", choices=("full", "small"), default="full",
                    help="full: published configs; small: tiny configs of the same architectures")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    dtypes = [d for d in args.dtypes.split(",") if d]
    bad = [n for n in names if n not in zoo.MODELS] + [d for d in dtypes if d not in zoo.DTYPES]
    if bad:
        ap.error(f"unknown model or dtype: {', '.join(bad)}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    failed: list[tuple[str, str, str]] = []
    print(f"{'model':<20} {'dtype':<8} {'size':>10} {'nodes':>6} {'export':>8}  file", flush=True)
    for name in names:
        for dtype in dtypes:
            try:
                info = zoo.export_info(name, dtype, out, args.size)
            except Exception as e:  # one model's failure must not stop the others
                why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                failed.append((name, dtype, f"{type(e).__name__}: {why}"))
                print(f"{name:<20} {dtype:<8} {'FAILED':>10}  {type(e).__name__}: {why}", flush=True)
                traceback.print_exc(file=sys.stderr)
                continue
            finally:
                gc.collect()  # full models hold GBs of weights; free them before the next
            done.append(info.manifest_entry(out))
            print(f"{name:<20} {dtype:<8} {info.bytes / 2**20:>8.1f}MB {info.nodes:>6} {info.seconds:>7.1f}s  "
                  f"{info.path}", flush=True)

    # Keep entries for other models whose files are still there (subset rebuilds).
    built = {(e["name"], e["dtype"]) for e in done}
    kept = [e for e in _load_manifest(out / MANIFEST)
            if (e["name"], e["dtype"]) not in built and (out / e["path"]).exists() and e.get("size") == args.size]
    order = {n: i for i, n in enumerate(zoo.MODELS)}
    dorder = {d: i for i, d in enumerate(zoo.DTYPES)}
    entries = sorted(kept + done, key=lambda e: (order.get(e["name"], len(order)), dorder.get(e["dtype"], 0)))
    manifest = {"schema": SCHEMA, "size": args.size, "opset": zoo.OPSET, "exporter": zoo.EXPORTER,
                "versions": _versions(), "models": entries}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {out / MANIFEST} ({len(entries)} models)")
    for name, dtype, why in failed:
        print(f"FAILED {name} {dtype}: {why}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
