// The few cuBLASLt types, values and entry points the gemm scheme uses, resolved at run time.
//
// Why not cublasLt.h: building the library must not need the CUDA toolkit, and linking
// libcublasLt would stop it from loading on machines without it. ONNX Runtime's CUDA EP has
// already loaded libcublasLt into the process, so it is dlopen()ed at the first GEMM (no
// dlclose: the library stays for the process, as ORT keeps it). The values below are those of
// cublasLt.h / cublas_api.h / library_types.h of cuBLAS 13.1 (the nvidia-cublas CUDA 13 wheel);
// they are part of cuBLASLt's ABI and have not changed since cuBLAS 11. The enum parameters of
// the prototypes are passed as int, which is what a C enum of these values is on every ABI the
// library builds for. tests/test_gemm.py compiles a check of every value and size against the
// real header where it is installed (tests/gemm_header_check.cc).
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace onnxstitch {
namespace lt {

using Status = int;  // cublasStatus_t
typedef struct cublasLtContext* Handle;
typedef struct cublasLtMatmulDescOpaque* MatmulDesc;
typedef struct cublasLtMatrixLayoutOpaque* Layout;
typedef struct cublasLtMatmulPreferenceOpaque* Preference;
typedef struct cublasLtMatrixTransformDescOpaque* TransformDesc;

constexpr Status kSuccess = 0;                 // CUBLAS_STATUS_SUCCESS
constexpr int kComputeF32 = 68;                // CUBLAS_COMPUTE_32F
constexpr int kComputeF32FastTf32 = 77;        // CUBLAS_COMPUTE_32F_FAST_TF32
constexpr int kR32F = 0;                       // CUDA_R_32F
constexpr int kR16F = 2;                       // CUDA_R_16F
constexpr int32_t kOpN = 0;                    // CUBLAS_OP_N
constexpr int32_t kOpT = 1;                    // CUBLAS_OP_T
constexpr int kDescTransA = 3;                 // CUBLASLT_MATMUL_DESC_TRANSA (int32_t)
constexpr int kDescTransB = 4;                 // CUBLASLT_MATMUL_DESC_TRANSB (int32_t)
constexpr int kDescEpilogue = 7;               // CUBLASLT_MATMUL_DESC_EPILOGUE (uint32_t)
constexpr int kDescBiasPointer = 8;            // CUBLASLT_MATMUL_DESC_BIAS_POINTER (const void*)
constexpr uint32_t kEpilogueDefault = 1;       // CUBLASLT_EPILOGUE_DEFAULT
constexpr uint32_t kEpilogueBias = 4;          // CUBLASLT_EPILOGUE_BIAS
constexpr uint32_t kEpilogueReluBias = 6;      // CUBLASLT_EPILOGUE_RELU_BIAS
constexpr uint32_t kEpilogueGeluBias = 36;     // CUBLASLT_EPILOGUE_GELU_BIAS
constexpr uint32_t kEpilogueRelu = 2;          // CUBLASLT_EPILOGUE_RELU
constexpr uint32_t kEpilogueGelu = 32;         // CUBLASLT_EPILOGUE_GELU
constexpr int kLayoutBatchCount = 5;          // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT (int32_t)
constexpr int kLayoutStridedBatchOffset = 6;  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET (int64_t)
constexpr int kTransformDescTransA = 2;       // CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA (int32_t)
constexpr int kPrefMaxWorkspaceBytes = 1;      // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64_t)
constexpr int kPrefMinAlignmentA = 5;          // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (uint32_t)
constexpr int kPrefMinAlignmentB = 6;          // ..._B_BYTES
constexpr int kPrefMinAlignmentC = 7;          // ..._C_BYTES
constexpr int kPrefMinAlignmentD = 8;          // ..._D_BYTES
constexpr int kAlgoConfigId = 0;               // CUBLASLT_ALGO_CONFIG_ID (int32_t)
constexpr int kAlgoConfigTileId = 1;           // CUBLASLT_ALGO_CONFIG_TILE_ID (uint32_t)
constexpr int kAlgoConfigSplitK = 2;           // CUBLASLT_ALGO_CONFIG_SPLITK_NUM (uint32_t)
constexpr int kAlgoConfigReduction = 3;        // CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME (uint32_t)
constexpr int kAlgoCapSplitK = 0;              // CUBLASLT_ALGO_CAP_SPLITK_SUPPORT (int32_t)
constexpr int kAlgoCapReductionMask = 1;       // CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK (uint32_t)
constexpr uint32_t kReductionInplace = 1;      // CUBLASLT_REDUCTION_SCHEME_INPLACE
constexpr uint32_t kReductionComputeType = 2;  // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE

struct MatmulAlgo {  // cublasLtMatmulAlgo_t
  uint64_t data[8];
};

struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  MatmulAlgo algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};
static_assert(sizeof(HeuristicResult) == 96, "cublasLtMatmulHeuristicResult_t is 96 bytes");

// Entry points, each with its prototype in cublasLt.h.
struct Api {
  Status (*Create)(Handle*) = nullptr;
  Status (*Destroy)(Handle) = nullptr;
  const char* (*GetStatusName)(Status) = nullptr;
  const char* (*GetStatusString)(Status) = nullptr;
  size_t (*GetVersion)() = nullptr;
  Status (*MatmulDescCreate)(MatmulDesc*, int compute, int scale) = nullptr;
  Status (*MatmulDescDestroy)(MatmulDesc) = nullptr;
  Status (*MatmulDescSetAttribute)(MatmulDesc, int attr, const void* buf, size_t size) = nullptr;
  Status (*MatrixLayoutCreate)(Layout*, int type, uint64_t rows, uint64_t cols, int64_t ld) = nullptr;
  Status (*MatrixLayoutDestroy)(Layout) = nullptr;
  Status (*MatmulPreferenceCreate)(Preference*) = nullptr;
  Status (*MatmulPreferenceDestroy)(Preference) = nullptr;
  Status (*MatmulPreferenceSetAttribute)(Preference, int attr, const void* buf, size_t size) = nullptr;
  Status (*MatmulAlgoGetHeuristic)(Handle, MatmulDesc, Layout a, Layout b, Layout c, Layout d, Preference,
                                   int requested, HeuristicResult* results, int* returned) = nullptr;
  Status (*Matmul)(Handle, MatmulDesc, const void* alpha, const void* a, Layout, const void* b, Layout,
                   const void* beta, const void* c, Layout, void* d, Layout, const MatmulAlgo* algo,
                   void* workspace, size_t workspace_bytes, void* stream) = nullptr;

  // The algorithm's configuration (split-K variants of the heuristic's results: gemm_algos.h).
  Status (*MatmulAlgoCheck)(Handle, MatmulDesc, Layout a, Layout b, Layout c, Layout d, const MatmulAlgo*,
                            HeuristicResult*) = nullptr;
  Status (*MatmulAlgoCapGetAttribute)(const MatmulAlgo*, int attr, void* buf, size_t size, size_t* written) = nullptr;
  Status (*MatmulAlgoConfigSetAttribute)(MatmulAlgo*, int attr, const void* buf, size_t size) = nullptr;
  Status (*MatmulAlgoConfigGetAttribute)(const MatmulAlgo*, int attr, void* buf, size_t size, size_t* written) = nullptr;

  Status (*MatrixLayoutSetAttribute)(Layout, int, const void*, size_t) = nullptr;
  Status (*MatrixTransformDescCreate)(TransformDesc*, int scale_type) = nullptr;
  Status (*MatrixTransformDescDestroy)(TransformDesc) = nullptr;
  Status (*MatrixTransformDescSetAttribute)(TransformDesc, int, const void*, size_t) = nullptr;
  // C = alpha·op(A) + beta·op(B): the conv scheme's layout changes (B unused, beta 0).
  Status (*MatrixTransform)(Handle, TransformDesc, const void* alpha, const void* a, Layout, const void* beta,
                            const void* b, Layout, void* c, Layout, void* stream) = nullptr;

  // Finds the libcublasLt ORT loaded (13, else 12), else loads one, and resolves every entry
  // point. Returns "" on success, else why not.
  std::string Load() {
    const char* names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
    void* lib = nullptr;
    for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
      for (const char* name : names) {
        if (lib == nullptr) lib = dlopen(name, flags);
      }
    }
    if (lib == nullptr) {
      const char* why = dlerror();
      return std::string("cannot load cuBLASLt (libcublasLt.so.13 or .12: ") + (why ? why : "not found") +
             "); ONNX Runtime's CUDA EP normally loads it";
    }
    struct Want {
      const char* name;
      void** slot;
    };
    const Want wants[] = {
        {"cublasLtCreate", reinterpret_cast<void**>(&Create)},
        {"cublasLtDestroy", reinterpret_cast<void**>(&Destroy)},
        {"cublasLtGetStatusName", reinterpret_cast<void**>(&GetStatusName)},
        {"cublasLtGetStatusString", reinterpret_cast<void**>(&GetStatusString)},
        {"cublasLtGetVersion", reinterpret_cast<void**>(&GetVersion)},
        {"cublasLtMatmulDescCreate", reinterpret_cast<void**>(&MatmulDescCreate)},
        {"cublasLtMatmulDescDestroy", reinterpret_cast<void**>(&MatmulDescDestroy)},
        {"cublasLtMatmulDescSetAttribute", reinterpret_cast<void**>(&MatmulDescSetAttribute)},
        {"cublasLtMatrixLayoutCreate", reinterpret_cast<void**>(&MatrixLayoutCreate)},
        {"cublasLtMatrixLayoutDestroy", reinterpret_cast<void**>(&MatrixLayoutDestroy)},
        {"cublasLtMatmulPreferenceCreate", reinterpret_cast<void**>(&MatmulPreferenceCreate)},
        {"cublasLtMatmulPreferenceDestroy", reinterpret_cast<void**>(&MatmulPreferenceDestroy)},
        {"cublasLtMatmulPreferenceSetAttribute", reinterpret_cast<void**>(&MatmulPreferenceSetAttribute)},
        {"cublasLtMatmulAlgoGetHeuristic", reinterpret_cast<void**>(&MatmulAlgoGetHeuristic)},
        {"cublasLtMatmul", reinterpret_cast<void**>(&Matmul)},
        {"cublasLtMatmulAlgoCheck", reinterpret_cast<void**>(&MatmulAlgoCheck)},
        {"cublasLtMatmulAlgoCapGetAttribute", reinterpret_cast<void**>(&MatmulAlgoCapGetAttribute)},
        {"cublasLtMatmulAlgoConfigSetAttribute", reinterpret_cast<void**>(&MatmulAlgoConfigSetAttribute)},
        {"cublasLtMatmulAlgoConfigGetAttribute", reinterpret_cast<void**>(&MatmulAlgoConfigGetAttribute)},
        {"cublasLtMatrixLayoutSetAttribute", reinterpret_cast<void**>(&MatrixLayoutSetAttribute)},
        {"cublasLtMatrixTransformDescCreate", reinterpret_cast<void**>(&MatrixTransformDescCreate)},
        {"cublasLtMatrixTransformDescDestroy", reinterpret_cast<void**>(&MatrixTransformDescDestroy)},
        {"cublasLtMatrixTransformDescSetAttribute", reinterpret_cast<void**>(&MatrixTransformDescSetAttribute)},
        {"cublasLtMatrixTransform", reinterpret_cast<void**>(&MatrixTransform)},
    };
    for (const Want& w : wants) {
      *w.slot = dlsym(lib, w.name);
      if (*w.slot == nullptr) return std::string("cuBLASLt has no ") + w.name;
    }
    // Major version 11 on: the epilogues, compute types and structs above.
    if (GetVersion() < 110000) return "cuBLASLt " + std::to_string(GetVersion()) + " is older than 11.0";
    return "";
  }

  std::string StatusText(Status s) const {
    const char* name = GetStatusName ? GetStatusName(s) : nullptr;
    const char* text = GetStatusString ? GetStatusString(s) : nullptr;
    std::string out = name ? name : "cublasStatus_t " + std::to_string(s);
    if (text) out += std::string(" (") + text + ")";
    return out;
  }
};

}  // namespace lt
}  // namespace onnxstitch
