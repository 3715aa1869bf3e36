#!/usr/bin/env bash
# On the GPU machine, in one call: install onnxstitch, run every `gpu` test, run the
# benchmarks. Full logs and JSON go to $OUT. Expects the staged packages in /tmp/site
# (../shared/gpu/stage.sh) and the custom-op library built on the CPU machine in .carry/
# (the GPU machine has no network to fetch ORT's headers):
#   here:  echo /.carry/ >> .git/info/exclude; mkdir -p .carry
#          cp "$(python3 -m onnxstitch.runtime.build)" .carry/libonnxstitch_ops.so
#   there: bash scripts/gpu_check.sh [pytest -k expression]      (carry .carry)
# The zoo report and BERT are separate calls (about 4 minutes per dtype each on an H200):
#   python3 scripts/build_zoo.py --out /tmp/zoo && python3 scripts/zoo_report.py --zoo /tmp/zoo
# (the GPU machine cannot export the zoo: build it here, then carry the models without their
#  weights, `python3 scripts/carry_weights.py strip MODEL DIR` — BERT-base is 0.6 MB so — and
#  `carry_weights.py fill` gives them seeded random weights there; bench_bert.sh and
#  zoo_merge.sh do the filling themselves)
#   bash scripts/bench_bert.sh float32,float16       (stock vs stitched vs ORT's optimizer, ncu;
#                                                     carry build/bertc)
#   bash scripts/zoo_merge.sh float32                (sibling GEMMs merged or not; carry build/zoo2c)
#   bash scripts/gpu_attention.sh                    (attention kernels: tests, sanitizers, variants
#                                                     (bench_attention.py), BERT with and without
#                                                     them; carry build/bertc)
set -uo pipefail
source scripts/gpu_env.sh
log="$OUT/gpu_check.log"
gpu_setup "$log"
sel=${1:-}
python3 -m pytest -p no:cacheprovider -m gpu tests -q -W ignore $(python3 -c "import xdist" 2>/dev/null && printf -- "-n 8") ${sel:+-k "$sel"} \
  --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee -a "$log" | tail -40
status=${PIPESTATUS[0]}
python3 scripts/bench_elementwise.py --out "$OUT/bench_elementwise.json" 2>&1 | tee -a "$log"
python3 scripts/bench_rows.py --out "$OUT/bench_rows.json" 2>&1 | tee -a "$log"
python3 scripts/bench_slices.py --out "$OUT/bench_slices.json" 2>&1 | tee -a "$log"
# Race and memory checks of every rows scheme, where the machine's compute-sanitizer works.
if command -v compute-sanitizer >/dev/null; then
  for tool in racecheck memcheck; do
    timeout 300 compute-sanitizer --tool $tool --target-processes all python3 scripts/sanitize_rows.py \
      > "$OUT/sanitizer-$tool.log" 2>&1
    echo "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.log" | tail -1)" | tee -a "$log"
  done
fi
# The CLI end to end, as a user runs it.
python3 -c "from models.elementwise import chain; import onnx; onnx.save(chain(20), '/tmp/chain.onnx')"
python3 -m onnxstitch.cli optimize /tmp/chain.onnx -o /tmp/chain.stitched.onnx --shape batch=8192 2>&1 | tee -a "$log"
python3 -m onnxstitch.cli bench /tmp/chain.onnx --stitched /tmp/chain.stitched.onnx --shape batch=8192 2>&1 | tee -a "$log"
python3 -m onnxstitch.cli bench /tmp/chain.onnx --stitched /tmp/chain.stitched.onnx --shape batch=8192 --cuda-graph 2>&1 | tee -a "$log"
python3 -m onnxstitch.cli bench /tmp/chain.onnx --stitched /tmp/chain.stitched.onnx --shape batch=64 --json > "$OUT/bench_chain_b64.json"
python3 -m onnxstitch.cli check /tmp/chain.onnx --baseline "$OUT/check_baseline.json" --update-baseline --shape batch=64 2>&1 | tee -a "$log"
python3 -m onnxstitch.cli check /tmp/chain.onnx --baseline "$OUT/check_baseline.json" --shape batch=64 2>&1 | tee -a "$log"
exit "$status"
