// Test only (tests/test_gemm.py compiles it with -fsyntax-only where cuDNN's headers are found):
// every value runtime/csrc/cudnn_api.h declares by hand against the real cudnn_graph.h.
#include <cudnn_graph.h>

#include "cudnn_api.h"

namespace dnn = onnxstitch::dnn;

static_assert(dnn::kSuccess == CUDNN_STATUS_SUCCESS && dnn::kNotSupported == CUDNN_STATUS_NOT_SUPPORTED, "status");
static_assert(dnn::kFloat == CUDNN_DATA_FLOAT && dnn::kHalf == CUDNN_DATA_HALF && dnn::kBfloat16 == CUDNN_DATA_BFLOAT16, "types");
static_assert(dnn::kTypeHandle == CUDNN_TYPE_HANDLE && dnn::kTypeDataType == CUDNN_TYPE_DATA_TYPE, "attr types");
static_assert(dnn::kTypeBoolean == CUDNN_TYPE_BOOLEAN && dnn::kTypeInt64 == CUDNN_TYPE_INT64, "attr types");
static_assert(dnn::kTypeFloat == CUDNN_TYPE_FLOAT && dnn::kTypeDouble == CUDNN_TYPE_DOUBLE, "attr types");
static_assert(dnn::kTypeVoidPtr == CUDNN_TYPE_VOID_PTR && dnn::kTypeConvolutionMode == CUDNN_TYPE_CONVOLUTION_MODE, "attr types");
static_assert(dnn::kTypeHeurMode == CUDNN_TYPE_HEUR_MODE && dnn::kTypePointwiseMode == CUDNN_TYPE_POINTWISE_MODE, "attr types");
static_assert(dnn::kTypeBackendDescriptor == CUDNN_TYPE_BACKEND_DESCRIPTOR, "attr types");
static_assert(dnn::kPointwiseDescriptor == CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "descriptors");
static_assert(dnn::kConvolutionDescriptor == CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "descriptors");
static_assert(dnn::kEngineCfgDescriptor == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "descriptors");
static_assert(dnn::kEngineHeurDescriptor == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "descriptors");
static_assert(dnn::kExecutionPlanDescriptor == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "descriptors");
static_assert(dnn::kOperationConvolutionForwardDescriptor == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "descriptors");
static_assert(dnn::kOperationPointwiseDescriptor == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "descriptors");
static_assert(dnn::kOperationGraphDescriptor == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "descriptors");
static_assert(dnn::kVariantPackDescriptor == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "descriptors");
static_assert(dnn::kTensorDescriptor == CUDNN_BACKEND_TENSOR_DESCRIPTOR, "descriptors");
static_assert(dnn::kMatmulDescriptor == CUDNN_BACKEND_MATMUL_DESCRIPTOR, "descriptors");
static_assert(dnn::kOperationMatmulDescriptor == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "descriptors");
static_assert(dnn::kAttrPointwiseMode == CUDNN_ATTR_POINTWISE_MODE && dnn::kAttrPointwiseMathPrec == CUDNN_ATTR_POINTWISE_MATH_PREC, "pw");
static_assert(dnn::kAttrPointwiseReluLowerClip == CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, "pw");
static_assert(dnn::kAttrPointwiseReluUpperClip == CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, "pw");
static_assert(dnn::kAttrPointwiseReluLowerClipSlope == CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, "pw");
static_assert(dnn::kAttrPointwiseSwishBeta == CUDNN_ATTR_POINTWISE_SWISH_BETA, "pw");
static_assert(dnn::kAttrConvolutionCompType == CUDNN_ATTR_CONVOLUTION_COMP_TYPE, "conv");
static_assert(dnn::kAttrConvolutionConvMode == CUDNN_ATTR_CONVOLUTION_CONV_MODE, "conv");
static_assert(dnn::kAttrConvolutionDilations == CUDNN_ATTR_CONVOLUTION_DILATIONS, "conv");
static_assert(dnn::kAttrConvolutionFilterStrides == CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, "conv");
static_assert(dnn::kAttrConvolutionPostPaddings == CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, "conv");
static_assert(dnn::kAttrConvolutionPrePaddings == CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, "conv");
static_assert(dnn::kAttrConvolutionSpatialDims == CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, "conv");
static_assert(dnn::kAttrEngineHeurMode == CUDNN_ATTR_ENGINEHEUR_MODE, "heur");
static_assert(dnn::kAttrEngineHeurOperationGraph == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, "heur");
static_assert(dnn::kAttrEngineHeurResults == CUDNN_ATTR_ENGINEHEUR_RESULTS, "heur");
static_assert(dnn::kAttrEngineCfgWorkspaceSize == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, "cfg");
static_assert(dnn::kAttrExecutionPlanHandle == CUDNN_ATTR_EXECUTION_PLAN_HANDLE, "plan");
static_assert(dnn::kAttrExecutionPlanEngineConfig == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, "plan");
static_assert(dnn::kAttrExecutionPlanWorkspaceSize == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, "plan");
static_assert(dnn::kAttrConvolutionForwardAlpha == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, "fprop");
static_assert(dnn::kAttrConvolutionForwardBeta == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, "fprop");
static_assert(dnn::kAttrConvolutionForwardConvDesc == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, "fprop");
static_assert(dnn::kAttrConvolutionForwardW == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, "fprop");
static_assert(dnn::kAttrConvolutionForwardX == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, "fprop");
static_assert(dnn::kAttrConvolutionForwardY == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, "fprop");
static_assert(dnn::kAttrPointwisePwDescriptor == CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, "pw op");
static_assert(dnn::kAttrPointwiseXDesc == CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "pw op");
static_assert(dnn::kAttrPointwiseBDesc == CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "pw op");
static_assert(dnn::kAttrPointwiseYDesc == CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "pw op");
static_assert(dnn::kAttrOperationGraphHandle == CUDNN_ATTR_OPERATIONGRAPH_HANDLE, "graph");
static_assert(dnn::kAttrOperationGraphOps == CUDNN_ATTR_OPERATIONGRAPH_OPS, "graph");
static_assert(dnn::kAttrTensorByteAlignment == CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, "tensor");
static_assert(dnn::kAttrTensorDataType == CUDNN_ATTR_TENSOR_DATA_TYPE, "tensor");
static_assert(dnn::kAttrTensorDimensions == CUDNN_ATTR_TENSOR_DIMENSIONS, "tensor");
static_assert(dnn::kAttrTensorStrides == CUDNN_ATTR_TENSOR_STRIDES, "tensor");
static_assert(dnn::kAttrTensorUniqueId == CUDNN_ATTR_TENSOR_UNIQUE_ID, "tensor");
static_assert(dnn::kAttrTensorIsVirtual == CUDNN_ATTR_TENSOR_IS_VIRTUAL, "tensor");
static_assert(dnn::kAttrVariantPackUniqueIds == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, "pack");
static_assert(dnn::kAttrVariantPackDataPointers == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, "pack");
static_assert(dnn::kAttrVariantPackWorkspace == CUDNN_ATTR_VARIANT_PACK_WORKSPACE, "pack");
static_assert(dnn::kAttrMatmulCompType == CUDNN_ATTR_MATMUL_COMP_TYPE, "matmul");
static_assert(dnn::kAttrMatmulADesc == CUDNN_ATTR_OPERATION_MATMUL_ADESC && dnn::kAttrMatmulBDesc == CUDNN_ATTR_OPERATION_MATMUL_BDESC, "mm");
static_assert(dnn::kAttrMatmulCDesc == CUDNN_ATTR_OPERATION_MATMUL_CDESC && dnn::kAttrMatmulDesc == CUDNN_ATTR_OPERATION_MATMUL_DESC, "mm");
static_assert(dnn::kPointwiseAdd == CUDNN_POINTWISE_ADD && dnn::kPointwiseMul == CUDNN_POINTWISE_MUL, "modes");
static_assert(dnn::kPointwiseIdentity == CUDNN_POINTWISE_IDENTITY && dnn::kPointwiseReluFwd == CUDNN_POINTWISE_RELU_FWD, "modes");
static_assert(dnn::kPointwiseTanhFwd == CUDNN_POINTWISE_TANH_FWD && dnn::kPointwiseSigmoidFwd == CUDNN_POINTWISE_SIGMOID_FWD, "modes");
static_assert(dnn::kPointwiseGeluFwd == CUDNN_POINTWISE_GELU_FWD && dnn::kPointwiseSwishFwd == CUDNN_POINTWISE_SWISH_FWD, "modes");
static_assert(dnn::kPointwiseGeluApproxTanhFwd == CUDNN_POINTWISE_GELU_APPROX_TANH_FWD, "modes");
static_assert(dnn::kHeurModeFallback == CUDNN_HEUR_MODE_FALLBACK && dnn::kHeurModeA == CUDNN_HEUR_MODE_A, "heur modes");
static_assert(dnn::kCrossCorrelation == CUDNN_CROSS_CORRELATION, "conv mode");
