"""Quantized models as users make them with onnxruntime.quantization: dynamic quantization
(DynamicQuantizeLinear + MatMulInteger around the float work) and static quantization in both
formats (QDQ pairs around every op; QOperator's QLinearConv). optimize must plan them without
error, leave the integer work to ONNX Runtime, and write a model whose outputs match the given
one on fresh inputs (its own CPU verification, and here ONNX Runtime on both)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxstitch
from onnxstitch.inputs import random_feeds

from .stitching import fresh_seed

quantization = pytest.importorskip("onnxruntime.quantization")
SMALL = Path(__file__).resolve().parents[1] / "models/small"


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(path: Path, dims: dict[str, int]) -> onnxstitch.OptimizeResult:
    res = onnxstitch.optimize(str(path), shapes={k: [v] for k, v in dims.items()}, archs=("sm_90",))
    assert not res.report.dropped
    onnx.checker.check_model(res.model)
    feeds = random_feeds(onnx.load(str(path)), seed=fresh_seed(), dim_values=dims)
    for got, want in zip(_run(res.model, feeds), _run(str(path), feeds)):
        # Integer work is ORT's on both sides; float groups round alike up to summation order.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    return res


def test_dynamically_quantized_bert_fuses_its_float_work(tmp_path) -> None:
    q = tmp_path / "bert-int8.onnx"
    quantization.quantize_dynamic(str(SMALL / "bert-base-float32.onnx"), str(q),
                                  weight_type=quantization.QuantType.QInt8)
    assert any(n.op_type == "DynamicQuantizeLinear" for n in onnx.load(str(q)).graph.node)
    res = _check(q, {"batch": 2, "sequence": 16})
    assert res.report.plan.groups  # LayerNorms, the mask, GELU: float work between the products


class _Images(quantization.CalibrationDataReader):
    def __init__(self, seed: int) -> None:
        self.rng, self.left = np.random.default_rng(seed), 3

    def get_next(self) -> dict[str, np.ndarray] | None:
        self.left -= 1
        return {"pixel_values": self.rng.standard_normal((2, 3, 64, 64)).astype(np.float32)} if self.left >= 0 else None


@pytest.mark.parametrize("form", ["QDQ", "QOperator"])
def test_statically_quantized_resnet_is_written_and_still_matches(form: str, tmp_path) -> None:
    q = tmp_path / f"resnet-{form}.onnx"
    quantization.quantize_static(str(SMALL / "resnet50-float32.onnx"), str(q), _Images(fresh_seed()),
                                 quant_format=getattr(quantization.QuantFormat, form))
    _check(q, {"batch": 2})
