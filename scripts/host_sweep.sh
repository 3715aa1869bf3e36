#!/usr/bin/env bash
# Every case of the host-kernel sweeps (tests/conftest.py samples one in three by default): the
# generated kernels for every op, dtype and shape, compiled with g++ and run on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
ONNXSTITCH_FULL_SWEEP=1 python3 -m pytest -q tests/test_host_kernels.py tests/test_attention_host.py \
  tests/test_attention_decoder.py "$@"
