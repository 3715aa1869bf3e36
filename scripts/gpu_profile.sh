#!/usr/bin/env bash
# Where BERT-base's time goes on the GPU machine (batch 8, sequence 128): `onnxstitch bench
# --profile`, ORT's profile of stock ORT and of the stitched model side by side (top op types,
# and GPU kernels where this ORT build records them), plain and with --cuda-graph (profiled
# without graphs, as the note says), and the same as JSON. Optimizes once, benches that model.
# Carry build/bertc (scripts/carry_weights.py strip) and .carry.
#   there: bash scripts/gpu_profile.sh     (in $OUT: bert_profile.txt, bert_profile_graphs.txt,
#                                           bert_profile.json, optimize.log)
set -uo pipefail
source scripts/gpu_env.sh
gpu_setup "$OUT/setup.log" >/dev/null
export COLUMNS=${COLUMNS:-160}  # rich's width off a terminal: room for the side-by-side tables
python3 scripts/carry_weights.py fill build/bertc/bert-base-float32.onnx /tmp/zoo >/dev/null
model=/tmp/zoo/bert-base-float32.onnx
stitched=/tmp/zoo/bert.stitched.onnx
shape=batch=8,sequence=128
python3 -m onnxstitch.cli optimize "$model" --shape "$shape" -o "$stitched" 2>&1 | tee "$OUT/optimize.log" | tail -25
bench() { python3 -m onnxstitch.cli bench "$model" --stitched "$stitched" --shape "$shape" --profile "$@"; }
bench 2>&1 | tee "$OUT/bert_profile.txt"
bench --cuda-graph 2>&1 | tee "$OUT/bert_profile_graphs.txt"
bench --json -q >"$OUT/bert_profile.json" 2>"$OUT/bert_profile.json.err"
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('json: schema', d['schema'], 'speedup',
round(d['speedup'], 3), {k: (p['node_us_per_run'], p['nodes_per_run'], p['kernels_per_run']) for k, p in d['profiles'].items()})" \
  "$OUT/bert_profile.json" || cat "$OUT/bert_profile.json.err"
