// The kernel parameter of docs/abi.md, byte for byte: every generated entry
// (<kernel_name>_v32 and <kernel_name>_s64) takes one StitchArgs by value.
#pragma once

#include <cstddef>

#define STITCH_MAX_RANK 8
#define STITCH_MAX_IN 32
#define STITCH_MAX_OUT 16

namespace onnxstitch {

struct StitchArgs {
  const void* in[STITCH_MAX_IN];
  void* out[STITCH_MAX_OUT];
  long long n;
  int rank;
  int pad_;
  long long dims[STITCH_MAX_RANK];
  long long strides[STITCH_MAX_IN][STITCH_MAX_RANK];
};

// The device compiler lays the struct out the same way on x86-64 and on the GPU (8-byte
// pointers, 8-byte long long); pin the offsets so a change on one side cannot go unnoticed.
static_assert(sizeof(void*) == 8, "64-bit host required");
static_assert(offsetof(StitchArgs, out) == 256, "StitchArgs layout");
static_assert(offsetof(StitchArgs, n) == 384, "StitchArgs layout");
static_assert(offsetof(StitchArgs, rank) == 392, "StitchArgs layout");
static_assert(offsetof(StitchArgs, dims) == 400, "StitchArgs layout");
static_assert(offsetof(StitchArgs, strides) == 464, "StitchArgs layout");
static_assert(sizeof(StitchArgs) == 2512, "StitchArgs layout");  // under the 4 KB parameter limit

}  // namespace onnxstitch
