"""Wheel build hook: the compiled custom-op library goes into the wheel.

The project's metadata is all in pyproject.toml; this file only adds two commands to
setuptools' own PEP 517 backend:

- ``build_py`` also builds ``libonnxstitch_ops.so`` with onnxstitch/runtime/build.py (its
  sources, compile line, ORT headers and cache) and copies it to
  ``onnxstitch/runtime/lib/`` of the wheel, where ``onnxstitch.library_path()`` looks
  first. Editable installs skip it: they build on first use (``onnxstitch build-library``),
  so ``pip install -e .`` needs no compiler.
- ``bdist_wheel`` tags the wheel ``py3-none-<platform>``: the library is native code for
  this platform, but it links no Python, so one wheel serves every Python 3.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:  # older setuptools: the wheel package's command
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
BUILD_MODULE = ROOT / "onnxstitch" / "runtime" / "build.py"


def _runtime_build() -> ModuleType:
    """onnxstitch/runtime/build.py loaded by path: the build environment has none of the
    package's dependencies, and build.py needs only the standard library."""
    spec = importlib.util.spec_from_file_location("_onnxstitch_runtime_build", BUILD_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class BuildPyWithLibrary(build_py):
    """build_py, then the custom-op library into the build tree (not for editable installs)."""

    def run(self) -> None:
        editable = getattr(self, "editable_mode", False)
        if not editable:
            # setuptools never empties build/lib: a source file moved or removed since the last
            # in-tree build would otherwise still reach the wheel.
            shutil.rmtree(Path(self.build_lib, "onnxstitch"), ignore_errors=True)
        super().run()
        if editable:
            return
        rt = _runtime_build()
        try:
            built = rt.build()
        except rt.BuildError as exc:
            raise SystemExit(f"onnxstitch: cannot build {rt.LIBRARY_NAME} for the wheel: {exc}") from None
        target = Path(self.build_lib) / rt.PACKAGED_LIBRARY.relative_to(ROOT)  # where library_path() looks
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)
        print(f"onnxstitch: packaged {built} as {target}")


class NativeDistribution(Distribution):
    """Counts as holding native code, so the wheel is a platform wheel installed to platlib."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """Tagged ``py3-none-<platform>``: native code, but no libpython linked, so any Python 3."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
