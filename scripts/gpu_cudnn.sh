#!/usr/bin/env bash
# On the GPU machine, in one call and with nothing staged: what cuDNN's graph API fuses there
# (scripts/probe_cudnn.cc: GEMMs and convolutions with bias / GELU / ReLU / SiLU / residual
# epilogues, each against its plain call and cuBLASLt, one JSON line per case), or with `gemm`
# which cuBLASLt algorithms win at BERT's shapes (scripts/probe_gemm.cc). cuDNN and
# cuBLASLt come from the machine's own CUDA wheels (torch's), found and loaded as ORT would.
#   there: bash scripts/gpu_cudnn.sh [matmul|conv|mobilenet|all|gemm]     (JSON lines and a log under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/onnxstitch-out}; mkdir -p "$OUT"
what=${1:-all}
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
dirs=$(find "$site/nvidia" \( -name 'libcudnn.so.9' -o -name 'libcublasLt.so.1[23]' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${dirs}${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu_cudnn.log"
probe=probe_cudnn
[ "$what" = gemm ] && probe=probe_gemm
g++ -std=c++17 -O2 -Ionnxstitch/runtime/csrc -Ionnxstitch/schemes/gemm -Iscripts "scripts/$probe.cc" -o "/tmp/$probe" -ldl \
  2>&1 | tee -a "$OUT/gpu_cudnn.log" || exit 1
"/tmp/$probe" "$what" > "$OUT/$probe.jsonl" 2>> "$OUT/gpu_cudnn.log"
status=$?
cat "$OUT/$probe.jsonl" "$OUT/gpu_cudnn.log" | tail -c 11000
exit $status
