// onnxstitch runtime: the com.onnxstitch::FusedKernel custom op for ONNX Runtime's CUDA EP.
//
// One op, heterogeneous variadic inputs and outputs of any tensor type, all in GPU memory. Each
// node carries its own compiled kernel (cubins + PTX) in attributes; this library loads the
// module once per CUDA context, computes the iteration shape, fills StitchArgs and launches on
// ORT's compute stream. The node/kernel contract is docs/abi.md.
//
// Rules kept throughout:
//  * Plain C API only (no ORT C++ wrappers): no C++ exception may cross into ORT, so every entry
//    point catches everything and returns an OrtStatus whose message names the node.
//  * The CUDA driver is reached through cuda_driver.h (dlopen + cuGetProcAddress), lazily at the
//    first Compute, so the library loads, registers and builds sessions on machines without GPUs.
//  * Compute allocates nothing but the outputs and never synchronises (CUDA-graph friendly).
//
// Attributes read by this library (see the report / docs/abi.md for the encoding of the images:
// ORT's custom-op C API cannot read STRINGS attributes, so cubins travel as one binary-safe STRING):
//   kernel_name STRING, vec_width INT, input_kinds INTS, output_dtypes INTS, shape_rule STRING,
//   image_archs INTS (major*10+minor, e.g. 90), image_sizes INTS, images STRING (the cubins
//   concatenated in image_archs order), ptx STRING.
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "attention.h"
#include "cuda_driver.h"
#include "input_boxes.h"
#include "output_views.h"
#include "stitch_abi.h"

