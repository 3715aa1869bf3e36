"""The plan on small graphs: expected groups, kernel counts, predicted bytes, acyclicity."""
from __future__ import annotations

import json

import pytest

from onnxstitch.candidates import enumerate_candidates, legality
from onnxstitch.cost import CostModel, group_bytes, group_us, node_bytes, node_us
from onnxstitch.plan import find_cycles, make_plan, pairwise_conflicts, topological_groups
from tests._graphs import CHAIN, DIAMOND, MATMUL_SPLIT, from_text, node, nodes

F = 8 * 16 * 4  # bytes of one float[8,16]


def chosen(plan) -> set[tuple[int, ...]]:
    return {g.nodes for g in plan.groups}


def test_chain_becomes_one_group_with_its_bytes():
    g = from_text(CHAIN)
    plan = make_plan(g)
    assert plan.status == "optimal"
    assert [gr.nodes for gr in plan.groups] == [(0, 1, 2, 3)]
    (gr,) = plan.groups
    assert gr.name == "g0" and gr.inputs == ("x", "b") and gr.outputs == ("y",)
    assert gr.iteration_shape == (8, 16)
    assert gr.predicted_bytes == 2 * F + 16 * 4  # x and y once, b once
    assert plan.kernels_before == 4 and plan.kernels_after == 1
    # Unfused: Add reads x, b and writes t; three more nodes read and write one [8,16] each.
    assert plan.bytes_before == (2 * F + 64) + 2 * F + 2 * F + 3 * F
    assert plan.bytes_after == gr.predicted_bytes
    cost = CostModel()
    assert plan.predicted_us_after == pytest.approx(cost.kernel_us(gr.predicted_bytes))
    assert plan.predicted_us_before == pytest.approx(4 * cost.launch_us + plan.bytes_before / 2.85e6)


def test_matmul_in_the_middle_splits_the_chain():
    g = from_text(MATMUL_SPLIT)
    plan = make_plan(g)
    assert [gr.nodes for gr in plan.groups] == [nodes(g, "a", "b"), nodes(g, "c", "y")]
    assert [gr.name for gr in plan.groups] == ["g0", "g1"]
    assert plan.kernels_after == 3


def test_diamond_fuses_into_one_kernel():
    assert chosen(make_plan(from_text(DIAMOND))) == {(0, 1, 2, 3)}


def test_fusible_pair_around_an_opaque_node_is_not_fused():
    g = from_text("""
    g (float[8,16] x, float[16,16] w) => (float[8,16] y) {
      a = Relu(x)
      m = MatMul(a, w)
      b = Add(a, m)
      y = Sigmoid(b)
    }""")
    plan = make_plan(g)
    assert all(not {node(g, "a"), node(g, "b")} <= set(gr.nodes) for gr in plan.groups)
    assert chosen(plan) == {nodes(g, "b", "y")}


def test_smaller_graph_output_keeps_its_producer_apart():
    g = from_text("""
    g (float[8,16] x, float[16] b) => (float[8,16] y, float[16] s) {
      s = Relu(b)
      t = Add(x, s)
      y = Sigmoid(t)
    }""")
    plan = make_plan(g)
    assert chosen(plan) == {nodes(g, "t", "y")}
    assert any("[16]" in r.reason and r.node == node(g, "t") for r in plan.rejections)


# Two groups that feed each other through opaque nodes: A = {x, v}, B = {u, y};
# x -> Hardmax -> y puts A before B, u -> Hardmax -> v puts B before A.
TWO_CYCLE = """
g (float[8,16] p, float[8,16] q) => (float[8,16] v, float[8,16] y) {
  x = Relu(p)
  u = Sigmoid(q)
  sx = Hardmax(x)
  su = Hardmax(u)
  v = Add(x, su)
  y = Add(u, sx)
}"""


def _acyclic(g, plan) -> bool:
    return not find_cycles(g, [gr.nodes for gr in plan.groups])


def test_two_groups_that_would_form_a_cycle_are_not_both_chosen():
    g = from_text(TWO_CYCLE)
    a, b = nodes(g, "x", "v"), nodes(g, "u", "y")
    assert legality(g, frozenset(a)) is None and legality(g, frozenset(b)) is None
    assert find_cycles(g, [a, b]) == [[0, 1]]
    assert pairwise_conflicts(g, [a, b]) == [(0, 1)]
    plan = make_plan(g)
    assert plan.conflicts >= 1 and plan.cuts == 0
    assert len(plan.groups) == 1 and chosen(plan) <= {a, b}
    assert _acyclic(g, plan)


def test_lazy_cuts_alone_also_break_the_two_cycle():
    g = from_text(TWO_CYCLE)
    plan = make_plan(g, pairwise=False)
    assert plan.conflicts == 0 and plan.cuts >= 1 and plan.rounds >= 2
    assert len(plan.groups) == 1 and _acyclic(g, plan)


