"""Running ONNX Runtime sessions on bfloat16 tensors, and with the user's custom-op libraries.

numpy has no bfloat16 of its own: inputs come as `ml_dtypes.bfloat16` arrays, which
`InferenceSession.run` rejects, and ORT cannot hand a bfloat16 output back as numpy. Both go
through OrtValues here: inputs are built from the arrays' 16-bit patterns with their ONNX type,
outputs are read back as raw bytes (from the device through a CUDA copy). Every other dtype
takes ORT's own path unchanged.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from onnx import TensorProto as TP


def is_bfloat16(arr: np.ndarray) -> bool:
    """Whether `arr` holds ml_dtypes bfloat16 values."""
    return np.asarray(arr).dtype.name == "bfloat16"


def to_ortvalue(arr: np.ndarray, device: str = "cpu", device_id: int = 0) -> Any:
    """An OrtValue on `device` holding `arr` (bfloat16 arrays included)."""
    import onnxruntime as ort

    arr = np.asarray(arr)
    arr = arr if arr.flags.c_contiguous else arr.copy()  # (ascontiguousarray makes scalars 1-d)
    if not is_bfloat16(arr):
        return ort.OrtValue.ortvalue_from_numpy(arr, device, device_id)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), TP.BFLOAT16, device, device_id)
    value.update_inplace(arr.view(np.uint16))  # the bit patterns; ORT copies them to the device
    return value


def empty(shape: Sequence[int], dtype: np.dtype, device: str = "cpu", device_id: int = 0) -> Any:
    """An uninitialised OrtValue of `shape` and numpy `dtype` (ml_dtypes.bfloat16 included)."""
    import onnxruntime as ort

    kind = TP.BFLOAT16 if np.dtype(dtype).name == "bfloat16" else np.dtype(dtype).type
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), kind, device, device_id)


def to_numpy(value: Any) -> np.ndarray:
    """An OrtValue as numpy, host or device (bfloat16 as ml_dtypes.bfloat16, read from its
    bytes; from a device through a CUDA copy)."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    import ml_dtypes

    shape = tuple(value.shape())
    nbytes = value.tensor_size_in_bytes()
    host = np.empty(nbytes, np.uint8)
    if nbytes and value.device_name().lower() == "cpu":
        ctypes.memmove(host.ctypes.data, value.data_ptr(), nbytes)
    elif nbytes:
        from cupy_backends.cuda.api import runtime

        runtime.memcpy(host.ctypes.data, value.data_ptr(), nbytes, runtime.memcpyDeviceToHost)
    return host.view(np.uint16).view(ml_dtypes.bfloat16).reshape(shape)


def run(session: Any, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """`session.run(names, feeds)`, also where inputs or outputs are bfloat16."""
    out_types = {o.name: o.type for o in session.get_outputs()}
    if not any(is_bfloat16(v) for v in feeds.values()) and \
            not any(out_types.get(n) == "tensor(bfloat16)" for n in names):
        return session.run(list(names), dict(feeds))
    io = session.io_binding()
    for k, v in feeds.items():
        io.bind_ortvalue_input(k, to_ortvalue(v))
    for n in names:
        io.bind_output(n, "cpu")
    session.run_with_iobinding(io)
    return [to_numpy(v) for v in io.get_outputs()]


# CPU threads each ORT session of onnxstitch's may use, where set: `onnxstitch zoo` sets it in
# each worker so that several workers on one host do not each start a pool of every core, spinning.
THREADS_ENV = "ONNXSTITCH_THREADS"
# Where several optimizes share one GPU (a corpus or zoo run with more jobs than GPUs): a file
# each holds while it times kernels or the whole model (measure.timing_lock), so that their
# timings do not run over one another (MobileNetV2's groups timed 0.0 µs beside another job).
TIMING_LOCK_ENV = "ONNXSTITCH_TIMING_LOCK"


def with_custom_ops(options: Any, libraries: Sequence[str]) -> Any:
    """`options` (an ORT SessionOptions) with each custom-op library of the user's registered:
    the model's own ops from onnxruntime-extensions or the user's library; where THREADS_ENV is
    set, ORT's CPU thread pools held to that many threads that do not spin. Returns `options`."""
    for lib in libraries:
        options.register_custom_ops_library(str(lib))
    threads = os.environ.get(THREADS_ENV, "")
    if threads.isdigit() and int(threads) > 0:
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def custom_op_libraries(paths: Sequence[str | os.PathLike]) -> tuple[str, ...]:
    """The user's custom-op libraries (`--custom-op-library`), each checked to exist and to load
    into ONNX Runtime. Raises BadInputError naming the file that does not."""
    import onnxruntime as ort

    from .errors import BadInputError, first_line

    out = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_file():
            raise BadInputError(f"--custom-op-library {p}: no such file")
        try:
            ort.SessionOptions().register_custom_ops_library(str(path.resolve()))
        except Exception as e:
            raise BadInputError(f"--custom-op-library {p}: ONNX Runtime cannot load it as a custom-op library "
                                f"({first_line(e)})") from None
        out.append(str(path.resolve()))
    return tuple(out)
