#!/usr/bin/env python3
"""A float32 ONNX model in float16, for timing where the zoo's float16 export (torch's
module.half(), scripts/build_zoo.py) cannot be made: the GPU machine has no torch. ONNX
Runtime's own converter (onnxruntime.transformers.float16) rewrites every float32 initializer,
input, output and value to float16, clamping constants to float16's range (BERT's mask fill,
float32's minimum, becomes -65504 as torch writes it in half). The graph keeps the float32
export's structure: attention cores, LayerNormalization and GELU as that exporter wrote them.

    python3 scripts/half_model.py IN.onnx OUT.onnx
"""
from __future__ import annotations

import sys

import onnx


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(sys.argv[1]), keep_io_types=False)
    onnx.save(model, sys.argv[2])
    print(f"{sys.argv[2]}: float16, {len(model.graph.node)} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