# Three groups K = {k0, k1, k2} for K in a, b, c: k0 feeds k1 and k2; k2 leaves through a
# Hardmax into the next group's k1. No two groups reach each other both ways (each enters at
# k1 and leaves from k2, unconnected inside), but a -> b -> c -> a is a cycle.
THREE_CYCLE = """
g (float[4,8] pa, float[4,8] pb, float[4,8] pc) => (float[4,8] a1, float[4,8] b1, float[4,8] c1) {
  a0 = Relu(pa)
  b0 = Relu(pb)
  c0 = Relu(pc)
  a2 = Sigmoid(a0)
  b2 = Sigmoid(b0)
  c2 = Sigmoid(c0)
  xa = Hardmax(a2)
  xb = Hardmax(b2)
  xc = Hardmax(c2)
  a1 = Add(a0, xc)
  b1 = Add(b0, xa)
  c1 = Add(c0, xb)
}"""


def test_three_cycle_needs_a_lazy_cut():
    g = from_text(THREE_CYCLE)
    full = [nodes(g, f"{k}0", f"{k}1", f"{k}2") for k in "abc"]
    assert all(legality(g, frozenset(f)) is None for f in full)
    assert pairwise_conflicts(g, full) == []
    assert find_cycles(g, full) == [[0, 1, 2]]
    plan = make_plan(g)
    assert plan.status == "optimal"
    assert plan.cuts >= 1 and plan.rounds >= 2
    assert _acyclic(g, plan)
    # Best acyclic plan: two full groups and the third split into a pair and a singleton.
    assert len(chosen(plan) & set(full)) == 2
    assert plan.kernels_after == 3 + 2 + 2  # three Hardmax, two full groups, pair + single


def test_cut_limit_falls_back_to_no_fusion_and_says_so():
    g = from_text(THREE_CYCLE)
    plan = make_plan(g, max_rounds=1)
    assert plan.status == "no plan" and plan.groups == ()
    assert "cyclic" in plan.message and "nothing is fused" in plan.message
    assert plan.kernels_after == plan.kernels_before


def test_nothing_to_fuse_skips_the_solver():
    g = from_text("""
    g (float[8,16] x, float[16,16] w) => (float[8,16] y) {
      m = MatMul(x, w)
      y = Relu(m)
    }""")
    plan = make_plan(g)
    assert plan.groups == () and plan.rounds == 0 and plan.status == "optimal"
    assert "nothing to fuse" in plan.message
    assert plan.predicted_us_after == pytest.approx(plan.predicted_us_before)


def test_topological_group_order_follows_dependencies():
    g = from_text(MATMUL_SPLIT)
    late, early = nodes(g, "c", "y"), nodes(g, "a", "b")
    assert topological_groups(g, [late, early]) == [1, 0]


def test_report_is_json():
    g = from_text(TWO_CYCLE)
    data = json.loads(json.dumps(make_plan(g).to_json()))
    assert data["kernels_before"] == 6 and len(data["groups"]) == 1
    assert data["groups"][0]["name"] == "g0" and data["groups"][0]["labels"]
    assert {"status", "message", "solve_seconds", "num_candidates", "rejections"} <= data.keys()


def test_cost_model_terms():
    cost = CostModel()
    assert (cost.launch_us, cost.bandwidth_gbs) == (4.5, 2850.0)
    assert cost.kernel_us(0) == 4.5
    assert cost.kernel_us(2_850_000) == pytest.approx(5.5)  # 2.85 MB at 2.85 TB/s = 1 µs
    g = from_text("""
    g (float[8,16] x) => (float[8,16] y) <float c = {2.0}> {
      t = Mul(x, c)
      y = Relu(t)
    }""")
    # The baked scalar and the internal t cost nothing in the group; alone, each node pays.
    assert group_bytes(g, frozenset({0, 1})) == 2 * F
    assert node_bytes(g, 0) == 2 * F + 4 and node_bytes(g, 1) == 2 * F


def test_plan_reuses_given_candidates():
    g = from_text(THREE_CYCLE)
    cands = enumerate_candidates(g, max_size=2)
    plan = make_plan(g, candidates=cands)
    assert plan.num_candidates == len(cands.groups)


def test_time_limit_without_a_solution_fuses_nothing_and_says_so():
    g = from_text(TWO_CYCLE)
    plan = make_plan(g, time_limit_s=1e-9)
    assert plan.status == "no plan" and plan.groups == ()
    assert "time limit" in plan.message


def test_a_lone_layer_norm_is_not_left_to_ort():
    # ORT's LayerNormalization kernel moves its bytes at about 0.3 of the bandwidth (BERT-base,
    # H200): a LayerNorm with nothing to fuse around it (its input from a GEMM with a residual
    # epilogue, its output read by two MatMuls) still runs as a rows kernel.
    g = from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1024,768] x, float[768] s, float[768] b, float[768,768] w, float[768,768] v) => (float[1024,768] p, float[1024,768] q) {
      y = LayerNormalization<axis = -1, epsilon = 0.00001>(x, s, b)
      p = MatMul(y, w)
      q = MatMul(y, v)
    }""")
    plan = make_plan(g)
    assert chosen(plan) == {(node(g, "y"),)}
    assert node_us(g, CostModel(), node(g, "y")) > group_us(g, CostModel(), frozenset({node(g, "y")}))
