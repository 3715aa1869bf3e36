"""Attention chains on the CPU: which chains become one kernel and why others do not
(attention.py; the eager forms and transformers' SDPA as both exporters write it), the plan and report around them, the stitched model through its fallback
function against the original on fresh random inputs, TF32-aware verification, and the
runtime's "attention" shape rule up to the first driver call (the CPU-EP test build)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxstitch
from onnxstitch import verify
from onnxstitch.schemes.attention import match as attention
from onnxstitch.schemes.attention.spec import AttentionSpec
from onnxstitch.runtime import build as rtbuild

from .attention_models import (CORES, PROJECTED, SDPA, Core, Projected, Sdpa, attention_graph, core_feeds, core_model,
                               core_reference, projected_feeds, projected_model, projected_reference, relative_error,
                               sdpa_feeds, sdpa_model, sdpa_reference)
from .corpus import CORPUS, corpus_entry
from .stitching import fresh_seed

SMALL = Core((2, 3), 10, 10, 16, (2, 1, 1, 10))


def found(model: onnx.ModelProto) -> attention.Found:
    return attention_graph(model)[1]


def run_cpu(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.id)
def test_every_core_is_one_chain(core: Core) -> None:
    (m,) = found(core_model(core)).matches
    want_masks = tuple(t for t, shape in (("bias", core.bias), ("mask", core.mask)) if shape is not None)
    assert (m.head_dim, m.masks, m.transposed) == (core.d, want_masks, core.transposed)
    assert m.scale == pytest.approx(1 / np.sqrt(core.d), rel=1e-6)
    assert len(m.nodes) == 4 + len(want_masks) + core.transposed  # MatMul, Mul, Softmax, MatMul


def _edited(model: onnx.ModelProto, edit) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    edit(out.graph)
    return out


def _extra_output(g: onnx.GraphProto) -> None:
    g.output.append(helper.make_tensor_value_info("p", TP.FLOAT, [2, 3, 10, 10]))


def _softmax_axis(g: onnx.GraphProto) -> None:
    soft = next(n for n in g.node if n.op_type == "Softmax")
    del soft.attribute[:]
    soft.attribute.append(helper.make_attribute("axis", 2))


@pytest.mark.parametrize("model,reason", [
    (core_model(SMALL, dtype=TP.DOUBLE), "generated for float32, float16, bfloat16"),
    (core_model(dataclasses.replace(SMALL, d=12)), "head size 12"),
    (_edited(core_model(SMALL), _extra_output), "also read outside the chain"),
    (_edited(core_model(SMALL), _softmax_axis), "not over the keys"),
    (core_model(dataclasses.replace(SMALL, mask=(3, 10))), "does not broadcast"),
], ids=["double", "head-12", "probabilities-read-outside", "softmax-axis", "mask-shape"])
def test_chains_left_apart_say_why(model: onnx.ModelProto, reason: str) -> None:
    f = found(model)
    assert not f.matches and len(f.refusals) == 1 and reason in f.refusals[0]


@pytest.mark.parametrize("keys,staged", [(128, True), (197, False)])
def test_tf32_rounding_is_staged_where_keys_come_in_16_byte_chunks(keys: int, staged: bool) -> None:
    from onnxstitch.schemes.attention import codegen as codegen_attention

    g, f = attention_graph(core_model(dataclasses.replace(SMALL, sq=keys, sk=keys, mask=None)))
    (match,) = f.matches
    src = codegen_attention.generate(g, "k", match).source
    assert ("#define STAGE(x) __uint_as_float(stitch_tf32(x))" in src) == staged


def test_a_softmax_between_no_matmuls_is_not_a_near_miss() -> None:
    x = helper.make_tensor_value_info("x", TP.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TP.FLOAT, [4, 8])
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [x], [y])
    assert found(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])) == attention.Found()


@pytest.mark.parametrize("name,layers", [("bert-base", 2), ("t5-small-encoder", 2), ("vit-b16", 2), ("gpt2", 2),
                                         ("llama-layer", 1)])
def test_zoo_transformers_have_their_attention_cores_matched(name: str, layers: int) -> None:
    model = onnx.load(str(Path(__file__).resolve().parents[1] / f"models/small/{name}-float32.onnx"))
    f = found(model)
    assert len(f.matches) == layers and not f.refusals
    if name.startswith("t5"):  # position bias, then the mask
        assert all(len(m.masks) == 2 for m in f.matches)
    # q, kᵀ and v come straight from their projections, except LLaMA's (rotary embedding between).
    assert all(len(m.projections) == (0 if name == "llama-layer" else 3) for m in f.matches)
    assert all(m.biased == (name in ("bert-base", "vit-b16")) for m in f.matches if m.projections)


@pytest.mark.parametrize("p", PROJECTED, ids=lambda p: p.id)
def test_projections_are_read_by_the_kernel(p: Projected) -> None:
    model = projected_model(p, np.random.default_rng(0))
    g, f = attention_graph(model)
    (m,) = f.matches
    assert m.heads == p.core.lead[1] and m.biased == p.biased
    # Every node of the model is in the chain: Slices/Split/MatMuls' outputs are read whole.
    absorbed = {g.nodes[i].op_type for i in m.nodes} - {"MatMul", "Mul", "Add", "Softmax", "Transpose"}
    assert absorbed == {"Reshape"} | ({"Slice"} if p.source == "slice" else {"Split"} if p.source == "split" else set())
    xs = {"matmul": ("q_cols", "k_cols", "v_cols"), "split": ("x",) * 3}.get(p.source)
    if xs is None:
        xs = ("x",) * 3 if p.core.sq == p.core.sk else ("xq", "xkv", "xkv")
    assert tuple(x.x for x in m.projections) == xs


def _reads_twice(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """`model` with `tensor` also a graph output."""
    inferred = onnx.shape_inference.infer_shapes(model)
    model.graph.output.append(next(v for v in inferred.graph.value_info if v.name == tensor))
    return model


@pytest.mark.parametrize("tensor", ["q_biased", "k_heads"])
def test_a_projection_read_elsewhere_leaves_the_operands_as_they_are(tensor: str) -> None:
    p = PROJECTED[0]
    model = _reads_twice(projected_model(p, np.random.default_rng(0)), tensor)
    (m,) = found(model).matches
    assert m.projections == () and (m.q, m.kt, m.v) == ("q", "kt", "v")


def test_a_slice_read_elsewhere_is_where_the_kernel_reads() -> None:
    # ONNX Runtime computes v's columns anyway (a graph output): the kernel reads them there.
    p = PROJECTED[0]
    (m,) = found(_reads_twice(projected_model(p, np.random.default_rng(0)), "v_cols")).matches
    assert [(x.x, x.offset) for x in m.projections] == [("x", 0), ("x", 768), ("v_cols", 0)]


def test_a_split_with_an_output_read_elsewhere_is_not_absorbed() -> None:
    p = PROJECTED[1]
    (m,) = found(_reads_twice(projected_model(p, np.random.default_rng(0)), "v_cols")).matches
    assert m.projections == ()


def test_misaligned_columns_are_not_read_by_the_kernel() -> None:
    # q's heads start at column 2: the kernel's 16-byte loads cannot reach them.
    p = Projected(Core((1, 2), 10, 12, 16, None), pad=4)
    model = projected_model(p, np.random.default_rng(0))
    start = next(t for t in model.graph.initializer if t.name == "q_start")
    start.CopyFrom(onnx.numpy_helper.from_array(np.array([2], np.int64), "q_start"))
    end = next(t for t in model.graph.initializer if t.name == "q_end")
    end.CopyFrom(onnx.numpy_helper.from_array(np.array([2 + 32], np.int64), "q_end"))
    (m,) = found(model).matches
    assert m.projections == ()


def test_bert_reads_its_merged_qkv_product_in_the_attention_kernels() -> None:
    model = onnx.load(str(Path(__file__).resolve().parents[1] / "models/small/bert-base-float32.onnx"))
    res = onnxstitch.optimize(model, shapes={"batch": [2], "sequence": [16]}, verify=False)
    chains = [grp for grp in res.report.plan.groups if grp.scheme == "attention"]
    kernels = {k["group"]: k for k in res.report.kernels}
    assert chains and all(kernels[grp.name]["biases"] for grp in chains)
    hidden = kernels[chains[0].name]["heads"] * kernels[chains[0].name]["head_size"]
    assert all(kernels[grp.name]["column_offsets"] == [0, hidden, 2 * hidden] for grp in chains)
    # The merged product feeds the chains directly: no kernel writes q, kᵀ and v apart.
    merged = {t for grp in chains for t in grp.inputs if t.endswith("~merged")}
    assert len(merged) == len(chains)
    assert not any(merged & set(grp.inputs) for grp in res.report.plan.groups if grp.scheme != "attention")


def test_bert_plans_one_attention_kernel_per_layer() -> None:
    model = onnx.load(str(Path(__file__).resolve().parents[1] / "models/small/bert-base-float32.onnx"))
    res = onnxstitch.optimize(model, shapes={"batch": [2], "sequence": [16]}, verify=False)
    chains = [grp for grp in res.report.plan.groups if grp.scheme == "attention"]
    assert len(chains) == len(res.report.attention) == 2 and not res.report.attention_refusals
    kernels = {k["group"]: k for k in res.report.kernels}
    assert all(kernels[grp.name]["scheme"] == "attention" and kernels[grp.name]["transposed_output"] for grp in chains)
    # The plan chose them over the groups it could make of their Softmax, scale and mask: their
    # nodes are in no other group.
    others = {i for grp in res.report.plan.groups if grp.scheme != "attention" for i in grp.nodes}
    assert not others & {i for grp in chains for i in grp.nodes}
    off = onnxstitch.optimize(model, shapes={"batch": [2], "sequence": [16]}, verify=False, attention=False)
    assert not any(grp.scheme == "attention" for grp in off.report.plan.groups)
    assert off.report.plan.kernels_after > res.report.plan.kernels_after


def test_plan_keeps_its_groups_in_topological_order_with_the_chains() -> None:
    # Verification relies on it (a TF32 group's rounding reaches only later groups): a group
    # reading a chain's context comes after the chain.
    model = core_model(SMALL)
    g = model.graph
    g.node.extend([helper.make_node("Mul", ["y", "two"], ["y2"]), helper.make_node("Relu", ["y2"], ["z"])])
    g.initializer.append(onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    g.output[0].name = "z"
    groups = onnxstitch.optimize(model, verify=False).report.plan.groups
    assert sorted(grp.tf32 for grp in groups) == [False, True]
    writer = {t: k for k, grp in enumerate(groups) for t in grp.outputs}
    assert all(writer.get(t, -1) < k for k, grp in enumerate(groups) for t in grp.inputs)


@pytest.mark.parametrize("seq", [16, 37])
def test_stitched_core_runs_anywhere_through_its_function(seq: int) -> None:
    # Planned at 16, run at 16 and 37: the fused node keeps the sequence dynamic, and without the
    # library ONNX Runtime runs the function holding the original chain.
    core = dataclasses.replace(SMALL, sq=16, sk=16, mask=(2, 1, 1, 16))
    res = onnxstitch.optimize(core_model(core, seq="seq"), shapes={"seq": [16]})
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    node = res.model.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["shape_rule"] == b"attention"
    run = dataclasses.replace(core, sq=seq, sk=seq, mask=(2, 1, 1, seq))
    feeds = core_feeds(run, np.random.default_rng(fresh_seed()))
    (got,) = run_cpu(res.model, feeds)
    assert relative_error(got, core_reference(run, feeds)) <= 1e-5


@pytest.mark.parametrize("p", [PROJECTED[1], PROJECTED[4]], ids=lambda p: p.id)
def test_stitched_projected_core_runs_anywhere_through_its_function(p: Projected) -> None:
    rng = np.random.default_rng(fresh_seed())
    model = projected_model(p, rng)
    res = onnxstitch.optimize(model)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    feeds = projected_feeds(p, rng)
    (got,) = run_cpu(res.model, feeds)
    assert relative_error(got, projected_reference(p, model, feeds)) <= 1e-5


def test_verification_holds_tf32_groups_to_tf32_accuracy() -> None:
    rng = np.random.default_rng(fresh_seed())
    want = rng.standard_normal(1000).astype(np.float32)
    off_by = lambda rel: (want * (1 + rel * rng.choice([-1, 1], want.shape))).astype(want.dtype)  # noqa: E731
    assert not verify.compare(off_by(1e-3), want)[0]  # float32: 1e-4
    assert verify.compare(off_by(1e-3), want, tf32=True)[0]
    assert not verify.compare(off_by(1e-2), want, tf32=True)[0]  # a wrong mask or scale is far beyond
    half = want.astype(np.float16)
    assert verify.compare(off_by(1e-3).astype(np.float16), half, tf32=True)[0]
    assert not verify.compare(off_by(1e-1).astype(np.float16), half, tf32=True)[0]  # half keeps its own


# The runtime's "attention" rule on the CPU-EP test build: everything before the first driver call.

@pytest.fixture(scope="module")
def cpu_lib() -> Path:
    return rtbuild.build(extra_flags=("-DONNXSTITCH_CPU_EP_FOR_TESTS",))


def attention_node_model(shapes_in: dict[str, list], out_shape: list | None, spec: AttentionSpec | None,
                         names: list[str] | None = None) -> bytes:
    """A model of one attention FusedKernel reading graph inputs `shapes_in` (as `names`, which
    may repeat one, when given)."""
    names = names or list(shapes_in)
    attrs = dict(kernel_name="k0", vec_width=1, input_kinds=[1] * len(names), output_dtypes=[TP.FLOAT],
                 shape_rule="attention", ptx=b"// none")
    if spec is not None:
        attrs |= spec.attributes()
    node = helper.make_node("FusedKernel", names, ["y"], name="fused0", domain="com.onnxstitch", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in shapes_in.items()],
                          [helper.make_tensor_value_info("y", TP.FLOAT, out_shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxstitch", 1)],
                          ir_version=10)
    return m.SerializeToString()


def spec(**named) -> AttentionSpec:
    """A spec for heads of 8, 64 queries per block of 128 threads, unless `named` says otherwise."""
    return AttentionSpec(**({"head_size": 8, "queries": 64, "threads": 128, "shared_bytes": 0, "masks": 0,
                             "transposed": False} | named))


def cpu_run(lib: Path, model: bytes, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib))
    so.log_severity_level = 4
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def test_runtime_allocates_the_transposed_context(cpu_lib: Path) -> None:
    # No queries: the output is allocated at [b, s, h, d] and nothing is launched.
    model = attention_node_model({"q": [2, 3, 0, 8], "kt": [2, 3, 8, 5], "v": [2, 3, 5, 8], "m": [2, 1, 1, 5]},
                                 None, spec(masks=1, transposed=True))
    (y,) = cpu_run(cpu_lib, model, {"q": zeros(2, 3, 0, 8), "kt": zeros(2, 3, 8, 5), "v": zeros(2, 3, 5, 8),
                                    "m": zeros(2, 1, 1, 5)})
    assert y.shape == (2, 0, 3, 8)


@pytest.mark.parametrize("spec,feeds,message", [
    (None, {"q": zeros(1, 4, 8), "kt": zeros(1, 8, 4), "v": zeros(1, 4, 8)},
     "missing INT attribute 'attention_head_size'"),
    (spec(head_size=12), {"q": zeros(1, 4, 12), "kt": zeros(1, 12, 4), "v": zeros(1, 4, 12)},
     "the attention spec must have"),
    (spec(masks=1), {"q": zeros(1, 4, 8), "kt": zeros(1, 8, 4), "v": zeros(1, 4, 8)}, "and 1 mask\\(s\\), got 3"),
    (spec(), {"q": zeros(1, 4, 8), "kt": zeros(1, 4, 8), "v": zeros(1, 4, 8)}, "do not fit"),
    (spec(transposed=True), {"q": zeros(1, 4, 8), "kt": zeros(1, 8, 4), "v": zeros(1, 4, 8)}, "of rank 4"),
    (spec(masks=1), {"q": zeros(1, 4, 8), "kt": zeros(1, 8, 4), "v": zeros(1, 4, 8), "m": zeros(3, 4)},
     "does not broadcast"),
], ids=["missing", "head-12", "no-mask-input", "k-not-transposed", "transposed-rank-3", "mask"])
def test_runtime_names_what_does_not_fit(cpu_lib: Path, spec, feeds, message) -> None:
    model = attention_node_model({k: list(v.shape) for k, v in feeds.items()}, None, spec)
    with pytest.raises(Exception, match=f"fused0.*{message}"):
        cpu_run(cpu_lib, model, feeds)


def test_runtime_allocates_the_context_of_projections(cpu_lib: Path) -> None:
    # Read from x [b, s, 3·h·d]: the context is [b, s, h, d] (transposed) or [b, h, s, d].
    feeds = {"x": zeros(2, 0, 48), "bq": zeros(16), "bk": zeros(16), "bv": zeros(16)}
    ins = {k: list(v.shape) for k, v in feeds.items()}
    for transposed, shape in ((1, (2, 0, 2, 8)), (0, (2, 2, 0, 8))):
        model = attention_node_model(ins, None, spec(transposed=bool(transposed), heads=2, column_offsets=(0, 16, 32),
                                                     biases=True), ["x", "x", "x", "bq", "bk", "bv"])
        (y,) = cpu_run(cpu_lib, model, feeds)
        assert y.shape == shape


def test_runtime_names_projections_that_do_not_fit(cpu_lib: Path) -> None:
    # Two heads of 8 at column 40 of a 48-wide x: past its end.
    feeds = {"x": zeros(1, 4, 48)}
    model = attention_node_model({"x": [1, 4, 48]}, None, spec(transposed=True, heads=2, column_offsets=(0, 16, 40)),
                                 ["x", "x", "x"])
    with pytest.raises(Exception, match="fused0.*do not hold 2 heads of 8 at columns 0, 16, 40"):
        cpu_run(cpu_lib, model, feeds)


def test_the_plan_weighs_an_attention_chain_against_the_other_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain is a candidate of the one ILP, priced by its scheme: priced above what ORT's GEMMs
    and a rows kernel over its Softmax would cost, the plan takes those instead and says why."""
    model = core_model(SMALL)
    priced = attention.group_of

    def dear(*args, **kwargs):
        return dataclasses.replace(priced(*args, **kwargs), predicted_us=1e6)

    monkeypatch.setattr(attention, "group_of", dear)
    res = onnxstitch.optimize(model, verify=False)
    assert not any(grp.scheme == "attention" for grp in res.report.plan.groups)
    assert any(grp.scheme == "rows" for grp in res.report.plan.groups)  # its Softmax, stitched
    assert not res.report.attention
    assert any("the plan found other kernels over these nodes cheaper" in r for r in res.report.attention_refusals)
    monkeypatch.setattr(attention, "group_of", priced)
    fair = onnxstitch.optimize(model, verify=False)
    assert [grp.scheme for grp in fair.report.plan.groups] == ["attention"] and len(fair.report.attention) == 1


