// The conv scheme's runtime side (shape rule "conv", docs/abi.md): one 2-D convolution and the
// pointwise work after it (bias, a residual Add, an activation) as one cuDNN graph, run in NHWC —
// where cuDNN's fused engines are (on the H100, NCHW graphs with a residual or SiLU have no
// engine at all, and plain NCHW convolutions run 1.6–2.7× slower: scripts/probe_cudnn.cc).
//
// Inputs X, W [K, C/group, R, S] as ONNX stores it, the bias [K] (conv_bias), R of Y's shape
// (conv_residual); Y = act(conv(X, W) + bias + R), or with conv_residual 2 act(conv(X, W) + bias) + R. conv_layouts says which of X, Y and R are NHWC
// ([N, H, W, C] as the ONNX graph declares them, between two conv nodes) rather than NCHW; an NCHW
// one is changed in scratch memory by cublasLtMatrixTransform (per image, [C, HW] ↔ [HW, C]).
// The filter is changed to [K, R, S, C/group] once per weight buffer, kept by the node.
//
// Per CUDA context a cuDNN and a cuBLASLt handle (one stream at a time: their stream is set under
// the lock); per input shape and attributes the cuDNN plan, shared by the process's nodes: the
// fastest of the heuristic's first four where the stream is not being captured (timed on it
// once), else the first. The choice is saved on disk (plan_cache.h) and loaded by later
// processes on the same kind of GPU, driver and cuDNN: the plan itself where cuDNN serializes it
// (runtime-compiled engines), else which configuration won, finalized alone. cuDNN compiles
// one engine at a time in a process, so optimize prepares a network's shapes in worker
// processes side by side (ONNXSTITCH_PLAN_PREPARE=1: finalize the candidates and save them, no
// timing); the process that then runs the shape loads them in milliseconds and times them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "cublaslt_api.h"
#include "cudnn_graph.h"
#include "plan_cache.h"
#include "scheme.h"

namespace onnxstitch {
namespace {

constexpr const char* kRule = "conv";
constexpr int64_t kFloat = 1, kFloat16 = 10;  // TensorProto element types
constexpr int kRounds = 3, kReps = 10;  // timing each candidate engine at the first call (Fastest)
constexpr int kLoaders = 4;  // hinted plans' loader threads (Loaders): ResNet-50 b8 first run 0.19-0.23 s with 1, 0.06 s with 4 (H200)
constexpr int kCandidates = 4;  // each compiles its engine at session start: 4 against 2 cost ResNet-50 float32 12 s more and ran it 10% faster (H200)
constexpr int64_t kMaxWorkspace = int64_t{256} << 20;
constexpr const char* kSavedMagic = "onnxstitch conv plan";  // the first line of a saved plan (plan_cache.h)
constexpr const char* kCandidatesMagic = "onnxstitch conv candidates";  // ... and of prepared candidates
#ifndef ONNXSTITCH_SOURCES  // (build.py compiles in the digest of the library's sources)
#define ONNXSTITCH_SOURCES "unversioned"
#endif
// conv_activation codes (schemes/conv/spec.py ACTIVATIONS).
enum Activation {
  kNone = 0, kRelu, kClip, kLeakyRelu, kSilu, kSigmoid, kTanh, kGelu, kGeluTanh, kHardSwish, kHardSigmoid, kActivations
};
const char* const kActivationNames[] = {"none", "relu", "clip", "leaky_relu", "silu", "sigmoid", "tanh",
                                        "gelu", "gelu_tanh", "hardswish", "hard_sigmoid"};
// Tensor ids in the cuDNN graph; by-value scalars from kScalar on.
constexpr int64_t kX = 1, kW = 2, kB = 3, kR = 4, kY = 5, kScalar = 10;

// cuDNN and cuBLASLt, and their handles per context.
struct Library {
  std::mutex mu;
  bool tried = false;
  std::string error;
  dnn::Api dnn;
  lt::Api lt;
  struct Handles {
    dnn::Handle dnn = nullptr;
    lt::Handle lt = nullptr;
    std::mutex use;  // one stream at a time on these handles
  };
  std::map<unsigned long long, std::unique_ptr<Handles>> handles;  // by context key, never freed
  // Plans by everything they depend on, shared by every node and session of the process: a
  // plan's engines are compiled when it is made (seconds for a network), and networks repeat
  // their convolutions.
  std::mutex plans_mu;
  std::map<std::string, std::shared_ptr<const dnn::Plan>> plans;
  // Plans hinted by nodes when they are made (conv_hint: the geometry optimize planned them at),
  // loaded from the saved plans by a thread that the first run in a context starts: a session's
  // first inference loaded them one after another, node by node (ResNet-50: 26 plans, ~225 ms of
  // 0.48 s). What the thread has not loaded yet when its node runs, the node loads itself.
  std::mutex hints_mu;
  std::vector<std::string> hints;  // plan keys without the context, not yet loaded
  std::set<std::string> hinted;    // every key ever queued (each session makes its nodes again)
  std::vector<std::thread> loaders;
  int loading = 0;  // (hints_mu) loaders running
  std::set<int> busy;  // (hints_mu) the indices (handles) of the loaders running
  std::set<std::string> inflight;  // (hints_mu) keys the loaders are loading: a node with one waits
  // (hints_mu) cuDNN handles of the loaders after the first, by context key, never freed: a plan
  // loads on its own handle beside the others (the first loader uses the context's).
  std::map<unsigned long long, std::vector<dnn::Handle>> loader_handles;
  std::atomic<bool> stop{false};
  cu::Driver driver;  // (mu) the driver as nodes' creation sees it: 0 untried, 1 loaded, -1 failed
  int driver_state = 0;
  std::map<int, cu::Context> primary;  // (mu) devices' primary contexts, retained for the process

