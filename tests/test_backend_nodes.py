"""The ONNX backend node test cases of every op onnxstitch fuses: each op is forced into its
own kernel, the kernel must compile, and the stitched model must reproduce the case's
expected outputs — through the fallback function on CPU here, through the real kernel on the
GPU (marker `gpu`)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort
import pytest
from onnx.backend.test.case.node import collect_testcases

from onnxstitch import ops
from onnxstitch.folds import slices

from .stitching import assert_close, prepared, stitch_nodes


def _cases() -> list:
    out = []
    for case in collect_testcases():
        nodes = case.model.graph.node if case.model is not None else []
        # Layout ops fold only as a kernel's output tail, Slice/Split only as its input boxes,
        # never alone (tests/test_views.py, tests/test_slices.py).
        if len(nodes) == 1 and ops.spec(nodes[0].op_type, nodes[0].domain).fusible and case.data_sets \
                and nodes[0].op_type not in ops.LAYOUT | slices.OPS:
            out.append(pytest.param(case, id=case.name))
    return out


CASES = _cases()


def _refusal(model: onnx.ModelProto) -> str | None:
    """Why the case's node cannot be a kernel of its own: the node's reason, or the group's
    (an Expand whose output is wider than its input cannot: the kernel derives its iteration
    shape from its inputs)."""
    _, g = prepared(model, reductions=True)
    n = g.nodes[0]
    if n.reason or n.op_type != "Expand":
        return n.reason
    wide, narrow = g.tensors[n.outputs[0]].shape, g.tensors[n.inputs[0]].shape
    return None if wide == narrow else f"Expand widens {narrow} to {wide}, a shape no kernel input carries"


def _array(v) -> np.ndarray:
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def _run(model: onnx.ModelProto, feeds: dict, session_fn) -> list[np.ndarray]:
    return session_fn(model).run(None, feeds)


def _baked_axes(case) -> int:
    """Reductions read their axes as a graph input in these cases; a model fixes them, so the
    case's axes become an initializer (stitching needs them constant). Inputs kept: the count."""
    node = case.model.graph.node[0]
    if ops.spec(node.op_type, node.domain).kind != ops.OpKind.REDUCE or len(node.input) < 2 or not node.input[1]:
        return len(case.model.graph.input)
    return 1


def _check(case, session_fn) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.ir_version = 10  # onnx writes its newest IR; onnxruntime reads up to its own
    keep = _baked_axes(case)
    if keep < len(model.graph.input):
        axes = _array(case.data_sets[0][0][1])
        if any(not np.array_equal(_array(inputs[1]), axes) for inputs, _ in case.data_sets):
            pytest.skip("the data sets use different axes")
        model.graph.initializer.append(numpy_helper.from_array(axes, model.graph.input[1].name))
        del model.graph.input[1]
    names = [i.name for i in model.graph.input]
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for inputs, _ in case.data_sets:
            sess.run(None, {n: _array(v) for n, v in zip(names, inputs)})
    except Exception as e:  # the reference runtime itself cannot run this case
        pytest.skip(f"onnxruntime cannot run the original: {str(e)[:120]}")
    reason = _refusal(model)
    if reason:
        pytest.skip(f"not fusible: {reason}")
    stitched = stitch_nodes(model, [(0,)], archs=("sm_90",))
    onnx.checker.check_model(stitched, full_check=True)
    assert [n.op_type for n in stitched.graph.node] == ["FusedKernel"]
    for inputs, expected in case.data_sets:
        feeds = {n: _array(v) for n, v in zip(names, inputs)}
        got = _run(stitched, feeds, session_fn)
        for g, e, o in zip(got, expected, case.model.graph.output):
            assert_close(g, _array(e), f"{case.name}:{o.name}")


def test_collected_enough_cases() -> None:
    assert len(CASES) > 300


@pytest.mark.parametrize("case", CASES)
def test_backend_case_fallback_cpu(case) -> None:
    def cpu(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

    _check(case, cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_backend_case_gpu(case) -> None:
    import onnxstitch

    def gpu(m):
        return onnxstitch.session(m.SerializeToString())

    _check(case, gpu)
