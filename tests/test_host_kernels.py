"""The generated kernels themselves, run on the CPU (tests/host_kernels.py): every scheme —
elementwise with broadcasting, layout views with vector, element and tiled stores, packed
groups, row kernels with shuffles, block reductions, the loop path and the register budget's
paths — in float32, float16 and bfloat16, through both entries (32- and 64-bit indices),
against independent references on fresh random inputs (float64 numpy, or ORT CPU running
the original model): float32 within 1e-5 and half precision within 1e-2 (relative norm
error), integers exactly, every output element written (outputs are poisoned first)."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch.inputs import random_feeds

from .host_kernels import HAVE_GXX, plan_sources, run_model
from .layout_models import QKV_PERMS, attention_projections, attention_split, layout_models
from .op_models import op_models
from .slice_models import slice_models
from .concat_models import concat_models
from .row_models import (arg_models, channel_models, column_models, group_norm_models, long_row_model, many_input_rows,
                         row_models, trailing_models)
from .stitching import assert_matches_reference, fresh_seed
from .test_codegen import _div_by

pytestmark = pytest.mark.skipif(not HAVE_GXX, reason="needs g++ to build kernels for the host")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("host-kernels")


def _np(dtype: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype))


def _check(model, ref, dtype: int, plan: dict, run: dict, folder, name: str, wide: bool | None = None,
           clusters: bool = True) -> None:
    feeds = random_feeds(model, seed=fresh_seed(), dim_values=run)
    expected = ref(feeds)
    names = [o.name for o in model.graph.output]
    like = {t: e if e.dtype.kind in "iub" else e.astype(_np(dtype)) for t, e in zip(names, expected)}
    got = run_model(model, feeds, like, plan, folder, wide=wide, clusters=clusters)
    for t, e in zip(names, expected):
        assert_matches_reference(got[t], e, dtype != TP.FLOAT, f"{name}: {t}")


# -- elementwise ----------------------------------------------------------------------------

OPS = [pytest.param(name, model, id=name) for name, model in op_models((7, 33))]


def _ort_reference(model: onnx.ModelProto):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


@pytest.mark.parametrize("name,model", OPS)
def test_every_op_kernel_matches_ort_cpu(name, model, folder) -> None:
    feeds = random_feeds(model, seed=fresh_seed())
    if "b" in feeds and feeds["b"].dtype.kind == "i":
        feeds["b"][feeds["b"] == 0] = 3  # integer division by zero is undefined
    expected = _ort_reference(model)(feeds)
    names = [o.name for o in model.graph.output]
    got = run_model(model, feeds, dict(zip(names, expected)), {}, folder)
    for t, e in zip(names, expected):
        g = got[t]
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=name)
        else:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), equal_nan=True,
                                       rtol=1e-2 if e.dtype == np.float16 else 1e-5,
                                       atol=1e-2 if e.dtype == np.float16 else 1e-6, err_msg=name)


@pytest.mark.parametrize("c", [1.4142135, 4.0, -0.1, 1e38])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
def test_division_by_a_constant(c, dtype, folder) -> None:
    model = _div_by(c, dtype)
    cc = float(np.array(c, _np(dtype)))
    if not np.isfinite(cc):
        pytest.skip(f"{c} is not finite in this dtype")
    _check(model, lambda f: [np.maximum(f["x"].astype(np.float64) / cc, 0)], dtype, {"n": [64]}, {"n": 37},
           folder, f"div{c}")


# -- layout views, tiles and packing ---------------------------------------------------------

LAYOUT = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
          for dt in (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16) for cols in (10, 64)
          for name, model, ref in layout_models(cols, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", LAYOUT)
def test_layout_tails(name, model, ref, dtype, folder) -> None:
    _check(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 3, "seq": 33}, folder, name)


PERMS = [p for p in itertools.permutations(range(4)) if p != (0, 1, 2, 3)]


# head_dim 64: whole tiles; 12: partial tiles; 5: vectors split (element path)
@pytest.mark.parametrize("perm", PERMS, ids=lambda p: "".join(map(str, p)))
@pytest.mark.parametrize("heads,head_dim,dtype", [(2, 64, TP.FLOAT), (4, 12, TP.FLOAT16), (3, 5, TP.FLOAT)],
                         ids=["whole-f32", "partial-f16", "split-f32"])
def test_every_permutation_of_an_attention_split(perm, heads, head_dim, dtype, folder) -> None:
    model, ref = attention_split(heads, head_dim, perm, dtype)
    _check(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 2, "seq": 33}, folder, f"perm{perm}")


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16, TP.BFLOAT16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("heads,head_dim", [(12, 64), (3, 5)])
@pytest.mark.parametrize("wide", [None, True], ids=["runtime-entry", "64-bit-entry"])
def test_packed_projection_tails(heads, head_dim, dtype, wide, folder) -> None:
    model, ref = attention_projections(heads, head_dim, dtype, QKV_PERMS)
    _check(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 2, "seq": 40}, folder, "packed", wide)


# -- folded Slice/Split (input boxes) -------------------------------------------------------

SLICES = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
          for dt in (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16) for cols in (10, 64)
          for name, model, ref in slice_models(cols, dt)]


@pytest.mark.parametrize("wide", [None, True], ids=["runtime-entry", "64-bit-entry"])
@pytest.mark.parametrize("name,model,ref,dtype", SLICES)
def test_boxed_inputs(name, model, ref, dtype, wide, folder) -> None:
    _check(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 3, "seq": 33}, folder, name, wide)


# -- stitched Concat (input windows) ---------------------------------------------------------

CONCATS = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
           for dt in (TP.FLOAT, TP.FLOAT16, TP.BFLOAT16) for cols in (2, 10, 64)
           for name, model, ref in concat_models(cols, dt)]


@pytest.mark.parametrize("wide", [None, True], ids=["runtime-entry", "64-bit-entry"])
@pytest.mark.parametrize("name,model,ref,dtype", CONCATS)
def test_windowed_inputs(name, model, ref, dtype, wide, folder) -> None:
    _check(model, ref, dtype, {"batch": [8], "seq": [128]}, {"batch": 3, "seq": 33}, folder, name, wide)


# -- rows -------------------------------------------------------------------------------------

ROWS = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
        for dt, cols in [(TP.FLOAT, 1), (TP.FLOAT, 7), (TP.FLOAT, 1000), (TP.FLOAT, 40000),
                         (TP.FLOAT16, 7), (TP.FLOAT16, 768), (TP.BFLOAT16, 1000)]
        for name, model, ref in row_models(3, cols, dtype=dt)]


@pytest.mark.parametrize("name,model,ref,dtype", ROWS)
def test_row_kernels(name, model, ref, dtype, folder) -> None:
    _check(model, ref, dtype, {"batch": [5]}, {"batch": 5}, folder, name)


TRAILING = [pytest.param(name, model, ref, dt, id=f"{name}-c{cols}-{TP.DataType.Name(dt).lower()}")
            for dt, cols in [(TP.FLOAT, 1), (TP.FLOAT, 7), (TP.FLOAT, 300), (TP.FLOAT16, 300)]
            for name, model, ref in list(trailing_models(cols, dtype=dt)) + list(channel_models(cols, dtype=dt))
            + list(arg_models(cols, dtype=dt))]


@pytest.mark.parametrize("name,model,ref,dtype", TRAILING)
def test_trailing_and_channel_row_kernels(name, model, ref, dtype, folder) -> None:
    _check(model, ref, dtype, {"batch": [5]}, {"batch": 5}, folder, name)


@pytest.mark.parametrize("name", ["Softmax", "LayerNormalization", "ReduceMax"])
@pytest.mark.parametrize("cols", [7, 1000])
def test_row_kernels_through_the_64_bit_entry(name, cols, folder) -> None:
    _, model, ref = next(c for c in row_models(3, cols) if c[0] == name)
    _check(model, ref, TP.FLOAT, {"batch": [5]}, {"batch": 5}, folder, name, wide=True)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("n,cols", [(3, 768), (8, 4096), (8, 8192), (2, 65536)])
def test_many_inputs_and_long_rows(n, cols, dtype, folder) -> None:
    """The register budget's paths: no prefetch, the loop path instead of a spilling register
    path, and plans that split a many-input producer from a long row."""
    model, ref = many_input_rows(n, cols, dtype)
    _check(model, ref, dtype, {"batch": [64]}, {"batch": 3}, folder, f"{n}x{cols}")


GROUP_NORMS = [pytest.param(name, model, ref, dt, id=f"{name}-c{c}g{g}-{'x'.join(map(str, sp))}-{TP.DataType.Name(dt).lower()}")
               for c, g, sp, dt in [(8, 4, (5, 6), TP.FLOAT), (6, 3, (7,), TP.FLOAT16), (32, 8, (40, 40), TP.FLOAT),
                                    (32, 4, (64, 65), TP.FLOAT16)]
               for name, model, ref in group_norm_models(c, g, sp, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", GROUP_NORMS)
def test_group_norm_kernels(name, model, ref, dtype, folder) -> None:
    """Group norms in their [N, G, C/G, P] form (normalize.py) with the affine part and SiLU:
    per-channel γ and β read per element across the row's two axes."""
    _check(model, ref, dtype, {"batch": [2]}, {"batch": 3}, folder, name)