  static Library& Get() {
    static Library* lib = new Library;  // never destroyed: nodes may outlive static destructors
    return *lib;
  }
};

float FromBits(int64_t bits) {
  const uint32_t b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// With ONNXSTITCH_PLAN_LOG=1, where each plan's time went, one line on stderr.
void Log(const std::string& line) {
  static const bool on = [] {
    const char* v = std::getenv("ONNXSTITCH_PLAN_LOG");
    return v != nullptr && std::string(v) == "1";
  }();
  if (on) std::fprintf(stderr, "onnxstitch conv plan %s\n", line.c_str());
}

std::string Ms(std::chrono::steady_clock::time_point since) {
  return std::to_string(static_cast<int>(
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count())) + " ms";
}

// What a saved plan's file holds besides the graph (plan_cache.h): everything the plan depends
// on that is not the node's (the kind of GPU, the driver, cuDNN, the library's sources); "" when
// the device cannot be asked (plans are then not saved).
std::string SavedPrefix(const cu::Driver& d, const dnn::Api& api) {
  cu::Device dev = 0;
  int major = 0, minor = 0, sms = 0, driver = 0;
  if (d.CtxGetDevice == nullptr || d.CtxGetDevice(&dev) != cu::kSuccess ||
      d.DeviceGetAttribute(&major, cu::kAttrComputeCapabilityMajor, dev) != cu::kSuccess ||
      d.DeviceGetAttribute(&minor, cu::kAttrComputeCapabilityMinor, dev) != cu::kSuccess ||
      d.DeviceGetAttribute(&sms, cu::kAttrMultiprocessorCount, dev) != cu::kSuccess ||
      d.DriverGetVersion == nullptr || d.DriverGetVersion(&driver) != cu::kSuccess) {
    return "";
  }
  return "conv plan v1|library " + std::string(ONNXSTITCH_SOURCES) + "|sm " + std::to_string(major * 10 + minor) + "|" +
         std::to_string(sms) + " SMs|driver " + std::to_string(driver) + "|cudnn " + std::to_string(api.GetVersion()) +
         "|";
}

// A saved plan's parts ("onnxstitch conv plan", the winning configuration's mode and index, then
// cuDNN's serialized plan or nothing): false when the file is not one. `json` is "" where only
// the configuration was saved, or where the plan looks cut (cuDNN's parser sees only what looks
// whole: a cut file falls back to the configuration).
bool ParseSaved(const std::string& text, dnn::Origin* origin, std::string* json) {
  std::istringstream in(text);
  std::string magic;
  if (!std::getline(in, magic) || magic != kSavedMagic || !(in >> origin->mode >> origin->index) || in.get() != '\n') {
    return false;
  }
  const std::streamoff at = in.tellg();
  *json = at < 0 ? "" : text.substr(static_cast<size_t>(at));
  if (!(json->size() > 1 && json->front() == '{' && json->back() == '}')) json->clear();
  return true;
}

// The context's handles, made at their first use.
Error ContextHandles(const cu::Driver& d, cu::Context cuctx, Library::Handles** out) {
  Library& lib = Library::Get();
  std::lock_guard<std::mutex> lock(lib.mu);
  if (!lib.tried) {
    lib.tried = true;
    lib.error = lib.dnn.Load();
    if (lib.error.empty()) lib.error = lib.lt.Load();
  }
  if (!lib.error.empty()) return Fail(ORT_FAIL, lib.error);
  std::unique_ptr<Library::Handles>& h = lib.handles[d.ContextKey(cuctx)];
  if (h == nullptr) {
    auto made = std::make_unique<Library::Handles>();
    const dnn::Status s = lib.dnn.Create(&made->dnn);
    if (s != dnn::kSuccess) return Fail(ORT_FAIL, "cudnnCreate: " + lib.dnn.StatusText(s));
    const lt::Status t = lib.lt.Create(&made->lt);
    if (t != lt::kSuccess) return Fail(ORT_FAIL, "cublasLtCreate: " + lib.lt.StatusText(t));
    h = std::move(made);
  }
  *out = h.get();
  return {};
}

// One hinted plan into the process's plans, from its file at `path`: false where it is there
// already, not saved, saved as its configuration only (the node finalizes it at its run), or
// does not load.
bool LoadAhead(Library& lib, Library::Handles* h, const std::string& key, const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(lib.plans_mu);
    if (lib.plans.count(key) != 0) return false;
  }
  std::string text, json;
  dnn::Origin origin;
  if (!plan_cache::Read(path, &text) || !ParseSaved(text, &origin, &json) || json.empty()) return false;
  dnn::Plan plan;
  std::lock_guard<std::mutex> use(h->use);
  if (!dnn::PlanFromJson(lib.dnn, h->dnn, json, &plan).empty() || plan.workspace > kMaxWorkspace) return false;
  std::lock_guard<std::mutex> lock(lib.plans_mu);
  return lib.plans.emplace(key, std::make_shared<const dnn::Plan>(std::move(plan))).second;
}

// A node about to run at a geometry whose key (without the context) is `rest`: taken off the
// loader's queue (the node loads it itself), or waited for where the loader is loading it (a
// plan's load, ~10 ms; polled: std::condition_variable::wait would need GCC 12's libstdc++
// (GLIBCXX_3.4.30), above the wheel's manylinux_2_34).
void TakeHint(const std::string& rest) {
  Library& lib = Library::Get();
  std::unique_lock<std::mutex> lock(lib.hints_mu);
  if (lib.hinted.empty()) return;
  auto it = std::find(lib.hints.begin(), lib.hints.end(), rest);
  if (it != lib.hints.end()) lib.hints.erase(it);
  while (lib.inflight.count(rest) != 0) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    lock.lock();
  }
}

// How many loader threads load the hinted plans side by side (ONNXSTITCH_PLAN_LOADERS, 1 to 8).
int Loaders() {
  static const int n = [] {
    const char* v = std::getenv("ONNXSTITCH_PLAN_LOADERS");
    const int got = v == nullptr ? kLoaders : std::atoi(v);
    return std::min(8, std::max(1, got));
  }();
  return n;
}

// The hinted plans' loader `index` (Library::hints), on its own thread with the context current:
// each saved plan that cuDNN serialized, made on a handle into the process's plans. The first
// loader uses the context's handle (under its lock, a plan at a time, so the nodes' runs
// interleave), the others a handle of their own. Its calls are in the relaxed capture mode: ORT
// may capture a CUDA graph on another thread meanwhile, and cuDNN's loading (module loads,
// allocations) would otherwise end that capture.
void LoadHinted(cu::Driver d, cu::Context ctx, int index) {
  Library& lib = Library::Get();
  int mode = cu::kStreamCaptureModeRelaxed;
  const bool entered = d.CtxPushCurrent(ctx) == cu::kSuccess;
  const bool relaxed = entered && d.ThreadExchangeStreamCaptureMode(&mode) == cu::kSuccess;
  Library::Handles* h = nullptr;
  bool handles = relaxed && !ContextHandles(d, ctx, &h);
  Library::Handles own;  // (a later loader's: its handle, its lock unshared)
  if (handles && index > 0) {
    const size_t at = static_cast<size_t>(index - 1);
    {
      std::lock_guard<std::mutex> lock(lib.hints_mu);
      const std::vector<dnn::Handle>& made = lib.loader_handles[d.ContextKey(ctx)];
      if (at < made.size()) own.dnn = made[at];
    }
    if (own.dnn == nullptr) {  // (made outside the lock: the nodes' TakeHint wait on it)
      handles = lib.dnn.Create(&own.dnn) == dnn::kSuccess;
      std::lock_guard<std::mutex> lock(lib.hints_mu);
      std::vector<dnn::Handle>& made = lib.loader_handles[d.ContextKey(ctx)];
      if (made.size() <= at) made.resize(at + 1, nullptr);
      if (handles) made[at] = own.dnn;
    }
    h = &own;
  }
  const std::string prefix = handles ? SavedPrefix(d, lib.dnn) : "";
  const std::string context = std::to_string(d.ContextKey(ctx)) + ",";
  int loaded = 0;
  const auto began = std::chrono::steady_clock::now();
  if (prefix.empty() && index == 0) {  // nothing can be loaded here: the nodes load their own
    std::lock_guard<std::mutex> lock(lib.hints_mu);
    lib.hints.clear();
  }
  while (!prefix.empty() && !lib.stop) {
    std::string rest;
    {
      std::lock_guard<std::mutex> lock(lib.hints_mu);
      if (lib.hints.empty()) break;
      rest = lib.hints.front();
      lib.hints.erase(lib.hints.begin());
      lib.inflight.insert(rest);
    }
    if (LoadAhead(lib, h, context + rest, plan_cache::PathOf(prefix + "0," + rest))) {
      ++loaded;
      Log("loaded ahead (" + rest + ")");
    }
    std::lock_guard<std::mutex> lock(lib.hints_mu);
    lib.inflight.erase(rest);
  }
  if (relaxed) d.ThreadExchangeStreamCaptureMode(&mode);
  if (entered) {
    cu::Context popped = nullptr;
    d.CtxPopCurrent(&popped);
  }
  Log("loader " + std::to_string(index) + ": " + std::to_string(loaded) + " hinted plans in " + Ms(began));
  std::lock_guard<std::mutex> lock(lib.hints_mu);
  --lib.loading;
  lib.busy.erase(index);
}

// Starts the loaders for `ctx` where plans are hinted and none is running: at a node's creation
// where the creating thread has a current context (ORT's CUDA EP makes its device current in
// the thread that creates a session), else at the first run in the context. At exit the loader
// is stopped after its plan at hand.
void StartLoader(const cu::Driver& d, cu::Context ctx) {
  if (d.ThreadExchangeStreamCaptureMode == nullptr) return;  // (a driver before CUDA 10.1)
  Library& lib = Library::Get();
  std::lock_guard<std::mutex> lock(lib.hints_mu);
  // One more loader while hints outnumber the loaders running, up to Loaders(): a session's
  // nodes are made one by one, each queueing its hint and calling here.
  if (lib.loading >= Loaders() || static_cast<int>(lib.hints.size()) <= lib.loading || lib.stop) return;
  static const bool stopped_at_exit = [] {
    return std::atexit([] {
      Library& l = Library::Get();
      l.stop = true;
      std::vector<std::thread> ts;
      {
        std::lock_guard<std::mutex> held(l.hints_mu);
        ts.swap(l.loaders);
      }
      for (std::thread& t : ts) {
        if (t.joinable()) t.join();
      }
    }) == 0;
  }();
  if (!stopped_at_exit) return;
  if (lib.loading == 0) {  // the last ones have finished
    for (std::thread& t : lib.loaders) {
      if (t.joinable()) t.join();
    }
    lib.loaders.clear();
  }
  int index = 0;  // the least free: which handle it loads on
  while (lib.busy.count(index) != 0) ++index;
  try {
    lib.loaders.emplace_back(LoadHinted, d, ctx, index);
    ++lib.loading;
    lib.busy.insert(index);
  } catch (const std::system_error&) {
    // No thread: each node loads what is left at its run, as without hints.
  }
}

// StartLoader at a node's creation, in the primary context of the node's device (`device`, -1
// unknown: the creating thread's current context, if it has one; else the first run starts it).
// ORT's CUDA EP runs in its device's primary context (the CUDA runtime's).
void StartLoaderAtCreation(int device) {
  Library& lib = Library::Get();
  cu::Driver d;
  cu::Context ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    if (lib.driver_state == 0) lib.driver_state = lib.driver.Load().empty() ? 1 : -1;
    if (lib.driver_state < 0) return;
    d = lib.driver;
    if (device >= 0 && d.DeviceGet != nullptr && d.DevicePrimaryCtxRetain != nullptr) {
      auto it = lib.primary.find(device);
      if (it == lib.primary.end()) {
        cu::Device dev = 0;
        cu::Context made = nullptr;
        if (d.DeviceGet(&dev, device) != cu::kSuccess || d.DevicePrimaryCtxRetain(&made, dev) != cu::kSuccess) {
          made = nullptr;
        }
        it = lib.primary.emplace(device, made).first;
      }
      ctx = it->second;
    }
  }
  if (ctx == nullptr && (d.CtxGetCurrent(&ctx) != cu::kSuccess || ctx == nullptr)) return;
  StartLoader(d, ctx);
}

