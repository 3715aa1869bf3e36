"""The model zoo: real architectures with random weights built from their configs, exported
to ONNX with `torch.onnx.export` the way users export them. Nothing is downloaded.

Every builder takes `size` ("full": the published configuration; "small": a tiny config of
the same architecture for tests) and returns a `Built`: the torch module, example inputs,
input names and the symbolic dims of each input, plus what a benchmark needs to feed it
(a default concrete shape, the valid range of integer inputs). `export(name, dtype, out_dir,
size)` writes `<out_dir>/<name>-<dtype>.onnx`.

One exporter path for every model: the dynamo exporter (`torch.onnx.export(dynamo=True)`,
torch.export + onnxscript) at opset 18, with `torch.export.Dim` named `batch` and `sequence`
so the ONNX inputs carry exactly those dim names. Inputs are passed by keyword. The legacy
TorchScript exporter (dynamo=False) is deprecated and failed on transformers 5's BertModel
("got multiple values for argument 'use_cache'"); the dynamo path exported every model here
with torch 2.11 and 2.13.
Float16 models are exported from `module.half()` with float16 example inputs.

torch and transformers are imported inside the builders, so this module (its model list and
`MODELS` metadata) imports without them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

Size = Literal["full", "small"]
OPSET = 18
EXPORTER = "torch.onnx.export(dynamo=True)"
DTYPES = ("float32", "float16")

# Example sizes for tracing. torch.export specializes dims of size 0 and 1 and merges equal
# dynamic sizes, so batch and sequence get distinct values above 1.
_EXAMPLE_BATCH, _EXAMPLE_SEQ = 2, 16
# Default concrete shapes: benchmarks (full) and tests (small).
_BENCH = {"full": {"batch": 8, "sequence": 128}, "small": {"batch": 2, "sequence": 16}}


@dataclass
class Built:
    """A model ready to export. `dynamic_dims` maps an input name to {axis: dim name};
    `shapes` gives each input's default concrete shape; `int_ranges` the valid [low, high)
    of integer inputs (token ids must index the vocabulary, masks are 0/1)."""

    module: Any  # torch.nn.Module
    inputs: tuple[Any, ...]  # torch.Tensor examples, one per input name
    input_names: tuple[str, ...]
    dynamic_dims: dict[str, dict[int, str]]
    output_names: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportInfo:
    """What `export_info` wrote: the file and the facts a manifest records about it."""

    name: str
    dtype: str
    size: str
    path: Path
    bytes: int
    seconds: float
    nodes: int
    inputs: tuple[dict[str, Any], ...]
    outputs: tuple[str, ...]

    def manifest_entry(self, root: Path | None = None) -> dict[str, Any]:
        """JSON-ready manifest entry; `path` relative to `root` when given."""
        path = self.path.relative_to(root) if root is not None else self.path
        return {"name": self.name, "dtype": self.dtype, "size": self.size, "path": str(path),
                "bytes": self.bytes, "export_seconds": round(self.seconds, 2), "nodes": self.nodes,
                "opset": OPSET, "exporter": EXPORTER, "inputs": list(self.inputs), "outputs": list(self.outputs)}


# ---------------------------------------------------------------- helpers


def _text_inputs(names: Sequence[str], vocab: int) -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for n in names:
        if n == "input_ids":
            out.append(torch.randint(0, vocab, (_EXAMPLE_BATCH, _EXAMPLE_SEQ), generator=g))
        else:  # attention_mask / token_type_ids: tracing is data-independent; ones are valid for both
            out.append(torch.ones(_EXAMPLE_BATCH, _EXAMPLE_SEQ, dtype=torch.int64))
    return tuple(out)


def _text(module: Any, names: Sequence[str], outputs: Sequence[str], vocab: int, size: Size,
          type_vocab: int = 2) -> Built:
    """A text model over [batch, sequence] int64 inputs."""
    bench = _BENCH[size]
    shape = (bench["batch"], bench["sequence"])
    ranges = {"input_ids": (0, vocab), "attention_mask": (0, 2), "token_type_ids": (0, type_vocab)}
    return Built(module.eval(), _text_inputs(names, vocab), tuple(names),
                 {n: {0: "batch", 1: "sequence"} for n in names}, tuple(outputs),
                 {n: shape for n in names}, {n: ranges[n] for n in names})


def _vision(module: Any, image: int, outputs: Sequence[str], size: Size) -> Built:
    """A vision model over one [batch, 3, image, image] float input named pixel_values."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(_EXAMPLE_BATCH, 3, image, image, generator=g)
    return Built(module.eval(), (x,), ("pixel_values",), {"pixel_values": {0: "batch"}}, tuple(outputs),
                 {"pixel_values": (_BENCH[size]["batch"], 3, image, image)})


