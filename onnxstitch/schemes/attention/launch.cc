// The attention scheme's runtime side (shape rule "attention", docs/abi.md): dims [B, H, Sq, Sk],
// mask k's strides in strides[first mask + k], projections' row widths in strides[0..2][0]; one
// block of `threads` per (batch, head) and `queries` queries, a 1-D grid.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "attention_dims.h"
#include "scheme.h"

namespace onnxstitch {
namespace {

constexpr const char* kSuffix = "_attn";  // the tiled kernel
constexpr const char* kDecode = "_attn_decode";  // decode shapes: split-KV partials (or the context)
constexpr const char* kMerge = "_attn_merge";    // and their merge
constexpr int kDefaultSharedLimit = 48 * 1024;
constexpr int kDecodeThreads = 128, kMergeThreads = 128;
constexpr long long kDecodeBlocksPerSm = 4;  // blocks the splits aim for, per multiprocessor

class Attention final : public Scheme {
 public:
  // The spec's named attributes (docs/abi.md): attention_<field> of schemes/attention/spec.py.
  Error Init(Attrs& a, size_t, size_t) override {
    AttentionSpec& s = spec_;
    int64_t masks = 0, transposed = 0, heads = 0, biases = 0;
    const char* rule = "attention";
    if (Error e = a.RequiredInt("attention_head_size", rule, &s.head)) return e;
    if (Error e = a.RequiredInt("attention_queries", rule, &s.queries)) return e;
    if (Error e = a.RequiredInt("attention_threads", rule, &s.threads)) return e;
    if (Error e = a.RequiredInt("attention_shared_bytes", rule, &s.shared)) return e;
    if (Error e = a.RequiredInt("attention_masks", rule, &masks)) return e;
    if (Error e = a.RequiredInt("attention_transposed", rule, &transposed)) return e;
    bool present = false;
    if (Error e = a.Int("attention_heads", &heads, &present)) return e;
    // Grouped KV heads: optional, 1 (K and V have q's heads) for nodes written before it.
    if (Error e = a.Int("attention_kv_group", &s.kv_group, &present)) return e;
    if (!present) s.kv_group = 1;
    // V's own head width: optional, absent (head size) for nodes whose V is as wide as q.
    if (Error e = a.Int("attention_value_size", &s.value, &present)) return e;
    if (!present) s.value = 0;
    if (Error e = a.Int("attention_decode_rows", &s.decode_rows, &present)) return e;
    if (present && s.decode_rows > 0) {
      if (Error e = a.RequiredInt("attention_decode_shared_bytes", rule, &s.decode_shared)) return e;
      if (Error e = a.RequiredInt("attention_decode_keys", rule, &s.decode_keys)) return e;
    } else {
      s.decode_rows = 0;
    }
    s.masks = static_cast<int>(masks);
    s.transposed = transposed != 0;
    s.projected = present && heads > 0;
    if (s.projected) {
      // Operands read from projections: the columns where q, k and v start, and their biases.
      std::vector<int64_t> offsets;
      if (Error e = a.Ints("attention_column_offsets", &offsets, &present)) return e;
      if (!present || offsets.size() != 3) {
        return Fail(ORT_INVALID_ARGUMENT, "attention_column_offsets must be INTS of three (q, k, v) with attention_heads");
      }
      if (Error e = a.RequiredInt("attention_biases", rule, &biases)) return e;
      s.heads = heads;
      for (int i = 0; i < 3; ++i) s.offsets[i] = offsets[i];
      s.biased = biases != 0;
    }
    std::string error;
    if (!CheckAttention(s, &error)) return Fail(ORT_INVALID_ARGUMENT, error);
    return {};
  }

  bool OutputShapes(const std::vector<std::vector<ShapeDim>>& ins, size_t n_out,
                    std::vector<std::vector<ShapeDim>>* outs) const override {
    std::vector<ShapeDim> shape;
    if (ins.empty() || n_out != 1 || !AttentionOutput(spec_, ins[0], &shape)) return false;
    outs->assign(1, shape);
    return true;
  }

  Error Entries(const cu::Driver& d, const std::string& kernel_name, Loaded* l) const override {
    // More dynamic shared memory than the default 48 KB where the kernel needs it.
    const std::string entry = kernel_name + kSuffix;
    cu::Result r = d.ModuleGetFunction(&l->entry[0], l->module, entry.c_str());
    if (r == cu::kSuccess && spec_.shared > kDefaultSharedLimit) {
      r = d.FuncSetAttribute(l->entry[0], cu::kFuncMaxDynamicSharedBytes, static_cast<int>(spec_.shared));
    }
    if (r != cu::kSuccess) {
      return Fail(ORT_FAIL, "the kernel image's entry '" + entry + "' cannot be used with " +
                                std::to_string(spec_.shared) + " bytes of shared memory: " + d.ErrorText(r));
    }
    if (spec_.decode_rows == 0) return {};
    const char* suffixes[2] = {kDecode, kMerge};
    for (int k = 0; k < 2; ++k) {
      const std::string name = kernel_name + suffixes[k];
      r = d.ModuleGetFunction(&l->more[k], l->module, name.c_str());
      if (r == cu::kSuccess && k == 0 && spec_.decode_shared > kDefaultSharedLimit) {
        r = d.FuncSetAttribute(l->more[0], cu::kFuncMaxDynamicSharedBytes, static_cast<int>(spec_.decode_shared));
      }
      if (r != cu::kSuccess) return Fail(ORT_FAIL, "the kernel image's entry '" + name + "': " + d.ErrorText(r));
    }
    return {};
  }

