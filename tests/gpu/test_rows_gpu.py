"""The rows scheme on the GPU (marker `gpu`): every row op stitched with its neighbours,
against an independent float64 numpy reference on fresh random inputs, rows of 1, 7, 1000
and 65536 elements, float32 within 1e-5 and float16 within 1e-2 (relative norm error), every
output element written (outputs are poisoned first)."""
from __future__ import annotations

import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch.cost import CostModel
from onnxstitch.inputs import random_feeds

from ..row_models import (arg_models, channel_models, column_models, dynamic_row_model, group_norm_models, row_models,
                          trailing_models)
from ..stitching import assert_matches_reference, fresh_seed
from .test_stitched_gpu import run_gpu, stitch

pytestmark = pytest.mark.gpu

CASES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
         for dt in (TP.FLOAT, TP.FLOAT16) for cols in (1, 7, 768, 1000, 65536)
         for name, model, ref in row_models(3, cols, dtype=dt)
         if not (name == "ReduceProd" and cols > 7)]  # longer products leave float range


def _check_gpu(model, ref, dtype, plan: dict, run: dict, name: str, **settings) -> None:
    """Plan at `plan` sizes into one kernel (optimize's `settings` besides), run at `run` sizes
    on the GPU (outputs poisoned first), compare with the float64 reference: indices exactly,
    values by relative norm."""
    res = stitch(model, shapes=plan, verify=False, reductions=True, **settings)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"], name
    feeds = random_feeds(model, seed=fresh_seed(), dim_values=run)
    expected = ref(feeds)
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    like = [e if e.dtype.kind == "i" else e.astype(npd) for e in expected]
    got = run_gpu(res.model, feeds, like)
    for g, e in zip(got, expected):
        assert_matches_reference(g, e, dtype in (TP.FLOAT16, TP.BFLOAT16), name)


@pytest.mark.parametrize("name,model,ref,dtype", CASES)
def test_row_kernel_matches_float64_numpy(name, model, ref, dtype) -> None:
    _check_gpu(model, ref, dtype, {"batch": [5]}, {"batch": 5}, name)


TRAILING = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
            for dt in (TP.FLOAT, TP.FLOAT16) for cols in (1, 7, 300, 5000)
            for name, model, ref in list(trailing_models(cols, dtype=dt)) + list(channel_models(cols, dtype=dt))
            + list(arg_models(cols, dtype=dt))]


@pytest.mark.parametrize("name,model,ref,dtype", TRAILING)
def test_trailing_row_kernel_matches_float64_numpy(name, model, ref, dtype) -> None:
    _check_gpu(model, ref, dtype, {"batch": [5]}, {"batch": 5}, name)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
@pytest.mark.parametrize("cols", [3, 64, 1000, 40000])
def test_rows_longer_or_shorter_than_planned(dtype, cols) -> None:
    """Planned at 64 elements per row (the default symbolic dim), run at other lengths: the
    register path's capacity is exceeded and the loop path runs."""
    model, ref = dynamic_row_model(dtype)
    _check_gpu(model, ref, dtype, {"batch": [5]}, {"batch": 9, "cols": cols}, f"dynamic-{cols}")


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16, TP.BFLOAT16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n,cols", [(3, 768), (8, 4096), (8, 8192), (16, 8192), (2, 65536)])
def test_many_inputs_and_long_rows_match_float64_numpy(n, cols, dtype) -> None:
    """The register budget's paths: prefetch dropped, the loop path instead of a spilling
    register path, and the plan splitting many-input producers from long rows."""
    from ..row_models import many_input_rows

    model, ref = many_input_rows(n, cols, dtype)
    res = stitch(model, shapes={"batch": [64]}, verify=False)
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 5})
    # A partial sum the plan writes between two kernels is a tensor of the model's dtype.
    written = frozenset(t for node in res.model.graph.node for t in node.output)
    (want,) = ref(feeds, written)
    (got,) = run_gpu(res.model, feeds, [want.astype(helper.tensor_dtype_to_np_dtype(dtype))])
    assert_matches_reference(got, want, dtype != TP.FLOAT, f"{n} inputs x {cols}")