def _calibrated(built: Built) -> Built:
    """`built` with its BatchNorm statistics set from a batch of random images (see
    blocks.calibrate_batchnorm): keeps activations of random-weight conv nets in range."""
    import torch

    from .blocks import calibrate_batchnorm

    x = built.inputs[0]
    calibrate_batchnorm(built.module, torch.randn(4, *x.shape[1:], generator=torch.Generator().manual_seed(1)))
    return built


def _eager(cfg: Any) -> Any:
    """Eager attention: the export is plain MatMul/Softmax ops, not an SDPA decomposition
    whose shape depends on the torch version."""
    cfg._attn_implementation = "eager"
    return cfg


# ---------------------------------------------------------------- builders


def bert_base(size: Size = "full") -> Built:
    """BERT-base (12 layers, hidden 768, 12 heads) as transformers' BertModel."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig() if size == "full" else BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64)
    names = ("input_ids", "attention_mask", "token_type_ids")
    return _text(BertModel(_eager(cfg)), names, ("last_hidden_state", "pooler_output"), cfg.vocab_size, size,
                 cfg.type_vocab_size)


def gpt2(size: Size = "full") -> Built:
    """GPT-2 small (12 layers, hidden 768) as transformers' GPT2Model, without a KV cache."""
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(use_cache=False) if size == "full" else GPT2Config(
        vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False,
        bos_token_id=127, eos_token_id=127)
    return _text(GPT2Model(_eager(cfg)), ("input_ids", "attention_mask"), ("last_hidden_state",),
                 cfg.vocab_size, size)


def gpt2_block(size: Size = "full") -> Built:
    """One GPT-2 small layer (hidden 768, 12 heads) with a 2048-token vocabulary, as GPT2Model
    with n_layer=1: small enough to carry to a GPU machine, the layer as the full model has it."""
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_layer=1, vocab_size=2048, use_cache=False, bos_token_id=2047, eos_token_id=2047) \
        if size == "full" else GPT2Config(vocab_size=128, n_embd=48, n_layer=1, n_head=3, n_positions=64,
                                          use_cache=False, bos_token_id=127, eos_token_id=127)
    return _text(GPT2Model(_eager(cfg)), ("input_ids", "attention_mask"), ("last_hidden_state",),
                 cfg.vocab_size, size)


def t5_small_encoder(size: Size = "full") -> Built:
    """The T5-small encoder (6 layers, d_model 512, RMSNorm, relative position bias) as
    transformers' T5EncoderModel."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(use_cache=False) if size == "full" else T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, use_cache=False)
    return _text(T5EncoderModel(_eager(cfg)), ("input_ids", "attention_mask"), ("last_hidden_state",),
                 cfg.vocab_size, size)


def llama_block(size: Size = "full") -> Built:
    """One LLaMA decoder layer (LLaMA-2-7B dims: hidden 4096, SiLU-gated MLP 11008, 32 heads,
    RMSNorm, rotary embedding) with its token embedding and final norm, as LlamaModel with
    num_hidden_layers=1. The small variant uses grouped-query attention (4 heads, 2 KV)."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(num_hidden_layers=1, use_cache=False) if size == "full" else LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return _text(LlamaModel(_eager(cfg)), ("input_ids", "attention_mask"), ("last_hidden_state",),
                 cfg.vocab_size, size)


