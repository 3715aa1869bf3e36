#!/usr/bin/env bash
# On the GPU machine (setup of scripts/gpu_check.sh): ncu metrics of row kernels at forced
# threads per row (scripts/profile_rows.py): GPU time, instructions, issue-slot use, achieved
# occupancy, registers, DRAM throughput and the main stall reasons — to tell bandwidth-,
# issue- and latency-bound kernels apart. Cases are "case dtype size threads" lines below, or
# NCU_CASES (the same lines; an empty threads field takes the planner's).
#   bash scripts/ncu_rows.sh
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ONNXSTITCH_LIBRARY=$PWD/.carry/libonnxstitch_ops.so ONNXSTITCH_CACHE=/tmp/onnxstitch-cache
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,launch__grid_size,local_load_bytes:l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
M=${M//local_load_bytes:/}
while read case dt size t; do
  ncu --csv --kernel-name regex:stitch --launch-skip 3 --launch-count 1 --metrics $M python3 scripts/profile_rows.py $case $dt $size ${t:+--threads $t} > /tmp/p.csv 2>&1
  echo "== $case $dt $size T=$t  $(grep -E '^(softmax|layernorm)' /tmp/p.csv)"
  grep -E '^"[0-9]' /tmp/p.csv | awk -F'","' '{printf "   %s=%s\n", $13, $NF}' | sed 's/"$//; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | tr '\n' ' '; echo
done <<< "${NCU_CASES:-$(cat <<'CASES'
softmax float16 512 32
softmax float16 512 64
softmax float32 512 32
layernorm float16 4096 64
layernorm float16 4096 128
layernorm float32 1024 64
softmax float32 128 8
softmax float16 128 16
CASES
)}"