# -- split rows (few long rows: a cluster of blocks per row) -------------------------------

def _splits(model, plan: dict) -> list[int]:
    return [src.spec.row_split for src in plan_sources(model, plan)[3]]


SPLIT_ROWS = [pytest.param(name, model, ref, dt, id=f"{name}-{TP.DataType.Name(dt).lower()}")
              for dt in (TP.FLOAT, TP.FLOAT16) for name, model, ref in row_models(3, 20000, dt)
              if name != "ReduceProd"  # (a product of 20 000 values leaves float range)
              and (dt == TP.FLOAT or name in ("Softmax", "LayerNormalization-bias", "RMSNorm", "ReduceMax"))]


@pytest.mark.parametrize("name,model,ref,dtype", SPLIT_ROWS)
def test_split_row_kernels(name, model, ref, dtype, folder) -> None:
    """3 rows of 20 000 planned: each row split across a cluster of 4 blocks, partial totals
    combined through the cluster's shared memory; run at 5 rows on a grid of 3 clusters (rows
    grid-strided by cluster, the last trip partly empty)."""
    assert _splits(model, {"batch": [3]}) == [4], name
    _check(model, ref, dtype, {"batch": [3]}, {"batch": 5}, folder, name)


@pytest.mark.parametrize("name", ["Softmax", "LayerNormalization-bias", "ReduceSum"])
def test_split_row_kernels_without_clusters(name, folder) -> None:
    """The same kernels' entries for GPUs without clusters: one block walks the whole row."""
    _, model, ref = next(c for c in row_models(3, 20000) if c[0] == name)
    _check(model, ref, TP.FLOAT, {"batch": [3]}, {"batch": 5}, folder, name, clusters=False)


