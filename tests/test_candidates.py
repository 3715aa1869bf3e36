"""Legality and candidate enumeration on small graphs written as ONNX text."""
from __future__ import annotations

from onnxstitch.candidates import enumerate_candidates, legality, reachability
from onnxstitch.graph import MAX_INPUTS

from tests._graphs import CHAIN, DIAMOND, from_model, from_text, node, nodes


def test_chain_is_legal_and_one_maximal_candidate():
    g = from_text(CHAIN)
    assert legality(g, frozenset(range(4))) is None
    cands = enumerate_candidates(g)
    assert (0, 1, 2, 3) in cands.groups
    assert all(legality(g, frozenset(c)) is None for c in cands.groups)


def test_long_chain_is_one_candidate_whatever_max_size():
    body = "\n".join(f"  t{i + 1} = Relu(t{i})" for i in range(40))
    g = from_text(f"g (float[4,4] t0) => (float[4,4] t40) {{\n{body}\n}}")
    cands = enumerate_candidates(g, max_size=3, per_seed=2)
    assert tuple(range(40)) in cands.groups
    assert max(len(c) for c in cands.groups if c != tuple(range(40))) <= 3


def test_opaque_node_is_refused_with_its_reason():
    g = from_text("""
    g (float[8,16] x, float[16,16] w) => (float[8,16] y) {
      a = Relu(x)
      m = MatMul(a, w)
      y = Sigmoid(m)
    }""")
    reason = legality(g, frozenset(range(3)))
    assert reason is not None and "MatMul" in reason and "not fusible" in reason
    # Neither neighbour can join a fusible node across the MatMul.
    assert enumerate_candidates(g).groups == ()
    rej = enumerate_candidates(g).rejections
    assert any(r.node == node(g, "m") and "MatMul" in r.reason for r in rej)


def test_output_of_smaller_shape_is_refused_naming_both_shapes():
    g = from_text("""
    g (float[8,16] x, float[16] b) => (float[8,16] y, float[16] s) {
      s = Relu(b)
      y = Add(x, s)
    }""")
    reason = legality(g, frozenset(nodes(g, "s", "y")))
    assert reason is not None
    assert "'s'" in reason and "[16]" in reason and "[8, 16]" in reason
    cands = enumerate_candidates(g)
    assert cands.groups == ()
    assert any(r.node == node(g, "y") and "[16]" in r.reason for r in cands.rejections)


def test_smaller_internal_node_is_fine():
    g = from_text("""
    g (float[8,16] x, float[16] b) => (float[8,16] y) {
      s = Relu(b)
      y = Add(x, s)
    }""")
    assert legality(g, frozenset(nodes(g, "s", "y"))) is None
    assert enumerate_candidates(g).groups == (nodes(g, "s", "y"),)


def test_diamond_fuses():
    g = from_text(DIAMOND)
    assert legality(g, frozenset(range(4))) is None
    assert (0, 1, 2, 3) in enumerate_candidates(g).groups


def test_path_through_an_opaque_node_makes_the_pair_non_convex():
    # a -> X -> b and a -> b: fusing a and b would put X both before and after the kernel.
    g = from_text("""
    g (float[8,16] x, float[16,16] w) => (float[8,16] b) {
      a = Relu(x)
      m = MatMul(a, w)
      b = Add(a, m)
    }""")
    reason = legality(g, frozenset(nodes(g, "a", "b")))
    assert reason is not None and "not convex" in reason and "MatMul" in reason
    cands = enumerate_candidates(g)
    assert cands.groups == ()
    assert any(r.node == node(g, "b") and "not convex" in r.reason for r in cands.rejections)


def test_path_through_an_unfused_fusible_node_is_also_non_convex():
    g = from_text("""
    g (float[8,16] x) => (float[8,16] c) {
      a = Relu(x)
      b = Sigmoid(a)
      c = Add(a, b)
    }""")
    assert "not convex" in legality(g, frozenset(nodes(g, "a", "c")))
    assert legality(g, frozenset(nodes(g, "a", "b", "c"))) is None


