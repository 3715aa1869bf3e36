"""Code generation: every fusible op's kernel compiles with NVRTC for sm_80 and sm_90 (and
PTX), and the rewritten model still computes the original outputs on ORT CPU."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxstitch import ops

from onnxstitch.schemes.elementwise import codegen
from onnxstitch.inputs import random_feeds

from .op_models import covered_ops, op_models
from .stitching import assert_close, fresh_seed, prepared, stitch_nodes

MODELS = list(op_models())


def test_every_elementwise_table_op_is_covered() -> None:
    assert covered_ops() == {op for op, spec in ops.TABLE.items() if spec.printer is not None}


@pytest.mark.parametrize("name,model", MODELS, ids=[m[0] for m in MODELS])
def test_kernel_compiles_and_fallback_matches(name: str, model: onnx.ModelProto) -> None:
    stitched = stitch_nodes(model, [(0, 1)], archs=("sm_80", "sm_90"))
    onnx.checker.check_model(stitched, full_check=True)
    node = stitched.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["image_archs"] == [80, 90]
    sizes = attrs["image_sizes"]
    assert sum(sizes) == len(attrs["images"])
    starts = [0, sizes[0]]
    assert all(attrs["images"][s:s + 4] == b"\x7fELF" for s in starts)  # cubins are ELF images
    assert b".entry" in attrs["ptx"]
    feeds = random_feeds(model, seed=fresh_seed())
    if "b" in feeds and feeds["b"].dtype.kind == "i":
        feeds["b"][feeds["b"] == 0] = 3  # integer division by zero is undefined
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(stitched.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(got, ref):
        assert_close(a, b, name)


def test_vector_width_follows_widest_full_tensor() -> None:
    model = dict(MODELS)["Add-float16"]
    _, g = prepared(model)
    assert codegen.generate(g, "k", (0, 1)).vec_width == 8  # 8 halves = 16 bytes
    model = dict(MODELS)["Cast-float16-to-double"]
    _, g = prepared(model)
    assert codegen.generate(g, "k", (0, 1)).vec_width == 2  # 2 doubles = 16 bytes


def test_broadcast_inputs_are_marked() -> None:
    _, g = prepared(dict(MODELS)["Add-float"])
    src = codegen.generate(g, "k", (0, 1))
    assert src.input_kinds == (codegen.FULL, codegen.BROADCAST)
    assert "a.strides[1]" in src.source


def _div_by(c: float, dtype: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """y = relu(x / c) with c a baked scalar."""
    h = onnx.helper
    npd = h.tensor_dtype_to_np_dtype(dtype)
    g = h.make_graph([h.make_node("Div", ["x", "c"], ["q"]), h.make_node("Relu", ["q"], ["y"])], "div",
                     [h.make_tensor_value_info("x", dtype, ["n", 16])], [h.make_tensor_value_info("y", dtype, ["n", 16])],
                     [onnx.numpy_helper.from_array(np.array(c, npd), "c")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("c,folds", [(1.4142135, True), (4.0, True), (-0.1, True), (0.0, False),
                                     (-0.0, False), (1e38, False), (float("inf"), False), (float("nan"), False)])
def test_division_by_a_constant_multiplies_by_its_normal_reciprocal(c: float, folds: bool) -> None:
    m, g = prepared(_div_by(c))
    line = next(x for x in codegen.generate(g, "k", (0, 1)).source.splitlines() if "// Div" in x)
    assert ("stitch_div" not in line) == folds, line
