"""What a user runs after `pip install onnxstitch`, against the installed package only
(scripts/wheel_check.sh runs it in a fresh virtual environment, from outside the checkout):
optimize with a plan picture and a bundle, bench on the CPU, check against a baseline, explain,
and the bundle's custom-op library loaded into an ONNX Runtime session. Exits non-zero, naming
the step, on the first failure."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def block_model(hidden: int = 64) -> onnx.ModelProto:
    """A transformer MLP block over [batch, tokens, hidden]: MatMul + bias, exact GELU, residual,
    LayerNorm written out as exporters write it, then a Softmax — elementwise and rows work."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.1, "w")
    b = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b")
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5), ("eps", 1e-5), ("two", 2.0))]
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w"], ["mm"]), n("Add", ["mm", "b"], ["h"]),
        n("Div", ["h", "sqrt2"], ["hd"]), n("Erf", ["hd"], ["he"]), n("Add", ["he", "one"], ["h1"]),
        n("Mul", ["h", "h1"], ["hm"]), n("Mul", ["hm", "half"], ["g"]), n("Add", ["g", "x"], ["r"]),
        n("ReduceMean", ["r", "axes"], ["mu"]), n("Sub", ["r", "mu"], ["c"]), n("Pow", ["c", "two"], ["c2"]),
        n("ReduceMean", ["c2", "axes"], ["var"]), n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
        n("Div", ["c", "sd"], ["ln"]), n("Softmax", ["ln"], ["y"], axis=-1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", hidden])
    graph = helper.make_graph(nodes, "block", [x], [y], [w, b, axes, *consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def step(name: str, cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=900)
    sys.stdout.write(res.stdout[-3000:])
    if res.returncode != 0:
        sys.stdout.write(res.stderr[-3000:])
        raise SystemExit(f"wheel smoke test: step '{name}' failed with exit status {res.returncode}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", type=Path, required=True)
    args = ap.parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)

    import onnxstitch

    package = Path(onnxstitch.__file__).resolve().parent
    if "site-packages" not in package.parts:
        raise SystemExit(f"wheel smoke test: onnxstitch imported from {package}, not from an installed wheel")
    exe = shutil.which("onnxstitch")
    if exe is None:
        raise SystemExit("wheel smoke test: the wheel installed no 'onnxstitch' command")
    print(f"onnxstitch {onnxstitch.__version__} from {package}; command {exe}")

    model = work / "block.onnx"
    onnx.save(block_model(), str(model))
    shape = ["--shape", "batch=2,tokens=16"]
    bundle = work / "bundle"
    step("version", [exe, "--version"], work)
    step("optimize", [exe, "optimize", str(model), *shape, "--plan-picture", str(work / "plan.html"),
                      "--bundle", str(bundle), "--report", str(work / "plan.json")], work)
    stitched = bundle / "block.stitched.onnx"
    for f in (stitched, work / "plan.html", work / "plan.json"):
        if not f.exists() or f.stat().st_size == 0:
            raise SystemExit(f"wheel smoke test: optimize wrote no {f}")
    report = json.loads((work / "plan.json").read_text())
    if not report["plan"]["groups"]:
        raise SystemExit("wheel smoke test: optimize fused no group in the block model")
    step("explain", [exe, "explain", str(work / "plan.json"), "-o", str(work / "plan.svg")], work)
    res = step("bench", [exe, "bench", str(model), "--stitched", str(stitched), *shape, "--providers",
                         "CPUExecutionProvider", "--warmup", "1", "--iters", "3", "--json"], work)
    timing = json.loads(res.stdout)
    if timing["configs"]["onnxstitch"]["max_rel_err"] > 1e-4:
        raise SystemExit(f"wheel smoke test: bench found the stitched outputs off: {timing['configs']}")
    base = work / "baseline.json"
    step("check (baseline)", [exe, "check", str(model), "--baseline", str(base), "--update-baseline", *shape], work)
    step("check", [exe, "check", str(model), "--baseline", str(base), *shape], work)

    # The bundle's library loads into ONNX Runtime (registered only where the CUDA EP runs, as
    # its README says; on the CPU the stitched model runs its fallback functions without it).
    import onnxruntime as ort

    libs = sorted(bundle.glob("*.so"))
    if len(libs) != 1:
        raise SystemExit(f"wheel smoke test: the bundle holds {len(libs)} libraries, not 1")
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(libs[0]))
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = np.random.default_rng().standard_normal(3).astype(np.float32)
    got = ort.InferenceSession(plain.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    if not np.array_equal(got[0], np.maximum(x, 0)):
        raise SystemExit("wheel smoke test: a session with the bundle's library registered computed wrong values")
    feeds = {"x": np.random.default_rng().standard_normal((2, 16, 64)).astype(np.float32)}
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    out = ort.InferenceSession(str(stitched), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    if not np.allclose(out, ref, rtol=1e-4, atol=1e-6):
        raise SystemExit("wheel smoke test: the stitched model's fallback differs from the original")
    print(f"wheel smoke test: ok ({libs[0].name} loaded; {len(report['plan']['groups'])} fused groups)")


if __name__ == "__main__":
    main()
