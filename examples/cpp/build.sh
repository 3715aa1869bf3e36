#!/usr/bin/env bash
# Build examples/cpp/run_stitched.cc against ONNX Runtime's C++ headers and the
# libonnxruntime that the onnxruntime (or onnxruntime-gpu) Python wheel ships.
#
#   bash examples/cpp/build.sh [OUT_DIR]        → OUT_DIR/run_stitched (default build/cpp)
#
# Headers: $ORT_INCLUDE_DIR, else where onnxstitch finds them (onnxstitch.runtime.build:
# a system install or Debian's libonnxruntime-dev). Library: $ORT_LIB_DIR (a folder holding
# libonnxruntime.so.*), else the onnxruntime package's capi/ folder. Compiler: $CXX or g++.
# Then: OUT_DIR/run_stitched bundle/model.stitched.onnx --library bundle/libonnxstitch_ops.so
set -euo pipefail
out=${1:-build/cpp}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
inc=${ORT_INCLUDE_DIR:-$("$py" -c 'from onnxstitch.runtime.build import find_ort_include; print(find_ort_include())')}
capi=${ORT_LIB_DIR:-$("$py" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')}
ort=$(find "$capi" -maxdepth 1 -name 'libonnxruntime.so*' | sort | tail -1)
[ -n "$ort" ] || { echo "build.sh: no libonnxruntime.so* in $capi; set ORT_LIB_DIR" >&2; exit 2; }
[ -f "$inc/onnxruntime_cxx_api.h" ] || { echo "build.sh: no onnxruntime_cxx_api.h in $inc; set ORT_INCLUDE_DIR" >&2; exit 2; }
# The wheel ships libonnxruntime.so.<version> alone, while the program asks the loader for its
# soname, libonnxruntime.so.1; and ONNX Runtime loads its providers (CUDA) from the folder it
# was loaded from. A folder of links to capi's libraries, on the program's rpath, gives both.
mkdir -p "$out/ortlib"
lib=$(cd "$out/ortlib" && pwd)
for f in "$capi"/lib*.so*; do ln -sf "$f" "$lib/"; done
ln -sf "$ort" "$lib/libonnxruntime.so.1"
"${CXX:-g++}" -O2 -std=c++17 -Wall -Wextra -I"$inc" "$here/run_stitched.cc" -o "$out/run_stitched" \
  "$lib/libonnxruntime.so.1" -Wl,-rpath,"$lib"
echo "$out/run_stitched (headers $inc, $(basename "$ort") from $capi)"
