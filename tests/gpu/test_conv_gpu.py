"""Convolution epilogues through cuDNN's graph API on the GPU (marker `gpu`): each network of
tests/conv_models.py optimized with `epilogues=True` (verified there against stock ORT CUDA), then
run through the custom op with poisoned outputs against a float64 reference on fresh random inputs
at sizes other than the planning ones: each activation, the residual, strides, dilation, groups and
depthwise, asymmetric pads, tensors kept NHWC between conv nodes and changed at the network's
ends, float32 (TF32) and float16, and CUDA graphs.

Tolerances (‖got − want‖ / ‖want‖): TF32 rounds X and W to 10 mantissa bits (about 5e-4 relative
per product), compounded over up to four layers: 3e-3; float16 also rounds every layer's output:
1e-2 — far below a wrong layout, bias, residual or activation."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxstitch.cost import CostModel

from ..conv_models import Layer, Net, feeds, model, reference
from ..stitching import fresh_seed
from .test_stitched_gpu import replay_under_cuda_graphs, run_gpu, stitch

pytestmark = pytest.mark.gpu

TOLERANCE = {TP.FLOAT: 3e-3, TP.FLOAT16: 1e-2}

NETS = [Net(8, (Layer(16, activation=a),), seed=k) for k, a in
        enumerate(("", "relu", "relu6", "leaky_relu", "silu", "sigmoid", "tanh"))]
NETS += [
    Net(16, (Layer(16, residual=True, activation="relu"),), seed=11),
    Net(16, (Layer(16, residual=True),), seed=12),  # MobileNet's residual without activation
    Net(8, (Layer(16, bias=False, activation="relu"), Layer(16, residual=True, activation="relu"),
            Layer(32, kernel=1, stride=2, activation="silu"), Layer(32, group=32, activation="relu6")), seed=13),
    Net(6, (Layer(12, stride=2, pad=(0, 1, 1, 0), activation="leaky_relu"),
            Layer(12, dilation=2, group=2, activation="tanh"), Layer(12, residual=True)), seed=14),
    Net(3, (Layer(16, kernel=3, stride=2, activation="silu"), Layer(32, stride=2, activation="silu"),
            Layer(32, kernel=1, activation="silu")), seed=15),  # a YOLO stem
    Net(16, (Layer(16, kernel=1, activation="silu"), Layer(16, activation="silu", shortcut=True),
             Layer(16, activation="silu", shortcut=True)), seed=16),  # YOLO's bottlenecks
    Net(8, (Layer(16, bn=True, activation="relu"), Layer(16, bias=False, bn=True, residual=True, activation="relu")),
        seed=17),  # BatchNormalization folded into the weights
    # MobileNetV3's: depthwise convolutions with ReLU, HardSwish or nothing, 1×1 ones with
    # HardSwish, the squeeze-excite's HardSigmoid
    Net(16, (Layer(64, kernel=1, activation="relu"), Layer(64, group=64, stride=2, activation="relu"),
             Layer(24, kernel=1)), seed=19),
    Net(16, (Layer(48, kernel=1, activation="hardswish"), Layer(48, kernel=5, group=48, activation="hardswish"),
             Layer(16, kernel=1, residual=False), Layer(16, group=16)), seed=20),
    Net(8, (Layer(32, kernel=1, activation="hard_sigmoid"), Layer(32, group=32, residual=True, activation="relu6")),
        seed=21),
    Net(8, (Layer(32, kernel=1, activation="hardswish"), Layer(32, kernel=5, group=32, activation="relu", se=True),
            Layer(32, kernel=1, residual=True)), seed=22, opset=18),  # squeeze-excite in NHWC
    # activations written out: paddle2onnx's HardSwish, the exporters' erf GELU
    Net(8, (Layer(16, bn=True, activation="hardswish_written"), Layer(16, group=16, activation="hardswish_written"),
            Layer(16, residual=True, activation="gelu_written")), seed=23),
]
NETS += [Net(n.channels, n.layers, TP.FLOAT16, n.seed) for n in NETS if n.channels % 8 == 0 or n.channels == 6]
# 1-D convolutions (H = R = 1 in cuDNN's graph, NCW in and out): each activation, a residual, a
# folded BatchNormalization, strides, dilations, odd pads and a depthwise one; float32 and float16.
LINE_NETS = [Net(8, (Layer(16, kernel=5, activation=a),), seed=40 + k, line=True) for k, a in
             enumerate(("", "relu", "silu", "gelu_written"))]
LINE_NETS += [Net(8, (Layer(16, kernel=3, stride=2, pad=(0, 1, 0, 2), activation="relu"),
                      Layer(16, dilation=2, residual=True, activation="relu"), Layer(24, kernel=1, bn=True, activation="silu"),
                      Layer(24, group=24, activation="relu")), seed=45, line=True)]
LINE_NETS += [Net(n.channels, n.layers, TP.FLOAT16, n.seed, line=True) for n in LINE_NETS]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def stitched(net: Net):
    """The network optimized with epilogues, layout changes priced at nothing so that every
    ungrouped or depthwise Conv is a conv group (other grouped ones stay ORT's), verified on the
    GPU."""
    res = stitch(model(net), epilogues=True, shapes={"n": [2], "h": [24], "w": [24]},
                              cost=CostModel(layout_changes=False))
    convs = [g for g in res.report.plan.groups if g.scheme == "conv"]
    want = sum(ly.group in (1, ly.out) for ly in net.layers) + 2 * sum(ly.se for ly in net.layers)  # SE: two 1×1 convs
    assert len(convs) == want and not res.report.dropped, res.report.dropped
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    return res


@pytest.mark.parametrize("net", NETS + LINE_NETS, ids=lambda n: n.id)
def test_conv_epilogue_matches_float64(net: Net) -> None:
    res = stitched(net)
    given = feeds(net, 3, 19, 23, np.random.default_rng(fresh_seed()))
    want = reference(net, given)
    (got,) = run_gpu(res.model, given, [want.astype(given["x"].dtype)])
    assert relative_error(got, want) <= TOLERANCE[net.dtype]


@pytest.mark.parametrize("form", ["pad", "same_upper_even", "same_lower_even", "same_strided_fixed"])
def test_padded_and_same_convolutions_match_the_reference(form: str) -> None:
    """A zero Pad joined into the Conv's pads (TorchScript's TensorFlow-style padding, pads from
    folded constants) and SAME_UPPER/LOWER auto_pad made explicit (one-sided pads for even
    kernels, strided over fixed pixels): cuDNN's graphs with those pads, against onnx's reference
    evaluator at sizes other than the planning ones (fixed ones where the model fixes them)."""
    from onnx.reference import ReferenceEvaluator

    from ..test_conv import _same_conv, _same_padded

    m = {"pad": lambda: _same_padded(), "same_upper_even": lambda: _same_conv("SAME_UPPER", 4, 1),
         "same_lower_even": lambda: _same_conv("SAME_LOWER", 4, 1),
         "same_strided_fixed": lambda: _same_conv("SAME_UPPER", 3, 2, (15, 16))}[form]()
    res = stitch(m, epilogues=True, shapes={"n": [2], "h": [17], "w": [15]}, cost=CostModel(layout_changes=False))
    assert sum(g.scheme == "conv" for g in res.report.plan.groups) == 2 and not res.report.dropped
    assert res.report.verification is not None and res.report.verification.device == "gpu"
    hw = (15, 16) if form == "same_strided_fixed" else (21, 18)
    x = np.random.default_rng(fresh_seed()).standard_normal((3, 4, *hw)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0].astype(np.float64)
    (got,) = run_gpu(res.model, {"x": x}, [want.astype(np.float32)])
    assert relative_error(got, want) <= TOLERANCE[TP.FLOAT]


@pytest.mark.parametrize("net", [NETS[9], Net(8, (Layer(16, activation="silu"), Layer(16, residual=True)),
                                                 TP.FLOAT16, 21)], ids=lambda n: n.id)
def test_conv_epilogue_under_cuda_graphs(net: Net) -> None:
    rng = np.random.default_rng(fresh_seed())
    want = reference(net, feeds(net, 2, 20, 20, np.random.default_rng(0)))

    def check(run: int, given: dict, got: np.ndarray) -> None:
        assert relative_error(got, reference(net, given)) <= TOLERANCE[net.dtype], f"run {run}"

    replay_under_cuda_graphs(stitched(net).model, lambda: feeds(net, 2, 20, 20, rng),
                             ("y", want.shape, helper.tensor_dtype_to_np_dtype(net.dtype)), check)


# cuDNN plans chosen in one process are saved (runtime/csrc/plan_cache.h) and loaded by the next,
# so a user's first inference does not compile and time engines again.

_RUN_IN_NEW_PROCESS = r"""
import sys, time
import numpy as np, onnx, onnxstitch
from onnxstitch import ortio
model, given_at, out_at = sys.argv[1:4]
given = dict(np.load(given_at))
for _ in range(2):  # a second session finds the first one's plans in memory
    sess = onnxstitch.session(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    start = time.perf_counter()
    (y,) = sess.run(None, given)
    print(f"first run {time.perf_counter() - start:.3f} s")
np.save(out_at, y)
"""


def _run_in_new_process(model_at, given_at, out_at, cache, **env) -> tuple[np.ndarray, str]:
    """The model run in a fresh process (two sessions, one after the other) with the plan cache
    in `cache`: its output and what the library logged of its plans (ONNXSTITCH_PLAN_LOG)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _RUN_IN_NEW_PROCESS, str(model_at), str(given_at), str(out_at)],
                          env={**os.environ, "ONNXSTITCH_CACHE": str(cache), "ONNXSTITCH_PLAN_LOG": "1", **env},
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out_at), done.stderr


