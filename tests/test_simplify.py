"""The simplify stage (simplify.py): the padding mask as transformers 5 exports it through
torch.onnx (Range, Unsqueeze, Expand, Concat, GatherND, And, Where) loses its index arithmetic,
and the result equals the original model on fresh random masks (run by ONNX Runtime's CPU
provider) and an independent numpy construction of the mask; variations that are not index
grids or not known all true are left as they are."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from onnxstitch import load, shapes, simplify, sizes

from .stitching import fresh_seed

MIN = np.float32(np.finfo(np.float32).min)


def mask_model(*, start: int = 0, bound: int = 0, scores_rows: bool = True, grid_order: bool = True,
               expose_and: bool = False) -> onnx.ModelProto:
    """scores [b, h, s, s] + where(mask[b, None, None, :] & (arange(s)[:, None] >= bound), 0, min),
    built as the exporter does (`start`: the batch Range's start; `scores_rows`: False makes the
    scores [b, h, 1, s], which cannot absorb a [b, 1, s, s] mask's query axis being dropped)."""
    c = lambda name, v, dt=np.int64: numpy_helper.from_array(np.array(v, dt), name)  # noqa: E731
    inits = [c("zero", 0), c("one", 1), c("start", start), c("bound", bound), c("ax12", [1, 2]), c("ax01", [0, 1]),
             c("ax3", [3]), c("ax2", [2]), c("last", [-1]), c("true", True, np.bool_), c("zeros", 0.0, np.float32),
             c("min", MIN, np.float32)]
    n = helper.make_node
    nodes = [
        n("Shape", ["mask"], ["b1"], start=0, end=1), n("Squeeze", ["b1"], ["b"]),
        n("Shape", ["mask"], ["s1"], start=1, end=2), n("Squeeze", ["s1"], ["s"]),
        n("Cast", ["mask"], ["bmask"], to=TP.BOOL),
        n("Range", ["start", "b", "one"], ["arange"]), n("Range", ["zero", "s", "one"], ["arange2"]),
        n("Unsqueeze", ["arange", "ax12"], ["u1"]), n("Unsqueeze", ["u1", "ax3"], ["batch_idx"]),  # [b, 1, 1, 1]
        n("Unsqueeze", ["arange2", "ax01"], ["u7"]), n("Unsqueeze", ["u7", "ax3"], ["query_idx"]),  # [1, 1, s, 1]
        n("Unsqueeze", ["u7", "ax2"], ["key_idx"]),  # [1, 1, 1, s]
        n("GreaterOrEqual", ["query_idx", "bound"], ["ge"]), n("And", ["true", "ge"], ["rows"]),
        n("Max", ["batch_idx", "key_idx"], ["grid"]), n("Shape", ["grid"], ["grid_shape"]),
        n("Expand", ["batch_idx" if grid_order else "key_idx", "grid_shape"], ["e0"]),
        n("Unsqueeze", ["e0", "last"], ["i0"]),
        n("Expand", ["key_idx" if grid_order else "batch_idx", "grid_shape"], ["e1"]),
        n("Unsqueeze", ["e1", "last"], ["i1"]),
        n("Concat", ["i0", "i1"], ["idx"], axis=-1), n("GatherND", ["bmask", "idx"], ["keys"]),
        n("And", ["rows", "keys"], ["both"]), n("Where", ["both", "zeros", "min"], ["where"]),
        n("Add", ["scores", "where"], ["y"]),
    ]
    rows = "s" if scores_rows else 1
    outs = [helper.make_tensor_value_info("y", TP.FLOAT, ["b", "h", "s", "s"])]
    if expose_and:
        outs.append(helper.make_tensor_value_info("both", TP.BOOL, ["b", 1, "s", "s"]))
    g = helper.make_graph(nodes, "mask", [helper.make_tensor_value_info("mask", TP.INT64, ["b", "s"]),
                                           helper.make_tensor_value_info("scores", TP.FLOAT, ["b", "h", rows, "s"])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def simplified(model: onnx.ModelProto) -> simplify.Simplified:
    m = load.constants_to_initializers(model)
    m, _ = sizes.resolve_shapes(m, {})
    return simplify.simplify(m, shapes.infer(m)[1])


def feeds(rng: np.random.Generator, b: int = 3, h: int = 2, s: int = 7, rows: int | None = None) -> dict:
    mask = (rng.random((b, s)) < 0.7).astype(np.int64)
    return {"mask": mask, "scores": rng.standard_normal((b, h, rows or s, s)).astype(np.float32)}


def run(model: onnx.ModelProto, f: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)


def test_exported_mask_loses_its_index_arithmetic() -> None:
    model = mask_model()
    out = simplified(model)
    assert len(out.rewrites) == 3  # the And with True, the GatherND, the And with rows ≥ 0
    ops_left = [n.op_type for n in out.model.graph.node]
    assert "GatherND" not in ops_left and "And" not in ops_left and "Range" not in ops_left
    assert out.tensors["where"].shape == ("b", 1, 1, "s")  # the key axis only
    f = feeds(np.random.default_rng(fresh_seed()))
    (got,) = run(out.model, f)
    (orig,) = run(model, f)
    want = f["scores"] + np.where(f["mask"][:, None, None, :] != 0, np.float32(0), MIN)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, orig)


@pytest.mark.parametrize("variant,kwargs,left", [
    ("batch range from 1", {"start": 1}, "GatherND"),  # indices are not the grid 0..b
    ("components out of order", {"grid_order": False}, "GatherND"),
    ("rows ≥ 1 are not all true", {"bound": 1}, "And"),
])
def test_what_is_not_a_grid_or_not_all_true_stays(variant, kwargs, left) -> None:
    model = mask_model(**kwargs)
    out = simplified(model)
    assert left in [n.op_type for n in out.model.graph.node], variant
    f = feeds(np.random.default_rng(fresh_seed()))
    if kwargs.get("start"):  # the batch Range then has fewer entries than the batch: run b = 1 + 1
        f = feeds(np.random.default_rng(fresh_seed()), b=2)
        f["mask"] = f["mask"][:2]
    try:
        (orig,) = run(model, f)
    except Exception:
        return  # the original itself does not run at these sizes; nothing more to compare
    (got,) = run(out.model, f)
    np.testing.assert_array_equal(got, orig)


def test_the_mask_keeps_its_query_axis_where_a_reader_needs_it() -> None:
    # Scores with one row: the [b, 1, s, s] mask's query axis makes the output's; the And stays
    # (the GatherND still goes).
    model = mask_model(scores_rows=False)
    out = simplified(model)
    assert [r for r in out.rewrites if "GatherND" in r] and "And" in [n.op_type for n in out.model.graph.node]
    f = feeds(np.random.default_rng(fresh_seed()), rows=1)
    np.testing.assert_array_equal(run(out.model, f)[0], run(model, f)[0])


def test_a_graph_output_keeps_its_shape() -> None:
    out = simplified(mask_model(expose_and=True))
    assert "And" in [n.op_type for n in out.model.graph.node]
    assert out.tensors["both"].shape == ("b", 1, "s", "s")


def test_bert_plans_with_a_key_padding_mask() -> None:
    model = onnx.load(str(Path(__file__).resolve().parents[1] / "models/small/bert-base-float32.onnx"))
    res = onnxstitch.optimize(model, shapes={"batch": [2], "sequence": [16]})
    assert len(res.report.simplified) == 3
    assert "GatherND" not in [n.op_type for n in res.model.graph.node]
    assert res.report.to_json()["simplify"]["rewrites"] == list(res.report.simplified)
    v = res.report.verification
    assert v is not None and not v.skipped and v.tensors_checked > 0


def test_before_opset_13_the_unsqueeze_takes_its_axes_as_an_attribute() -> None:
    c = lambda name, v, dt=np.int64: numpy_helper.from_array(np.array(v, dt), name)  # noqa: E731
    n = helper.make_node
    nodes = [n("Range", ["zero", "two", "one"], ["rb"]), n("Range", ["zero", "five", "one"], ["rk"]),
             n("Unsqueeze", ["rb"], ["ub"], axes=[1, 2, 3]), n("Unsqueeze", ["rk"], ["uk"], axes=[0, 1, 2]),
             n("Expand", ["ub", "grid"], ["eb"]), n("Expand", ["uk", "grid"], ["ek"]),
             n("Unsqueeze", ["eb"], ["ib"], axes=[-1]), n("Unsqueeze", ["ek"], ["ik"], axes=[-1]),
             n("Concat", ["ib", "ik"], ["idx"], axis=-1), n("GatherND", ["keep", "idx"], ["kept"]),
             n("Where", ["kept", "x", "zeros"], ["y"])]
    inits = [c("zero", 0), c("one", 1), c("two", 2), c("five", 5), c("grid", [2, 1, 1, 5]), c("zeros", 0.0, np.float32)]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "grid", [vi("keep", TP.BOOL, [2, 5]), vi("x", TP.FLOAT, [2, 3, 5, 5])],
                          [vi("y", TP.FLOAT, [2, 3, 5, 5])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    out = simplified(model)
    (unsq,) = [x for x in out.model.graph.node if x.output[0] == "kept"]
    assert unsq.op_type == "Unsqueeze" and list(helper.get_attribute_value(unsq.attribute[0])) == [1, 2]
    rng = np.random.default_rng(fresh_seed())
    f = {"keep": rng.random((2, 5)) < 0.5, "x": rng.standard_normal((2, 3, 5, 5)).astype(np.float32)}
    want = np.where(f["keep"][:, None, None, :], f["x"], np.float32(0))
    np.testing.assert_array_equal(run(out.model, f)[0], want)
    np.testing.assert_array_equal(run(model, f)[0], want)


def repeat_shape_model(gather: int) -> onnx.ModelProto:
    """V [b, 2, s, 4] repeated to 6 heads (repeat_kv), its Transpose an output, and one dim of the
    repeated tensor's Shape (TorchScript sizes its attention output from it) another."""
    vi, mk = helper.make_tensor_value_info, helper.make_node
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [mk("Unsqueeze", ["v", "ax2"], ["vu"]), mk("Shape", ["v"], ["vs"]),
             mk("Concat", ["vs01", "three", "vs23"], ["exp"], axis=0),
             mk("Slice", ["vs", "zero", "two"], ["vs01"]), mk("Slice", ["vs", "two", "four"], ["vs23"]),
             mk("Expand", ["vu", "exp"], ["ve"]), mk("Reshape", ["ve", "rep"], ["vr"]),
             mk("Transpose", ["vr"], ["y"], perm=[0, 1, 3, 2]),
             mk("Shape", ["vr"], ["shape"]), mk("Gather", ["shape", "index"], ["dim"], axis=0),
             mk("Unsqueeze", ["dim", "ax0"], ["z"])]
    inits = [i64("ax2", [2]), i64("ax0", [0]), i64("three", [3]), i64("zero", [0]), i64("two", [2]), i64("four", [4]),
             i64("rep", [0, 6, -1, 4]), i64("index", gather)]
    g = helper.make_graph(nodes, "repeat", [vi("v", TP.FLOAT, ["b", 2, "s", 4])],
                          [vi("y", TP.FLOAT, None), vi("z", TP.INT64, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("gather, rewritten", [(0, True), (2, True), (3, None), (-1, None), (1, None), (-3, None)])
def test_the_shape_of_a_repeated_kv_reads_it_unrepeated(gather: int, rewritten: bool | None) -> None:
    # A dim of the batch or the length reads V itself; a fixed one (the heads, the head size)
    # is a constant, and the Shape goes (None).
    model = repeat_shape_model(gather)
    res = simplified(model)
    shape = next((n for n in res.model.graph.node if n.output[0] == "shape"), None)
    if rewritten is None:
        assert shape is None and any("fixed dims" in r for r in res.rewrites), res.rewrites
    else:
        assert shape is not None and (shape.input[0] == "v") == rewritten and bool(res.rewrites) == rewritten
    f = {"v": np.random.default_rng(fresh_seed()).standard_normal((3, 2, 5, 4)).astype(np.float32)}
    for a, b in zip(run(model, f), run(res.model, f)):
        np.testing.assert_array_equal(a, b)


def test_a_product_over_heads_flattened_into_rows_reads_them_merged() -> None:
    """GPT-2's attention output: the context [b, s, h, d] flattened to [b·s, h·d] for the Gemm
    becomes a Reshape to [0, 0, h·d] and one MatMul over the rows, equal on fresh inputs."""
    rng = np.random.default_rng(fresh_seed())
    w = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w")  # transB: [N, K]
    c = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "c")
    rows = numpy_helper.from_array(np.array([-1, 16], np.int64), "rows")
    n = numpy_helper.from_array(np.array([8], np.int64), "n")
    mk = helper.make_node
    nodes = [mk("Reshape", ["x", "rows"], ["flat"]), mk("Gemm", ["flat", "w", "c"], ["p"], name="proj", transB=1),
             mk("Shape", ["x"], ["lead"], start=0, end=2), mk("Concat", ["lead", "n"], ["ys"], axis=0),
             mk("Reshape", ["p", "ys"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w, c, rows, n])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    assert s.rewrites == ("proj (Gemm on rows flattened from 'x') is a MatMul over them with its bias added",)
    ops = [n.op_type for n in s.model.graph.node]
    assert ops == ["Reshape", "MatMul", "Add"] and s.tensors["y"].shape == ("b", 3, 8)
    x = rng.standard_normal((5, 3, 4, 4)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]  # noqa: E731
    want = x.reshape(5, 3, 16).astype(np.float64) @ numpy_helper.to_array(w).T.astype(np.float64) + numpy_helper.to_array(c)
    np.testing.assert_allclose(run(model), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(s.model), want, rtol=1e-5, atol=1e-5)


def test_products_sharing_a_weight_made_at_run_time_transpose_it_each() -> None:
    """Two flattened Gemms (transB) reading one weight that is a graph input: each gets its own
    Transpose, and the rewritten model is valid and equal on fresh inputs."""
    rng = np.random.default_rng(fresh_seed())
    rows = numpy_helper.from_array(np.array([-1, 16], np.int64), "rows")
    unrows = numpy_helper.from_array(np.array([2, 3, 8], np.int64), "unrows")
    mk = helper.make_node
    nodes = [mk("Reshape", ["x", "rows"], ["flat"])]
    for k in range(2):
        nodes += [mk("Gemm", ["flat", "w"], [f"p{k}"], name=f"proj{k}", transB=1),
                  mk("Reshape", [f"p{k}", "unrows"], [f"y{k}"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3, 16]),
                                       helper.make_tensor_value_info("w", TP.FLOAT, [8, 16])],
                          [helper.make_tensor_value_info(f"y{k}", TP.FLOAT, None) for k in range(2)], [rows, unrows])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    assert len(s.rewrites) == 2 and [n.op_type for n in s.model.graph.node].count("Transpose") == 2
    onnx.checker.check_model(s.model, full_check=True)
    feeds = {"x": rng.standard_normal((2, 3, 16)).astype(np.float32), "w": rng.standard_normal((8, 16)).astype(np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    for got, want in zip(run(s.model), run(model)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _aliased_batchnorms(rng: np.random.Generator, nested: bool = False) -> onnx.ModelProto:
    """Two BatchNormalization → Relu layers whose scale and shift are one initializer each,
    given to the second layer through Identity nodes, as TorchScript's exporter writes equal
    weights (DenseNet's untrained BatchNorms). `nested`: an If branch also reads an alias."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    ch = 4
    inits = [c("scale", rng.uniform(0.5, 2.0, ch)), c("shift", rng.standard_normal(ch)),
             c("mean", rng.standard_normal(ch)), c("var", rng.uniform(0.5, 2.0, ch)),
             c("mean2", rng.standard_normal(ch)), c("var2", rng.uniform(0.5, 2.0, ch))]
    mk = helper.make_node
    nodes = [mk("Identity", ["scale"], ["scale2"], name="alias_scale"),
             mk("Identity", ["shift"], ["shift2"], name="alias_shift"),
             mk("BatchNormalization", ["x", "scale", "shift", "mean", "var"], ["b1"]), mk("Relu", ["b1"], ["r1"]),
             mk("BatchNormalization", ["r1", "scale2", "shift2", "mean2", "var2"], ["b2"]), mk("Relu", ["b2"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, ["n", ch, 8, 8])]
    if nested:
        branch = lambda name: helper.make_graph(  # noqa: E731
            [mk("Identity", ["scale2"], [f"{name}_out"])], name, [], [helper.make_tensor_value_info(f"{name}_out", TP.FLOAT, [ch])])
        nodes.append(mk("If", ["flag"], ["picked"], then_branch=branch("then"), else_branch=branch("else")))
        outputs.append(helper.make_tensor_value_info("picked", TP.FLOAT, [ch]))
    # (the If's flag a runtime input: an If on a constant is its branch, and the alias would go)
    flag = [helper.make_tensor_value_info("flag", TP.BOOL, [])] if nested else []
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", ch, 8, 8])] + flag, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_identity_of_a_constant_is_that_constant() -> None:
    """TorchScript's aliased initializers: the second BatchNorm reads the constants themselves,
    so both BatchNorm → Relu pairs are fused (the first only, before the rewrite), and the
    stitched model's function equals an independent float64 construction on fresh inputs."""
    rng = np.random.default_rng(fresh_seed())
    model = _aliased_batchnorms(rng)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    assert len(s.rewrites) == 2 and "Identity" not in [n.op_type for n in s.model.graph.node]
    res = onnxstitch.optimize(model, shapes={"n": [2]})
    assert "BatchNormalization" not in [n.op_type for n in res.model.graph.node]
    x = rng.standard_normal((3, 4, 8, 8)).astype(np.float32)
    p = {t.name: numpy_helper.to_array(t).astype(np.float64)[None, :, None, None] for t in model.graph.initializer}

    def bn_relu(v: np.ndarray, mean: str, var: str) -> np.ndarray:
        return np.maximum((v - p[mean]) / np.sqrt(p[var] + 1e-5) * p["scale"] + p["shift"], 0.0)

    want = bn_relu(bn_relu(x.astype(np.float64), "mean", "var"), "mean2", "var2")
    got = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_identity_read_inside_a_subgraph_stays() -> None:
    """The rename reaches the main graph's node inputs only: an alias an If branch reads keeps
    its Identity (the other alias goes)."""
    model = _aliased_batchnorms(np.random.default_rng(fresh_seed()), nested=True)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    assert [n.name for n in s.model.graph.node if n.op_type == "Identity"] == ["alias_scale"]
    onnx.checker.check_model(s.model, full_check=True)


def test_a_cast_to_the_type_its_input_has_is_its_input() -> None:
    # BLOOM casts its float32 Softmax back to the hidden dtype: in a float32 model, to float32.
    # That Cast goes; a Cast to another type and one giving a graph output stay.
    x = helper.make_tensor_value_info("x", TP.FLOAT, [2, 8])
    outs = [helper.make_tensor_value_info("y", TP.FLOAT, [2, 8]), helper.make_tensor_value_info("h", TP.FLOAT16, [2, 8]),
            helper.make_tensor_value_info("c", TP.FLOAT, [2, 8])]
    nodes = [helper.make_node("Softmax", ["x"], ["p"]), helper.make_node("Cast", ["p"], ["pc"], to=TP.FLOAT),
             helper.make_node("Relu", ["pc"], ["y"]), helper.make_node("Cast", ["p"], ["h"], to=TP.FLOAT16),
             helper.make_node("Cast", ["x"], ["c"], to=TP.FLOAT)]
    model = helper.make_model(helper.make_graph(nodes, "casts", [x], outs), opset_imports=[helper.make_opsetid("", 18)])
    _, infos = shapes.infer(model)
    out = simplify.simplify(model, infos)
    assert [n.op_type for n in out.model.graph.node] == ["Softmax", "Relu", "Cast", "Cast"], out.rewrites
    assert list(out.model.graph.node[1].input) == ["p"] and len(out.rewrites) == 1
    feeds = {"x": np.random.default_rng(fresh_seed()).standard_normal((2, 8)).astype(np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    for a, b in zip(run(out.model), run(model)):
        np.testing.assert_array_equal(a, b)


def test_a_slice_that_keeps_every_element_is_its_input() -> None:
    # silero-vad's STFT as TorchScript writes it: the real and imaginary halves of a conv output
    # through Slices to INT64_MAX ([0:] on the time axis), then sqrt(re² + im²). Those Slices go,
    # so both halves keep the conv's time dim and the magnitude fuses; a Slice that drops an
    # element (start 1), one with step 2, one giving a graph output and one with its start
    # before a fixed axis (-300 of 258) are checked alike: only the whole ones go.
    mk, vi, f = helper.make_node, helper.make_tensor_value_info, TP.FLOAT
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    end = 2**63 - 1
    inits = [i64("zero", [0]), i64("half", [129]), i64("big", [end]), i64("ax1", [1]), i64("ax2", [2]),
             i64("one", [1]), i64("two", [2]), i64("far", [-300]), i64("two_ends", [0, 0]), i64("bigs", [end, end]),
             i64("ax02", [0, 2]), numpy_helper.from_array(np.array(2.0, np.float32), "p")]
    nodes = [mk("Slice", ["x", "zero", "half", "ax1"], ["re0"]), mk("Slice", ["x", "half", "big", "ax1"], ["im0"]),
             mk("Slice", ["re0", "zero", "big", "ax2"], ["re"]), mk("Slice", ["im0", "two_ends", "bigs", "ax02"], ["im"]),
             mk("Pow", ["re", "p"], ["re2"]), mk("Pow", ["im", "p"], ["im2"]), mk("Add", ["re2", "im2"], ["s"]),
             mk("Sqrt", ["s"], ["mag"]),
             mk("Slice", ["x", "one", "big", "ax2"], ["drop1"]), mk("Slice", ["x", "zero", "big", "ax2", "two"], ["step2"]),
             mk("Slice", ["x", "far", "big", "ax1"], ["all_fixed"]), mk("Relu", ["all_fixed"], ["r"]),
             mk("Slice", ["x", "zero", "big", "ax1"], ["exposed"])]
    outs = [vi("mag", f, None), vi("drop1", f, None), vi("step2", f, None), vi("r", f, None), vi("exposed", f, None)]
    model = helper.make_model(helper.make_graph(nodes, "stft", [vi("x", f, ["b", 258, "t"])], outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    _, infos = shapes.infer(model)
    out = simplify.simplify(model, infos)
    slices = {n.output[0] for n in out.model.graph.node if n.op_type == "Slice"}
    assert slices == {"re0", "im0", "drop1", "step2", "exposed"}, out.rewrites
    reads = {t for n in out.model.graph.node for t in n.input}
    assert {"re0", "im0"} <= reads and not {"re", "im", "all_fixed"} & reads
    re, im = (out.tensors[t].shape for t in ("re0", "im0"))
    assert re == im and re[2] == "t"  # both halves keep the input's time dim
    feeds = {"x": np.random.default_rng(fresh_seed()).standard_normal((3, 258, 5)).astype(np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    for a, b in zip(run(out.model), run(model)):
        np.testing.assert_array_equal(a, b)
    x = feeds["x"]
    np.testing.assert_allclose(run(out.model)[0], np.sqrt(x[:, :129] ** 2 + x[:, 129:] ** 2), rtol=1e-6)


def test_the_stft_magnitude_fuses_once_its_whole_slices_go() -> None:
    # The planning side of the rule above: the magnitude sqrt(re² + im²) of two halves of one
    # tensor, each through a whole Slice, is one kernel (it was refused: "output shapes
    # [b, 129, unk__4], [b, 129, unk__5] do not broadcast").
    mk, vi, f = helper.make_node, helper.make_tensor_value_info, TP.FLOAT
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [i64("zero", [0]), i64("half", [129]), i64("big", [2**63 - 1]), i64("ax1", [1]), i64("ax2", [2]),
             numpy_helper.from_array(np.array(2.0, np.float32), "p")]
    nodes = [mk("Conv", ["x", "w"], ["c"], pads=[0, 0]), mk("Slice", ["c", "zero", "half", "ax1"], ["re0"]),
             mk("Slice", ["c", "half", "big", "ax1"], ["im0"]), mk("Slice", ["re0", "zero", "big", "ax2"], ["re"]),
             mk("Slice", ["im0", "zero", "big", "ax2"], ["im"]), mk("Pow", ["re", "p"], ["re2"]),
             mk("Pow", ["im", "p"], ["im2"]), mk("Add", ["re2", "im2"], ["s"]), mk("Sqrt", ["s"], ["mag"])]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((258, 1, 16)).astype(np.float32), "w")
    model = helper.make_model(helper.make_graph(nodes, "stft", [vi("x", f, ["b", 1, "n"])], [vi("mag", f, ["b", 129, "t"])],
                                                inits + [w]), opset_imports=[helper.make_opsetid("", 17)])
    result = onnxstitch.optimize(model, shapes={"b": [2], "n": [512]}, epilogues=False)
    fused = [n for n in result.model.graph.node if n.op_type == "FusedKernel"]
    assert len(fused) == 1, result.report.plan.rejections


def test_fixed_dims_of_a_shape_are_constants_and_an_unscaled_sdpa_gets_its_scale() -> None:
    # TorchScript's SDPA without a scale (Falcon) computes 1/√√D from Shape(q)[-1:] (through a
    # Cast to float32 of a float32) and scales q and kᵀ by it: the Slice of a fixed dim folds,
    # the rest is computed from constants, and the attention chain takes 1/√D as its scale. A
    # Gather of the batch dim stays.
    mk, vi, f = helper.make_node, helper.make_tensor_value_info, TP.FLOAT
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [i64("m1", [-1]), i64("big", [2**62]), i64("zero", 0), numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [mk("Shape", ["q"], ["qs"]), mk("Slice", ["qs", "m1", "big"], ["d"]), mk("Cast", ["d"], ["df"], to=f),
             mk("Sqrt", ["df"], ["sd"]), mk("Div", ["one", "sd"], ["inv"]), mk("Cast", ["inv"], ["invc"], to=f),
             mk("Sqrt", ["invc"], ["s"]),
             mk("Mul", ["q", "s"], ["qq"]), mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), mk("Mul", ["kt", "s"], ["kk"]),
             mk("MatMul", ["qq", "kk"], ["sc"]), mk("Softmax", ["sc"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["y"]),
             mk("Gather", ["qs", "zero"], ["b"])]
    ins = [vi(t, f, ["batch", 4, "seq", 64]) for t in ("q", "k", "v")]
    outs = [vi("y", f, ["batch", 4, "seq", 64]), vi("b", TP.INT64, [])]
    model = helper.make_model(helper.make_graph(nodes, "sdpa", ins, outs, inits), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    _, infos = shapes.infer(model)
    out = simplify.simplify(model, infos)
    assert any("Slice of fixed dims" in r for r in out.rewrites), out.rewrites
    assert "Gather" in [n.op_type for n in out.model.graph.node]  # the batch dim is not fixed
    from .attention_models import attention_graph

    g, found = attention_graph(out.model)
    (m,) = found.matches
    assert m.scale == pytest.approx(1 / 8, rel=1e-6) and m.kt == "kt", found.refusals
    res = onnxstitch.optimize(model, shapes={"batch": [2], "seq": [16]})
    assert "FusedKernel" in [n.op_type for n in res.model.graph.node] and res.report.verification.device == "cpu"


def merged_heads_model(*, heads_merged: bool = True, sized_by_shape: bool = False) -> onnx.ModelProto:
    """BLOOM's attention as both exporters write it: q, k, v [b, 4, 8, 16] reshaped to
    [b·4, 8, 16]; scores q·kᵀ × 0.25 + ALiBi (a [b, 4, 8] bias reshaped to [b·4, 1, 8], scaled
    after the Reshape as TorchScript does), reshaped to [b, 4, 8, 8] for the mask and the
    Softmax, back to [b·4, 8, 8] for the second product, whose result is reshaped to
    [b, 4, 8, 16]. `heads_merged=False` merges the heads with the queries instead ([b, 32, 16]);
    `sized_by_shape` sizes the last Reshape from the product's Shape (b·4 / 4) and also returns
    that batch size, as TorchScript does."""
    mk, vi, f = helper.make_node, helper.make_tensor_value_info, TP.FLOAT
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    merged = [-1, 8, 16] if heads_merged else [0, -1, 16]
    inits = [i64("m3", merged), i64("m3s", [-1, 8, 8] if heads_merged else [0, -1, 8]), i64("bias3", [-1, 1, 8]),
             i64("s4", [-1, 4, 8, 8]), i64("zero", [0]), i64("four", 4), i64("tail", [4, 8, 16]),
             numpy_helper.from_array(np.array(0.25, np.float32), "alpha"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [mk("Reshape", ["q", "m3"], ["q3"]), mk("Reshape", ["k", "m3"], ["k3"]), mk("Reshape", ["v", "m3"], ["v3"]),
             mk("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]), mk("MatMul", ["q3", "kt3"], ["s3"]),
             mk("Mul", ["s3", "alpha"], ["ss3"]), mk("Reshape", ["alibi", "bias3"], ["a3"]), mk("Mul", ["a3", "half"], ["ah3"]),
             mk("Add", ["ss3", "ah3"], ["sb3"]), mk("Reshape", ["sb3", "s4"], ["s4d"]), mk("Add", ["s4d", "mask"], ["sm"]),
             mk("Softmax", ["sm"], ["p"], axis=-1), mk("Reshape", ["p", "m3s"], ["p3"]), mk("MatMul", ["p3", "v3"], ["c3"])]
    outs = [vi("y", f, ["batch", 4, 8, 16])]
    if sized_by_shape:
        nodes += [mk("Shape", ["c3"], ["cs"]), mk("Gather", ["cs", "zero"], ["bh"]), mk("Div", ["bh", "four"], ["b"]),
                  mk("Concat", ["b", "tail"], ["c4d"], axis=0), mk("Reshape", ["c3", "c4d"], ["y"])]
        outs.append(vi("b", TP.INT64, [1]))
    else:
        inits.append(i64("c4", [-1, 4, 8, 16]))
        nodes.append(mk("Reshape", ["c3", "c4"], ["y"]))
    ins = [vi(t, f, ["batch", 4, 8, 16]) for t in ("q", "k", "v")] + \
        [vi("alibi", f, ["batch", 4, 8]), vi("mask", f, ["batch", 1, 8, 8])]
    model = helper.make_model(helper.make_graph(nodes, "bloom", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("sized_by_shape", [False, True])
def test_a_product_on_merged_heads_runs_on_the_4d_tensors(sized_by_shape: bool) -> None:
    # Both products go 4-D (the scores with their scale and scaled ALiBi term on the way), the
    # results equal the original's on fresh inputs, and the attention matcher takes the chain.
    model = merged_heads_model(sized_by_shape=sized_by_shape)
    _, infos = shapes.infer(model)
    out = simplify.simplify(model, infos)
    assert sum("merged heads" in r for r in out.rewrites) == 2, out.rewrites
    ops = [n.op_type for n in out.model.graph.node]
    assert ops.count("MatMul") == 2 and "Softmax" in ops
    rng = np.random.default_rng(fresh_seed())
    feeds = {t: rng.standard_normal((3, 4, 8, 16)).astype(np.float32) for t in ("q", "k", "v")}
    feeds |= {"alibi": rng.standard_normal((3, 4, 8)).astype(np.float32),
              "mask": np.where(rng.random((3, 1, 8, 8)) < 0.2, MIN, 0).astype(np.float32)}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    for want, got in zip(run(model), run(out.model)):  # (the same sums; ORT may block them otherwise)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    from .attention_models import attention_graph

    _, found = attention_graph(out.model)
    assert len(found.matches) == 1, found.refusals
    res = onnxstitch.optimize(model, shapes={"batch": [2]})
    assert res.report.notes["attention"].rewrites, res.report.notes["attention"].refusals


def test_heads_merged_with_other_dims_stay() -> None:
    # [b, 4·8, 16] merges the heads with the queries, not with the batch: not this form.
    model = merged_heads_model(heads_merged=False)
    _, infos = shapes.infer(model)
    assert not any("merged heads" in r for r in simplify.simplify(model, infos).rewrites)


def _head_scaled_model(t_shape: tuple[int, ...]) -> onnx.ModelProto:
    """q·kᵀ [b, 4, 8, 8] times a factor of shape `t_shape` (XCiT's temperature: [4, 1, 1]),
    then Softmax and ·v."""
    mk, vi, f = helper.make_node, helper.make_tensor_value_info, TP.FLOAT
    t = numpy_helper.from_array(np.linspace(0.5, 2.0, int(np.prod(t_shape))).astype(np.float32).reshape(t_shape), "t")
    nodes = [mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), mk("MatMul", ["q", "kt"], ["s"]),
             mk("Mul", ["s", "t"], ["st"]), mk("Softmax", ["st"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["y"])]
    ins = [vi(n, f, ["batch", 4, 8, 16]) for n in ("q", "k", "v")]
    model = helper.make_model(helper.make_graph(nodes, "xca", ins, [vi("y", f, ["batch", 4, 8, 16])], [t]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("t_shape,moved", [((4, 1, 1), True), ((1, 4, 1, 1), True), ((4, 8, 1), False), ((), False)])
def test_a_per_head_scale_moves_onto_the_first_operand(t_shape: tuple[int, ...], moved: bool) -> None:
    # A factor constant along the product's last two dims scales q instead, and the attention
    # matcher takes the chain; one that varies along them (or a scalar, the matcher's own
    # scale) stays where it is.
    model = _head_scaled_model(t_shape)
    _, infos = shapes.infer(model)
    out = simplify.simplify(model, infos)
    assert any("scaled per head" in r for r in out.rewrites) == moved, out.rewrites
    if not moved:
        return
    rng = np.random.default_rng(fresh_seed())
    feeds = {n: rng.standard_normal((2, 4, 8, 16)).astype(np.float32) for n in ("q", "k", "v")}
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    # (the scale multiplies q's elements rather than the dot products: float32 rounding apart,
    # a few units in the last place of the scores, ~1e-6 absolute after the Softmax)
    np.testing.assert_allclose(run(out.model)[0], run(model)[0], rtol=1e-4, atol=1e-5)
    from .attention_models import attention_graph

    _, found = attention_graph(out.model)
    assert len(found.matches) == 1, found.refusals


def _window_attention(w: int | str) -> onnx.ModelProto:
    """Hiera's mask-unit attention: q, k, v [b, 2, w, 16, 32] (heads, windows, tokens, head
    dim), q scaled, kᵀ a Transpose of K's last two dims, the context [b, 2, w, 16, 32]."""
    dims = ["b", 2, w, 16, 32]
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Mul", ["q", "scale"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
             helper.make_node("MatMul", ["qs", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "windows", [vi(x, TP.FLOAT, dims) for x in "qkv"], [vi("y", TP.FLOAT, dims)],
                          [numpy_helper.from_array(np.array(32 ** -0.5, np.float32), "scale")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_attention_over_windows_runs_on_4d_views() -> None:
    model = _window_attention(3)
    res = onnxstitch.optimize(model, shapes={"b": [4]})
    assert any("attention over windows" in r for r in res.report.notes["simplify"].rewrites)
    assert len(res.report.notes["attention"].rewrites) == 1
    rng = np.random.default_rng(fresh_seed())
    feeds = {x: rng.standard_normal((3, 2, 3, 16, 32)).astype(np.float32) for x in "qkv"}
    (got,) = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    q, k, v = (feeds[x].astype(np.float64) for x in "qkv")
    s = q @ k.swapaxes(-1, -2) / np.sqrt(32)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_windows_counted_at_run_time_stay_rank_5() -> None:
    res = onnxstitch.optimize(_window_attention("w"), shapes={"b": [4], "w": [3]})
    assert not any("attention over windows" in r for r in res.report.notes["simplify"].rewrites)
    assert any("rank 5" in r for r in res.report.notes["attention"].refusals)


def _size_branches(state_layers: int) -> onnx.ModelProto:
    """silero-vad's two kinds of If, written as TorchScript writes them: `if state.size(0):` on a
    dim the model fixes (`state_layers`; nested inside it, `if y.size(1) == 4:` on the fixed
    channels of a Relu, folding only once the outer If is inlined), and
    `x.squeeze(-1) if x.size(-1) == 1 else x` on a length, followed by a branch on the rank that
    gives (`if y.dim() == 2: unsqueeze`), which no inference knows before the run."""
    mk, c = helper.make_node, numpy_helper.from_array
    i64 = lambda name, v: c(np.array(v, np.int64), name)  # noqa: E731
    out = lambda name, dims: helper.make_tensor_value_info(name, TP.FLOAT, dims)  # noqa: E731
    x3 = ["b", 4, "T"]
    inner = mk("If", ["c4"], ["scaled"], name="channels_if",
               then_branch=helper.make_graph([mk("Mul", ["h", "twice"], ["hs"])], "t4", [], [out("hs", x3)]),
               else_branch=helper.make_graph([mk("Neg", ["h"], ["hn"])], "e4", [], [out("hn", x3)]))
    then = helper.make_graph([mk("Relu", ["x"], ["h"]), mk("Shape", ["h"], ["hshape"]), mk("Gather", ["hshape", "one"], ["hc"]),
                              mk("Equal", ["hc", "four"], ["c4"]), inner], "then", [], [out("scaled", x3)])
    other = helper.make_graph([mk("Sigmoid", ["x"], ["g"])], "else", [], [out("g", x3)])
    sq_then = helper.make_graph([mk("Squeeze", ["y0", "last"], ["sq"])], "sq_then", [], [out("sq", ["b", 4])])
    sq_else = helper.make_graph([mk("Identity", ["y0"], ["same"])], "sq_else", [], [out("same", x3)])
    r_then = helper.make_graph([mk("Unsqueeze", ["y1", "last"], ["up"])], "r_then", [], [out("up", ["b", 4, 1])])
    r_else = helper.make_graph([mk("Identity", ["y1"], ["kept"])], "r_else", [], [out("kept", x3)])
    nodes = [mk("Shape", ["state"], ["ss"]), mk("Gather", ["ss", "zero"], ["layers"]), mk("Cast", ["layers"], ["has"], to=TP.BOOL),
             mk("If", ["has"], ["y0"], name="state_if", then_branch=then, else_branch=other),
             mk("Shape", ["y0"], ["ys"]), mk("Gather", ["ys", "minus1"], ["t"]), mk("Equal", ["t", "one"], ["c1"]),
             mk("If", ["c1"], ["y1"], name="squeeze_if", then_branch=sq_then, else_branch=sq_else),
             mk("Shape", ["y1"], ["s1"]), mk("Size", ["s1"], ["rank"]), mk("Equal", ["rank", "two"], ["c2"]),
             mk("If", ["c2"], ["y"], name="rank_if", then_branch=r_then, else_branch=r_else)]
    inits = [i64("zero", 0), i64("one", 1), i64("minus1", -1), i64("four", 4), i64("two", 2), i64("last", [-1]),
             c(np.array(2.0, np.float32), "twice")]
    g = helper.make_graph(nodes, "size_branches", [out("x", x3), out("state", [state_layers, "b", 8])],
                          [out("y", ["b", 4, "T2"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("layers", [2, 0])
def test_an_if_on_fixed_dims_is_its_branch(layers: int) -> None:
    """The Ifs on fixed dims fold (the nested one once its If is inlined); those on a length and
    on the rank an If gives stay, and the model computes what it did, through either branch
    of each (a length of 1 and of 3)."""
    model = _size_branches(layers)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    ifs = sorted(n.name for n in s.model.graph.node if n.op_type == "If")
    assert ifs == ["rank_if", "squeeze_if"], s.rewrites
    assert any("state_if" in r for r in s.rewrites) and any("channels_if" in r for r in s.rewrites) == (layers > 0)
    onnx.checker.check_model(s.model, full_check=True)
    rng = np.random.default_rng(fresh_seed())
    for length in (1, 3):
        feeds = {"x": rng.standard_normal((2, 4, length)).astype(np.float32),
                 "state": rng.standard_normal((layers, 2, 8)).astype(np.float32)}
        (want,), (got,) = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                           for m in (model, s.model))
        assert got.shape == want.shape and np.array_equal(got, want), length


def test_a_rank_an_if_gives_is_unknown() -> None:
    """ORT's symbolic inference keeps the then-branch's rank where an If's branches differ;
    inference here calls it unknown, and so what is computed from it (the model's own
    declaration of its output stands)."""
    _, tensors = shapes.infer(_size_branches(2))
    assert tensors["y1"].shape is None
    assert not all(isinstance(d, int) for d in tensors["s1"].shape)
    assert tensors["y"].shape == ("b", 4, "T2")


def test_an_inlined_if_feeds_range_scalars() -> None:
    """ONNX's AffineGrid function: an If on `Size(size) == 4` gives dims of shape [1] (one a
    constant) that Range reads. Inlined, ORT folds that Range at load and its inference refuses
    rank-1 inputs (the model would not load); they are read through Reshapes to rank 0, and the
    model computes what it did."""
    mk, c = helper.make_node, numpy_helper.from_array
    one = helper.make_tensor_value_info
    then = helper.make_graph([mk("Split", ["size"], ["n_t", "w_t"], num_outputs=2), mk("Identity", ["one_1d"], ["d_t"])],
                             "then", [], [one("n_t", TP.INT64, [1]), one("w_t", TP.INT64, [1]), one("d_t", TP.INT64, [1])])
    other = helper.make_graph([mk("Split", ["size"], ["n_e", "w_e", "d_e"], num_outputs=3)], "else", [],
                              [one("n_e", TP.INT64, [1]), one("w_e", TP.INT64, [1]), one("d_e", TP.INT64, [1])])
    nodes = [mk("Size", ["size"], ["ndim"]), mk("Equal", ["ndim", "two"], ["is2"]),
             mk("If", ["is2"], ["n", "w", "d"], name="dims_if", then_branch=then, else_branch=other),
             mk("Range", ["zero", "w", "step"], ["ws"]), mk("Range", ["zero", "d", "step"], ["ds"]),
             mk("Cast", ["ws"], ["y"], to=TP.FLOAT), mk("Cast", ["ds"], ["z"], to=TP.FLOAT)]
    inits = [c(np.array(2, np.int64), "two"), c(np.array(0, np.int64), "zero"), c(np.array(1, np.int64), "step"),
             c(np.array([1], np.int64), "one_1d")]
    g = helper.make_graph(nodes, "affine_dims", [one("size", TP.INT64, [2])],
                          [one("y", TP.FLOAT, None), one("z", TP.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    inferred, tensors = shapes.infer(model)
    s = simplify.simplify(inferred, tensors)
    assert not [n for n in s.model.graph.node if n.op_type == "If"], s.rewrites
    feeds = {"size": np.array([3, 5], np.int64)}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                 for m in (model, s.model))
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
