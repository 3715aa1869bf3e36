"""Property tests on random DAGs: every fusible node in at most one group, every group legal,
the contracted graph acyclic with the plan's group order a topological one, and (on small
graphs) the ILP's choice as good as brute force over all partitions.

The random graphs mix elementwise/broadcast ops (float and bool), opaque ops that keep the
shape (Hardmax) or shrink it (ReduceMax keepdims), fan-out, shared inputs, a baked scalar and
broadcast inputs. Shapes are computed here, so no shape inference runs per example.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxstitch import graph as fgraph
from onnxstitch.candidates import _State, enumerate_candidates, legality, reachability
from onnxstitch.cost import CostModel, group_us, node_us
from onnxstitch.plan import make_plan
from onnxstitch.shapes import TensorInfo, broadcast_shapes

FULL = (3, 4)
INPUT_SHAPES = [(3, 4), (4,), (3, 1), (1, 4), ()]
UNARY = ["Relu", "Sigmoid", "Neg", "Exp"]
BINARY = ["Add", "Mul", "Sub", "Max"]
# Opaque nodes between fusible ones ("cross" adds a pair) are what make groups conflict.
OPS = UNARY + BINARY + ["Greater", "Where", "Hardmax", "ReduceMax", "cross"]


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: int
    shape: tuple[int, ...]


class _Builder:
    """Grows a random graph as a few lanes (chains) that read each other, directly or through
    an opaque node: lanes crossing through Hardmax in both directions are what make two legal
    groups feed each other."""

    def __init__(self, draw, inputs: list[Tensor], ops: list[str], lanes: int) -> None:
        self.draw, self.ops = draw, ops
        self.pool: list[Tensor] = list(inputs) + [Tensor("k", TensorProto.FLOAT, ())]  # k: baked
        self.lanes = [draw(st.sampled_from(inputs)) for _ in range(draw(st.integers(lanes, 3)))]
        self.nodes: list[onnx.NodeProto] = []

    def emit(self, op: str, ins: list[Tensor], dtype: int, shape: tuple[int, ...]) -> Tensor:
        out = Tensor(f"t{len(self.nodes)}", dtype, shape)
        self.nodes.append(helper.make_node(op, [t.name for t in ins], [out.name], name=f"n{len(self.nodes)}"))
        self.pool.append(out)
        return out

    def operand(self, lane: int) -> Tensor:
        """Another float operand: a lane's head, any float tensor, or one through a Hardmax."""
        how = self.draw(st.sampled_from(["pool", "lane", "opaque"]))
        if how == "lane":
            return self.lanes[self.draw(st.integers(0, len(self.lanes) - 1))]
        some = self.draw(st.sampled_from([t for t in self.pool if t.dtype == TensorProto.FLOAT]))
        if how == "opaque" and some.shape:
            return self.emit("Hardmax", [some], some.dtype, some.shape)
        return some

    def cross(self, lane: int) -> None:
        """Two lanes each read the other's head through a Hardmax: the smallest pattern in
        which two legal groups feed each other."""
        other = self.draw(st.integers(0, len(self.lanes) - 1))
        a, b = self.lanes[lane], self.lanes[other]
        if other == lane or not a.shape or not b.shape:
            return
        sa = self.emit("Hardmax", [a], a.dtype, a.shape)
        sb = self.emit("Hardmax", [b], b.dtype, b.shape)
        self.lanes[lane] = self.emit("Add", [a, sb], a.dtype, broadcast_shapes([a.shape, b.shape]))
        self.lanes[other] = self.emit("Add", [b, sa], b.dtype, broadcast_shapes([a.shape, b.shape]))

    def step(self) -> None:
        F, B = TensorProto.FLOAT, TensorProto.BOOL
        lane = self.draw(st.integers(0, len(self.lanes) - 1))
        a = self.lanes[lane]
        op = self.draw(st.sampled_from(self.ops))
        if op == "cross":
            self.cross(lane)
            return
        if op in UNARY:
            res = self.emit(op, [a], F, a.shape)
        elif op in BINARY:
            b = self.operand(lane)
            res = self.emit(op, [a, b], F, broadcast_shapes([a.shape, b.shape]))
        elif op == "Greater":  # a bool for a later Where; the lane head stays
            b = self.operand(lane)
            self.emit(op, [a, b], B, broadcast_shapes([a.shape, b.shape]))
            return
        elif op == "Where":
            conds = [t for t in self.pool if t.dtype == B]
            if not conds:
                return
            c, b = self.draw(st.sampled_from(conds)), self.operand(lane)
            res = self.emit(op, [c, a, b], F, broadcast_shapes([c.shape, a.shape, b.shape]))
        elif not a.shape:  # both opaque ops need rank >= 1
            return
        elif op == "Hardmax":
            res = self.emit(op, [a], F, a.shape)
        else:  # ReduceMax, keepdims: a smaller shape for later broadcasts
            res = self.emit(op, [a, Tensor("axes", TensorProto.INT64, (1,))], F, a.shape[:-1] + (1,))
        self.lanes[lane] = res


