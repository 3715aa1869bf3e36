// One cuDNN operation graph and its execution plan, through the backend API (cudnn_api.h): the
// library epilogues describe a product or convolution and the pointwise work after it as tensors
// and operations, and cuDNN's heuristics pick an engine that runs them as one kernel where one
// exists. Errors are strings naming the call that failed ("" is success), as cudnn_api.h's Load.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cudnn_api.h"

namespace onnxstitch {
namespace dnn {

// Owns one backend descriptor.
class Desc {
 public:
  Desc() = default;
  Desc(const Api* api, Descriptor d) : api_(api), d_(d) {}
  Desc(Desc&& o) noexcept : api_(o.api_), d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      Reset();
      api_ = o.api_;
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() { Reset(); }
  Descriptor get() const { return d_; }

 private:
  void Reset() {
    if (d_ != nullptr) api_->BackendDestroyDescriptor(d_);
    d_ = nullptr;
  }
  const Api* api_ = nullptr;
  Descriptor d_ = nullptr;
};

// A tensor of the graph: its id in the variant pack (a virtual one is never bound).
struct TensorSpec {
  int64_t uid = 0;
  int dtype = kFloat;
  std::vector<int64_t> dims, strides;
  bool is_virtual = false;
  int64_t alignment = 16;
  // A scalar passed by value: bound in the variant pack to a host pointer to its value, which
  // cuDNN copies into the kernel's parameters at execution (so CUDA graphs capture it).
  bool by_value = false;
};

// A float32 scalar passed by value, uid `uid`.
inline TensorSpec ScalarSpec(int64_t uid) { return TensorSpec{uid, kFloat, {1, 1, 1, 1}, {1, 1, 1, 1}, false, 16, true}; }

// Packed (row-major) strides of dims.
inline std::vector<int64_t> PackedStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

// Where a plan's engine configuration came from: the heuristic mode and its place in that mode's
// list, so that a later process finalizes that one configuration alone (plan_cache.h).
struct Origin {
  int mode = 0;
  int64_t index = -1;
};

// A finalized plan and the workspace it needs.
struct Plan {
  Desc plan;
  int64_t workspace = 0;
  Origin origin;
};

// Builds one graph: each call adds a tensor or an operation; the first failure is kept and every
// later call does nothing, so a builder is written straight through and checked once.
class Graph {
 public:
  Graph(const Api& api, Handle handle) : api_(api), handle_(handle) {}

  const std::string& error() const { return error_; }

  // Milliseconds Plans spent in cuDNN's heuristics and in finalizing plans (the engines' compiles).
  double heuristics_ms = 0, finalize_ms = 0;

  Descriptor Tensor(const TensorSpec& t) {
    Descriptor d = Make(kTensorDescriptor, "tensor");
    const int64_t rank = static_cast<int64_t>(t.dims.size());
    const bool virt = t.is_virtual;
    Set(d, kAttrTensorUniqueId, kTypeInt64, 1, &t.uid, "tensor id");
    Set(d, kAttrTensorDataType, kTypeDataType, 1, &t.dtype, "tensor data type");
    Set(d, kAttrTensorDimensions, kTypeInt64, rank, t.dims.data(), "tensor dims");
    Set(d, kAttrTensorStrides, kTypeInt64, rank, t.strides.data(), "tensor strides");
    Set(d, kAttrTensorByteAlignment, kTypeInt64, 1, &t.alignment, "tensor alignment");
    Set(d, kAttrTensorIsVirtual, kTypeBoolean, 1, &virt, "tensor virtual flag");
    if (t.by_value) Set(d, kAttrTensorIsByValue, kTypeBoolean, 1, &t.by_value, "tensor by-value flag");
    Finalize(d, "tensor");
    return d;
  }

