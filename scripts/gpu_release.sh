#!/usr/bin/env bash
# On the GPU machine: the checks a change to the runtime or the kernels needs before it lands,
# in parts that each fit one call (logs under $OUT; carry .carry, and build/bertc for bert):
#   bash scripts/gpu_release.sh tests      every `gpu` test (8 workers)
#   bash scripts/gpu_release.sh sanitize   compute-sanitizer racecheck and memcheck on the rows
#                                          and attention kernels
#   bash scripts/gpu_release.sh bert       BERT-base float32 b8 s128, stock vs stitched, CUDA graphs
# Parts run in the order given: `bash scripts/gpu_release.sh tests bert`.
set -uo pipefail
source scripts/gpu_env.sh
log="$OUT/gpu_release.log"
gpu_setup "$OUT/setup.log" > /dev/null
status=0
for part in "$@"; do
  case "$part" in
    tests)
      python3 -m pytest -p no:cacheprovider -m gpu tests -q -W ignore -n 8 --junitxml="$OUT/gpu_tests.xml" \
        > "$OUT/gpu_tests.log" 2>&1 || status=1
      echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")" | tee -a "$log" ;;
    sanitize)
      for what in "" attention; do
        for tool in racecheck memcheck; do
          name="sanitizer-${what:-rows}-$tool"
          timeout 240 compute-sanitizer --tool $tool --target-processes all python3 scripts/sanitize_rows.py $what \
            > "$OUT/$name.log" 2>&1
          echo "$name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tail -1)" | tee -a "$log"
        done
      done ;;
    bert)
      python3 scripts/carry_weights.py fill build/bertc/bert-base-float32.onnx /tmp/zoo > /dev/null
      python3 -m onnxstitch.cli bench /tmp/zoo/bert-base-float32.onnx --shape batch=8,sequence=128 --cuda-graph \
        --json > "$OUT/bert_graphs.json" 2> "$OUT/bert_graphs.err" || status=1
      python3 - "$OUT/bert_graphs.json" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
ms = {k: round(v["median_ms"], 3) for k, v in r["configs"].items()}
print(f"bert-base f32 b8 s128, CUDA graphs, {r.get('device', '?')}: {ms} speedup {r['speedup']:.2f}x")
PY
      ;;
    *) echo "unknown part '$part' (tests, sanitize, bert)" >&2; status=2 ;;
  esac
done
exit "$status"
