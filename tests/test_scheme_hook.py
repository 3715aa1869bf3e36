"""A new scheme touches only its own code and the registry line: a demonstration scheme that
runs every Neg node as its own kernel ("negate"), defined here as its folder would define it
(a Spec, a generator, a Matcher, the Scheme object) and added to the registry, is proposed to
the plan, chosen, compiled by NVRTC, written as a FusedKernel node with its fallback, reported
under its stage, and the written model computes what the original does, with no change to the
pipeline, the plan or the rewrite."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import parser

import onnxstitch
from onnxstitch.graph import FusionGraph
from onnxstitch.planned import Group
from onnxstitch.schemes import registry
from onnxstitch.schemes.base import Matcher
from onnxstitch.schemes.source import ARGS_STRUCT, FULL, KernelSource, Spec

from .stitching import fresh_seed

NEGATE = "negate"


# ---- what schemes/negate/ would hold ------------------------------------------------------------


@dataclass(frozen=True)
class NegateSpec(Spec):
    scheme: ClassVar[str] = NEGATE
    shape_rule: ClassVar[str] = "broadcast"
    entry_suffixes: ClassVar[tuple[str, ...]] = ("_s64",)


@dataclass(frozen=True)
class NegMatch:
    node: int
    label: str

    def describe(self) -> str:
        return f"{self.label}: one kernel"


@dataclass(frozen=True)
class Found:
    matches: tuple[NegMatch, ...] = ()
    refusals: tuple[str, ...] = ()


def _find(g: FusionGraph, _weights: Any, _options: Any) -> Found:
    nodes = tuple(NegMatch(n.index, n.label) for n in g.nodes if n.op_type == "Neg")
    return Found(nodes, tuple(f"{n.label}: not a Neg" for n in g.nodes if n.op_type == "MatMul"))


def _group_of(g: FusionGraph, cost: Any, name: str, m: NegMatch) -> Group:
    n = g.nodes[m.node]
    # Priced below the stock node: the plan takes it wherever the node is not fused otherwise.
    return Group(name, (m.node,), tuple(n.inputs), tuple(n.outputs), g.tensors[n.outputs[0]].shape, 0, 0.1,
                 (n.label,), scheme=NEGATE, payload=m)


def _chosen(found: Found, plan: Any) -> Found:
    taken = {grp.payload for grp in plan.groups if grp.scheme == NEGATE}
    return Found(tuple(m for m in found.matches if m in taken), found.refusals)


class Negate:
    name = NEGATE
    fallback_verbatim = True
    relayout = None

    def claims(self, graph: FusionGraph, nodes: frozenset[int]) -> bool:
        return False  # its groups are its matcher's
    matcher = Matcher(stage="negations", prefix="n", enabled=lambda _o: True, find=_find, group_of=_group_of,
                      chosen=_chosen)

    def generate(self, graph: FusionGraph, name: str, group: Group) -> KernelSource:
        n = graph.nodes[group.payload.node]
        code = (f"{ARGS_STRUCT}\nextern \"C\" __global__ void {name}_s64(const StitchArgs a) {{\n"
                f"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < a.n;"
                f" i += (long long)gridDim.x * blockDim.x)\n"
                f"    ((float*)a.out[0])[i] = -((const float*)a.in[0])[i];\n}}\n")
        return KernelSource(name, code, 1, tuple(n.inputs), tuple(n.outputs), (FULL,),
                            (graph.tensors[n.outputs[0]].dtype,), NegateSpec())

    def describe(self, graph: FusionGraph, group: Group, src: KernelSource) -> dict[str, Any]:
        return {"scheme": self.name}

    def attributes(self, src: KernelSource) -> list[onnx.AttributeProto]:
        return []


# ---- the registry line --------------------------------------------------------------------------


@pytest.fixture
def negate_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.SCHEMES, NEGATE, Negate())


def test_a_scheme_added_through_the_registry_alone_runs_end_to_end(negate_registered: None) -> None:
    model = parser.parse_model("""<ir_version: 10, opset_import: ["" : 18]>
g (float[N, 300] x) => (float[N, 300] y) {
  a = MatMul(x, x2)
  b = Neg(a)
  y = MatMul(b, x2)
}""".replace("float[N, 300] x)", "float[N, 300] x, float[300, 300] x2)"))
    res = onnxstitch.optimize(model, shapes={"N": [4]})
    groups = res.report.plan.groups
    assert [g.scheme for g in groups].count(NEGATE) == 1, [(g.scheme, g.labels) for g in groups]
    notes = res.report.notes["negations"]  # reported under the scheme's own stage
    assert notes.rewrites == ("Neg#1 (Neg): one kernel",) and len(notes.refusals) == 2
    (node,) = [n for n in res.model.graph.node if n.op_type == "FusedKernel"
               and any(g.name == n.overload and g.scheme == NEGATE for g in groups)]
    (fn,) = [f for f in res.model.functions if f.overload == node.overload]
    assert [n.op_type for n in fn.node] == ["Neg"]  # its fallback: the node as it was
    rng = np.random.default_rng(fresh_seed())
    feeds = {"x": rng.standard_normal((3, 300)).astype(np.float32),
             "x2": rng.standard_normal((300, 300)).astype(np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    np.testing.assert_allclose(run(res.model)[0], run(model)[0], rtol=1e-5, atol=1e-4)
