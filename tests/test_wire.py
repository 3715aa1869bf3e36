"""wire.py: a model file read with its large raw payloads left in the file's map gives the same
message (those fields aside) and the same bytes as onnx.load; what it cannot read it leaves to
onnx.load; load_detached through it writes the same model."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from onnxstitch import load, wire

from .stitching import fresh_seed


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """MatMuls by weights of random sizes (some under wire.CUT_FROM bytes), an int64 table, a
    float16 weight, one large enough to stay out of the message, and an If whose branch holds an
    initializer of its own."""
    inits, nodes, x = [], [], "x"
    for k in range(int(rng.integers(2, 6))):
        n = int(rng.choice([4, 16, 64, 300]))
        inits.append(numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) * n, f"w{k}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [f"y{k}"]))
        x = f"y{k}"
    inits.append(numpy_helper.from_array(rng.integers(0, 9, (4096,)).astype(np.int64), "table"))
    inits.append(numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float16), "half"))
    # Over weights.DETACH_ABOVE elements: kept out of the message as a view of the file.
    inits.append(numpy_helper.from_array(rng.standard_normal((256, 300)).astype(np.float32), "big"))
    branch_w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "bw")
    then = helper.make_graph([helper.make_node("MatMul", [x, "bw"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, [8, 32])], [branch_w])
    other = helper.make_graph([helper.make_node("Identity", [x], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TP.FLOAT, [8, 32])])
    nodes.append(helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [8, 32]),
                                       helper.make_tensor_value_info("c", TP.BOOL, [])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, [8, 32])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", range(4))
def test_payloads_are_the_files_bytes_and_the_rest_is_onnx_s(tmp_path: Path, case: int) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(np.random.default_rng(fresh_seed() + case)), path)
    got = wire.read(path)
    want = onnx.load(path)
    assert got is not None
    assert got.payloads, "nothing was cut"
    for i, t in enumerate(want.graph.initializer):
        mine = got.model.graph.initializer[i]
        if i in got.payloads:
            assert bytes(got.payloads[i]) == t.raw_data and len(t.raw_data) >= wire.CUT_FROM
            mine = onnx.TensorProto.FromString(mine.SerializeToString())
            mine.raw_data = t.raw_data
        assert mine == t
    # Nothing else differs, subgraphs' initializers included.
    del want.graph.initializer[:]
    del got.model.graph.initializer[:]
    assert got.model == want


@pytest.mark.parametrize("content", [b"", b"not a model at all\n" * 40, "cut", "two graphs"])
def test_what_it_cannot_read_is_left_to_onnx(tmp_path: Path, content: bytes | str) -> None:
    path = tmp_path / "m.onnx"
    if content == "cut":  # cut short inside a weight
        onnx.save(_model(np.random.default_rng(fresh_seed())), path)
        content = path.read_bytes()[:-100]
    elif content == "two graphs":  # legal protobuf (the two merge), not what exporters write
        m = _model(np.random.default_rng(fresh_seed()))
        graph_only = onnx.ModelProto(graph=m.graph).SerializeToString()
        content = m.SerializeToString() + graph_only
    path.write_bytes(content)
    assert wire.read(path) is None


def test_load_detached_through_the_map_writes_the_same_model(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(np.random.default_rng(fresh_seed())), path)
    written = []
    for reader in (wire.read, lambda _p: None):  # through the map, then as onnx reads it
        monkeypatch.setattr(wire, "read", reader)
        model, weights = load.load_detached(path)
        out = tmp_path / f"out{len(written)}.onnx"
        assert weights.bytes_in(model) >= 256 * 300 * 4  # "big" is held apart
        weights.save(model, out, False)
        written.append(out.read_bytes())
    assert written[0] == written[1]


def test_sessions_map_the_weights_from_the_model_file_itself(tmp_path: Path) -> None:
    """Weights inside the file reach ONNX Runtime as external data of that same file (ORT maps
    them; handed over in memory each session copied them: BERT-base +0.48 GB a session), at
    whatever offset protobuf put them."""
    from onnxstitch import sessions
    from onnxstitch.weights import is_stub

    rng = np.random.default_rng(fresh_seed())
    odd = int(rng.integers(1, 8))  # a table before the weight, so its payload lies unaligned
    inits = [numpy_helper.from_array(rng.integers(0, 9, (4096 + odd,)).astype(np.uint8), "table"),
             numpy_helper.from_array(rng.standard_normal((256, 300)).astype(np.float32), "big")]
    nodes = [helper.make_node("MatMul", ["x", "big"], ["y"]),
             helper.make_node("Cast", ["table"], ["t"], to=TP.FLOAT),
             helper.make_node("ReduceSum", ["t"], ["s"], keepdims=0),
             helper.make_node("Add", ["y", "s"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [4, 256])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, [4, 300])], inits)
    whole = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(whole, path)
    mapped = wire.read(path)
    assert mapped is not None
    raw = path.read_bytes()
    for i, view in mapped.payloads.items():
        assert raw[mapped.offsets[i]:mapped.offsets[i] + len(view)] == bytes(view)
    model, weights = load.load_detached(path)
    session_model = weights.session_model(model, files=True)
    big = next(t for t in session_model.graph.initializer if t.name == "big")
    fields = {e.key: e.value for e in big.external_data}
    assert not is_stub(big) and fields["location"] == "m.onnx"
    feeds = {"x": rng.standard_normal((4, 256)).astype(np.float32)}
    want = sessions.runtime_session(whole.SerializeToString(), False, False).run(None, feeds)
    got = sessions.Runner(False, weights).run(model, False, feeds)
    np.testing.assert_array_equal(got["z"], want[0])