def test_a_long_mask_computation_stays_one_group_beside_the_chain() -> None:
    """The mask's arithmetic (more nodes than the small candidates hold) is grown as one maximal
    group; with the chain's own nodes free to join it, that group would reach into the chain's
    Add and Softmax, and the one that stops at the chain's edge must still be a candidate for
    the plan that takes the chain (t5-ts: one 7-node mask group, not 2 + 5)."""
    model = core_model(SMALL)
    g = model.graph
    mask_in = next(i for i in g.input if i.name == "mask")
    mask_in.name = "raw"
    ops = ["Neg", "Abs", "Sigmoid", "Neg", "Exp", "Neg", "Tanh", "Neg"]
    t = "raw"
    for k, op in enumerate(ops):
        out = "mask" if k == len(ops) - 1 else f"m{k}"
        g.node.insert(k, helper.make_node(op, [t], [out]))
        t = out
    res = onnxstitch.optimize(model, verify=False)
    groups = res.report.plan.groups
    assert sorted(grp.scheme for grp in groups) == ["attention", "elementwise"]
    assert [len(grp.nodes) for grp in groups if grp.scheme == "elementwise"] == [len(ops)]


# transformers' SDPA as the exporters write it (attention_models.Sdpa).

@pytest.mark.parametrize("s", SDPA, ids=lambda s: s.id)
def test_sdpa_forms_are_one_chain(s: Sdpa) -> None:
    g, f = attention_graph(sdpa_model(s))
    (m,) = f.matches
    assert not f.refusals
    fq, fk = s.factors
    assert m.scale == fq * fk  # the float32 constants' product, folded exactly
    assert (m.q, m.kt, m.v, m.guarded) == ("q", "kt", "v", s.guard)
    ops = sorted(g.nodes[i].op_type for i in m.nodes)
    scales = ["Div" if s.scale == "div" else "Mul"] * (1 if s.scale == "q" else 2)
    masks = [] if s.core.mask is None else ["Add"] if s.mask == "additive" else ["Where", "Add"] if s.mask == "first" \
        else ["Where"]
    want = ["MatMul", "MatMul", "Softmax"] + scales + masks + ["IsNaN", "Where"] * s.guard + ["Transpose"] * s.core.transposed
    assert ops == sorted(want)
    if s.core.mask is None:
        assert m.masks == () and m.select is None
    elif s.mask == "additive":  # Where(mask, 0, fill) is computed before the chain, once
        assert m.masks == ("bias",) and m.select is None
    elif s.mask == "first":  # the boolean mask before the padding mask's term
        assert m.masks == ("pad",) and m.select == attention.Select("mask", True, s.fill, first=True)
    else:
        assert m.masks == () and m.select == attention.Select("mask", s.mask == "keep", s.fill)


