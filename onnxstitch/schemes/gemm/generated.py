"""The gemm scheme's generated GEMMs (issue 38): CUTLASS 3.x SM90 kernels with the epilogue
inside, for what cuBLASLt's epilogues cannot run: the exact GELU (match.py offers nothing else:
measured, the kernels were no faster than cuBLASLt on a K-major weight for the rest).

Why CUTLASS (docs/perf-notes.md, "Decision: CUTLASS"): in TF32 its warp-specialized kernel
matches cuBLAS at BERT's and LLaMA's shapes, and with the exact GELU inside it beats cuBLAS plus
a separate GELU kernel at all eight (1.01–1.27×, H200). Its host side builds TMA descriptors per
set of pointers, so a kernel is not a bare cubin: each configuration is built by nvcc, with the
nvidia-cutlass wheel's headers, into a small shared object (cutlass_gemm.cu.in) that exports
three C functions; the fused node carries it as its image and the runtime loads it from memory
(docs/abi.md, "Generated GEMMs"). It runs only on compute capability 9.0 (sm_90a code), so the
plan offers one only when every target is sm_90. (A node whose epilogue cuBLASLt also runs may
carry one too: the runtime then times both; the optimizer writes none such now.)

Building takes nvcc about a minute per configuration on two cores; objects are cached on disk by
what they are built from (the source with its #defines, nvcc's version, CUTLASS's), and built
in parallel with the NVRTC kernels (compile.py).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onnx import TensorProto as TP

from ...errors import CompileError

log = logging.getLogger(__name__)

TEMPLATE = Path(__file__).with_name("cutlass_gemm.cu.in")
ARCH = "sm_90a"  # the only target: wgmma and TMA are Hopper's (compute capability 9.0 exactly)
# Activations by the code the template reads (STITCH_ACT).
ACTIVATIONS = ("", "relu", "gelu", "gelu_erf")
# The tile's N: 128, or 64 where 128-wide tiles are too few for the multiprocessors (`tile_n`).
TILE_M = 128
WIDE, NARROW = 128, 64
# Build time cap per object: nvcc takes ~60 s for one on two cores.
NVCC_TIMEOUT_S = 600
_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
          "-shared", "-Xcompiler=-fPIC,-fvisibility=hidden", "-cudart", "static")


@dataclass(frozen=True)
class Config:
    """One generated GEMM: its dtype, epilogue and tile."""

    dtype: int  # TensorProto FLOAT (TF32 tensor cores) or FLOAT16
    activation: str  # one of ACTIVATIONS
    bias: bool
    residual: bool
    tile_n: int = WIDE
    stream_k: bool = False
    # The weight [N, K] (K-major; TF32 needs it) or, in half, [K, N] as the model stores it.
    b_kmajor: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in (TP.FLOAT, TP.FLOAT16):
            raise ValueError(f"generated GEMM dtype {self.dtype}: float32 or float16")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"generated GEMM activation {self.activation!r}: one of {ACTIVATIONS}")
        if self.tile_n not in (WIDE, NARROW):
            raise ValueError(f"generated GEMM tile N {self.tile_n}: {WIDE} or {NARROW}")
        if not self.b_kmajor and self.dtype != TP.FLOAT16:
            raise ValueError("a float32 generated GEMM reads its weight K-major (TF32 wgmma reads only that)")

    @property
    def name(self) -> str:
        """What the kernel is, for reports and the runtime's messages."""
        parts = ["cutlass", "f16" if self.dtype == TP.FLOAT16 else "tf32", f"n{self.tile_n}"]
        parts += ["bias"] * self.bias + [self.activation] * bool(self.activation) + ["residual"] * self.residual
        return "_".join(parts + ["sk"] * self.stream_k + ["kn"] * (not self.b_kmajor))

    def defines(self) -> str:
        return "".join(f"#define {k} {int(v)}\n" for k, v in (
            ("STITCH_HALF", self.dtype == TP.FLOAT16), ("STITCH_ACT", ACTIVATIONS.index(self.activation)),
            ("STITCH_BIAS", self.bias), ("STITCH_RESIDUAL", self.residual), ("STITCH_TILE_N", self.tile_n),
            ("STITCH_STREAM_K", self.stream_k), ("STITCH_B_KMAJOR", self.b_kmajor)))


