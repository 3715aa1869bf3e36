"""Packaging: `pip wheel` builds a platform wheel (py3-none-<platform>) holding the custom-op
library compiled by runtime/build.py next to its C++ sources; installed where there is no
compiler, `library_path()` and `onnxstitch build-library` give the packaged library and ONNX
Runtime registers it; an editable install compiles nothing (it needs no compiler). Builds run
on a copy of the source tree; pip fetches setuptools for its isolated build as a user's does."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from onnxstitch.runtime import build as rtbuild

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "onnxstitch")
PACKAGED = "onnxstitch/runtime/lib/" + rtbuild.LIBRARY_NAME

# Run with `python -S` from the installed wheel alone: no compiler on PATH, an empty cache.
PROBE = r"""
import json, os, shutil
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
import onnxstitch
lib = onnxstitch.library_path()
so = ort.SessionOptions()
so.register_custom_ops_library(str(lib))
graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "g",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "xy"],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
x, y = np.random.default_rng().standard_normal((2, 2, 3)).astype(np.float32)
print(json.dumps({"compiler": shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++"),
                  "package": onnxstitch.__file__, "library": str(lib),
                  "ran": bool(np.array_equal(sess.run(None, {"x": x, "y": y})[0], x + y))}))
"""


def _pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _no_compiler_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment with no compiler on PATH, CXX naming none and an empty onnxstitch
    cache: any attempt to build the library fails."""
    (tmp / "bin").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("ONNXSTITCH_LIBRARY", "ORT_INCLUDE_DIR", "PYTHONPATH")}
    return {**env, "PATH": str(tmp / "bin"), "CXX": "no-such-compiler-onnxstitch",
            "ONNXSTITCH_CACHE": str(tmp / "cache"), **extra}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", "-q", "-w", str(out), str(source))
    (whl,) = out.glob("*.whl")
    return whl


def test_wheel_is_for_this_platform_and_holds_the_library(wheel: Path, source: Path) -> None:
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name.endswith(f"-py3-none-{platform}.whl"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        assert "Root-Is-Purelib: false" in z.read(info).decode()
        packaged = z.read(PACKAGED)
    # Every C++ source the build compiles or includes travels too (a source install rebuilds).
    tree = Path(rtbuild.__file__).resolve().parents[2]
    for path in rtbuild._sources():
        assert path.relative_to(tree).as_posix() in names, path
    assert any(n.startswith("onnxstitch/cli/") for n in names)
    # The library is build.py's own build of these sources (its cache key covers them).
    assert packaged == rtbuild.build().read_bytes()


def test_wheel_holds_every_module_and_scheme_source(wheel: Path) -> None:
    """Package discovery cannot forget a folder: every Python module and C++ source under
    onnxstitch/ is in the wheel (a hand-written package list once lost onnxstitch.schemes.conv,
    and only the editable install worked), and every folder of Python code is a package."""
    tree = ROOT / "onnxstitch"
    wanted = {p.relative_to(ROOT).as_posix() for ext in ("*.py", "*.cc", "*.h", "*.map", "*.cu.in") for p in tree.rglob(ext)
              if "__pycache__" not in p.parts and "lib" not in p.relative_to(tree).parts[:2]}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert wanted - names == set()
    for folder in {p.parent for p in tree.rglob("*.py")}:
        assert (folder / "__init__.py").exists(), f"{folder} holds Python code but is no package"


def test_installed_wheel_needs_no_compiler(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel))
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = _no_compiler_env(tmp_path, PYTHONPATH=os.pathsep.join([str(target), *deps]))
    # -S: no site hooks, so this environment's editable onnxstitch stays out of the way.
    res = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    probe = json.loads(res.stdout.splitlines()[-1])
    assert probe["compiler"] is None
    assert Path(probe["package"]).parent == target / "onnxstitch"
    assert probe["library"] == str(target / PACKAGED) and probe["ran"]
    cli = subprocess.run([sys.executable, "-S", "-m", "onnxstitch.cli", "build-library"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert cli.returncode == 0 and cli.stdout.strip() == str(target / PACKAGED), cli.stdout + cli.stderr
    assert not (tmp_path / "cache").exists()  # nothing was built or fetched


def test_editable_install_compiles_nothing(source: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip("--python", str(venv / "bin" / "python"), "install", "--no-deps", "-q", "-e", str(source),
         env=_no_compiler_env(tmp_path))
    assert not (source / "onnxstitch" / "runtime" / "lib").exists()
    assert not (tmp_path / "cache").exists()