def llama_layer(size: Size = "full") -> Built:
    """One LLaMA decoder layer at a width that can be carried to a GPU machine (hidden 1024, 8
    heads of 128 as LLaMA-2-7B's, SiLU-gated MLP 2048, vocabulary 2048; 50 MB in float32): the
    rotary embedding, RMSNorm and gated MLP at their real head size. The small variant keeps
    full multi-head attention (2 heads of 32)."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=2048, hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=8, use_cache=False) if size == "full" else LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return _text(LlamaModel(_eager(cfg)), ("input_ids", "attention_mask"), ("last_hidden_state",),
                 cfg.vocab_size, size)


def vit_b16(size: Size = "full") -> Built:
    """ViT-B/16 at 224×224 as transformers' ViTModel (with pooler)."""
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig() if size == "full" else ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8)
    return _vision(ViTModel(_eager(cfg)), cfg.image_size, ("last_hidden_state", "pooler_output"), size)


def resnet50(size: Size = "full") -> Built:
    """ResNet-50 (bottleneck blocks, depths 3-4-6-3) as transformers' ResNetModel."""
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig() if size == "full" else ResNetConfig(
        embedding_size=8, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
    return _vision(ResNetModel(cfg), 224 if size == "full" else 64, ("last_hidden_state", "pooler_output"), size)


def convnext_tiny(size: Size = "full") -> Built:
    """ConvNeXt-Tiny (depths 3-3-9-3, widths 96…768) as transformers' ConvNextModel."""
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig() if size == "full" else ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])
    return _vision(ConvNextModel(cfg), 224 if size == "full" else 64, ("last_hidden_state", "pooler_output"), size)


def mobilenet_v3_large(size: Size = "full") -> Built:
    """MobileNetV3-Large (the paper's Table 1: hard-swish, squeeze-excite, inverted
    residuals), hand-written in models/blocks.py; transformers has no V3."""
    from .blocks import MobileNetV3

    m = MobileNetV3() if size == "full" else MobileNetV3(width=0.125, num_classes=10, last_channel=64)
    return _calibrated(_vision(m, 224 if size == "full" else 64, ("logits",), size))


def yolo(size: Size = "full") -> Built:
    """A YOLOv8-style detector (Conv-BN-SiLU, C2f, SPPF, anchor-free head with DFL decode)
    at the 's' size on 640×640, hand-written in models/blocks.py."""
    from .blocks import YoloNet, init_bias_prior

    m = YoloNet(width=0.5, depth=0.33) if size == "full" else YoloNet(
        width=0.0625, depth=0.33, num_classes=4, max_channels=512, reg_max=4)
    init_bias_prior(m)
    return _calibrated(_vision(m, 640 if size == "full" else 64, ("detections",), size))


def unet_stage(size: Size = "full") -> Built:
    """A stage of a latent-diffusion UNet at Stable Diffusion's first width (320 channels,
    32 groups) on a 64×64 latent, hand-written in models/blocks.py: GroupNorm + SiLU ResNet
    blocks and spatial self-attention."""
    from .blocks import UNetStage

    m = UNetStage() if size == "full" else UNetStage(width=16, groups=4)
    return _vision(m, 64 if size == "full" else 16, ("sample",), size)


# name -> builder; names are file stems.
MODELS: dict[str, Callable[[Size], Built]] = {
    "bert-base": bert_base,
    "gpt2": gpt2,
    "gpt2-block": gpt2_block,
    "t5-small-encoder": t5_small_encoder,
    "vit-b16": vit_b16,
    "resnet50": resnet50,
    "convnext-tiny": convnext_tiny,
    "mobilenetv3-large": mobilenet_v3_large,
    "llama-block": llama_block,
    "llama-layer": llama_layer,
    "yolo": yolo,
    "unet-stage": unet_stage,
}


def build(name: str, size: Size = "full") -> Built:
    """The `Built` of zoo model `name`."""
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
    import torch

    # Seeded weights: the same name and size always export the same model.
    torch.manual_seed(0)
    return MODELS[name](size)


# ---------------------------------------------------------------- export


def _dynamic_shapes(built: Built) -> dict[str, dict[int, Any]]:
    import torch

    dims: dict[str, Any] = {}
    out: dict[str, dict[int, Any]] = {}
    for name in built.input_names:
        axes = built.dynamic_dims.get(name, {})
        out[name] = {ax: dims.setdefault(d, torch.export.Dim(d)) for ax, d in axes.items()}
    return out