  // y = mode(x) or mode(x, b), computed in float; params are (attribute, value) pairs such as a
  // ReLU's clips, passed as doubles.
  void Pointwise(int mode, Descriptor x, Descriptor b, Descriptor y,
                 const std::vector<std::pair<int, double>>& params = {}) {
    Descriptor pw = Make(kPointwiseDescriptor, "pointwise");
    const int prec = kFloat;
    Set(pw, kAttrPointwiseMode, kTypePointwiseMode, 1, &mode, "pointwise mode");
    Set(pw, kAttrPointwiseMathPrec, kTypeDataType, 1, &prec, "pointwise precision");
    for (const auto& p : params) Set(pw, p.first, kTypeDouble, 1, &p.second, "pointwise parameter");
    Finalize(pw, "pointwise");
    Descriptor op = Make(kOperationPointwiseDescriptor, "pointwise operation");
    Set(op, kAttrPointwisePwDescriptor, kTypeBackendDescriptor, 1, &pw, "pointwise descriptor");
    Set(op, kAttrPointwiseXDesc, kTypeBackendDescriptor, 1, &x, "pointwise x");
    if (b != nullptr) Set(op, kAttrPointwiseBDesc, kTypeBackendDescriptor, 1, &b, "pointwise b");
    Set(op, kAttrPointwiseYDesc, kTypeBackendDescriptor, 1, &y, "pointwise y");
    Finalize(op, "pointwise operation");
    ops_.push_back(op);
  }

  // c = a · b over [batch, M, K] · [batch, K, N] (a batch of 1 broadcasts), accumulated in float.
  void Matmul(Descriptor a, Descriptor b, Descriptor c) {
    Descriptor mm = Make(kMatmulDescriptor, "matmul");
    const int comp = kFloat;
    Set(mm, kAttrMatmulCompType, kTypeDataType, 1, &comp, "matmul compute type");
    Finalize(mm, "matmul");
    Descriptor op = Make(kOperationMatmulDescriptor, "matmul operation");
    Set(op, kAttrMatmulADesc, kTypeBackendDescriptor, 1, &a, "matmul a");
    Set(op, kAttrMatmulBDesc, kTypeBackendDescriptor, 1, &b, "matmul b");
    Set(op, kAttrMatmulCDesc, kTypeBackendDescriptor, 1, &c, "matmul c");
    Set(op, kAttrMatmulDesc, kTypeBackendDescriptor, 1, &mm, "matmul descriptor");
    Finalize(op, "matmul operation");
    ops_.push_back(op);
  }

  // y = conv(x, w), cross-correlation as ONNX's Conv, accumulated in float; groups follow from
  // x's channels over w's.
  void ConvForward(Descriptor x, Descriptor w, Descriptor y, const std::vector<int64_t>& pre_pads,
                   const std::vector<int64_t>& post_pads, const std::vector<int64_t>& strides,
                   const std::vector<int64_t>& dilations) {
    Descriptor cv = Make(kConvolutionDescriptor, "convolution");
    const int comp = kFloat, mode = kCrossCorrelation;
    const int64_t spatial = static_cast<int64_t>(strides.size());
    Set(cv, kAttrConvolutionCompType, kTypeDataType, 1, &comp, "convolution compute type");
    Set(cv, kAttrConvolutionConvMode, kTypeConvolutionMode, 1, &mode, "convolution mode");
    Set(cv, kAttrConvolutionSpatialDims, kTypeInt64, 1, &spatial, "convolution spatial dims");
    Set(cv, kAttrConvolutionDilations, kTypeInt64, spatial, dilations.data(), "convolution dilations");
    Set(cv, kAttrConvolutionFilterStrides, kTypeInt64, spatial, strides.data(), "convolution strides");
    Set(cv, kAttrConvolutionPrePaddings, kTypeInt64, spatial, pre_pads.data(), "convolution pre-paddings");
    Set(cv, kAttrConvolutionPostPaddings, kTypeInt64, spatial, post_pads.data(), "convolution post-paddings");
    Finalize(cv, "convolution");
    Descriptor op = Make(kOperationConvolutionForwardDescriptor, "convolution operation");
    const float alpha = 1.0f, beta = 0.0f;
    Set(op, kAttrConvolutionForwardX, kTypeBackendDescriptor, 1, &x, "convolution x");
    Set(op, kAttrConvolutionForwardW, kTypeBackendDescriptor, 1, &w, "convolution w");
    Set(op, kAttrConvolutionForwardY, kTypeBackendDescriptor, 1, &y, "convolution y");
    Set(op, kAttrConvolutionForwardConvDesc, kTypeBackendDescriptor, 1, &cv, "convolution descriptor");
    Set(op, kAttrConvolutionForwardAlpha, kTypeFloat, 1, &alpha, "convolution alpha");
    Set(op, kAttrConvolutionForwardBeta, kTypeFloat, 1, &beta, "convolution beta");
    Finalize(op, "convolution operation");
    ops_.push_back(op);
  }

