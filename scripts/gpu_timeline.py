#!/usr/bin/env python3
"""Where a stitched model's time goes against stock ORT, on the GPU machine: a CUPTI timeline
(PyTorch's profiler watches every CUDA kernel, copy and runtime call in the process, ORT's
included) of both models, plain and with CUDA graphs, plus ORT's own profile (which nodes run on
which provider, Memcpy nodes included).

    python3 scripts/gpu_timeline.py --corpus DIR --out OUT NAME...   (optimizes each model first)

Per configuration and run: wall time, GPU kernel time, kernels, host↔device copies (count, bytes,
time), synchronizations, and the kernels that take the most time. JSON in DIR/timeline.json, a
readable summary on stdout. A diagnosis tool, not a benchmark: `onnxstitch bench` times.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402

from onnxstitch import bench, profile  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402
from scripts.kernel_profile import kind as kernel_kind  # noqa: E402
from scripts.zoo_report import symbol_values  # noqa: E402


def _session(path: Path, stitched: bool, graphs: bool, so=None):
    import onnxruntime as ort

    import onnxstitch
    providers = bench._provider_list(bench.BenchConfig(cuda_graph=graphs))
    if stitched:
        return onnxstitch.session(str(path), sess_options=so, providers=providers)
    return ort.InferenceSession(str(path), sess_options=so, providers=providers)


def _ort_nodes(path: Path, stitched: bool, feeds, like, warm: int = 5, runs: int = 10) -> dict:
    """Nodes per (provider, op) per run and their host time, from ORT's profiler (the warm-up
    runs, module loads and first allocations, left out)."""
    prof = profile.record(lambda so: bench._Bound(_session(path, stitched, False, so), feeds, like),
                          runs=runs, warmup=warm)
    return {r.name: {"per_run": r.calls_per_run, "host_us_per_run": round(r.us_per_run, 1),
                     "host_us_per_node": round(r.us_per_run / r.calls_per_run, 2)}
            for r in prof.by_op(with_provider=True)}


def _timeline(bound, runs: int) -> dict:
    """One CUPTI trace over `runs` runs of a warmed-up bound session."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        bound.run()
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(runs):
                bound.run()
            wall = (time.perf_counter() - t0) / runs * 1e3
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        events = json.loads(Path(trace).read_text()).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    runtime = Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(e.get("dur", 0.0))
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    copy_kinds: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0, "us": 0.0})
    for e in copies:
        kind = e["name"]
        copy_kinds[kind]["count"] += 1
        copy_kinds[kind]["bytes"] += int(e.get("args", {}).get("bytes", 0))
        copy_kinds[kind]["us"] += e.get("dur", 0.0)
    kinds: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        kinds[kernel_kind(e["name"])].append(e.get("dur", 0.0))
    span = 0.0
    if kernels:
        span = (max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)) / runs
    return {
        "wall_ms_per_run": round(wall, 4),
        "kernels_per_run": len(kernels) / runs,
        "kernel_us_per_run": round(sum(e.get("dur", 0) for e in kernels) / runs, 2),
        "kernel_span_us_per_run": round(span, 2),
        "by_kind": {k: {"count": len(d) / runs, "us_per_run": round(sum(d) / runs, 2)} for k, d in kinds.items()},
        "copies_per_run": {k: {"count": v["count"] / runs, "bytes": v["bytes"] / runs, "us": round(v["us"] / runs, 2)}
                           for k, v in copy_kinds.items()},
        "runtime_calls_per_run": {k: v / runs for k, v in runtime.most_common(12)},
        "top_kernels": [{"name": n[:140], "count": len(d) / runs, "us_per_run": round(sum(d) / runs, 2)}
                        for n, d in top],
    }


def profile_pair(stock: Path, stitched_path: Path, feeds, runs: int) -> dict:
    """The timelines and ORT node counts of `stock` and `stitched_path`, plain and with graphs."""
    import onnxruntime as ort

    ref = bench._Bound(_session(stock, False, False), feeds, None)
    ref.run()
    like = ref.outputs()
    result: dict = {"stock": str(stock), "stitched": str(stitched_path), "device": bench.gpu_name(),
                    "onnxruntime": ort.__version__, "configs": {}}
    for label, path, stitched in (("stock", stock, False), ("stitched", stitched_path, True)):
        try:
            result["configs"][f"{label}:ort-nodes"] = _ort_nodes(path, stitched, feeds, like)
        except Exception as e:  # noqa: BLE001  (a diagnosis: record and go on)
            result["configs"][f"{label}:ort-nodes"] = {"error": str(e).splitlines()[0]}
        for graphs in (False, True):
            key = f"{label}:{'graphs' if graphs else 'plain'}"
            try:
                bound = bench._Bound(_session(path, stitched, graphs), feeds, like if graphs else None)
                result["configs"][key] = _timeline(bound, runs)
            except Exception as e:  # noqa: BLE001
                result["configs"][key] = {"error": str(e).splitlines()[0]}
    return result


def show(name: str, result: dict) -> None:
    """The readable summary of one model's timelines."""
    for key, r in result["configs"].items():
        print(f"== {name} {key}")
        if "error" in r or key.endswith("ort-nodes"):
            print(json.dumps(r)[:1500])
            continue
        print(f"  wall {r['wall_ms_per_run']} ms, kernels {r['kernels_per_run']} ({r['kernel_us_per_run']} us, span "
              f"{r['kernel_span_us_per_run']} us), copies {json.dumps(r['copies_per_run'])}")
        print(f"  runtime {json.dumps(r['runtime_calls_per_run'])}")
        print(f"  by kind {json.dumps(r['by_kind'])}")
        for k in r["top_kernels"][:25]:
            print(f"    {k['us_per_run']:9.2f} us  x{k['count']:<5g} {k['name'][:100]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="models of the corpus manifest")
    ap.add_argument("--corpus", type=Path, required=True, help="folder with manifest.json and the models")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--epilogues", action="store_true", help="optimize with --epilogues")
    args = ap.parse_args()
    import torch  # noqa: F401  (its profiler; imported before any session so that CUPTI sees them)

    import onnxstitch

    bench.require_gpu("gpu_timeline")
    manifest = {}
    for e in json.loads((args.corpus / "manifest.json").read_text())["models"]:
        # The corpus's entries (file, shapes) or the zoo's (path, inputs with dims), by name or
        # file stem (the zoo's names repeat across dtypes).
        e = dict(e, file=e.get("file") or e["path"])
        e.setdefault("shapes", {d: [v] for d, v in symbol_values(e).items()})
        manifest[e["name"]] = manifest[Path(e["file"]).stem] = e
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.names:
        entry = manifest[name]
        path = args.corpus / entry["file"]
        stitched = args.out / f"{name}.stitched.onnx"
        t0 = time.perf_counter()
        values = entry.get("values") or {}  # inputs the manifest fixes (silero-vad's sr)
        res = onnxstitch.optimize(path, shapes=entry["shapes"], values=values, epilogues=args.epilogues)
        res.save(stitched)
        print(f"{name}: optimized in {time.perf_counter() - t0:.1f} s, {len(res.report.kernels)} kernels", flush=True)
        names = {i["name"] for i in entry["inputs"]}
        dims = {k: v[0] for k, v in entry["shapes"].items() if k not in names}
        overrides = {k: tuple(v) for k, v in entry["shapes"].items() if k in names}
        feeds = random_feeds(onnx.load(str(path), load_external_data=False), 0, dims, overrides, values=values)
        results[name] = profile_pair(path, stitched, feeds, args.runs)
        show(name, results[name])
        (args.out / "timeline.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
