"""Verification before writing: tensor comparison rules, and a stitched model whose fallback
disagrees with the original is refused with the failing group named and nothing written."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import parser

import onnxstitch
from onnxstitch.cli.main import main
from models.fuzz import run_cpu
from onnxstitch import rewrite, verify
from onnxstitch.inputs import random_feeds
from onnxstitch.sessions import Runner
from onnxstitch.verify import VerifyError, compare

from .stitching import fresh_seed

TWO_GROUPS = """<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 16] x, float[16, 16] w) => (float[B, 16] z) {
  a = Mul(x, x)
  b = Sigmoid(a)
  m = MatMul(b, w)
  c = Tanh(m)
  z = Add(c, m)
}"""


def test_compare_rules() -> None:
    rng = np.random.default_rng()
    x = rng.standard_normal(100).astype(np.float32)
    assert compare(x, x.copy())[0]
    assert not compare(x * 1.01, x)[0]
    assert compare((x * (1 + 1e-3)).astype(np.float16), x.astype(np.float16))[0]  # half precision
    y = x.copy()
    y[3] = np.nan
    ok, _, why = compare(y, x)
    assert not ok and "NaN" in why
    assert compare(y, y.copy())[0]  # NaN where the original has NaN is fine
    i = rng.integers(0, 9, 50)
    j = i.copy()
    j[7] += 1
    assert not compare(j, i)[0] and compare(i, i.copy())[0]
    assert not compare(x.astype(np.float64), x)[0]  # dtype must match
    near = x * (1 + 1e-3 * np.sign(rng.standard_normal(100))).astype(np.float32)
    assert not compare(near, x)[0] and compare(near, x, half_inputs=True)[0]  # float32 from half data


def test_a_graph_output_near_zero_is_judged_at_its_inputs_scale() -> None:
    """A detector's probabilities on a random image are sigmoids of large negative logits
    (PP-OCRv3: 1e-13 to 1e-7): rounding of 1e-7 there is the whole of their norm. At the scale
    of the model's inputs it is a few float32 units and passes; a real difference still fails."""
    rng = np.random.default_rng(fresh_seed())
    logits = (-25.0 + rng.standard_normal((64, 64))).astype(np.float32)
    probs = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    noisy = probs + (rng.standard_normal(probs.shape) * 3e-8).astype(np.float32)
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[64, 64] x) => (float[64, 64] p) { p = Sigmoid(x) }""")

    def judge(input_scale: float) -> verify._Judge:  # no envelope: the fixed tolerance
        feeds = {"x": np.full(probs.shape, input_scale, np.float32)}
        j = verify._Judge(model, feeds, {"p": probs}, Runner(False), tf32=False)
        j._envelope = {"p": 0.0}  # (these feeds are not what the expected values came from)
        return j

    assert judge(0.0).output("p", noisy) is not None  # its own norm: 100% off
    assert judge(1.0).output("p", noisy) is None
    assert judge(1.0).output("p", probs * 3 + 1e-3) is not None


def _broken_function(monkeypatch: pytest.MonkeyPatch, group: str) -> None:
    """Make the fallback body of `group` compute Sub where the original computes Add/Mul."""
    real = rewrite._function

    def corrupt(model, graph, grp):
        fn = real(model, graph, grp)
        if grp.name == group:
            for node in fn.node:
                if node.op_type in ("Add", "Mul"):
                    node.op_type = "Sub"
        return fn

    monkeypatch.setattr(rewrite, "_function", corrupt)


def test_verification_names_the_failing_group(monkeypatch: pytest.MonkeyPatch) -> None:
    model = parser.parse_model(TWO_GROUPS)
    groups = onnxstitch.optimize(model, verify=False).report.plan.groups
    assert len(groups) == 2
    target = groups[1].name
    _broken_function(monkeypatch, target)
    with pytest.raises(VerifyError, match=rf"group {target} .*output 'z'"):
        onnxstitch.optimize(model, strict=True)


def test_a_failing_group_is_left_to_ort_and_the_rest_written(monkeypatch: pytest.MonkeyPatch) -> None:
    model = parser.parse_model(TWO_GROUPS)
    target, kept = (g.name for g in onnxstitch.optimize(model, verify=False).report.plan.groups)
    _broken_function(monkeypatch, target)
    res = onnxstitch.optimize(model)
    assert [d["group"] for d in res.report.dropped] == [target]
    fused = [n for n in res.model.graph.node if n.op_type == "FusedKernel"]
    assert [n.overload for n in fused] == [kept]
    feeds = random_feeds(model, fresh_seed(), {"B": 5})
    for a, b in zip(run_cpu(res.model, feeds), run_cpu(model, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_cli_strict_writes_nothing_when_verification_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "m.stitched.onnx"
    onnx.save(parser.parse_model(TWO_GROUPS), src)
    _broken_function(monkeypatch, "g0")
    res = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out), "--strict-verify"], catch_exceptions=False)
    assert res.exit_code == 1 and "verification failed" in res.output and "g0" in res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1
    assert not out.exists()
    res = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0 and out.exists() and "left to ONNX Runtime" in res.output and "g0" in res.output
    out.unlink()
    res = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out), "--no-verify", "-q"], catch_exceptions=False)
    assert res.exit_code == 0 and out.exists()


def test_verification_is_reported() -> None:
    rep = onnxstitch.optimize(parser.parse_model(TWO_GROUPS)).report.to_json()["verification"]
    assert rep["device"] in ("cpu", "gpu") and rep["tensors_checked"] >= 2 and not rep["skipped"]


def test_an_images_height_and_width_verify_larger_on_the_cpu() -> None:
    # At VERIFY_DIM (3) a detector's feature maps collapse to a pixel; the dims a convolution
    # reads as height and width verify at up to VERIFY_SPATIAL_DIM instead.
    from onnx import TensorProto as TP, helper

    from onnxstitch.verify import VERIFY_SPATIAL_DIM, _spatial_dims

    x = helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])
    s = helper.make_tensor_value_info("s", TP.FLOAT, ["n", "t", 8])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    w = helper.make_tensor("wt", TP.FLOAT, [4, 3, 3, 3], [0.0] * 108)
    conv = helper.make_node("Conv", ["x", "wt"], ["y"], pads=[1, 1, 1, 1])
    relu = helper.make_node("Relu", ["s"], ["z"])
    z = helper.make_tensor_value_info("z", TP.FLOAT, None)
    model = helper.make_model(helper.make_graph([conv, relu], "g", [x, s], [y, z], [w]))
    assert _spatial_dims(model) == {"h", "w"} and VERIFY_SPATIAL_DIM >= 32
    del model.graph.node[0]  # no convolution: nothing is an image
    assert _spatial_dims(model) == set()


def test_graph_outputs_are_judged_within_the_models_envelope(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every group is right on its own inputs, a graph output may differ by what the
    network amplifies: up to ENVELOPE_MARGIN × what the original itself moves under TF32 (a
    deep random CNN: several percent), never less than ACCUMULATED_TOLERANCE; the figures reach
    the report. Shapes and NaN positions are never covered."""
    from onnxstitch.sessions import Runner

    rng = np.random.default_rng(fresh_seed())
    want = rng.standard_normal(1000).astype(np.float32)
    original = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
