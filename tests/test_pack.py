"""Kernel packing (pack.py): independent elementwise groups over one iteration space become one
kernel; the stitched model still matches an independent numpy reference (through its fallback
on CPU); what is not packed says why; packed plans stay acyclic on random graphs."""
from __future__ import annotations

import itertools

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto as TP
from onnx import helper

import onnxstitch
from models.fuzz import run_cpu
from onnxstitch import pack
from onnxstitch.candidates import legality
from onnxstitch.inputs import random_feeds
from onnxstitch.plan import make_plan

from .layout_models import attention_projections
from .stitching import assert_close, fresh_seed, prepared
from .test_plan_properties import _contracted_order, _reaches, random_graphs

PLAN = {"batch": [8], "seq": [128]}


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_attention_projections_pack_into_one_kernel_and_match_numpy(dtype) -> None:
    model, ref = attention_projections(4, 16, dtype)
    res = onnxstitch.optimize(model, shapes=PLAN, archs=("sm_90",))
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    (grp,) = res.report.to_json()["plan"]["groups"]
    assert len(grp["packed_from"]) == 3 and grp["outputs"] == ["y0", "y1", "y2"]
    # Q and V keep the innermost axis (vector stores); K's moves it (the tile).
    assert [v["stores"] for v in grp["kernel"]["views"]] == ["vector", "tile", "vector"]
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3, "seq": 5})
    for got, want in zip(run_cpu(res.model, feeds), ref(feeds)):
        assert_close(got, want.astype(got.dtype), "packed projections")


def test_no_pack_keeps_one_kernel_per_group() -> None:
    model, _ = attention_projections(4, 16)
    res = onnxstitch.optimize(model, shapes=PLAN, archs=("sm_90",), verify=False, pack=False)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"] * 3
    assert all("packed_from" not in g for g in res.report.to_json()["plan"]["groups"])
    packed = onnxstitch.optimize(model, shapes=PLAN, archs=("sm_90",), verify=False).report.plan
    assert packed.kernels_after == res.report.plan.kernels_after - 2


def _plan(model: onnx.ModelProto):
    _, g = prepared(model)
    return g, make_plan(g)


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "m", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _vi(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TP.FLOAT, shape)


def test_two_tiles_are_not_packed_and_say_why() -> None:
    # Two views that each move the innermost axis to a different place need two tiles.
    model, _ = attention_projections(4, 16, perms=((0, 2, 3, 1), (0, 3, 1, 2)))
    g, plan = _plan(model)
    packed = pack.pack(g, plan)
    assert len(packed.groups) == 2
    (why,) = packed.pack_refusals
    assert "one tile" in why.reason


def test_inputs_beyond_the_kernel_limit_start_a_new_pack() -> None:
    n = 17  # 2 inputs each: 16 groups fill the 32 input slots
    nodes = [x for j in range(n) for x in (helper.make_node("Add", [f"a{j}", f"b{j}"], [f"s{j}"]),
                                          helper.make_node("Relu", [f"s{j}"], [f"y{j}"]))]
    ins = [_vi(f"{p}{j}", ["batch", 8]) for j in range(n) for p in "ab"]
    g, plan = _plan(_model(nodes, ins, [_vi(f"y{j}", ["batch", 8]) for j in range(n)]))
    packed = pack.pack(g, plan)
    assert sorted(len(grp.parts) for grp in packed.groups) == [0, 16]
    assert any("34 inputs exceed" in r.reason for r in packed.pack_refusals)
    assert packed.kernels_after == plan.kernels_after - 15
    assert packed.predicted_us_after < plan.predicted_us_after


def test_row_groups_are_not_packed() -> None:
    nodes = [x for j in range(2) for x in (helper.make_node("Mul", [f"x{j}", f"x{j}"], [f"m{j}"]),
                                          helper.make_node("Softmax", [f"m{j}"], [f"y{j}"], axis=-1))]
    g, plan = _plan(_model(nodes, [_vi(f"x{j}", ["batch", 64]) for j in range(2)],
                           [_vi(f"y{j}", ["batch", 64]) for j in range(2)]))
    packed = pack.pack(g, plan)
    assert len(packed.groups) == 2
    assert [r.reason for r in packed.pack_refusals] == ["rows kernels are not packed (only elementwise groups share a launch)"]


def test_a_group_that_depends_on_another_is_not_packed_with_it() -> None:
    # y = relu(x + 1) feeds a MatMul whose result feeds the second group of the same shape.
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Mul", ["m", "x"], ["p"]), helper.make_node("Tanh", ["p"], ["y"])]
    g, plan = _plan(_model(nodes, [_vi("x", [8, 8]), _vi("w", [8, 8])], [_vi("y", [8, 8])]))
    packed = pack.pack(g, plan)
    assert [grp.nodes for grp in packed.groups] == [grp.nodes for grp in plan.groups] and len(plan.groups) == 2
    assert pack.levels(g, [grp.nodes for grp in plan.groups]) == [0, 2]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_nodes=16))
def test_packed_plans_are_acyclic_ordered_and_made_of_planned_groups(graph):
    plan = make_plan(graph)
    packed = pack.pack(graph, plan)
    planned = {grp.nodes for grp in plan.groups}
    covered = sorted(i for grp in packed.groups for i in grp.nodes)
    assert covered == sorted(i for grp in plan.groups for i in grp.nodes)
    for grp in packed.groups:
        parts = grp.parts or (grp.nodes,)
        assert set(parts) <= planned
        assert grp.nodes == tuple(sorted(itertools.chain(*parts)))
        assert (grp.inputs, grp.outputs) == graph.boundary(frozenset(grp.nodes))
        if grp.parts:
            assert all(legality(graph, frozenset(p)) is None for p in grp.parts)
            assert len({graph.iteration_shape(frozenset(p)) for p in grp.parts}) == 1
            for a, b in itertools.combinations(grp.parts, 2):  # independent
                assert not _reaches(graph, set(a), set(b)) and not _reaches(graph, set(b), set(a))
    groups = [grp.nodes for grp in packed.groups]
    assert _contracted_order(graph, groups) is not None, "packing closed a cycle"
    for i, j in itertools.combinations(range(len(groups)), 2):
        assert not _reaches(graph, set(groups[j]), set(groups[i]))
    assert packed.kernels_after == plan.kernels_after - (len(plan.groups) - len(packed.groups))


def test_levels_count_the_longest_path() -> None:
    # x → Relu → Hardmax (opaque) → Neg → Sigmoid: the second group sits two vertices down.
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Hardmax", ["r"], ["h"], axis=-1),
             helper.make_node("Neg", ["h"], ["n"]), helper.make_node("Sigmoid", ["n"], ["y"])]
    g, _ = _plan(_model(nodes, [_vi("x", [4, 4])], [_vi("y", [4, 4])]))
    assert pack.levels(g, [(0,), (2, 3)]) == [0, 2]
