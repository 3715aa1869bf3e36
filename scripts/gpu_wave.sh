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
#   tests    the gpu-marked tests of the files named in TESTS (default the measure/verify ones;
#            carry .carry whole so that the generated-GEMM ones run);
#            TEST_WORKERS xdist workers (8), spread over ONNXSTITCH_TEST_GPUS GPUs (tests/conftest.py)
#   opt      BERT-base optimize cold and warm (time, peak RSS, stages), then a cold run under
#            cProfile (the top of it in $OUT/opt-profile.txt); carry build/bertc
#   timeline where a cold optimize's time goes, per model (TIMELINE="bertc/bert-base-float32:batch=8,...";
#            TIMELINE_PROFILE=1 adds node_profile.py of stock and stitched)
#   cf       control flow (issue 39), carry build/cfc: silero-vad at batch 8 (sr 16000), the Scan
#            GRU and the greedy-decoding Loop, default flags, GPU verification, timed plain
#            (CF_ROUNDS benches each; CF_PROFILE=1: silero's nodes by time, stock and stitched)
#   columns  split column kernels (issue 36): their GPU tests, then bench_rows.py --columns (GRN norms
#            at ConvNeXt V2's stages, split and unsplit, against the copy bandwidth)
#   layernorm scripts/bench_layernorm.py: BERT's bias + residual + LayerNorm rows, stock ORT against
#            our kernel, and hand-written forms of it, in CUDA graphs (issue 38)
#   gemm     scripts/bench_triton_gemm.py: Triton GEMMs with epilogues against cuBLASLt (issue 38)
#   cnn      issue 36, carry build/cnnc: CNN_JOBS="resnet50-float32 nudenet-320n@8 ..." with and without
#            epilogues, benched plain and in graphs (session start and first run too), a GPU a job
#   epi      issue 36, carry build/cnnc: EPI_MODELS optimized with --epilogues (cold, cuDNN plan
#            times logged), then their first inference and speed in CUDA graphs
#   capture  CAPTURE="dir/name:shape ...": why ORT cannot capture a stitched model in a CUDA graph
#            (optimized --no-gate; scripts/capture_probe.py at ORT's verbose log)
#   plans    carry build/bertc: BERT-base (PLAN_DTYPES, default float16,float32) optimized with the gate
#            and with --no-gate (PLAN_FLAGS added to both), the groups of each report
#            (scripts/report_groups.py: predicted against measured), both benched in CUDA graphs
#   versus   carry build/bertc and build/old (the package of an earlier commit:
#            `git archive REV onnxstitch | tar -x -C build/old`): BERT-base (VERSUS_DTYPES, default
#            float16) optimized by this tree and by the old one, each benched in CUDA graphs against
#            stock, VERSUS_ROUNDS times in turn (same call: a change's effect on one machine)
#   zoo      issue 40, carry build/zoosub (a manifest): `onnxstitch zoo --local` on GPU 0 alone
#            (CUDA_VISIBLE_DEVICES=0), then on every GPU of the machine, each with a cold cache
# Usage there: bash scripts/gpu_wave.sh PART
set -uo pipefail
source scripts/gpu_env.sh
part=${1:?part: bert, unseen, ab, quick, opt, plans, versus, cf, layernorm, columns, gemm, generated, zoo, zoofill, cnn, capture or tests}
log="$OUT/$part.log"
gpu_setup "$OUT/setup.log" >/dev/null
carried_gemms() {  # CUTLASS's headers (the wheel in .carry/cutlass) and the generated GEMMs built
  # on the CPU machine (.carry/gcache, scripts/prebuild_gemms.py) where this machine looks for them
  for w in .carry/cutlass/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site/; done
  mkdir -p "$ONNXSTITCH_CACHE/gemm" && cp .carry/gcache/gemm/*.so "$ONNXSTITCH_CACHE/gemm/" 2>/dev/null
}
fill() {  # fill DIR_FROM DIR_TO: every stripped model of a folder, given seeded weights
  mkdir -p "$2"
  for m in "$1"/*.onnx; do python3 scripts/carry_weights.py fill "$m" "$2/" >/dev/null || echo "fill failed: $m"; done
  cp "$1"/manifest.json "$2/" 2>/dev/null || true
}
case "$part" in
  bert)
    # (build/unseenc here: python3 scripts/build_corpus.py --only unseen --out build/unseen, then
    # carry_weights.py strip each model into build/unseenc with the manifest; without it the
    # TorchScript BERT rows are skipped)
    [ -f build/unseenc/bert-ts.onnx ] && fill build/unseenc /tmp/unseen
    [ -f build/unseenc/bert-ts.onnx ] && {
      echo "== bench --cuda-graph, TorchScript BERT (corpus widths)"
      python3 -m onnxstitch.cli optimize /tmp/unseen/bert-ts.onnx -o /tmp/bert-ts.stitched.onnx \
        --shape batch=8,sequence=128 -q
      python3 -m onnxstitch.cli bench /tmp/unseen/bert-ts.onnx --stitched /tmp/bert-ts.stitched.onnx \
        --shape batch=8,sequence=128 --cuda-graph --json -q > "$OUT/bench-bert-ts-graphs.json"
      python3 -m onnxstitch.cli bench /tmp/unseen/bert-ts.onnx --stitched /tmp/bert-ts.stitched.onnx \
        --shape batch=8,sequence=128 --cuda-graph
    } 2>&1 | tee "$log"
    [ -f build/unseenc/bert-ts.onnx ] || echo "== TorchScript BERT skipped: no build/unseenc" | tee "$log"
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
  opt)
    bash scripts/gpu_optimize_time.sh 2>&1 | tee "$log"
    ONNXSTITCH_CACHE=/tmp/onnxstitch-prof python3 -m cProfile -o "$OUT/opt.prof" -m onnxstitch.cli optimize \
      /tmp/zoo/bert-base-float32.onnx --shape batch=8,sequence=128 -q -o /tmp/zoo/bert.prof.onnx 2>&1 | tee -a "$log"
    python3 -c "import pstats; p = pstats.Stats('$OUT/opt.prof'); p.sort_stats('cumulative').print_stats(60)
p.sort_stats('tottime').print_stats(30)" > "$OUT/opt-profile.txt" 2>&1
    ;;
  timeline)
    # where a cold optimize's time goes: INFO log stamped in ms since start, peak RSS, then the
    # nodes of stock and stitched by time (node_profile.py). TIMELINE="dir/name:shape ..."
    # (dir a carried folder of stripped models under build/)
    for job in ${TIMELINE:?TIMELINE=\"dir/name:shape ...\"}; do
      rel=${job%%:*} shape=${job#*:} name=$(basename "${job%%:*}")
      mkdir -p /tmp/tl && python3 scripts/carry_weights.py fill "build/$rel.onnx" /tmp/tl/ >/dev/null
      export ONNXSTITCH_CACHE=/tmp/onnxstitch-tl-$name && rm -rf "$ONNXSTITCH_CACHE"
      echo "== $name $shape (cold)"
      /usr/bin/time -f "wall %e s, peak %M KB" python3 -c "import logging, sys
logging.basicConfig(level=logging.INFO, format='%(relativeCreated)7.0f ms %(levelname)s %(name)s: %(message)s')
logging.getLogger('onnxstitch.compile').setLevel(logging.DEBUG)  # each compile's time
from onnxstitch.cli.main import main
sys.argv = ['onnxstitch'] + sys.argv[1:]
main()" optimize "/tmp/tl/$name.onnx" --shape "$shape" -o "/tmp/tl/$name.stitched.onnx" \
        --report "$OUT/timeline-$name.json" > "$OUT/timeline-$name.log" 2>&1
      grep -E "stage |wall |made in|timed in|compiled|measur|gate|verif|given" "$OUT/timeline-$name.log" | tail -75
      [ -n "${TIMELINE_PROFILE:-}" ] && python3 scripts/node_profile.py "/tmp/tl/$name.onnx" "/tmp/tl/$name.stitched.onnx" \
        --dims "$shape" --top 25 > "$OUT/profile-$name.txt" 2>&1
    done 2>&1 | tee "$log"
    ;;
  cf)
    cf() {  # cf NAME SHAPE "FLAGS" [optimize-only flags]: optimize with GPU verification, time it plain
      local name=$1 shape=$2 flags=$3
      shift 3
      echo "== $name $shape $flags $*"
      /usr/bin/time -f "optimize %e s, peak %M KB" python3 -m onnxstitch.cli optimize "build/cfc/$name.onnx" \
        --shape "$shape" $flags "$@" -o "/tmp/$name.stitched.onnx" --report "$OUT/cf-$name$*.json"
      for round in $(seq "${CF_ROUNDS:-1}"); do  # the plain bench is host-bound and noisy: rounds
        python3 -m onnxstitch.cli bench "build/cfc/$name.onnx" --stitched "/tmp/$name.stitched.onnx" \
          --shape "$shape" $flags --iters 300
      done
    }
    {
      cf silero-vad input=8x512,state=2x8x128 "--value sr=16000" ${CF_FLAGS:-}
      [ -n "${CF_PROFILE:-}" ] && python3 scripts/node_profile.py build/cfc/silero-vad.onnx \
        /tmp/silero-vad.stitched.onnx --shape input=8x512,state=2x8x128 --value sr=16000 --runs 20 --top 40
      [ -n "${CF_SILERO_ONLY:-}" ] || { cf gru-scan batch=8,seq=64 ""; cf greedy-loop batch=8 ""; }
    } 2>&1 | tee "$log"
    ;;
  layernorm)  # issue 38: BERT's residual LayerNorm, stock ORT against ours and hand-written forms
    python3 scripts/bench_layernorm.py --out "$OUT/layernorm.json" 2>&1 | tee "$log"
    ;;
  columns)  # issue 36: split column kernels, GPU tests and the GRN norms against the copy bandwidth
    python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore tests/gpu/test_rows_gpu.py -k column 2>&1 | tail -5 | tee "$log"
    python3 scripts/bench_rows.py --columns --out "$OUT/columns.json" 2>&1 | tee -a "$log"
    ;;
  generated)
    # Issue 38's generated GEMMs; carry .carry/gcache (objects built here: scripts/prebuild_gemms.py),
    # .carry/cutlass (the nvidia-cutlass wheel, for nvcc there when one is missing) and build/bertc.
    # GEN_STEPS: configs (scripts/bench_cutlass_configs.py: each configuration against cuBLAS),
    # tests, bench (scripts/bench_generated_gemm.py), bert (BERT-base float32 with and without
    # them, then float16 with and without, stock in the same call), default all four; llama (carry
    # build/llamac: the LLaMA layer's prefill with and without them).
    { carried_gemms
      nvcc --version | tail -2
      python3 -c "from onnxstitch.schemes.gemm import generated as g; print(g.toolchain(), g.local_sm_count())"
    } 2>&1 | tee "$log"
    steps=${GEN_STEPS:-configs,tests,bench,bert}
    if [[ $steps == *configs* ]]; then
      python3 scripts/bench_cutlass_configs.py --out "$OUT/cutlass_configs.json" ${GEN_SHAPES:+--shapes "$GEN_SHAPES"} \
        2>&1 | tee -a "$log"
    fi
    if [[ $steps == *tests* ]]; then
      python3 -m pytest -q -n 4 -m gpu tests/gpu/test_generated_gemm_gpu.py tests/gpu/test_gemm_gpu.py \
        -p no:cacheprovider 2>&1 | tail -15 | tee -a "$log"
    fi
    if [[ $steps == *bench* ]]; then
      python3 scripts/bench_generated_gemm.py --out "$OUT/generated_gemm.json" ${GEN_SHAPES:+--shapes "$GEN_SHAPES"} \
        ${GEN_DTYPES:+--dtypes "$GEN_DTYPES"} 2>&1 | tee -a "$log"
    fi
    if [[ $steps == *bert* ]]; then
      fill build/bertc /tmp/zoo >/dev/null
      m=/tmp/zoo/bert-base-float32.onnx
      for v in default generated; do
        flags=(); [ $v = generated ] && flags=(--arch sm_90 --generated-gemms on)
        t0=$(date +%s.%N)
        python3 -m onnxstitch.cli optimize "$m" -o /tmp/zoo/bert.$v.onnx --shape batch=8,sequence=128 \
          --report "$OUT/bert-$v-report.json" -q "${flags[@]}"
        echo "$v optimize: rc $? $(python3 -c "import time; print(round(time.time() - $t0, 2))") s wall"
      done 2>&1 | tee -a "$log"
      if [ -f /tmp/zoo/bert-base-float16.onnx ]; then
        for v in f16 f16gen; do
          flags=(); [ $v = f16gen ] && flags=(--arch sm_90 --generated-gemms on)
          python3 -m onnxstitch.cli optimize /tmp/zoo/bert-base-float16.onnx -o /tmp/zoo/bert.$v.onnx \
            --shape batch=8,sequence=128 --report "$OUT/bert-$v-report.json" -q "${flags[@]}"
          echo "$v optimize: rc $?"
        done 2>&1 | tee -a "$log"
      fi
      for v in default generated f16 f16gen; do
        echo "== $v, CUDA graphs"
        src=$m; [[ $v == f16* ]] && src=/tmp/zoo/bert-base-float16.onnx
        [ -f /tmp/zoo/bert.$v.onnx ] || continue
        python3 -m onnxstitch.cli bench "$src" --stitched /tmp/zoo/bert.$v.onnx --shape batch=8,sequence=128 \
          --cuda-graph --json -q > "$OUT/bench-bert-$v.json"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: round(v['median_ms'], 4) for k, v in r['configs'].items()}, r['speedup'])" \
          "$OUT/bench-bert-$v.json"
      done 2>&1 | tee -a "$log"
    fi
    if [[ $steps == *llama* ]]; then  # carry build/llamac: the LLaMA layer's prefill, float16, batch 4 × 512
      mkdir -p /tmp/llama && python3 scripts/carry_weights.py fill build/llamac/llama-prefill-dynamo.onnx /tmp/llama/ >/dev/null
      m=/tmp/llama/llama-prefill-dynamo.onnx
      for v in default generated; do
        flags=(); [ $v = generated ] && flags=(--arch sm_90 --generated-gemms on)
        python3 -m onnxstitch.cli optimize "$m" -o /tmp/llama/$v.onnx --shape batch=4,sequence=512 \
          --report "$OUT/llama-$v-report.json" -q "${flags[@]}"
        echo "llama $v optimize: rc $?"
        python3 -m onnxstitch.cli bench "$m" --stitched /tmp/llama/$v.onnx --shape batch=4,sequence=512 \
          --cuda-graph --json -q > "$OUT/bench-llama-$v.json"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: round(v['median_ms'], 4) for k, v in r['configs'].items()}, r['speedup'])" \
          "$OUT/bench-llama-$v.json"
      done 2>&1 | tee -a "$log"
    fi
    ;;
  plans)
    fill build/bertc /tmp/zoo >/dev/null
    for dt in $(echo "${PLAN_DTYPES:-float16,float32}" | tr , ' '); do
      m=/tmp/zoo/bert-base-$dt.onnx
      for v in gate nogate; do
        flags=(${PLAN_FLAGS:-}); [ $v = nogate ] && flags+=(--no-gate)
        python3 -m onnxstitch.cli optimize "$m" -o /tmp/zoo/bert-$dt-$v.onnx --shape batch=8,sequence=128 \
          --report "$OUT/report-$dt-$v.json" -q "${flags[@]}"
        echo "== $dt $v (${flags[*]}): optimize rc $?"
        python3 scripts/report_groups.py "$OUT/report-$dt-$v.json"
        python3 -m onnxstitch.cli bench "$m" --stitched /tmp/zoo/bert-$dt-$v.onnx --shape batch=8,sequence=128 \
          --cuda-graph --json -q > "$OUT/bench-$dt-$v.json"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: round(v['median_ms'], 4) for k, v in r['configs'].items()}, round(r['speedup'], 3))" \
          "$OUT/bench-$dt-$v.json"
      done
    done 2>&1 | tee "$log"
    ;;
  versus)
    fill build/bertc /tmp/zoo >/dev/null
    for dt in $(echo "${VERSUS_DTYPES:-float16}" | tr , ' '); do
      m=/tmp/zoo/bert-base-$dt.onnx
      for v in new old; do
        # (the old tree's package first on the path; the library and everything else as carried)
        PYTHONPATH=$([ $v = old ] && echo "$PWD/build/old:")$PYTHONPATH ONNXSTITCH_CACHE=/tmp/onnxstitch-$v \
          python3 -m onnxstitch.cli optimize "$m" -o /tmp/zoo/bert-$dt-$v.onnx --shape batch=8,sequence=128 \
          --report "$OUT/report-$dt-$v.json" -q
        echo "== $dt $v: optimize rc $?"
      done
      for r in $(seq "${VERSUS_ROUNDS:-2}"); do
        for v in new old; do
          python3 -m onnxstitch.cli bench "$m" --stitched /tmp/zoo/bert-$dt-$v.onnx --shape batch=8,sequence=128 \
            --cuda-graph --json -q > "$OUT/bench-$dt-$v-$r.json"
          python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], {k: round(v['median_ms'], 4) for k, v in r['configs'].items()}, round(r['speedup'], 3))" \
            "$OUT/bench-$dt-$v-$r.json" "$dt $v round $r"
        done
      done
    done 2>&1 | tee "$log"
    ;;
  gemm)
    python3 scripts/bench_triton_gemm.py --out "$OUT/triton_gemm.json" ${SHAPES:+--shapes "$SHAPES"} 2>&1 | tee "$log"
    ;;
  zoo)
    # GPU 0 alone first; its report then orders the run on every GPU (longest models first, as a
    # CI run ordered by its last report).
    # ZOO_FILL=DIR: a folder of stripped models (carry_weights.py strip) to fill once on this
    # machine; ZOO_ORDER=FILE: a zoo.json from an earlier call (the one-GPU run) to order by.
    manifest=build/zoosub/manifest.json
    if [ -n "${ZOO_FILL:-}" ]; then
      [ -f /tmp/zoofill/manifest.json ] || fill "$ZOO_FILL" /tmp/zoofill
      manifest=/tmp/zoofill/manifest.json
    fi
    # ZOO_SHARD=K/N: one shard of the manifest (a one-GPU run longer than a call's 10 minutes
    # is made in two calls, 1/2 then 2/2, on one lease; its wall is their sum).
    for run in ${ZOO_RUNS:-one all}; do
      echo "== $run ${ZOO_SHARD:-}"
      [ "$run" = all ] && [ -f /tmp/zoo-order-one.json ] && mkdir -p "$OUT/zoo-all" && cp /tmp/zoo-order-one.json "$OUT/zoo-all/zoo.json"
      [ -n "${ZOO_ORDER:-}" ] && mkdir -p "$OUT/zoo-$run" && cp "$ZOO_ORDER" "$OUT/zoo-$run/zoo.json"
      export ONNXSTITCH_CACHE=/tmp/zoo-cache-$run
      start=$(date +%s.%N)
      if [ $run = one ]; then
        CUDA_VISIBLE_DEVICES=0 python3 -m onnxstitch.cli zoo "$manifest" --local --out "$OUT/zoo-$run" -q \
          ${ZOO_SHARD:+--shard $ZOO_SHARD}
      else
        python3 -m onnxstitch.cli zoo "$manifest" --local --out "$OUT/zoo-$run" -q ${ZOO_SHARD:+--shard $ZOO_SHARD}
      fi
      rc=$?
      # for a later call's ZOO_ORDER and the run on every GPU: the shards' rows merged
      python3 - "$OUT/zoo-$run/zoo.json" "/tmp/zoo-order-$run.json" <<'PY'
import json, os, sys
new, kept = json.load(open(sys.argv[1])), {}
if os.path.exists(sys.argv[2]):
    kept = {r["name"]: r for r in json.load(open(sys.argv[2])).get("models", [])}
kept.update({r["name"]: r for r in new.get("models", [])})
new["models"] = list(kept.values())
json.dump(new, open(sys.argv[2], "w"))
PY
      echo "exit $rc wall $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
      head -5 "$OUT/zoo-$run/zoo.md"
    done 2>&1 | tee "$log"
    ;;
  zoofill)  # fill ZOO_FILL's stripped models into /tmp/zoofill ahead of the zoo calls
    fill "${ZOO_FILL:?ZOO_FILL=DIR}" /tmp/zoofill 2>&1 | tee "$log"
    ls /tmp/zoofill | wc -l | tee -a "$log"
    ;;
  cnn)  # issue 36's CNN figures, carry build/cnnc: CNN_JOBS ("name[@batch]" each) with and without
    # epilogues, benched plain and in CUDA graphs, one job per GPU at a time (scripts/gpu_conv.sh)
    for job in ${CNN_JOBS:?CNN_JOBS}; do  # fill each model once, before the jobs share it
      name=${job%@*}; [ -f "/tmp/zoo/$name.onnx" ] || python3 scripts/carry_weights.py fill "build/cnnc/$name.onnx" /tmp/zoo >/dev/null
    done
    gpus=$(nvidia-smi -L | wc -l); i=0
    for job in $CNN_JOBS; do
      name=${job%@*}; batch=${job#*@}; tag=; shape=
      # NudeNet (YOLOv8n) has free sizes: 640², at the batch named
      [ "$batch" != "$job" ] && tag=-b$batch && shape="--shape batch=$batch,height=640,width=640"
      (CUDA_VISIBLE_DEVICES=$((i % gpus)) OUT="$OUT/cnn-$name$tag" TAG=$tag SHAPE=$shape PARTS=bench \
        MODES="graphs plain" CORPUS=build/cnnc bash scripts/gpu_conv.sh "$name" > /dev/null 2>&1) &
      i=$((i + 1)); [ $((i % gpus)) = 0 ] && wait
    done
    wait
    cat "$OUT"/cnn-*/gpu_conv.log > "$log"
    grep -h "speedup\|optimize" "$OUT"/cnn-*/gpu_conv.log
    ;;
  epi)  # issue 36, carry build/cnnc: EPI_MODELS optimized with --epilogues, cold, side by side (a GPU
    # each), cuDNN's plan times logged (ONNXSTITCH_PLAN_LOG), then the first inference in a new process
    gpus=$(nvidia-smi -L | wc -l); i=0
    for name in ${EPI_MODELS:?EPI_MODELS}; do
      [ -f "/tmp/zoo/$name.onnx" ] || python3 scripts/carry_weights.py fill "build/cnnc/$name.onnx" /tmp/zoo >/dev/null
      (export CUDA_VISIBLE_DEVICES=$((i % gpus)) ONNXSTITCH_PLAN_LOG=1
       /usr/bin/time -f "$name: optimize %e s, peak %M KB" python3 -m onnxstitch.cli optimize "/tmp/zoo/$name.onnx" \
         --shape batch=8 --epilogues -v -o "/tmp/$name-epi.onnx" --report "$OUT/$name-report.json" > "$OUT/$name-optimize.log" 2>&1
       python3 -m onnxstitch.cli bench "/tmp/zoo/$name.onnx" --stitched "/tmp/$name-epi.onnx" --shape batch=8 \
         --cuda-graph --iters 100 --json > "$OUT/$name-bench.json" 2> "$OUT/$name-bench.log") &
      i=$((i + 1))
    done
    wait
    for name in $EPI_MODELS; do
      python3 - "$OUT" "$name" <<'PY' | tee -a "$log"