def tile_n(m: int, n: int, sm_count: int = 132) -> int:
    """The tile's N for a product of M × N at the planning sizes: 64 where 128-wide tiles would
    number fewer than one and a half waves of the multiprocessors. Measured on an H200
    (scripts/bench_cutlass_configs.py, bench/results/nvidia-h200/wave3l): 64-wide tiles were
    faster at all of BERT's M = 1024 products (48, 144 and 192 tiles of 128: 0.70-0.96×), slower
    at a LLaMA layer's M = 2048 ones (256 tiles and more: 1.4-1.6×)."""
    tiles = -(-m // TILE_M) * -(-n // WIDE)
    return NARROW if tiles < 1.5 * sm_count else WIDE


def source(config: Config) -> str:
    """The configuration's CUDA C++: its #defines, then the template."""
    return f"// {config.name}\n" + config.defines() + TEMPLATE.read_text()


@dataclass(frozen=True)
class Toolchain:
    """nvcc and CUTLASS's headers, as found on this machine."""

    nvcc: str
    include: tuple[str, ...]
    version: str  # nvcc's and CUTLASS's, for the cache key


def _cutlass_root() -> Path | str:
    """CUTLASS's source folder (include/, tools/util/include/), or why it is not here."""
    env = os.environ.get("ONNXSTITCH_CUTLASS")
    if env:
        return Path(env) if (Path(env) / "include" / "cutlass").is_dir() else \
            f"ONNXSTITCH_CUTLASS={env} holds no include/cutlass"
    try:
        import cutlass_library
    except ImportError:
        return "CUTLASS's headers are not installed (pip install nvidia-cutlass)"
    root = Path(cutlass_library.__file__).parent / "source"
    return root if (root / "include" / "cutlass").is_dir() else f"{root} holds no include/cutlass"


def _nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=1)
def toolchain() -> Toolchain | str:
    """nvcc and CUTLASS, or why generated GEMMs cannot be built here (one line)."""
    if os.environ.get("ONNXSTITCH_GENERATED_GEMMS", "1") == "0":
        return "ONNXSTITCH_GENERATED_GEMMS=0"
    nvcc = _nvcc()
    if nvcc is None:
        return "nvcc is not found (CUDA_HOME, /usr/local/cuda, PATH)"
    root = _cutlass_root()
    if isinstance(root, str):
        return root
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"{nvcc} --version failed: {e}"
    release = next((line.strip() for line in out.splitlines() if "release" in line), out.strip()[-80:])
    header = root / "include" / "cutlass" / "version.h"
    version = header.read_text() if header.is_file() else ""
    digest = hashlib.sha256((release + version).encode()).hexdigest()[:16]
    return Toolchain(nvcc, (str(root / "include"), str(root / "tools" / "util" / "include")), f"{release} {digest}")


@functools.lru_cache(maxsize=1)
def local_sm_count() -> int | None:
    """The multiprocessors of this machine's first GPU where it is of compute capability 9.0
    (what generated GEMMs run on), else None (no GPU, no driver, another GPU)."""
    try:
        from cupy.cuda import runtime
    except ImportError:
        return None
    try:
        if runtime.getDeviceCount() < 1:
            return None
        props = runtime.getDeviceProperties(0)
    except Exception:  # noqa: BLE001 - no driver, no device: none here
        return None
    return int(props["multiProcessorCount"]) if (props["major"], props["minor"]) == (9, 0) else None


def build(text: str, name: str, cache: Path) -> bytes:
    """The shared object of a generated GEMM's source `text`, built by nvcc or taken from the
    cache in `cache` (keyed by the text, the flags and the toolchain's versions)."""
    tools = toolchain()
    if isinstance(tools, str):
        raise CompileError(f"cannot build the generated GEMM {name}: {tools}")
    key = hashlib.sha256("\0".join((text, *_FLAGS, tools.version)).encode()).hexdigest()[:24]
    path = cache / "gemm" / f"{key}.so"  # (by content alone: the name is the code's hash or the config's)
    if path.is_file():
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onnxstitch-gemm-") as tmp:
        cu, so = Path(tmp) / f"{name}.cu", Path(tmp) / f"{name}.so"
        cu.write_text(text)
        cmd = [tools.nvcc, *_FLAGS, *(f"-I{d}" for d in tools.include), str(cu), "-o", str(so)]
        log.debug("building %s: %s", name, " ".join(cmd))
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise CompileError(f"nvcc took over {NVCC_TIMEOUT_S} s for the generated GEMM {name}") from e
        if done.returncode != 0:
            first = next((x for x in done.stderr.splitlines() if "error" in x), done.stderr[-300:])
            raise CompileError(f"nvcc failed for the generated GEMM {name}: {first}", done.stderr, text)
        data = so.read_bytes()
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(data)
    os.replace(partial, path)  # whole or absent, for other processes building the same
    return data
