# Sourced by the GPU scripts (gpu_check.sh, gpu_attention.sh): the environment they run in on the
# GPU machine (staged packages in /tmp/site, the library built here in .carry/) and
# `gpu_setup LOG`, which records the device and installs onnxstitch without its dependencies.
OUT=${OUT:-/tmp/onnxstitch-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export ONNXSTITCH_LIBRARY=${ONNXSTITCH_LIBRARY:-$PWD/.carry/libonnxstitch_ops.so}
export ONNXSTITCH_CACHE=${ONNXSTITCH_CACHE:-/tmp/onnxstitch-cache}

gpu_setup() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import onnxruntime as o; o.preload_dlls(); print('onnxruntime', o.__version__, o.get_available_providers())"
    # (one install at a time: gpu_wave.sh cnn starts several scripts at once)
    flock /tmp/onnxstitch-setup.lock python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . 2>&1 | tail -2
    # What a pip install leaves: bytecode for what optimize imports (timed runs then measure onnxstitch).
    python3 -c "import onnxstitch.cli.main, onnxstitch.pipeline, onnxruntime.tools.symbolic_shape_infer, sympy, mip"
  } 2>&1 | tee "$1"
}
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}  # the image's site-packages have no bytecode: compile it once, as an install does
unset PYTHONDONTWRITEBYTECODE  # else every process compiles sympy, onnx and ORT's tools again (3.7 s of BERT's optimize)
