#!/usr/bin/env bash
# On the GPU machine: deploy as a user without a compiler does. Installs the wheel built on the
# CPU machine (carried in .whl/) into a fresh folder, hides every C/C++ compiler, checks that
# onnxstitch and its custom-op library come from the wheel, optimizes a small transformer-style
# block into a bundle (optimize --bundle) with the wheel's onnxstitch, runs the bundle on the CUDA
# EP from Python through the bundle's library (against stock ORT; fused nodes must run on CUDA),
# then, where g++ is there, builds examples/cpp/run_stitched against the ORT headers carried in
# .whl/ort-include and the libonnxruntime of the staged onnxruntime-gpu, and runs the bundle with it.
# Logs under $OUT (gpu_deploy.log, the bundle's README, ORT profiles).
#   here (the wheel of the last commit, headers from where onnxstitch finds them):
#          rm -rf .whl /tmp/onnxstitch-src && mkdir /tmp/onnxstitch-src && git archive HEAD | tar x -C /tmp/onnxstitch-src \
#          && python3 -m pip wheel -q --no-deps -w .whl /tmp/onnxstitch-src && cp -rL "$(python3 -c \
#            'from onnxstitch.runtime.build import find_ort_include as f; print(f())')" .whl/ort-include
#   there: bash scripts/gpu_deploy.sh                       (carry .whl; staged packages in /tmp/site)
set -uo pipefail
OUT=${OUT:-/tmp/onnxstitch-out}
mkdir -p "$OUT"
log="$OUT/gpu_deploy.log"
: > "$log"
repo=$PWD
staged=${STAGED_SITE:-/tmp/site}  # onnxruntime-gpu and mip (../shared/gpu/stage.sh)
work=/tmp/onnxstitch-deploy
rm -rf "$work" && mkdir -p "$work/site" "$work/nocc" "$work/cache"
status=0
say() { echo "== $*" | tee -a "$log"; }
step() {  # step NAME COMMAND...: run, log, remember a failure
  say "$1"; shift
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "!! failed (exit $rc)" | tee -a "$log"; status=1; }
  return "$rc"
}

whl=$(ls "$repo"/.whl/onnxstitch-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || { echo "no .whl/onnxstitch-*.whl: build it on the CPU machine and carry .whl (see the header)" | tee -a "$log"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 --version; echo "wheel $(basename "$whl")"; } 2>&1 | tee -a "$log"
step "install the wheel into $work/site" python3 -m pip install -q --no-deps --no-index --target "$work/site" "$whl" || exit 1

# A PATH of links to every command but the C/C++ compilers.
IFS=: read -ra path_dirs <<< "$PATH"
for d in "${path_dirs[@]}"; do
  for f in "$d"/*; do
    n=${f##*/}
    case "$n" in g++*|gcc*|c++*|cc|clang*|*-g++*|*-gcc*|*-c++*|nvcc) continue ;; esac
    [ -e "$work/nocc/$n" ] || ln -s "$f" "$work/nocc/$n"
  done
done
# The user's environment: the wheel and the staged packages only (not this checkout), no
# compiler, an empty cache, no library override. Python by its own path (a venv's stays one).
py=$(command -v python3)
user() { (cd "$work" && env -u ONNXSTITCH_LIBRARY -u CXX PATH="$work/nocc" PYTHONPATH="$work/site:$staged" \
          ONNXSTITCH_CACHE="$work/cache" PYTHONUNBUFFERED=1 "$@"); }
check=$repo/scripts/deploy_check.py
step "onnxstitch and its library come from the wheel, no compiler" user "$py" "$check" installed "$work/site"
step "a small model" user "$py" "$check" model "$work/block.onnx"
step "optimize --bundle" user "$py" -m onnxstitch.cli optimize "$work/block.onnx" --bundle "$work/bundle" \
  --shape batch=8,seq=128
ls -l "$work/bundle" 2>&1 | tee -a "$log"
cp "$work/bundle/README.txt" "$OUT/bundle_README.txt" 2>/dev/null
cmp "$work/bundle/libonnxstitch_ops.so" "$work/site/onnxstitch/runtime/lib/libonnxstitch_ops.so" \
  && say "the bundle's library is the wheel's" || { say "the bundle's library is NOT the wheel's"; status=1; }
step "the bundle from Python on the CUDA EP" user "$py" "$check" run "$work/bundle/block.stitched.onnx" \
  "$work/bundle/libonnxstitch_ops.so" "$work/block.onnx" --dim batch=4 --dim seq=64

# C++: the real PATH (the program is built here, as its user would on their build machine).
if command -v "${CXX:-g++}" >/dev/null; then
  capi=$staged/onnxruntime/capi
  ls "$capi" 2>&1 | tee -a "$log"
  if step "build examples/cpp/run_stitched" env ORT_INCLUDE_DIR="$repo/.whl/ort-include" ORT_LIB_DIR="$capi" \
      bash "$repo/examples/cpp/build.sh" "$work/cpp"; then
    cudalibs=$(user "$py" "$check" cuda-lib-dirs 2>>"$log" | tail -1)
    say "CUDA libraries for the C++ program: $cudalibs"
    step "run_stitched on the bundle (CUDA EP, library registered)" env LD_LIBRARY_PATH="$cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$work/cpp/run_stitched" "$work/bundle/block.stitched.onnx" --library "$work/bundle/libonnxstitch_ops.so" \
      --dim batch=4 --dim seq=64 --runs 20 --profile "$OUT/cpp_profile"
    prof=$(ls -t "$OUT"/cpp_profile*.json 2>/dev/null | head -1)
    [ -n "$prof" ] && step "fused nodes ran on CUDA in the C++ run" user "$py" "$check" profile "$prof"
    step "run_stitched on the original model (CUDA EP, stock)" env LD_LIBRARY_PATH="$cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$work/cpp/run_stitched" "$work/block.onnx" --dim batch=4 --dim seq=64 --runs 20
  fi
else
  say "no ${CXX:-g++} on this machine: the C++ step is skipped"
fi
say "gpu_deploy: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
