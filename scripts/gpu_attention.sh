#!/usr/bin/env bash
# On the GPU machine, in one call: the attention kernels' GPU tests, compute-sanitizer on them,
# the kernel variants and cores end to end (scripts/bench_attention.py) and
# BERT-base float32 with and without attention kernels (scripts/bench_bert.sh, same run).
# Setup as scripts/gpu_check.sh (staged packages in /tmp/site, .carry/libonnxstitch_ops.so;
# carry build/bertc for BERT). Everything goes to $OUT.
#   bash scripts/gpu_attention.sh [BERT dtypes, default float32; none: no BERT] [bench_bert.sh variants, default reductions,noattention]
set -uo pipefail
source scripts/gpu_env.sh
log="$OUT/gpu_attention.log"
gpu_setup "$log"
python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore tests/gpu/test_attention_gpu.py \
  --junitxml="$OUT/attention_tests.xml" 2>&1 | tee -a "$log" | tail -15
status=${PIPESTATUS[0]}
if command -v compute-sanitizer >/dev/null; then
  for tool in racecheck memcheck; do
    timeout 200 compute-sanitizer --tool $tool --target-processes all \
      python3 scripts/sanitize_rows.py attention > "$OUT/sanitizer-attention-$tool.log" 2>&1
    echo "compute-sanitizer $tool (attention kernels): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$OUT/sanitizer-attention-$tool.log" | tail -1)" | tee -a "$log"
  done
fi
python3 scripts/bench_attention.py --out "$OUT/bench_attention.json" 2>&1 | tee -a "$log"
[ "${1:-float32}" = none ] || BERT_NCU=${BERT_NCU:-0} bash scripts/bench_bert.sh "${1:-float32}" "${2:-reductions,noattention}" 2>&1 | tee -a "$log"
exit "$status"
