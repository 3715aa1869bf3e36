"""Programmatic dependent launch (docs/abi.md, "programmatic_wait"): the runtime may start a
generated kernel while the kernel before it on the stream finishes, so every entry of every
generated kernel must wait for its predecessors before it touches memory, and only nodes whose
kernels do so may be marked for it."""
from __future__ import annotations

import dataclasses
import re

import onnx
import pytest

import onnxstitch
from onnxstitch import compile as nvrtc_compile
from onnxstitch.schemes.attention import codegen as codegen_attention

from .attention_models import Core, Decoder, attention_graph, core_model, decoder_model
from .row_models import long_row_model, row_models

# An entry's head and the first statement of its body.
_ENTRY = re.compile(r'extern "C" __global__ void [^\n]*?\(const StitchArgs a\) \{\s*([^;]*;)')


def _models() -> list[tuple[str, onnx.ModelProto]]:
    rows = [(f"rows-{name}", m) for name, m, _ in list(row_models(64, 256))[:4]]
    return [*rows, ("long-row", long_row_model()[0]),
            ("attention", core_model(Core((2, 4), 64, 64, 32, (2, 1, 1, 64)))),
            ("attention-half", core_model(Core((2, 4), 64, 64, 32, (2, 1, 1, 64)), dtype=onnx.TensorProto.FLOAT16)),
            ("decode", decoder_model(Decoder(2, 6, 3, 1, 150, 16, "dynamo")))]


def _optimized(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch, **kwargs) -> tuple[list, onnx.ModelProto]:
    """The sources handed to the compiler and the stitched model (not verified: the sources are
    what is checked)."""
    seen: list = []
    real = nvrtc_compile.compile_all

    def recording(sources, *args, **kw):
        sources = list(sources)
        seen.extend(sources)
        return real(sources, *args, **kw)

    monkeypatch.setattr(nvrtc_compile, "compile_all", recording)
    return seen, onnxstitch.optimize(model, verify=False, **kwargs).model


@pytest.mark.parametrize("name,model", _models(), ids=[n for n, _ in _models()])
def test_every_entry_waits_for_its_predecessors_first(name: str, model: onnx.ModelProto,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sources, stitched = _optimized(model, monkeypatch)
    generated = [s for s in sources if s.source]
    assert generated, f"{name}: nothing generated"
    for src in generated:
        firsts = _ENTRY.findall(src.source)
        # Every entry the image exports (and the decode form's and clusters' extra ones).
        assert len(firsts) >= len(src.entries), f"{name}: entries not found in {src.name}"
        assert all(f.startswith("stitch_wait_prior();") for f in firsts), f"{name}: {src.name}: {firsts}"
    fused = [n for n in stitched.graph.node if n.op_type == "FusedKernel"]
    assert fused and all(onnx.helper.get_attribute_value(a) == 1 for n in fused
                         for a in n.attribute if a.name == "programmatic_wait")
    assert all(any(a.name == "programmatic_wait" for a in n.attribute) for n in fused)


def test_attention_decode_form_waits_in_all_three_kernels() -> None:
    g, found = attention_graph(decoder_model(Decoder(2, 6, 3, 1, 150, 16, "dynamo")))
    src = codegen_attention.generate(g, "stitch_h0", dataclasses.replace(found.matches[0], decode=True))
    heads = _ENTRY.findall(src.source)
    assert len(heads) == 3 and all(h.startswith("stitch_wait_prior();") for h in heads), heads


def test_no_programmatic_launch_leaves_the_nodes_unmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    _, stitched = _optimized(core_model(Core((2, 4), 64, 64, 32, (2, 1, 1, 64))), monkeypatch, programmatic=False)
    fused = [n for n in stitched.graph.node if n.op_type == "FusedKernel"]
    assert fused and not any(a.name == "programmatic_wait" for n in fused for a in n.attribute)
