// Test only (tests/test_runtime_build.py compiles it with -fsyntax-only where a CUDA toolkit's
// cuda.h is installed): the launch structs and values runtime/csrc/cuda_driver.h declares by
// hand against the real cuda.h.
#include <cuda.h>

#include <cstddef>

#include "cuda_driver.h"

namespace cu = onnxstitch::cu;

static_assert(cu::kLaunchAttrProgrammaticStreamSerialization == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
              "programmatic stream serialization");
static_assert(cu::kAttrMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count");
static_assert(cu::kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "major");
static_assert(cu::kAttrComputeCapabilityMinor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "minor");
static_assert(cu::kFuncMaxDynamicSharedBytes == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, "shared bytes");
static_assert(sizeof(cu::LaunchAttribute) == sizeof(CUlaunchAttribute), "attribute size");
static_assert(offsetof(cu::LaunchAttribute, value) == offsetof(CUlaunchAttribute, value), "attribute value");
static_assert(offsetof(cu::LaunchAttribute, value.programmatic_stream_serialization_allowed) ==
                  offsetof(CUlaunchAttribute, value.programmaticStreamSerializationAllowed),
              "serialization flag");
static_assert(sizeof(cu::LaunchConfig) == sizeof(CUlaunchConfig), "config size");
static_assert(offsetof(cu::LaunchConfig, shared_bytes) == offsetof(CUlaunchConfig, sharedMemBytes), "shared");
static_assert(offsetof(cu::LaunchConfig, stream) == offsetof(CUlaunchConfig, hStream), "stream");
static_assert(offsetof(cu::LaunchConfig, attrs) == offsetof(CUlaunchConfig, attrs), "attributes");
static_assert(offsetof(cu::LaunchConfig, num_attrs) == offsetof(CUlaunchConfig, numAttrs), "attribute count");
static_assert(sizeof(cu::Stream) == sizeof(CUstream) && sizeof(cu::Function) == sizeof(CUfunction), "handles");
