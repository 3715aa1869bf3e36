// The rows scheme's runtime side (shape rule "rows", docs/abi.md): a reduction over a run of
// axes of the inputs' broadcast shape; a few lanes, a warp or a block per row (or a cluster of
// blocks per row on GPUs with clusters), rows grid-strided.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "iteration.h"
#include "scheme.h"

namespace onnxstitch {
namespace {

constexpr long long kWideThreshold = 1LL << 30;
constexpr const char* kSuffix[kEntries] = {"_rows", "_rows64"};  // 32-bit, 64-bit indices
// Split rows: entries launching clusters of row_split blocks per row, in images for GPUs with
// thread-block clusters (sm_90 on); absent elsewhere.
constexpr const char* kClusterSuffix[kEntries] = {"_rows_cl", "_rows64_cl"};

class Rows final : public Scheme {
 public:
  Error Init(Attrs& a, size_t, size_t n_out) override {
    bool present = false;
    // Each output is full-shaped (0) or row-shaped: keepdims (1) or the row's dims dropped (2).
    if (Error e = a.Ints("output_kinds", &output_kinds_, &present)) return e;
    if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing INTS attribute 'output_kinds' (shape_rule \"rows\")");
    for (int64_t k : output_kinds_) {
      if (k < 0 || k > 2) return Fail(ORT_INVALID_ARGUMENT, "output_kinds values must be 0, 1 or 2, got " + std::to_string(k));
    }
    if (output_kinds_.size() != n_out) {
      return Fail(ORT_INVALID_ARGUMENT, "output_kinds has " + std::to_string(output_kinds_.size()) + " entries for " +
                                            std::to_string(n_out) + " outputs");
    }
    std::vector<int64_t> geo;
    if (Error e = a.Ints("row_geometry", &geo, &present)) return e;
    if (present) {
      if (Error e = ReadGeometry(geo)) return e;
    }
    std::vector<int64_t> views;
    if (Error e = a.Ints("output_views", &views, &present)) return e;
    if (present) return Fail(ORT_INVALID_ARGUMENT, "output_views is for shape_rule \"broadcast\" only");
    return {};
  }

  bool OutputShapes(const std::vector<std::vector<ShapeDim>>& ins, size_t n_out,
                    std::vector<std::vector<ShapeDim>>* outs) const override {
    std::vector<ShapeDim> shape;
    if (!BroadcastSymbolic(ins, &shape) || shape.size() < static_cast<size_t>(row_axes_ + row_inner_)) return false;
    const size_t stop = shape.size() - static_cast<size_t>(row_inner_), lead = stop - static_cast<size_t>(row_axes_);
    outs->assign(n_out, shape);
    for (size_t o = 0; o < n_out; ++o) {
      std::vector<ShapeDim>& s = (*outs)[o];
      if (output_kinds_[o] == 1) {
        for (size_t d = lead; d < stop; ++d) s[d] = ShapeDim{1, ""};
      } else if (output_kinds_[o] == 2) {
        s.erase(s.begin() + static_cast<long>(lead), s.begin() + static_cast<long>(stop));
      }
    }
    return true;
  }

  Error Entries(const cu::Driver& d, const std::string& kernel_name, Loaded* l) const override {
    for (int v = 0; v < kEntries; ++v) {
      if (Error e = GetEntry(d, l, kernel_name + kSuffix[v], &l->entry[v])) return e;
    }
    // Cluster entries are optional: an image for a GPU without clusters has none (both or neither).
    for (int v = 0; row_split_ > 1 && v < kEntries; ++v) {
      const std::string entry = kernel_name + kClusterSuffix[v];
      if (d.ModuleGetFunction(&l->cluster[v], l->module, entry.c_str()) != cu::kSuccess) l->cluster[v] = nullptr;
    }
    if (l->cluster[0] == nullptr || l->cluster[1] == nullptr) l->cluster[0] = l->cluster[1] = nullptr;
    if (d.OccupancyMaxActiveBlocksPerMultiprocessor != nullptr) {
      int n = 0;
      const int block = static_cast<int>(block_threads_);
      if (d.OccupancyMaxActiveBlocksPerMultiprocessor(&n, l->entry[0], block, 0) == cu::kSuccess) l->blocks_per_sm = n;
      if (l->cluster[0] != nullptr &&
          d.OccupancyMaxActiveBlocksPerMultiprocessor(&n, l->cluster[0], block, 0) == cu::kSuccess) {
        l->cluster_blocks_per_sm = n;
      }
    }
    return {};
  }

