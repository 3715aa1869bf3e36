#!/usr/bin/env python3
"""The fused groups of an optimize report (`onnxstitch optimize --report R.json`), one line each:
scheme, the ops it covers, the plan's predicted time against stock's, the measured times where the
GPU timed them, and what the gate or the measured replan did with it.

    python3 scripts/report_groups.py R.json [--all]   (--all: every group, else one per distinct
                                                      op sequence, with how many share it)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path


def _ops(group: dict) -> str:
    """The group's op types in order ('Add+Add+LayerNormalization')."""
    return "+".join(re.sub(r".*\((\w+)\)$", r"\1", label) for label in group.get("labels", []))


def _fig(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--all", action="store_true", help="every group, not one per op sequence")
    args = ap.parse_args()
    rep = json.loads(args.report.read_text())
    groups = rep["plan"]["groups"]
    rows: OrderedDict[str, list] = OrderedDict()
    for g in groups:
        m = g.get("measured") or {}
        key = g["name"] if args.all else f"{g.get('scheme')}:{_ops(g)}"
        rows.setdefault(key, []).append((g, m))
    print(f"{len(groups)} groups; kernels {rep['plan'].get('kernels_before')} -> {rep['plan'].get('kernels_after')}; "
          f"predicted {rep['plan'].get('predicted_us_before', 0):.1f} -> {rep['plan'].get('predicted_us_after', 0):.1f} us")
    print(f"{'n':>3} {'scheme':10} {'pred':>7} {'pstock':>7} {'ours':>7} {'stock':>7}  ops / fate")
    for items in rows.values():
        g, m = items[0]
        fate = g.get("given_back") or g.get("dropped_by_verification") or ""
        print(f"{len(items):3d} {str(g.get('scheme')):10} {_fig(g.get('predicted_us')):>7} "
              f"{_fig(m.get('predicted_stock_us')):>7} {_fig(m.get('ours_us')):>7} {_fig(m.get('stock_us')):>7}  "
              f"{_ops(g)[:90]}{'  [' + fate[:80] + ']' if fate else ''}")
    meas = rep.get("measured") or {}
    print("summary:", json.dumps(meas.get("summary")))
    for line in (meas.get("planned_again") or [])[:20]:
        print("  replan:", line[:200])
    for d in (meas.get("given_back") or [])[:20]:
        print("  given back:", json.dumps(d)[:200])
    if meas.get("model"):
        print("model:", json.dumps(meas["model"])[:400])
    return 0


if __name__ == "__main__":
    sys.exit(main())
