"""Custom ops users bring: a model with an op from onnxruntime-extensions (PyPI) optimizes with
verification when its library is given (`--custom-op-library`), with fused groups on both sides
of the op (its output shapes read off runs of the model, probe.py); bench and check register it
too; without it the refusal says which option is missing; a file that is no library is exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_extensions
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch import probe, shapes
from onnxstitch.cli.main import main
from onnxstitch.pipeline import optimize

from .stitching import fresh_seed

LIBRARY = onnxruntime_extensions.get_library_path()
CONTRIB = "ai.onnx.contrib"


def around_negpos(width: int = 48) -> onnx.ModelProto:
    """Elementwise chains before and after onnxruntime-extensions' NegPos (x → min(x, 0),
    max(x, 0)), whose output shapes no shape inference knows."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"]), n("Sigmoid", ["r"], ["s"]), n("Mul", ["s", "x"], ["m"]),
             n("NegPos", ["m"], ["neg", "pos"], domain=CONTRIB),
             n("Sub", ["pos", "neg"], ["c"]), n("Tanh", ["c"], ["d"]), n("Mul", ["d", "x"], ["e"]),
             n("Exp", ["neg"], ["f"]), n("Add", ["e", "f"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(CONTRIB, 1)],
                             ir_version=10)


def _run(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.register_custom_ops_library(LIBRARY)
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_probed_shapes_name_the_symbolic_dims() -> None:
    model = around_negpos()
    _, infos = shapes.infer(model)
    pending = probe.custom_outputs(model, infos)
    assert pending == ["neg", "pos"]
    got = probe.probe(model, pending, {"N": 5}, [LIBRARY])
    assert got.shapes == {"neg": ("N", 48), "pos": ("N", 48)} and got.dim_values == {}
    assert got.dtypes == {"neg": TP.FLOAT, "pos": TP.FLOAT}


def test_fused_on_both_sides_of_the_op_and_verified() -> None:
    res = optimize(around_negpos(), shapes={"N": [8]}, custom_op_libraries=[LIBRARY])
    fused = [n for n in res.model.graph.node if n.domain == "com.onnxstitch"]
    assert len(fused) == 2 and [n.op_type for n in res.model.graph.node if n.domain == CONTRIB] == ["NegPos"]
    v = res.report.verification
    assert v is not None and not v.skipped and not res.report.dropped
    x = np.random.default_rng(fresh_seed()).standard_normal((6, 48)).astype(np.float32)
    np.testing.assert_allclose(_run(res.model, x), _run(around_negpos(), x), rtol=1e-5, atol=1e-6)


def test_cli_commands_register_the_library_and_say_when_it_is_missing(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(around_negpos(), str(src))
    out = tmp_path / "m.stitched.onnx"
    runner = CliRunner()
    res = runner.invoke(main, ["optimize", str(src), "-o", str(out), "--shape", "N=8"])
    assert res.exit_code == 0, res.output
    assert "--custom-op-library" in res.output  # nothing fused unverified; the way out is named
    assert not any(n.domain == "com.onnxstitch" for n in onnx.load(str(out)).graph.node)
    lib = ["--custom-op-library", LIBRARY]
    res = runner.invoke(main, ["optimize", str(src), "-o", str(out), "--shape", "N=8", *lib, "-q"])
    assert res.exit_code == 0, res.output
    assert sum(n.domain == "com.onnxstitch" for n in onnx.load(str(out)).graph.node) == 2
    res = runner.invoke(main, ["bench", str(src), "--stitched", str(out), "--shape", "N=8", *lib, "--providers",
                               "CPUExecutionProvider", "--warmup", "1", "--iters", "2", "--json", "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["configs"]["onnxstitch"]["max_abs_err"] < 1e-5
    base = tmp_path / "base.json"
    res = runner.invoke(main, ["check", str(src), "--baseline", str(base), "--update-baseline", "--shape", "N=8", *lib])
    assert res.exit_code == 0, res.output
    assert json.loads(base.read_text())["plan"]["kernels_after"] == 3


@pytest.mark.parametrize("case", ["missing", "not_a_library"])
def test_a_library_that_does_not_load_is_exit_2(tmp_path: Path, case: str) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(around_negpos(), str(src))
    lib = tmp_path / "libnothing.so"
    if case == "not_a_library":
        lib.write_bytes(b"\x7fELF not really")
    res = CliRunner().invoke(main, ["optimize", str(src), "--custom-op-library", str(lib)])
    assert res.exit_code == 2, res.output
    assert str(lib) in res.output and "internal error" not in res.output