struct Geometry {
  unsigned long long ctx;  // plans belong to a device
  int64_t n, c, h, w, k, cg, r, s, ho, wo;
  bool line = false;  // a 1-D convolution (rank-3 X, W and Y) run as H = R = 1 (the same plan)
  bool operator<(const Geometry& o) const {
    return std::tie(ctx, n, c, h, w, k, cg, r, s) < std::tie(o.ctx, o.n, o.c, o.h, o.w, o.k, o.cg, o.r, o.s);
  }
};

class Conv final : public Scheme {
 public:
  ~Conv() override { Release(); }

  Error Init(Attrs& a, size_t n_in, size_t n_out) override {
    std::vector<int64_t> pads, strides, dilations, layouts, params;
    bool present = false;
    for (auto [name, v, size] : {std::tuple<const char*, std::vector<int64_t>*, size_t>{"conv_pads", &pads, 4},
                                 {"conv_strides", &strides, 2}, {"conv_dilations", &dilations, 2},
                                 {"conv_layouts", &layouts, 3}, {"conv_activation_params", &params, 2}}) {
      if (Error e = a.Ints(name, v, &present)) return e;
      if (!present || v->size() != size) {
        return Fail(ORT_INVALID_ARGUMENT, std::string("conv attribute '") + name + "' must hold " + std::to_string(size) + " INTS");
      }
    }
    int64_t group = 0, bias = 0, residual = 0, activation = 0;
    if (Error e = a.RequiredInt("conv_group", kRule, &group)) return e;
    if (Error e = a.RequiredInt("conv_bias", kRule, &bias)) return e;
    if (Error e = a.RequiredInt("conv_residual", kRule, &residual)) return e;
    if (Error e = a.RequiredInt("conv_activation", kRule, &activation)) return e;
    if (activation < 0 || activation >= kActivations) {
      return Fail(ORT_INVALID_ARGUMENT, "conv_activation " + std::to_string(activation) + " is none of 0.." +
                                            std::to_string(kActivations - 1));
    }
    for (int64_t v : strides) {
      if (v < 1) return Fail(ORT_INVALID_ARGUMENT, "conv_strides must be positive");
    }
    for (int64_t v : dilations) {
      if (v < 1) return Fail(ORT_INVALID_ARGUMENT, "conv_dilations must be positive");
    }
    for (int64_t v : pads) {
      if (v < 0) return Fail(ORT_INVALID_ARGUMENT, "conv_pads must not be negative");
    }
    if (group < 1) return Fail(ORT_INVALID_ARGUMENT, "conv_group must be positive");
    if (residual < 0 || residual > 2) {
      return Fail(ORT_INVALID_ARGUMENT, "conv_residual is 0 (none), 1 (before the activation) or 2 (after it)");
    }
    std::vector<int64_t> dtypes;
    if (Error e = a.Ints("output_dtypes", &dtypes, &present)) return e;
    if (!present || dtypes.size() != 1 || (dtypes[0] != kFloat && dtypes[0] != kFloat16)) {
      return Fail(ORT_INVALID_ARGUMENT, "a conv node has one output, float32 or float16 (output_dtypes)");
    }
    const size_t want = 2 + (bias != 0) + (residual != 0);
    if (n_in != want || n_out != 1) {
      return Fail(ORT_INVALID_ARGUMENT, "a conv node" + std::string(bias ? " with a bias" : "") +
                                            (residual ? " and a residual" : "") + " takes " + std::to_string(want) +
                                            " inputs and gives 1 output, not " + std::to_string(n_in) + " and " +
                                            std::to_string(n_out));
    }
    pads_ = pads;
    strides_ = strides;
    dilations_ = dilations;
    group_ = group;
    bias_ = bias != 0;
    residual_ = residual != 0;
    residual_after_ = residual == 2;
    activation_ = static_cast<int>(activation);
    params_[0] = FromBits(params[0]);
    params_[1] = FromBits(params[1]);
    x_nhwc_ = layouts[0] != 0;
    y_nhwc_ = layouts[1] != 0;
    r_nhwc_ = layouts[2] != 0;
    half_ = dtypes[0] == kFloat16;
    // The geometry optimize planned this node at (N, C, H, W, K, C/group, R, S), where it says:
    // its saved plan is loaded before the node's first run (Library::hints).
    std::vector<int64_t> hint;
    if (Error e = a.Ints("conv_hint", &hint, &present)) return e;
    if (present && hint.size() == 8) {
      Geometry g{};
      g.n = hint[0], g.c = hint[1], g.h = hint[2], g.w = hint[3], g.k = hint[4], g.cg = hint[5], g.r = hint[6],
      g.s = hint[7];
      Library& lib = Library::Get();
      {
        std::lock_guard<std::mutex> lock(lib.hints_mu);
        if (lib.hinted.insert(KeyRest(g)).second) lib.hints.push_back(KeyRest(g));
      }
      StartLoaderAtCreation(a.DeviceOrdinal());
    }
    // Scalars the graph takes by value (`Build`). A grouped convolution's graph always has one:
    // cuDNN 9.19's heuristic sends depthwise conv + bias (+ ReLU) to an engine 6–16× slower than
    // the plain convolution, and a graph with a by-value operand to its runtime-fusion engines,
    // as fast as the plain one (scripts/probe_cudnn.cc mobilenet, H100).
    scalars_.clear();
    if (activation_ == kHardSwish || activation_ == kHardSigmoid) {
      scalars_ = {static_cast<float>(params_[0]), static_cast<float>(params_[1])};  // alpha, beta
    } else if (group_ > 1 && activation_ == kRelu) {
      scalars_ = {0.0f};  // ReLU as MAX(x, 0)
    } else if (ScalarTail()) {
      scalars_ = {1.0f};  // a final MUL by 1
    }
    return {};
  }

