#!/usr/bin/env python3
"""Optimize every ONNX backend node-test model (expanded cases included) that ONNX Runtime's
CPU provider runs, and check the stitched model against the case's expected outputs.

    python scripts/node_tests.py                      # every case, table of failures
    python scripts/node_tests.py --match rotary --json out.json

A case counts as a crash when optimize raises anything but a BadInputError naming the model
(a fault of the case itself), and as wrong when the stitched model's outputs differ from the
expected ones (ONNX's reference) where the original's did not. Exits 1 on any crash or wrong
output. Runs on the CPU: the stitched model goes through its fallback functions there.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import sessions  # noqa: E402
from onnxstitch.errors import BadInputError, first_line  # noqa: E402


def cases(match: str) -> list:
    """ONNX's node test cases (as onnx.backend.test.case builds them: models and data sets,
    expanded function forms included) whose name contains `match`."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cases' own numpy overflows while making data
        return [c for c in collect_testcases() if match in c.name and c.model is not None and c.data_sets]


def _array(v) -> np.ndarray | None:
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    return v if isinstance(v, np.ndarray) else None


def _data(case) -> tuple[dict, list] | None:
    """(feeds, expected outputs) of the case's first data set; None when an input or output
    is not a plain tensor (sequences, optionals)."""
    ins, outs = case.data_sets[0]
    ins, outs = [_array(v) for v in ins], [_array(v) for v in outs]
    names = [i.name for i in case.model.graph.input]
    if any(v is None for v in ins + outs) or len(ins) != len(names):
        return None
    return dict(zip(names, ins)), outs


def _matches(got: list, want: list) -> tuple[bool, str]:
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return False, f"output {k}: shape {g.shape} != {w.shape}"
        if w.dtype.kind in "fc":
            if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3, atol=1e-4, equal_nan=True):
                return False, f"output {k}: values differ"
        elif not np.array_equal(g, w):
            return False, f"output {k}: values differ"
    return True, ""


def run_case(case) -> dict:
    """Optimize one case and compare; returns {'case', 'status', ...}."""
    import onnxruntime as ort

    row: dict = {"case": case.name}
    model = case.model
    data = _data(case)
    if data is None:
        return row | {"status": "skipped", "why": "inputs or outputs are not plain tensors"}
    feeds, want = data
    try:
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:
        return row | {"status": "skipped", "why": f"ORT CPU does not run it: {first_line(e)}"}
    if not _matches(got, want)[0]:
        return row | {"status": "skipped", "why": "ORT CPU itself differs from the expected outputs"}
    t0 = time.perf_counter()
    try:
        res = onnxstitch.optimize(model, shapes={k: list(v.shape) for k, v in feeds.items()})
    except BadInputError as e:
        return row | {"status": "refused", "why": first_line(e)}
    except Exception as e:
        return row | {"status": "crash", "why": f"{type(e).__name__}: {first_line(e)}",
                      "traceback": traceback.format_exc(limit=6)}
    row["optimize_s"] = round(time.perf_counter() - t0, 3)
    row["groups"] = len(res.report.plan.groups) - len(res.report.dropped)
    try:
        got = sessions.runtime_session(res.model.SerializeToString(), gpu=False, stitched=True).run(None, feeds)
    except Exception as e:
        return row | {"status": "crash", "why": f"stitched model does not run: {first_line(e)}"}
    ok, why = _matches(got, want)
    return row | ({"status": "ok"} if ok else {"status": "wrong", "why": why})


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print the failures and a summary line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--match", default="", help="only cases whose name contains this")
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the cases' unused initializers are warned about by the thousand
    rows = []
    t0 = time.perf_counter()
    for case in cases(args.match):
        rows.append(run_case(case))
        r = rows[-1]
        if r["status"] in ("crash", "wrong"):
            print(f"{r['status']:6} {r['case']}: {r['why']}", flush=True)
    count = {s: sum(r["status"] == s for r in rows) for s in ("ok", "refused", "skipped", "crash", "wrong")}
    fused = sum(1 for r in rows if r.get("groups"))
    print(f"{len(rows)} cases in {time.perf_counter() - t0:.0f} s: " + ", ".join(f"{v} {k}" for k, v in count.items())
          + f" ({fused} with fused groups)")
    if args.json:
        args.json.write_text(json.dumps({"onnx": onnx.__version__, "rows": rows}, indent=1))
    return 1 if count["crash"] or count["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
