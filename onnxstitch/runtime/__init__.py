"""Runtime side of onnxstitch: the custom-op library and ONNX Runtime sessions that use it.

``library_path()`` finds (in a wheel; else building on first use) ``libonnxstitch_ops.so``, which registers
``com.onnxstitch::FusedKernel`` for ONNX Runtime's CUDA execution provider. ``session()`` makes
an ``onnxruntime.InferenceSession`` with the CUDA EP and that library.

The library is registered only in sessions that use the CUDA EP: with the library registered,
ORT sees a kernel for FusedKernel and stops inlining the model-local fallback functions, so a
CPU-only session would fail with NOT_IMPLEMENTED. A stitched model runs on CPU through its
fallback functions in a plain ``onnxruntime.InferenceSession`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import onnx
    import onnxruntime

__all__ = ["library_path", "session", "CUDA_PROVIDER"]

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

ProviderSpec = Union[str, tuple[str, dict[str, Any]]]


# Libraries a session of this process registered, held open for the life of the process. ONNX
# Runtime unloads a custom-op library with the last session that registered it, and with it the
# plans the library chose for cuDNN and cuBLASLt (at first use: seconds for a CNN); optimize's
# verification, gate and a user's sessions one after another would each choose them again.
_LOADED: dict[str, Any] = {}


def _keep_loaded(lib: str) -> None:
    import ctypes

    if lib not in _LOADED:
        _LOADED[lib] = ctypes.CDLL(lib)  # the handle ORT holds, one reference more


def library_path(build: bool = True) -> Path:
    """Path of the custom-op library.

    In order: ``$ONNXSTITCH_LIBRARY`` (the file must exist); the library shipped inside an
    installed wheel (``onnxstitch/runtime/lib/``); the cached build for the current sources,
    compiled first if it is missing and ``build`` is true (source and editable installs).
    Raises FileNotFoundError if there is no library and ``build`` is false, and
    ``build.BuildError`` (a RuntimeError) if building fails.
    """
    env = os.environ.get("ONNXSTITCH_LIBRARY")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"ONNXSTITCH_LIBRARY={env} does not exist")
        return path
    from . import build as _build

    packaged = _build.packaged_library()
    if packaged is not None:
        return packaged
    if build:
        return _build.build()
    path = _build.cached_library(fetch_headers=False)
    if not path.is_file():
        raise FileNotFoundError(f"the onnxstitch custom-op library is not built yet (expected {path})")
    return path


def _provider_name(spec: ProviderSpec) -> str:
    return spec if isinstance(spec, str) else spec[0]


def session(
    model: Union[str, os.PathLike[str], bytes, "onnx.ModelProto"],
    providers: Sequence[ProviderSpec] | None = None,
    sess_options: "onnxruntime.SessionOptions | None" = None,
    **kw: Any,
) -> "onnxruntime.InferenceSession":
    """An ``onnxruntime.InferenceSession`` on the CUDA EP with the onnxstitch library registered.

    ``model``: a path, serialized bytes or an ``onnx.ModelProto``. ``providers`` defaults to
    CUDA then CPU; a given list must include the CUDA EP. ``sess_options`` is used as given
    (the library is registered into it, so pass a fresh one per call). Other keyword arguments
    go to ``InferenceSession`` (e.g. ``provider_options``).

    Raises RuntimeError if this onnxruntime has no CUDA EP or the providers leave it out:
    registering the library without the CUDA EP would make ORT fail with NOT_IMPLEMENTED.
    """
    import onnxruntime as ort

    if providers is None:
        providers = [CUDA_PROVIDER, CPU_PROVIDER]
    names = [_provider_name(p) for p in providers]
    if CUDA_PROVIDER not in names:
        raise RuntimeError(
            f"onnxstitch sessions need {CUDA_PROVIDER} among the providers (got {names}); "
            "run stitched models without it through a plain onnxruntime.InferenceSession"
        )
    available = ort.get_available_providers()
    if CUDA_PROVIDER not in available:
        raise RuntimeError(
            f"this onnxruntime {ort.__version__} has no {CUDA_PROVIDER} (available: {available}); "
            "install onnxruntime-gpu, or run stitched models on CPU through a plain onnxruntime.InferenceSession"
        )
    if hasattr(ort, "preload_dlls"):
        # Loads the CUDA/cuDNN libraries of the pip wheels so the CUDA EP can find them.
        ort.preload_dlls()

    if sess_options is None:
        sess_options = ort.SessionOptions()
    lib = str(library_path())
    sess_options.register_custom_ops_library(lib)
    _keep_loaded(lib)

    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    return ort.InferenceSession(model, sess_options=sess_options, providers=list(providers), **kw)