#define STITCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace onnxstitch {
namespace {

constexpr const char* kDomain = "com.onnxstitch";
constexpr const char* kOpType = "FusedKernel";
#ifdef ONNXSTITCH_CPU_EP_FOR_TESTS
// Test build only (tests/test_runtime_build.py): registering for the CPU EP lets a machine
// without a GPU run everything up to the first driver call (attributes, shapes, outputs, errors).
constexpr const char* kProvider = "CPUExecutionProvider";
#else
constexpr const char* kProvider = "CUDAExecutionProvider";
#endif
constexpr int kBlock = 256;
constexpr long long kWideThreshold = 1LL << 30;  // the 32-bit vector entry stops short of this
constexpr int kEntries = 2;
constexpr const char* kEntrySuffix[kEntries] = {"_v32", "_s64"};
constexpr const char* kRowsEntrySuffix[kEntries] = {"_rows", "_rows64"};  // 32-bit, 64-bit indices
// Split rows (row_geometry[4] > 1): entries launching clusters of that many blocks per row, in
// images for GPUs with thread-block clusters (sm_90 on); absent elsewhere.
constexpr const char* kClusterEntrySuffix[kEntries] = {"_rows_cl", "_rows64_cl"};
constexpr const char* kAttentionEntrySuffix = "_attn";  // shape_rule "attention": one entry

// Our OrtCustomOp plus the OrtApi it was registered with (InferOutputShapeFn gets no api).
struct OpDef {
  OrtCustomOp op;  // first member: ORT hands back &op, we cast back to OpDef
  const OrtApi* api;
};

// An error on its way to becoming an OrtStatus.
struct Error {
  OrtErrorCode code = ORT_OK;
  std::string message;
  explicit operator bool() const { return code != ORT_OK; }
};

Error Fail(OrtErrorCode code, std::string message) { return Error{code, std::move(message)}; }

// Converts an OrtStatus from an ORT call into an Error (and releases it).
Error FromStatus(const OrtApi* api, OrtStatus* status, const char* what) {
  if (status == nullptr) return {};
  Error e{api->GetErrorCode(status), std::string(what) + ": " + api->GetErrorMessage(status)};
  if (e.code == ORT_OK) e.code = ORT_FAIL;
  api->ReleaseStatus(status);
  return e;
}

#define STITCH_TRY(expr, what)                            \
  do {                                                    \
    if (Error e_ = FromStatus(api_, (expr), (what))) return e_; \
  } while (0)

std::string ShapeText(const int64_t* dims, size_t rank) {
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// Kernel attribute reading (OrtKernelInfo).

struct AttrReader {
  const OrtApi* api_;
  const OrtKernelInfo* info_;

  // A failed read means "absent" unless ORT says the attribute exists with another type, which
  // is reported (e.g. images written as STRINGS by an older exporter must not be skipped silently).
  Error Absent(OrtStatus* st, const char* name, const char* expected, bool* present) {
    const std::string msg = api_->GetErrorMessage(st);
    api_->ReleaseStatus(st);
    *present = false;
    if (msg.find("No attribute") == std::string::npos && msg.find("type") != std::string::npos) {
      return Fail(ORT_INVALID_ARGUMENT, std::string("attribute '") + name + "' must be " + expected +
                                            " (" + msg + ")");
    }
    return {};
  }

  // Binary-safe: ORT reports the true size (+1 for a NUL it appends) and memcpy()s the bytes.
  Error String(const char* name, std::string* out, bool* present) {
    size_t size = 0;
    OrtStatus* st = api_->KernelInfoGetAttribute_string(info_, name, nullptr, &size);
    if (st != nullptr) return Absent(st, name, "a STRING", present);
    std::vector<char> buf(size + 1, '\0');
    size_t got = buf.size();
    STITCH_TRY(api_->KernelInfoGetAttribute_string(info_, name, buf.data(), &got),
               (std::string("reading attribute '") + name + "'").c_str());
    out->assign(buf.data(), got > 0 ? got - 1 : 0);
    *present = true;
    return {};
  }

  Error Ints(const char* name, std::vector<int64_t>* out, bool* present) {
    size_t size = 0;
    OrtStatus* st = api_->KernelInfoGetAttributeArray_int64(info_, name, nullptr, &size);
    if (st != nullptr) return Absent(st, name, "INTS", present);
    out->assign(size, 0);
    *present = true;
    if (size == 0) return {};
    STITCH_TRY(api_->KernelInfoGetAttributeArray_int64(info_, name, out->data(), &size),
               (std::string("reading attribute '") + name + "'").c_str());
    out->resize(size);
    return {};
  }

  Error Int(const char* name, int64_t* out, bool* present) {
    OrtStatus* st = api_->KernelInfoGetAttribute_int64(info_, name, out);
    if (st != nullptr) return Absent(st, name, "an INT", present);
    *present = true;
    return {};
  }
};

// ---------------------------------------------------------------------------------------------
// Per-context module cache entry.

struct Loaded {
  cu::Context ctx = nullptr;
  cu::Module module = nullptr;
  cu::Function entry[kEntries] = {nullptr, nullptr};  // v32, s64
  cu::Function cluster[kEntries] = {nullptr, nullptr};  // split rows on GPUs with clusters
  int sm_count = 1;
  int rows_blocks_per_sm = 0;  // rows kernels: resident blocks per multiprocessor (0: unknown)
  int cluster_blocks_per_sm = 0;  // the same for the cluster entries
};

// Pops the pushed context on every path out of Compute.
struct CtxGuard {
  const cu::Driver* driver = nullptr;
  ~CtxGuard() {
    if (driver != nullptr) {
      cu::Context popped = nullptr;
      driver->CtxPopCurrent(&popped);
    }
  }
};

class Kernel {
 public:
  Kernel(const OrtApi* api, std::string node_name) : api_(api), node_(std::move(node_name)) {}
  ~Kernel() { UnloadAll(); }

  Error Init(const OrtKernelInfo* info);
  Error Compute(OrtKernelContext* ctx);
  // One launch per scheme (the shape rule): attention, rows, elementwise ("broadcast").
  Error ComputeAttention(OrtKernelContext* ctx, StitchArgs* args, const int64_t (*shapes)[STITCH_MAX_RANK],
                         const size_t* ranks, size_t n_in);
  Error LaunchRows(const Loaded* l, cu::Stream stream, void** params, long long n, long long n_rows);
  Error LaunchElementwise(const Loaded* l, cu::Stream stream, void** params, const StitchArgs& args, long long n,
                          size_t n_in, size_t n_out);

  OrtStatus* ToStatus(const Error& e) const { return api_->CreateStatus(e.code, (Who() + ": " + e.message).c_str()); }

  // "FusedKernel node 'name' (kernel k)": the prefix of every message.
  std::string Who() const {
    std::string s = std::string(kOpType) + " node '" + node_ + "'";
    if (!kernel_name_.empty()) s += " (kernel " + kernel_name_ + ")";
    return s;
  }

 private:
  Error EnsureDriver();
  Error Enter(OrtKernelContext* ctx, CtxGuard* guard, cu::Stream* stream, const Loaded** l);
  Error ModuleFor(cu::Context ctx, const Loaded** out);
  Error LoadModule(Loaded* l);
  void UnloadAll() noexcept;
  std::string CuError(cu::Result r) const { return driver_.ErrorText(r); }

  const OrtApi* api_;
  std::string node_;

  // From the attributes; immutable after Init.
  std::string kernel_name_;
  int64_t vec_width_ = 1;
  std::vector<int64_t> input_kinds_;  // 0 FULL, 1 BROADCAST
  std::vector<int64_t> output_dtypes_;
  std::string shape_rule_;
  bool rows_ = false;                  // shape_rule "rows"
  std::vector<int64_t> output_kinds_;  // rows only: 0 full, 1 row (keepdims), 2 row (dims dropped)
  int64_t row_axes_ = 1, row_threads_ = 256, block_threads_ = 256;  // rows only: "row_geometry"
  int64_t row_inner_ = 0;  // rows only: axes after the row (a column reduction when > 0)
  int64_t row_split_ = 1;  // rows only: blocks per row (a cluster) where the image has cluster entries
  std::vector<OutputView> views_;      // broadcast only: per output, "output_views" (may be absent)
  std::vector<InputBox> boxes_;        // per input, "input_boxes" (may be absent): a folded Slice/Split
  std::vector<InputWindow> windows_;   // per input, "input_windows" (may be absent): a stitched Concat
  AttentionSpec attention_;            // shape_rule "attention" only
  std::vector<int64_t> image_archs_;   // major*10+minor
  std::vector<std::string> images_;    // one allocation each: cubins stay suitably aligned
  std::string ptx_;
  bool has_ptx_ = false;

  // Lazily initialised under mu_; after that read-only.
  std::mutex mu_;
  bool driver_tried_ = false;
  std::string driver_error_;
  cu::Driver driver_;
  std::map<unsigned long long, std::unique_ptr<Loaded>> loaded_;  // by context id
};

Error Kernel::Init(const OrtKernelInfo* info) {
  AttrReader r{api_, info};
  bool present = false;

  if (Error e = r.String("kernel_name", &kernel_name_, &present)) return e;
  if (!present || kernel_name_.empty()) {
    return Fail(ORT_INVALID_ARGUMENT, "missing STRING attribute 'kernel_name'");
  }
  if (Error e = r.Int("vec_width", &vec_width_, &present)) return e;
  if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing INT attribute 'vec_width'");
  if (vec_width_ < 1) {
    return Fail(ORT_INVALID_ARGUMENT, "vec_width must be >= 1, got " + std::to_string(vec_width_));
  }
  if (Error e = r.String("shape_rule", &shape_rule_, &present)) return e;
  if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing STRING attribute 'shape_rule'");

  if (Error e = r.Ints("input_kinds", &input_kinds_, &present)) return e;
  if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing INTS attribute 'input_kinds'");
  for (int64_t k : input_kinds_) {
    if (k != 0 && k != 1) {
      return Fail(ORT_INVALID_ARGUMENT,
                  "input_kinds values must be 0 (FULL) or 1 (BROADCAST), got " + std::to_string(k));
    }
  }
  if (Error e = r.Ints("output_dtypes", &output_dtypes_, &present)) return e;
  if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing INTS attribute 'output_dtypes'");
  rows_ = shape_rule_ == "rows";
  if (rows_) {
    // Row kernels (docs/abi.md): each output is full-shaped (0) or row-shaped, keepdims (1).
    if (Error e = r.Ints("output_kinds", &output_kinds_, &present)) return e;
    if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing INTS attribute 'output_kinds' (shape_rule \"rows\")");
    for (int64_t k : output_kinds_) {
      if (k < 0 || k > 2) {
        return Fail(ORT_INVALID_ARGUMENT, "output_kinds values must be 0, 1 or 2, got " + std::to_string(k));
      }
    }
    std::vector<int64_t> geo;
    if (Error e = r.Ints("row_geometry", &geo, &present)) return e;
    if (present) {
      // [row axes, threads per row, threads per block(, axes after the row)] (docs/abi.md)
      // Threads per row: a power of two up to a warp (lanes share shuffles), whole warps beyond.
      const bool lanes_ok = (geo.size() == 3 || (geo.size() >= 4 && geo.size() <= 5 && geo[3] >= 0 &&
                                                 geo[0] + geo[3] <= STITCH_MAX_RANK)) &&
                            geo[1] >= 1 && geo[1] <= 1024 &&
                            (geo[1] <= 32 ? (geo[1] & (geo[1] - 1)) == 0 : geo[1] % 32 == 0);
      // A row of more than a warp reduces across the whole block: then the block is the row.
      const bool ok = lanes_ok && geo[0] >= 1 && geo[0] <= STITCH_MAX_RANK && geo[2] >= geo[1] && geo[2] <= 1024 &&
                      geo[2] % geo[1] == 0 && (geo[1] <= 32 || geo[2] == geo[1]) &&
                      // a split row: 2..8 blocks (a portable cluster), each the row's block
                      (geo.size() < 5 || (geo[4] >= 1 && geo[4] <= 8 && (geo[4] == 1 || geo[2] == geo[1])));
      if (!ok) return Fail(ORT_INVALID_ARGUMENT, "row_geometry must be [row axes, threads per row (a power of two up to "
                                                 "32, else a multiple of 32), threads per block (a multiple up to 1024; "
                                                 "the same beyond 32), optionally the axes after the row and the blocks per row (1..8)]");
      row_axes_ = geo[0], row_threads_ = geo[1], block_threads_ = geo[2];
      row_inner_ = geo.size() >= 4 ? geo[3] : 0;
      row_split_ = geo.size() == 5 ? geo[4] : 1;
    }
  }

  if (shape_rule_ == "attention") {
    std::vector<int64_t> spec;
    std::string error;
    if (Error e = r.Ints("attention", &spec, &present)) return e;
    if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing INTS attribute 'attention' (shape_rule \"attention\")");
    if (!ParseAttention(spec, &attention_, &error)) return Fail(ORT_INVALID_ARGUMENT, error);
  }

  size_t n_in = 0, n_out = 0;
  STITCH_TRY(api_->KernelInfo_GetInputCount(info, &n_in), "KernelInfo_GetInputCount");
  STITCH_TRY(api_->KernelInfo_GetOutputCount(info, &n_out), "KernelInfo_GetOutputCount");
  if (n_in < 1 || n_in > STITCH_MAX_IN) {
    return Fail(ORT_INVALID_ARGUMENT, "has " + std::to_string(n_in) + " inputs; 1.." +
                                          std::to_string(STITCH_MAX_IN) + " are supported");
  }
  if (n_out < 1 || n_out > STITCH_MAX_OUT) {
    return Fail(ORT_INVALID_ARGUMENT, "has " + std::to_string(n_out) + " outputs; 1.." +
                                          std::to_string(STITCH_MAX_OUT) + " are supported");
  }
  if (rows_ && output_kinds_.size() != n_out) {
    return Fail(ORT_INVALID_ARGUMENT, "output_kinds has " + std::to_string(output_kinds_.size()) +
                                          " entries for " + std::to_string(n_out) + " outputs");
  }
  std::vector<int64_t> views;
  if (Error e = r.Ints("output_views", &views, &present)) return e;
  if (present && rows_) return Fail(ORT_INVALID_ARGUMENT, "output_views is for shape_rule \"broadcast\" only");
  std::string view_error;
  if (!ParseOutputViews(present ? views : std::vector<int64_t>(n_out, 0), n_out, &views_, &view_error)) {
    return Fail(ORT_INVALID_ARGUMENT, view_error);
  }
  std::vector<int64_t> box_attr;
  if (Error e = r.Ints("input_boxes", &box_attr, &present)) return e;
  if (!ParseInputBoxes(present ? box_attr : std::vector<int64_t>(), n_in, &boxes_, &view_error)) {
    return Fail(ORT_INVALID_ARGUMENT, view_error);
  }
  std::vector<int64_t> window_attr;
  if (Error e = r.Ints("input_windows", &window_attr, &present)) return e;
  if (!ParseInputWindows(present ? window_attr : std::vector<int64_t>(), n_in, &windows_, &view_error)) {
    return Fail(ORT_INVALID_ARGUMENT, view_error);
  }
  if (input_kinds_.size() != n_in) {
    return Fail(ORT_INVALID_ARGUMENT, "input_kinds has " + std::to_string(input_kinds_.size()) +
                                          " entries for " + std::to_string(n_in) + " inputs");
  }
  for (size_t i = 0; i < n_in; ++i) {
    if ((boxes_[i].present || windows_[i].present) && input_kinds_[i] != 1) {
      return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " has a box or window but is not BROADCAST (strided)");
    }
  }
  if (output_dtypes_.size() != n_out) {
    return Fail(ORT_INVALID_ARGUMENT, "output_dtypes has " +
                                          std::to_string(output_dtypes_.size()) + " entries for " +
                                          std::to_string(n_out) + " outputs");
  }
  // The outputs ORT allocates take the node's declared types; they must be what the kernel writes.
  for (size_t i = 0; i < n_out; ++i) {
    OrtTypeInfo* ti = nullptr;
    if (OrtStatus* st = api_->KernelInfo_GetOutputTypeInfo(info, i, &ti)) {
      api_->ReleaseStatus(st);  // no type recorded: nothing to compare against
      continue;
    }
    const OrtTensorTypeAndShapeInfo* tensor = nullptr;
    ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    OrtStatus* st = api_->CastTypeInfoToTensorInfo(ti, &tensor);
    if (st == nullptr && tensor != nullptr) st = api_->GetTensorElementType(tensor, &et);
    if (st != nullptr) api_->ReleaseStatus(st);
    api_->ReleaseTypeInfo(ti);
    if (et != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED && static_cast<int64_t>(et) != output_dtypes_[i]) {
      return Fail(ORT_INVALID_ARGUMENT, "output " + std::to_string(i) + " has element type " +
                                            std::to_string(static_cast<int>(et)) +
                                            " in the graph but output_dtypes says " +
                                            std::to_string(output_dtypes_[i]));
    }
  }

  // Kernel images. STRINGS attributes are unreadable through the custom-op C API, hence INTS
  // archs, byte sizes, and one STRING holding the cubins back to back.
  std::vector<int64_t> sizes;
  bool has_archs = false, has_sizes = false, has_images = false;
  std::string blob;
  if (Error e = r.Ints("image_archs", &image_archs_, &has_archs)) return e;
  if (Error e = r.Ints("image_sizes", &sizes, &has_sizes)) return e;
  if (Error e = r.String("images", &blob, &has_images)) return e;
  if (Error e = r.String("ptx", &ptx_, &has_ptx_)) return e;
  has_ptx_ = has_ptx_ && !ptx_.empty();
  if (has_images && !blob.empty()) {
    if (!has_archs || !has_sizes) {
      return Fail(ORT_INVALID_ARGUMENT,
                  "attribute 'images' needs 'image_archs' and 'image_sizes' as INTS (a STRINGS "
                  "attribute cannot be read by an ONNX Runtime custom op)");
    }
    if (sizes.size() != image_archs_.size()) {
      return Fail(ORT_INVALID_ARGUMENT, "image_sizes and image_archs differ in length");
    }
    size_t offset = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (sizes[k] <= 0 || image_archs_[k] < 10 || offset + static_cast<size_t>(sizes[k]) > blob.size()) {
        return Fail(ORT_INVALID_ARGUMENT, "image " + std::to_string(k) +
                                              ": bad image_sizes/image_archs entry");
      }
      images_.emplace_back(blob, offset, static_cast<size_t>(sizes[k]));
      offset += static_cast<size_t>(sizes[k]);
    }
    if (offset != blob.size()) {
      return Fail(ORT_INVALID_ARGUMENT, "image_sizes add up to " + std::to_string(offset) +
                                            " bytes but 'images' holds " + std::to_string(blob.size()));
    }
  } else {
    image_archs_.clear();
  }
  if (images_.empty() && !has_ptx_) {
    return Fail(ORT_INVALID_ARGUMENT,
                "carries no kernel image: neither 'images' (+ image_archs, image_sizes) nor 'ptx'");
  }
  return {};
}