  // Whether the graph ends with a MUL by a by-value 1: a grouped convolution whose activation
  // brings no by-value operand of its own (ReLU is MAX(x, 0), HardSwish/HardSigmoid have theirs),
  // and any clip (ReLU6): torchvision's MobileNetV2 (every 1×1 expansion ends in a clip) ran
  // 0.28× of stock ORT on an H200 with its clip graphs left to the heuristic's engines, 2.31×
  // with the operand (CUDA graphs, batch 8, float32; bench/results/nvidia-h200/corpus-tv).
  bool ScalarTail() const {
    return (group_ > 1 || activation_ == kClip) && activation_ != kRelu && activation_ != kHardSwish &&
           activation_ != kHardSigmoid;
  }

  bool OutputShapes(const std::vector<std::vector<ShapeDim>>& ins, size_t n_out,
                    std::vector<std::vector<ShapeDim>>* outs) const override {
    if (ins.size() < 2 || n_out != 1) return false;
    if (ins[0].size() == 3 && ins[1].size() == 3) {  // a 1-D convolution (NCW or NWC): H = R = 1
      const ShapeDim& in = ins[0][x_nhwc_ ? 1 : 2];
      const ShapeDim& f = ins[1][2];
      const bool known = in.symbol.empty() && in.value >= 0 && f.symbol.empty() && f.value >= 0;
      const ShapeDim wo = known ? ShapeDim{OutDim(in.value, f.value, 1), ""} : ShapeDim{-1, ""};
      outs->assign(1, y_nhwc_ ? std::vector<ShapeDim>{ins[0][0], wo, ins[1][0]} : std::vector<ShapeDim>{ins[0][0], ins[1][0], wo});
      return true;
    }
    if (ins[0].size() != 4 || ins[1].size() != 4) return false;
    const std::vector<ShapeDim>& x = ins[0];
    const ShapeDim& k = ins[1][0];
    ShapeDim sp[2];
    for (int i = 0; i < 2; ++i) {
      const ShapeDim& in = x[x_nhwc_ ? 1 + i : 2 + i];
      const ShapeDim& f = ins[1][2 + i];
      if (!in.symbol.empty() || in.value < 0 || !f.symbol.empty() || f.value < 0) {
        sp[i] = ShapeDim{-1, ""};
      } else {
        sp[i] = ShapeDim{OutDim(in.value, f.value, i), ""};
      }
    }
    outs->assign(1, y_nhwc_ ? std::vector<ShapeDim>{x[0], sp[0], sp[1], k} : std::vector<ShapeDim>{x[0], k, sp[0], sp[1]});
    return true;
  }

  Error Entries(const cu::Driver&, const std::string&, Loaded*) const override { return {}; }
  bool UsesImage() const override { return false; }