# Per-node metadata the exporter writes that names files of the exporting machine (stack
# traces, FX node dumps): dropped so builds on two machines give the same file, and small
# models stay small. The module namespace stays: it says which layer a node came from.
_MACHINE_METADATA = frozenset({"pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node"})


def _strip_machine_metadata(model: Any) -> bool:
    """Remove _MACHINE_METADATA from every node of the main graph; True if any was removed."""
    changed = False
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key not in _MACHINE_METADATA]
        if len(keep) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
            changed = True
    return changed


def _input_entries(model: Any, built: Built) -> tuple[dict[str, Any], ...]:
    """Manifest entries of the graph inputs, read back from the ONNX file (dims as the
    exporter wrote them), checked against the declared dynamic dims."""
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    entries = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims: list[int | str] = [d.dim_param if d.dim_param else int(d.dim_value)
                                 for d in vi.type.tensor_type.shape.dim]
        want = built.dynamic_dims.get(vi.name, {})
        got = {i: d for i, d in enumerate(dims) if isinstance(d, str)}
        if got != want:  # the exporter named or specialized a dim differently than declared
            raise RuntimeError(f"{vi.name}: exported symbolic dims {got}, expected {want}")
        entry: dict[str, Any] = {"name": vi.name,
                                 "dtype": helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name,
                                 "dims": dims, "shape": list(built.shapes[vi.name])}
        if vi.name in built.int_ranges:
            entry["int_range"] = list(built.int_ranges[vi.name])
        entries.append(entry)
    return tuple(entries)


def export_info(name: str, dtype: str = "float32", out_dir: str | Path = "build/zoo", size: Size = "full",
                opset: int = OPSET) -> ExportInfo:
    """Build zoo model `name` at `dtype` ("float32" or "float16") and export it to
    `<out_dir>/<name>-<dtype>.onnx` (one file, weights inside); returns what was written."""
    import logging
    import warnings

    import onnx
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{dtype}.onnx"
    t0 = time.perf_counter()
    with torch.no_grad():
        built = build(name, size)
        tdtype = torch.float16 if dtype == "float16" else torch.float32
        module = built.module.to(tdtype)
        inputs = tuple(x.to(tdtype) if x.is_floating_point() else x for x in built.inputs)
        kwargs = dict(zip(built.input_names, inputs))
        # The exporter's progress lines and warnings about torchvision ops are noise here.
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (), str(path), kwargs=kwargs, dynamo=True, opset_version=opset,
                              dynamic_shapes=_dynamic_shapes(built), output_names=list(built.output_names),
                              external_data=False, verbose=False)
    model = onnx.load(str(path))
    if _strip_machine_metadata(model):
        onnx.save(model, str(path))
    seconds = time.perf_counter() - t0
    entries = _input_entries(model, built)
    outputs = tuple(o.name for o in model.graph.output)
    return ExportInfo(name, dtype, size, path, path.stat().st_size, seconds, len(model.graph.node), entries, outputs)


def export(name: str, dtype: str = "float32", out_dir: str | Path = "build/zoo", size: Size = "full") -> Path:
    """Export zoo model `name` at `dtype` to `<out_dir>/<name>-<dtype>.onnx`; returns the path."""
    return export_info(name, dtype, out_dir, size).path


# ---------------------------------------------------------------- feeding a manifest entry


def feeds(entry: Mapping[str, Any], seed: int = 0, shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Seeded random inputs for a manifest entry: floats standard normal, integer inputs drawn
    in their valid range (token ids within the vocabulary, masks 0/1). `shapes` overrides the
    entry's default shape per input. Needs only numpy."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for inp in entry["inputs"]:
        shape = tuple((shapes or {}).get(inp["name"], inp["shape"]))
        dt = np.dtype(inp["dtype"])
        if "int_range" in inp:
            lo, hi = inp["int_range"]
            out[inp["name"]] = rng.integers(lo, hi, size=shape).astype(dt)
        else:
            out[inp["name"]] = rng.standard_normal(shape).astype(dt)
    return out
