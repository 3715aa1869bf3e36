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


def test_the_gate_binds_outputs_of_the_shapes_a_run_gives(tmp_path) -> None:
    """Output shapes the caller got wrong (a dim inference named after an input, computed
    otherwise) do not turn a CUDA-graph timing into a plain one: the shapes of a plain stock run
    are bound instead, and both sides still run through CUDA graphs."""
    import numpy as np
    import onnx

    from onnxstitch import bench

    path = tmp_path / "m.onnx"
    onnx.save(chain(6, shape=(256, 1024)), path)
    out = onnx.load(path).graph.output[0].name
    wrong = {out: bench.OutputLike((256, 512), np.dtype(np.float32))}
    right = {out: bench.OutputLike((256, 1024), np.dtype(np.float32))}
    for outputs in (right, wrong):
        t = measure.compare_models(path, path, {}, outputs=outputs)
        assert t.stock_graphs and t.stitched_graphs, t
