// onnxstitch runtime: the FusedKernel kernel's entry points (fused_kernel.cc), which the op's
// registration (custom_op.cc) hands to ONNX Runtime. Each returns an OrtStatus naming the node
// on failure and lets nothing escape.
#pragma once

#include <onnxruntime_c_api.h>

namespace onnxstitch {

// The op's type, the prefix of every message ("FusedKernel node 'name' (kernel k): ...").
inline constexpr const char* kOpType = "FusedKernel";

// A kernel for the node `info` describes, read from its attributes, into `*kernel`.
OrtStatus* CreateKernel(const OrtApi* api, const OrtKernelInfo* info, void** kernel);
// One run of the node on ORT's CUDA stream.
OrtStatus* ComputeKernel(void* kernel, OrtKernelContext* context);
void DestroyKernel(void* kernel) noexcept;

}  // namespace onnxstitch