@st.composite
def random_graphs(draw, max_nodes: int = 12, ops: list[str] = OPS, lanes: int = 1) -> fgraph.FusionGraph:
    """A random DAG of about `max_nodes` nodes drawn from `ops`, grown on at least `lanes`
    lanes, as a FusionGraph with shapes and dtypes filled in by hand."""
    inputs = [Tensor(f"in{i}", TensorProto.FLOAT, draw(st.sampled_from(INPUT_SHAPES)))
              for i in range(draw(st.integers(1, 3)))]
    b = _Builder(draw, inputs, ops, lanes)
    target = draw(st.integers(max_nodes // 2, max_nodes))
    while len(b.nodes) < target:
        b.step()
    return _build(draw, b.nodes, inputs, b.pool)


def _build(draw, nodes, inputs, pool) -> fgraph.FusionGraph:
    produced = [t for t in pool if t.name.startswith("t")]
    used = {i for n in nodes for i in n.input}
    outputs = [t for t in produced if t.name not in used or draw(st.booleans())]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "k"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]

    def vi(t: Tensor):
        return helper.make_tensor_value_info(t.name, t.dtype, list(t.shape))

    g = helper.make_graph(nodes, "random", [vi(t) for t in inputs], [vi(t) for t in outputs], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    infos = {t.name: TensorInfo(t.name, t.dtype, t.shape) for t in pool}
    infos["axes"] = TensorInfo("axes", TensorProto.INT64, (1,))
    return fgraph.build(model, infos)


# ---------------------------------------------------------------------------------------------
# Independent checkers (no code shared with plan.py).


def _owner(graph, groups) -> list[int]:
    owner = list(range(len(graph.nodes)))
    for gi, members in enumerate(groups):
        for i in members:
            owner[i] = len(graph.nodes) + gi
    return owner


def _contracted_order(graph, groups) -> list[int] | None:
    """Kahn's algorithm on the contraction; None when it has a cycle."""
    owner = _owner(graph, groups)
    edges = {(owner[i], owner[s]) for i in range(len(graph.nodes)) for s in graph.succs[i]
             if owner[i] != owner[s]}
    verts = set(owner)
    indeg = {v: 0 for v in verts}
    for _, w in edges:
        indeg[w] += 1
    ready = [v for v in verts if indeg[v] == 0]
    order = []
    while ready:
        v = ready.pop()
        order.append(v)
        for a, w in edges:
            if a == v:
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
    return order if len(order) == len(verts) else None


def _reaches(graph, src: set[int], dst: set[int]) -> bool:
    seen, stack = set(src), list(src)
    while stack:
        for s in graph.succs[stack.pop()]:
            if s in dst:
                return True
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def _check_plan(graph, plan) -> None:
    groups = [gr.nodes for gr in plan.groups]
    covered = [i for gr in groups for i in gr]
    assert len(covered) == len(set(covered)), "a node is in two groups"
    for gr, members in zip(plan.groups, groups):
        assert all(graph.nodes[i].fusible for i in members)
        assert list(members) == sorted(members)
        assert legality(graph, frozenset(members)) is None, legality(graph, frozenset(members))
        assert (gr.inputs, gr.outputs) == graph.boundary(frozenset(members))
        assert gr.iteration_shape == graph.iteration_shape(frozenset(members))
    assert _contracted_order(graph, groups) is not None, "contracted graph has a cycle"
    # Every dependency kept: a later group never feeds an earlier one.
    for i, j in itertools.combinations(range(len(groups)), 2):
        assert not _reaches(graph, set(groups[j]), set(groups[i]))
    assert plan.kernels_after == plan.kernels_before - sum(len(m) - 1 for m in groups)
    assert plan.predicted_us_after <= plan.predicted_us_before + 1e-9
    assert plan.status == "optimal", plan.message


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_nodes=16))
def test_random_plans_are_legal_acyclic_and_ordered(graph):
    cands = enumerate_candidates(graph, max_size=4, per_seed=6)
    for c in cands.groups:
        assert legality(graph, frozenset(c)) is None, (c, legality(graph, frozenset(c)))
    _check_plan(graph, make_plan(graph, candidates=cands))


