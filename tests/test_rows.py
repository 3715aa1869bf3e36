"""Row reductions stitched with their elementwise neighbours (the rows scheme): each op plans
into one kernel that compiles for sm_80 and sm_90, keeps the original's outputs through the
fallback on CPU, and what is not stitched says why."""
from __future__ import annotations

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import parser

import onnxstitch
from onnxstitch.cost import CostModel
from onnxstitch import graph, shapes
from onnxstitch import rowplan as rows
from models.fuzz import run_cpu
from onnxstitch.inputs import random_feeds

from .row_models import arg_models, channel_models, column_models, row_models, trailing_models
from .stitching import assert_close, fresh_seed, prepared

CASES = [pytest.param(m, id=f"{name}-c{cols}-opset{opset}")
         for cols in (1, 7, 1000) for opset in (17, 18) for name, m, _ in row_models(3, cols, opset=opset)]
# Rows longer than any register path (the loop path), one opset.
CASES += [pytest.param(m, id=f"{name}-c65536-opset18") for name, m, _ in row_models(3, 65536, opset=18)]


@pytest.mark.parametrize("model", CASES)
def test_row_group_is_one_kernel_and_keeps_outputs(model: onnx.ModelProto) -> None:
    res = onnxstitch.optimize(model, shapes={"batch": [5]}, archs=("sm_80", "sm_90"), reductions=True)
    fused = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    assert len(fused) == 1 and len(res.model.graph.node) == 1, [n.op_type for n in res.model.graph.node]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in fused[0].attribute}
    assert attrs["shape_rule"] == b"rows"
    declared = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    # Row-shaped outputs (last dim 1 where the row is longer) are marked 1, the rest 0.
    for name, kind in zip(fused[0].output, attrs["output_kinds"]):
        cols = model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
        assert kind == (1 if declared[name][-1] == 1 and cols != 1 else 0) or cols == 1
    for batch in (4, 0):  # and empty tensors
        feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": batch})
        for a, b in zip(run_cpu(res.model, feeds), run_cpu(model, feeds)):
            assert_close(a, b)


@pytest.mark.parametrize("model", [pytest.param(m, id=f"{name}-c{cols}") for cols in (1, 7, 300)
                                   for name, m, _ in list(trailing_models(cols)) + list(channel_models(cols))
                                   + list(arg_models(cols)) + list(column_models(cols, 5))])
def test_trailing_rows_and_columns_plan_into_one_kernel_and_keep_outputs(model: onnx.ModelProto) -> None:
    # Columns priced at full bandwidth: at these sizes a column kernel is latency-bound and the
    # plan would rightly leave it to ORT (cost.column_share); here the kernel itself is tested.
    res = onnxstitch.optimize(model, shapes={"batch": [5]}, archs=("sm_90",), reductions=True,
                              cost=CostModel(column_share=False))
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"], [n.op_type for n in res.model.graph.node]
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 4})
    for a, b in zip(run_cpu(res.model, feeds), run_cpu(model, feeds)):
        assert_close(a, b)


def test_split_runs_of_axes_and_inner_use_of_keepdims_0_are_refused_with_reasons() -> None:
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[8, 8] x, float[4, 8, 2] w) => (float[1, 8, 1] y, float[8, 8] z) <int64[2] ax02 = {0, 2}> {
      a = Exp(w)
      b = ReduceSum<keepdims = 1>(a, ax02)
      y = Neg(b)
      c = Tanh(x)
      d = ReduceMax<axes = [-1], keepdims = 0>(c)
      z = Add(c, d)
    }""")
    res = onnxstitch.optimize(model, reductions=True)
    assert not any(n.op_type == "FusedKernel" and "b" in n.output for n in res.model.graph.node)
    assert not any(n.op_type == "FusedKernel" and {"d", "z"} <= set(n.output) | set(n.input) and "c" not in n.input
                   for n in res.model.graph.node)
    m, _ = prepared(model)
    g = graph.build(m, shapes.infer(m)[1], reductions=True)
    assert "only one run of consecutive axes" in " ".join(n.reason or "" for n in g.nodes)
    refusals = " ".join(r.reason for r in res.report.plan.rejections)
    assert "keepdims=0" in refusals, refusals


def test_no_reductions_leaves_them_to_ort_and_says_why() -> None:
    (name, model, _), *_ = row_models(3, 7)
    res = onnxstitch.optimize(model, reductions=False)
    assert not any(n.op_type == "FusedKernel" and "r" in n.output for n in res.model.graph.node)
    assert "--no-reductions" in " ".join(n.reason or "" for n in prepared(model, reductions=False)[1].nodes)


def test_report_names_each_groups_scheme_and_launch_shape() -> None:
    """The plan report says, per kernel, whether it is a rows or an elementwise kernel and
    how it is launched; the row geometry follows the row length (threads per row grow with it)."""
    shapes_seen = {}
    for cols in (7, 1000):
        (name, model, _), *_ = row_models(3, cols)
        res = onnxstitch.optimize(model, shapes={"batch": [64]}, archs=("sm_90",), verify=False)
        rep = res.report.to_json()
        (k,) = rep["kernels"]
        assert k["scheme"] == "rows" and k["row_axes"] == 1
        (grp,) = rep["plan"]["groups"]
        assert grp["kernel"] == k and isinstance(grp["left_out"], list)
        assert k["block"] % k["threads_per_row"] == 0 and k["rows_per_block"] * k["threads_per_row"] == k["block"]
        shapes_seen[cols] = k["threads_per_row"]
    assert shapes_seen[1000] > shapes_seen[7]
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[64, 32] x) => (float[64, 32] y) { a = Exp(x)  y = Neg(a) }""")
    (k,) = onnxstitch.optimize(model, archs=("sm_90",), verify=False).report.to_json()["kernels"]
    assert k["scheme"] == "elementwise" and "threads_per_row" not in k