  Error Run(Call& call, Bound* b) const override {
    Geometry g{};
    if (Error e = Shapes(b, &g)) return e;
    const int64_t y_dims[4] = {g.n, y_nhwc_ ? g.ho : g.k, y_nhwc_ ? g.wo : g.ho, y_nhwc_ ? g.k : g.wo};
    const int64_t y_line[3] = {g.n, y_nhwc_ ? g.wo : g.k, y_nhwc_ ? g.k : g.wo};  // a 1-D convolution's [N, K, W']
    void* y = nullptr;
    if (Error e = g.line ? call.Output(0, y_line, 3, &y) : call.Output(0, y_dims, 4, &y)) return e;
    if (g.n == 0 || g.k == 0 || g.ho == 0 || g.wo == 0) return {};
    cu::Stream stream = nullptr;
    const Loaded* l = nullptr;
    if (Error e = call.Enter(&stream, &l)) return e;
    const cu::Driver& d = call.Driver();
    Library::Handles* h = nullptr;
    if (Error e = Handles(d, l->ctx, &h)) return e;
    g.ctx = d.ContextKey(l->ctx);
    if (!Planned(g)) {  // (each run after a geometry's first skips the library-wide locks)
      StartLoader(d, l->ctx);
      TakeHint(KeyRest(g));  // (before the handle is held: the loader needs it)
    }
    Library& lib = Library::Get();
    const size_t elem = half_ ? 2 : 4;
    std::lock_guard<std::mutex> use(h->use);
    std::lock_guard<std::mutex> lock(mu_);
    // The filter as NHWC wants it, made once per weight buffer.
    const void* w = nullptr;
    if (Error e = Filter(d, lib.lt, h->lt, b->args.in[1], g, stream, &w)) return e;
    // NCHW operands and result through scratch memory in NHWC.
    const void* x = b->args.in[0];
    const void* r = residual_ ? b->args.in[b->n_in - 1] : nullptr;
    void* y_nhwc = y;
    // At 1×1 pixels, or one channel (wav2vec2's waveform), NCHW and NHWC are the same bytes:
    // nothing to change.
    const bool x_nhwc = x_nhwc_ || g.h * g.w == 1 || g.c == 1, y_out_nhwc = y_nhwc_ || g.ho * g.wo == 1 || g.k == 1,
               r_nhwc = r_nhwc_ || g.ho * g.wo == 1 || g.k == 1;
    if (!x_nhwc) {
      void* t = nullptr;
      if (Error e = call.Scratch(static_cast<size_t>(g.n * g.c * g.h * g.w) * elem, &t)) return e;
      if (Error e = Transpose(lib.lt, h->lt, x, t, g.n, g.c, g.h * g.w, stream)) return e;
      x = t;
    }
    if (residual_ && !r_nhwc) {
      void* t = nullptr;
      if (Error e = call.Scratch(static_cast<size_t>(g.n * g.k * g.ho * g.wo) * elem, &t)) return e;
      if (Error e = Transpose(lib.lt, h->lt, r, t, g.n, g.k, g.ho * g.wo, stream)) return e;
      r = t;
    }
    if (!y_out_nhwc) {
      if (Error e = call.Scratch(static_cast<size_t>(g.n * g.k * g.ho * g.wo) * elem, &y_nhwc)) return e;
    }
    std::vector<int64_t> uids = {kX, kW, kY};
    std::vector<void*> ptrs = {const_cast<void*>(x), const_cast<void*>(w), y_nhwc};
    if (bias_) {
      uids.push_back(kB);
      ptrs.push_back(const_cast<void*>(b->args.in[2]));
    }
    if (residual_) {
      uids.push_back(kR);
      ptrs.push_back(const_cast<void*>(r));
    }
    for (size_t i = 0; i < scalars_.size(); ++i) {  // host pointers: cuDNN copies the values at execution
      uids.push_back(kScalar + static_cast<int64_t>(i));
      ptrs.push_back(const_cast<float*>(&scalars_[i]));
    }
    dnn::Status s = lib.dnn.SetStream(h->dnn, stream);
    if (s != dnn::kSuccess) return Fail(ORT_FAIL, "cudnnSetStream: " + lib.dnn.StatusText(s));
    const dnn::Plan* plan = nullptr;
    void* workspace = nullptr;
    if (Error e = PlanFor(call, lib.dnn, h->dnn, g, uids, ptrs, stream, &plan, &workspace)) return e;
    const std::string err = dnn::Execute(lib.dnn, h->dnn, *plan, uids, ptrs, workspace);
    if (!err.empty()) return Fail(ORT_FAIL, err + " (" + What(g) + ")");
    if (!y_out_nhwc) {
      if (Error e = Transpose(lib.lt, h->lt, y_nhwc, y, g.n, g.ho * g.wo, g.k, stream)) return e;
    }
    return {};
  }

 private:
  int64_t OutDim(int64_t in, int64_t f, int i) const {
    const int64_t span = dilations_[i] * (f - 1) + 1;
    const int64_t padded = in + pads_[i] + pads_[2 + i];
    return padded < span ? 0 : (padded - span) / strides_[i] + 1;
  }

  Error Shapes(const Bound* b, Geometry* g) const {
    const int64_t* x = b->shapes[0];
    const int64_t* w = b->shapes[1];
    // A 1-D convolution ([N, C, W] or NWC [N, W, C] by [K, C/group, S]) runs as a 2-D one of
    // H = R = 1: the same bytes, its pads, strides and dilations given as the second axis's
    // (match.py).
    g->line = b->ranks[0] == 3 && b->ranks[1] == 3;
    if (!g->line && (b->ranks[0] != 4 || b->ranks[1] != 4)) {
      return Fail(ORT_INVALID_ARGUMENT, "X " + ShapeText(x, b->ranks[0]) + " and W " + ShapeText(w, b->ranks[1]) +
                                            ": a convolution takes both of rank 4 (2-D) or 3 (1-D, NCW)");
    }
    g->n = x[0];
    if (g->line) {
      g->c = x[x_nhwc_ ? 2 : 1], g->h = 1, g->w = x[x_nhwc_ ? 1 : 2];
      g->k = w[0], g->cg = w[1], g->r = 1, g->s = w[2];
    } else {
      g->c = x_nhwc_ ? x[3] : x[1];
      g->h = x_nhwc_ ? x[1] : x[2];
      g->w = x_nhwc_ ? x[2] : x[3];
      g->k = w[0];
      g->cg = w[1];
      g->r = w[2];
      g->s = w[3];
    }
    if (g->cg * group_ != g->c || g->k % group_ != 0) {
      return Fail(ORT_INVALID_ARGUMENT, "X " + ShapeText(x, b->ranks[0]) + (x_nhwc_ ? " (NHWC)" : "") + " and W " + ShapeText(w, b->ranks[1]) +
                                            " do not convolve in " + std::to_string(group_) + " group(s)");
    }
    g->ho = OutDim(g->h, g->r, 0);
    g->wo = OutDim(g->w, g->s, 1);
    if (bias_ && (b->ranks[2] != 1 || b->shapes[2][0] != g->k)) {
      return Fail(ORT_INVALID_ARGUMENT, "the bias " + ShapeText(b->shapes[2], b->ranks[2]) + " is not [" + std::to_string(g->k) + "]");
    }
    if (residual_) {
      const size_t i = b->n_in - 1;
      const int64_t want[4] = {g->n, r_nhwc_ ? g->ho : g->k, r_nhwc_ ? g->wo : g->ho, r_nhwc_ ? g->k : g->wo};
      const int64_t line[3] = {g->n, r_nhwc_ ? g->wo : g->k, r_nhwc_ ? g->k : g->wo};
      const int rank = g->line ? 3 : 4;
      const int64_t* expect = g->line ? line : want;
      if (b->ranks[i] != rank || !std::equal(expect, expect + rank, b->shapes[i])) {
        return Fail(ORT_INVALID_ARGUMENT, "the residual " + ShapeText(b->shapes[i], b->ranks[i]) + " is not " + ShapeText(expect, rank));
      }
    }
    return {};
  }

