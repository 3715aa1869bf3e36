// onnxstitch runtime: the com.onnxstitch::FusedKernel op as ONNX Runtime sees it — its
// OrtCustomOp (names, variadic typing, the kernel's entry points, shape inference) and the
// library's entry point, RegisterCustomOps. The kernel is fused_kernel.cc's, the shapes
// shape_inference.cc's. Plain C API only: nothing thrown may cross into ORT.
#include <onnxruntime_c_api.h>

#include <cstring>
#include <exception>
#include <string>

#include "kernel_entry.h"
#include "shape_inference.h"

#define STITCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace onnxstitch {
namespace {

constexpr const char* kDomain = "com.onnxstitch";
#ifdef ONNXSTITCH_CPU_EP_FOR_TESTS
// Test build only (tests/test_runtime_build.py): registering for the CPU EP lets a machine
// without a GPU run everything up to the first driver call (attributes, shapes, outputs, errors).
constexpr const char* kProvider = "CPUExecutionProvider";
#else
constexpr const char* kProvider = "CUDAExecutionProvider";
#endif
// Our OrtCustomOp plus the OrtApi it was registered with (InferOutputShapeFn gets no api).
struct OpDef {
  OrtCustomOp op;  // first member: ORT hands back &op, we cast back to OpDef
  const OrtApi* api;
};

OrtStatus* ORT_API_CALL CreateKernelV2(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info,
                                       void** kernel) {
  return CreateKernel(api, info, kernel);
}

OrtStatus* ORT_API_CALL KernelComputeV2(void* op_kernel, OrtKernelContext* context) {
  return ComputeKernel(op_kernel, context);
}

void ORT_API_CALL KernelDestroy(void* op_kernel) { DestroyKernel(op_kernel); }

OrtStatusPtr ORT_API_CALL InferOutputShape(const OrtCustomOp* op, OrtShapeInferContext* ctx) {
  try {
    InferShapes(reinterpret_cast<const OpDef*>(op)->api, ctx);
  } catch (...) {
    // Shapes are an optimisation; a failure here must not break graph resolution.
  }
  return nullptr;  // ORT ignores (and would leak) a returned status
}

const char* ORT_API_CALL GetName(const OrtCustomOp*) { return kOpType; }
const char* ORT_API_CALL GetExecutionProviderType(const OrtCustomOp*) { return kProvider; }
size_t ORT_API_CALL GetTypeCount(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL GetType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // any tensor type
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL GetCharacteristic(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_VARIADIC;
}
OrtMemType ORT_API_CALL GetInputMemoryType(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL GetVariadicMinArity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL GetVariadicHomogeneity(const OrtCustomOp*) { return 0; }  // mixed dtypes

void FillOp(OrtCustomOp* op) {
  std::memset(op, 0, sizeof(*op));
  op->version = ORT_API_VERSION;
  op->CreateKernel = nullptr;  // V2 entry points are used (ORT >= 1.16)
  op->GetName = GetName;
  op->GetExecutionProviderType = GetExecutionProviderType;
  op->GetInputType = GetType;
  op->GetInputTypeCount = GetTypeCount;
  op->GetOutputType = GetType;
  op->GetOutputTypeCount = GetTypeCount;
  op->KernelCompute = nullptr;
  op->KernelDestroy = KernelDestroy;
  op->GetInputCharacteristic = GetCharacteristic;
  op->GetOutputCharacteristic = GetCharacteristic;
  op->GetInputMemoryType = GetInputMemoryType;
  op->GetVariadicInputMinArity = GetVariadicMinArity;
  op->GetVariadicInputHomogeneity = GetVariadicHomogeneity;
  op->GetVariadicOutputMinArity = GetVariadicMinArity;
  op->GetVariadicOutputHomogeneity = GetVariadicHomogeneity;
  op->CreateKernelV2 = CreateKernelV2;
  op->KernelComputeV2 = KernelComputeV2;
  op->InferOutputShapeFn = InferOutputShape;
  // GetStartVersion/GetEndVersion null: since version 1, open ended. In-place/alias maps: none.
}

}  // namespace
}  // namespace onnxstitch

// Entry point ORT calls from SessionOptions.register_custom_ops_library / RegisterCustomOpsLibrary.
STITCH_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace onnxstitch;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // Runtime older than our headers; version 1 of the API still has CreateStatus.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string msg = std::string("onnxstitch: this ONNX Runtime (") + api_base->GetVersionString() +
                            ") is older than the API version " + std::to_string(ORT_API_VERSION) +
                            " the custom-op library was built for";
    return v1 ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  try {
    // The op definition and the domain must outlive every session made from these options; ORT
    // never hands them back, so they are kept for the life of the process (a few hundred bytes
    // per registration).
    auto* def = new OpDef;
    FillOp(&def->op);
    def->api = api;
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* st = api->CreateCustomOpDomain(kDomain, &domain)) return st;
    if (OrtStatus* st = api->CustomOpDomain_Add(domain, &def->op)) return st;
    if (OrtStatus* st = api->AddCustomOpDomain(options, domain)) return st;
    return nullptr;
  } catch (const std::exception& ex) {
    return api->CreateStatus(ORT_FAIL, (std::string("onnxstitch: registering custom ops failed: ") + ex.what()).c_str());
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, "onnxstitch: registering custom ops failed");
  }
}
