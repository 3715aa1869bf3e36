// cuDNN's backend (graph) API, declared by hand and resolved at run time, as cublaslt_api.h does
// for cuBLASLt: the library builds with no cuDNN headers, loads where no GPU is, and uses the
// libcudnn ONNX Runtime's CUDA EP already loaded into the process. Only what the library epilogues
// use is declared; every value is checked against the real cudnn_graph.h by
// tests/cudnn_header_check.cc. The values are cuDNN 9's, stable across its releases.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace onnxstitch {
namespace dnn {

using Status = int;                                  // cudnnStatus_t
typedef struct cudnnContext* Handle;                 // cudnnHandle_t
typedef void* Descriptor;                            // cudnnBackendDescriptor_t
constexpr Status kSuccess = 0;
constexpr Status kNotSupported = 3000;

// cudnnDataType_t
constexpr int kFloat = 0, kHalf = 2, kBfloat16 = 9;
// cudnnBackendAttributeType_t
constexpr int kTypeHandle = 0, kTypeDataType = 1, kTypeBoolean = 2, kTypeInt64 = 3, kTypeFloat = 4, kTypeDouble = 5,
              kTypeVoidPtr = 6, kTypeConvolutionMode = 7, kTypeHeurMode = 8, kTypePointwiseMode = 14,
              kTypeBackendDescriptor = 15, kTypeChar = 24;
// cudnnBackendDescriptorType_t
constexpr int kPointwiseDescriptor = 0, kConvolutionDescriptor = 1, kEngineCfgDescriptor = 3,
              kEngineHeurDescriptor = 4, kExecutionPlanDescriptor = 5, kOperationConvolutionForwardDescriptor = 10,
              kOperationPointwiseDescriptor = 13, kOperationGraphDescriptor = 15, kVariantPackDescriptor = 16,
              kTensorDescriptor = 17, kMatmulDescriptor = 18, kOperationMatmulDescriptor = 19;
// cudnnBackendAttributeName_t
constexpr int kAttrPointwiseMode = 0, kAttrPointwiseMathPrec = 1, kAttrPointwiseReluLowerClip = 3,
              kAttrPointwiseReluUpperClip = 4, kAttrPointwiseReluLowerClipSlope = 5, kAttrPointwiseSwishBeta = 8;
constexpr int kAttrConvolutionCompType = 100, kAttrConvolutionConvMode = 101, kAttrConvolutionDilations = 102,
              kAttrConvolutionFilterStrides = 103, kAttrConvolutionPostPaddings = 104,
              kAttrConvolutionPrePaddings = 105, kAttrConvolutionSpatialDims = 106;
constexpr int kAttrEngineHeurMode = 200, kAttrEngineHeurOperationGraph = 201, kAttrEngineHeurResults = 202;
constexpr int kAttrEngineCfgWorkspaceSize = 303;
constexpr int kAttrExecutionPlanHandle = 400, kAttrExecutionPlanEngineConfig = 401,
              kAttrExecutionPlanWorkspaceSize = 402, kAttrExecutionPlanJsonRepresentation = 405;
constexpr int kAttrConvolutionForwardAlpha = 700, kAttrConvolutionForwardBeta = 701,
              kAttrConvolutionForwardConvDesc = 702, kAttrConvolutionForwardW = 703, kAttrConvolutionForwardX = 704,
              kAttrConvolutionForwardY = 705;
constexpr int kAttrPointwisePwDescriptor = 750, kAttrPointwiseXDesc = 751, kAttrPointwiseBDesc = 752,
              kAttrPointwiseYDesc = 753;
constexpr int kAttrOperationGraphHandle = 800, kAttrOperationGraphOps = 801;
constexpr int kAttrTensorByteAlignment = 900, kAttrTensorDataType = 901, kAttrTensorDimensions = 902,
              kAttrTensorStrides = 903, kAttrTensorUniqueId = 906, kAttrTensorIsVirtual = 907,
              kAttrTensorIsByValue = 908;
constexpr int kAttrVariantPackUniqueIds = 1000, kAttrVariantPackDataPointers = 1001, kAttrVariantPackWorkspace = 1003;
constexpr int kAttrMatmulCompType = 1500;
constexpr int kAttrMatmulADesc = 1520, kAttrMatmulBDesc = 1521, kAttrMatmulCDesc = 1522, kAttrMatmulDesc = 1523;
// cudnnPointwiseMode_t
constexpr int kPointwiseAdd = 0, kPointwiseMul = 1, kPointwiseMin = 2, kPointwiseMax = 3, kPointwiseIdentity = 21,
              kPointwiseReluFwd = 100, kPointwiseTanhFwd = 101, kPointwiseSigmoidFwd = 102, kPointwiseGeluFwd = 104, kPointwiseSwishFwd = 106,
              kPointwiseGeluApproxTanhFwd = 107;
// cudnnBackendHeurMode_t, cudnnConvolutionMode_t
constexpr int kHeurModeFallback = 2, kHeurModeA = 3;
constexpr int kCrossCorrelation = 1;

struct Api {
  size_t (*GetVersion)() = nullptr;
  const char* (*GetErrorString)(Status) = nullptr;
  void (*GetLastErrorString)(char*, size_t) = nullptr;
  Status (*Create)(Handle*) = nullptr;
  Status (*Destroy)(Handle) = nullptr;
  Status (*SetStream)(Handle, void*) = nullptr;
  Status (*BackendCreateDescriptor)(int, Descriptor*) = nullptr;
  Status (*BackendDestroyDescriptor)(Descriptor) = nullptr;
  Status (*BackendFinalize)(Descriptor) = nullptr;
  Status (*BackendSetAttribute)(Descriptor, int, int, int64_t, const void*) = nullptr;
  Status (*BackendGetAttribute)(Descriptor, int, int, int64_t, int64_t*, void*) = nullptr;
  Status (*BackendExecute)(Handle, Descriptor, Descriptor) = nullptr;

