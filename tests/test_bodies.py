"""Fusion inside If, Loop and Scan (bodies.py): each body is planned, stitched and verified as a
model of its own; the written model keeps its control flow, its bodies hold FusedKernel nodes
with their fallback functions under names of their own, and it computes what the original does
on fresh inputs that take each branch and run the loop and the scan for several steps."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxstitch.errors import SIZE_HINT
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxstitch
from onnxstitch import bodies

from .stitching import fresh_seed

N = helper.make_node


def _chain(x: str, out: str, tag: str, extra: str | None = None) -> list[onnx.NodeProto]:
    """Five elementwise ops (and a read of `extra` from the outer scope): one fused group."""
    a, b, c, d = (f"{tag}_{k}" for k in "abcd")
    return [N("Sigmoid", [x], [a]), N("Mul", [a, x], [b]), N("Tanh", [b], [c]),
            N("Add", [c, extra or x], [d]), N("Mul", [d, d], [out])]


def control_flow_model() -> onnx.ModelProto:
    """x [B, 64] and a flag: an If whose branches each run a chain over x (reading an outer
    tensor), a Loop that applies a chain to a carried state `steps` times, and a Scan over the rows
    of a sequence [T, B, 64] with a chain in its body (an RNN-like recurrence)."""
    s = helper.make_tensor_value_info
    then = helper.make_graph(_chain("x", "t_out", "t", "bias"), "then", [], [s("t_out", TP.FLOAT, ["B", 64])])
    other = helper.make_graph([N("Neg", ["x"], ["nx"])] + _chain("nx", "e_out", "e"), "else", [],
                              [s("e_out", TP.FLOAT, ["B", 64])])
    loop_body = helper.make_graph(
        [N("Identity", ["cond_in"], ["cond_out"])] + _chain("h_in", "h_out", "l", "bias"), "loop_body",
        [s("i", TP.INT64, []), s("cond_in", TP.BOOL, []), s("h_in", TP.FLOAT, ["B", 64])],
        [s("cond_out", TP.BOOL, []), s("h_out", TP.FLOAT, ["B", 64])])
    scan_body = helper.make_graph(
        [N("Add", ["st_in", "row"], ["sum"])] + _chain("sum", "st_out", "s") + [N("Identity", ["st_out"], ["y_row"])],
        "scan_body", [s("st_in", TP.FLOAT, ["B", 64]), s("row", TP.FLOAT, ["B", 64])],
        [s("st_out", TP.FLOAT, ["B", 64]), s("y_row", TP.FLOAT, ["B", 64])])
    nodes = [N("Relu", ["x"], ["bias"]),
             N("If", ["flag"], ["branch"], then_branch=then, else_branch=other),
             N("Loop", ["steps", "", "branch"], ["looped"], body=loop_body),
             N("Scan", ["looped", "seq"], ["state", "ys"], body=scan_body, num_scan_inputs=1)]
    graph = helper.make_graph(nodes, "control", [s("x", TP.FLOAT, ["B", 64]), s("flag", TP.BOOL, []),
                                                  s("steps", TP.INT64, []), s("seq", TP.FLOAT, ["T", "B", 64])],
                              [s("state", TP.FLOAT, ["B", 64]), s("ys", TP.FLOAT, ["T", "B", 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_bodies_are_stitched_and_compute_what_the_original_does() -> None:
    model = control_flow_model()
    res = onnxstitch.optimize(model, shapes={"B": [4], "T": [5]})
    notes = res.report.notes["bodies"]
    assert len(notes.rewrites) == 4, (notes.rewrites, notes.refusals)  # then, else, loop body, scan body
    stitched = res.model
    fused = [n for n in bodies._all_nodes(stitched.graph) if n.op_type == "FusedKernel"]
    assert len(fused) >= 4 and len({n.overload for n in fused}) == len(fused)
    assert {(f.domain, f.overload) for f in stitched.functions} >= {(n.domain, n.overload) for n in fused}
    assert [n.op_type for n in stitched.graph.node if n.op_type in ("If", "Loop", "Scan")] == ["If", "Loop", "Scan"]
    rng = np.random.default_rng(fresh_seed())
    for flag in (True, False):  # each branch, and several loop and scan steps
        feeds = {"x": rng.standard_normal((3, 64)).astype(np.float32), "flag": np.array(flag),
                 "steps": np.array(3, np.int64), "seq": rng.standard_normal((4, 3, 64)).astype(np.float32)}
        for got, want in zip(_run(stitched, feeds), _run(model, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "bodies" in res.report.to_json() and res.report.to_json()["bodies"]["rewrites"]


def test_a_body_is_verified_on_its_own_and_a_wrong_one_stays_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The If's then branch with a broken fallback (Sub for Mul): its own verification finds the
    group and leaves it to ONNX Runtime; the other bodies are stitched, the model still right."""
    from onnxstitch import rewrite

    real = rewrite._function

    def broken(m, g, grp):
        fn = real(m, g, grp)
        if any(n.op_type == "Tanh" for n in fn.node) and any(i.startswith("bias") for i in fn.input):
            for n in fn.node:
                if n.op_type == "Mul":
                    n.op_type = "Sub"
        return fn

    monkeypatch.setattr(rewrite, "_function", broken)
    model = control_flow_model()
    res = onnxstitch.optimize(model, shapes={"B": [4], "T": [5]})
    rng = np.random.default_rng(fresh_seed())
    feeds = {"x": rng.standard_normal((3, 64)).astype(np.float32), "flag": np.array(True),
             "steps": np.array(2, np.int64), "seq": rng.standard_normal((2, 3, 64)).astype(np.float32)}
    for got, want in zip(_run(res.model, feeds), _run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_no_control_flow_leaves_the_bodies_alone() -> None:
    model = control_flow_model()
    res = onnxstitch.optimize(model, shapes={"B": [4], "T": [5]}, control_flow=False)
    assert not [n for n in bodies._all_nodes(res.model.graph) if n.op_type == "FusedKernel"]
    assert not res.report.notes["bodies"].rewrites


def test_a_body_reading_an_untyped_outer_tensor_is_left_with_why() -> None:
    s = helper.make_tensor_value_info
    then = helper.make_graph(_chain("u", "t_out", "t"), "then", [], [s("t_out", TP.FLOAT, [4])])
    other = helper.make_graph(_chain("u", "e_out", "e"), "else", [], [s("e_out", TP.FLOAT, [4])])
    graph = helper.make_graph([N("CustomThing", ["x"], ["u"], domain="my.ops"),
                               N("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
                              [s("x", TP.FLOAT, [4]), s("flag", TP.BOOL, [])], [s("y", TP.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("my.ops", 1)],
                              ir_version=10)
    from onnxstitch import load, shapes

    m = load.constants_to_initializers(model)
    _, infos = shapes.infer(m)
    done = bodies.stitch_bodies(m, infos, {}, lambda bm, shapes: pytest.fail("nothing to optimize"))
    assert not done.bodies and all("whose type the outer graph's inference does not know" in r for r in done.refusals)
    assert len(done.refusals) == 2


def test_bodies_with_initializers_and_nested_ifs_round_trip() -> None:
    """A branch holding its own initializer and a nested If: the inner bodies are stitched by the
    body's own optimize, the initializer stays in the branch."""
    s = helper.make_tensor_value_info
    w = numpy_helper.from_array(np.linspace(-1, 1, 64).astype(np.float32), "w_in_branch")
    inner_then = helper.make_graph(_chain("x", "it", "it"), "inner_then", [], [s("it", TP.FLOAT, ["B", 64])])
    inner_else = helper.make_graph(_chain("x", "ie", "ie", "x"), "inner_else", [], [s("ie", TP.FLOAT, ["B", 64])])
    then = helper.make_graph([N("Mul", ["x", "w_in_branch"], ["xw"])] + _chain("xw", "t1", "t") +
                             [N("If", ["flag2"], ["t2"], then_branch=inner_then, else_branch=inner_else),
                              N("Add", ["t1", "t2"], ["t_out"])], "then", [], [s("t_out", TP.FLOAT, ["B", 64])], [w])
    other = helper.make_graph(_chain("x", "e_out", "e"), "else", [], [s("e_out", TP.FLOAT, ["B", 64])])
    graph = helper.make_graph([N("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
                              [s("x", TP.FLOAT, ["B", 64]), s("flag", TP.BOOL, []), s("flag2", TP.BOOL, [])],
                              [s("y", TP.FLOAT, ["B", 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    res = onnxstitch.optimize(model, shapes={"B": [4]})
    assert len([n for n in bodies._all_nodes(res.model.graph) if n.op_type == "FusedKernel"]) >= 3
    rng = np.random.default_rng(fresh_seed())
    for f1 in (True, False):
        for f2 in (True, False):
            feeds = {"x": rng.standard_normal((2, 64)).astype(np.float32), "flag": np.array(f1), "flag2": np.array(f2)}
            np.testing.assert_allclose(_run(res.model, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gru_scan", "greedy_loop"])
def test_corpus_control_flow_models_fuse_their_bodies(name: str) -> None:
    """The corpus's Scan GRU and greedy-decoding Loop (models/controlflow.py): their bodies read
    outer constants that decide shapes (a Split's sizes), which verification must give their
    values, not random ones. Each body gets kernels, and the whole model is compared with the
    original end to end although its main graph fuses nothing."""
    from models import controlflow

    model = getattr(controlflow, name)()
    shapes = {"batch": [4], "seq": [6]} if name == "gru_scan" else {"batch": [4]}
    res = onnxstitch.optimize(model, shapes=shapes)
    notes = res.report.notes["bodies"]
    assert len(notes.rewrites) == 1 and not notes.refusals, (notes.rewrites, notes.refusals)
    fused = [n for n in bodies._all_nodes(res.model.graph) if n.op_type == "FusedKernel"]
    assert fused
    assert res.report.verification is not None and not res.report.verification.skipped
    # The Split sizes only the fused-away nodes read are gone from the main graph.
    assert not [t.name for t in res.model.graph.initializer if t.name.endswith("thirds")]
    rng = np.random.default_rng(fresh_seed())
    if name == "gru_scan":
        feeds = {"x": rng.standard_normal((3, 5, controlflow.FEATURES)).astype(np.float32),
                 "h0": rng.standard_normal((3, controlflow.HIDDEN)).astype(np.float32)}
    else:
        feeds = {"tok0": rng.integers(0, controlflow.VOCAB, 3).astype(np.int64),
                 "h0": rng.standard_normal((3, controlflow.HIDDEN)).astype(np.float32)}
    for got, want in zip(_run(res.model, feeds), _run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_two_optimizations_write_the_same_bytes_whatever_the_hash_seed(tmp_path) -> None:
    """Inference names a body's dims after whichever equal outer symbol it meets first (an order
    that follows Python's string hashing): stitched bodies keep no dim names, so the written model
    is the same bytes in every process."""
    import hashlib
    import os
    import subprocess
    import sys

    onnx.save(control_flow_model(), str(tmp_path / "cf.onnx"))
    code = ("import hashlib, sys, onnxstitch; r = onnxstitch.optimize(sys.argv[1], shapes={'B': [4], 'T': [5]}); "
            "print(hashlib.sha256(r.model.SerializeToString(deterministic=True)).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code, str(tmp_path / "cf.onnx")], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
               for seed in ("1", "2")}
    assert len(digests) == 1 and hashlib.sha256(b"").hexdigest() not in digests


def test_warnings_while_a_body_is_optimized_name_the_body(caplog: pytest.LogCaptureFixture) -> None:
    """A warning logged while a body is optimized says which body, and does not tell the user to
    size the model's inputs for a branch that may run at other sizes."""
    import logging

    with caplog.at_level(logging.WARNING), bodies._scoped("If x: then_branch"), bodies._scoped("Loop y: body"):
        logging.getLogger("onnxstitch.pipeline").warning(f"verification cannot run it: {SIZE_HINT}; %s", "left")
    (rec,) = caplog.records
    assert rec.getMessage().startswith("If x: then_branch: Loop y: body: verification cannot run it: ")
    assert "--shape" not in rec.getMessage() and rec.getMessage().endswith("; left")
    assert not logging.getLogger("onnxstitch.pipeline").filters


def test_a_branch_for_another_input_length_is_verified_at_half_the_sizes() -> None:
    """An If branch that runs only at half the planning length (silero-vad's 8 kHz branch reads
    256 samples where the model is planned at 512): verification cannot run it at the planning
    sizes, so the body is planned and verified again at half of them, and both branches fuse."""
    V = helper.make_tensor_value_info
    c = lambda name, v: N("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64)))  # noqa: E731
    then = helper.make_graph(_chain("x", "yt", "t"), "then", [], [V("yt", TP.FLOAT, [1, "L"])])
    other = helper.make_graph([c("rows", [2, 128]), c("flat", [1, -1]), N("Reshape", ["x", "rows"], ["xr"])]
                              + _chain("xr", "ye0", "e") + [N("Reshape", ["ye0", "flat"], ["ye"])],
                              "else", [], [V("ye", TP.FLOAT, [1, 256])])
    graph = helper.make_graph([N("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "branches",
                              [V("x", TP.FLOAT, [1, "L"]), V("flag", TP.BOOL, [])], [V("y", TP.FLOAT, [1, "Y"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    res = onnxstitch.optimize(model, shapes={"L": [512]})
    notes = res.report.notes["bodies"]
    assert len(notes.rewrites) == 2 and not notes.refusals, (notes.rewrites, notes.refusals)
    rng = np.random.default_rng(fresh_seed())
    for flag, length in ((True, 512), (False, 256)):
        feeds = {"x": rng.standard_normal((1, length)).astype(np.float32), "flag": np.array(flag)}
        np.testing.assert_allclose(_run(res.model, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_an_if_deciding_later_ifs_takes_the_tail_into_its_branches() -> None:
    """`x.squeeze(-1) if x.size(-1) == 1 else x` then `if y.dim() == 2:` (tests/test_simplify.py's
    model): the squeeze's If gives rank 2 or 3, so the tail after it, the rank's If included, runs
    inside each of its branches (renamed per branch), where the rank is known and the rank's If
    folds; the model computes what it did through either branch (lengths 1 and 3)."""
    from onnxstitch import shapes, simplify

    from .test_simplify import _size_branches

    model = _size_branches(2)
    inferred, tensors = shapes.infer(model)
    pre = simplify.simplify(inferred, tensors)  # (the state's If first, as the pipeline does)
    out, lines = bodies.sink_tails(pre.model, pre.tensors)
    assert len(lines) == 1 and "squeeze_if" in lines[0], lines
    main = [n for n in out.graph.node if n.op_type == "If"]
    assert [n.name for n in main] == ["squeeze_if"] and list(main[0].output) == ["y"]
    for branch in main[0].attribute:
        assert [n.name for n in branch.g.node if n.op_type == "If"] == [f"rank_if~{branch.name.split('_')[0]}"]
        # inside the branch the rank is known: as a model of its own, its If is its branch
        sub = bodies.body_model(branch.g, main[0], out, shapes.infer(out)[1])
        folded = simplify.simplify(*shapes.infer(sub))
        assert not [n for n in folded.model.graph.node if n.op_type == "If"], folded.rewrites
    # Its then branch runs only at a length of 1: planned and verified there (random lengths
    # would fail its Squeeze).
    assert bodies._implied_sizes(out.graph, main[0], shapes.infer(out)[1]) == {"T": 1}
    onnx.checker.check_model(out, full_check=True)
    rng = np.random.default_rng(fresh_seed())
    for length in (1, 3):
        feeds = {"x": rng.standard_normal((2, 4, length)).astype(np.float32),
                 "state": rng.standard_normal((2, 2, 8)).astype(np.float32)}
        (want,), (got,) = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                           for m in (model, out))
        assert got.shape == want.shape and np.array_equal(got, want), length


def test_an_if_no_later_if_branches_on_keeps_its_tail() -> None:
    """With nothing after it branching on what it gives, an If stays as it is."""
    from onnxstitch import shapes

    from .test_simplify import _size_branches

    model = _size_branches(2)
    del model.graph.node[-1]  # (the rank's If)
    model.graph.output[0].name = "c2"
    model.graph.output[0].type.tensor_type.elem_type = TP.BOOL
    del model.graph.output[0].type.tensor_type.shape.dim[:]
    out, lines = bodies.sink_tails(*shapes.infer(model))
    assert not lines and out is not None
