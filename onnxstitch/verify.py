"""Stage 9: verify the stitched model against the original before anything is written.

Both models run on the same seeded random inputs, with every fused group's outputs exposed as
graph outputs, so a mismatch names the first group that went wrong. On a machine with a GPU
and onnxruntime-gpu the stitched model runs its real kernels (reference: the original on
stock ORT CUDA); elsewhere it runs through its fallback functions on ORT CPU, which checks the
rewrite's wiring rather than the kernels.
"""
from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from . import ortio
from .errors import StitchError, first_line
from .graph import FusionGraph
from .inputs import random_feeds
from .load import is_large, save
from .plan import Group

log = logging.getLogger(__name__)

# Symbolic dims take this small odd value while verifying: fast on CPU, and it exercises the
# kernels' broadcast and tail paths (the planning sizes stay what --shape said).
VERIFY_DIM = 3


class VerifyError(StitchError):
    """The stitched model's outputs differ from the original's; `group` names the fused group
    whose outputs differ first (None when the difference cannot be pinned on one)."""

    def __init__(self, message: str, group: str | None = None) -> None:
        super().__init__(message)
        self.group = group


@dataclass(frozen=True)
class Verification:
    """What was checked: where it ran, how many tensors, the worst relative error seen."""

    device: str  # "gpu" or "cpu"
    tensors_checked: int
    worst_relative_error: float
    skipped: str = ""  # why verification could not run, when it could not

    def to_json(self) -> dict:
        return {"device": self.device, "tensors_checked": self.tensors_checked,
                "worst_relative_error": self.worst_relative_error, "skipped": self.skipped}


# Products on TF32 tensor cores (attention.py) against ONNX Runtime's own TF32 GEMMs: each
# rounds its inputs to 10 mantissa bits (unit roundoff 2^-11 ≈ 4.9e-4), in its own order; the
# two differ by ~5e-4 relative at BERT's sizes (scripts/probe_attention.py), so 8 unit roundoffs.
TF32_TOLERANCE = 4e-3


def _relative_tolerance(dtype: np.dtype) -> float:
    # Half precision: fused kernels keep float32 intermediates where ORT rounds every op's
    # output to half, and values in half's subnormal range (layer scales of 1e-6) carry few
    # bits either way; measured up to 2% relative norm on ConvNeXt and YOLO (H200), so 5%.
    name = np.dtype(dtype).name
    return 5e-2 if name in ("float16", "bfloat16") else 1e-4


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" or a.dtype.name == "bfloat16"


def _special_mismatch(a: np.ndarray, b: np.ndarray) -> str | None:
    """Why two tensors cannot match whatever the tolerance: shape, dtype, integer values,
    NaN or infinity positions (None when none of these differ)."""
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if not _is_float(b):
        bad = int(np.count_nonzero(a != b))
        return f"{bad} of {a.size} elements differ" if bad else None
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return f"NaN at {int(np.count_nonzero(nan_a ^ nan_b))} positions where the original has none (or the reverse)"
    if (np.isinf(a64) != np.isinf(b64)).any() or (np.isinf(b64) & (a64 != b64)).any():
        return "infinities differ"
    return None


def compare(actual: np.ndarray, expected: np.ndarray, half_inputs: bool = False,
            tf32: bool = False) -> tuple[bool, float, str]:
    """(ok, relative error, why) for one tensor: exact for integers and bools; for floats the
    same NaN/Inf positions and ‖a − b‖ ≤ tol·‖b‖ over finite values (tol 1e-4, or 5e-2 for
    half precision, or TF32_TOLERANCE for float32 values downstream of TF32 products): the
    norm suits values at the end of long chains."""
    a, b = np.asarray(actual), np.asarray(expected)
    why = _special_mismatch(a, b)
    if why is not None:
        return False, float("inf"), why
    if not _is_float(b):
        return True, 0.0, ""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(b64)
    diff = float(np.linalg.norm((a64 - b64)[finite]))
    ref = float(np.linalg.norm(b64[finite]))
    rel = diff / ref if ref > 0 else diff
    # A float32 output computed from half-precision inputs is only as certain as they are:
    # ORT may evaluate it in another order (its own fusions), differing by half's rounding.
    tol = _relative_tolerance(np.dtype(np.float16) if half_inputs else a.dtype)
    if tf32 and a.dtype == np.float32:
        tol = max(tol, TF32_TOLERANCE)
    return rel <= tol, rel, f"relative error {rel:.3g} > {tol:g}"


@dataclass(frozen=True)
class OutputCheck:
    """One output compared element by element with its reference."""

    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    detail: str = ""


def compare_elementwise(name: str, got: np.ndarray, ref: np.ndarray, atol: float | None = None,
                        rtol: float | None = None) -> OutputCheck:
    """Every element within atol + rtol·|ref| (defaults by dtype: 1e-4 for float32/64, 5e-2
    for half), besides the exact rules of `compare` for shapes, integers, NaN and Inf."""
    g, r = np.asarray(got), np.asarray(ref)
    why = _special_mismatch(g, r)
    if why is not None:
        return OutputCheck(name, False, float("inf"), float("inf"), why)
    if not _is_float(r):
        return OutputCheck(name, True, 0.0, 0.0)
    tol = _relative_tolerance(r.dtype)
    atol, rtol = (tol if atol is None else atol), (tol if rtol is None else rtol)
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    finite = np.isfinite(r64)
    diff = np.abs(g64 - r64)[finite]
    mag = np.abs(r64[finite])
    abs_err = float(diff.max()) if diff.size else 0.0
    rel_err = float((diff / np.maximum(mag, 1e-12)).max()) if diff.size else 0.0
    ok = bool(np.all(diff <= atol + rtol * mag))
    return OutputCheck(name, ok, abs_err, rel_err, "" if ok else f"exceeds atol {atol:g} + rtol {rtol:g}")


