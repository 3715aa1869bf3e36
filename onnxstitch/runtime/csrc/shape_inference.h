// onnxstitch runtime: shape inference of the FusedKernel op (shape_inference.cc).
#pragma once

#include <onnxruntime_c_api.h>

namespace onnxstitch {

// The output shapes of one FusedKernel node, where its scheme can tell them from its inputs'
// shapes and attributes (scheme.h: OutputShapes); outputs it cannot size are left untouched.
void InferShapes(const OrtApi* api, OrtShapeInferContext* ctx);

}  // namespace onnxstitch
