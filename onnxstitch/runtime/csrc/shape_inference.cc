// onnxstitch runtime: shape inference of the FusedKernel op (graph resolution), apart from the
// kernel itself (fused_kernel.cc). ORT ignores this function's status and, as of 1.31,
// ShapeInferContext_SetOutputTypeShape only records the shape: the output element types must be
// present in the model (value_info / graph outputs). So this only adds shapes, and only where they
// are certain; anything unexpected leaves the outputs untouched.
#include "shape_inference.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "input_boxes.h"
#include "scheme.h"
#include "stitch_abi.h"

namespace onnxstitch {
namespace {

// The same attributes in shape inference (OrtShapeInferContext): anything unreadable is absent.
class InferAttrs final : public Attrs {
 public:
  InferAttrs(const OrtApi* api, const OrtShapeInferContext* ctx) : api_(api), ctx_(ctx) {}

  Error Int(const char* name, int64_t* out, bool* present) override {
    *present = Read(name, ORT_OP_ATTR_INT, out, sizeof(*out)) == sizeof(*out);
    return {};
  }

  Error Ints(const char* name, std::vector<int64_t>* out, bool* present) override {
    const size_t bytes = Read(name, ORT_OP_ATTR_INTS, nullptr, 0);
    out->assign(bytes == kAbsent ? 0 : bytes / sizeof(int64_t), 0);
    *present = bytes != kAbsent && (out->empty() || Read(name, ORT_OP_ATTR_INTS, out->data(), bytes) == bytes);
    return {};
  }

  Error String(const char* name, std::string* out, bool* present) override {
    const size_t bytes = Read(name, ORT_OP_ATTR_STRING, nullptr, 0);
    std::vector<char> buf(bytes == kAbsent ? 1 : bytes + 1, '\0');
    *present = bytes != kAbsent && bytes > 0 && Read(name, ORT_OP_ATTR_STRING, buf.data(), buf.size()) != kAbsent;
    if (*present) out->assign(buf.data());
    return {};
  }

 private:
  static constexpr size_t kAbsent = static_cast<size_t>(-1);

  // Copies the attribute into `data` (when given) and returns its size in bytes, kAbsent when
  // it is missing or unreadable. A size query (no buffer) reports the size with a status.
  size_t Read(const char* name, OrtOpAttrType type, void* data, size_t size) {
    const OrtOpAttr* attr = nullptr;
    if (OrtStatus* st = api_->ShapeInferContext_GetAttribute(ctx_, name, &attr)) {
      api_->ReleaseStatus(st);
      return kAbsent;
    }
    size_t bytes = size;  // ORT may leave it unset when it copied a single INT
    if (OrtStatus* st = api_->ReadOpAttr(attr, type, data, size, &bytes)) {
      api_->ReleaseStatus(st);
      if (data != nullptr) return kAbsent;
    }
    return bytes;
  }