Error Kernel::EnsureDriver() {
  // Caller holds mu_.
  if (!driver_tried_) {
    driver_tried_ = true;
    driver_error_ = driver_.Load();
  }
  if (!driver_error_.empty()) return Fail(ORT_FAIL, driver_error_);
  return {};
}

Error Kernel::LoadModule(Loaded* l) {
  // The context l->ctx is current on this thread.
  cu::Device dev = 0;
  cu::Result r = driver_.CtxGetDevice(&dev);
  if (r != cu::kSuccess) return Fail(ORT_FAIL, "cuCtxGetDevice failed: " + CuError(r));
  int major = 0, minor = 0, sms = 0;
  if ((r = driver_.DeviceGetAttribute(&major, cu::kAttrComputeCapabilityMajor, dev)) != cu::kSuccess ||
      (r = driver_.DeviceGetAttribute(&minor, cu::kAttrComputeCapabilityMinor, dev)) != cu::kSuccess ||
      (r = driver_.DeviceGetAttribute(&sms, cu::kAttrMultiprocessorCount, dev)) != cu::kSuccess) {
    return Fail(ORT_FAIL, "cuDeviceGetAttribute failed: " + CuError(r));
  }
  l->sm_count = std::max(1, sms);
  const std::string device_arch = "sm_" + std::to_string(major) + std::to_string(minor);

  // Cubin: same major as the device, the highest minor not above the device's.
  int best = -1;
  for (size_t k = 0; k < image_archs_.size(); ++k) {
    const int64_t a = image_archs_[k];
    if (a / 10 == major && a % 10 <= minor && (best < 0 || a % 10 > image_archs_[best] % 10)) {
      best = static_cast<int>(k);
    }
  }
  std::string why;
  if (best >= 0) {
    r = driver_.ModuleLoadDataEx(&l->module, images_[best].data(), 0, nullptr, nullptr);
    if (r != cu::kSuccess) {
      l->module = nullptr;
      why = "loading the sm_" + std::to_string(image_archs_[best]) + " cubin failed: " + CuError(r);
    }
  } else {
    why = "no cubin for " + device_arch + " (have:";
    for (int64_t a : image_archs_) why += " sm_" + std::to_string(a);
    why += image_archs_.empty() ? " none)" : ")";
  }
  if (l->module == nullptr && has_ptx_) {
    // PTX: the driver JIT-compiles it; keep its log for the error message.
    char log[4096] = {0};
    int options[2] = {cu::kJitErrorLogBuffer, cu::kJitErrorLogBufferSizeBytes};
    void* values[2] = {log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof(log) - 1))};
    r = driver_.ModuleLoadDataEx(&l->module, ptx_.c_str(), 2, options, values);
    if (r != cu::kSuccess) {
      l->module = nullptr;
      why += "; JIT of the PTX failed: " + CuError(r);
      if (log[0] != '\0') why += ": " + std::string(log);
    }
  } else if (l->module == nullptr) {
    why += "; no PTX to fall back on";
  }
  if (l->module == nullptr) return Fail(ORT_FAIL, "cannot load a kernel image for " + device_arch + ": " + why);

  if (attention_.present) {
    // One entry, with more dynamic shared memory than the default 48 KB where it needs it.
    const std::string entry = kernel_name_ + kAttentionEntrySuffix;
    r = driver_.ModuleGetFunction(&l->entry[0], l->module, entry.c_str());
    if (r == cu::kSuccess && attention_.shared > 48 * 1024) {
      r = driver_.FuncSetAttribute(l->entry[0], cu::kFuncMaxDynamicSharedBytes, static_cast<int>(attention_.shared));
    }
    if (r != cu::kSuccess) {
      driver_.ModuleUnload(l->module);
      l->module = nullptr;
      return Fail(ORT_FAIL, "the kernel image's entry '" + entry + "' cannot be used with " +
                                std::to_string(attention_.shared) + " bytes of shared memory: " + CuError(r));
    }
    return {};
  }
  for (int v = 0; v < kEntries; ++v) {
    const std::string entry = kernel_name_ + (rows_ ? kRowsEntrySuffix[v] : kEntrySuffix[v]);
    r = driver_.ModuleGetFunction(&l->entry[v], l->module, entry.c_str());
    if (r != cu::kSuccess) {
      driver_.ModuleUnload(l->module);
      l->module = nullptr;
      return Fail(ORT_FAIL, "the kernel image has no entry '" + entry + "': " + CuError(r));
    }
  }
  // Cluster entries are optional: an image for a GPU without clusters has none (both or neither).
  for (int v = 0; rows_ && row_split_ > 1 && v < kEntries; ++v) {
    const std::string entry = kernel_name_ + kClusterEntrySuffix[v];
    if (driver_.ModuleGetFunction(&l->cluster[v], l->module, entry.c_str()) != cu::kSuccess) l->cluster[v] = nullptr;
  }
  if (l->cluster[0] == nullptr || l->cluster[1] == nullptr) l->cluster[0] = l->cluster[1] = nullptr;
  if (rows_ && driver_.OccupancyMaxActiveBlocksPerMultiprocessor != nullptr) {
    int n = 0;
    if (driver_.OccupancyMaxActiveBlocksPerMultiprocessor(&n, l->entry[0], static_cast<int>(block_threads_), 0) ==
        cu::kSuccess) {
      l->rows_blocks_per_sm = n;
    }
    if (l->cluster[0] != nullptr &&
        driver_.OccupancyMaxActiveBlocksPerMultiprocessor(&n, l->cluster[0], static_cast<int>(block_threads_), 0) ==
            cu::kSuccess) {
      l->cluster_blocks_per_sm = n;
    }
  }
  return {};
}