@pytest.mark.parametrize("net", [NETS[9], NETS[-1]], ids=lambda n: n.id)
def test_plans_chosen_in_one_process_are_loaded_by_the_next(net: Net, tmp_path) -> None:
    res = stitched(net)
    model_at = tmp_path / "stitched.onnx"
    model_at.write_bytes(res.model.SerializeToString())
    given = feeds(net, 2, 24, 24, np.random.default_rng(fresh_seed()))  # the planning sizes
    np.savez(tmp_path / "given.npz", **given)
    want = reference(net, given)
    cache = tmp_path / "cache"

    got, log = _run_in_new_process(model_at, tmp_path / "given.npz", tmp_path / "y1.npy", cache)
    assert relative_error(got, want) <= TOLERANCE[net.dtype]
    saved = sorted((cache / "plans").glob("*.plan"))
    assert saved, "no plan was saved"
    for p in saved:
        assert p.read_bytes().startswith(b"onnxstitch conv plan\n")
    assert log.count("conv plan chosen") == len(saved) and "conv plan loaded" not in log, log
    # The next process loads each once (its second session shares them; the files stay as they
    # were) and computes the same.
    before = {p: p.read_bytes() for p in saved}
    got, log = _run_in_new_process(model_at, tmp_path / "given.npz", tmp_path / "y2.npy", cache)
    assert relative_error(got, want) <= TOLERANCE[net.dtype]
    assert {p: p.read_bytes() for p in saved} == before
    assert log.count("conv plan loaded") == len(saved) and "conv plan chosen" not in log, log
    # The nodes carry the geometry they were planned at (conv_hint): the session's plans are
    # loaded by the library's loader thread, from the session's creation on, not node by node.
    assert "conv plan loader 0:" in log, log
    assert len(saved) == 1 or "conv plan loaded ahead" in log, log
    # Loaded by several loaders side by side, each on a cuDNN handle of its own (the plans then
    # run on the context's handle): each plan once, and the same results.
    got, log = _run_in_new_process(model_at, tmp_path / "given.npz", tmp_path / "y4.npy", cache,
                                   ONNXSTITCH_PLAN_LOADERS="4")
    assert relative_error(got, want) <= TOLERANCE[net.dtype]
    assert log.count("conv plan loaded") == len(saved) and "conv plan chosen" not in log, log
    assert len(saved) == 1 or "conv plan loader 1:" in log, log
    # A damaged plan falls back to the configuration the file names; the results stay right.
    for p in saved:
        p.write_bytes(p.read_bytes()[:40] + b"{not a plan")
    got, _ = _run_in_new_process(model_at, tmp_path / "given.npz", tmp_path / "y3.npy", cache)
    assert relative_error(got, want) <= TOLERANCE[net.dtype]
    # Turned off: nothing is written.
    off = tmp_path / "off"
    got, _ = _run_in_new_process(model_at, tmp_path / "given.npz", tmp_path / "y4.npy", off, ONNXSTITCH_PLAN_CACHE="0")
    assert relative_error(got, want) <= TOLERANCE[net.dtype]
    assert not (off / "plans").exists()
