#!/usr/bin/env bash
# Build scripts/cutlass_gemm.cu for sm_90a in every configuration it measures (issue 38), here on
# the CPU machine (nvcc and the nvidia-cutlass wheel's headers; no GPU needed), into .cutlass/
# (ignored; carry it); the headers come from `pip install nvidia-cutlass`. Then on the GPU: bash scripts/build_cutlass_gemm.sh --run  (times each at
# BERT-base's and a TinyLlama layer's shapes; torch's cuBLAS at the same shapes, same machine).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cutlass
bert="1024 2304 768 1024 768 768 1024 3072 768 1024 768 3072"
llama="2048 2560 2048 2048 2048 2048 2048 11264 2048 2048 2048 5632"
if [ "${1:-}" = --run ]; then
  for exe in "$out"/cutlass_gemm_*; do "$exe" $bert $llama || echo "$exe failed"; done
  exit 0
fi
grep -qx '/.cutlass/' .git/info/exclude 2>/dev/null || echo '/.cutlass/' >> .git/info/exclude
mkdir -p "$out"
root=$(python3 -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source
flags=(-std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I"$root/include" -I"$root/tools/util/include"
       -DNDEBUG -cudart static)
pids=()
for f16 in 0 1; do for epi in 0 2; do for tn in 128 64; do
  name="$out/cutlass_gemm_$( [ $f16 = 1 ] && echo f16 || echo f32 )_e${epi}_n${tn}"
  nvcc "${flags[@]}" -DCONFIG_F16=$f16 -DCONFIG_EPI=$epi -DCONFIG_TN=$tn scripts/cutlass_gemm.cu -o "$name" &
  pids+=($!)
  if [ ${#pids[@]} -ge "${JOBS:-2}" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done; done; done
wait
ls -la "$out"
