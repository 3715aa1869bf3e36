#!/usr/bin/env bash
# On the GPU machine, in one call: GEMM epilogues through cuBLASLt (schemes/gemm, issue 21) —
# their GPU tests (tests/gpu/test_gemm_gpu.py), the kernel-level benchmark at BERT-base's shapes
# (scripts/bench_gemm.py: each epilogue against the plain cuBLASLt call and stock ORT, CUDA
# graphs) and BERT-base float32 (batch 8, sequence 128) optimized without and with --epilogues,
# each benched against stock ORT with CUDA graphs. Setup as scripts/gpu_check.sh (staged
# packages in /tmp/site, the library built here in .carry/); carry .carry and build/bertc.
#   here:  mkdir -p .carry && cp "$(python3 -m onnxstitch.runtime.build)" .carry/libonnxstitch_ops.so
#   there: bash scripts/gpu_gemm.sh            (JSON, reports and logs under $OUT)
set -uo pipefail
source scripts/gpu_env.sh
log="$OUT/gpu_gemm.log"
gpu_setup "$log"
python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore tests/gpu/test_gemm_gpu.py \
  --junitxml="$OUT/gemm_tests.xml" 2>&1 | tee -a "$log" | tail -25
status=${PIPESTATUS[0]}
python3 scripts/bench_gemm.py --out "$OUT/bench_gemm.json" 2>&1 | tee -a "$log"
[ ${PIPESTATUS[0]} = 0 ] || status=1
zoo=/tmp/zoo
m="$zoo/bert-base-float32.onnx"
[ -f "$m" ] || python3 scripts/carry_weights.py fill build/bertc/bert-base-float32.onnx "$zoo" 2>&1 | tail -2 | tee -a "$log"
shape=(--shape batch=8 --shape sequence=128)
for variant in plain epilogues; do
  flag=(); [ $variant = epilogues ] && flag=(--epilogues)
  python3 -m onnxstitch.cli optimize "$m" -o "/tmp/bert-float32-$variant.onnx" "${shape[@]}" "${flag[@]}" \
    --report "$OUT/bert-report-$variant.json" 2>&1 | tail -12 | tee -a "$log"
  python3 -m onnxstitch.cli bench "$m" --stitched "/tmp/bert-float32-$variant.onnx" "${shape[@]}" --cuda-graph \
    --iters 200 --json > "$OUT/bert-bench-$variant.json" 2>>"$log"
  python3 - "$OUT/bert-bench-$variant.json" "$OUT/bert-report-$variant.json" "$variant" <<'PY' | tee -a "$log"
import json, sys
r, rep = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
row = "  ".join(f"{k}: {v['median_ms']:.3f} ms ({v['launches_per_run']:.0f} launches)" for k, v in r["configs"].items())
e = rep.get("epilogues", {})
print(f"BERT-base float32 b8 s128 CUDA graphs, {sys.argv[3]:9} {row}  speedup {r['speedup']:.3f}  "
      f"epilogues {len(e.get('gemms', []))} taken, {len(e.get('refusals', []))} refused or passed")
PY
done
exit "$status"
