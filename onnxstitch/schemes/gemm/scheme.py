"""The gemm scheme behind the common interface (schemes/base.py): a library call, whose
KernelSource has no code (compile.py builds no image for it, rewrite.py writes none), or, where
the node carries a generated GEMM (generated.py), that GEMM's CUDA C++, built by nvcc."""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from ...graph import FusionGraph
from ...planned import Group
from .. import GEMM
from ..base import Matcher
from ..source import BROADCAST, HELPER_PREFIX, KernelSource
from . import generated, match
from .match import Generating, Match


def generating(options: Any) -> Generating | str | None:
    """Whether optimize's options (pipeline.Options: `generated_gemms` "auto", "on", "all" or
    "off"; `archs`) and this machine offer generated GEMMs (the exact-GELU chains; with "all",
    kernels beside cuBLASLt's too: match.py): only where every target is sm_90 (they run nowhere
    else); with "auto" only where this machine's GPU runs them (compute capability 9.0: the plan
    is measured there). None where they are not asked for, or why they cannot be."""
    mode = getattr(options, "generated_gemms", "off")
    if mode == "off" or {a.rstrip("a") for a in options.archs} != {"sm_90"}:
        return None
    sms = generated.local_sm_count()
    if mode == "auto" and sms is None:
        return None
    tools = generated.toolchain()
    if isinstance(tools, str):
        return f"generated GEMMs are off: {tools}"
    return Generating(exact=True, sm_count=sms or 132, beside=mode == "all")


def _find(g: FusionGraph, weights: Any, options: Any) -> match.Found:
    gen = generating(options)
    found = match.find(g, weights, gen if isinstance(gen, Generating) else None)
    if isinstance(gen, str):
        return match.Found(found.matches, found.refusals + (gen,))
    return found


# (Looked up at each call, so that what the match module holds is what runs.)
MATCHER = Matcher(
    stage="epilogues", prefix="e", enabled=lambda o: o.epilogues,
    find=lambda *a: _find(*a), group_of=lambda *a: match.group_of(*a), chosen=lambda *a: match.chosen(*a))


def transposed_back(m: Match) -> tuple[onnx.NodeProto, ...]:
    """Before the chain's own nodes in the fused function, where the node reads its weight
    transposed: the weight back as the product reads it."""
    if m.kmajor is None:
        return ()
    return (helper.make_node("Transpose", [m.weight], [m.b], name=f"{HELPER_PREFIX}transpose~{m.b}", perm=[1, 0]),)


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
        if spec.generated is not None:  # the generated GEMM's source (named after its code)
            kernel, code = name, generated.source(spec.generated)
        else:  # named after what it runs (there is no code to hash): the runtime's messages name it
            kernel = f"cublaslt_{spec.epilogue}{'_residual' if spec.residual else ''}_" \
                     f"{'f16' if spec.dtype == onnx.TensorProto.FLOAT16 else 'tf32' if spec.tf32 else 'f32'}"
            code = ""
        inputs = m.node_inputs
        return KernelSource(kernel, code, 1, inputs, (m.output,), (BROADCAST,) * len(inputs), (m.dtype,), spec,
                            fallback_before=transposed_back(m), constants=(m.kmajor,) if m.kmajor is not None else ())

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        spec, m = src.spec, group.payload
        library = "cuBLASLt" if spec.generated is None else \
            f"CUTLASS ({spec.generated.name})" + ("" if spec.epilogue.startswith("gelu_erf") else " or cuBLASLt")
        library += ", weight K-major" if m.kmajor is not None else ""
        return {"scheme": self.name, "library": library, "epilogue": spec.epilogue, "residual": spec.residual,
                "k": m.k, "n": m.n, "trans_a": spec.trans_a, "trans_b": spec.trans_b, "tf32": spec.tf32}

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        return [helper.make_attribute(k, v) for k, v in src.spec.attributes().items()]


SCHEME = Gemm()
