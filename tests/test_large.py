"""Models past protobuf's 2 GiB limit are read and written with external data. Testing with a
real 2 GiB model would take minutes and gigabytes here, so the limit is lowered to 1 MB:
the same code paths (checker by path, inference on a skeleton, external data out, ORT from a
file) run on a 4 MB model."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxstitch.cli.main import main
from onnxstitch import load

from .stitching import assert_close


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w"], ["m"]), helper.make_node("Sigmoid", ["m"], ["c"]),
             helper.make_node("Add", ["c", "m"], ["y"])]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 1024])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 1024])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_large_model_round_trips_with_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load, "PROTOBUF_LIMIT", 2**20)
    src_dir, out_dir = tmp_path / "in", tmp_path / "out"
    src_dir.mkdir()
    model = _model()
    onnx.save(model, src_dir / "big.onnx", save_as_external_data=True, location="big.onnx.data")
    before = _digest(src_dir)
    res = CliRunner().invoke(main, ["optimize", str(src_dir / "big.onnx"), "-o", str(out_dir / "big.stitched.onnx")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert _digest(src_dir) == before  # the input and its external data are untouched
    assert sorted(p.name for p in out_dir.iterdir()) == ["big.stitched.onnx", "big.stitched.onnx.data"]
    assert (out_dir / "big.stitched.onnx").stat().st_size < 2**20  # the weights went to the .data file
    stitched = onnx.load(str(out_dir / "big.stitched.onnx"))
    assert sum(n.op_type == "FusedKernel" for n in stitched.graph.node) == 2
    x = np.random.default_rng().standard_normal((3, 1024)).astype(np.float32)
    ref = ort.InferenceSession(str(src_dir / "big.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = ort.InferenceSession(str(out_dir / "big.stitched.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert_close(got[0], ref[0])