  Error Run(Call& call, Bound* b) const override {
    if (Error e = BroadcastIteration(b)) return e;
    const size_t rank = static_cast<size_t>(b->args.rank);
    const long long* dims = b->args.dims;
    if (rank < static_cast<size_t>(row_axes_ + row_inner_)) {
      return Fail(ORT_INVALID_ARGUMENT, "a rows kernel over " + std::to_string(row_axes_) + " axes with " +
                                            std::to_string(row_inner_) + " after them got inputs of rank " +
                                            std::to_string(rank));
    }
    // The row_axes dims [lead, stop) are the row, trailing or followed by row_inner others
    // (columns); the rows are the other dims (which may exist when the row is empty).
    const size_t stop = rank - static_cast<size_t>(row_inner_), lead = stop - static_cast<size_t>(row_axes_);
    long long n_rows = 1;
    for (size_t d = 0; d < rank; ++d) n_rows *= (d >= lead && d < stop) ? 1 : dims[d];
    bool row_outputs = false;
    for (size_t o = 0; o < b->n_out; ++o) {
      int64_t out_dims[STITCH_MAX_RANK];
      size_t out_rank = rank;
      for (size_t d = 0; d < rank; ++d) out_dims[d] = dims[d];
      // Row-shaped outputs hold one value per row, the reduction's identity for an empty row
      // (ONNX's rule, and ORT 1.32's CPU kernels; ORT 1.31 kept the empty dim of an all-empty input).
      if (output_kinds_[o] == 1) {
        for (size_t d = lead; d < stop; ++d) out_dims[d] = 1;
      } else if (output_kinds_[o] == 2) {
        for (size_t d = stop; d < rank; ++d) out_dims[d - (stop - lead)] = dims[d];
        out_rank = rank - (stop - lead);
      }
      row_outputs = row_outputs || output_kinds_[o] != 0;
      if (Error e = call.Output(o, out_dims, out_rank, &b->args.out[o])) return e;
    }
    const long long n = b->args.n;
    // Empty outputs allocated, nothing to launch; except row-shaped outputs of empty rows, which
    // still get one value per row.
    if (n == 0 && !(row_outputs && n_rows > 0)) return {};

    cu::Stream stream = nullptr;
    const Loaded* l = nullptr;
    if (Error e = call.Enter(&stream, &l)) return e;
    void* params[1] = {&b->args};
    // One wave of resident blocks: each thread group then walks several rows, loading the next
    // row while it reduces this one (docs/abi.md).
    const long long per_block = block_threads_ / row_threads_;
    const long long resident = l->blocks_per_sm > 0 ? l->blocks_per_sm : 2048 / block_threads_;
    const long long cap = std::max<long long>(1, resident * l->sm_count);
    const long long blocks = std::max<long long>(1, std::min<long long>((n_rows + per_block - 1) / per_block, cap));
    const int variant = n < kWideThreshold ? 0 : 1;
    if (l->cluster[variant] != nullptr) {
      // A split row: row_split blocks (one cluster, its size fixed in the image) per row, rows
      // grid-strided by cluster; a grid of whole clusters, at most one wave. (Split columns: a
      // cluster per block's worth of columns, each of its blocks a slice of their length.)
      const long long per_sm = l->cluster_blocks_per_sm > 0 ? l->cluster_blocks_per_sm : resident;
      const long long clusters = std::max<long long>(
          1, std::min<long long>((n_rows + per_block - 1) / per_block, per_sm * l->sm_count / row_split_));
      // A device that cannot place the clusters (a partitioned GPU) refuses the launch at once:
      // the one-block-per-row entry computes the same rows.
      if (!call.Launch(l->cluster[variant], kClusterSuffix[variant], clusters * row_split_, block_threads_, 0, stream,
                       params)) {
        return {};
      }
    }
    return call.Launch(l->entry[variant], kSuffix[variant], blocks, block_threads_, 0, stream, params);
  }

 private:
  // row_geometry: [row axes, threads per row, threads per block(, axes after the row(, blocks per row))].
  Error ReadGeometry(const std::vector<int64_t>& geo) {
    // Threads per row: a power of two up to a warp (lanes share shuffles), whole warps beyond.
    const bool lanes_ok = (geo.size() == 3 || (geo.size() >= 4 && geo.size() <= 5 && geo[3] >= 0 &&
                                               geo[0] + geo[3] <= STITCH_MAX_RANK)) &&
                          geo[1] >= 1 && geo[1] <= 1024 && (geo[1] <= 32 ? (geo[1] & (geo[1] - 1)) == 0 : geo[1] % 32 == 0);
    // A row of more than a warp reduces across the whole block: then the block is the row.
    const bool ok = lanes_ok && geo[0] >= 1 && geo[0] <= STITCH_MAX_RANK && geo[2] >= geo[1] && geo[2] <= 1024 &&
                    geo[2] % geo[1] == 0 && (geo[1] <= 32 || geo[2] == geo[1]) &&
                    // a split row: 2..8 blocks (a portable cluster), each the row's block, or split
                    // columns (axes after the row, a thread per column)
                    (geo.size() < 5 || (geo[4] >= 1 && geo[4] <= 8 &&
                                        (geo[4] == 1 || geo[2] == geo[1] || (geo[3] > 0 && geo[1] == 1))));
    if (!ok) {
      return Fail(ORT_INVALID_ARGUMENT, "row_geometry must be [row axes, threads per row (a power of two up to "
                                        "32, else a multiple of 32), threads per block (a multiple up to 1024; "
                                        "the same beyond 32), optionally the axes after the row and the blocks per row (1..8)]");
    }
    row_axes_ = geo[0], row_threads_ = geo[1], block_threads_ = geo[2];
    row_inner_ = geo.size() >= 4 ? geo[3] : 0;
    row_split_ = geo.size() == 5 ? geo[4] : 1;
    return {};
  }

  std::vector<int64_t> output_kinds_;
  int64_t row_axes_ = 1, row_threads_ = 256, block_threads_ = 256;
  int64_t row_inner_ = 0;  // axes after the row (a column reduction when > 0)
  int64_t row_split_ = 1;  // blocks per row (a cluster) where the image has cluster entries
};

}  // namespace

std::unique_ptr<Scheme> MakeRows() { return std::make_unique<Rows>(); }

}  // namespace onnxstitch