GROUP_NORMS = [pytest.param(name, model, ref, dt, id=f"{name}-c{c}g{g}-{'x'.join(map(str, sp))}-{TP.DataType.Name(dt).lower()}")
               for c, g, sp in [(8, 4, (5, 6)), (64, 32, (16, 16)), (320, 32, (64, 64)), (640, 32, (17, 19)),
                                (320, 32, (128, 128))]
               for dt in (TP.FLOAT, TP.FLOAT16)
               for name, model, ref in group_norm_models(c, g, sp, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", GROUP_NORMS)
def test_group_norm_kernel_matches_float64_numpy(name, model, ref, dtype) -> None:
    """Group norms in their [N, G, C/G, P] form (normalize.py): one kernel with the affine part
    and SiLU; outside it only Shape and the Reshapes ORT runs as views."""
    res = stitch(model, shapes={"batch": [2]}, verify=False)
    kinds = [n.op_type for n in res.model.graph.node]
    assert kinds.count("FusedKernel") == 1 and set(kinds) <= {"FusedKernel", "Shape", "Reshape"}, kinds
    feeds = random_feeds(model, seed=fresh_seed(), dim_values={"batch": 2})
    expected = ref(feeds)
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    for got, want in zip(run_gpu(res.model, feeds, [e.astype(npd) for e in expected]), expected):
        assert_matches_reference(got, want, dtype != TP.FLOAT, name)


SPLIT = [pytest.param(name, model, ref, dt, rows, cols, id=f"{name}-{rows}x{cols}-{TP.DataType.Name(dt).lower()}")
         for rows, cols, dt in [(3, 20000, TP.FLOAT), (3, 20000, TP.FLOAT16), (16, 65536, TP.FLOAT), (2, 400000, TP.FLOAT16)]
         for name, model, ref in row_models(rows, cols, dtype=dt) if name != "ReduceProd"
         # (float16 sums of 400 000 squares or magnitudes pass float16's range)
         and not (dt == TP.FLOAT16 and name in ("ReduceL1", "ReduceSumSquare"))]


@pytest.mark.parametrize("name,model,ref,dtype,rows,cols", SPLIT)
def test_split_row_kernel_matches_float64_numpy(name, model, ref, dtype, rows, cols) -> None:
    """Few long rows, each split across a cluster of blocks (sm_90; one block per row before):
    planned and run at `rows`, and run at 2 × rows + 1 (rows grid-strided by cluster)."""
    _check_gpu(model, ref, dtype, {"batch": [rows]}, {"batch": rows}, name)
    _check_gpu(model, ref, dtype, {"batch": [rows]}, {"batch": 2 * rows + 1}, name)


@pytest.mark.parametrize("cols", [3, 5000, 20000, 30001, 200000])
def test_split_rows_longer_or_shorter_than_planned(cols) -> None:
    """Planned at 4 rows of 20 000 (split in 4), run shorter (blocks without elements) and
    longer (slices past the registers: the loop path)."""
    from ..row_models import long_row_model

    model, ref = long_row_model()
    _check_gpu(model, ref, TP.FLOAT, {"batch": [4], "cols": [20000]}, {"batch": 4, "cols": cols}, f"cols={cols}")


COLUMNS = [pytest.param(name, model, ref, dt, id=f"{name}-r{length}x{inner}-{TP.DataType.Name(dt).lower()}")
           for length, inner in [(16, 8400), (7, 300), (40, 5), (300, 7), (1, 9)]
           for dt in (TP.FLOAT, TP.FLOAT16)
           for name, model, ref in column_models(length, inner, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", COLUMNS)
def test_column_reduction_kernel_matches_float64_numpy(name, model, ref, dtype) -> None:
    """Reductions over a run of axes followed by others (YOLO's DFL decode over 16 bins of 8400
    anchors among them): one thread per column, in registers up to 16 elements, re-read beyond.
    Priced at the full bandwidth: the plan leaves few long columns to ORT (rows.column_share),
    and the kernel is what is tested here."""
    _check_gpu(model, ref, dtype, {"batch": [3]}, {"batch": 3}, name, cost=CostModel(column_share=False))


SPLIT_COLUMNS = [pytest.param(name, model, ref, dt, id=f"{name}-{TP.DataType.Name(dt).lower()}")
                 for dt in (TP.FLOAT, TP.FLOAT16) for name, model, ref in column_models(1000, 12, dt)
                 if not name.startswith("ArgMax")]  # (positions are not split)


@pytest.mark.parametrize("name,model,ref,dtype", SPLIT_COLUMNS)
def test_split_column_kernel_matches_float64_numpy(name, model, ref, dtype) -> None:
    """Few long columns, each split across a cluster of 8 blocks (rowplan.column_split_factor):
    planned at batch 2, run at 2 and at 5 (columns grid-strided by cluster)."""
    for run in (2, 5):
        _check_gpu(model, ref, dtype, {"batch": [2]}, {"batch": run}, name, cost=CostModel(column_share=False))


@pytest.mark.parametrize("dtype,offset", [(TP.FLOAT, 30.0), (TP.FLOAT16, 1000.0)])
@pytest.mark.parametrize("cols", [64, 256, 768, 4096])
def test_layernorm_far_from_zero_matches_float64_numpy(dtype, offset, cols) -> None:
    """Rows whose mean is far from zero against their spread (std 1): a LayerNorm's mean and
    variance taken in one reduction (stitch_row_moments: sums of the row less one of its
    values) keep the variance, where the sum of squares less the squared sum would not (its
    error here is 2.7e-5 in float32 and 3e-2 in float16 against tolerances of 1e-5 and 1e-2)."""
    import numpy as np

    npd = helper.tensor_dtype_to_np_dtype(dtype)
    shape = ["batch", cols]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)], "ln",
        [helper.make_tensor_value_info("x", dtype, shape), helper.make_tensor_value_info("g", dtype, [cols]),
         helper.make_tensor_value_info("b", dtype, [cols])], [helper.make_tensor_value_info("y", dtype, shape)]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    res = stitch(model, shapes={"batch": [6]}, verify=False, reductions=True)
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"]
    rng = np.random.default_rng(fresh_seed())
    feeds = {"x": (offset + rng.standard_normal((6, cols))).astype(npd),
             "g": (1 + 0.1 * rng.standard_normal(cols)).astype(npd), "b": rng.standard_normal(cols).astype(npd)}
    h = feeds["x"].astype(np.float64)
    mu = h.mean(-1, keepdims=True)
    want = (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * feeds["g"] + feeds["b"]
    (got,) = run_gpu(res.model, feeds, [want.astype(npd)])
    assert_matches_reference(got, want, dtype == TP.FLOAT16, f"LayerNorm offset {offset}, {cols} columns")
