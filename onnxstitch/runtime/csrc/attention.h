// shape_rule "attention" (docs/abi.md): one kernel for an attention chain (codegen_attention.py).
// Its inputs are q [L..., Sq, D], kᵀ [L..., D, Sk], v [L..., Sk, D] and up to kMaxMasks terms
// added to the scores, each broadcasting to [L..., Sq, Sk]; L is [b, h] or [b·h]. Pure functions over shapes, so
// they are shared by Compute and shape inference and tested without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "output_views.h"
#include "stitch_abi.h"

namespace onnxstitch {

constexpr int kMaxMasks = 2;  // additive terms: a mask, and T5's position bias before it

struct AttentionSpec {
  bool present = false;
  int64_t head = 0, queries = 0, threads = 0, shared = 0;  // head size, queries per block, block, bytes
  int masks = 0;
  bool transposed = false;
};

// The "attention" attribute: [head, queries per block, threads, shared bytes, masks, transposed].
inline bool ParseAttention(const std::vector<int64_t>& a, AttentionSpec* s, std::string* error) {
  if (a.size() != 6 || a[0] < 8 || a[0] > 128 || a[0] % 8 != 0 || a[1] < 1 || a[2] < 32 || a[2] > 1024 ||
      a[2] % 32 != 0 || a[3] < 0 || a[4] < 0 || a[4] > kMaxMasks || (a[5] != 0 && a[5] != 1)) {
    *error = "attention must be [head size (a multiple of 8, 8..128), queries per block, threads (whole warps), "
             "shared bytes, masks 0.." + std::to_string(kMaxMasks) + ", transposed 0|1]";
    return false;
  }
  *s = AttentionSpec{true, a[0], a[1], a[2], a[3], static_cast<int>(a[4]), a[5] != 0};
  return true;
}

// The context's shape from q's: q's own, or [b, s, h, d] from [b, h, s, d] when transposed.
inline bool AttentionOutput(const std::vector<ShapeDim>& q, bool transposed, std::vector<ShapeDim>* out) {
  if (q.size() < 3 || q.size() > 4 || (transposed && q.size() != 4)) return false;
  *out = q;
  if (transposed) std::swap((*out)[1], (*out)[2]);
  return true;
}

// Launch dims [B, H, Sq, Sk] (B = 1 for rank-3 operands) and each mask's element strides over
// them (0 where it broadcasts), from the bound inputs' shapes; false with `error` when they do
// not fit the kernel.
inline bool AttentionDims(const AttentionSpec& s, const int64_t (*shapes)[STITCH_MAX_RANK], const size_t* ranks,
                          size_t n_in, long long dims[4], long long mask_strides[kMaxMasks][4], std::string* error) {
  const auto text = [&](size_t i) {
    std::string t = "[";
    for (size_t j = 0; j < ranks[i]; ++j) t += (j ? ", " : "") + std::to_string(shapes[i][j]);
    return t + "]";
  };
  if (n_in != 3u + static_cast<size_t>(s.masks)) {
    *error = "an attention kernel takes q, kᵀ, v and " + std::to_string(s.masks) + " mask(s), got " +
             std::to_string(n_in) + " inputs";
    return false;
  }
  const size_t r = ranks[0];
  if (r < 3 || r > 4 || ranks[1] != r || ranks[2] != r || (s.transposed && r != 4)) {
    *error = "q " + text(0) + ", kᵀ " + text(1) + ", v " + text(2) + ": expected three tensors of rank " +
             (s.transposed ? "4" : "3 or 4");
    return false;
  }
  const int64_t* q = shapes[0];
  const int64_t* k = shapes[1];
  const int64_t* v = shapes[2];
  bool ok = q[r - 1] == s.head && k[r - 2] == s.head && v[r - 1] == s.head && k[r - 1] == v[r - 2];
  for (size_t d = 0; d + 2 < r; ++d) ok = ok && q[d] == k[d] && q[d] == v[d];
  if (!ok) {
    *error = "q " + text(0) + ", kᵀ " + text(1) + ", v " + text(2) + " do not fit a kernel for heads of " +
             std::to_string(s.head) + " (q [.., Sq, D], kᵀ [.., D, Sk], v [.., Sk, D], same leading dims)";
    return false;
  }
  // Scores [L..., Sq, Sk] as four dims.
  const int64_t scores[4] = {r == 4 ? q[0] : 1, q[r - 3], q[r - 2], k[r - 1]};
  for (int d = 0; d < 4; ++d) dims[d] = scores[d];
  for (int t = 0; t < s.masks; ++t) {
    const size_t i = 3 + static_cast<size_t>(t), mr = ranks[i];
    if (mr > r) {
      *error = "the mask " + text(i) + " has a higher rank than the scores";
      return false;
    }
    long long stride = 1;
    for (int d = 0; d < 4; ++d) mask_strides[t][d] = 0;
    for (size_t j = mr; j-- > 0;) {
      const int d = static_cast<int>(4 - mr + j);  // right-aligned against the four score dims
      const int64_t m = shapes[i][j];
      if (m != 1 && m != scores[d]) {
        *error = "the mask " + text(i) + " does not broadcast to the scores";
        return false;
      }
      mask_strides[t][d] = (m == 1 && scores[d] != 1) ? 0 : stride;
      stride *= m;
    }
  }
  return true;
}

}  // namespace onnxstitch