@pytest.mark.parametrize("mask", ["additive", "first"])
def test_gemma2s_logit_cap_is_in_the_chain(mask: str) -> None:
    """Mul(Tanh(Div(scores, cap)), cap) before the mask: one chain, the division folded into
    the scale, the cap the kernel's; the stitched model, run through its function on the CPU,
    matches the float64 reference on fresh inputs."""
    s = Sdpa(SMALL, exporter="ts", mask=mask, softcap=2.5)
    g, f = attention_graph(sdpa_model(s))
    (m,) = f.matches
    assert not f.refusals and m.softcap == 2.5
    fq, fk = s.factors
    assert m.scale == pytest.approx(fq * fk / 2.5, rel=1e-6)
    assert sorted(g.nodes[i].op_type for i in m.nodes if g.nodes[i].op_type in ("Tanh", "Div")) == ["Div", "Tanh"]
    res = onnxstitch.optimize(sdpa_model(s))
    assert [n.op_type for n in res.model.graph.node if n.op_type == "FusedKernel"]
    feeds = sdpa_feeds(s, np.random.default_rng(fresh_seed()))
    (got,) = run_cpu(res.model, feeds)
    assert relative_error(got, sdpa_reference(s, feeds)) <= 1e-5


def _sdpa_edited(s: Sdpa, edit) -> onnx.ModelProto:
    model = sdpa_model(s)
    edit(model.graph)
    return model


