"""The weights store (weights.py): joined sibling weights are made only where read and equal
numpy's concatenation; ONNX Runtime sessions read stubs from their external data files and
join merged weights themselves, with the same outputs as the model with its weights inside;
the written model holds the same bytes either way."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import onnxstitch
from onnxstitch import load, sessions, shapes, siblings, weights as weights_mod
from onnxstitch.inputs import random_feeds

from .sibling_models import projections

# Large enough that every weight is detached (k × n > DETACH_ABOVE).
K, SIZES = 256, (384, 384, 128)


def _on_disk(tmp_path: Path) -> tuple[Path, onnx.ModelProto]:
    model, _ = projections(SIZES, K, tail="heads", heads=4)
    src = tmp_path / "in"
    src.mkdir()
    whole = onnx.ModelProto()
    whole.CopyFrom(model)
    onnx.save(model, src / "m.onnx", save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    return src / "m.onnx", whole


def _merged(path: Path) -> tuple[onnx.ModelProto, weights_mod.Weights]:
    m, store = load.load_detached(path)
    m = load.constants_to_initializers(m)
    out = siblings.merge(m, shapes.infer(m)[1], (), store)
    assert len(out.merges) == 1
    return out.model, store


def test_a_join_is_made_only_where_read_and_equals_numpys(tmp_path: Path) -> None:
    path, whole = _on_disk(tmp_path)
    merged, store = _merged(path)
    (w,) = [t for t in merged.graph.initializer if t.name.endswith(siblings.SUFFIX)]
    assert weights_mod.is_stub(w) and list(w.dims) == [K, sum(SIZES)]
    originals = {t.name: numpy_helper.to_array(t) for t in whole.graph.initializer}
    want = np.concatenate([originals[f"w{i}"] for i in range(len(SIZES))], axis=1)
    np.testing.assert_array_equal(store.value(w), want)
    attached = store.attach(merged)
    np.testing.assert_array_equal(numpy_helper.to_array(next(t for t in attached.graph.initializer
                                                             if t.name == w.name)), want)


@pytest.mark.parametrize("large", [False, True])  # given as bytes (files mapped), through a file
def test_sessions_read_the_files_and_join_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      large: bool) -> None:
    path, _ = _on_disk(tmp_path)
    merged, store = _merged(path)
    session_model = store.session_model(merged, files=not large)
    assert not any(weights_mod.is_stub(t) and t.name.endswith(siblings.SUFFIX) for t in session_model.graph.initializer)
    assert "Concat" in [n.op_type for n in session_model.graph.node]
    feeds = random_feeds(merged, seed=0, dim_values={"batch": 2, "seq": 3})
    # The same session options, weights inside the model.
    want = sessions.runtime_session(store.attach(merged).SerializeToString(), False, False).run(None, feeds)
    monkeypatch.setattr(sessions, "is_large", lambda _m: large)
    # The joins run as Concat nodes, not folded into a second copy held by each session.
    assert weights_mod.Weights.has_joins(session_model)
    folds: list[bool] = []
    monkeypatch.setattr(sessions, "runtime_session",
                        lambda *a, _real=sessions.runtime_session, **k: folds.append(k["fold"]) or _real(*a, **k))
    got = sessions.Runner(False, store).run(merged, False, feeds)
    assert folds == [False]
    for o, w in zip(merged.graph.output, want):
        np.testing.assert_array_equal(got[o.name], w)


def test_session_options_refuse_a_join_left_as_a_stub(tmp_path: Path) -> None:
    path, _ = _on_disk(tmp_path)
    merged, store = _merged(path)
    with pytest.raises(ValueError, match="session_model"):
        store.session_options(merged)


def test_the_written_model_holds_the_joined_weights(tmp_path: Path) -> None:
    path, whole = _on_disk(tmp_path)
    merged, store = _merged(path)
    out = tmp_path / "out"
    out.mkdir()
    store.save(merged, out / "s.onnx", external=True)
    written = onnx.load(str(out / "s.onnx"))
    expected = store.attach(merged)
    assert [(t.name, t.raw_data) for t in written.graph.initializer] == \
        [(t.name, t.raw_data) for t in expected.graph.initializer]
    originals = {t.name: numpy_helper.to_array(t) for t in whole.graph.initializer}
    joined = next(t for t in written.graph.initializer if t.name.endswith(siblings.SUFFIX))
    np.testing.assert_array_equal(numpy_helper.to_array(joined),
                                  np.concatenate([originals[f"w{i}"] for i in range(len(SIZES))], axis=1))


def test_the_streamed_inline_write_is_the_model_onnx_would_write(tmp_path: Path) -> None:
    """Without external data, `save` streams the model (header, graph, each initializer with its
    payload) instead of attaching every payload and serializing the whole: the file parses to
    exactly the model `attach` makes, inline weights, a join, and payloads from a file alike."""
    path, _ = _on_disk(tmp_path)
    merged, store = _merged(path)
    rng = np.random.default_rng()
    merged.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "small"))
    big = rng.standard_normal(weights_mod.DETACH_ABOVE + 3).astype(np.float32)
    merged.graph.initializer.append(store.add(big, "inline_big"))
    store.save(merged, tmp_path / "s.onnx", external=False)
    written = onnx.load(str(tmp_path / "s.onnx"))
    assert written == store.attach(merged)
    np.testing.assert_array_equal(numpy_helper.to_array(written.graph.initializer[-1]), big)


def test_optimize_from_external_data_verifies_and_writes(tmp_path: Path) -> None:
    path, whole = _on_disk(tmp_path)
    res = onnxstitch.optimize(path, shapes={"batch": [2], "seq": [8]}, archs=("sm_90",))
    assert res.report.verification is not None and res.report.verification.tensors_checked > 0
    assert res.report.merged
    res.save(tmp_path / "s.onnx")
    feeds = random_feeds(whole, seed=1, dim_values={"batch": 2, "seq": 3})
    want = ort.InferenceSession(whole.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_model_counts_the_bytes_it_writes_once(tmp_path: Path) -> None:
    """After a merge the store holds the parts and the join; the merged model writes the join
    alone, and `bytes_in` (what `save` weighs against protobuf's limit) counts just that."""
    path, _ = _on_disk(tmp_path)
    merged, store = _merged(path)
    stubs = {t.name for t in merged.graph.initializer if weights_mod.is_stub(t)}
    written = sum(len(t.raw_data) for t in store.attach(merged).graph.initializer if t.name in stubs)
    assert store.bytes_in(merged) == written == 4 * K * sum(SIZES)
    assert store.nbytes > written  # the detached parts, still held, and the join
