"""Why ORT cannot capture a (stitched) model in a CUDA graph: makes the session with CUDA graphs
on at ORT's verbose log (its node placements: which nodes went to the CPU), runs it three times
with inputs and outputs bound on the device (the third run replays the capture), and prints the
placement lines, the first failing run's error and, where the runs succeed, whether the replay
gives the plain run's outputs. A GPU script (scripts/gpu_wave.sh capture).

    python3 scripts/capture_probe.py stitched.onnx --shape batch=8,sequence=128
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from onnxstitch import sizes  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402
from onnxstitch.runtime import session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--shape", default="")
    args = ap.parse_args()
    import onnxruntime as ort

    model = onnx.load(args.model, load_external_data=False)
    given = sizes.resolve(model, sizes.parse([args.shape]))  # (read as optimize and bench read --shape)
    feeds = random_feeds(model, seed=0, dim_values=given.dims, overrides=given.inputs)
    log_path = tempfile.mktemp(suffix=".log")
    # ORT logs to stderr: send fd 2 to a file while the session is made, then read it back.
    saved = os.dup(2)
    with open(log_path, "w") as f:
        os.dup2(f.fileno(), 2)
        try:
            so = ort.SessionOptions()
            so.log_severity_level = 0
            try:
                sess = session(args.model, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"}),
                                                      "CPUExecutionProvider"], sess_options=so)
                made = ""
            except Exception as e:  # noqa: BLE001 - what ORT says is the finding
                sess, made = None, str(e).splitlines()[0]
        finally:
            os.dup2(saved, 2)
    text = open(log_path).read()
    os.unlink(log_path)
    for line in text.splitlines():
        if re.search(r"placed on|Node placements|graph capture|cuda graph|CUDA Graph|Memcpy", line, re.I):
            print(line[:400])
    cpu = re.findall(r"Node\(s\) placed on \[CPUExecutionProvider\][^\n]*\n((?:[^\n]*\n){0,60})", text)
    for block in cpu:
        print("CPU nodes:\n" + block)
    if sess is None:
        print("session not made:", made)
        return 1
    names = [o.name for o in sess.get_outputs()]
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
    for n in names:
        binding.bind_output(n, "cuda", 0)
    outs = []
    for i in range(3):
        try:
            sess.run_with_iobinding(binding)
            outs.append([o.numpy() for o in binding.get_outputs()])
            print(f"run {i}: ok")
        except Exception as e:  # noqa: BLE001
            print(f"run {i}: failed: {str(e).splitlines()[0][:600]}")
            return 1
    worst = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
                for a, b in zip(outs[0], outs[2]))
    print(f"replayed: largest difference from the first run {worst:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
