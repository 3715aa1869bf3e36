#!/usr/bin/env bash
# On the GPU machine: convolution epilogues through cuDNN (schemes/conv, issue 21) — their GPU
# tests and the header check (PARTS=tests), then for each zoo CNN given (carried without weights,
# scripts/carry_weights.py) optimized with --no-epilogues and with --epilogues, each benched
# against stock ORT with CUDA graphs. Setup as scripts/gpu_check.sh (staged packages in
# /tmp/site, the library built here in .carry/); carry .carry and the stripped models.
#   there: PARTS=tests bash scripts/gpu_conv.sh
#          PARTS=bench CORPUS=build/zooc bash scripts/gpu_conv.sh resnet50-float32 yolo-float16 ...
# PARTS=kernels times each conv group the plan takes against the same cuDNN call without its
# epilogue (scripts/bench_conv.py, the kernel-level criterion). MODES="graphs plain" benches
# both ways (default graphs); each row gives each configuration's session start and first run.
# TAG=SUFFIX names a run's files apart (the same model at two SHAPEs, side by side).
set -uo pipefail
source scripts/gpu_env.sh
log="$OUT/gpu_conv.log"
gpu_setup "$log"
status=0
if [[ ",${PARTS:-tests,bench}," == *,tests,* ]]; then
  python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore tests/gpu/test_conv_gpu.py tests/test_conv.py \
    tests/test_gemm.py -k "conv or header" -n 4 --junitxml="$OUT/conv_tests.xml" 2>&1 | tee -a "$log" | tail -25
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ ",${PARTS:-tests,bench}," == *,bench,* || ",${PARTS:-}," == *,kernels,* ]]; then
  corpus=${CORPUS:-build/zooc}
  for name in "$@"; do
    m="/tmp/zoo/$name.onnx"
    [ -f "$m" ] || python3 scripts/carry_weights.py fill "$corpus/$name.onnx" /tmp/zoo 2>&1 | tail -1 | tee -a "$log"
    # SHAPE="--shape d=v,..." overrides the manifest's sizes (a model carried from another folder).
    shape=${SHAPE:-$(python3 -c "import json, sys; from scripts.zoo_report import symbol_values
e = next(m for m in json.load(open(sys.argv[1]))['models'] if m['path'] == sys.argv[2])
print(' '.join(f'--shape {d}={v}' for d, v in symbol_values(e).items()))" "$corpus/manifest.json" "$name.onnx")}
    if [[ ",${PARTS:-tests,bench}," == *,kernels,* ]]; then
      python3 scripts/bench_conv.py "$m" $shape --out "$OUT/$name-bench-conv.json" 2>&1 | grep -v "shape massaging" \
        | tail -40 | tee -a "$log" || status=1
    fi
    [[ ",${PARTS:-tests,bench}," == *,bench,* ]] || continue
    for variant in ${VARIANTS:-plain epilogues}; do
      flag=--no-epilogues; [ $variant = epilogues ] && flag=--epilogues
      /usr/bin/time -f "$name${TAG:-} $variant: optimize %e s, peak %M KB" -a -o "$log" \
      python3 -m onnxstitch.cli optimize "$m" -o "/tmp/$name${TAG:-}-$variant.onnx" $shape $flag \
        --report "$OUT/$name${TAG:-}-report-$variant.json" 2>&1 | tail -14 >> "$log"
      for loaders in ${LOADERS:-default}; do  # LOADERS="1 4": ONNXSTITCH_PLAN_LOADERS of each bench
      for mode in ${MODES:-graphs}; do
      g=; [ $mode = graphs ] && g=--cuda-graph
      run=$variant-$mode; [ "$loaders" = default ] || run=$run-loaders$loaders
      (if [ "$loaders" != default ]; then export ONNXSTITCH_PLAN_LOADERS=$loaders; fi
       python3 -m onnxstitch.cli bench "$m" --stitched "/tmp/$name${TAG:-}-$variant.onnx" $shape $g \
        --iters 200 --json > "$OUT/$name${TAG:-}-bench-$run.json" 2>>"$log") || status=1
      python3 - "$OUT/$name${TAG:-}-bench-$run.json" "$OUT/$name${TAG:-}-report-$variant.json" "$name${TAG:-}" "$run" <<'PY' | tee -a "$log"
import json, sys
try:
    r, rep = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except Exception as e:
    print(f"{sys.argv[3]} {sys.argv[4]}: no result ({e})"); sys.exit(0)
row = "  ".join(f"{k}: {v['median_ms']:.3f} ms (start {v.get('startup_s', 0):.2f} s, first run {v.get('first_run_s', 0):.2f} s)"
               for k, v in r["configs"].items())
e = rep.get("epilogues", {})
print(f"{sys.argv[3]:24} {sys.argv[4]:9} {row}  speedup {r['speedup']:.3f}  conv epilogues {len(e.get('convs', []))}, "
      f"dropped {len(rep.get('dropped_groups', []))}, stages {sum(rep.get('stage_seconds', {}).values()):.1f} s")
PY
      done
      done
    done
  done
fi
tar czf "$OUT/conv-results.tgz" -C "$OUT" $(cd "$OUT" && ls *.json *.xml 2>/dev/null) 2>/dev/null
exit "$status"