import json, re, sys
out, name = sys.argv[1:]
text = open(f"{out}/{name}-optimize.log").read()
stages = json.load(open(f"{out}/{name}-report.json")).get("stage_seconds", {})
chosen = [tuple(map(int, m)) for m in re.findall(r"chosen in (\d+) ms: heuristics (\d+) ms, finalizing \d+ plans (\d+) ms", text)]
loaded = [int(m) for m in re.findall(r"loaded in (\d+) ms", text)]
prepared = [int(m) for m in re.findall(r"prepared in (\d+) ms", text)]  # in optimize's worker processes
picked = [int(m) for m in re.findall(r"chosen from prepared candidates in (\d+) ms", text)]
measured = json.load(open(f"{out}/{name}-report.json")).get("measured", {})
groups = measured.get("groups", []) if isinstance(measured, dict) else []
wall = re.findall(r"optimize ([\d.]+) s, peak (\d+) KB", text)
print(f"{name}: {wall}, stages { {k: round(v, 1) for k, v in stages.items() if v > 0.3} }")
print(f"  plans chosen {len(chosen)}: total {sum(c[0] for c in chosen)} ms, heuristics {sum(c[1] for c in chosen)} ms, "
      f"finalize {sum(c[2] for c in chosen)} ms; loaded {len(loaded)} in {sum(loaded)} ms; prepared in workers "
      f"{len(prepared)} ({sum(prepared)} ms in all), chosen from them {len(picked)} ({sum(picked)} ms)")
