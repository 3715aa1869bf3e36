"""scripts/corpus_report.py's timing rows: a model neither stock ORT nor the stitched model can
capture in a CUDA graph is timed plain only (bench times both plain again under --cuda-graph: a
second reading of the same mode, which once read 0.89× beside 1.05× for a CPU-bound model)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import scripts.corpus_report as corpus_report


def _result(stock_ms: float, stitched_ms: float, graphs: bool) -> SimpleNamespace:
    timing = lambda ms: SimpleNamespace(median_ms=ms, cuda_graph=graphs, launches_per_run=1.0)  # noqa: E731
    configs = {"stock": timing(stock_ms), "stitched": timing(stitched_ms)}
    return SimpleNamespace(stock=configs["stock"], stitched=configs["stitched"], speedup=stock_ms / stitched_ms,
                           max_abs_err=0.0, configs=configs)


@pytest.mark.parametrize("captured", [True, False])
def test_a_graphs_row_is_a_mode_only_where_a_side_captures(monkeypatch: pytest.MonkeyPatch, captured: bool) -> None:
    from onnxstitch import bench

    readings = {False: _result(25.2, 24.0, False), True: _result(25.7, 29.0 if not captured else 20.0, captured)}
    monkeypatch.setattr(bench, "run", lambda path, stitched, config, shapes: readings[config.cuda_graph])
    runs = corpus_report._bench_runs({"path": "m.onnx", "iters": 10, "shapes": {}}, "s.onnx")
    by = {r["label"]: r for r in runs}
    assert by["plain"]["speedup"] == pytest.approx(25.2 / 24.0)
    if captured:
        assert corpus_report.speedup({"runs": runs}) == ("cuda graphs", pytest.approx(25.7 / 20.0))
    else:
        assert "na" in by["cuda graphs"] and "speedup" not in by["cuda graphs"]
        assert corpus_report.speedup({"runs": runs}) == ("plain", pytest.approx(25.2 / 24.0))


def test_a_model_written_as_given_counts_as_stock_speed() -> None:
    # Every group given back (the gate's "negligible" round): the file is the model as given, so
    # its timing is the bench's noise (0.89× once, for an int8 LSTM on the CPU EP); it counts 1.00×.
    runs = [{"label": "plain", "stock_ms": 57.9, "stitched_ms": 65.4, "speedup": 0.885},
            {"label": "cuda graphs", "na": "neither captures"}]
    row = {"status": corpus_report.OK, "runs": runs, "fused_kernels": 0, "attention_kernels": 0,
           "nodes_before": 52, "nodes_after": 52}
    assert corpus_report.speedup(row) == ("as given", 1.0)
    assert "0 under" in corpus_report._summary([{**row, "model": "m"}])
    fused = {**row, "fused_kernels": 3, "nodes_after": 40}
    assert corpus_report.speedup(fused) == ("plain", 0.885)
    assert "1 under" in corpus_report._summary([{**fused, "model": "m"}])