Error Kernel::ModuleFor(cu::Context ctx, const Loaded** out) {
  // Caller has pushed ctx. Contexts are keyed by their unique id where the driver has one
  // (a destroyed context's address can be reused by a new one).
  unsigned long long key = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ctx));
  if (driver_.CtxGetId != nullptr) {
    unsigned long long id = 0;
    if (driver_.CtxGetId(ctx, &id) == cu::kSuccess) key = id;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = loaded_.find(key);
  if (it != loaded_.end()) {
    *out = it->second.get();
    return {};
  }
  auto l = std::make_unique<Loaded>();
  l->ctx = ctx;
  if (Error e = LoadModule(l.get())) return e;
  *out = l.get();
  loaded_.emplace(key, std::move(l));
  return {};
}

void Kernel::UnloadAll() noexcept {
  // Best effort: at process exit the driver may already be shut down; errors are ignored.
  for (auto& kv : loaded_) {
    Loaded* l = kv.second.get();
    if (l->module == nullptr) continue;
    if (driver_.CtxPushCurrent(l->ctx) == cu::kSuccess) {
      driver_.ModuleUnload(l->module);
      cu::Context popped = nullptr;
      driver_.CtxPopCurrent(&popped);
    }
  }
  loaded_.clear();
}

// ORT's compute stream, its context made current on this thread until `guard` goes, and the
// module loaded there.
Error Kernel::Enter(OrtKernelContext* ctx, CtxGuard* guard, cu::Stream* stream, const Loaded** l) {
  cu::Context cuctx = nullptr;
  void* stream_handle = nullptr;
  STITCH_TRY(api_->KernelContext_GetGPUComputeStream(ctx, &stream_handle), "KernelContext_GetGPUComputeStream");
  *stream = static_cast<cu::Stream>(stream_handle);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Error e = EnsureDriver()) return e;
  }
  cu::Result r = driver_.StreamContext(*stream, &cuctx);
  if ((r != cu::kSuccess || cuctx == nullptr) && *stream == nullptr) {
    r = driver_.CtxGetCurrent(&cuctx);  // legacy default stream: the thread's current context
  }
  if (r != cu::kSuccess || cuctx == nullptr) {
    return Fail(ORT_FAIL, "cannot get the CUDA context of ORT's compute stream: " +
                              (r != cu::kSuccess ? CuError(r) : std::string("no context")));
  }
  r = driver_.CtxPushCurrent(cuctx);
  if (r != cu::kSuccess) return Fail(ORT_FAIL, "cuCtxPushCurrent failed: " + CuError(r));
  guard->driver = &driver_;
  return ModuleFor(cuctx, l);
}

