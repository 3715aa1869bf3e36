// shape_rule "attention" (docs/abi.md): one kernel for an attention chain (codegen.py beside this).
// Its inputs are q [L..., Sq, D], kᵀ [L..., D, Sk], v [L..., Sk, D] and up to kMaxMasks terms
// added to the scores, each broadcasting to [L..., Sq, Sk]; L is [b, h] or [b·h]. Or, projected,
// the projections' outputs xq [b, Sq, Wq], xk [b, Sk, Wk], xv [b, Sk, Wv] whose columns
// offset + h·D .. hold head h, then (biased) a bias [H·D] for each, then the terms. Pure
// functions over shapes, so they are shared by the launch and shape inference and tested without
// a GPU (tests/test_attention_dims.py).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "output_views.h"  // runtime/csrc
#include "stitch_abi.h"

namespace onnxstitch {

constexpr int kMaxMasks = 2;  // additive terms: a mask, and T5's position bias before it

struct AttentionSpec {
  int64_t head = 0, queries = 0, threads = 0, shared = 0;  // head size, queries per block, block, bytes
  int masks = 0;
  bool transposed = false;
  // Operands read from projections: `heads` heads, q/k/v's columns from offsets[0..2], biases.
  bool projected = false, biased = false;
  int64_t heads = 0;
  int64_t offsets[3] = {0, 0, 0};
  // Grouped KV heads (attention_kv_group, 1 when absent): with g > 1, K and V are [b, H / g, Sk, D]
  // (K as rows, not kᵀ) and q head h reads KV head h / g.
  int64_t kv_group = 1;
  // Decode entries (attention_decode_rows, 0 when absent): launches whose g · Sq query rows per
  // (batch, KV head) are at most this many run the split-KV decode kernel and its merge.
  int64_t decode_rows = 0, decode_shared = 0, decode_keys = 0;
  // V's and the context's head width (attention_value_size) where it is not `head`; 0 when absent.
  int64_t value = 0;

