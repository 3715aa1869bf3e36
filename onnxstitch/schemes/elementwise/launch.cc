// The elementwise scheme's runtime side (shape rule "broadcast", docs/abi.md): a grid-stride
// loop over the inputs' broadcast shape; outputs of that shape or written through a view.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "iteration.h"
#include "scheme.h"

namespace onnxstitch {
namespace {

constexpr int kBlock = 256;
constexpr long long kWideThreshold = 1LL << 30;  // the 32-bit vector entry stops short of this
constexpr const char* kSuffix[kEntries] = {"_v32", "_s64"};

class Elementwise final : public Scheme {
 public:
  Error Init(Attrs& a, size_t, size_t n_out) override {
    bool present = false;
    if (Error e = a.RequiredInt("vec_width", "broadcast", &vec_width_)) return e;
    if (vec_width_ < 1) return Fail(ORT_INVALID_ARGUMENT, "vec_width must be >= 1, got " + std::to_string(vec_width_));
    std::vector<int64_t> views;
    if (Error e = a.Ints("output_views", &views, &present)) return e;
    std::string error;
    if (!ParseOutputViews(present ? views : std::vector<int64_t>(n_out, 0), n_out, &views_, &error)) {
      return Fail(ORT_INVALID_ARGUMENT, error);
    }
    return {};
  }

  bool OutputShapes(const std::vector<std::vector<ShapeDim>>& ins, size_t n_out,
                    std::vector<std::vector<ShapeDim>>* outs) const override {
    std::vector<ShapeDim> shape;
    if (!BroadcastSymbolic(ins, &shape)) return false;
    std::string error;
    outs->assign(n_out, shape);
    for (size_t o = 0; o < n_out; ++o) {
      if (views_[o].present && !ViewShape(views_[o], shape, &(*outs)[o], &error)) return false;
    }
    return true;
  }

  Error Entries(const cu::Driver& d, const std::string& kernel_name, Loaded* l) const override {
    for (int v = 0; v < kEntries; ++v) {
      if (Error e = GetEntry(d, l, kernel_name + kSuffix[v], &l->entry[v])) return e;
    }
    return {};
  }

  Error Run(Call& call, Bound* b) const override {
    if (Error e = BroadcastIteration(b)) return e;
    const StitchArgs& args = b->args;
    const size_t rank = static_cast<size_t>(args.rank);
    for (size_t o = 0; o < b->n_out; ++o) {
      int64_t dims[STITCH_MAX_RANK];
      size_t out_rank = rank;
      for (size_t d = 0; d < rank; ++d) dims[d] = args.dims[d];
      if (views_[o].present) {
        std::vector<ShapeDim> iter, shape;
        for (size_t d = 0; d < rank; ++d) iter.push_back(ShapeDim{args.dims[d], ""});
        std::string error;
        if (!ViewShape(views_[o], iter, &shape, &error)) {
          return Fail(ORT_INVALID_ARGUMENT, "output " + std::to_string(o) + "'s view of iteration shape " +
                                                ShapeText(dims, rank) + ": " + error);
        }
        out_rank = shape.size();
        for (size_t d = 0; d < out_rank; ++d) dims[d] = shape[d].value;
      }
      if (Error e = call.Output(o, dims, out_rank, &b->args.out[o])) return e;
    }
    const long long n = args.n;
    if (n == 0) return {};  // empty outputs allocated, nothing to launch

    // Variant: vector entries need whole vectors and 16-byte aligned linear tensors.
    bool vector_ok = (n % vec_width_) == 0 && n < kWideThreshold;
    for (size_t i = 0; vector_ok && i < b->n_in; ++i) {
      if (b->kinds[i] == 0) vector_ok = (reinterpret_cast<uintptr_t>(args.in[i]) % 16) == 0;
    }
    for (size_t o = 0; vector_ok && o < b->n_out; ++o) vector_ok = (reinterpret_cast<uintptr_t>(args.out[o]) % 16) == 0;
    cu::Stream stream = nullptr;
    const Loaded* l = nullptr;
    if (Error e = call.Enter(&stream, &l)) return e;
    const int variant = vector_ok ? 0 : 1;  // _v32 or _s64
    const long long work = vector_ok ? n / vec_width_ : n;
    // 64 blocks per multiprocessor: best of 16/32/64/uncapped on H200 (docs/perf-notes.md)
    const long long blocks = std::max<long long>(1, std::min<long long>((work + kBlock - 1) / kBlock, 64LL * l->sm_count));
    void* params[1] = {&b->args};
    return call.Launch(l->entry[variant], kSuffix[variant], blocks, kBlock, 0, stream, params);
  }

 private:
  int64_t vec_width_ = 1;
  std::vector<OutputView> views_;  // per output (may be absent)
};

}  // namespace

std::unique_ptr<Scheme> MakeElementwise() { return std::make_unique<Elementwise>(); }

}  // namespace onnxstitch
