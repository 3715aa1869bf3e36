"""The gemm scheme's launch facts (docs/abi.md, shape rule "gemm"): one cuBLASLt matmul with an
epilogue, no generated kernel."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from onnx import TensorProto as TP

from .. import GEMM
from ..source import Spec
from . import generated
from .generated import Config

ATTRIBUTE_PREFIX = "gemm_"
# cuBLASLt's epilogues this scheme runs, by the code the node carries (gemm_epilogue): the plain
# product (a residual may still be added), with a bias, with a bias and an activation, or with
# an activation alone (products without a bias: LLaMA's, or a zero bias an exporter dropped).
# The exact (erf) GELU is no cuBLASLt epilogue: only a generated GEMM (generated.py) runs it.
EPILOGUES = ("none", "bias", "relu_bias", "gelu_bias", "relu", "gelu", "gelu_erf_bias", "gelu_erf")
BIASED = ("bias", "relu_bias", "gelu_bias", "gelu_erf_bias")
LIBRARY_EPILOGUES = EPILOGUES[:6]
DTYPES = (TP.FLOAT, TP.FLOAT16)


@dataclass(frozen=True)
class GemmSpec(Spec):
    """Y = epilogue(op(A)·op(B) [+ R]) with A [.., M, K] (rank 2 or 3, rows flattened), B a
    constant [K, N] ([N, K] when `trans_b`), the bias [N] of the epilogue and R (`residual`) of
    Y's shape added through cuBLASLt's β·C before the activation. With `generated`, the node
    also carries a generated GEMM of that configuration (its image), B stored [N, K]."""

    scheme: ClassVar[str] = GEMM
    shape_rule: ClassVar[str] = "gemm"
    entry_suffixes: ClassVar[tuple[str, ...]] = ()  # a library call: no image, no entry
    epilogue: str  # one of EPILOGUES; GELU is the tanh form, cuBLASLt's only one
    residual: bool
    dtype: int  # of A, B, the bias, R and Y alike: TensorProto FLOAT or FLOAT16
    tf32: bool  # float32 products on TF32 tensor cores (ONNX Runtime's CUDA EP default)
    trans_a: bool = False  # A stored [K, M] (Gemm's transA; rank 2 only)
    trans_b: bool = False  # B stored [N, K] (Gemm's transB)
    # The algorithm: the fastest of cuBLASLt's heuristic's first 16, timed at the first call; off,
    # the heuristic's first (the benchmark's baseline).
    timed: bool = True
    generated: Config | None = None

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"gemm epilogue {self.epilogue!r}: one of {', '.join(EPILOGUES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"gemm dtype {self.dtype}: float32 or float16")
        if self.epilogue not in LIBRARY_EPILOGUES and self.generated is None:
            raise ValueError(f"gemm epilogue {self.epilogue!r} runs only as a generated GEMM")
        if self.generated is not None and (self.trans_a or self.trans_b != self.generated.b_kmajor):
            raise ValueError("a generated GEMM reads A [M, K] and its weight as its configuration says: [N, K] "
                             "(trans_b on) or, in half, [K, N] (trans_b off); trans_a off")

    @property
    def builds_own_image(self) -> bool:
        return self.generated is not None

    def build_image(self, source: str, name: str, cache: Path) -> tuple[str, bytes]:
        """The generated GEMM's shared object (nvcc; generated.build)."""
        return generated.ARCH, generated.build(source, name, cache)

    @property
    def biased(self) -> bool:
        return self.epilogue in BIASED

    @property
    def input_count(self) -> int:
        """A, B, [the bias], [R]: the node's inputs in this order."""
        return 2 + self.biased + self.residual

    def attributes(self) -> dict[str, int]:
        """The node attributes the runtime reads (docs/abi.md): gemm_<field>, booleans as 0/1,
        the epilogue by its index in EPILOGUES; the dtype travels as output_dtypes."""
        return {ATTRIBUTE_PREFIX + "epilogue": EPILOGUES.index(self.epilogue),
                ATTRIBUTE_PREFIX + "residual": int(self.residual), ATTRIBUTE_PREFIX + "tf32": int(self.tf32),
                ATTRIBUTE_PREFIX + "trans_a": int(self.trans_a), ATTRIBUTE_PREFIX + "trans_b": int(self.trans_b),
                ATTRIBUTE_PREFIX + "timed": int(self.timed)}