  const OrtApi* api_;
  const OrtShapeInferContext* ctx_;
};

// A name for a dim shape inference cannot size. ORT writes a dim given without a name as that
// number (ShapeInferContext_SetOutputTypeShape), so an unknown one given as -1 became the size
// -1, and ORT's inference downstream computed from it (a Reshape [0, -1] of [b, 2, -1] gave
// [b, -2]). A name of its own leaves it unknown and equal to nothing else; the counter only
// keeps names apart, as ORT's own symbolic names are.
std::string UnknownDimName() {
  static std::atomic<unsigned long long> next{0};
  return "onnxstitch_unk_" + std::to_string(next.fetch_add(1, std::memory_order_relaxed));
}

// Each input's shape as the kernel sees it: a box's extent, a window's total; false where an
// input has no shape information.
bool InputShapes(const OrtApi* api, OrtShapeInferContext* ctx, Attrs& attrs, std::vector<std::vector<ShapeDim>>* ins) {
  size_t n_in = 0;
  if (OrtStatus* st = api->ShapeInferContext_GetInputCount(ctx, &n_in)) {
    api->ReleaseStatus(st);
    return false;
  }
  ins->assign(n_in, {});
  for (size_t i = 0; i < n_in; ++i) {
    OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by ctx
    if (OrtStatus* st = api->ShapeInferContext_GetInputTypeShape(ctx, i, &info)) {
      api->ReleaseStatus(st);
      return false;
    }
    size_t rank = 0;
    if (OrtStatus* st = api->GetDimensionsCount(info, &rank)) {
      api->ReleaseStatus(st);
      return false;
    }
    // An input without shape information shows up as rank 0, like a scalar; the two cannot be
    // told apart here, so give up rather than infer a wrong rank.
    if (rank == 0 || rank > STITCH_MAX_RANK) return false;
    std::vector<int64_t> values(rank);
    std::vector<const char*> names(rank, nullptr);
    OrtStatus* st = api->GetDimensions(info, values.data(), rank);
    if (st == nullptr) st = api->GetSymbolicDimensions(info, names.data(), rank);
    if (st != nullptr) {
      api->ReleaseStatus(st);
      return false;
    }
    for (size_t j = 0; j < rank; ++j) (*ins)[i].push_back(ShapeDim{values[j], names[j] ? names[j] : ""});
  }
  std::vector<int64_t> attr;
  std::vector<InputBox> boxes;
  std::vector<InputWindow> windows;
  std::string error;
  bool present = false;
  if (attrs.Ints("input_boxes", &attr, &present) || !ParseInputBoxes(present ? attr : std::vector<int64_t>(), n_in, &boxes, &error)) {
    return false;
  }
  if (attrs.Ints("input_windows", &attr, &present) ||
      !ParseInputWindows(present ? attr : std::vector<int64_t>(), n_in, &windows, &error)) {
    return false;
  }
  for (size_t i = 0; i < n_in; ++i) {
    std::vector<ShapeDim>& in = (*ins)[i];
    if (boxes[i].present && static_cast<size_t>(boxes[i].axis) >= in.size()) return false;
    if (boxes[i].present) in[boxes[i].axis] = ShapeDim{boxes[i].stop - boxes[i].start, ""};
    if (windows[i].present && static_cast<size_t>(windows[i].axis) >= in.size()) return false;
    if (windows[i].present) in[windows[i].axis] = ShapeDim{windows[i].total, ""};
  }
  return true;
}

}  // namespace

void InferShapes(const OrtApi* api, OrtShapeInferContext* ctx) {
  InferAttrs attrs(api, ctx);
  std::string rule;
  std::vector<int64_t> dtypes;
  bool has_rule = false, has_dtypes = false;
  attrs.String("shape_rule", &rule, &has_rule);
  attrs.Ints("output_dtypes", &dtypes, &has_dtypes);
  std::unique_ptr<Scheme> scheme = has_rule ? MakeScheme(rule) : nullptr;
  std::vector<std::vector<ShapeDim>> ins, outs;
  if (scheme == nullptr || !has_dtypes || dtypes.empty() || !InputShapes(api, ctx, attrs, &ins) ||
      scheme->Init(attrs, ins.size(), dtypes.size()) || !scheme->OutputShapes(ins, dtypes.size(), &outs) ||
      outs.size() != dtypes.size()) {
    return;
  }
  for (size_t o = 0; o < dtypes.size(); ++o) {
    std::vector<int64_t> values;
    std::vector<const char*> names;
    for (ShapeDim& d : outs[o]) {
      if (d.symbol.empty() && d.value < 0) d.symbol = UnknownDimName();
    }
    for (const ShapeDim& d : outs[o]) {
      values.push_back(d.symbol.empty() ? d.value : -1);
      names.push_back(d.symbol.c_str());
    }
    OrtTensorTypeAndShapeInfo* info = nullptr;
    if (OrtStatus* st = api->CreateTensorTypeAndShapeInfo(&info)) {
      api->ReleaseStatus(st);
      return;
    }
    OrtStatus* st = api->SetTensorElementType(info, static_cast<ONNXTensorElementDataType>(dtypes[o]));
    if (st == nullptr) st = api->SetDimensions(info, values.data(), values.size());
    if (st == nullptr) st = api->SetSymbolicDimensions(info, names.data(), names.size());
    if (st == nullptr) st = api->ShapeInferContext_SetOutputTypeShape(ctx, o, info);
    if (st != nullptr) api->ReleaseStatus(st);
    api->ReleaseTensorTypeAndShapeInfo(info);
  }
}

}  // namespace onnxstitch