  // The graph's plans in the heuristic's order (mode A, else the fallback engines), each
  // finalized and needing at most max_workspace bytes; at most `want` of them, or with `only`
  // those configurations alone. An error when there is none. Configurations are finalized
  // `want` at a time in threads, as cuDNN allows for plans of one graph: a runtime-fusion engine
  // compiles its kernel there (a second or more). On an H200 this did not shorten ResNet-50's
  // choices measurably (26 plans, 42 s of finalizing inside verification).
  std::string Plans(int64_t max_workspace, size_t want, std::vector<Plan>* out,
                    const std::vector<Origin>* only = nullptr) {
    if (!error_.empty()) return error_;
    if (ops_.empty()) return "an empty cuDNN graph";
    Descriptor graph = Make(kOperationGraphDescriptor, "operation graph");
    // The graph's and plan's handle attribute is deprecated from 9.? on but needed before it;
    // a release that ignores it may refuse it, so its status is not checked.
    api_.BackendSetAttribute(graph, kAttrOperationGraphHandle, kTypeHandle, 1, &handle_);
    Set(graph, kAttrOperationGraphOps, kTypeBackendDescriptor, static_cast<int64_t>(ops_.size()), ops_.data(),
        "graph operations");
    Finalize(graph, "operation graph");
    if (!error_.empty()) return error_;
    std::string why;
    for (int mode : {kHeurModeA, kHeurModeFallback}) {
      auto listed = [&](int64_t i) {
        return only == nullptr || std::any_of(only->begin(), only->end(), [&](const Origin& o) {
          return o.mode == mode && o.index == i;
        });
      };
      if (only != nullptr && !std::any_of(only->begin(), only->end(), [&](const Origin& o) { return o.mode == mode; })) {
        continue;
      }
      std::vector<Desc> configs;
      auto began = std::chrono::steady_clock::now();
      why = Configs(graph, mode, &configs);
      heuristics_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
      began = std::chrono::steady_clock::now();
      std::vector<int64_t> order;
      for (int64_t i = 0; i < static_cast<int64_t>(configs.size()); ++i) {
        if (listed(i)) order.push_back(i);
      }
      for (size_t next = 0; out->size() < want && next < order.size();) {
        const size_t n = std::min(want - out->size(), order.size() - next);
        std::vector<Desc> plans;
        std::vector<std::string> failed(n);
        for (size_t j = 0; j < n; ++j) {
          Descriptor pd = nullptr;
          if (api_.BackendCreateDescriptor(kExecutionPlanDescriptor, &pd) != kSuccess) pd = nullptr;
          plans.emplace_back(&api_, pd);
        }
        auto finalize = [&](size_t j) {
          Descriptor pd = plans[j].get();
          if (pd == nullptr) {
            failed[j] = "cudnnBackendCreateDescriptor(execution plan) failed";
            return;
          }
          api_.BackendSetAttribute(pd, kAttrExecutionPlanHandle, kTypeHandle, 1, &handle_);
          Descriptor c = configs[static_cast<size_t>(order[next + j])].get();
          Status st = api_.BackendSetAttribute(pd, kAttrExecutionPlanEngineConfig, kTypeBackendDescriptor, 1, &c);
          if (st == kSuccess) st = api_.BackendFinalize(pd);
          if (st != kSuccess) failed[j] = "no engine finalized: " + api_.StatusText(st);  // this thread's message
        };
        if (n == 1) {
          finalize(0);
        } else {
          std::vector<std::thread> threads;
          for (size_t j = 0; j < n; ++j) threads.emplace_back(finalize, j);
          for (std::thread& t : threads) t.join();
        }
        for (size_t j = 0; j < n; ++j) {
          if (!failed[j].empty()) {
            why = failed[j];
            continue;
          }
          int64_t ws = 0, got = 0;
          api_.BackendGetAttribute(plans[j].get(), kAttrExecutionPlanWorkspaceSize, kTypeInt64, 1, &got, &ws);
          if (ws > max_workspace) {
            why = "every engine needs more than " + std::to_string(max_workspace >> 20) + " MiB of workspace";
            continue;
          }
          out->push_back(Plan{std::move(plans[j]), ws, Origin{mode, order[next + j]}});
        }
        next += n;
      }
      finalize_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
      if (!out->empty()) return "";
    }
    return "cuDNN has no engine for this graph (" + why + ")";
  }