def test_unconnected_set_is_refused():
    g = from_text("""
    g (float[8,16] x) => (float[8,16] a, float[8,16] b) {
      a = Relu(x)
      b = Sigmoid(x)
    }""")
    assert "not connected" in legality(g, frozenset({0, 1}))


def test_single_node_is_legal_but_offered_only_where_ort_is_slow():
    # One node alone is a legal kernel; enumeration offers it only for ops whose ORT kernel is
    # measured slow (cost.ORT_BANDWIDTH_SHARE: LayerNormalization), never a lone Relu.
    g = from_text(CHAIN)
    assert legality(g, frozenset({1})) is None
    assert "needs a node" in legality(g, frozenset())
    assert all(len(c) > 1 for c in enumerate_candidates(g).groups)
    ln = from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[64,32] x, float[32] s, float[32] b, float[32,32] w) => (float[64,32] p) {
      y = LayerNormalization<axis = -1>(x, s, b)
      p = MatMul(y, w)
    }""")
    assert (0,) in enumerate_candidates(ln).groups


def _bn_model(shape: list, flatten: bool):
    """x [·] (→ MatMul → Flatten(axis 2)) → BatchNormalization (constant parameters) → y."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    c = shape[-1] if flatten else shape[1]
    params = [numpy_helper.from_array(np.full(c, v, np.float32), k) for k, v in
              (("s", 1.5), ("b", 0.1), ("m", 0.2), ("v", 2.0))]
    nodes, bn_in = [], "x"
    if flatten:
        params.append(numpy_helper.from_array(np.eye(c, dtype=np.float32), "w"))
        nodes += [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Flatten", ["p"], ["f"], axis=2)]
        bn_in = "f"
    nodes.append(helper.make_node("BatchNormalization", [bn_in, "s", "b", "m", "v"], ["n"]))
    nodes.append(helper.make_node("Relu", ["n"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [None, c] if flatten else shape)], params)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_flatten_keeps_its_input_dims_and_a_flat_batchnorm_is_offered_alone():
    """Flatten's output is written in its input's dims ([196*B, 128]: onnxruntime's inference
    named both anew, and nothing after it could be proved to broadcast with its channels), and a
    BatchNormalization with no spatial extent is offered alone: ORT runs it as cuDNN's N×C×1×1
    kernel, measured 111 µs a call on LeViT (cost.ORT_FLAT_BATCHNORM_SHARE)."""
    from onnxstitch import cost

    g = from_model(_bn_model(["B", 196, 128], flatten=True))
    assert g.tensors["f"].shape == ("196*B", 128)
    bn = node(g, "n")
    assert legality(g, frozenset({bn})) is None
    assert cost.ort_share(g, bn) == cost.ORT_FLAT_BATCHNORM_SHARE
    assert any(bn in c for c in enumerate_candidates(g).groups)
    spatial = from_model(_bn_model([8, 16, 4, 4], flatten=False))
    assert cost.ort_share(spatial, node(spatial, "n")) == 1.0


def test_baked_constant_that_widens_the_shape_is_refused():
    # The kernel derives its iteration shape from its runtime inputs ([16]); the baked [1,1]
    # scalar would make the outputs [1,16].
    g = from_text("""
    g (float[16] x) => (float[1,16] y) <float[1,1] c = {2.0}> {
      t = Add(x, c)
      y = Relu(t)
    }""")
    reason = legality(g, frozenset({0, 1}))
    assert reason is not None and "[16]" in reason and "[1, 16]" in reason


def test_symbolic_dims_are_a_provable_iteration_shape():
    g = from_text("""
    g (float[N,16] x, float[16] b) => (float[N,16] y) {
      t = Add(x, b)
      y = Relu(t)
    }""")
    assert legality(g, frozenset({0, 1})) is None
    assert g.iteration_shape(frozenset({0, 1})) == ("N", 16)


def test_input_limit_splits_the_maximal_groups():
    n = MAX_INPUTS + 8
    params = ", ".join(f"float[4] b{i}" for i in range(n))
    body = "\n".join(f"  t{i + 1} = Add(t{i}, b{i})" for i in range(n))
    g = from_text(f"g (float[4] t0, {params}) => (float[4] t{n}) {{\n{body}\n}}")
    reason = legality(g, frozenset(range(n)))
    assert reason is not None and f"{n + 1} inputs" in reason
    cands = enumerate_candidates(g)
    assert all(legality(g, frozenset(c)) is None for c in cands.groups)
    # The greedy growth takes as many as fit: the first MAX_INPUTS - 1 adds (plus t0).
    assert tuple(range(MAX_INPUTS - 1)) in cands.groups
    assert any("inputs exceed" in r.reason for r in cands.rejections)


def test_reachability_bitsets():
    g = from_text(CHAIN)
    reach = reachability(g)
    assert reach.desc[0] == 0b1110 and reach.anc[3] == 0b0111
    assert reach.desc[3] == 0 and reach.anc[0] == 0


def test_every_candidate_is_connected_convex_and_deduplicated():
    g = from_text("""
    g (float[8,16] x, float[16] b, float[16,16] w) => (float[8,16] y, float[8,16] z) {
      t = Add(x, b)
      r = Relu(t)
      s = Sigmoid(t)
      m = MatMul(r, w)
      u = Add(s, m)
      y = Mul(u, r)
      z = Neg(s)
    }""")
    cands = enumerate_candidates(g, max_size=8, per_seed=100)
    assert len(set(cands.groups)) == len(cands.groups)
    for c in cands.groups:
        assert legality(g, frozenset(c)) is None, c
    # t, r, s, z are one convex group; u and y sit after the MatMul that r feeds.
    assert nodes(g, "t", "r", "s", "z") in cands.groups
    assert nodes(g, "u", "y") in cands.groups
    assert legality(g, frozenset(nodes(g, "r", "y"))) is not None


def test_nodes_that_can_only_join_together_are_added_together():
    # From s, v alone leaves s's [16] output to c outside; c then leaves v's path
    # s -> v -> y. Only {s, v, c, y} together is legal: growth must add what v forces in.
    g = from_text("""
    g (float[8,16] x, float[16] b) => (float[8,16] y) {
      s = Relu(b)
      v = Add(x, s)
      c = Sigmoid(s)
      y = Mul(v, c)
    }""")
    assert legality(g, frozenset(nodes(g, "s", "v"))) is not None
    assert legality(g, frozenset(nodes(g, "s", "c", "y"))) is not None
    assert legality(g, frozenset(range(4))) is None
    # max_size=2: the small subgraphs cannot find it, only the maximal growth can.
    assert (0, 1, 2, 3) in enumerate_candidates(g, max_size=2).groups


def test_group_of_constants_only_is_refused() -> None:
    from onnxstitch.candidates import legality

    from ._graphs import from_text, nodes

    g = from_text(("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[4] y, float y2) <float c = {2.0}> {
      a = Exp(c)
      b = Neg(a)
      y = Add(x, b)
      y2 = Identity(b)
    }"""))
    assert "constant" in (legality(g, frozenset(nodes(g, "a", "b"))) or "")


def test_a_flat_batchnorm_after_flatten_is_fused_and_verified():
    """End to end on the CPU: LeViT's MatMul → Flatten → BatchNorm1d → activation form gets a
    fused kernel over the BatchNormalization, checked through its fallback function against
    stock ORT on fresh random inputs."""
    import onnxstitch

    res = onnxstitch.optimize(_bn_model(["B", 196, 128], flatten=True), shapes={"B": [8]})
    fused = [fn for fn in res.model.functions if any(n.op_type == "BatchNormalization" for n in fn.node)]
    assert fused and res.report.verification is not None and res.report.verification.tensors_checked > 0
    assert not res.report.dropped
