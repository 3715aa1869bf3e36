"""Peak RSS of a process that only starts what optimize's GPU stages start: onnxruntime's CUDA EP
(a one-node session, run once), CuPy's device and NVRTC, and the onnxstitch library in a session.
The floor under optimize's own peak on this machine (issue 41's weights + 1.5 GB is read against
it). Prints one JSON line."""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    from onnx import TensorProto, helper

    import onnxruntime as ort

    marks = {"python + numpy": peak_mb()}
    g = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    ort.preload_dlls()
    marks["import onnxruntime"] = peak_mb()
    sess = ort.InferenceSession(model, providers=["CUDAExecutionProvider"])
    sess.run(None, {"x": np.ones((64, 64), np.float32)})
    marks["CUDA EP session, one MatMul run"] = peak_mb()
    import cupy

    cupy.RawKernel('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1; }', "k")(
        (1,), (32,), (cupy.zeros(32, cupy.float32),))
    marks["+ CuPy, an NVRTC kernel"] = peak_mb()
    from onnxstitch.runtime import session

    session(model, providers=["CUDAExecutionProvider"]).run(None, {"x": np.ones((64, 64), np.float32)})
    marks["+ the onnxstitch library's session"] = peak_mb()
    print(json.dumps({k: round(v) for k, v in marks.items()}))


if __name__ == "__main__":
    main()
