#!/usr/bin/env bash
# The real-model corpus on the GPU machine, in one call: install onnxstitch, give the carried
# models (stripped of their float weights here, scripts/carry_weights.py) seeded random weights,
# and run scripts/corpus_report.py --gpu over them (optimize with GPU verification, then stock
# ORT CUDA EP against the stitched model, plain and with CUDA graphs). Results in $OUT/corpus/.
#   here:  for f in build/corpus/*.onnx; do python3 scripts/carry_weights.py strip $f build/corpusc; done
#          cp build/corpus/manifest.json build/corpusc/
#   there: bash scripts/gpu_corpus.sh [MODELS]          (carry build/corpusc and .carry)
# CORPUS=DIR picks another carried folder of the same form (scripts/build_llama_layer.py's).
# EPILOGUES=1 optimizes with --epilogues (GEMM and conv epilogues).
# MODELS: comma-separated names (default: every model of the manifest), so that a corpus larger
# than one call's ten minutes can run in several calls.
set -uo pipefail
source scripts/gpu_env.sh
gpu_setup "$OUT/setup.log" >/dev/null
models=${1:-}
carried=${CORPUS:-build/corpusc}
corpus=/tmp/$(basename "$carried")
mkdir -p "$corpus"
cp "$carried/manifest.json" "$corpus/"
for f in "$carried"/*.onnx; do
  name=$(basename "$f" .onnx)
  if [ -z "$models" ] || [[ ",$models," == *",$name,"* ]]; then
    [ -f "$corpus/$name.onnx" ] || python3 scripts/carry_weights.py fill "$f" "$corpus" >/dev/null
  fi
done
python3 scripts/corpus_report.py --corpus "$corpus" --gpu --jobs ${JOBS:-8} --gpus "$(nvidia-smi -L | wc -l)" --timeout 240 --out "$OUT/corpus" \
  ${models:+--models "$models"} ${EPILOGUES:+--epilogues} 2>&1 | tee "$OUT/corpus.log" | tail -60