 private:
  // The heuristic's engine configurations for one mode.
  std::string Configs(Descriptor graph, int mode, std::vector<Desc>* configs) {
    Descriptor hd = nullptr;
    Status s = api_.BackendCreateDescriptor(kEngineHeurDescriptor, &hd);
    if (s != kSuccess) return "cudnnBackendCreateDescriptor(heuristics): " + api_.StatusText(s);
    Desc heur(&api_, hd);
    s = api_.BackendSetAttribute(hd, kAttrEngineHeurOperationGraph, kTypeBackendDescriptor, 1, &graph);
    if (s == kSuccess) s = api_.BackendSetAttribute(hd, kAttrEngineHeurMode, kTypeHeurMode, 1, &mode);
    if (s == kSuccess) s = api_.BackendFinalize(hd);
    int64_t count = 0;
    if (s == kSuccess) s = api_.BackendGetAttribute(hd, kAttrEngineHeurResults, kTypeBackendDescriptor, 0, &count, nullptr);
    if (s != kSuccess) return "cuDNN's heuristics: " + api_.StatusText(s);
    std::vector<Descriptor> raw;
    for (int64_t i = 0; i < count; ++i) {
      Descriptor d = nullptr;
      if (api_.BackendCreateDescriptor(kEngineCfgDescriptor, &d) != kSuccess) break;
      configs->emplace_back(&api_, d);
      raw.push_back(d);
    }
    int64_t got = 0;
    s = api_.BackendGetAttribute(hd, kAttrEngineHeurResults, kTypeBackendDescriptor, static_cast<int64_t>(raw.size()),
                                 &got, raw.data());
    if (s != kSuccess) return "cuDNN's heuristic results: " + api_.StatusText(s);
    configs->resize(static_cast<size_t>(std::min<int64_t>(got, static_cast<int64_t>(configs->size()))));
    return configs->empty() ? "the heuristics returned no engine" : "";
  }

  Descriptor Make(int type, const char* what) {
    if (!error_.empty()) return nullptr;
    Descriptor d = nullptr;
    const Status s = api_.BackendCreateDescriptor(type, &d);
    if (s != kSuccess) {
      error_ = std::string("cudnnBackendCreateDescriptor(") + what + "): " + api_.StatusText(s);
      return nullptr;
    }
    owned_.emplace_back(&api_, d);
    return d;
  }
  void Set(Descriptor d, int attr, int type, int64_t count, const void* value, const char* what) {
    if (!error_.empty()) return;
    const Status s = api_.BackendSetAttribute(d, attr, type, count, value);
    if (s != kSuccess) error_ = std::string("setting the ") + what + ": " + api_.StatusText(s);
  }
  void Finalize(Descriptor d, const char* what) {
    if (!error_.empty()) return;
    const Status s = api_.BackendFinalize(d);
    if (s != kSuccess) error_ = std::string("finalizing the ") + what + ": " + api_.StatusText(s);
  }

