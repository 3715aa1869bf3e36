#!/usr/bin/env bash
# On the GPU machine (setup of scripts/gpu_check.sh): Nsight Compute's full section set of one
# attention kernel alone (scripts/bench_attention.py's case and variant), with the SASS and its
# per-instruction samples (warp stalls, executed instructions) as CSV, into $OUT/ncu_attention.tar.gz.
#   bash scripts/ncu_attention.sh [case, default bert-projected-bk-float16] [variant, default keys=128,staged_tf32=1]
set -uo pipefail
source scripts/gpu_env.sh
gpu_setup "$OUT/ncu_attention.log" >/dev/null
case=${1:-bert-projected-bk-float16}
variant=${2:-keys=128,staged_tf32=1}
dir=/tmp/ncu_attention; mkdir -p $dir
ncu --clock-control none --kernel-name regex:_attn --launch-skip 5 --launch-count 1 --set full --import-source yes \
  -f -o $dir/attn python3 scripts/bench_attention.py --cases "$case" --variants "$variant" --no-end-to-end --reps 10 \
  --out $dir/bench.json >> "$OUT/ncu_attention.log" 2>&1
ncu -i $dir/attn.ncu-rep --page details --csv > $dir/details.csv 2>&1
ncu -i $dir/attn.ncu-rep --page source --csv --print-source sass > $dir/sass.csv 2>&1
ncu -i $dir/attn.ncu-rep --page details --print-details all > $dir/details.txt 2>&1
grep -E "Duration|Executed Instructions|Issue Slots Busy|Achieved Occupancy|Registers Per|Theoretical Occ|Warp Cycles Per Issued|No Eligible|Memory Throughput|L1/TEX Hit|L2 Hit" $dir/details.txt | head -30 | tee -a "$OUT/ncu_attention.log"
tar czf "$OUT/ncu_attention.tar.gz" -C /tmp ncu_attention