@pytest.mark.parametrize("cols", [3, 5000, 20000, 30001])
@pytest.mark.parametrize("clusters", [True, False], ids=["clusters", "one-block"])
def test_split_rows_longer_or_shorter_than_planned(cols, clusters, folder) -> None:
    """Planned at 20 000 per row (split in 4), run shorter (blocks of the cluster without
    elements) and longer (each block's slice past its registers: the loop path)."""
    model, ref = long_row_model()
    plan = {"batch": [3], "cols": [20000]}
    assert _splits(model, plan) == [4]
    _check(model, ref, TP.FLOAT, plan, {"batch": 4, "cols": cols}, folder, f"cols={cols}", clusters=clusters)


def test_split_rows_through_the_64_bit_entry(folder) -> None:
    model, ref = long_row_model()
    _check(model, ref, TP.FLOAT, {"batch": [3], "cols": [20000]}, {"batch": 4, "cols": 20000}, folder, "wide", wide=True)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_split_group_norm_kernels(dtype, folder) -> None:
    """A group norm of 8 rows of 36 864 (64 channels in 4 groups, 48 × 48): 8 blocks per row."""
    name, model, ref = next(iter(group_norm_models(64, 4, (48, 48), dtype)))
    assert _splits(model, {"batch": [2]}) == [8]
    _check(model, ref, dtype, {"batch": [2]}, {"batch": 3}, folder, name)


COLUMNS = [pytest.param(name, model, ref, dt, id=f"{name}-r{length}x{inner}-{TP.DataType.Name(dt).lower()}")
           for length, inner, dt in [(16, 33, TP.FLOAT), (7, 300, TP.FLOAT16), (40, 5, TP.FLOAT), (1, 9, TP.FLOAT),
                                     (16, 20, TP.BFLOAT16)]
           for name, model, ref in column_models(length, inner, dt)]


@pytest.mark.parametrize("name,model,ref,dtype", COLUMNS)
def test_column_reduction_kernels(name, model, ref, dtype, folder) -> None:
    """Reductions over a run of axes followed by others: one thread per column, elements S
    apart; columns held in registers (up to 16) or re-read (40)."""
    _check(model, ref, dtype, {"batch": [3]}, {"batch": 3}, folder, name)


