"""Fuzz report: optimize N drawn models (models/fuzz.py), check each, print and write counts.

    python3 scripts/fuzz_report.py 200 --out fuzz-report

Per model: `onnxstitch.optimize` → onnx.checker (full_check) → structural invariants → the
stitched model on ORT CPU (fallback functions) bit-for-bit against the original, and, where
`onnxstitch.session` works (a GPU with onnxruntime-gpu), the real kernels against the original
on ORT CPU with dtype-aware tolerances. Counts: improved (≥ 1 FusedKernel), unchanged, broken
(optimize raised, checker or structure failed, outputs differ); the first failures are saved
as repros (model.onnx, model.txt, case.json) under --out, and everything in report.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # models/ and tests/ from a checkout

import onnx  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

import onnxstitch  # noqa: E402
from models.fuzz import (FuzzCase, cases, exact_mismatch, float32_feeds, float32_reference,  # noqa: E402
                         fused_nodes, run_cpu, simplified, structural_problems,
                         tolerant_mismatch)


def gpu_runner():
    """A function running a stitched model's real kernels, or None without a usable GPU."""
    try:
        from tests.conftest import gpu_available

        if not gpu_available():
            return None
        from tests.gpu.test_stitched_gpu import run_gpu

        return run_gpu
    except Exception:
        return None


def check_case(case: FuzzCase, run_gpu) -> tuple[str, str, str, int]:
    """(outcome, stage, message, fused node count) for one case; outcome is improved,
    unchanged or broken; stage names where it broke."""
    stage = ["?"]
    try:
        res = onnxstitch.optimize(case.model, shapes=case.plan_shapes, progress=lambda s: stage.__setitem__(0, s))
    except Exception as e:
        return "broken", f"optimize:{stage[0]}", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", 0
    stitched = res.model
    n = len(fused_nodes(stitched))
    try:
        onnx.checker.check_model(stitched, full_check=True)
    except Exception as e:
        return "broken", "checker", str(e).splitlines()[0], n
    problems = structural_problems(case.model, stitched, simplified(case.model))
    if problems:
        return "broken", "structure", "; ".join(problems), n
    feeds = case.feeds()
    try:
        expected = run_cpu(case.model, feeds)
        got = run_cpu(stitched, feeds)
    except Exception as e:
        return "broken", "cpu-run", f"{type(e).__name__}: {str(e).splitlines()[0]}", n
    for out, a, b in zip(case.model.graph.output, got, expected):
        why = exact_mismatch(a, b)
        if why:
            return "broken", "cpu-compare", f"output {out.name}: {why}", n
    if run_gpu is not None and n:
        try:
            half = case.has_float16
            ref_model, ref_feeds = (float32_reference(case.model), float32_feeds(feeds)) if half else (case.model, feeds)
            ref = run_cpu(ref_model, ref_feeds)
            like = [r.astype(a.dtype) for r, a in zip(ref, expected)]
            got = run_gpu(stitched, feeds, like)
        except Exception as e:
            return "broken", "gpu-run", f"{type(e).__name__}: {str(e).splitlines()[0]}", n
        for out, a, b in zip(case.model.graph.output, got, ref):
            why = tolerant_mismatch(a, b, half)
            if why:
                return "broken", "gpu-compare", f"output {out.name}: {why}", n
    return ("improved" if n else "unchanged"), "", "", n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, nargs="?", default=200, help="models to draw (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (same seed, same models)")
    ap.add_argument("--out", type=Path, default=Path("fuzz-report"), help="folder for report.json and repros")
    ap.add_argument("--repros", type=int, default=5, help="failures saved as repros (default 5)")
    ap.add_argument("--avoid", default="", help="comma-separated known bugs to draw around (models.fuzz.KNOWN_BUGS), "
                    "to look for the next ones")
    ap.add_argument("--steps", type=int, default=10, help="most ops (or small patterns) per model (default 10)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the GPU check even where it could run")
    args = ap.parse_args()

    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    run_gpu = None if args.no_gpu else gpu_runner()
    args.out.mkdir(parents=True, exist_ok=True)
    counts: Counter[str] = Counter()
    by_stage: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    fused_total = 0
    t0 = time.perf_counter()

    # Hypothesis draws the models (generation only: no shrinking, no database) so the report
    # sees exactly the distribution the tests see.
    @seed(args.seed)
    @settings(max_examples=args.n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases(max_steps=args.steps, avoid=frozenset(filter(None, args.avoid.split(",")))))
    def one(case: FuzzCase) -> None:
        nonlocal fused_total
        if sum(counts.values()) >= args.n:
            return
        try:
            outcome, stage, msg, n = check_case(case, run_gpu)
        except Exception as e:  # a bug in the checks themselves: count it, keep going
            outcome, stage, msg, n = "broken", "harness", f"{type(e).__name__}: {e}\n{traceback.format_exc()}", 0
        counts[outcome] += 1
        fused_total += n
        if outcome != "broken":
            return
        by_stage[stage] += 1
        entry: dict[str, Any] = {"index": sum(counts.values()) - 1, "stage": stage, "error": msg}
        if len(failures) < args.repros:
            d = args.out / f"failure_{len(failures):02d}"
            d.mkdir(parents=True, exist_ok=True)
            onnx.save(case.model, d / "model.onnx")
            (d / "model.txt").write_text(onnx.printer.to_text(case.model))
            (d / "case.json").write_text(json.dumps({"dims": dict(case.dims), "plan_shapes": dict(case.plan_shapes),
                                                     "feeds_seed": case.seed, "overrides": list(case.overrides),
                                                     "stage": stage, "error": msg}, indent=2))
            entry["repro"] = str(d)
        failures.append(entry)
        print(f"[{entry['index']}] broken at {stage}: {msg}", file=sys.stderr)

    one()
    total = sum(counts.values())
    signatures = Counter(f"{f['stage']}: {f['error'][:120]}" for f in failures)
    report = {"models": total, "improved": counts["improved"], "unchanged": counts["unchanged"],
              "broken": counts["broken"], "fused_nodes": fused_total, "broken_by_stage": dict(by_stage),
              "gpu_checked": run_gpu is not None, "seed": args.seed, "avoid": args.avoid, "seconds": round(time.perf_counter() - t0, 1),
              "failure_signatures": dict(signatures.most_common()), "failures": failures}
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"{total} models: improved {counts['improved']}, unchanged {counts['unchanged']}, "
          f"broken {counts['broken']} ({dict(by_stage)}); {fused_total} fused nodes; "
          f"GPU {'checked' if run_gpu else 'not checked'}; {report['seconds']} s → {args.out / 'report.json'}")
    for sig, k in signatures.most_common(10):
        print(f"  {k:4d} × {sig}")
    return 1 if counts["broken"] else 0


if __name__ == "__main__":
    sys.exit(main())