  // Finds the libcudnn ONNX Runtime loaded (9), else loads one, and resolves every entry point.
  // Returns "" on success, else why not.
  std::string Load() {
    void* lib = nullptr;
    for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
      if (lib == nullptr) lib = dlopen("libcudnn.so.9", flags);
    }
    if (lib == nullptr) {
      const char* why = dlerror();
      return std::string("cannot load cuDNN (libcudnn.so.9: ") + (why ? why : "not found") +
             "); ONNX Runtime's CUDA EP normally loads it";
    }
    struct Want {
      const char* name;
      void** slot;
    };
    const Want wants[] = {
        {"cudnnGetVersion", reinterpret_cast<void**>(&GetVersion)},
        {"cudnnGetErrorString", reinterpret_cast<void**>(&GetErrorString)},
        {"cudnnGetLastErrorString", reinterpret_cast<void**>(&GetLastErrorString)},
        {"cudnnCreate", reinterpret_cast<void**>(&Create)},
        {"cudnnDestroy", reinterpret_cast<void**>(&Destroy)},
        {"cudnnSetStream", reinterpret_cast<void**>(&SetStream)},
        {"cudnnBackendCreateDescriptor", reinterpret_cast<void**>(&BackendCreateDescriptor)},
        {"cudnnBackendDestroyDescriptor", reinterpret_cast<void**>(&BackendDestroyDescriptor)},
        {"cudnnBackendFinalize", reinterpret_cast<void**>(&BackendFinalize)},
        {"cudnnBackendSetAttribute", reinterpret_cast<void**>(&BackendSetAttribute)},
        {"cudnnBackendGetAttribute", reinterpret_cast<void**>(&BackendGetAttribute)},
        {"cudnnBackendExecute", reinterpret_cast<void**>(&BackendExecute)},
    };
    for (const Want& w : wants) {
      *w.slot = dlsym(lib, w.name);
      if (*w.slot == nullptr) return std::string("cuDNN has no ") + w.name;
    }
    // 9.0 on: the backend values above (8.x numbered some of them differently).
    if (GetVersion() < 90000) return "cuDNN " + std::to_string(GetVersion()) + " is older than 9.0";
    return "";
  }

  // The status's name and cuDNN's last message for this thread.
  std::string StatusText(Status s) const {
    std::string out = GetErrorString ? GetErrorString(s) : "cudnnStatus_t " + std::to_string(s);
    if (GetLastErrorString != nullptr) {
      char message[512] = {0};
      GetLastErrorString(message, sizeof(message));
      if (message[0] != '\0') out += std::string(" (") + message + ")";
    }
    return out;
  }
};

}  // namespace dnn
}  // namespace onnxstitch