@pytest.mark.parametrize("name", ["Softmax-axis1", "LayerNorm-channels"])
def test_column_kernels_through_the_64_bit_entry(name, folder) -> None:
    _, model, ref = next(c for c in column_models(16, 33) if c[0] == name)
    _check(model, ref, TP.FLOAT, {"batch": [3]}, {"batch": 3}, folder, name, wide=True)


SPLIT_COLUMNS = [pytest.param(name, model, ref, dt, id=f"{name}-{TP.DataType.Name(dt).lower()}")
                 for dt in (TP.FLOAT, TP.FLOAT16) for name, model, ref in column_models(1000, 12, dt)
                 if not name.startswith("ArgMax")]  # (positions are not split)


@pytest.mark.parametrize("name,model,ref,dtype", SPLIT_COLUMNS)
def test_split_column_kernels(name, model, ref, dtype, folder) -> None:
    """Columns of 1000 planned at batch 2: each split across a cluster of 8 blocks of a warp
    (a column per thread, a slice of its length per block), each thread's partial totals
    combined through the cluster's shared memory; run at batch 3 (more columns than planned:
    the last block's worth partly empty)."""
    assert _splits(model, {"batch": [2]}) == [8], name
    _check(model, ref, dtype, {"batch": [2]}, {"batch": 3}, folder, name)


@pytest.mark.parametrize("name", ["Softmax-axis1", "LayerNorm-channels"])
@pytest.mark.parametrize("clusters,wide", [(False, None), (True, True)], ids=["one-block", "64-bit"])
def test_split_column_kernels_without_clusters_and_wide(name, clusters, wide, folder) -> None:
    """The same kernels' entries for GPUs without clusters (a block walks its columns' whole
    length), and the cluster entry with 64-bit indices."""
    _, model, ref = next(c for c in column_models(1000, 12) if c[0] == name)
    _check(model, ref, TP.FLOAT, {"batch": [2]}, {"batch": 3}, folder, name, clusters=clusters, wide=wide)


def _empty_row_model(op: str, shape: list[int], axes: list[int], keepdims: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TP.FLOAT, shape)
    out = [1 if d in axes else n for d, n in enumerate(shape)] if keepdims else \
        [n for d, n in enumerate(shape) if d not in axes]
    y = helper.make_tensor_value_info("y", TP.FLOAT, out)
    nodes = [helper.make_node("Neg", ["x"], ["t"]), helper.make_node(op, ["t", "axes"], ["y"], keepdims=keepdims)]
    g = helper.make_graph(nodes, "empty", [x], [y], [onnx.numpy_helper.from_array(np.array(axes, np.int64), "axes")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("op,identity", [("ReduceSum", 0.0), ("ReduceMax", -np.inf), ("ReduceMean", 0.0),
                                         ("ReduceProd", 1.0)])
@pytest.mark.parametrize("shape,axes", [([3, 4, 0], [2]), ([3, 0, 4], [1])], ids=["row", "column"])
@pytest.mark.parametrize("keepdims", [1, 0])
def test_empty_rows_hold_the_identity(op, identity, shape, axes, keepdims, folder) -> None:
    """A reduction over an empty run of axes gives one identity value per row (ONNX's rule,
    as ORT's CPU kernels: ReduceMean gives 0), in rows and in columns."""
    model = _empty_row_model(op, shape, axes, keepdims)
    want = np.full([1 if (d in axes and keepdims) else n for d, n in enumerate(shape) if keepdims or d not in axes],
                   identity, np.float32)
    (ort_cpu,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros(shape, np.float32)})
    np.testing.assert_array_equal(ort_cpu, want)  # the rule the kernel follows is ORT CPU's
    got = run_model(model, {"x": np.zeros(shape, np.float32)}, {"y": np.empty_like(want)}, {}, folder)
    np.testing.assert_array_equal(got["y"], want)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("tail,sizes", [("heads", (8, 8, 8)), ("heads", (8, 16, 8)), ("glu", (24, 24))])
def test_kernels_reading_a_merged_gemm_through_slices(tail, sizes, dtype, folder) -> None:
    """Sibling MatMuls merged (siblings.py): the kernels after the one GEMM read their columns
    of its product as boxes (strided rows of the wider product)."""
    from .sibling_models import projections

    model, ref = projections(sizes, 16, dtype=dtype, tail=tail, heads=4, seed=fresh_seed())
    _check(model, ref, dtype, {"batch": [2], "seq": [8]}, {"batch": 3, "seq": 5}, folder, f"{tail} {sizes}")

