#!/usr/bin/env bash
# On the GPU machine, in one call: the attention kernels' GPU tests (float32, float16, bfloat16),
# compute-sanitizer on them (float32 and float16 kernels), the kernel variants and cores end to
# end (scripts/bench_attention.py, float32 and half cases) and BERT-base with and without
# attention kernels, plain and with CUDA graphs (scripts/bench_bert.sh, same run), float32 and
# float16 by default. Setup as scripts/gpu_check.sh (staged packages in /tmp/site,
# .carry/libonnxstitch_ops.so; carry build/bertc for BERT). The GPU machine has no torch: where
# no float16 BERT was carried, the float32 one (weights filled) is converted by ONNX Runtime's
# converter (scripts/half_model.py). Everything goes to $OUT.
#   [PARTS=tests,sanitize,bench,bert] bash scripts/gpu_attention.sh [BERT dtypes, default float32,float16; none: no BERT] [bench_bert.sh variants, default reductions,noattention]
# (PARTS picks what runs, all by default; within the device's 10 minutes a call, split it:
#  PARTS=tests,sanitize then PARTS=bench,bert on the same warm machine.)
set -uo pipefail
parts=",${PARTS:-tests,sanitize,bench,bert},"
source scripts/gpu_env.sh
log="$OUT/gpu_attention.log"
gpu_setup "$log"
status=0
if [[ $parts == *,tests,* ]]; then
  python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore tests/gpu/test_attention_gpu.py \
    --junitxml="$OUT/attention_tests.xml" 2>&1 | tee -a "$log" | tail -25
  status=${PIPESTATUS[0]}
fi
if [[ $parts == *,sanitize,* ]] && command -v compute-sanitizer >/dev/null; then
  for tool in racecheck memcheck; do
    timeout 300 compute-sanitizer --tool $tool --target-processes all \
      python3 scripts/sanitize_rows.py attention > "$OUT/sanitizer-attention-$tool.log" 2>&1
    echo "compute-sanitizer $tool (attention kernels, float32 and float16): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
      "$OUT/sanitizer-attention-$tool.log" | tail -1)" | tee -a "$log"
  done
fi
[[ $parts == *,bench,* ]] && python3 scripts/bench_attention.py --out "$OUT/bench_attention.json" 2>&1 | tee -a "$log"
dtypes=${1:-float32,float16}
if [[ $parts == *,bert,* ]] && [ "$dtypes" != none ]; then
  if [[ ",$dtypes," == *,float16,* ]] && [ ! -f /tmp/zoo/bert-base-float16.onnx ] && [ ! -f build/bertc/bert-base-float16.onnx ]; then
    mkdir -p /tmp/zoo
    [ -f /tmp/zoo/bert-base-float32.onnx ] || \
      python3 scripts/carry_weights.py fill build/bertc/bert-base-float32.onnx /tmp/zoo 2>&1 | tee -a "$log"
    python3 scripts/half_model.py /tmp/zoo/bert-base-float32.onnx /tmp/zoo/bert-base-float16.onnx 2>&1 | tee -a "$log"
  fi
  BERT_NCU=${BERT_NCU:-0} bash scripts/bench_bert.sh "$dtypes" "${2:-reductions,noattention}" 2>&1 | tee -a "$log"
fi
exit "$status"