  size_t first_mask() const { return biased ? 6 : 3; }
  int64_t values() const { return value > 0 ? value : head; }
};

// The spec's limits: head size a multiple of 8 up to 128, whole warps, at most kMaxMasks terms;
// projected, 16-byte aligned column offsets (the kernel reads 4 floats at a time).
inline bool CheckAttention(const AttentionSpec& s, std::string* error) {
  bool ok = s.head >= 8 && s.head <= 128 && s.head % 8 == 0 && s.queries >= 1 && s.threads >= 32 &&
            s.threads <= 1024 && s.threads % 32 == 0 && s.shared >= 0 && s.masks >= 0 && s.masks <= kMaxMasks;
  ok = ok && s.kv_group >= 1 && !(s.kv_group > 1 && s.projected);
  ok = ok && s.decode_rows >= 0 && s.decode_shared >= 0 && (s.decode_rows == 0 || (!s.projected && s.decode_keys > 0));
  // Values of their own width: plain operands only (no projections, grouped heads or decode entries).
  ok = ok && (s.value == 0 || (s.value >= 8 && s.value <= 128 && s.value % 8 == 0 && !s.projected &&
                               s.kv_group == 1 && s.decode_rows == 0));
  if (ok && s.projected) {
    ok = s.heads >= 1;
    for (int i = 0; i < 3; ++i) ok = ok && s.offsets[i] >= 0 && s.offsets[i] % 4 == 0;
  }
  if (!ok) {
    *error = "the attention spec must have a head size (a multiple of 8, 8..128), queries per block >= 1, threads "
             "(whole warps up to 1024), shared bytes >= 0, masks 0.." + std::to_string(kMaxMasks) +
             ", a KV group >= 1 (1 with projections), decode rows >= 0 (0 with projections; then keys a tile > 0), a value "
             "size 0 or as a head size (then no projections, KV groups or decode rows) and, for projections, heads >= 1 "
             "and q, k and v column offsets (multiples of 4)";
  }
  return ok;
}

// The context's shape from the first input's: q's own, or [b, s, h, d] from [b, h, s, d] when
// transposed; projected, from xq [b, Sq, W]: [b, H, Sq, D], or [b, Sq, H, D] transposed.
inline bool AttentionOutput(const AttentionSpec& s, const std::vector<ShapeDim>& q, std::vector<ShapeDim>* out) {
  if (s.projected) {
    if (q.size() != 3) return false;
    const ShapeDim heads{s.heads, ""}, head{s.head, ""};
    *out = s.transposed ? std::vector<ShapeDim>{q[0], q[1], heads, head} : std::vector<ShapeDim>{q[0], heads, q[1], head};
    return true;
  }
  if (q.size() < 3 || q.size() > 4 || (s.transposed && q.size() != 4)) return false;
  *out = q;
  out->back() = ShapeDim{s.values(), ""};
  if (s.transposed) std::swap((*out)[1], (*out)[2]);
  return true;
}

// Launch dims [B, H, Sq, Sk] (B = 1 for rank-3 operands), each mask's element strides over
// them (0 where it broadcasts) and, projected, each projection's row width, from the bound
// inputs' shapes; false with `error` when they do not fit the kernel.
inline bool AttentionDims(const AttentionSpec& s, const int64_t (*shapes)[STITCH_MAX_RANK], const size_t* ranks,
                          size_t n_in, long long dims[4], long long mask_strides[kMaxMasks][4], long long widths[3],
                          std::string* error) {
  const auto text = [&](size_t i) {
    std::string t = "[";
    for (size_t j = 0; j < ranks[i]; ++j) t += (j ? ", " : "") + std::to_string(shapes[i][j]);
    return t + "]";
  };
  const size_t first = s.first_mask();
  if (n_in != first + static_cast<size_t>(s.masks)) {
    *error = std::string("an attention kernel takes ") +
             (s.projected ? (s.biased ? "xq, xk, xv, three biases" : "xq, xk, xv") : "q, kᵀ, v") + " and " +
             std::to_string(s.masks) + " mask(s), got " + std::to_string(n_in) + " inputs";
    return false;
  }
  for (int i = 0; i < 3; ++i) widths[i] = 0;
  const size_t r = ranks[0];
  if (s.projected) {
    // xq [B, Sq, Wq], xk [B, Sk, Wk], xv [B, Sk, Wv]: each holds H heads of D at its offset.
    const int64_t span = s.heads * s.head;
    bool ok = ranks[0] == 3 && ranks[1] == 3 && ranks[2] == 3;
    for (int i = 0; ok && i < 3; ++i) {
      ok = shapes[i][0] == shapes[0][0] && shapes[i][2] % 4 == 0 && s.offsets[i] + span <= shapes[i][2];
      widths[i] = shapes[i][2];
    }
    ok = ok && shapes[1][1] == shapes[2][1];
    for (size_t i = 3; ok && i < first; ++i) ok = ranks[i] == 1 && shapes[i][0] == span;
    if (!ok) {
      *error = "xq " + text(0) + ", xk " + text(1) + ", xv " + text(2) + (s.biased ? " and their biases" : "") +
               " do not hold " + std::to_string(s.heads) + " heads of " + std::to_string(s.head) + " at columns " +
               std::to_string(s.offsets[0]) + ", " + std::to_string(s.offsets[1]) + ", " +
               std::to_string(s.offsets[2]) + " ([b, s, w] each, w a multiple of 4, the same b, xk and xv the same "
               "s" + (s.biased ? ", biases [heads · head size]" : "") + ")";
      return false;
    }
    const long long d[4] = {shapes[0][0], s.heads, shapes[0][1], shapes[1][1]};
    for (int k = 0; k < 4; ++k) dims[k] = d[k];
  } else {
    if (r < 3 || r > 4 || ranks[1] != r || ranks[2] != r || (s.transposed && r != 4)) {
      *error = "q " + text(0) + ", kᵀ " + text(1) + ", v " + text(2) + ": expected three tensors of rank " +
               (s.transposed ? "4" : "3 or 4");
      return false;
    }
    const int64_t* q = shapes[0];
    const int64_t* k = shapes[1];
    const int64_t* v = shapes[2];
    const bool grouped = s.kv_group > 1;  // K [b, H / g, Sk, D] as rows
    bool ok = q[r - 1] == s.head && v[r - 1] == s.values() &&
              (grouped ? r == 4 && k[3] == s.head && k[2] == v[2] && k[0] == q[0] && v[0] == q[0] &&
                             k[1] == v[1] && k[1] * s.kv_group == q[1]
                       : k[r - 2] == s.head && k[r - 1] == v[r - 2]);
    for (size_t d = 0; !grouped && d + 2 < r; ++d) ok = ok && q[d] == k[d] && q[d] == v[d];
    if (!ok) {
      *error = grouped ? "q " + text(0) + ", K " + text(1) + ", V " + text(2) + " do not fit a kernel for heads of " +
                             std::to_string(s.head) + " and " + std::to_string(s.kv_group) +
                             " q heads per KV head (q [b, H, Sq, D], K and V [b, H / " +
                             std::to_string(s.kv_group) + ", Sk, D])"
                       : "q " + text(0) + ", kᵀ " + text(1) + ", v " + text(2) + " do not fit a kernel for heads of " +
                             std::to_string(s.head) + (s.value ? " and values of " + std::to_string(s.value) : "") +
                             " (q [.., Sq, D], kᵀ [.., D, Sk], v [.., Sk, " + (s.value ? "Dv" : "D") +
                             "], same leading dims)";
      return false;
    }
    // Scores [L..., Sq, Sk] as four dims.
    const long long d[4] = {r == 4 ? q[0] : 1, q[r - 3], q[r - 2], grouped ? k[2] : k[r - 1]};
    for (int j = 0; j < 4; ++j) dims[j] = d[j];
  }
  const long long* scores = dims;
  const size_t score_rank = s.projected ? 4 : r;
  for (int t = 0; t < s.masks; ++t) {
    const size_t i = first + static_cast<size_t>(t), mr = ranks[i];
    if (mr > score_rank) {
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