@given(cols=st.integers(1, 200_000), vec=st.sampled_from([2, 4, 8]), forced=st.none() | st.sampled_from([1, 8, 32, 64, 256]),
       n_rows=st.none() | st.integers(1, 1 << 20), inputs=st.integers(1, 32))
@settings(max_examples=300, deadline=None)
def test_row_geometry_is_launchable_and_covers_the_row(cols: int, vec: int, forced: int | None,
                                                       n_rows: int | None, inputs: int) -> None:
    geo = rows.choose_geometry(cols, vec, 1, forced, n_rows, inputs)
    assert 1 <= geo.threads <= 1024
    assert geo.threads & (geo.threads - 1) == 0 if geo.threads <= 32 else geo.threads % 32 == 0
    assert geo.block % geo.threads == 0 and geo.block <= 1024 and (geo.threads <= 32 or geo.block == geo.threads)
    assert 0 <= geo.chunks <= rows.MAX_CHUNKS
    if geo.chunks:  # the register path holds the whole planned row, within the register bound
        assert geo.capacity >= cols
        assert geo.vec * geo.chunks + rows.BASE_REGISTERS <= rows.register_bound(geo.block)


@pytest.mark.parametrize("n,cols", [(8, 4096), (8, 8192), (16, 8192)])
def test_many_input_rows_keep_outputs_through_the_fallback(n: int, cols: int) -> None:
    from .row_models import many_input_rows

    model, ref = many_input_rows(n, cols)
    res = onnxstitch.optimize(model, shapes={"batch": [64]}, archs=("sm_90",))
    assert any(n.op_type == "FusedKernel" for n in res.model.graph.node)
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 3})
    (got,) = run_cpu(res.model, feeds)
    assert_close(got, ref(feeds)[0].astype(got.dtype))