  std::string What(const Geometry& g) const {
    return "N " + std::to_string(g.n) + ", C " + std::to_string(g.c) + ", " + std::to_string(g.h) + "×" + std::to_string(g.w) +
           ", K " + std::to_string(g.k) + ", " + std::to_string(g.r) + "×" + std::to_string(g.s) + ", group " +
           std::to_string(group_) + ", " + (half_ ? "float16" : "float32") + (bias_ ? ", bias" : "") +
           (residual_ && !residual_after_ ? ", residual" : "") + ", " + kActivationNames[activation_] +
           (residual_after_ ? ", then a residual" : "");
  }

  Error Handles(const cu::Driver& d, cu::Context cuctx, Library::Handles** out) const {
    return ContextHandles(d, cuctx, out);
  }

  // dst = each of `batch` row-major [rows, cols] matrices of src transposed ([cols, rows]).
  Error Transpose(const lt::Api& api, lt::Handle handle, const void* src, void* dst, int64_t batch, int64_t rows,
                  int64_t cols, cu::Stream stream) const {
    const int type = half_ ? lt::kR16F : lt::kR32F;
    lt::TransformDesc desc = nullptr;
    lt::Layout a = nullptr, c = nullptr;
    const int32_t op = lt::kOpT, count = static_cast<int32_t>(batch);
    const int64_t stride = rows * cols;
    // Row-major [rows, cols] is column-major cols × rows (ld cols); its transpose, column-major
    // rows × cols (ld rows), is row-major [cols, rows].
    lt::Status s = api.MatrixTransformDescCreate(&desc, lt::kR32F);
    if (s == lt::kSuccess) s = api.MatrixTransformDescSetAttribute(desc, lt::kTransformDescTransA, &op, sizeof(op));
    if (s == lt::kSuccess) s = api.MatrixLayoutCreate(&a, type, cols, rows, cols);
    if (s == lt::kSuccess) s = api.MatrixLayoutCreate(&c, type, rows, cols, rows);
    for (lt::Layout layout : {a, c}) {
      if (s == lt::kSuccess) s = api.MatrixLayoutSetAttribute(layout, lt::kLayoutBatchCount, &count, sizeof(count));
      if (s == lt::kSuccess) s = api.MatrixLayoutSetAttribute(layout, lt::kLayoutStridedBatchOffset, &stride, sizeof(stride));
    }
    const float one = 1.0f, zero = 0.0f;
    if (s == lt::kSuccess) s = api.MatrixTransform(handle, desc, &one, src, a, &zero, nullptr, c, dst, c, stream);
    if (c != nullptr) api.MatrixLayoutDestroy(c);
    if (a != nullptr) api.MatrixLayoutDestroy(a);
    if (desc != nullptr) api.MatrixTransformDescDestroy(desc);
    if (s != lt::kSuccess) return Fail(ORT_FAIL, "cublasLtMatrixTransform (a layout change) failed: " + api.StatusText(s));
    return {};
  }

  // The filter [K, R, S, C/group] of the weight at `w`, made at its first use (mu_ held).
  Error Filter(const cu::Driver& d, const lt::Api& api, lt::Handle handle, const void* w, const Geometry& g,
               cu::Stream stream, const void** out) const {
    auto it = filters_.find(w);
    if (it != filters_.end()) {
      *out = reinterpret_cast<const void*>(it->second.second);
      return {};
    }
    const size_t bytes = static_cast<size_t>(g.k * g.cg * g.r * g.s) * (half_ ? 2 : 4);
    cu::DevicePtr p = 0;
    const cu::Result r = d.MemAlloc(&p, bytes);
    if (r != cu::kSuccess) return Fail(ORT_FAIL, "cuMemAlloc of the NHWC filter (" + std::to_string(bytes) + " bytes) failed: " + d.ErrorText(r));
    cu::Context ctx = nullptr;
    d.CtxGetCurrent(&ctx);
    filters_[w] = {ctx, p};
    driver_ = d;
    *out = reinterpret_cast<const void*>(p);
    return Transpose(api, handle, w, reinterpret_cast<void*>(p), g.k, g.cg, g.r * g.s, stream);
  }

  // One pointwise operation after the convolution: y = mode(a, b) where a is the value before
  // it and b a fixed tensor, the value after step `b_step` (-1: the convolution's), or none.
  struct Step {
    int mode;
    dnn::Descriptor b = nullptr;
    int b_step = -2;
    std::vector<std::pair<int, double>> params = {};
  };

