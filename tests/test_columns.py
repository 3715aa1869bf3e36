"""Column reductions priced by the bandwidth they can reach: ConvNeXt V2's GRN (an L2 norm over
H × W of NHWC activations, few long columns) planned at full bandwidth ran the model at 0.45× of
stock ORT on an H200; priced by its columns' bytes in flight it is left to ONNX Runtime while
the elementwise work around it still fuses, and a column reduction over many short columns
(YOLOv8's DFL decode) still plans as one kernel."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from onnxstitch import cost as cost_mod
from onnxstitch import rowplan as rows

from .stitching import prepared


def grn(n: int, h: int, w: int, c: int, written: str = "ReduceL2") -> onnx.ModelProto:
    """ConvNeXt V2's GRN over NHWC x: Gx = ‖x‖₂ over (H, W); Nx = Gx / (mean_C(Gx) + 1e-6);
    y = γ·(x·Nx) + β + x — as the TorchScript exporter writes it (ReduceL2) or the dynamo one
    (x², ReduceSum, Sqrt)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), k) for k in ("gamma", "beta")]
    inits += [numpy_helper.from_array(np.array([1, 2], np.int64), "hw"), numpy_helper.from_array(np.array([-1], np.int64), "ch"),
              numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
    mk = helper.make_node
    if written == "ReduceL2":
        norm = [mk("ReduceL2", ["x", "hw"], ["gx"], keepdims=1)]
    else:
        norm = [mk("Mul", ["x", "x"], ["sq"]), mk("ReduceSum", ["sq", "hw"], ["ss"], keepdims=1), mk("Sqrt", ["ss"], ["gx"])]
    nodes = norm + [mk("ReduceMean", ["gx", "ch"], ["mean"], keepdims=1), mk("Add", ["mean", "eps"], ["den"]),
                    mk("Div", ["gx", "den"], ["nx"]), mk("Mul", ["x", "nx"], ["xn"]), mk("Mul", ["gamma", "xn"], ["g"]),
                    mk("Add", ["g", "beta"], ["gb"]), mk("Add", ["gb", "x"], ["y"])]
    graph = helper.make_graph(nodes, "grn", [helper.make_tensor_value_info("x", TP.FLOAT, [n, h, w, c])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [n, h, w, c])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("written", ["ReduceL2", "ReduceSum"])
@pytest.mark.parametrize("clusters", [True, False], ids=["sm_90", "sm_80"])
def test_grn_over_few_long_columns_is_priced_at_its_share(written: str, clusters: bool) -> None:
    """768 columns of 3136: split across clusters of 8 blocks of a warp each where the targets
    have clusters (192 blocks, 32 loads in flight per thread: 3/8 of the bytes in flight the
    bandwidth needs), else 24 blocks of a warp (under 5%). Priced at that share, a ReduceL2
    alone is left to ONNX Runtime either way; x², ReduceSum and Sqrt (the dynamo form) are one
    split kernel that saves writing x² where the targets have clusters, and go to ONNX Runtime
    where they do not. The elementwise work around the norm fuses in every case."""
    model = grn(8, 56, 56, 96, written)
    archs = ("sm_90",) if clusters else ("sm_80",)
    m, g = prepared(model, archs=archs)
    norm = next(n.index for n in g.nodes if n.op_type in ("ReduceL2", "ReduceSum"))
    plan = rows.row_plan(g, frozenset({norm}))
    assert plan.inner == 1 and plan.rows == 8 * 96 and plan.cols == 56 * 56
    assert (plan.split, plan.geometry.block) == ((8, 32) if clusters else (1, 32))
    share = rows.column_share(plan, 4)
    assert share == pytest.approx(0.375) if clusters else share < 0.05
    # The column kernel is priced at its share: several times the bytes' time at full bandwidth.
    full = cost_mod.CostModel().kernel_us(cost_mod.group_bytes(g, {norm}))
    assert cost_mod.group_us(g, cost_mod.CostModel(), {norm}) > (1.5 if clusters else 8) * full
    res = onnxstitch.optimize(model, verify=False, gate=False, archs=archs)
    labels = [lbl for grp in res.report.plan.groups for lbl in grp.labels]
    fused = any(lbl.startswith(("ReduceL2", "ReduceSum")) for lbl in labels)
    assert fused == (clusters and written == "ReduceSum"), labels
    assert any(lbl.startswith("Div") for lbl in labels)  # the elementwise work around it still fuses


def test_grn_over_columns_a_split_fills_is_one_kernel() -> None:
    """3072 columns of 3136 (384 channels at batch 8), as the dynamo exporter writes the norm
    (x², ReduceSum, Sqrt): split in 8, at full share; the square, the sum and the root are one
    split column kernel (the square is never written)."""
    model = grn(8, 56, 56, 384, "ReduceSum")
    m, g = prepared(model, archs=("sm_90",))
    norm = next(n.index for n in g.nodes if n.op_type == "ReduceSum")
    plan = rows.row_plan(g, frozenset({norm}))
    assert plan.split == 8 and rows.column_share(plan, 4) == 1.0
    res = onnxstitch.optimize(model, verify=False, gate=False, archs=("sm_90",))
    (grp,) = [grp for grp in res.report.plan.groups if any(lbl.startswith("ReduceSum") for lbl in grp.labels)]
    assert grp.scheme == "rows" and any(lbl.startswith("Sqrt") for lbl in grp.labels), grp.labels
    (k,) = [k for k in res.report.kernels if k["group"] == grp.name]
    assert k.get("blocks_per_row") == 8, k


def test_many_short_columns_still_plan_as_one_kernel() -> None:
    """YOLOv8's DFL decode: a Softmax over 16 bins on axis 1 of [1, 16, 4, 8400], weighted sum."""
    mk = helper.make_node
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1), "w")
    axes = numpy_helper.from_array(np.array([1], np.int64), "ax")
    nodes = [mk("Softmax", ["x"], ["p"], axis=1), mk("Mul", ["p", "w"], ["pw"]),
             mk("ReduceSum", ["pw", "ax"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "dfl", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 16, 4, 8400])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8400])], [w, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    m, g = prepared(model)
    sm = next(n.index for n in g.nodes if n.op_type == "Softmax")
    assert rows.column_share(rows.row_plan(g, frozenset({sm})), 4) == 1.0
    res = onnxstitch.optimize(model, verify=False, gate=False)
    (grp,) = res.report.plan.groups
    assert len(grp.nodes) == 3 and grp.scheme == "rows"


def test_split_column_kernel_batches_its_loads_and_alternates_its_slots() -> None:
    """The split GRN norm's kernel (3072 columns of 3136, clusters of 8 blocks of 128 threads):
    its loop takes whole steps of COLUMN_UNROLL loads (all issued before the first is used, then
    one guarded step for the slice's last elements), its launch bound leaves ptxas the registers
    for them (rowplan.COLUMN_REGISTERS), and consecutive trips of a cluster use alternate slots
    (the trip's parity was once taken of row0 / G * per_block: even at every trip)."""
    from onnxstitch.schemes.rows.codegen import generate_rows

    m, g = prepared(grn(8, 56, 56, 384, "ReduceSum"), archs=("sm_90",))
    nodes = tuple(n.index for n in g.nodes if n.op_type in ("Mul", "ReduceSum", "Sqrt") and
                  (n.op_type != "Mul" or n.inputs[0] == n.inputs[1] == "x"))
    plan = rows.row_plan(g, frozenset(nodes))
    assert (plan.split, plan.geometry.block) == (8, 128)
    src = generate_rows(g, "k", nodes).source
    assert f"constexpr int UN = {rows.COLUMN_UNROLL};" in src and "for (; cm + UN <= Cr; cm += UN)" in src
    assert f"__launch_bounds__(128, {rows.column_min_blocks(128)})" in src
    trip = next(line for line in src.splitlines() if "const int trip" in line).split("=", 1)[1].strip(" ;")
    expr = trip.replace("(int)", "").replace("(I)", "").replace("gridDim.x", "G").replace("/", "//")
    grid, ks, per_block = 48, 8, 128
    for k in range(4):
        for cluster in range(grid // ks):
            row0 = cluster * per_block + k * (grid // ks) * per_block
            assert eval(expr, {"row0": row0, "G": grid, "KS": ks, "per_block": per_block}) == k & 1
