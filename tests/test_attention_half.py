"""Attention chains in float16 and bfloat16 on the CPU: the matcher takes every form the float32
kernel takes in either type (one element type per chain), the spec names its type, the plan
prices a half chain by its bytes and its products at twice TF32's rate, the report says which
type, and a float16 core optimized end to end verifies at half precision and runs through its
function. (The kernels themselves: tests/test_attention_host.py.)"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP

import onnxstitch
from onnxstitch.cost import CostModel
from onnxstitch.schemes.attention import codegen, match as attention

from .attention_models import (CORES, PROJECTED, SDPA, Core, attention_graph, core_feeds, core_model, core_reference,
                               projected_model, relative_error, sdpa_model)
from .stitching import fresh_seed

HALVES = {"float16": TP.FLOAT16, "bfloat16": TP.BFLOAT16}


def typed(core: Core, dtype: str) -> Core:
    return dataclasses.replace(core, dtype=HALVES[dtype])


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("core", CORES, ids=lambda c: c.id)
def test_every_half_core_is_one_chain_of_its_type(core: Core, dtype: str) -> None:
    g, f = attention_graph(core_model(typed(core, dtype)))
    (m,) = f.matches
    assert m.dtype == HALVES[dtype] and f"attention in {dtype}" in m.describe()
    spec = codegen.generate(g, "k", m).spec
    assert spec.half and spec.attributes()["attention_dtype"] == HALVES[dtype]
    # The K and V tiles of 2-byte elements: half of float32's at the same tile of keys.
    g32, f32 = attention_graph(core_model(core))
    keyed = codegen.AttentionOptions(keys=64)
    assert codegen.generate(g, "k", m, keyed).spec.shared_bytes < codegen.generate(g32, "k", f32.matches[0], keyed).spec.shared_bytes


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_half_sdpa_forms_are_matched(s, dtype: str) -> None:
    s = dataclasses.replace(s, core=typed(s.core, dtype))
    (m,) = attention_graph(sdpa_model(s))[1].matches
    fq, fk = s.factors  # the constants in the core's type
    assert m.dtype == HALVES[dtype] and m.guarded == s.guard and m.scale == pytest.approx(fq * fk, rel=1e-12)


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("p", PROJECTED, ids=lambda p: p.id)
def test_half_projections_are_read_by_the_kernel(p, dtype: str) -> None:
    p = dataclasses.replace(p, core=typed(p.core, dtype))
    (m,) = attention_graph(projected_model(p, np.random.default_rng(0)))[1].matches
    assert len(m.projections) == 3 and m.heads == p.core.lead[1] and m.biased == p.biased


def test_other_types_are_refused_with_why() -> None:
    f = attention_graph(core_model(CORES[2], dtype=TP.DOUBLE))[1]
    assert not f.matches and "generated for float32, float16, bfloat16" in f.refusals[0]


def _group(core: Core) -> tuple[float, float, float]:
    """(predicted µs, bytes, the products' flops computed here from the core's dims)."""
    g, f = attention_graph(core_model(core))
    grp = attention.group_of(g, CostModel(), "a0", f.matches[0])
    lead = int(np.prod(core.lead))
    return grp.predicted_us, grp.predicted_bytes, 4.0 * lead * core.sq * core.sk * core.d


@pytest.mark.parametrize("dtype", list(HALVES))
def test_half_chains_cost_half_the_bytes_and_products_at_twice_the_rate(dtype: str) -> None:
    cost = CostModel()
    # BERT's core: memory-bound, the bytes halve.
    bert = Core((8, 12), 128, 128, 64, (8, 1, 1, 128))
    us32, bytes32, _ = _group(bert)
    us16, bytes16, _ = _group(typed(bert, dtype))
    assert bytes16 * 2 == bytes32
    assert us16 == pytest.approx(cost.launch_us + bytes16 / (cost.bandwidth_gbs * 1e3))
    assert us32 == pytest.approx(cost.launch_us + bytes32 / (cost.bandwidth_gbs * 1e3))
    # 4096 tokens, one head: the products dominate, at the dtype's tensor rate.
    long = Core((1, 1), 4096, 4096, 64, None)
    us32, _, flops = _group(long)
    us16, _, _ = _group(typed(long, dtype))
    assert us32 - cost.launch_us == pytest.approx(flops / (attention.TENSOR_TFLOPS[TP.FLOAT] * 1e6))
    assert us16 - cost.launch_us == pytest.approx((us32 - cost.launch_us) / 2)


def test_a_float16_core_is_verified_at_half_precision_and_runs_through_its_function() -> None:
    core = Core((2, 3), 40, 40, 32, (2, 1, 1, 40), dtype=TP.FLOAT16)
    res = onnxstitch.optimize(core_model(core))
    (grp,) = res.report.plan.groups
    assert grp.scheme == "attention" and not grp.tf32 and not res.report.dropped
    (kernel,) = res.report.kernels
    assert kernel["dtype"] == "float16" and not kernel["tf32"]
    assert res.report.verification is not None and res.report.verification.tensors_checked == 1
    node = res.model.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["attention_dtype"] == TP.FLOAT16
    feeds = core_feeds(core, np.random.default_rng(fresh_seed()))
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert got.dtype == np.float16 and relative_error(got, core_reference(core, feeds)) <= 5e-3
