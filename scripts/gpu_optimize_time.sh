#!/usr/bin/env bash
# Cold optimize time of BERT-base (batch 8, sequence 128) on the GPU machine: a bare kernel
# cache, stage times from -v. Carry build/bertc (scripts/carry_weights.py strip) and .carry.
#   there: bash scripts/gpu_optimize_time.sh            (log in $OUT/optimize_time.log)
set -uo pipefail
source scripts/gpu_env.sh
gpu_setup "$OUT/setup.log" >/dev/null
export ONNXSTITCH_CACHE=/tmp/onnxstitch-cold-$$
python3 scripts/carry_weights.py fill build/bertc/bert-base-float32.onnx /tmp/zoo >/dev/null
for run in cold warm; do
  echo "== $run"
  /usr/bin/time -v python3 -m onnxstitch.cli optimize /tmp/zoo/bert-base-float32.onnx --shape batch=8 \
    --shape sequence=128 -q -o /tmp/zoo/bert.stitched.onnx --report /tmp/zoo/report.json 2>&1 \
    | grep -E "Maximum resident|Elapsed"
  python3 -c "import json; r = json.load(open('/tmp/zoo/report.json')); s = r['stage_seconds']
print('stages', round(sum(s.values()), 2), 's:', {k: round(v, 2) for k, v in s.items()})"
done 2>&1 | tee "$OUT/optimize_time.log"
