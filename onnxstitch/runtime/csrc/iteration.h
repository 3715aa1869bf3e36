// The iteration space of the elementwise and rows schemes (docs/abi.md, "broadcast" and "rows"):
// the numpy broadcast of the inputs' shapes, with each input's strides over it.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "scheme.h"

namespace onnxstitch {

// Fills b->args (n, rank, dims, per-input strides: 0 where an input broadcasts) from the bound
// inputs; FULL inputs must have the iteration shape itself (leading 1s tolerated).
inline Error BroadcastIteration(Bound* b) {
  size_t rank = 0;
  for (size_t i = 0; i < b->n_in; ++i) rank = std::max(rank, b->ranks[i]);
  int64_t dims[STITCH_MAX_RANK];
  for (size_t d = 0; d < rank; ++d) dims[d] = 1;
  for (size_t i = 0; i < b->n_in; ++i) {
    for (size_t j = 0; j < b->ranks[i]; ++j) {
      const size_t d = rank - b->ranks[i] + j;
      const int64_t s = b->shapes[i][j];
      if (dims[d] == 1) {
        dims[d] = s;
      } else if (s != 1 && s != dims[d]) {
        std::string all;
        for (size_t k = 0; k < b->n_in; ++k) all += (k ? " " : "") + ShapeText(b->shapes[k], b->ranks[k]);
        return Fail(ORT_INVALID_ARGUMENT, "input shapes do not broadcast: " + all);
      }
    }
  }
  long long n = 1;
  for (size_t d = 0; d < rank; ++d) n *= dims[d];
  for (size_t i = 0; i < b->n_in; ++i) {
    const size_t r = b->ranks[i];
    // FULL inputs are indexed linearly: their shape must be the iteration shape (leading 1s,
    // which change no linear index, are tolerated).
    if (b->kinds[i] == 0) {
      bool same = r <= rank;
      for (size_t d = 0; same && d < rank; ++d) same = (d + r >= rank ? b->shapes[i][d + r - rank] : 1) == dims[d];
      if (!same) {
        return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " is FULL but has shape " +
                                              ShapeText(b->shapes[i], r) + ", not the iteration shape " +
                                              ShapeText(dims, rank));
      }
    }
    // Element strides of the input's own contiguous layout (a boxed input's: its tensor's),
    // mapped onto the iteration dims; 0 where the input is broadcast (missing leading dim, or
    // extent 1 against a larger one).
    for (size_t j = r; j-- > 0;) {
      const size_t d = rank - r + j;
      b->args.strides[i][d] = (b->shapes[i][j] == 1 && dims[d] != 1) ? 0 : b->own[i][j];
    }
  }
  b->args.n = n;
  b->args.rank = static_cast<int>(rank);
  for (size_t d = 0; d < rank; ++d) b->args.dims[d] = dims[d];
  return {};
}

// Broadcast of input dims with names: a number other than 1 wins; else one shared name; else 1.
// Returns false where the result is not certain (unknown dims, two different names, clashes).
inline bool BroadcastSymbolic(const std::vector<std::vector<ShapeDim>>& ins, std::vector<ShapeDim>* out) {
  size_t rank = 0;
  for (const auto& s : ins) rank = std::max(rank, s.size());
  out->assign(rank, ShapeDim{});
  for (size_t d = 0; d < rank; ++d) {
    int64_t number = -1;
    std::string name;
    bool unsure = false;
    for (const auto& s : ins) {
      if (d + s.size() < rank) continue;  // this input lacks the dim: broadcast
      const ShapeDim& x = s[d + s.size() - rank];
      if (!x.symbol.empty()) {
        if (name.empty()) name = x.symbol;
        else if (name != x.symbol) unsure = true;
      } else if (x.value < 0) {
        unsure = true;
      } else if (x.value != 1) {
        if (number >= 0 && number != x.value) return false;  // do not broadcast at all
        number = x.value;
      }
    }
    if (number >= 0) {
      (*out)[d] = ShapeDim{number, ""};
    } else if (unsure) {
      return false;
    } else if (!name.empty()) {
      (*out)[d] = ShapeDim{-1, name};
    }
  }
  return true;
}

}  // namespace onnxstitch