// An attention chain (docs/abi.md, "attention"): dims [B, H, Sq, Sk], mask k's strides in
// strides[first mask + k], projections' row widths in strides[0..2][0]; one block of `threads`
// per (batch, head) and `queries` queries, 1-D grid.
Error Kernel::ComputeAttention(OrtKernelContext* ctx, StitchArgs* args, const int64_t (*shapes)[STITCH_MAX_RANK],
                               const size_t* ranks, size_t n_in) {
  long long dims[4], mask_strides[kMaxMasks][4], widths[3];
  std::string error;
  if (!AttentionDims(attention_, shapes, ranks, n_in, dims, mask_strides, widths, &error)) {
    return Fail(ORT_INVALID_ARGUMENT, error);
  }
  args->rank = 4;
  for (int d = 0; d < 4; ++d) args->dims[d] = dims[d];
  const size_t first = attention_.first_mask();
  for (int k = 0; k < attention_.masks; ++k) {
    for (int d = 0; d < 4; ++d) args->strides[first + k][d] = mask_strides[k][d];
  }
  if (attention_.projected) {
    for (int i = 0; i < 3; ++i) args->strides[i][0] = widths[i];
  }
  args->n = dims[0] * dims[1] * dims[2] * attention_.head;
  std::vector<ShapeDim> q, shape;
  for (size_t j = 0; j < ranks[0]; ++j) q.push_back(ShapeDim{shapes[0][j], ""});
  AttentionOutput(attention_, q, &shape);  // ranks were checked by AttentionDims
  int64_t out_dims[STITCH_MAX_RANK];
  for (size_t d = 0; d < shape.size(); ++d) out_dims[d] = shape[d].value;
  OrtValue* v = nullptr;
  STITCH_TRY(api_->KernelContext_GetOutput(ctx, 0, out_dims, shape.size(), &v), "KernelContext_GetOutput");
  if (v == nullptr) return Fail(ORT_FAIL, "ORT returned no buffer for output 0");
  STITCH_TRY(api_->GetTensorMutableData(v, &args->out[0]), "GetTensorMutableData");
  const long long tiles = (dims[2] + attention_.queries - 1) / attention_.queries;
  const long long blocks = dims[0] * dims[1] * tiles;
  if (args->n == 0) return {};  // no queries (without keys the kernel writes zeros, as ORT)
  if (blocks > 0x7fffffffLL) return Fail(ORT_INVALID_ARGUMENT, "too many (batch, head, query tile) blocks");

  cu::Stream stream = nullptr;
  CtxGuard guard;
  const Loaded* l = nullptr;
  if (Error e = Enter(ctx, &guard, &stream, &l)) return e;
  void* params[1] = {args};
  const cu::Result r = driver_.LaunchKernel(l->entry[0], static_cast<unsigned int>(blocks), 1, 1,
                                            static_cast<unsigned int>(attention_.threads), 1, 1,
                                            static_cast<unsigned int>(attention_.shared), stream, params, nullptr);
  if (r != cu::kSuccess) {
    return Fail(ORT_FAIL, "cuLaunchKernel(" + kernel_name_ + kAttentionEntrySuffix + ", grid " +
                              std::to_string(blocks) + ") failed: " + CuError(r));
  }
  return {};
}

Error Kernel::Compute(OrtKernelContext* ctx) {
  if (shape_rule_ != "broadcast" && !rows_ && !attention_.present) {
    return Fail(ORT_NOT_IMPLEMENTED,
                "shape_rule '" + shape_rule_ + "' is not supported (\"broadcast\", \"rows\" or \"attention\")");
  }
  size_t n_in = 0, n_out = 0;
  STITCH_TRY(api_->KernelContext_GetInputCount(ctx, &n_in), "KernelContext_GetInputCount");
  STITCH_TRY(api_->KernelContext_GetOutputCount(ctx, &n_out), "KernelContext_GetOutputCount");
  if (n_in != input_kinds_.size() || n_out != output_dtypes_.size()) {
    return Fail(ORT_INVALID_ARGUMENT, "got " + std::to_string(n_in) + " inputs / " +
                                          std::to_string(n_out) + " outputs, attributes describe " +
                                          std::to_string(input_kinds_.size()) + " / " +
                                          std::to_string(output_dtypes_.size()));
  }

  StitchArgs args;
  std::memset(&args, 0, sizeof(args));  // unused slots are zero
  int64_t shapes[STITCH_MAX_IN][STITCH_MAX_RANK];
  long long own[STITCH_MAX_IN][STITCH_MAX_RANK];  // each input's contiguous element strides
  size_t ranks[STITCH_MAX_IN];

  for (size_t i = 0; i < n_in; ++i) {
    const OrtValue* v = nullptr;
    STITCH_TRY(api_->KernelContext_GetInput(ctx, i, &v), "KernelContext_GetInput");
    if (v == nullptr) return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " is missing");
    OrtTensorTypeAndShapeInfo* ti = nullptr;
    STITCH_TRY(api_->GetTensorTypeAndShape(v, &ti), "GetTensorTypeAndShape");
    size_t rank = 0;
    OrtStatus* st = api_->GetDimensionsCount(ti, &rank);
    if (st == nullptr && rank > STITCH_MAX_RANK) {
      api_->ReleaseTensorTypeAndShapeInfo(ti);
      return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " has rank " +
                                            std::to_string(rank) + "; at most " +
                                            std::to_string(STITCH_MAX_RANK) + " is supported");
    }
    if (st == nullptr) st = api_->GetDimensions(ti, shapes[i], rank);
    ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    if (st == nullptr) st = api_->GetTensorElementType(ti, &et);
    api_->ReleaseTensorTypeAndShapeInfo(ti);
    STITCH_TRY(st, "GetDimensions");
    ranks[i] = rank;
    long long stride = 1;
    for (size_t j = rank; j-- > 0;) own[i][j] = stride, stride *= shapes[i][j];
    void* data = nullptr;
    // ORT has no const accessor in this API version; the kernel only reads inputs.
    STITCH_TRY(api_->GetTensorMutableData(const_cast<OrtValue*>(v), &data), "GetTensorMutableData");
    args.in[i] = data;
    const InputBox& b = boxes_[i];
    const InputWindow& w = windows_[i];
    // Boxes and windows move the pointer by whole elements.
    const int64_t bytes = b.present || w.present ? ElementBytes(static_cast<int>(et)) : 0;
    if ((b.present || w.present) && bytes == 0) {
      return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " has an element type a box or window cannot step over");
    }
    if (b.present) {
      // A folded Slice/Split: the kernel reads [start, stop) along the axis, through the
      // tensor's own strides, from the box's first element on.
      if (static_cast<size_t>(b.axis) >= rank || b.stop > shapes[i][b.axis]) {
        return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " of shape " + ShapeText(shapes[i], rank) +
                                              " has no box [" + std::to_string(b.start) + ", " +
                                              std::to_string(b.stop) + ") along axis " + std::to_string(b.axis));
      }
      if (shapes[i][b.axis] > 0) args.in[i] = static_cast<char*>(data) + b.start * own[i][b.axis] * bytes;
      shapes[i][b.axis] = b.stop - b.start;
    }
    if (w.present) {
      // A stitched Concat's operand: the kernel loads it only inside its window, through its own
      // strides from `origin` elements before its first; it counts as the Concat's size.
      if (static_cast<size_t>(w.axis) >= rank || shapes[i][w.axis] != w.size) {
        return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " of shape " + ShapeText(shapes[i], rank) +
                                              " is not " + std::to_string(w.size) + " long along axis " +
                                              std::to_string(w.axis) + " (its Concat window)");
      }
      bool empty = false;
      for (size_t j = 0; j < rank; ++j) empty = empty || shapes[i][j] == 0;
      if (!empty) args.in[i] = static_cast<const char*>(args.in[i]) - w.origin * own[i][w.axis] * bytes;
      shapes[i][w.axis] = w.total;
    }
  }

  if (attention_.present) return ComputeAttention(ctx, &args, shapes, ranks, n_in);

  // Iteration shape: numpy broadcast of all input shapes (right-aligned).
  size_t rank = 0;
  for (size_t i = 0; i < n_in; ++i) rank = std::max(rank, ranks[i]);
  int64_t dims[STITCH_MAX_RANK];
  for (size_t d = 0; d < rank; ++d) dims[d] = 1;
  for (size_t i = 0; i < n_in; ++i) {
    for (size_t j = 0; j < ranks[i]; ++j) {
      const size_t d = rank - ranks[i] + j;
      const int64_t s = shapes[i][j];
      if (dims[d] == 1) {
        dims[d] = s;
      } else if (s != 1 && s != dims[d]) {
        std::string all;
        for (size_t k = 0; k < n_in; ++k) all += (k ? " " : "") + ShapeText(shapes[k], ranks[k]);
        return Fail(ORT_INVALID_ARGUMENT, "input shapes do not broadcast: " + all);
      }
    }
  }
  long long n = 1;
  for (size_t d = 0; d < rank; ++d) n *= dims[d];

  for (size_t i = 0; i < n_in; ++i) {
    // FULL inputs are indexed linearly: their shape must be the iteration shape (leading 1s,
    // which change no linear index, are tolerated).
    if (input_kinds_[i] == 0) {
      bool same = ranks[i] <= rank;
      for (size_t d = 0; same && d < rank; ++d) {
        const int64_t s = d + ranks[i] >= rank ? shapes[i][d + ranks[i] - rank] : 1;
        same = s == dims[d];
      }
      if (!same) {
        return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " is FULL but has shape " +
                                              ShapeText(shapes[i], ranks[i]) + ", not the iteration shape " +
                                              ShapeText(dims, rank));
      }
    }
    // Element strides of the input's own contiguous layout (a boxed input's: its tensor's),
    // mapped onto the iteration dims; 0 where the input is broadcast (missing leading dim, or
    // extent 1 against a larger one).
    for (size_t j = ranks[i]; j-- > 0;) {
      const size_t d = rank - ranks[i] + j;
      args.strides[i][d] = (shapes[i][j] == 1 && dims[d] != 1) ? 0 : own[i][j];
    }
  }
  args.n = n;
  args.rank = static_cast<int>(rank);
  for (size_t d = 0; d < rank; ++d) args.dims[d] = dims[d];

  if (rows_ && rank < static_cast<size_t>(row_axes_ + row_inner_)) {
    return Fail(ORT_INVALID_ARGUMENT, "a rows kernel over " + std::to_string(row_axes_) + " axes with " +
                                          std::to_string(row_inner_) + " after them got inputs of rank " +
                                          std::to_string(rank));
  }
  // Rows: the row_axes dims [lead, stop) are the row (C elements), trailing or followed by
  // row_inner others (columns); R rows over the other dims (which may exist when C is 0).
  const size_t stop = rows_ ? rank - static_cast<size_t>(row_inner_) : rank;
  const size_t lead = rows_ ? stop - static_cast<size_t>(row_axes_) : rank;
  long long n_rows = 1;
  for (size_t d = 0; rows_ && d < rank; ++d) n_rows *= (d >= lead && d < stop) ? 1 : dims[d];
  bool row_outputs = false;
  for (size_t o = 0; o < n_out; ++o) {
    OrtValue* v = nullptr;
    int64_t out_dims[STITCH_MAX_RANK];
    size_t out_rank = rank;
    for (size_t d = 0; d < rank; ++d) out_dims[d] = dims[d];
    // Row-shaped outputs hold one value per row, the reduction's identity for an empty row
    // (ONNX's rule, and ORT 1.32's CPU kernels; ORT 1.31 kept the empty dim of an all-empty input).
    if (rows_ && output_kinds_[o] == 1) {
      for (size_t d = lead; d < stop; ++d) out_dims[d] = 1;
      row_outputs = true;
    }
    if (rows_ && output_kinds_[o] == 2) {  // the row's dims dropped
      for (size_t d = stop; d < rank; ++d) out_dims[d - (stop - lead)] = dims[d];
      out_rank = rank - (stop - lead), row_outputs = true;
    }
    if (views_[o].present) {
      std::vector<ShapeDim> iter, shape;
      for (size_t d = 0; d < rank; ++d) iter.push_back(ShapeDim{dims[d], ""});
      std::string error;
      if (!ViewShape(views_[o], iter, &shape, &error)) {
        return Fail(ORT_INVALID_ARGUMENT, "output " + std::to_string(o) + "'s view of iteration shape " +
                                              ShapeText(dims, rank) + ": " + error);
      }
      out_rank = shape.size();
      for (size_t d = 0; d < out_rank; ++d) out_dims[d] = shape[d].value;
    }
    STITCH_TRY(api_->KernelContext_GetOutput(ctx, o, out_dims, out_rank, &v), "KernelContext_GetOutput");
    if (v == nullptr) return Fail(ORT_FAIL, "ORT returned no buffer for output " + std::to_string(o));
    void* data = nullptr;
    STITCH_TRY(api_->GetTensorMutableData(v, &data), "GetTensorMutableData");
    args.out[o] = data;
  }
  // Empty outputs allocated, nothing to launch; except row-shaped outputs of empty rows, which
  // still get one value per row.
  if (n == 0 && !(row_outputs && n_rows > 0)) return {};

  cu::Stream stream = nullptr;
  CtxGuard guard;
  const Loaded* l = nullptr;
  if (Error e = Enter(ctx, &guard, &stream, &l)) return e;
  void* params[1] = {&args};
  return rows_ ? LaunchRows(l, stream, params, n, n_rows) : LaunchElementwise(l, stream, params, args, n, n_in, n_out);
}

