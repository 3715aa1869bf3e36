// Output views (docs/abi.md, attribute `output_views`): an output the kernel writes reshaped and
// transposed. The iteration shape is reshaped to `split`, its axes permuted by `perm`, and the
// result reshaped to `final`. Sizes are relative to the shape they reshape: >= 0 a fixed size,
// -1 the remainder that makes the element counts agree, -(k+2) a copy of dim k. The same code
// serves the kernel's output allocation (numbers) and ORT's shape inference (named dims).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnxstitch {

struct ShapeDim {
  int64_t value = 1;   // -1: not a number
  std::string symbol;  // non-empty: named dimension
};

struct OutputView {
  bool present = false;
  std::vector<int64_t> split, perm, final;
};

// Parses the attribute into one view per output; false (with *error) if it is malformed.
inline bool ParseOutputViews(const std::vector<int64_t>& attr, size_t n_out, std::vector<OutputView>* out,
                             std::string* error) {
  out->assign(n_out, OutputView{});
  size_t pos = 0;
  auto take = [&](size_t count, std::vector<int64_t>* into) {
    if (pos + count > attr.size()) return false;
    into->assign(attr.begin() + pos, attr.begin() + pos + count);
    pos += count;
    return true;
  };
  for (size_t o = 0; o < n_out; ++o) {
    if (pos >= attr.size()) return *error = "output_views is shorter than its " + std::to_string(n_out) + " outputs", false;
    const int64_t r = attr[pos++];
    if (r == 0) continue;
    OutputView& v = (*out)[o];
    v.present = true;
    if (r < 0 || r > 8 || !take(r, &v.split) || !take(r, &v.perm) || pos >= attr.size()) {
      return *error = "output_views: view of output " + std::to_string(o) + " is malformed", false;
    }
    const int64_t rf = attr[pos++];
    if (rf < 1 || rf > 8 || !take(rf, &v.final)) {
      return *error = "output_views: final shape of output " + std::to_string(o) + " is malformed", false;
    }
    std::vector<bool> seen(r, false);
    for (int64_t p : v.perm) {
      if (p < 0 || p >= r || seen[p]) return *error = "output_views: perm of output " + std::to_string(o) + " is not a permutation", false;
      seen[p] = true;
    }
  }
  if (pos != attr.size()) return *error = "output_views is longer than its outputs need", false;
  return true;
}

// `spec` applied to `src`. Returns false with *error when it cannot hold (a copy of a dim that
// does not exist, a remainder that does not divide, element counts that differ); a result with
// named or unknown dims is not checked (shape inference: the runtime checks the numbers).
inline bool Reshaped(const std::vector<ShapeDim>& src, const std::vector<int64_t>& spec, std::vector<ShapeDim>* out,
                     std::string* error) {
  out->assign(spec.size(), ShapeDim{});
  bool numeric = true;
  int64_t total = 1, known = 1;
  for (const ShapeDim& d : src) numeric = numeric && d.symbol.empty() && d.value >= 0, total *= d.value;
  int rest = -1;
  for (size_t j = 0; j < spec.size(); ++j) {
    const int64_t e = spec[j];
    if (e == -1) {
      if (rest >= 0) return *error = "two remainder dims", false;
      rest = static_cast<int>(j);
      continue;
    }
    if (e >= 0) {
      (*out)[j] = ShapeDim{e, ""};
    } else {
      const int64_t k = -e - 2;
      if (k >= static_cast<int64_t>(src.size())) return *error = "a copy of dim " + std::to_string(k) + " of a rank-" + std::to_string(src.size()) + " shape", false;
      (*out)[j] = src[k];
    }
    const ShapeDim& d = (*out)[j];
    numeric = numeric && d.symbol.empty() && d.value >= 0;
    known *= d.value;
  }
  if (!numeric) {
    if (rest >= 0) (*out)[rest] = ShapeDim{-1, ""};
    return true;
  }
  if (rest >= 0) {
    if (known == 0 ? total != 0 : total % known != 0) return *error = "the remainder dim does not divide", false;
    (*out)[rest] = ShapeDim{known == 0 ? 0 : total / known, ""};
    known *= (*out)[rest].value;
  }
  if (known != total) return *error = "the reshape holds " + std::to_string(known) + " elements, not " + std::to_string(total), false;
  return true;
}

// The shape of an output written through `v` from iteration shape `iter`.
inline bool ViewShape(const OutputView& v, const std::vector<ShapeDim>& iter, std::vector<ShapeDim>* out,
                      std::string* error) {
  std::vector<ShapeDim> split;
  if (!Reshaped(iter, v.split, &split, error)) return false;
  std::vector<ShapeDim> permuted;
  for (int64_t p : v.perm) permuted.push_back(split[p]);
  return Reshaped(permuted, v.final, out, error);
}

}  // namespace onnxstitch