  const Api& api_;
  Handle handle_;
  std::string error_;
  std::vector<Desc> owned_;
  std::vector<Descriptor> ops_;
};

// The plan as cuDNN serializes it: runtime-compiled engines only, their kernel included; "" for
// the others (and where this cuDNN cannot).
inline std::string PlanJson(const Api& api, const Plan& p) {
  int64_t n = 0;
  if (api.BackendGetAttribute(p.plan.get(), kAttrExecutionPlanJsonRepresentation, kTypeChar, 0, &n, nullptr) != kSuccess ||
      n <= 0) {
    return "";
  }
  std::string text(static_cast<size_t>(n), '\0');
  if (api.BackendGetAttribute(p.plan.get(), kAttrExecutionPlanJsonRepresentation, kTypeChar, n, &n, &text[0]) != kSuccess) {
    return "";
  }
  text.resize(strnlen(text.data(), text.size()));
  return text;
}

// A plan from PlanJson's text, on this handle (the same GPU and cuDNN that wrote it, which the
// caller's key ensures): "" on success, else why not.
inline std::string PlanFromJson(const Api& api, Handle handle, const std::string& json, Plan* out) {
  Descriptor pd = nullptr;
  Status s = api.BackendCreateDescriptor(kExecutionPlanDescriptor, &pd);
  if (s != kSuccess) return "cudnnBackendCreateDescriptor(execution plan): " + api.StatusText(s);
  Desc plan(&api, pd);
  s = api.BackendSetAttribute(pd, kAttrExecutionPlanJsonRepresentation, kTypeChar, static_cast<int64_t>(json.size()),
                              json.data());
  if (s == kSuccess) s = api.BackendSetAttribute(pd, kAttrExecutionPlanHandle, kTypeHandle, 1, &handle);
  if (s == kSuccess) s = api.BackendFinalize(pd);
  if (s != kSuccess) return "a saved cuDNN plan did not load: " + api.StatusText(s);
  int64_t ws = 0, got = 0;
  api.BackendGetAttribute(pd, kAttrExecutionPlanWorkspaceSize, kTypeInt64, 1, &got, &ws);
  *out = Plan{std::move(plan), ws, Origin{}};
  return "";
}

// Runs a plan on the handle's stream with the given tensors bound by id.
inline std::string Execute(const Api& api, Handle handle, const Plan& plan, const std::vector<int64_t>& uids,
                           const std::vector<void*>& pointers, void* workspace) {
  Descriptor vd = nullptr;
  Status s = api.BackendCreateDescriptor(kVariantPackDescriptor, &vd);
  if (s != kSuccess) return "cudnnBackendCreateDescriptor(variant pack): " + api.StatusText(s);
  Desc pack(&api, vd);
  const int64_t n = static_cast<int64_t>(uids.size());
  s = api.BackendSetAttribute(vd, kAttrVariantPackUniqueIds, kTypeInt64, n, uids.data());
  if (s == kSuccess) s = api.BackendSetAttribute(vd, kAttrVariantPackDataPointers, kTypeVoidPtr, n, pointers.data());
  if (s == kSuccess) s = api.BackendSetAttribute(vd, kAttrVariantPackWorkspace, kTypeVoidPtr, 1, &workspace);
  if (s == kSuccess) s = api.BackendFinalize(vd);
  if (s != kSuccess) return "making cuDNN's variant pack: " + api.StatusText(s);
  s = api.BackendExecute(handle, plan.plan.get(), vd);
  if (s != kSuccess) return "cudnnBackendExecute: " + api.StatusText(s);
  return "";
}

}  // namespace dnn
}  // namespace onnxstitch