// The rows scheme's launch (docs/abi.md, "rows").
Error Kernel::LaunchRows(const Loaded* l, cu::Stream stream, void** params, long long n, long long n_rows) {
  cu::Result r = cu::kSuccess;
  // row_threads per row, block_threads per block; rows grid-strided (docs/abi.md).
  const long long per_block = block_threads_ / row_threads_;
  // One wave of resident blocks: each thread group then walks several rows, loading the
  // next row while it reduces this one (docs/abi.md).
  const long long resident = l->rows_blocks_per_sm > 0 ? l->rows_blocks_per_sm : 2048 / block_threads_;
  const long long cap = std::max<long long>(1, resident * l->sm_count);
  long long blocks = std::max<long long>(1, std::min<long long>((n_rows + per_block - 1) / per_block, cap));
  const int variant = n < kWideThreshold ? 0 : 1;
  cu::Function fn = l->entry[variant];
  const char* suffix = kRowsEntrySuffix[variant];
  if (l->cluster[variant] != nullptr) {
    // A split row: row_split blocks (one cluster, its size fixed in the image) per row, rows
    // grid-strided by cluster; a grid of whole clusters, at most one wave.
    const long long per_sm = l->cluster_blocks_per_sm > 0 ? l->cluster_blocks_per_sm : resident;
    const long long clusters = std::max<long long>(1, std::min<long long>(n_rows, per_sm * l->sm_count / row_split_));
    r = driver_.LaunchKernel(l->cluster[variant], static_cast<unsigned int>(clusters * row_split_), 1, 1,
                             static_cast<unsigned int>(block_threads_), 1, 1, 0, stream, params, nullptr);
    // A device that cannot place the clusters (a partitioned GPU) refuses the launch at once:
    // the one-block-per-row entry computes the same rows.
    if (r == cu::kSuccess) return {};
  }
  r = driver_.LaunchKernel(fn, static_cast<unsigned int>(blocks), 1, 1, static_cast<unsigned int>(block_threads_), 1,
                           1, 0, stream, params, nullptr);
  if (r != cu::kSuccess) {
    return Fail(ORT_FAIL, "cuLaunchKernel(" + kernel_name_ + suffix + ", grid " + std::to_string(blocks) +
                              ") failed: " + CuError(r));
  }
  return {};
}

