"""ONNX Runtime sessions for running a model and its stitched form side by side: on the CPU, or
on the CUDA EP (the stitched model with the onnxstitch library), with the model's weights held
apart (weights.py) and the user's custom-op libraries registered. Verification, the gate and
shape probing all open their sessions here."""
from __future__ import annotations

import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from . import ortio
from .load import is_large, save
from .weights import Weights

log = logging.getLogger(__name__)

# Domains ONNX Runtime implements itself (ours included, through the onnxstitch library).
ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.onnxstitch"})


def library_domains(model: onnx.ModelProto) -> set[str]:
    """Op domains of `model` that ONNX Runtime knows only from a custom-op library (neither its
    own nor the model's local functions')."""
    return {n.domain for n in model.graph.node} - ORT_DOMAINS - {f.domain for f in model.functions}


def runtime_session(source: bytes | str, gpu: bool, stitched: bool, model: onnx.ModelProto | None = None,
                    weights: Weights | None = None, libraries: Sequence[str] = (), tf32: bool = False,
                    fold: bool = True):
    """An ORT session for comparing an original with its stitched model: CPU, or the CUDA EP
    (the stitched one with the onnxstitch library). `weights` supply the payloads of `model`'s
    stubs (weights.py), `model` being what `source` holds (passed through
    `Weights.session_model`, as Runner.open does); `libraries`: custom-op libraries the model's
    own ops need (ortio.custom_op_libraries). `tf32`: let the CUDA EP's GEMMs and convolutions
    round their inputs to TF32, as stock ORT does by default (off for comparisons). `fold`:
    ORT's constant folding on (off for a model whose joined weights are Concat nodes: folded,
    each session held a second copy of them, Qwen2-0.5B's 0.4 GB; run, one at a time)."""
    import onnxruntime as ort

    options = ortio.with_custom_ops(ort.SessionOptions(), libraries)
    if weights is not None and model is not None:
        options = weights.session_options(model, options)
    options.log_severity_level = 4  # a failing run is reported by its exception, in one line
    # Each session runs once: prepacked copies of the weights would only double its memory.
    options.add_session_config_entry("session.disable_prepacking", "1")
    kw = {} if fold else {"disabled_optimizers": ["ConstantFolding"]}
    if not gpu:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"], **kw)
    # TF32 off on both sides: MatMuls between groups must agree to float32 precision.
    # cuDNN's heuristic convolution algorithms: an exhaustive search costs seconds per session of a
    # CNN (EfficientNet at B7 widths: verification took 30 s on an H200), and nothing here is timed.
    cuda = [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0", "cudnn_conv_algo_search": "HEURISTIC"}),
            "CPUExecutionProvider"]
    if stitched:
        from .runtime import session

        return session(source, providers=cuda, sess_options=options, **kw)
    return ort.InferenceSession(source, options, providers=cuda, **kw)


@dataclass(frozen=True)
class Runner:
    """Where and how verification runs models: on the GPU (the stitched model with its real
    kernels) or the CPU (through its fallback functions), the payloads of the models' weight
    stubs (weights.py), and the user's custom-op libraries registered in every session."""

    gpu: bool
    weights: Weights | None = None
    libraries: tuple[str, ...] = ()
    tf32: bool = False  # TF32 in ORT's own GEMMs and convolutions (verify's envelope run)

    @property
    def where(self) -> str:
        return "gpu" if self.gpu else "cpu"

    def open(self, model: onnx.ModelProto, stitched: bool):
        """An ORT session of `model`."""
        large = is_large(model)  # over 2 GiB even without the detached weights: through a file
        if self.weights is not None:
            # ORT joins merged weights itself and, given bytes, maps external data files rather
            # than copy them from memory (weights.py)
            model = self.weights.session_model(model, files=not large)
        with tempfile.TemporaryDirectory() as tmp:
            if large:
                source: bytes | str = os.path.join(tmp, "model.onnx")
                save(model, source)
            else:
                source = model.SerializeToString()
            return runtime_session(source, self.gpu, stitched, model, self.weights, self.libraries, self.tf32,
                                   fold=not Weights.has_joins(model))

    def run(self, model: onnx.ModelProto, stitched: bool, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output of `model` on ORT, by name."""
        began = time.monotonic()
        sess = self.open(model, stitched)
        made = time.monotonic()
        names = [o.name for o in sess.get_outputs()]
        out = dict(zip(names, ortio.run(sess, names, feeds)))
        log.info("%s session of a %s model (%d nodes, %d outputs%s) made in %.2f s, ran in %.2f s", self.where,
                 "stitched" if stitched else "stock", len(model.graph.node), len(names), ", TF32" if self.tf32 else "",
                 made - began, time.monotonic() - made)
        return out

    def run_together(self, jobs: Sequence[tuple[onnx.ModelProto, bool]],
                     feeds: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray] | Exception]:
        """`run` of each (model, stitched) job on the same feeds: its outputs, or the exception
        it raised. On the GPU, where they fit its free memory, the jobs build their sessions and
        run in threads at once (ORT builds a session mostly outside the GIL, and building is
        most of a verification: BERT-base's four sessions took 4 s one after another); else one
        after another, stopping after a failing first job (the reference the others need)."""
        def one(job: tuple[onnx.ModelProto, bool]) -> dict[str, np.ndarray] | Exception:
            try:
                return self.run(job[0], job[1], feeds)
            except Exception as e:  # noqa: BLE001 - the caller names what failed
                return e

        if len(jobs) > 1 and self._fit_together(jobs):
            with ThreadPoolExecutor(len(jobs), thread_name_prefix="onnxstitch-verify") as pool:
                return list(pool.map(one, jobs))
        results = [one(jobs[0])] if jobs else []
        if results and isinstance(results[0], Exception):
            return results + [results[0]] * (len(jobs) - 1)
        return results + [one(job) for job in jobs[1:]]

    def _fit_together(self, jobs: Sequence[tuple[onnx.ModelProto, bool]]) -> bool:
        """Whether the jobs run at once: on the GPU, where every job's weights, twice over (ORT's
        working copies), fit in half its free memory and in half the host's available memory
        (sessions built at once hold their weights at once: BERT-base's peak rose from 3.2 to
        4.5 GB on an H200 host). On the CPU they run one after another (its cores run the
        sessions)."""
        if not self.gpu:
            return False
        try:
            from cupy_backends.cuda.api import runtime

            free, _ = runtime.memGetInfo()
            host = _host_available()
        except Exception:  # noqa: BLE001 - no reading: one after another
            return False
        need = sum(m.ByteSize() + (self.weights.bytes_in(m) if self.weights is not None else 0) for m, _ in jobs)
        return 2 * need < min(free, host) / 2


def _host_available() -> int:
    """Bytes of host memory available to a new allocation: Linux's MemAvailable (free memory and
    the page cache it can drop), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