def _sum_then_softmax(cols: int, rows: int | str = "rows") -> onnx.ModelProto:
    """x0 + x1 + x2 + x3 → Softmax over `rows` rows of `cols`."""
    h = onnx.helper
    ins = [h.make_tensor_value_info(f"x{j}", onnx.TensorProto.FLOAT, [rows, cols]) for j in range(4)]
    nodes = [h.make_node("Add", ["x0", "x1"], ["a"]), h.make_node("Add", ["a", "x2"], ["b"]),
             h.make_node("Add", ["b", "x3"], ["c"]), h.make_node("Softmax", ["c"], ["y"], axis=-1)]
    out = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [rows, cols])
    return h.make_model(h.make_graph(nodes, "g", ins, [out]), opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("cols,n_rows,passes", [(1000, 64, 1), (65536, 1024, 3), (65536, 16, 1)])
def test_the_cost_model_counts_the_loop_paths_passes(cols: int, n_rows: int, passes: int) -> None:
    # Softmax's loop path reads its row for the max, the sum and the output: three times; 64
    # 16 rows of 65536 are split across 8 blocks (rows.split_factor), each slice in registers.
    from onnxstitch import cost

    _, g = prepared(_sum_then_softmax(cols, n_rows))
    unit = n_rows * cols * 4  # one [rows, cols] float32 tensor
    softmax_only = frozenset({3})
    assert cost.group_bytes(g, frozenset({2, 3})) == (2 * passes + 1) * unit  # b, x3 in; y out
    assert rows.row_plan(g, softmax_only).in_registers == (passes == 1)


def test_long_rows_keep_a_many_input_producer_out_of_the_row_kernel() -> None:
    # Fused, the loop path would read x0..x3 three times each; apart, the Adds write c once.
    from onnxstitch.plan import make_plan

    for cols, want in ((1000, [[0, 1, 2, 3]]), (65536, [[0, 1, 2]])):
        _, g = prepared(_sum_then_softmax(cols, 1024))
        assert [list(grp.nodes) for grp in make_plan(g).groups] == want, cols


# -- split rows (few long rows) ---------------------------------------------------------------

@given(cols=st.integers(1, 1 << 22), n_rows=st.none() | st.integers(0, 1 << 16))
@settings(max_examples=300, deadline=None)
def test_split_factor_fills_the_gpu_within_a_portable_cluster(cols: int, n_rows: int | None) -> None:
    k = rows.split_factor(cols, n_rows)
    assert 1 <= k <= rows.MAX_SPLIT and k & (k - 1) == 0
    if k > 1:  # only few rows are split, into slices worth a cluster barrier
        assert n_rows is not None and n_rows * k // 2 < rows.SPLIT_TARGET_BLOCKS
        assert cols // k >= rows.SPLIT_MIN_SLICE
    elif n_rows and n_rows * 2 <= rows.SPLIT_TARGET_BLOCKS:  # not split: the row is short
        assert cols < 2 * rows.SPLIT_MIN_SLICE


@pytest.mark.parametrize("n_rows,cols,split", [(64, 40960, 2), (3, 20000, 4), (8, 50257, 8), (8, 262144, 8),
                                               (64, 10240, 1), (3, 8192, 1), (600, 65536, 1), (64, 2048, 1)])
def test_few_long_rows_plan_a_split_whose_slices_cover_the_row(n_rows: int, cols: int, split: int) -> None:
    _, g = prepared(_sum_then_softmax(cols, n_rows))
    plan = rows.row_plan(g, frozenset({3}))
    assert plan.split == split
    geo = plan.geometry
    # (rows one block holds in registers, 10 240 or 8192 elements, are not split)
    if split > 1:  # one block per slice: the block is the row's share
        assert geo.block == geo.threads >= 64 and plan.slice % geo.vec == 0
        assert plan.slice * split >= cols > plan.slice * (split - 1)
        assert plan.in_registers == (geo.chunks > 0 and geo.capacity >= plan.slice)


def test_split_rows_launch_clusters_and_report_them() -> None:
    """The rewritten node carries the blocks per row in row_geometry (docs/abi.md), the sm_90
    image has the cluster entries and the sm_80 image has none, and the report names the split."""
    from onnxstitch import compile as compile_mod

    res = onnxstitch.optimize(_sum_then_softmax(65536, 16), archs=("sm_80", "sm_90"), verify=False)
    (node,) = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    geometry = next(list(a.ints) for a in node.attribute if a.name == "row_geometry")
    assert geometry[3:] == [0, 8], geometry
    k = next(k for k in res.report.to_json()["kernels"] if k["scheme"] == "rows")
    assert k["blocks_per_row"] == 8
    src = rows_source(_sum_then_softmax(65536, 16))
    built = compile_mod.compile_kernel(src, ("sm_80", "sm_90"))
    for arch, image in zip(built.archs, built.images):
        has = all(f"{src.name}{s}".encode() in image for s in ("_rows_cl", "_rows64_cl"))
        assert has == (arch == "sm_90"), arch
    assert f"{src.name}_rows_cl".encode() not in built.ptx  # the compute_80 PTX has no clusters


def rows_source(model: onnx.ModelProto):
    from onnxstitch.pipeline import generate_kernel

    _, g = prepared(model)
    (grp,) = [grp for grp in onnxstitch.plan.make_plan(g).groups if rows.has_rows(g, grp.nodes)]
    return generate_kernel(g, "stitch_split", grp)


def test_long_few_rows_are_refused_only_where_they_cannot_split() -> None:
    """16 rows of 131072 elements: trailing rows are split, and so are 16 columns of 131072
    (rows.column_split_factor); with ArgMax they are left to ONNX Runtime with the reason."""
    def model(x: str, y: str, op: str) -> onnx.ModelProto:
        return parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[{x}] x) => ({y} y) {{ a = Exp(x)  y = {op}(a) }}""")

    for m in (model("16, 131072", "float[16, 131072]", "Softmax<axis = -1>"),
              model("131072, 16", "float[131072, 16]", "Softmax<axis = 0>")):
        res = onnxstitch.optimize(m, verify=False, gate=False, cost=CostModel(column_share=False))
        assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
        assert [k.get("blocks_per_row") for k in res.report.kernels] == [8], res.report.kernels
    for m in (model("16, 131072", "int64[16, 1]", "ArgMax<axis = -1>"),):
        res = onnxstitch.optimize(m, verify=False)
        assert "FusedKernel" not in [n.op_type for n in res.model.graph.node]
        why = " ".join(r.reason for r in res.report.plan.rejections)
        assert "too few, too long rows" in why and "split" in why, why


def test_rows_split_only_when_an_image_for_clusters_is_built() -> None:
    """Built for sm_80 only, few long rows are not split (one block per row, as that GPU runs
    them), and rows past the long-row bound are left to ONNX Runtime with the reason."""
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[16, 65536] x) => (float[16, 65536] y) { a = Exp(x)  y = Softmax<axis = -1>(a) }""")
    res = onnxstitch.optimize(model, archs=("sm_80",), verify=False)
    geometries = [list(a.ints) for n in res.model.graph.node for a in n.attribute if a.name == "row_geometry"]
    assert geometries and all(len(g) < 5 for g in geometries), geometries
    assert not any("blocks_per_row" in k for k in res.report.to_json()["kernels"])
    longer = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[16, 131072] x) => (float[16, 131072] y) { a = Exp(x)  y = Softmax<axis = -1>(a) }""")
    res = onnxstitch.optimize(longer, archs=("sm_80",), verify=False)
    assert "FusedKernel" not in [n.op_type for n in res.model.graph.node]
    assert "thread-block clusters" in " ".join(r.reason for r in res.report.plan.rejections)
