"""onnxstitch: fuse memory-bound ONNX operators into generated CUDA kernels for ONNX Runtime.

    result = onnxstitch.optimize("model.onnx", shapes={"batch": [8]})
    onnx.save(result.model, "model.stitched.onnx")
    sess = onnxstitch.session("model.stitched.onnx")   # CUDA EP + the custom-op library
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__
__all__ = ["optimize", "Options", "OptimizeResult", "Report", "library_path", "session", "__version__"]

if TYPE_CHECKING:
    from .pipeline import OptimizeResult, Options, Report, optimize
    from .runtime import library_path, session


def __getattr__(name: str) -> Any:
    # Imported on first use so `import onnxstitch` stays cheap for the CLI's --help.
    if name in ("optimize", "Options", "OptimizeResult", "Report"):
        from . import pipeline

        return getattr(pipeline, name)
    if name in ("library_path", "session"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'onnxstitch' has no attribute {name!r}")