  Error Run(Call& call, Bound* b) const override {
    long long dims[4], mask_strides[kMaxMasks][4], widths[3];
    std::string error;
    if (!AttentionDims(spec_, b->shapes, b->ranks, b->n_in, dims, mask_strides, widths, &error)) {
      return Fail(ORT_INVALID_ARGUMENT, error);
    }
    StitchArgs& args = b->args;
    args.rank = 4;
    for (int d = 0; d < 4; ++d) args.dims[d] = dims[d];
    const size_t first = spec_.first_mask();
    for (int k = 0; k < spec_.masks; ++k) {
      for (int d = 0; d < 4; ++d) args.strides[first + k][d] = mask_strides[k][d];
    }
    if (spec_.projected) {
      for (int i = 0; i < 3; ++i) args.strides[i][0] = widths[i];
    }
    args.n = dims[0] * dims[1] * dims[2] * spec_.values();
    std::vector<ShapeDim> q, shape;
    for (size_t j = 0; j < b->ranks[0]; ++j) q.push_back(ShapeDim{b->shapes[0][j], ""});
    AttentionOutput(spec_, q, &shape);  // ranks were checked by AttentionDims
    int64_t out_dims[STITCH_MAX_RANK];
    for (size_t d = 0; d < shape.size(); ++d) out_dims[d] = shape[d].value;
    if (Error e = call.Output(0, out_dims, shape.size(), &args.out[0])) return e;
    const long long tiles = (dims[2] + spec_.queries - 1) / spec_.queries;
    const long long blocks = dims[0] * dims[1] * tiles;
    if (args.n == 0) return {};  // no queries (without keys the kernel writes zeros, as ORT)
    if (blocks > 0x7fffffffLL) return Fail(ORT_INVALID_ARGUMENT, "too many (batch, head, query tile) blocks");

    cu::Stream stream = nullptr;
    const Loaded* l = nullptr;
    if (Error e = call.Enter(&stream, &l)) return e;
    void* params[1] = {&args};
    if (spec_.decode_rows > 0 && spec_.kv_group * dims[2] <= spec_.decode_rows) return Decode(call, l, stream, &args);
    return call.Launch(l->entry[0], kSuffix, blocks, spec_.threads, spec_.shared, stream, params);
  }

 private:
  // Decode shapes (codegen's decode.py): a block per (batch, KV head, split of the keys) for all
  // g · Sq rows; as many splits as fill the GPU (whole tiles of keys each). One split writes the
  // context; more write float32 partials (max, sum, unnormalised context per row and split) to
  // scratch memory, which the merge kernel combines, one block per row.
  Error Decode(Call& call, const Loaded* l, cu::Stream stream, StitchArgs* args) const {
    const long long B = args->dims[0], H = args->dims[1], Sq = args->dims[2], Sk = args->dims[3];
    const long long kt = spec_.decode_keys, base = B * (H / spec_.kv_group);
    const long long tiles = (Sk + kt - 1) / kt;
    const long long want = (kDecodeBlocksPerSm * l->sm_count + base - 1) / base;
    long long splits = std::max(1LL, std::min(want, tiles));
    const long long chunk = std::max(kt, (tiles + splits - 1) / splits * kt);
    splits = Sk > 0 ? (Sk + chunk - 1) / chunk : 1;
    args->dims[4] = chunk;
    args->dims[5] = splits;
    args->out[1] = nullptr;
    const long long rows = B * H * Sq;
    if (splits > 1) {
      const size_t bytes = static_cast<size_t>(rows * splits * (spec_.head + 2)) * sizeof(float);
      if (Error e = call.Scratch(bytes, &args->out[1])) return e;
    }
    if (base * splits > 0x7fffffffLL || rows > 0x7fffffffLL) return Fail(ORT_INVALID_ARGUMENT, "too many decode blocks");
    void* params[1] = {args};
    if (Error e = call.Launch(l->more[0], kDecode, base * splits, kDecodeThreads, spec_.decode_shared, stream, params)) {
      return e;
    }
    if (splits == 1) return {};
    return call.Launch(l->more[1], kMerge, rows, kMergeThreads, 0, stream, params);
  }

  AttentionSpec spec_;
};

}  // namespace

std::unique_ptr<Scheme> MakeAttention() { return std::make_unique<Attention>(); }

}  // namespace onnxstitch
