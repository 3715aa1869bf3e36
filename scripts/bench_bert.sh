#!/usr/bin/env bash
# On the GPU machine: BERT-base (batch 8, sequence 128; float32 and float16) stock ORT vs
# onnxstitch (elementwise only, --no-reductions, and by default with reductions) vs ORT's
# transformers optimizer, plain
# and with CUDA graphs; per-kernel GPU time under ncu where the machine has it. Everything
# goes to $OUT/bert. Needs the setup of scripts/gpu_check.sh (staged packages, .carry).
# The device tool brings back at most 8 files, so everything is packed into $OUT/bert.tar.gz.
#   [BERT_NCU=0] bash scripts/bench_bert.sh [float32,float16] [elementwise,reductions,nopack,nomerge,noattention]
# (elementwise: --no-reductions; nopack: --no-pack; nomerge: --no-merge-matmuls; noattention:
#  --no-attention; reductions: the defaults)
# The GPU machine has no torch: carry BERT without its weights (carry build/bertc), see below.
set -uo pipefail
TOP=${OUT:-/tmp/onnxstitch-out}
OUT=$TOP/bert
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export ONNXSTITCH_LIBRARY=${ONNXSTITCH_LIBRARY:-$PWD/.carry/libonnxstitch_ops.so}
export ONNXSTITCH_CACHE=${ONNXSTITCH_CACHE:-/tmp/onnxstitch-cache}
# The package must be installed for its entry point (an editable install is enough).
python3 -c "import onnxstitch.cli" 2>/dev/null || \
  python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . 2>&1 | tail -2
dtypes=${1:-float32,float16}
variants=${2:-elementwise,reductions}
zoo=/tmp/zoo
shape=(--shape batch=8 --shape sequence=128)
log="$OUT/bench_bert.log"
# Models carried without their weights (scripts/carry_weights.py strip, into build/bertc) get
# seeded random ones here; what is still missing is exported (needs torch).
missing=""; for dt in ${dtypes//,/ }; do
  [ -f "$zoo/bert-base-$dt.onnx" ] || [ ! -f "build/bertc/bert-base-$dt.onnx" ] || \
    python3 scripts/carry_weights.py fill "build/bertc/bert-base-$dt.onnx" "$zoo" 2>&1 | tee -a "$log"
  [ -f "$zoo/bert-base-$dt.onnx" ] || missing="$missing,$dt"
done
[ -z "$missing" ] || python3 scripts/build_zoo.py --out "$zoo" --models bert-base --dtypes "${missing#,}" 2>&1 | tail -3 | tee -a "$log"
for dt in ${dtypes//,/ }; do
  m="$zoo/bert-base-$dt.onnx"
  for variant in ${variants//,/ }; do
    flag=(); [ "$variant" = elementwise ] && flag=(--no-reductions); [ "$variant" = nopack ] && flag=(--no-pack)
    [ "$variant" = nomerge ] && flag=(--no-merge-matmuls)
    [ "$variant" = noattention ] && flag=(--no-attention)
    python3 -m onnxstitch.cli optimize "$m" -o "/tmp/bert-$dt-$variant.onnx" "${shape[@]}" "${flag[@]}" \
      --report "$OUT/report-$dt-$variant.json" 2>&1 | tail -4 | tee -a "$log"
    for g in "" --cuda-graph; do
      peer=(); [ "$variant" = reductions ] && peer=(--peer-ort-optimizer bert)
      python3 -m onnxstitch.cli bench "$m" --stitched "/tmp/bert-$dt-$variant.onnx" "${shape[@]}" $g "${peer[@]}" \
        --iters 200 --json > "$OUT/bench-$dt-$variant${g:+-graphs}.json" 2>>"$log"
      python3 - "$OUT/bench-$dt-$variant${g:+-graphs}.json" "$dt $variant ${g:-plain}" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
row = "  ".join(f"{k}: {v['median_ms']:.3f} ms ({v['launches_per_run']:.0f} launches)" for k, v in r["configs"].items())
print(f"{sys.argv[2]:32} {row}  speedup {r['speedup']:.3f}")
PY
    done
    # GPU time per kernel (ncu replays each once); BERT_NCU=0 skips it
    if [ $variant = reductions ] && [ "${BERT_NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
      for which in stock stitched; do
        path="$m"; [ $which = stitched ] && path="/tmp/bert-$dt-$variant.onnx"
        ncu --csv --clock-control none --metrics gpu__time_duration.sum \
          python3 scripts/run_model.py "$path" "${shape[@]}" --iters 2 > "/tmp/ncu-$dt-$variant-$which.csv" 2>>"$log"
        python3 scripts/kernel_profile.py "/tmp/ncu-$dt-$variant-$which.csv" --runs 2 --skip 1 \
          --json "$OUT/kernels-$dt-$variant-$which.json" > "$OUT/kernels-$dt-$variant-$which.txt" 2>&1
        head -8 "$OUT/kernels-$dt-$variant-$which.txt" | sed "s/^/$dt $variant $which: /" | tee -a "$log"
      done
    fi
  done
done
cp /tmp/ncu-*.csv "$OUT"/ 2>/dev/null
tar czf "$TOP/bert.tar.gz" -C "$TOP" bert && rm -rf "$OUT"
