#!/usr/bin/env bash
# Timelines of corpus models on the GPU machine, in one call (scripts/gpu_timeline.py): stock ORT
# against the stitched model, plain and with CUDA graphs. Carry build/corpusc and .carry.
#   there: bash scripts/gpu_timeline.sh NAME...        (results in $OUT/timeline/)
set -uo pipefail
source scripts/gpu_env.sh
gpu_setup "$OUT/setup.log" >/dev/null
corpus=/tmp/corpus
mkdir -p "$corpus"
cp build/corpusc/manifest.json "$corpus/"
for name in "$@"; do
  [ -f "$corpus/$name.onnx" ] || python3 scripts/carry_weights.py fill "build/corpusc/$name.onnx" "$corpus" >/dev/null
done
python3 scripts/gpu_timeline.py --corpus "$corpus" --out "$OUT/timeline" "$@" 2>&1 | tee "$OUT/timeline.log" \
  | grep -v "^\s*$" | head -400
rm -f "$OUT"/timeline/*.onnx "$OUT"/timeline/*.data