// The elementwise scheme's launch (docs/abi.md, "broadcast").
Error Kernel::LaunchElementwise(const Loaded* l, cu::Stream stream, void** params, const StitchArgs& args,
                                long long n, size_t n_in, size_t n_out) {
  cu::Result r = cu::kSuccess;
  // Variant: vector entries need whole vectors and 16-byte aligned linear tensors.
  bool vector_ok = (n % vec_width_) == 0;
  for (size_t i = 0; vector_ok && i < n_in; ++i) {
    if (input_kinds_[i] == 0) vector_ok = (reinterpret_cast<uintptr_t>(args.in[i]) % 16) == 0;
  }
  for (size_t o = 0; vector_ok && o < n_out; ++o) {
    vector_ok = (reinterpret_cast<uintptr_t>(args.out[o]) % 16) == 0;
  }
  vector_ok = vector_ok && n < kWideThreshold;
  const int variant = vector_ok ? 0 : 1;  // _v32 or _s64
  const long long work = vector_ok ? n / vec_width_ : n;
  long long blocks = (work + kBlock - 1) / kBlock;
  blocks = std::min<long long>(blocks, 64LL * l->sm_count);  // 64: best of 16/32/64/uncapped on H200 (docs/perf-notes.md)
  blocks = std::max<long long>(blocks, 1);
  r = driver_.LaunchKernel(l->entry[variant], static_cast<unsigned int>(blocks), 1, 1, kBlock, 1, 1, 0,
                           stream, params, nullptr);
  if (r != cu::kSuccess) {
    return Fail(ORT_FAIL, "cuLaunchKernel(" + kernel_name_ + kEntrySuffix[variant] + ", grid " +
                              std::to_string(blocks) + ") failed: " + CuError(r));
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Shape inference (graph resolution). ORT ignores this function's status and, as of 1.31,
// ShapeInferContext_SetOutputTypeShape only records the shape: the output element types must be
// present in the model (value_info / graph outputs). So this only adds shapes, and only where they
// are certain; anything unexpected leaves the outputs untouched.

bool ReadInts(const OrtApi* api, const OrtShapeInferContext* ctx, const char* name, std::vector<int64_t>* out) {
  const OrtOpAttr* attr = nullptr;
  if (OrtStatus* st = api->ShapeInferContext_GetAttribute(ctx, name, &attr)) {
    api->ReleaseStatus(st);
    return false;
  }
  size_t bytes = 0;
  if (OrtStatus* st = api->ReadOpAttr(attr, ORT_OP_ATTR_INTS, nullptr, 0, &bytes)) api->ReleaseStatus(st);
  out->assign(bytes / sizeof(int64_t), 0);
  if (out->empty()) return true;
  if (OrtStatus* st = api->ReadOpAttr(attr, ORT_OP_ATTR_INTS, out->data(), out->size() * sizeof(int64_t), &bytes)) {
    api->ReleaseStatus(st);
    return false;
  }
  return true;
}

bool ReadString(const OrtApi* api, const OrtShapeInferContext* ctx, const char* name, std::string* out) {
  const OrtOpAttr* attr = nullptr;
  if (OrtStatus* st = api->ShapeInferContext_GetAttribute(ctx, name, &attr)) {
    api->ReleaseStatus(st);
    return false;
  }
  size_t bytes = 0;
  if (OrtStatus* st = api->ReadOpAttr(attr, ORT_OP_ATTR_STRING, nullptr, 0, &bytes)) api->ReleaseStatus(st);
  if (bytes == 0) return false;
  std::vector<char> buf(bytes + 1, '\0');
  if (OrtStatus* st = api->ReadOpAttr(attr, ORT_OP_ATTR_STRING, buf.data(), buf.size(), &bytes)) {
    api->ReleaseStatus(st);
    return false;
  }
  out->assign(buf.data());
  return true;
}

// Broadcast of input dims with names: a number other than 1 wins; else one shared name; else 1.
// Returns false where the result is not certain (unknown dims, two different names, clashes).
bool BroadcastSymbolic(const std::vector<std::vector<ShapeDim>>& ins, std::vector<ShapeDim>* out) {
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

// A name for a dim shape inference cannot size. ORT writes a dim given without a name as that
// number (ShapeInferContext_SetOutputTypeShape), so an unknown one given as -1 became the size
// -1, and ORT's inference downstream computed from it (a Reshape [0, -1] of [b, 2, -1] gave
// [b, -2]). A name of its own leaves it unknown and equal to nothing else; the counter only
// keeps names apart, as ORT's own symbolic names are.
std::string UnknownDimName() {
  static std::atomic<unsigned long long> next{0};
  return "onnxstitch_unk_" + std::to_string(next.fetch_add(1, std::memory_order_relaxed));
}

void InferShapes(const OrtApi* api, OrtShapeInferContext* ctx) {
  std::string rule;
  if (!ReadString(api, ctx, "shape_rule", &rule) || (rule != "broadcast" && rule != "rows" && rule != "attention")) return;
  std::vector<int64_t> dtypes;
  if (!ReadInts(api, ctx, "output_dtypes", &dtypes) || dtypes.empty()) return;
  std::vector<int64_t> out_kinds(dtypes.size(), 0);
  if (rule == "rows" && (!ReadInts(api, ctx, "output_kinds", &out_kinds) || out_kinds.size() != dtypes.size())) return;
  std::vector<int64_t> geo;
  size_t row_axes = 1, row_inner = 0;
  if (rule == "rows" && ReadInts(api, ctx, "row_geometry", &geo)) {
    if (geo.size() < 3 || geo.size() > 5 || geo[0] < 1 || (geo.size() >= 4 && geo[3] < 0)) return;
    row_axes = static_cast<size_t>(geo[0]);
    row_inner = geo.size() >= 4 ? static_cast<size_t>(geo[3]) : 0;
  }

  size_t n_in = 0;
  if (OrtStatus* st = api->ShapeInferContext_GetInputCount(ctx, &n_in)) {
    api->ReleaseStatus(st);
    return;
  }
  std::vector<std::vector<ShapeDim>> ins(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    OrtTensorTypeAndShapeInfo* info = nullptr;  // owned by ctx
    if (OrtStatus* st = api->ShapeInferContext_GetInputTypeShape(ctx, i, &info)) {
      api->ReleaseStatus(st);
      return;
    }
    size_t rank = 0;
    if (OrtStatus* st = api->GetDimensionsCount(info, &rank)) {
      api->ReleaseStatus(st);
      return;
    }
    // An input without shape information shows up as rank 0, like a scalar; the two cannot be
    // told apart here, so give up rather than infer a wrong rank.
    if (rank == 0 || rank > STITCH_MAX_RANK) return;
    std::vector<int64_t> values(rank);
    std::vector<const char*> names(rank, nullptr);
    OrtStatus* st = api->GetDimensions(info, values.data(), rank);
    if (st == nullptr) st = api->GetSymbolicDimensions(info, names.data(), rank);
    if (st != nullptr) {
      api->ReleaseStatus(st);
      return;
    }
    for (size_t j = 0; j < rank; ++j) {
      ins[i].push_back(ShapeDim{values[j], names[j] ? names[j] : ""});
    }
  }
  std::vector<int64_t> box_attr;
  std::vector<InputBox> boxes;
  std::string box_error;
  if (!ReadInts(api, ctx, "input_boxes", &box_attr)) box_attr.clear();
  if (!ParseInputBoxes(box_attr, n_in, &boxes, &box_error)) return;
  for (size_t i = 0; i < n_in; ++i) {
    if (!boxes[i].present) continue;
    if (static_cast<size_t>(boxes[i].axis) >= ins[i].size()) return;
    ins[i][boxes[i].axis] = ShapeDim{boxes[i].stop - boxes[i].start, ""};
  }
  std::vector<int64_t> window_attr;
  std::vector<InputWindow> windows;
  if (!ReadInts(api, ctx, "input_windows", &window_attr)) window_attr.clear();
  if (!ParseInputWindows(window_attr, n_in, &windows, &box_error)) return;
  for (size_t i = 0; i < n_in; ++i) {
    if (!windows[i].present) continue;
    if (static_cast<size_t>(windows[i].axis) >= ins[i].size()) return;
    ins[i][windows[i].axis] = ShapeDim{windows[i].total, ""};
  }
  std::vector<ShapeDim> shape;
  if (rule == "attention") {
    std::vector<int64_t> spec;
    AttentionSpec attention;
    std::string error;
    if (ins.empty() || !ReadInts(api, ctx, "attention", &spec) || !ParseAttention(spec, &attention, &error) ||
        !AttentionOutput(attention, ins[0], &shape)) {
      return;
    }
  } else if (!BroadcastSymbolic(ins, &shape)) {
    return;
  }
  std::vector<int64_t> view_attr;
  std::vector<OutputView> views;
  std::string view_error;
  if (!ReadInts(api, ctx, "output_views", &view_attr)) view_attr.assign(dtypes.size(), 0);
  if (!ParseOutputViews(view_attr, dtypes.size(), &views, &view_error)) return;
  if (rule == "rows" && shape.size() < row_axes + row_inner) return;
  const size_t stop = rule == "rows" ? shape.size() - row_inner : shape.size();
  const size_t lead = rule == "rows" ? stop - row_axes : shape.size();

  for (size_t o = 0; o < dtypes.size(); ++o) {
    std::vector<int64_t> values;
    std::vector<const char*> names;
    std::vector<ShapeDim> viewed;
    if (views[o].present && !ViewShape(views[o], shape, &viewed, &view_error)) return;
    std::vector<ShapeDim>& dims = views[o].present ? viewed : shape;
    std::vector<ShapeDim> named(dims);
    for (ShapeDim& d : named) {
      if (d.symbol.empty() && d.value < 0) d.symbol = UnknownDimName();
    }
    for (const ShapeDim& d : named) {
      values.push_back(d.symbol.empty() ? d.value : -1);
      names.push_back(d.symbol.c_str());
    }
    if (out_kinds[o] == 1) {  // row-shaped output: keepdims
      for (size_t d = lead; d < stop && d < values.size(); ++d) values[d] = 1, names[d] = "";
    }
    if (out_kinds[o] == 2 && stop <= values.size()) {  // the row's dims dropped
      values.erase(values.begin() + lead, values.begin() + stop);
      names.erase(names.begin() + lead, names.begin() + stop);
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

// ---------------------------------------------------------------------------------------------
// OrtCustomOp callbacks. Each one is noexcept in effect: nothing escapes into ORT.

std::string NodeName(const OrtApi* api, const OrtKernelInfo* info) {
  size_t size = 0;
  if (OrtStatus* st = api->KernelInfo_GetNodeName(info, nullptr, &size)) {
    api->ReleaseStatus(st);
    return "?";
  }
  std::vector<char> buf(size + 1, '\0');
  size_t got = buf.size();
  if (OrtStatus* st = api->KernelInfo_GetNodeName(info, buf.data(), &got)) {
    api->ReleaseStatus(st);
    return "?";
  }
  return std::string(buf.data());
}

OrtStatus* ORT_API_CALL CreateKernelV2(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info,
                                       void** kernel) {
  *kernel = nullptr;
  std::string who = std::string(kOpType) + " node";
  try {
    auto k = std::make_unique<Kernel>(api, NodeName(api, info));
    who = k->Who();
    if (Error e = k->Init(info)) return k->ToStatus(e);
    *kernel = k.release();
    return nullptr;
  } catch (const std::exception& ex) {
    return api->CreateStatus(ORT_FAIL, (who + ": " + ex.what()).c_str());
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, (who + ": unknown error while creating the kernel").c_str());
  }
}

OrtStatus* ORT_API_CALL KernelComputeV2(void* op_kernel, OrtKernelContext* context) {
  auto* k = static_cast<Kernel*>(op_kernel);
  try {
    Error e = k->Compute(context);
    return e ? k->ToStatus(e) : nullptr;
  } catch (const std::exception& ex) {
    return k->ToStatus(Error{ORT_FAIL, ex.what()});
  } catch (...) {
    return k->ToStatus(Error{ORT_FAIL, "unknown error in Compute"});
  }
}

void ORT_API_CALL KernelDestroy(void* op_kernel) {
  try {
    delete static_cast<Kernel*>(op_kernel);
  } catch (...) {
    // Destruction must not throw into ORT.
  }
}

OrtStatusPtr ORT_API_CALL InferOutputShape(const OrtCustomOp* op, OrtShapeInferContext* ctx) {
  try {
    InferShapes(reinterpret_cast<const OpDef*>(op)->api, ctx);
  } catch (...) {
    // Shapes are an optimisation; a failure here must not break graph resolution.
  }
  return nullptr;  // ORT ignores (and would leak) a returned status
}

const char* ORT_API_CALL GetName(const OrtCustomOp*) { return kOpType; }
const char* ORT_API_CALL GetExecutionProviderType(const OrtCustomOp*) { return kProvider; }
size_t ORT_API_CALL GetTypeCount(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL GetType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // any tensor type
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL GetCharacteristic(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_VARIADIC;
}
OrtMemType ORT_API_CALL GetInputMemoryType(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL GetVariadicMinArity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL GetVariadicHomogeneity(const OrtCustomOp*) { return 0; }  // mixed dtypes

void FillOp(OrtCustomOp* op) {
  std::memset(op, 0, sizeof(*op));
  op->version = ORT_API_VERSION;
  op->CreateKernel = nullptr;  // V2 entry points are used (ORT >= 1.16)
  op->GetName = GetName;
  op->GetExecutionProviderType = GetExecutionProviderType;
  op->GetInputType = GetType;
  op->GetInputTypeCount = GetTypeCount;
  op->GetOutputType = GetType;
  op->GetOutputTypeCount = GetTypeCount;
  op->KernelCompute = nullptr;
  op->KernelDestroy = KernelDestroy;
  op->GetInputCharacteristic = GetCharacteristic;
  op->GetOutputCharacteristic = GetCharacteristic;
  op->GetInputMemoryType = GetInputMemoryType;
  op->GetVariadicInputMinArity = GetVariadicMinArity;
  op->GetVariadicInputHomogeneity = GetVariadicHomogeneity;
  op->GetVariadicOutputMinArity = GetVariadicMinArity;
  op->GetVariadicOutputHomogeneity = GetVariadicHomogeneity;
  op->CreateKernelV2 = CreateKernelV2;
  op->KernelComputeV2 = KernelComputeV2;
  op->InferOutputShapeFn = InferOutputShape;
  // GetStartVersion/GetEndVersion null: since version 1, open ended. In-place/alias maps: none.
}

}  // namespace
}  // namespace onnxstitch

// Entry point ORT calls from SessionOptions.register_custom_ops_library / RegisterCustomOpsLibrary.
STITCH_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace onnxstitch;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // Runtime older than our headers; version 1 of the API still has CreateStatus.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string msg = std::string("onnxstitch: this ONNX Runtime (") + api_base->GetVersionString() +
                            ") is older than the API version " + std::to_string(ORT_API_VERSION) +
                            " the custom-op library was built for";
    return v1 ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  try {
    // The op definition and the domain must outlive every session made from these options; ORT
    // never hands them back, so they are kept for the life of the process (a few hundred bytes
    // per registration).
    auto* def = new OpDef;
    FillOp(&def->op);
    def->api = api;
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* st = api->CreateCustomOpDomain(kDomain, &domain)) return st;
    if (OrtStatus* st = api->CustomOpDomain_Add(domain, &def->op)) return st;
    if (OrtStatus* st = api->AddCustomOpDomain(options, domain)) return st;
    return nullptr;
  } catch (const std::exception& ex) {
    return api->CreateStatus(ORT_FAIL, (std::string("onnxstitch: registering custom ops failed: ") + ex.what()).c_str());
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, "onnxstitch: registering custom ops failed");
  }
}
