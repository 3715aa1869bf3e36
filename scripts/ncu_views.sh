#!/usr/bin/env bash
# On the GPU machine (setup of scripts/gpu_check.sh): ncu per-kernel figures of one attention
# projection tail, tests/layout_models.attention_split at BERT-base size [8, 128, 768], for Q/V
# (perm 0,2,1,3) and K (perm 0,2,3,1) in float32 and float16: stock ORT (Add, Transpose) against
# the stitched view kernel — GPU time, DRAM bytes and L2 write sectors per launch.
#   bash scripts/ncu_views.sh
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1 ONNXSTITCH_LIBRARY=$PWD/.carry/libonnxstitch_ops.so ONNXSTITCH_CACHE=/tmp/onnxstitch-cache
OUT=${OUT:-/tmp/onnxstitch-out}; mkdir -p "$OUT"
for dt in 1 10; do for p in 0,2,1,3 0,2,3,1; do
python3 - $dt $p <<'PY'
import sys, onnx, layout_models as lm, onnxstitch
dt=int(sys.argv[1]); perm=tuple(int(x) for x in sys.argv[2].split(","))
m,_=lm.attention_split(12,64,perm,dt)
tag=f"{dt}-{''.join(map(str,perm))}"
onnx.save(m,f"/tmp/v{tag}.onnx")
r=onnxstitch.optimize(m,shapes={"batch":[8],"seq":[128]})
onnx.save(r.model,f"/tmp/v{tag}.s.onnx")
PY
tag="$dt-${p//,/}"
for w in v$tag v$tag.s; do
ncu --csv --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum,lts__t_sectors_op_write.sum python3 scripts/run_model.py /tmp/$w.onnx --shape batch=8 --shape seq=128 --iters 3 > /tmp/views-$w.csv 2>&1
echo "== $w"; grep -E 'gpu__time|dram__bytes|lts__t' /tmp/views-$w.csv | tail -9 | awk -F'","' '{print substr($5,1,60), $13, $NF}' | cut -c1-160
done; done; done
