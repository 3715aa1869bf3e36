"""Measured costs on the GPU (marker `gpu`): the timer times a long elementwise chain's kernel
far below the 20 ORT kernels it replaces, repeated layers are timed once, and the gate times the
written model against stock ORT and finds it faster; planned again, the figures come from the
cache."""
from __future__ import annotations

import pytest

import onnxstitch
from models.elementwise import chain
from onnxstitch import measure

pytestmark = pytest.mark.gpu


def test_a_chain_is_measured_faster_than_its_nodes_and_the_gate_agrees(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ONNXSTITCH_CACHE", str(tmp_path / "cache"))
    # A 20× predicted gain is clear enough to go unmeasured (measure.CLEAR_GAIN): measure it anyway.
    monkeypatch.setattr(measure, "CLEAR_GAIN", float("inf"))
    model = chain(20)
    res = onnxstitch.optimize(model, shapes={"batch": [4096]})
    rep = res.report
    (c,) = rep.costs
    assert c.source == "measured" and c.measured and c.pays, c
    # 20 kernels of [4096, 4096] float32 against one: several times faster, as predicted.
    assert c.stock_us > 5 * c.ours_us and c.predicted_stock_us > 5 * c.predicted_us
    assert rep.timing is not None and rep.timing.faster and rep.timing.speedup > 3, rep.timing
    assert not rep.given_back
    again = onnxstitch.optimize(model, shapes={"batch": [4096]}).report
    assert again.costs[0].source == "cache"
