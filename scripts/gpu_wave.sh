#!/usr/bin/env bash
# The third wave's GPU checks, one part per call (each well inside a call's 10 minutes); logs and
# JSON under $OUT, packed into $OUT/<part>.tgz. Expects the staged packages in /tmp/site
# (../shared/gpu/stage.sh), the library built here in .carry/ and, per part:
#   bert     carry build/bertc (BERT-base without weights) and build/unseenc: bench --cuda-graph on a
#            TorchScript BERT (stock cannot capture it: both rows), BERT-base optimize cold and
#            warm with the gate (time, peak RSS, measured costs), its speed plain and in graphs
#   unseen   carry build/unseenc: corpus_report --gpu over the models nobody here wrote
#            (MODELS=a,b to choose), default flags: measured costs, the gate, GPU verification
#   ab       the same (MODELS) with the gate and with --no-gate, one after the other
#   tests    the gpu-marked tests of the files named in TESTS (default the measure/verify ones)
# Usage there: bash scripts/gpu_wave.sh PART
set -uo pipefail
source scripts/gpu_env.sh
part=${1:?part: bert, unseen or tests}
log="$OUT/$part.log"
gpu_setup "$OUT/setup.log" >/dev/null
fill() {  # fill DIR_FROM DIR_TO: every stripped model of a folder, given seeded weights
  mkdir -p "$2"
  for m in "$1"/*.onnx; do python3 scripts/carry_weights.py fill "$m" "$2/" >/dev/null || echo "fill failed: $m"; done
  cp "$1"/manifest.json "$2/" 2>/dev/null || true
}
case "$part" in
  bert)
    fill build/unseenc /tmp/unseen
    {
      echo "== bench --cuda-graph, TorchScript BERT (corpus widths)"
      python3 -m onnxstitch.cli optimize /tmp/unseen/bert-ts.onnx -o /tmp/bert-ts.stitched.onnx \
        --shape batch=8,sequence=128 -q
      python3 -m onnxstitch.cli bench /tmp/unseen/bert-ts.onnx --stitched /tmp/bert-ts.stitched.onnx \
        --shape batch=8,sequence=128 --cuda-graph --json -q > "$OUT/bench-bert-ts-graphs.json"
      python3 -m onnxstitch.cli bench /tmp/unseen/bert-ts.onnx --stitched /tmp/bert-ts.stitched.onnx \
        --shape batch=8,sequence=128 --cuda-graph
    } 2>&1 | tee "$log"
    bash scripts/gpu_optimize_time.sh 2>&1 | tee -a "$log"
    cp /tmp/zoo/report.json "$OUT/bert-report.json" 2>/dev/null
    for g in "" --cuda-graph; do
      python3 -m onnxstitch.cli bench /tmp/zoo/bert-base-float32.onnx --stitched /tmp/zoo/bert.stitched.onnx \
        --shape batch=8,sequence=128 $g 2>&1 | tee -a "$log"
    done
    ;;
  unseen)
    fill build/unseenc /tmp/unseen
    python3 scripts/corpus_report.py --gpu --corpus /tmp/unseen --out "$OUT/unseen" --timeout 400 \
      ${MODELS:+--models "$MODELS"} 2>&1 | tee "$log"
    ;;
  ab)  # the same models with the gate and without it (--no-gate), same machine, same run
    fill build/unseenc /tmp/unseen
    for flag in "" --no-gate; do
      python3 scripts/corpus_report.py --gpu --corpus /tmp/unseen --out "$OUT/ab${flag:+-nogate}" --timeout 400 \
        ${MODELS:+--models "$MODELS"} $flag 2>&1 | tee -a "$log"
    done
    ;;
  quick)  # BERT-base optimize cold and warm, then MODELS through corpus_report (default flags)
    bash scripts/gpu_optimize_time.sh 2>&1 | tee "$log"
    fill build/unseenc /tmp/unseen
    python3 scripts/corpus_report.py --gpu --corpus /tmp/unseen --out "$OUT/quick" --timeout 400 \
      ${MODELS:+--models "$MODELS"} 2>&1 | tee -a "$log"
    ;;
  tests)
    python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore ${TESTS:-tests/gpu/test_stitched_gpu.py} 2>&1 \
      | tee "$log" | tail -30
    ;;
esac
tar czf "$OUT/$part.tgz" -C "$OUT" --exclude='*.tgz' . 2>/dev/null
