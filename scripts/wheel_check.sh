#!/usr/bin/env bash
# The package as a user who downloads it gets it: build the wheel, give it a manylinux tag with
# auditwheel, install it into a virtual environment made new outside the checkout, and run the
# commands a user runs (scripts/wheel_smoke.py) from a folder outside the checkout, so that
# nothing of the source tree can stand in for a file the wheel lacks.
# Usage: bash scripts/wheel_check.sh [WORKDIR]   (CI runs it from .ci/run)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-${TMPDIR:-/tmp}/onnxstitch-wheel-check}"
rm -rf "$work"
mkdir -p "$work/dist" "$work/run"
python3 -m pip wheel -q --no-deps -w "$work/dist" "$root"
raw=("$work"/dist/onnxstitch-*.whl)
# The custom-op library links glibc and libstdc++ only (CUDA is loaded at run time), so no
# library is grafted: the policy is the lowest one its symbol versions allow.
python3 -m auditwheel show "${raw[0]}"
python3 -m auditwheel repair --only-plat --plat "${ONNXSTITCH_MANYLINUX:-manylinux_2_34_x86_64}" \
  -w "$work/wheelhouse" "${raw[0]}"
wheel=("$work"/wheelhouse/onnxstitch-*manylinux*.whl)
echo "wheel: $(basename "${wheel[0]}")"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q "${wheel[0]}[cpu]"
cd "$work/run"  # outside the checkout: only the installed package can be imported
PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" "$root/scripts/wheel_smoke.py" --workdir "$work/run"