  // The graph's tensors and operations in NHWC: the convolution, then its steps, the last one
  // writing Y.
  void Build(dnn::Graph& graph, const Geometry& g) const {
    const int dt = half_ ? dnn::kHalf : dnn::kFloat;
    auto nhwc = [&](int64_t uid, int type, int64_t n, int64_t c, int64_t h, int64_t w, bool virt) {
      return graph.Tensor({uid, type, {n, c, h, w}, {h * w * c, 1, w * c, c}, virt, 16});
    };
    std::vector<dnn::Descriptor> scalar;
    for (size_t i = 0; i < scalars_.size(); ++i) scalar.push_back(graph.Tensor(dnn::ScalarSpec(kScalar + static_cast<int64_t>(i))));
    std::vector<Step> steps;
    if (bias_) steps.push_back({dnn::kPointwiseAdd, nhwc(kB, dt, 1, g.k, 1, 1, false)});
    if (residual_ && !residual_after_) steps.push_back({dnn::kPointwiseAdd, nhwc(kR, dt, g.n, g.k, g.ho, g.wo, false)});
    switch (activation_) {
      case kNone:
        break;
      case kRelu:
        if (group_ > 1) {
          steps.push_back({dnn::kPointwiseMax, scalar[0]});
        } else {
          steps.push_back({dnn::kPointwiseReluFwd});
        }
        break;
      case kClip:
        steps.push_back({dnn::kPointwiseReluFwd, nullptr, -2,
                         {{dnn::kAttrPointwiseReluLowerClip, params_[0]}, {dnn::kAttrPointwiseReluUpperClip, params_[1]}}});
        break;
      case kLeakyRelu:
        steps.push_back({dnn::kPointwiseReluFwd, nullptr, -2, {{dnn::kAttrPointwiseReluLowerClipSlope, params_[0]}}});
        break;
      case kSilu:
        steps.push_back({dnn::kPointwiseSwishFwd, nullptr, -2, {{dnn::kAttrPointwiseSwishBeta, 1.0}}});
        break;
      case kSigmoid:
        steps.push_back({dnn::kPointwiseSigmoidFwd});
        break;
      case kTanh:
        steps.push_back({dnn::kPointwiseTanhFwd});
        break;
      case kGelu:
        steps.push_back({dnn::kPointwiseGeluFwd});
        break;
      case kGeluTanh:
        steps.push_back({dnn::kPointwiseGeluApproxTanhFwd});
        break;
      default: {  // HardSigmoid: clip(alpha·v + beta, 0, 1); HardSwish: v · HardSigmoid(v)
        const int v = static_cast<int>(steps.size()) - 1;  // the step whose value is activated
        steps.push_back({dnn::kPointwiseMul, scalar[0]});
        steps.push_back({dnn::kPointwiseAdd, scalar[1]});
        steps.push_back({dnn::kPointwiseReluFwd, nullptr, -2,
                         {{dnn::kAttrPointwiseReluLowerClip, 0.0}, {dnn::kAttrPointwiseReluUpperClip, 1.0}}});
        if (activation_ == kHardSwish) steps.push_back({dnn::kPointwiseMul, nullptr, v});
        break;
      }
    }
    if (residual_after_) steps.push_back({dnn::kPointwiseAdd, nhwc(kR, dt, g.n, g.k, g.ho, g.wo, false)});
    if (ScalarTail()) steps.push_back({dnn::kPointwiseMul, scalar[0]});
    int64_t next = 100;  // virtual tensors' ids
    auto out = [&](bool last) {
      return last ? nhwc(kY, dt, g.n, g.k, g.ho, g.wo, false) : nhwc(next++, dnn::kFloat, g.n, g.k, g.ho, g.wo, true);
    };
    std::vector<dnn::Descriptor> values = {out(steps.empty())};  // values[i + 1]: after step i
    graph.ConvForward(nhwc(kX, dt, g.n, g.c, g.h, g.w, false), nhwc(kW, dt, g.k, g.cg, g.r, g.s, false), values[0],
                      {pads_[0], pads_[1]}, {pads_[2], pads_[3]}, strides_, dilations_);
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      const dnn::Descriptor b = st.b_step >= -1 ? values[static_cast<size_t>(st.b_step + 1)] : st.b;
      values.push_back(out(i + 1 == steps.size()));
      graph.Pointwise(st.mode, values[i], b, values.back(), st.params);
    }
  }

  // What a plan depends on: the context, the geometry and every attribute of the graph.
  std::string PlanKey(const Geometry& g) const { return std::to_string(g.ctx) + "," + KeyRest(g); }

  // PlanKey without the context.
  std::string KeyRest(const Geometry& g) const {
    std::string k;
    for (int64_t v : {g.n, g.c, g.h, g.w, g.k, g.cg, g.r, g.s, group_,
                      static_cast<int64_t>(bias_), static_cast<int64_t>(residual_) + residual_after_, static_cast<int64_t>(half_),
                      static_cast<int64_t>(activation_)}) {
      k += std::to_string(v) + ",";
    }
    for (const std::vector<int64_t>* list : {&pads_, &strides_, &dilations_}) {
      for (int64_t v : *list) k += std::to_string(v) + ",";
    }
    return k + std::to_string(params_[0]) + "," + std::to_string(params_[1]);
  }

  // Whether this node holds the plan of geometry `g` (its runs after the first).
  bool Planned(const Geometry& g) const {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.count(g) != 0;
  }

  // The plan of this geometry (made, and timed where it may be, at its first use in the process;
  // mu_ held) and scratch workspace for it.
  Error PlanFor(Call& call, const dnn::Api& api, dnn::Handle handle, const Geometry& g, const std::vector<int64_t>& uids,
                const std::vector<void*>& ptrs, cu::Stream stream, const dnn::Plan** out, void** workspace) const {
    *workspace = nullptr;
    auto it = plans_.find(g);
    if (it == plans_.end()) {
      Library& lib = Library::Get();
      const std::string key = PlanKey(g);
      std::shared_ptr<const dnn::Plan> shared;
      {
        std::lock_guard<std::mutex> lock(lib.plans_mu);
        auto found = lib.plans.find(key);
        if (found != lib.plans.end()) shared = found->second;
      }
      if (shared == nullptr) {
        // Saved by an earlier process (or session: the plans of one made in memory are shared
        // below), else chosen now and saved.
        const auto began = std::chrono::steady_clock::now();
        const std::string saved_at = SavedPath(call.Driver(), api, g);
        shared = Saved(api, handle, g, saved_at);
        if (shared != nullptr) {
          Log("loaded in " + Ms(began) + " (" + What(g) + ")");
        } else {
          dnn::Graph graph(api, handle);
          Build(graph, g);
          std::vector<dnn::Plan> plans;
          const std::string prepared_at = saved_at.empty() ? "" : saved_at + ".candidates";
          const bool prepared = !Preparing() && Candidates(api, handle, g, prepared_at, &plans);
          if (!prepared) {
            plans.clear();
            const std::string err = graph.Plans(kMaxWorkspace, kCandidates, &plans);
            if (!err.empty()) return Fail(ORT_NOT_IMPLEMENTED, err + " (" + What(g) + ")");
            if (Preparing()) SaveCandidates(api, plans, prepared_at);
          }
          int64_t most = 0;
          for (const dnn::Plan& p : plans) most = std::max(most, p.workspace);
          if (most > 0) {
            if (Error e = call.Scratch(static_cast<size_t>(most), workspace)) return e;
          }
          // The fastest on this call's tensors, as the heuristic's order is often wrong: 3 rounds
          // of 10 runs. Convolutions here take 3-30 µs; one round of 3 left the choice to noise
          // (bench_conv.py, H200: one-pixel 1×1 convolutions alike in shape 0.8× and 1.9× of plain).
          // (A preparing worker shares the GPU with others: its timings would be noise.)
          bool timed = false;
          const size_t best = Preparing() ? 0 : Fastest(call.Driver(), stream, plans.size(), kRounds, kReps, [&](size_t i, cu::Stream) {
            // (on `stream`, the handle's: these are timed as runs)
            return dnn::Execute(api, handle, plans[i], uids, ptrs, *workspace).empty();
          }, &timed);
          // Saved only when it was a choice by time (or the only one): an untimed first pick
          // (under capture) is left for a later process to time.
          if (timed || plans.size() == 1) {
            Save(api, plans[best], saved_at);
            if (prepared) std::remove(prepared_at.c_str());
          }
          Log((Preparing() ? "prepared in " : prepared ? "chosen from prepared candidates in " : "chosen in ") +
              Ms(began) + ": heuristics " + std::to_string(static_cast<int>(graph.heuristics_ms)) +
              " ms, finalizing " + std::to_string(plans.size()) + " plans " +
              std::to_string(static_cast<int>(graph.finalize_ms)) + " ms (" + What(g) + ")");
          shared = std::make_shared<const dnn::Plan>(std::move(plans[best]));
        }
        std::lock_guard<std::mutex> lock(lib.plans_mu);
        shared = lib.plans.emplace(key, shared).first->second;  // another node may have made it meanwhile
      }
      it = plans_.emplace(g, shared).first;
    }
    *out = it->second.get();
    if (*workspace == nullptr && it->second->workspace > 0) {
      return call.Scratch(static_cast<size_t>(it->second->workspace), workspace);
    }
    return {};
  }

  // The file a plan of this geometry is saved in, "" when plans are not saved: everything the
  // plan depends on besides the graph (PlanKey without the context) is in the key: the kind of
  // GPU, the driver and cuDNN.
  std::string SavedPath(const cu::Driver& d, const dnn::Api& api, const Geometry& g) const {
    const std::string prefix = SavedPrefix(d, api);
    Geometry any = g;
    any.ctx = 0;
    return prefix.empty() ? "" : plan_cache::PathOf(prefix + PlanKey(any));
  }

  // A saved plan ("onnxstitch conv plan", the winning configuration's mode and index, then
  // cuDNN's serialized plan or nothing), made on this handle; null when there is none or it no
  // longer loads (the caller then chooses again and saves anew).
  std::shared_ptr<const dnn::Plan> Saved(const dnn::Api& api, dnn::Handle handle, const Geometry& g,
                                         const std::string& path) const {
    std::string text, json;
    dnn::Origin origin;
    if (!plan_cache::Read(path, &text) || !ParseSaved(text, &origin, &json)) return nullptr;
    dnn::Plan plan;
    if (!json.empty() && dnn::PlanFromJson(api, handle, json, &plan).empty() && plan.workspace <= kMaxWorkspace) {
      return std::make_shared<const dnn::Plan>(std::move(plan));
    }
    dnn::Graph graph(api, handle);
    Build(graph, g);
    std::vector<dnn::Plan> plans;
    const std::vector<dnn::Origin> only{origin};
    if (!graph.Plans(kMaxWorkspace, 1, &plans, &only).empty() || plans.empty()) return nullptr;
    return std::make_shared<const dnn::Plan>(std::move(plans[0]));
  }

  // Whether this process only prepares plans (ONNXSTITCH_PLAN_PREPARE=1, optimize's workers).
  static bool Preparing() {
    static const bool on = [] {
      const char* v = std::getenv("ONNXSTITCH_PLAN_PREPARE");
      return v != nullptr && std::string(v) == "1";
    }();
    return on;
  }

  // Prepared candidates ("onnxstitch conv candidates", their count, then each one's mode, index
  // and byte count on a line and cuDNN's serialized plan, empty for an engine that is not
  // compiled at run time), made on this handle: false (and nothing kept) where there are none
  // or one does not load, so that the caller finalizes them itself.
  bool Candidates(const dnn::Api& api, dnn::Handle handle, const Geometry& g, const std::string& path,
                  std::vector<dnn::Plan>* out) const {
    std::string text;
    if (!plan_cache::Read(path, &text)) return false;
    std::istringstream in(text);
    std::string magic;
    size_t count = 0;
    if (!std::getline(in, magic) || magic != kCandidatesMagic || !(in >> count) || in.get() != '\n' || count == 0) {
      return false;
    }
    std::vector<dnn::Plan> loaded;
    std::vector<dnn::Origin> precompiled;  // finalized from their configuration: no compile
    for (size_t i = 0; i < count; ++i) {
      dnn::Origin origin;
      size_t bytes = 0;
      if (!(in >> origin.mode >> origin.index >> bytes) || in.get() != '\n' || bytes > text.size()) return false;
      std::string json(bytes, '\0');
      if (bytes > 0 && !in.read(&json[0], static_cast<std::streamsize>(bytes))) return false;
      if (bytes == 0) {
        precompiled.push_back(origin);
        continue;
      }
      dnn::Plan plan;
      if (!dnn::PlanFromJson(api, handle, json, &plan).empty() || plan.workspace > kMaxWorkspace) return false;
      plan.origin = origin;
      loaded.push_back(std::move(plan));
    }
    if (!precompiled.empty()) {
      dnn::Graph graph(api, handle);
      Build(graph, g);
      if (!graph.Plans(kMaxWorkspace, loaded.size() + precompiled.size(), &loaded, &precompiled).empty()) return false;
    }
    *out = std::move(loaded);
    return true;
  }

  static void SaveCandidates(const dnn::Api& api, const std::vector<dnn::Plan>& plans, const std::string& path) {
    if (path.empty()) return;
    std::string text = std::string(kCandidatesMagic) + "\n" + std::to_string(plans.size()) + "\n";
    for (const dnn::Plan& p : plans) {
      const std::string json = dnn::PlanJson(api, p);
      text += std::to_string(p.origin.mode) + " " + std::to_string(p.origin.index) + " " + std::to_string(json.size()) +
              "\n" + json;
    }
    plan_cache::Write(path, text);
  }

  static void Save(const dnn::Api& api, const dnn::Plan& plan, const std::string& path) {
    if (path.empty() || plan.origin.index < 0) return;
    plan_cache::Write(path, std::string(kSavedMagic) + "\n" + std::to_string(plan.origin.mode) + " " +
                                std::to_string(plan.origin.index) + "\n" + dnn::PlanJson(api, plan));
  }

  // Frees the filters this node made.
  void Release() noexcept {
    plans_.clear();
    for (const auto& f : filters_) {
      // Best effort: at process exit the context may be gone already.
      if (driver_.CtxPushCurrent(f.second.first) == cu::kSuccess) {
        driver_.MemFree(f.second.second);
        cu::Context popped = nullptr;
        driver_.CtxPopCurrent(&popped);
      }
    }
    filters_.clear();
  }

  std::vector<int64_t> pads_, strides_, dilations_;
  int64_t group_ = 1;
  bool bias_ = false, residual_ = false, residual_after_ = false, half_ = false, x_nhwc_ = false, y_nhwc_ = false, r_nhwc_ = false;
  int activation_ = kNone;
  double params_[2] = {0, 0};
  std::vector<float> scalars_;  // by-value operands, bound by address at each execution
  mutable std::mutex mu_;
  mutable std::map<Geometry, std::shared_ptr<const dnn::Plan>> plans_;
  mutable std::map<const void*, std::pair<cu::Context, cu::DevicePtr>> filters_;  // by the weight's address
  mutable cu::Driver driver_;
};

}  // namespace

std::unique_ptr<Scheme> MakeConv() { return std::make_unique<Conv>(); }

}  // namespace onnxstitch
