"""ONNX's backend node test cases whose graphs hold an If, a Loop or a Scan (the ops themselves
and the functions expanded with them: affine grids, linear attention, Range, SequenceMap),
through `optimize` as a user runs it (bodies planned, verification on): the written model must
check, and reproduce each case's expected outputs on ONNX Runtime's CPU EP, its fused groups
inside bodies running through their fallback functions. `optimize` may leave a case as given
but must not fail on it."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

import onnxstitch

from .stitching import assert_close

CONTROL_FLOW = {"If", "Loop", "Scan"}


def _cases() -> list:
    return [pytest.param(case, id=case.name) for case in collect_testcases()
            if case.model is not None and case.data_sets
            and any(n.op_type in CONTROL_FLOW for n in case.model.graph.node)]


CASES = _cases()


def _value(v):
    """A data set's value as ORT takes it: arrays as arrays, sequences as lists of arrays,
    optionals as their content or None."""
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    return v if v is None else np.asarray(v)


def _compare(got, expected, what: str) -> None:
    if isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), what
        for k, (g, e) in enumerate(zip(got, expected)):
            _compare(g, e, f"{what}[{k}]")
    elif expected is None:
        assert got is None, what
    else:
        assert_close(np.asarray(got), np.asarray(expected), what)


def test_collected_control_flow_cases() -> None:
    names = {p.id for p in CASES}
    assert {"test_if", "test_loop11", "test_scan_sum", "test_scan9_sum"} <= names, sorted(names)


@pytest.mark.parametrize("case", CASES)
def test_control_flow_case_through_optimize(case) -> None:
    names = [i.name for i in case.model.graph.input]
    try:
        stock = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
        for inputs, _ in case.data_sets:
            stock.run(None, {n: _value(v) for n, v in zip(names, inputs)})
    except Exception as e:  # the reference runtime itself cannot run this case (bfloat16 feeds)
        pytest.skip(f"onnxruntime cannot run the original: {str(e)[:120]}")
    res = onnxstitch.optimize(case.model)
    onnx.checker.check_model(res.model, full_check=True)
    sess = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for inputs, expected in case.data_sets:
        feeds = {n: _value(v) for n, v in zip(names, inputs)}
        got = sess.run(None, feeds)
        for g, e, o in zip(got, expected, case.model.graph.output):
            _compare(g, _value(e), f"{case.name}:{o.name}")