def _node(g: onnx.GraphProto, output: str) -> onnx.NodeProto:
    return next(n for n in g.node if output in n.output)


def _guard_of_half(g: onnx.GraphProto) -> None:
    g.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    _node(g, "p_guarded").input[1] = "half"


def _reshaped_scores(g: onnx.GraphProto) -> None:
    # DeBERTa reshapes its scores between the product and the Softmax.
    g.initializer.append(onnx.numpy_helper.from_array(np.array([2, 3, 10, 10], np.int64), "same"))
    g.node.insert(list(g.node).index(_node(g, "scores")) + 1, helper.make_node("Reshape", ["scores", "same"], ["scores_r"]))
    _node(g, "masked").input[0] = "scores_r"


def _three_terms(g: onnx.GraphProto) -> None:
    add = _node(g, "masked")
    add.output[0] = "masked1"
    at = list(g.node).index(add) + 1
    for k, (x, y) in enumerate((("masked1", "masked2"), ("masked2", "masked"))):
        g.node.insert(at + k, helper.make_node("Add", [x, "bias"], [y]))


def _boolean_before_two_terms(g: onnx.GraphProto) -> None:
    # (before one term, GPT-Neo's form, the kernel takes it: Select.first)
    where = _node(g, "masked")
    where.output[0] = "selected"
    at = list(g.node).index(where) + 1
    g.node.insert(at, helper.make_node("Add", ["selected", "q_bias"], ["biased"]))
    g.node.insert(at + 1, helper.make_node("Add", ["biased", "q_bias"], ["masked"]))
    g.input.append(helper.make_tensor_value_info("q_bias", TP.FLOAT, [10]))


