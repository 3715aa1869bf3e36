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
//   kernel_name STRING, input_kinds INTS, output_dtypes INTS, shape_rule STRING, input_boxes and
//   input_windows INTS (optional), image_archs INTS (major*10+minor, e.g. 90), image_sizes INTS,
//   images STRING (the cubins concatenated in image_archs order), ptx STRING, images_sha256
//   STRING (optional: the digest of images then ptx, checked before anything loads); and the attributes
//   of the node's scheme, which its launch.cc reads (scheme.h: the scheme named by shape_rule).
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "input_boxes.h"
#include "output_views.h"
#include "scheme.h"
#include "sha256.h"
#include "kernel_entry.h"
#include "stitch_abi.h"

namespace onnxstitch {
namespace {

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

// ---------------------------------------------------------------------------------------------
// Kernel attribute reading (OrtKernelInfo).

class KernelAttrs final : public Attrs {
 public:
  KernelAttrs(const OrtApi* api, const OrtKernelInfo* info) : api_(api), info_(info) {}

  // Binary-safe: ORT reports the true size (+1 for a NUL it appends) and memcpy()s the bytes.
  Error String(const char* name, std::string* out, bool* present) override {
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

  Error Ints(const char* name, std::vector<int64_t>* out, bool* present) override {
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

  Error Int(const char* name, int64_t* out, bool* present) override {
    OrtStatus* st = api_->KernelInfoGetAttribute_int64(info_, name, out);
    if (st != nullptr) return Absent(st, name, "an INT", present);
    *present = true;
    return {};
  }

  // The device of the node's default allocator (the CUDA EP's), -1 where ORT says none.
  int DeviceOrdinal() override {
    OrtAllocator* alloc = nullptr;
    if (OrtStatus* st = api_->KernelInfoGetAllocator(info_, OrtMemTypeDefault, &alloc)) {
      api_->ReleaseStatus(st);
      return -1;
    }
    int id = -1;
    const OrtMemoryInfo* mem = nullptr;
    if (OrtStatus* st = api_->AllocatorGetInfo(alloc, &mem)) {
      api_->ReleaseStatus(st);
    } else if (OrtStatus* st2 = api_->MemoryInfoGetId(mem, &id)) {
      api_->ReleaseStatus(st2);
      id = -1;
    }
    api_->ReleaseAllocator(alloc);
    return id;
  }

 private:
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
};

// ---------------------------------------------------------------------------------------------
// The node.

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

  OrtStatus* ToStatus(const Error& e) const { return api_->CreateStatus(e.code, (Who() + ": " + e.message).c_str()); }

  // "FusedKernel node 'name' (kernel k)": the prefix of every message.
  std::string Who() const {
    std::string s = std::string(kOpType) + " node '" + node_ + "'";
    if (!kernel_name_.empty()) s += " (kernel " + kernel_name_ + ")";
    return s;
  }

 private:
  friend class NodeCall;
  Error InitImages(KernelAttrs& r);
  Error Bind(OrtKernelContext* ctx, Bound* b) const;
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
  std::vector<int64_t> input_kinds_;  // 0 FULL, 1 BROADCAST
  std::vector<int64_t> output_dtypes_;
  std::string shape_rule_;
  std::unique_ptr<Scheme> scheme_;     // the shape rule's: its attributes, entries and launch
  std::vector<InputBox> boxes_;        // per input, "input_boxes" (may be absent): a folded Slice/Split
  std::vector<InputWindow> windows_;   // per input, "input_windows" (may be absent): a stitched Concat
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
  KernelAttrs r(api_, info);
  bool present = false;

  if (Error e = r.String("kernel_name", &kernel_name_, &present)) return e;
  if (!present || kernel_name_.empty()) {
    return Fail(ORT_INVALID_ARGUMENT, "missing STRING attribute 'kernel_name'");
  }
  if (Error e = r.String("shape_rule", &shape_rule_, &present)) return e;
  if (!present) return Fail(ORT_INVALID_ARGUMENT, "missing STRING attribute 'shape_rule'");
  scheme_ = MakeScheme(shape_rule_);
  if (scheme_ == nullptr) {
    return Fail(ORT_NOT_IMPLEMENTED,
                "shape_rule '" + shape_rule_ + "' is not supported (\"broadcast\", \"rows\", \"attention\" or \"gemm\")");
  }
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
  if (Error e = scheme_->Init(r, n_in, n_out)) return e;
  std::string error;
  std::vector<int64_t> attr;
  if (Error e = r.Ints("input_boxes", &attr, &present)) return e;
  if (!ParseInputBoxes(present ? attr : std::vector<int64_t>(), n_in, &boxes_, &error)) {
    return Fail(ORT_INVALID_ARGUMENT, error);
  }
  if (Error e = r.Ints("input_windows", &attr, &present)) return e;
  if (!ParseInputWindows(present ? attr : std::vector<int64_t>(), n_in, &windows_, &error)) {
    return Fail(ORT_INVALID_ARGUMENT, error);
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

  return InitImages(r);
}

Error Kernel::InitImages(KernelAttrs& r) {
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
  // The images are executable code: where the node states their digest, code that does not
  // match it (a corrupted or edited model) is refused before anything is loaded.
  std::string digest;
  bool has_digest = false;
  if (Error e = r.String("images_sha256", &digest, &has_digest)) return e;
  if (has_digest) {
    Sha256 h;
    h.Update(blob.data(), blob.size());
    h.Update(ptx_.data(), ptx_.size());
    const std::string actual = h.HexDigest();
    if (actual != digest) {
      return Fail(ORT_INVALID_ARGUMENT, "its kernel images do not match their SHA-256 (images_sha256 " +
                                            digest.substr(0, 16) + "..., the images hash to " + actual.substr(0, 16) +
                                            "...): the model was altered after onnxstitch wrote it");
    }
  }
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
  if (images_.empty() && !has_ptx_ && scheme_->UsesImage()) {
    return Fail(ORT_INVALID_ARGUMENT,
                "carries no kernel image: neither 'images' (+ image_archs, image_sizes) nor 'ptx'");
  }
  if (!scheme_->UsesImage() && !images_.empty()) return scheme_->TakeImages(image_archs_, images_);
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
  l->cc = major * 10 + minor;
  if (!scheme_->UsesImage()) return {};  // a library call: the context is all it needs
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

  if (Error e = scheme_->Entries(driver_, kernel_name_, l)) {
    driver_.ModuleUnload(l->module);
    l->module = nullptr;
    return e;
  }
  return {};
}

Error Kernel::ModuleFor(cu::Context ctx, const Loaded** out) {
  // Caller has pushed ctx.
  const unsigned long long key = driver_.ContextKey(ctx);
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

// What a scheme's launch asks of the node during one Compute.
class NodeCall final : public Call {
 public:
  NodeCall(Kernel* k, OrtKernelContext* ctx) : k_(k), ctx_(ctx) {}
  NodeCall(const NodeCall&) = delete;
  NodeCall& operator=(const NodeCall&) = delete;
  ~NodeCall() override {
    for (void* p : scratch_) allocator_->Free(allocator_, p);
    if (allocator_ != nullptr) k_->api_->ReleaseAllocator(allocator_);
  }

  Error Output(size_t o, const int64_t* dims, size_t rank, void** data) override {
    const OrtApi* api_ = k_->api_;
    OrtValue* v = nullptr;
    STITCH_TRY(api_->KernelContext_GetOutput(ctx_, o, dims, rank, &v), "KernelContext_GetOutput");
    if (v == nullptr) return Fail(ORT_FAIL, "ORT returned no buffer for output " + std::to_string(o));
    STITCH_TRY(api_->GetTensorMutableData(v, data), "GetTensorMutableData");
    if (output_ == nullptr) output_ = v;
    return {};
  }

  Error Scratch(size_t bytes, void** data) override {
    const OrtApi* api_ = k_->api_;
    *data = nullptr;
    if (output_ == nullptr) return Fail(ORT_FAIL, "scratch memory asked for before an output (its device)");
    if (allocator_ == nullptr) {
      const OrtMemoryInfo* info = nullptr;
      STITCH_TRY(api_->GetTensorMemoryInfo(output_, &info), "GetTensorMemoryInfo");
      STITCH_TRY(api_->KernelContext_GetAllocator(ctx_, info, &allocator_), "KernelContext_GetAllocator");
    }
    void* p = allocator_->Alloc(allocator_, bytes);
    if (p == nullptr) return Fail(ORT_FAIL, "ORT's allocator gave no " + std::to_string(bytes) + " bytes of scratch memory");
    scratch_.push_back(p);
    *data = p;
    return {};
  }

  Error Enter(cu::Stream* stream, const Loaded** l) override { return k_->Enter(ctx_, &guard_, stream, l); }
  const cu::Driver& Driver() const override { return k_->driver_; }
  const std::string& KernelName() const override { return k_->kernel_name_; }

 private:
  Kernel* k_;
  OrtKernelContext* ctx_;
  OrtValue* output_ = nullptr;  // the first output, whose device the scratch memory is on
  OrtAllocator* allocator_ = nullptr;
  std::vector<void*> scratch_;
  CtxGuard guard_;  // pops the context Enter pushed when the Compute returns
};

// The inputs of one Compute: pointers, shapes and strides, boxes and windows applied.
Error Kernel::Bind(OrtKernelContext* ctx, Bound* b) const {
  const size_t n_in = b->n_in;
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
    if (st == nullptr) st = api_->GetDimensions(ti, b->shapes[i], rank);
    ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    if (st == nullptr) st = api_->GetTensorElementType(ti, &et);
    api_->ReleaseTensorTypeAndShapeInfo(ti);
    STITCH_TRY(st, "GetDimensions");
    b->ranks[i] = rank;
    long long stride = 1;
    for (size_t j = rank; j-- > 0;) b->own[i][j] = stride, stride *= b->shapes[i][j];
    void* data = nullptr;
    // ORT has no const accessor in this API version; the kernel only reads inputs.
    STITCH_TRY(api_->GetTensorMutableData(const_cast<OrtValue*>(v), &data), "GetTensorMutableData");
    b->args.in[i] = data;
    const InputBox& box = boxes_[i];
    const InputWindow& w = windows_[i];
    // Boxes and windows move the pointer by whole elements.
    const int64_t bytes = box.present || w.present ? ElementBytes(static_cast<int>(et)) : 0;
    if ((box.present || w.present) && bytes == 0) {
      return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " has an element type a box or window cannot step over");
    }
    if (box.present) {
      // A folded Slice/Split: the kernel reads [start, stop) along the axis, through the
      // tensor's own strides, from the box's first element on.
      if (static_cast<size_t>(box.axis) >= rank || box.stop > b->shapes[i][box.axis]) {
        return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " of shape " + ShapeText(b->shapes[i], rank) +
                                              " has no box [" + std::to_string(box.start) + ", " +
                                              std::to_string(box.stop) + ") along axis " + std::to_string(box.axis));
      }
      if (b->shapes[i][box.axis] > 0) b->args.in[i] = static_cast<char*>(data) + box.start * b->own[i][box.axis] * bytes;
      b->shapes[i][box.axis] = box.stop - box.start;
    }
    if (w.present) {
      // A stitched Concat's operand: the kernel loads it only inside its window, through its own
      // strides from `origin` elements before its first; it counts as the Concat's size.
      if (static_cast<size_t>(w.axis) >= rank || b->shapes[i][w.axis] != w.size) {
        return Fail(ORT_INVALID_ARGUMENT, "input " + std::to_string(i) + " of shape " + ShapeText(b->shapes[i], rank) +
                                              " is not " + std::to_string(w.size) + " long along axis " +
                                              std::to_string(w.axis) + " (its Concat window)");
      }
      bool empty = false;
      for (size_t j = 0; j < rank; ++j) empty = empty || b->shapes[i][j] == 0;
      if (!empty) b->args.in[i] = static_cast<const char*>(b->args.in[i]) - w.origin * b->own[i][w.axis] * bytes;
      b->shapes[i][w.axis] = w.total;
    }
  }
  return {};
}

Error Kernel::Compute(OrtKernelContext* ctx) {
  size_t n_in = 0, n_out = 0;
  STITCH_TRY(api_->KernelContext_GetInputCount(ctx, &n_in), "KernelContext_GetInputCount");
  STITCH_TRY(api_->KernelContext_GetOutputCount(ctx, &n_out), "KernelContext_GetOutputCount");
  if (n_in != input_kinds_.size() || n_out != output_dtypes_.size()) {
    return Fail(ORT_INVALID_ARGUMENT, "got " + std::to_string(n_in) + " inputs / " +
                                          std::to_string(n_out) + " outputs, attributes describe " +
                                          std::to_string(input_kinds_.size()) + " / " +
                                          std::to_string(output_dtypes_.size()));
  }
  Bound b;
  std::memset(&b.args, 0, sizeof(b.args));  // unused slots are zero
  b.kinds = input_kinds_.data();
  b.n_in = n_in, b.n_out = n_out;
  if (Error e = Bind(ctx, &b)) return e;
  NodeCall call(this, ctx);
  return scheme_->Run(call, &b);
}

// ---------------------------------------------------------------------------------------------
// The node's name, for messages.

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// The kernel's entry points (kernel_entry.h), for the op's registration (custom_op.cc). Each one is
// noexcept in effect: nothing escapes into ORT.

OrtStatus* CreateKernel(const OrtApi* api, const OrtKernelInfo* info, void** kernel) {
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

OrtStatus* ComputeKernel(void* op_kernel, OrtKernelContext* context) {
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

void DestroyKernel(void* op_kernel) noexcept {
  try {
    delete static_cast<Kernel*>(op_kernel);
  } catch (...) {
    // Destruction must not throw into ORT.
  }
}

}  // namespace onnxstitch
