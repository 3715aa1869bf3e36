#!/usr/bin/env python3
"""Export a Qwen2-0.5B-size decoder (24 layers, hidden 896, 14 query and 2 KV heads, float32,
random weights: about 2 GB) with torch.onnx's dynamo exporter, weights as external data: the
model optimize must handle within the 24 GB of the CPU machine (issue 19).

    python scripts/build_decoder.py --out build/qwen2-0.5b          # needs torch, transformers
    /usr/bin/time -v onnxstitch optimize build/qwen2-0.5b/qwen2-0.5b.onnx --shape batch=1,sequence=128

`--layers` makes a shallower one of the same width (for a quick try).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    """Build the model; prints its size and export time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/qwen2-0.5b"))
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=args.layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16))
    mask = torch.ones_like(ids)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "qwen2-0.5b.onnx"
    t0 = time.perf_counter()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with torch.no_grad():
        program = torch.onnx.export(model, (ids, mask), input_names=["input_ids", "attention_mask"],
                                    output_names=["logits"], dynamo=True, external_data=True,
                                    dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
        program.save(str(path), external_data=True)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    params = sum(p.numel() for p in model.parameters())
    print(f"{path}: {params / 1e6:.0f} M parameters, {size / 1e9:.2f} GB on disk, exported in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
