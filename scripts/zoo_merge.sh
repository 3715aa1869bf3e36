#!/usr/bin/env bash
# On the GPU machine: zoo models stitched with the defaults and with one stage turned off
# (default --no-merge-matmuls; --no-attention for the attention kernels), each against stock ORT
# in the same run. Models are carried without their weights (scripts/carry_weights.py strip →
# build/zoo2c, with a manifest.json).
#   bash scripts/zoo_merge.sh float32 [models] [--no-attention]   (carry .carry build/zoo2c; staged packages)
set -uo pipefail
TOP=${OUT:-/tmp/onnxstitch-out}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export ONNXSTITCH_LIBRARY=${ONNXSTITCH_LIBRARY:-$PWD/.carry/libonnxstitch_ops.so}
export ONNXSTITCH_CACHE=${ONNXSTITCH_CACHE:-/tmp/onnxstitch-cache}
dtypes=${1:-float32}
models=${2:-vit-b16,t5-small-encoder,llama-layer}
off=${3:---no-merge-matmuls}
zoo=/tmp/zoo2
mkdir -p "$zoo"
cp build/zoo2c/manifest.json "$zoo/"
for f in build/zoo2c/*.onnx; do
  [ -f "$zoo/$(basename "$f")" ] || python3 scripts/carry_weights.py fill "$f" "$zoo" > /dev/null
done
for variant in on off; do
  flag=(); [ $variant = off ] && flag=("$off")
  python3 scripts/zoo_report.py --zoo "$zoo" --models "$models" --dtypes "$dtypes" --iters 50 \
    --out "$TOP/zoo-$variant" "${flag[@]}" > "$TOP/zoo-$variant-$dtypes.log" 2>&1
  grep -E "^\|" "$TOP/zoo-$variant-$dtypes.log" | sed "s/^/$variant /"
done
