"""`onnxstitch optimize MODEL --bundle DIR`: the folder holds the stitched model (and its
weights file), a copy of the custom-op library and a README, and works on its own from
another place in a fresh process: without the library ONNX Runtime's CPU provider runs the
fused nodes' fallback functions and matches the original; with the copied library registered
ORT resolves FusedKernel against it and stops at the missing CPU kernel, as the library does
(tests/test_runtime_build.py); the kernels themselves run on the GPU (scripts/gpu_deploy.sh)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from onnxstitch.cli.main import main
from models.elementwise import random_graph
from onnxstitch import load, runtime
from onnxstitch.inputs import random_feeds

from .stitching import fresh_seed

# Run in a fresh interpreter, from the bundle alone: argv = bundle dir, model name, feeds .npz.
LOAD_BUNDLE = r"""
import json, sys
from pathlib import Path
import numpy as np, onnxruntime as ort
bundle, name, feeds_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
feeds = dict(np.load(feeds_path))
model = str(bundle / name)
fallback = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
np.savez(feeds_path + ".out.npz", *fallback)
so = ort.SessionOptions()
so.register_custom_ops_library(str(bundle / "libonnxstitch_ops.so"))
so.log_severity_level = 4
try:
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    error = ""
except Exception as e:
    error = str(e)
print(json.dumps({"with_library": error}))
"""


@pytest.fixture(scope="module")
def lib() -> Path:
    return runtime.library_path()


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _load_moved_bundle(bundle: Path, name: str, feeds: dict[str, np.ndarray], tmp_path: Path) -> tuple[list, str]:
    """Copy `bundle` elsewhere, load it in a fresh process, return its CPU outputs and the
    error of a CPU session with the copied library registered."""
    moved = tmp_path / "elsewhere" / "bundle"
    shutil.copytree(bundle, moved)
    shutil.rmtree(bundle)  # nothing may still point at the first place
    feeds_path = tmp_path / "feeds.npz"
    np.savez(feeds_path, **feeds)
    res = subprocess.run([sys.executable, "-c", LOAD_BUNDLE, str(moved), name, str(feeds_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    outs = np.load(str(feeds_path) + ".out.npz")
    return [outs[f"arr_{i}"] for i in range(len(outs.files))], json.loads(res.stdout.splitlines()[-1])["with_library"]


@pytest.mark.parametrize("external", [False, True])
def test_bundle_runs_from_elsewhere_in_a_fresh_process(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       external: bool) -> None:
    if external:  # a model over protobuf's limit writes its weights beside it: so do these
        monkeypatch.setattr(load, "PROTOBUF_LIMIT", 200_000)
    model = random_graph(40, seed=5, shape=("batch", 320), opaque_every=9)
    src, bundle = tmp_path / "net.onnx", tmp_path / "bundle"
    onnx.save(model, src)
    res = _invoke("optimize", str(src), "--bundle", str(bundle), "--shape", "batch=4")
    assert res.exit_code == 0, res.output
    assert "bundle:" in res.output and "README.txt" in res.output
    data = ["net.stitched.onnx.data"] if external else []
    assert sorted(p.name for p in bundle.iterdir()) == sorted(["README.txt", "libonnxstitch_ops.so", "net.stitched.onnx", *data])
    assert (bundle / "libonnxstitch_ops.so").read_bytes() == lib.read_bytes()
    readme = (bundle / "README.txt").read_text()
    for needle in ("register_custom_ops_library", "RegisterCustomOpsLibrary", "net.stitched.onnx", "trust", *data):
        assert needle in readme
    stitched = onnx.load(str(bundle / "net.stitched.onnx"), load_external_data=False)
    fused = [n.name for n in stitched.graph.node if n.op_type == "FusedKernel"]
    assert fused
    outside = [t.name for t in stitched.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert bool(outside) == external

    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3})
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got, with_library = _load_moved_bundle(bundle, "net.stitched.onnx", feeds, tmp_path)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The copied library loaded and took FusedKernel over; this CPU build has no kernel for it.
    assert "NOT_IMPLEMENTED" in with_library and any(name in with_library for name in fused), with_library


def test_bundle_without_a_library_names_build_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONNXSTITCH_LIBRARY", raising=False)
    monkeypatch.setenv("ONNXSTITCH_CACHE", str(tmp_path / "empty-cache"))  # no build, no headers
    src, bundle = tmp_path / "m.onnx", tmp_path / "bundle"
    onnx.save(random_graph(8, seed=1), src)
    res = _invoke("optimize", str(src), "--bundle", str(bundle))
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "onnxstitch build-library" in lines[0], res.output
    assert not bundle.exists()


def test_bundle_and_output_are_one_choice(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(random_graph(8, seed=1), src)
    res = _invoke("optimize", str(src), "--bundle", str(tmp_path / "b"), "-o", str(tmp_path / "o.onnx"))
    assert res.exit_code == 2 and "--bundle" in res.output
    assert not (tmp_path / "b").exists() and not (tmp_path / "o.onnx").exists()


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_cpp_example_runs_the_bundle(lib: Path, tmp_path: Path) -> None:
    # examples/cpp: built against ORT's headers and this onnxruntime's libonnxruntime. On the CPU
    # it runs the fallbacks without the library; with the library it reaches the fused nodes.
    root = Path(__file__).resolve().parents[1]
    build = subprocess.run(["bash", str(root / "examples" / "cpp" / "build.sh"), str(tmp_path / "cpp")],
                           capture_output=True, text=True, cwd=root, timeout=300,
                           env={**os.environ, "PYTHON": sys.executable})
    assert build.returncode == 0, build.stdout + build.stderr
    model = random_graph(30, seed=2, shape=("batch", 64), opaque_every=7)
    src, bundle = tmp_path / "m.onnx", tmp_path / "bundle"
    onnx.save(model, src)
    assert _invoke("optimize", str(src), "--bundle", str(bundle), "-q").exit_code == 0
    exe, stitched = str(tmp_path / "cpp" / "run_stitched"), str(bundle / "m.stitched.onnx")
    run = subprocess.run([exe, stitched, "--cpu", "--dim", "batch=3"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    shapes = dict(re.findall(r"^output (\S+) float32 (\[.*\])$", run.stdout, re.M))
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    feeds = random_feeds(model, seed=0, dim_values={"batch": 3})
    expected = {o.name: str(list(v.shape)) for o, v in zip(ref.get_outputs(), ref.run(None, feeds))}
    assert shapes == expected, run.stdout
    with_lib = subprocess.run([exe, stitched, "--cpu", "--library", str(bundle / lib.name)], capture_output=True,
                              text=True, timeout=120)
    # ORT's NOT_IMPLEMENTED: the library's schema took the node, and it has no CPU kernel
    assert with_lib.returncode == 1 and "Could not find an implementation for FusedKernel" in with_lib.stderr, \
        with_lib.stderr