def _expose(model: onnx.ModelProto, graph: FusionGraph, names: Sequence[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for t in names:
        if t not in have:
            info = graph.tensors[t]
            out.graph.output.append(helper.make_tensor_value_info(t, info.dtype, None if info.shape is None else list(info.shape)))
    return out


def gpu_usable() -> bool:
    """True when stitched models can run their kernels here: CUDA EP and a built library."""
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return False
        from .runtime import library_path

        library_path(build=False)
        return True
    except Exception:
        return False


def _source(model: onnx.ModelProto, folder: str, name: str) -> bytes | str:
    """What ORT loads: the bytes, or for a model over 2 GiB a file with external data."""
    if not is_large(model):
        return model.SerializeToString()
    path = os.path.join(folder, name)
    save(model, path)
    return path


def runtime_session(source: bytes | str, gpu: bool, stitched: bool):
    """An ORT session for comparing an original with its stitched model: CPU, or the CUDA EP
    (the stitched one with the onnxstitch library)."""
    import onnxruntime as ort

    if not gpu:
        return ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    # TF32 off on both sides: MatMuls between groups must agree to float32 precision.
    cuda = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    if stitched:
        from .runtime import session

        return session(source, providers=cuda)
    return ort.InferenceSession(source, providers=cuda)


def verify(original: onnx.ModelProto, stitched: onnx.ModelProto, graph: FusionGraph,
           groups: Sequence[Group], *, seed: int = 0, dim_values: Mapping[str, int] | None = None,
           device: str = "auto", source: onnx.ModelProto | None = None) -> Verification:
    """Run both models on seeded random inputs and compare every graph output and every fused
    group's outputs (`groups` in the plan's topological order). Raises VerifyError naming the first group whose outputs differ. `source`:
    the model as the user gave it, when `original` is its normalized form (normalize.py); the
    graph outputs are then compared against it as well."""
    if not groups:
        return Verification("none", 0, 0.0, skipped="nothing was fused")
    gpu = gpu_usable() if device == "auto" else device == "gpu"
    exposed = [t for grp in groups for t in grp.outputs]
    ref_model = _expose(original, graph, exposed)
    new_model = _expose(stitched, graph, exposed)
    dims = {d: VERIFY_DIM for d in _symbolic_dims(original)}
    dims.update(dim_values or {})
    if not gpu:
        dims = {d: min(v, VERIFY_DIM) for d, v in dims.items()}
    feeds = random_feeds(original, seed, dims)
    with tempfile.TemporaryDirectory() as tmp:
        return _run_and_compare(_source(ref_model, tmp, "original.onnx"), _source(new_model, tmp, "stitched.onnx"),
                                original, graph, groups, feeds, gpu, exposed,
                                _source(source, tmp, "source.onnx") if source is not None else None)


def _run_and_compare(ref_src: bytes | str, new_src: bytes | str, original: onnx.ModelProto, graph: FusionGraph,
                     groups: Sequence[Group], feeds: dict, gpu: bool, exposed: list[str],
                     source_src: bytes | str | None = None) -> Verification:
    """Run the reference and the stitched model once each and compare; with `source_src`
    (the model as given, before normalization) its graph outputs are compared with the
    stitched run too."""
    where = "gpu" if gpu else "cpu"
    try:
        ref_sess = runtime_session(ref_src, gpu, stitched=False)
        names = [o.name for o in ref_sess.get_outputs()]
        expected = dict(zip(names, ortio.run(ref_sess, names, feeds)))
    except Exception as e:  # the original itself cannot run here: nothing to compare against
        log.warning("verification skipped: the original model does not run on ORT %s: %s", where.upper(), first_line(e))
        return Verification(where, 0, 0.0, skipped=f"original does not run on ORT {where.upper()}: {first_line(e)}")
    try:
        actual = dict(zip(names, ortio.run(runtime_session(new_src, gpu, stitched=True), names, feeds)))
    except Exception as e:
        raise VerifyError(f"verification failed on {where}: the stitched model does not run: {first_line(e)}") from e
    worst = 0.0
    # The plan's groups come in a topological order, so every group a TF32 group's rounding can
    # reach comes after it: once one has run, every later float32 comparison (and the graph
    # outputs) is held to TF32's accuracy.
    tf32 = False
    for grp in groups:
        tf32 = tf32 or grp.tf32
        half = any(graph.tensors[t].dtype in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) for t in grp.inputs)
        for t in grp.outputs:
            ok, rel, why = compare(actual[t], expected[t], half, tf32)
            worst = max(worst, rel)
            if not ok:
                raise VerifyError(f"verification failed on {where}: group {grp.name} "
                                  f"({', '.join(grp.labels[:4])}{', …' if len(grp.labels) > 4 else ''}) "
                                  f"output '{t}': {why}", grp.name)
    for o in original.graph.output:
        ok, rel, why = compare(actual[o.name], expected[o.name], tf32=tf32)
        worst = max(worst, rel)
        if not ok:
            raise VerifyError(f"verification failed on {where}: graph output '{o.name}': {why}")
    if source_src is not None:
        outs = [o.name for o in original.graph.output]
        for name, want in zip(outs, ortio.run(runtime_session(source_src, gpu, stitched=False), outs, feeds)):
            ok, _, why = compare(actual[name], want, tf32=tf32)
            if not ok:
                raise VerifyError(f"verification failed on {where}: graph output '{name}' against the model as given "
                                  f"(before normalization): {why}")
    return Verification(where, len(set(exposed) | {o.name for o in original.graph.output}), worst)


def _symbolic_dims(model: onnx.ModelProto) -> set[str]:
    return {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
