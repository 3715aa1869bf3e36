"""The model zoo's committed small variants (models/small/, tiny configs of the real
architectures exported by models/zoo.py) go through `onnxstitch.optimize`: the stitched model
passes the full ONNX checker, fuses something, and computes what the original computes on
ORT CPU (the fused nodes' fallback functions) at the default and another dynamic shape.
These need no torch; the last test, which exports a model end to end, runs only with torch."""
from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxstitch
from models import zoo
from models.tolerances import chain_tolerance

SMALL = Path(__file__).resolve().parents[1] / "models" / "small"
MANIFEST = json.loads((SMALL / "manifest.json").read_text())
ENTRIES = {e["name"]: e for e in MANIFEST["models"]}
# A second size for every symbolic dim: the stitched model must keep its dynamic dims.
OTHER_DIMS = {"batch": 3, "sequence": 20}
HAS_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "onnxscript"))


def _shapes(entry: dict[str, Any], dims: dict[str, int] | None = None) -> dict[str, list[int]]:
    """Each input's default shape, or its dims with symbolic ones taken from `dims`."""
    if dims is None:
        return {i["name"]: list(i["shape"]) for i in entry["inputs"]}
    return {i["name"]: [dims[d] if isinstance(d, str) else d for d in i["dims"]] for i in entry["inputs"]}


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _assert_outputs_close(got: list[np.ndarray], want: list[np.ndarray], names: list[str], what: str) -> None:
    # Outputs sit at the end of whole networks (dozens of ops per path), so the tolerance is the
    # long-chain one; stock ORT and the inlined fallback may also fuse MatMul/LayerNorm differently.
    assert len(got) == len(want)
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what} {name}: {g.shape}/{g.dtype} vs {w.shape}/{w.dtype}"
        assert np.isfinite(w).all(), f"{what} {name}: the original's output is not finite"
        rtol, atol = chain_tolerance(w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what} {name}")


def test_manifest_lists_every_zoo_model_and_files_are_small() -> None:
    assert set(ENTRIES) == set(zoo.MODELS)
    for e in MANIFEST["models"]:
        path = SMALL / e["path"]
        assert path.stat().st_size < 1 << 20, f"{path} is over 1 MB"
        assert path.stat().st_size == e["bytes"]


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_manifest_matches_model_inputs(name: str) -> None:
    entry = ENTRIES[name]
    model = onnx.load(str(SMALL / entry["path"]))
    graph_inputs = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
                    for vi in model.graph.input}
    assert graph_inputs == {i["name"]: i["dims"] for i in entry["inputs"]}
    for inp in entry["inputs"]:
        # Every model has a dynamic batch; text models a dynamic sequence as well.
        assert inp["dims"][0] == "batch"
        if "int_range" in inp:
            assert inp["dims"] == ["batch", "sequence"]


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_small_model_stitches_and_matches(name: str) -> None:
    entry = ENTRIES[name]
    original = onnx.load(str(SMALL / entry["path"]))
    # verify=False: this test compares outputs itself, with token ids inside the vocabulary
    # (the pipeline's own verify draws integers in -20..20, out of range for token_type_ids).
    result = onnxstitch.optimize(original, shapes=_shapes(entry), verify=False)
    stitched = result.model
    onnx.checker.check_model(stitched, full_check=True)
    ops = Counter(n.op_type for n in stitched.graph.node)
    # Every architecture here has elementwise chains (activations, residual adds, norms'
    # scale and shift, attention scaling): at least one group must be fused.
    assert ops["FusedKernel"] >= 1, f"{name}: nothing fused"
    assert len(stitched.graph.node) < len(original.graph.node)
    outputs = [o.name for o in original.graph.output]
    assert [o.name for o in stitched.graph.output] == outputs
    for seed, dims in ((0, None), (1, OTHER_DIMS)):
        feeds = zoo.feeds(entry, seed, _shapes(entry, dims))
        _assert_outputs_close(_run(stitched, feeds), _run(original, feeds), outputs, f"{name} seed {seed}")


def test_feeds_draw_integer_inputs_in_range() -> None:
    entry = ENTRIES["bert-base"]
    feeds = zoo.feeds(entry, seed=3, shapes={"input_ids": [4, 9]})
    for inp in entry["inputs"]:
        lo, hi = inp["int_range"]
        x = feeds[inp["name"]]
        assert x.dtype == np.int64 and lo <= x.min() and x.max() < hi
    assert feeds["input_ids"].shape == (4, 9) and feeds["attention_mask"].shape == (2, 16)
    again = zoo.feeds(entry, seed=3, shapes={"input_ids": [4, 9]})
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch, transformers and onnxscript (pip install '.[zoo]')")
def test_export_small_llama_end_to_end(tmp_path: Path) -> None:
    import torch

    info = zoo.export_info("llama-block", "float32", tmp_path, "small")
    assert info.path == tmp_path / "llama-block-float32.onnx" and info.path.exists()
    assert [i["dims"] for i in info.inputs] == [["batch", "sequence"]] * 2
    entry = info.manifest_entry(tmp_path)
    feeds = zoo.feeds(entry, seed=5, shapes=_shapes(entry, OTHER_DIMS))
    built = zoo.build("llama-block", "small")  # seeded: the same weights as the export
    with torch.no_grad():
        want = built.module(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy()
    model = onnx.load(str(info.path))
    (got,) = _run(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    stitched = onnxstitch.optimize(model, shapes=_shapes(entry), verify=False).model
    _assert_outputs_close(_run(stitched, feeds), [got], ["last_hidden_state"], "llama-block stitched")
