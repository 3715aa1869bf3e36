#!/usr/bin/env bash
# Timelines of corpus models on the GPU machine, in one call (scripts/gpu_timeline.py): stock ORT
# against the stitched model, plain and with CUDA graphs. Carry build/corpusc and .carry.
#   there: bash scripts/gpu_timeline.sh NAME...        (results in $OUT/timeline/)
# CORPUS=DIR picks another carried folder of the same form (scripts/build_llama_layer.py's) or the
# zoo's (build/zooc: NAME is a file's stem, mobilenetv3-large-float16); EPILOGUES=1 optimizes with
# --epilogues.
set -uo pipefail
source scripts/gpu_env.sh
gpu_setup "$OUT/setup.log" >/dev/null
carried=${CORPUS:-build/corpusc}
corpus=/tmp/$(basename "$carried")
mkdir -p "$corpus"
cp "$carried/manifest.json" "$corpus/"
for name in "$@"; do
  file=$(python3 -c "import json, sys; print(next(e.get('file') or e['path'] for e in json.load(open(sys.argv[1]))['models']
    if sys.argv[2] in (e['name'], (e.get('file') or e['path']).rsplit('.', 1)[0])))" "$carried/manifest.json" "$name")
  [ -f "$corpus/$file" ] || python3 scripts/carry_weights.py fill "$carried/$file" "$corpus" >/dev/null
done
python3 scripts/gpu_timeline.py --corpus "$corpus" --out "$OUT/timeline" ${EPILOGUES:+--epilogues} "$@" 2>&1 | tee "$OUT/timeline.log" \
  | grep -v "^\s*$" | head -400
rm -f "$OUT"/timeline/*.onnx "$OUT"/timeline/*.data
