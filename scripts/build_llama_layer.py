#!/usr/bin/env python3
"""Export LLaMA-style decoder steps (issue 22's targets) with both torch.onnx exporters, in
float16, into a corpus folder with a manifest.json that scripts/corpus_report.py reads:

    python scripts/build_llama_layer.py --out build/llama          # needs torch, transformers
    for f in build/llama/*.onnx; do python scripts/carry_weights.py strip $f build/llamac; done
    cp build/llama/manifest.json build/llamac/
    there: CORPUS=build/llamac bash scripts/gpu_corpus.sh         (times stock against stitched)

The model is transformers' LlamaForCausalLM with one decoder layer of TinyLlama-1.1B's widths
(hidden 2048, 32 query heads and 4 KV heads of 64, MLP 5632, RoPE) and a 1024-token vocabulary,
so that the layer, not the embedding or the head, is what is timed; weights random, exported
with `model.half()` (transformers keeps RoPE's angles in float32 and casts cos/sin, as it does
on the GPU). Two files per exporter:
  llama-prefill-*  input_ids and attention_mask, no cache (use_cache=False): planned and timed at
                   batch 4, 512 tokens (the in-graph causal and padding mask as transformers
                   builds it);
  llama-decode-*   input_ids, attention_mask and the layer's past key and value
                   [batch, 4, past, 64]; outputs logits and the present key and value (the
                   cache's Concat). Two manifest entries share it: one new token per sequence
                   against 1024 (llama-decode1k-*) and 4096 (llama-decode4k-*) cached ones.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_corpus  # noqa: E402  (the corpus manifest's schema and entries)

CONFIG = dict(vocab_size=1024, hidden_size=2048, intermediate_size=5632, num_hidden_layers=1,
              num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=8192)
BATCH, PREFILL, PASTS = 4, 512, {"decode1k": 1024, "decode4k": 4096}
EXPORTERS = {"ts": build_corpus.TS_EXPORTER, "dynamo": build_corpus.DYNAMO_EXPORTER}


def _modules() -> tuple[Any, Any, Any]:
    """The model (float16) and the two modules the exporters take: prefill and decode step."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache

    config = LlamaConfig(**CONFIG)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().half()

    class Prefill(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    class Decode(torch.nn.Module):
        """One step with the layer's cache as tensors, as a generation loop feeds it."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key: torch.Tensor,
                    past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            cache = DynamicCache(config=config)
            cache.update(past_key, past_value, 0)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True)
            layer = out.past_key_values.layers[0]
            return out.logits, layer.keys, layer.values

    return config, Prefill(), Decode()


def _export(module: Any, example: tuple[Any, ...], names: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]], dynamo: bool, path: Path) -> None:
    import torch

    with torch.no_grad():
        if not dynamo:
            torch.onnx.export(module, example, str(path), dynamo=False, input_names=names, output_names=outputs,
                              dynamic_axes=axes)
            return
        dims: dict[str, Any] = {}

        def dim(name: str) -> Any:
            # The mask's length is the cache's plus the new tokens': left to torch.export.
            return torch.export.Dim.AUTO if name == "total" else dims.setdefault(name, torch.export.Dim(name))

        shapes = tuple({i: dim(n) for i, n in axes[name].items()} for name in names)
        program = torch.onnx.export(module, example, dynamo=True, input_names=names, output_names=outputs,
                                    dynamic_shapes=shapes)
        program.save(str(path))


def build(out: Path, exporters: list[str]) -> list[dict[str, Any]]:
    """Export the files into `out`; returns their manifest entries."""
    import torch

    config, prefill, decode = _modules()
    head = config.hidden_size // config.num_attention_heads
    # Example sizes for tracing: distinct and above 1 (torch.export specializes 0 and 1).
    b, s, p = 2, 3, 5
    ids = torch.randint(0, config.vocab_size, (b, s))
    past = torch.randn(b, config.num_key_value_heads, p, head, dtype=torch.float16)
    entries = []
    for kind in exporters:
        dynamo = kind == "dynamo"
        t0 = time.perf_counter()
        path = out / f"llama-prefill-{kind}.onnx"
        _export(prefill, (ids, torch.ones(b, s, dtype=torch.int64)), ["input_ids", "attention_mask"], ["logits"],
                {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}},
                dynamo, path)
        spec = build_corpus.Spec(f"llama-prefill-{kind}", "transformers", EXPORTERS[kind], lambda _p: "",
                                 shapes={"input_ids": [BATCH, PREFILL], "attention_mask": [BATCH, PREFILL]},
                                 int_ranges={"input_ids": (0, config.vocab_size), "attention_mask": (1, 2)})
        entries.append(build_corpus.describe(path, spec) | {"origin": f"LlamaForCausalLM {CONFIG}, float16"})
        path = out / f"llama-decode-{kind}.onnx"
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
                "past_key": {0: "batch", 2: "past"}, "past_value": {0: "batch", 2: "past"}}
        _export(decode, (ids, torch.ones(b, p + s, dtype=torch.int64), past, past.clone()),
                list(axes), ["logits", "present_key", "present_value"], axes, dynamo, path)
        for name, n in PASTS.items():
            cache = [BATCH, config.num_key_value_heads, n, head]
            spec = build_corpus.Spec(f"llama-{name}-{kind}", "transformers", EXPORTERS[kind], lambda _p: "",
                                     shapes={"input_ids": [BATCH, 1], "attention_mask": [BATCH, n + 1],
                                             "past_key": cache, "past_value": cache},
                                     int_ranges={"input_ids": (0, config.vocab_size), "attention_mask": (1, 2)})
            entries.append(build_corpus.describe(path, spec) | {"origin": f"LlamaForCausalLM {CONFIG}, float16"})
        print(f"{kind}: exported in {time.perf_counter() - t0:.0f} s", flush=True)
    for e in entries:
        e["slice"] = "full"
    return entries


def main() -> int:
    """Build the files and the manifest."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/llama"))
    ap.add_argument("--exporters", default="ts,dynamo", help="comma-separated: ts, dynamo")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    entries = build(args.out, [e for e in args.exporters.split(",") if e])
    manifest = {"schema": build_corpus.SCHEMA, "versions": build_corpus._versions(), "models": entries, "failed": []}
    (args.out / build_corpus.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for e in entries:
        print(f"{e['name']:<24} {e['file']:<26} {e['bytes'] / 2**20:7.1f} MB {e['nodes']:5} nodes  {e['shapes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
