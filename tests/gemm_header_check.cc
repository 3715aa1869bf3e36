// Test only (tests/test_gemm.py compiles it with -fsyntax-only where cuBLASLt's headers are
// installed): every value and layout schemes/gemm/cublaslt_api.h declares by hand against the
// real cublasLt.h.
#include <cublasLt.h>

#include <cstddef>
#include <type_traits>

#include "cublaslt_api.h"

namespace lt = onnxstitch::lt;

static_assert(lt::kSuccess == CUBLAS_STATUS_SUCCESS, "status");
static_assert(lt::kComputeF32 == CUBLAS_COMPUTE_32F, "compute 32F");
static_assert(lt::kComputeF32FastTf32 == CUBLAS_COMPUTE_32F_FAST_TF32, "compute TF32");
static_assert(lt::kR32F == CUDA_R_32F && lt::kR16F == CUDA_R_16F, "data types");
static_assert(lt::kOpN == CUBLAS_OP_N && lt::kOpT == CUBLAS_OP_T, "operations");
static_assert(lt::kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA && lt::kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB, "trans");
static_assert(lt::kDescEpilogue == CUBLASLT_MATMUL_DESC_EPILOGUE, "epilogue attribute");
static_assert(lt::kDescBiasPointer == CUBLASLT_MATMUL_DESC_BIAS_POINTER, "bias attribute");
static_assert(lt::kEpilogueDefault == CUBLASLT_EPILOGUE_DEFAULT && lt::kEpilogueBias == CUBLASLT_EPILOGUE_BIAS, "epilogues");
static_assert(lt::kEpilogueReluBias == CUBLASLT_EPILOGUE_RELU_BIAS, "relu bias");
static_assert(lt::kEpilogueGeluBias == CUBLASLT_EPILOGUE_GELU_BIAS, "gelu bias");
static_assert(lt::kEpilogueRelu == CUBLASLT_EPILOGUE_RELU && lt::kEpilogueGelu == CUBLASLT_EPILOGUE_GELU, "no bias");
static_assert(lt::kPrefMaxWorkspaceBytes == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, "workspace");
static_assert(lt::kPrefMinAlignmentA == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, "alignment A");
static_assert(lt::kPrefMinAlignmentB == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, "alignment B");
static_assert(lt::kPrefMinAlignmentC == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, "alignment C");
static_assert(lt::kPrefMinAlignmentD == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, "alignment D");
static_assert(lt::kLayoutBatchCount == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, "batch count");
static_assert(lt::kLayoutStridedBatchOffset == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, "batch stride");
static_assert(lt::kTransformDescTransA == CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, "transform trans A");
static_assert(lt::kAlgoConfigId == CUBLASLT_ALGO_CONFIG_ID && lt::kAlgoConfigTileId == CUBLASLT_ALGO_CONFIG_TILE_ID, "id");
static_assert(lt::kAlgoConfigSplitK == CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "split-K");
static_assert(lt::kAlgoConfigReduction == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "reduction");
static_assert(lt::kAlgoCapSplitK == CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, "split-K cap");
static_assert(lt::kAlgoCapReductionMask == CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, "reduction cap");
static_assert(lt::kReductionInplace == CUBLASLT_REDUCTION_SCHEME_INPLACE, "inplace");
static_assert(lt::kReductionComputeType == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, "compute type");
static_assert(sizeof(lt::MatmulAlgo) == sizeof(cublasLtMatmulAlgo_t), "algo");
static_assert(sizeof(lt::HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t), "heuristic result");
static_assert(offsetof(lt::HeuristicResult, workspaceSize) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize), "ws");
static_assert(offsetof(lt::HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state), "state");
static_assert(sizeof(cublasComputeType_t) == sizeof(int) && sizeof(cudaDataType_t) == sizeof(int), "enums as int");
static_assert(sizeof(cublasLtMatmulDescAttributes_t) == sizeof(int), "attribute enum as int");
// The prototypes: each entry point assigned from the real function.
static void Prototypes(lt::Api& a) {
  a.GetVersion = &cublasLtGetVersion;
  a.GetStatusName = reinterpret_cast<const char* (*)(lt::Status)>(&cublasLtGetStatusName);
  static_assert(std::is_same<decltype(&cublasLtMatmul),
                             cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                                                cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t,
                                                const void*, const void*, cublasLtMatrixLayout_t, void*,
                                                cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                                                cudaStream_t)>::value, "cublasLtMatmul");
  static_assert(std::is_same<decltype(&cublasLtMatmulAlgoCheck),
                             cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                                const cublasLtMatmulAlgo_t*, cublasLtMatmulHeuristicResult_t*)>::value,
                "cublasLtMatmulAlgoCheck");
  static_assert(std::is_same<decltype(&cublasLtMatmulAlgoCapGetAttribute),
                             cublasStatus_t (*)(const cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoCapAttributes_t, void*,
                                                size_t, size_t*)>::value, "cublasLtMatmulAlgoCapGetAttribute");
  static_assert(std::is_same<decltype(&cublasLtMatmulAlgoConfigSetAttribute),
                             cublasStatus_t (*)(cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoConfigAttributes_t, const void*,
                                                size_t)>::value, "cublasLtMatmulAlgoConfigSetAttribute");
  static_assert(std::is_same<decltype(&cublasLtMatmulAlgoConfigGetAttribute),
                             cublasStatus_t (*)(const cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoConfigAttributes_t, void*,
                                                size_t, size_t*)>::value, "cublasLtMatmulAlgoConfigGetAttribute");
}
