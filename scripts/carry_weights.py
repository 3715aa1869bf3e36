"""Move a model too big for the GPU machine's upload limit without its weights, and give it
seeded random weights there. Timing does not depend on the weights' values, and the zoo's
models are randomly initialised anyway.

  here:   python3 scripts/carry_weights.py strip build/zoo/bert-base-float32.onnx build/bert/
  there:  python3 scripts/carry_weights.py fill build/bert/bert-base-float32.onnx /tmp/zoo/

`strip` keeps every tensor under 4096 elements and every one neither float nor 8-bit integer
(position ids, shapes) as it is and marks the large ones as external data in a file that does not travel;
`fill` replaces those with normal(0, 0.02) values (BERT's initialiser range) from a fixed seed,
quantized ones with small integers about the usual zero points.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

FLOATS = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: None,
          TensorProto.DOUBLE: np.float64}
# Quantized models' weights (int8/uint8, dynamically or statically quantized): large, and their
# values matter no more for timing than floats' do.
INTS = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8}
MISSING = "weights-not-carried.bin"
KEEP_BELOW = 4096


def _tensors(model: onnx.ModelProto):
    yield from model.graph.initializer
    for n in model.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t


def strip(src: Path, dst_dir: Path) -> None:
    model = onnx.load(str(src))
    dropped = 0
    kinds = {**FLOATS, **INTS}
    for t in _tensors(model):
        if kinds.get(t.data_type) is not None and int(np.prod(t.dims)) >= KEEP_BELOW:
            size = int(np.prod(t.dims)) * np.dtype(kinds[t.data_type]).itemsize
            for field in ("raw_data", "float_data", "int32_data", "double_data"):
                t.ClearField(field)
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in (("location", MISSING), ("offset", "0"), ("length", str(size))):
                e = t.external_data.add()
                e.key, e.value = k, v
            dropped += size
    dst_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst_dir / src.name))
    manifest = src.parent / "manifest.json"
    if manifest.exists():
        shutil.copy(manifest, dst_dir / "manifest.json")
    print(f"{dst_dir / src.name}: {dropped / 1e6:.0f} MB of weights left behind")


def fill(src: Path, dst_dir: Path, seed: int) -> None:
    model = onnx.load(str(src), load_external_data=False)
    rng = np.random.default_rng(seed)
    filled = 0
    for t in _tensors(model):
        if t.data_location == TensorProto.EXTERNAL:
            if t.data_type in INTS:  # a quantized weight: small integers about its zero point
                value = rng.integers(-8, 8, tuple(t.dims)).astype(INTS[t.data_type]) if t.data_type == TensorProto.INT8 \
                    else rng.integers(120, 136, tuple(t.dims)).astype(np.uint8)
            else:
                value = (rng.standard_normal(tuple(t.dims)) * 0.02).astype(FLOATS[t.data_type])
            t.CopyFrom(numpy_helper.from_array(value, t.name))
            filled += value.nbytes
    dst_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst_dir / src.name))
    manifest = src.parent / "manifest.json"
    if manifest.exists() and not (dst_dir / "manifest.json").exists():
        shutil.copy(manifest, dst_dir / "manifest.json")
    print(f"{dst_dir / src.name}: {filled / 1e6:.0f} MB of weights drawn (seed {seed})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("strip")
    s.add_argument("model", type=Path)
    s.add_argument("out_dir", type=Path)
    f = sub.add_parser("fill")
    f.add_argument("model", type=Path)
    f.add_argument("out_dir", type=Path)
    f.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "strip":
        strip(a.model, a.out_dir)
    else:
        fill(a.model, a.out_dir, a.seed)


if __name__ == "__main__":
    main()