SMALL_SDPA = Sdpa(SMALL)


@pytest.mark.parametrize("model,reason", [
    (_sdpa_edited(SMALL_SDPA, _guard_of_half), "reach the second MatMul through IsNaN, Where"),
    (_sdpa_edited(SMALL_SDPA, _reshaped_scores), "Reshape 'scores_r' between the scores' product and the Softmax"),
    (_sdpa_edited(SMALL_SDPA, _three_terms), "more terms than the kernel adds"),
    (_sdpa_edited(dataclasses.replace(SMALL_SDPA, mask="keep"), _boolean_before_two_terms),
     "a boolean mask before an added term"),
    (_sdpa_edited(SMALL_SDPA, _extra_output), "'p' is also read outside the chain"),
], ids=["guard-not-zero", "reshaped-scores", "three-terms", "boolean-before-term", "probabilities-read-outside"])
def test_sdpa_near_misses_name_what_stops_them(model: onnx.ModelProto, reason: str) -> None:
    f = found(model)
    assert not f.matches and len(f.refusals) == 1
    assert f.refusals[0].startswith("attention at 'p': ") and reason in f.refusals[0], f.refusals[0]


def test_a_scale_read_elsewhere_stays_outside_the_chain() -> None:
    # q·d^-1/4 is also a graph output: ONNX Runtime computes it anyway, and the kernel reads it
    # with kᵀ's factor alone as its scale.
    model = sdpa_model(SMALL_SDPA)
    model.graph.output.append(helper.make_tensor_value_info("q_scaled", TP.FLOAT, [2, 3, 10, 16]))
    (m,) = found(model).matches
    assert m.q == "q_scaled" and m.scale == SMALL_SDPA.factors[1]