g (float[1000] x) => (float[1000] y) { y = Relu(x) }""")

    def judge(envelope: float) -> verify._Judge:
        j = verify._Judge(original, {"x": want}, {"y": want}, Runner(gpu=True), tf32=False)
        monkeypatch.setattr(j, "envelope", lambda: {"y": envelope})
        return j

    def off_by(rel: float) -> np.ndarray:
        noise = rng.standard_normal(1000)
        return (want + rel * np.linalg.norm(want) * noise / np.linalg.norm(noise)).astype(np.float32)

    assert judge(0.0).output("y", off_by(5e-3)) is None  # the floor
    assert "envelope" in judge(0.0).output("y", off_by(3e-2))
    j = judge(0.02)
    assert j.output("y", off_by(3e-2)) is None  # deep-network rounding, within 2 × 0.02
    (stat,) = j.stats()
    assert stat.envelope == 0.02 and stat.tolerance == pytest.approx(0.04) and 0.02 < stat.relative_error < 0.04
    assert "0.04" in judge(0.02).output("y", off_by(0.1))
    nan = want.copy()
    nan[0] = np.nan
    assert "NaN" in judge(1.0).output("y", nan)


@pytest.mark.parametrize("together", [False, True])
def test_runs_together_give_what_runs_one_after_another_give(monkeypatch: pytest.MonkeyPatch,
                                                             together: bool) -> None:
    """The GPU builds verification's sessions in threads at once (Runner.run_together): its
    results and failures, in order, are those of runs one after another (here on the CPU)."""
    monkeypatch.setattr(Runner, "_fit_together", lambda self, jobs: together)
    model = parser.parse_model(TWO_GROUPS)
    broken = parser.parse_model(TWO_GROUPS.replace("z = Add(c, m)", "z = Add(c, nowhere)"))
    feeds = random_feeds(model, fresh_seed(), {"B": 3})
    runner = Runner(gpu=False)
    got = runner.run_together([(model, False), (broken, False), (model, False)], feeds)
    assert isinstance(got[1], Exception) and not isinstance(got[0], Exception)
    np.testing.assert_array_equal(got[0]["z"], got[2]["z"])
    np.testing.assert_allclose(got[0]["z"], run_cpu(model, feeds)[0], rtol=1e-6)
    first_fails = runner.run_together([(broken, False), (model, False)], feeds)
    assert isinstance(first_fails[0], Exception) and (together or first_fails[1] is first_fails[0])


@pytest.mark.parametrize("together", [False, True])
def test_a_broken_group_is_named_when_the_runs_go_together(monkeypatch: pytest.MonkeyPatch, together: bool) -> None:
    monkeypatch.setattr(Runner, "_fit_together", lambda self, jobs: together)
    model = parser.parse_model(TWO_GROUPS)
    target = onnxstitch.optimize(model, verify=False).report.plan.groups[0].name
    _broken_function(monkeypatch, target)
    res = onnxstitch.optimize(model)
    assert [d["group"] for d in res.report.dropped] == [target]


def test_an_output_that_moves_under_orts_own_fusions_is_judged_against_them() -> None:
    """A detector's TopK picks among near-equal scores: ORT's fusions in a user's session (no
    tensor exposed) reorder them, so the original itself moves. The stitched model as written is
    judged against the original as a user's session runs it too (the envelope's run); a wrong
    output is still caught."""
    model = parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[4, 64] x) => (float[4, 8] v) { e = Exp(x)  k = Constant<value = int64[1] {8}>()
                                                 v, i = TopK(e, k) }""")
    rng = np.random.default_rng(fresh_seed())
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32)}
    runner = Runner(False)
    truth = runner.run(model, False, feeds)["v"]
    exposed = truth[:, ::-1].copy()  # the reference run picked the same values in another order

    def judge() -> verify._Judge:
        return verify._Judge(model, feeds, {"v": exposed}, runner, tf32=False)

    assert judge().output("v", truth) is None  # matches the original as a user's session runs it
    assert judge().output("v", truth * 4 + 1) is not None  # beyond twice what the original moves
    stats = judge()
    stats.output("v", truth)
    assert stats.stats()[0].relative_error == 0.0