# Mostly lane crossings, so that many plans need cuts.
CROSSING = ["Relu", "Sigmoid", "Add", "Mul", "Hardmax", "cross", "cross"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_nodes=14, ops=CROSSING, lanes=2))
def test_lazy_cuts_alone_keep_plans_acyclic(graph):
    alone = make_plan(graph, pairwise=False)
    _check_plan(graph, alone)
    # Both ways of enforcing acyclicity are exact: same optimum.
    both = make_plan(graph)
    assert abs(alone.predicted_us_after - both.predicted_us_after) <= 1e-6 * both.predicted_us_after


def _partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first]] + part
        for k in range(len(part)):
            yield part[:k] + [[first] + part[k]] + part[k + 1:]


def _brute_force_us(graph, cost: CostModel) -> float:
    fusible = [n.index for n in graph.nodes if n.fusible]
    fixed = sum(node_us(graph, cost, n.index) for n in graph.nodes if not n.fusible)
    best = float("inf")
    for part in _partitions(fusible):
        blocks = [tuple(sorted(b)) for b in part if len(b) > 1]
        if any(legality(graph, frozenset(b)) is not None for b in blocks):
            continue
        if _contracted_order(graph, blocks) is None:
            continue
        us = sum(group_us(graph, cost, frozenset(b)) for b in blocks)
        us += sum(node_us(graph, cost, b[0]) for b in part if len(b) == 1)
        best = min(best, us)
    return best + fixed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_nodes=8))
def test_plan_matches_brute_force_on_small_graphs(graph):
    cost = CostModel()
    # Unbounded enumeration: every connected legal set is a candidate.
    plan = make_plan(graph, cost, max_size=len(graph.nodes), per_seed=10_000)
    _check_plan(graph, plan)
    best = _brute_force_us(graph, cost)
    assert abs(plan.predicted_us_after - best) <= 1e-6 * best, (plan.predicted_us_after, best)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_nodes=12), st.randoms(use_true_random=False))
def test_incremental_group_state_matches_a_fresh_one(graph, rnd):
    # Enumeration grows groups one node at a time; its bookkeeping must agree with
    # graph.boundary and the reach of the whole set, in any order of addition.
    reach = reachability(graph)
    fusible = [n.index for n in graph.nodes if n.fusible]
    order = rnd.sample(fusible, k=len(fusible))
    state = _State.of(graph, reach, order[:1]) if order else None
    for k in range(1, len(order)):
        state = state.add(graph, reach, order[k])
        fresh = _State.of(graph, reach, order[:k + 1])
        assert (set(state.ins), set(state.outs)) == (set(fresh.ins), set(fresh.outs))
        assert (state.mask, state.members, state.desc, state.anc) == (fresh.mask, fresh.members, fresh.desc, fresh.anc)
        assert state.shape == fresh.shape
