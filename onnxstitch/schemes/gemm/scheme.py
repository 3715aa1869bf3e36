"""The gemm scheme behind the common interface (schemes/base.py): a library call, so its
KernelSource has no code (compile.py builds no image for it, rewrite.py writes none)."""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ...graph import FusionGraph
from ...planned import Group
from .. import GEMM
from ..base import Matcher
from ..source import BROADCAST, KernelSource
from . import match
from .match import Match

# (Looked up at each call, so that what the match module holds is what runs.)
MATCHER = Matcher(
    stage="epilogues", prefix="e", enabled=lambda o: o.epilogues,
    find=lambda g, _weights: match.find(g), group_of=lambda *a: match.group_of(*a), chosen=lambda *a: match.chosen(*a))


class Gemm:
    name = GEMM
    matcher = MATCHER
    relayout = None
    # The chain's nodes as they are: the fallback runs the product, its Adds and its activation.
    fallback_verbatim = True

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        return False  # its groups are its matcher's

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        m: Match = group.payload
        spec = m.spec
        # Named after what it runs (there is no code to hash): the runtime's messages name it.
        kernel = f"cublaslt_{spec.epilogue}{'_residual' if spec.residual else ''}_" \
                 f"{'f16' if spec.dtype == onnx.TensorProto.FLOAT16 else 'tf32' if spec.tf32 else 'f32'}"
        return KernelSource(kernel, "", 1, m.inputs, (m.output,), (BROADCAST,) * len(m.inputs), (m.dtype,), spec)

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        spec, m = src.spec, group.payload
        return {"scheme": self.name, "library": "cuBLASLt", "epilogue": spec.epilogue, "residual": spec.residual,
                "k": m.k, "n": m.n, "trans_a": spec.trans_a, "trans_b": spec.trans_b, "tf32": spec.tf32}

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        return [helper.make_attribute(k, v) for k, v in src.spec.attributes().items()]


SCHEME = Gemm()