@pytest.mark.parametrize("s", [SDPA[1], SDPA[3]], ids=lambda s: s.id)
def test_stitched_sdpa_core_runs_anywhere_through_its_function(s: Sdpa) -> None:
    # Verified inside optimize on ONNX Runtime's CPU (the fused node runs its function there),
    # then run on inputs with rows that attend to nothing.
    res = onnxstitch.optimize(sdpa_model(s), strict=True)
    assert [grp.scheme for grp in res.report.plan.groups].count("attention") == 1
    feeds = sdpa_feeds(s, np.random.default_rng(fresh_seed()), blank_rows=True)
    (got,) = run_cpu(res.model, feeds)
    want = sdpa_reference(s, feeds)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    assert relative_error(got[keep], want[keep]) <= 1e-5


@pytest.mark.parametrize("name", ["distilbert-dynamo", "roberta-dynamo", "clip-text-dynamo", "qwen2-dynamo",
                                  "distilbert-ts", "bert-ts"])
def test_exported_sdpa_models_get_one_attention_kernel_per_layer(name: str) -> None:
    # Verified on ONNX Runtime's CPU inside optimize (the fused nodes run their functions there).
    entry = corpus_entry(name)
    layers = int(re.search(r"\b(?:num_hidden_layers|n_layers)=(\d+)", entry["origin"]).group(1))
    res = onnxstitch.optimize(str(CORPUS / entry["file"]), shapes=entry["shapes"], strict=True)
    chains = [grp for grp in res.report.plan.groups if grp.scheme == "attention"]
    assert len(chains) == len(res.report.attention) == layers and not res.report.attention_refusals
    assert res.report.verification is not None and res.report.verification.tensors_checked
    kernels = {k["group"]: k for k in res.report.kernels}
    assert all(kernels[grp.name]["scheme"] == "attention" for grp in chains)


def test_values_of_their_own_width_are_one_kernel_and_say_so() -> None:
    """LeViT's chains: keys 16 wide, values 32. The match keeps both widths, the spec writes the
    value size (and only there: chains whose values are as wide as the keys write none), and a
    width the kernel cannot take is refused with why."""
    from onnxstitch.schemes.attention import codegen

    c = Core((2, 4), 49, 49, 16, (4, 49, 49), dv=32)
    g, found = attention_graph(core_model(c))
    (m,) = found.matches
    assert (m.head_dim, m.value_dim, m.values) == (16, 32, 32) and "(values 32)" in m.describe()
    attrs = codegen.generate(g, "stitch_h0", m).spec.attributes()
    assert attrs["attention_head_size"] == 16 and attrs["attention_value_size"] == 32
    g, found = attention_graph(core_model(dataclasses.replace(c, dv=None)))
    assert "attention_value_size" not in codegen.generate(g, "stitch_h0", found.matches[0]).spec.attributes()
    g, found = attention_graph(core_model(dataclasses.replace(c, dv=20)))
    assert not found.matches and any("value head size 20: a multiple of 8" in r for r in found.refusals), found.refusals