print(f"  groups measured {sum(g.get('ours_us') is not None for g in groups)} of {len(groups)}, not paying "
      f"{[g['group'] for g in groups if not g.get('pays', True)]}")
b = json.load(open(f"{out}/{name}-bench.json"))
print("  bench: " + "  ".join(f"{k}: {v['median_ms']:.3f} ms (first {v['startup_s']:.2f} s)" for k, v in b["configs"].items())
      + f"  speedup {b['speedup']:.3f}")
PY
    done
    ;;
  capture)  # why a stitched model ORT cannot capture in a CUDA graph where stock can: CAPTURE="dir/name:shape ..."
    # (dir a carried folder of stripped models under build/); optimized --no-gate, benched with
    # --cuda-graph, the notes printed, then one session at ORT's info log for the refusal
    for job in ${CAPTURE:?CAPTURE=\"dir/name:shape ...\"}; do
      rel=${job%%:*} shape=${job#*:} name=$(basename "${job%%:*}")
      mkdir -p /tmp/cap && python3 scripts/carry_weights.py fill "build/$rel.onnx" /tmp/cap/ >/dev/null
      echo "== $name $shape"
      python3 -m onnxstitch.cli optimize "/tmp/cap/$name.onnx" --shape "$shape" -o "/tmp/cap/$name.s.onnx" --no-gate -q
      python3 -m onnxstitch.cli bench "/tmp/cap/$name.onnx" --stitched "/tmp/cap/$name.s.onnx" --shape "$shape" \
        --cuda-graph --json -q > "$OUT/capture-$name.json" 2> "$OUT/capture-$name.err"
      python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
for k, v in r['configs'].items(): print(k, v.get('median_ms'), v.get('cuda_graph'), v.get('note'))" "$OUT/capture-$name.json"
      python3 scripts/capture_probe.py "/tmp/cap/$name.s.onnx" --shape "$shape" > "$OUT/capture-$name-probe.log" 2>&1
      tail -25 "$OUT/capture-$name-probe.log"
    done 2>&1 | tee "$log"
    ;;
  tests)
    carried_gemms  # (without CUTLASS's headers the generated-GEMM tests skip)
    python3 -m pytest -p no:cacheprovider -m gpu -q -W ignore ${TESTS:-tests/gpu/test_stitched_gpu.py} \
      $(python3 -c "import xdist" 2>/dev/null && printf -- "-n %s" "${TEST_WORKERS:-8}") --junitxml="$OUT/tests.xml" 2>&1 \
      | tee "$log" | tail -30
    ;;
esac
tar czf "$OUT/$part.tgz" -C "$OUT" --exclude='*.tgz' . 2>/dev/null
