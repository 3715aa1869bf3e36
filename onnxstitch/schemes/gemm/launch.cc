// The gemm scheme's runtime side (shape rule "gemm", docs/abi.md): one cuBLASLt matmul with an
// epilogue, no kernel image. Inputs A [.., M, K] (rank 2 or 3, rows flattened; [K, M] with
// gemm_trans_a), B [K, N] ([N, K] with gemm_trans_b), the bias [N] unless gemm_epilogue is 0,
// then R (gemm_residual) of Y's shape; Y = act(A·B + bias + R).
//
// ONNX tensors are row-major and cuBLASLt's layouts column-major: a row-major X [r, c] is the
// column-major Xᵀ [c, r], so Y = A·B is computed as Yᵀ = Bᵀ·Aᵀ — cuBLASLt's "A" is our B and its
// "B" our A, and the bias (one value per row of column-major D) runs along N as ONNX's does.
//
// Precision: float32 runs CUBLAS_COMPUTE_32F_FAST_TF32 where gemm_tf32 says so (the optimizer
// sets it as ONNX Runtime's CUDA EP runs its own float32 GEMMs: its provider option use_tf32,
// CUDAExecutionProviderInfo::use_tf32, defaults to true since ORT 1.17 — a session passing
// use_tf32=0 gets full float32 from ORT but not from this node, which cannot read the EP's
// options), else CUBLAS_COMPUTE_32F; float16 runs CUBLAS_COMPUTE_32F (float accumulation, as ORT's
// half GEMMs by default). Scales are float on the host.
//
// Per CUDA context a cuBLASLt handle, per (context, stream) one workspace allocated with the
// driver at the first call — ORT's warm-up runs come before a CUDA graph's capture, so nothing is
// allocated during one — shared by every gemm node of that stream (they run one after another on
// it) and freed with the last node using it. Per node and shape the matmul descriptor and the
// layouts are made once and kept, with the algorithm: with gemm_timed, the fastest of the
// heuristic's first kAlgos (gemm_algos.h; split-K variants of them never won at BERT's shapes,
// scripts/probe_gemm.cc), timed on the node's own tensors at its first call (the heuristic's
// first is not always the fastest with an epilogue: scripts/bench_gemm.py times both), chosen
// once per process for each shape, epilogue and alignment and shared by the nodes that have
// them. A call made while the stream is captured into a CUDA graph cannot be timed and takes the
// heuristic's first (ORT's warm-up runs come before a capture, so that is rare).
//
// Generated GEMMs (schemes/gemm/generated.py, docs/abi.md): a node may carry, as its sm_90
// image, a shared object built by nvcc from CUTLASS that runs the same product with its
// epilogue (B stored [N, K]). It is loaded from memory once per process (a memfd, by the
// image's digest) and called through its C functions on ORT's stream. On a GPU of compute
// capability 9.0 the node times it against cuBLASLt's chosen algorithm at its first call per
// shape and keeps the faster; elsewhere, or where it cannot run the shape, cuBLASLt runs. The
// exact-GELU epilogues (6, 7) exist only as generated GEMMs.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cublaslt_api.h"
#include "gemm_algos.h"
#include "scheme.h"
#include "sha256.h"

namespace onnxstitch {
namespace {

constexpr const char* kRule = "gemm";
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
constexpr int64_t kFloat = 1, kFloat16 = 10;           // TensorProto element types
constexpr int kAlgos = 16;                             // heuristic candidates timed per shape
// By gemm_epilogue (schemes/gemm/spec.py's EPILOGUES); codes 1-3 and 6 take a bias; 6 and 7
// (the exact GELU) are no cuBLASLt epilogue: only a generated GEMM runs them.
const uint32_t kEpilogues[] = {lt::kEpilogueDefault, lt::kEpilogueBias, lt::kEpilogueReluBias,
                               lt::kEpilogueGeluBias, lt::kEpilogueRelu, lt::kEpilogueGelu};
const char* const kEpilogueNames[] = {"none", "bias", "relu_bias", "gelu_bias", "relu", "gelu", "gelu_erf_bias",
                                      "gelu_erf"};
constexpr int kLastEpilogue = 7, kLastLibraryEpilogue = 5;
bool Biased(int epilogue) { return (epilogue >= 1 && epilogue <= 3) || epilogue == 6; }
constexpr int kGeneratedArch = 90;  // sm_90a code runs on compute capability 9.0 only
// gemm_library: which of cuBLASLt and the node's generated GEMM runs a shape where both can.
constexpr int kTimed = 0, kCublasLtOnly = 1, kGeneratedOnly = 2;

// A generated GEMM's C functions (cutlass_gemm.cu.in; docs/abi.md, version 1).
struct GeneratedArgs {
  long long m, n, k;
  const void* a;
  const void* b;
  const void* bias;
  const void* c;
  void* d;
  void* workspace;
  unsigned long long workspace_bytes;
  void* stream;
};
struct Generated {
  int (*run)(const void* args, char* error, unsigned long long error_size) = nullptr;
  unsigned long long (*workspace)(long long m, long long n, long long k) = nullptr;
};

// The shared object in `image`, loaded once per process (by its digest) from memory: written to
// a memfd and opened through /proc (it is never unloaded: its CUDA runtime is static; nor is the
// memfd closed, see below).
Error LoadGenerated(const std::string& image, const Generated** out) {
  static std::mutex* mu = new std::mutex;
  static auto* loaded = new std::map<std::string, std::pair<Generated, std::string>>;  // digest → (it, error)
  Sha256 sha;
  sha.Update(image.data(), image.size());
  const std::string digest = sha.HexDigest();
  std::lock_guard<std::mutex> lock(*mu);
  auto it = loaded->find(digest);
  if (it == loaded->end()) {
    Generated g;
    std::string why;
    const int fd = static_cast<int>(memfd_create("onnxstitch-gemm", MFD_CLOEXEC));
    if (fd < 0) {
      why = "memfd_create failed";
    } else {
      size_t done = 0;
      while (done < image.size()) {
        const ssize_t n = write(fd, image.data() + done, image.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      if (done != image.size()) why = "writing it to a memfd failed";
      void* h = why.empty() ? dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
      if (why.empty() && h == nullptr) why = std::string("dlopen failed: ") + dlerror();
      // The memfd stays open while the process lives: closed, its number (and so the path) would
      // come back for the next module, and dlopen returns the library already loaded under a name.
      if (h == nullptr) close(fd);
      if (h != nullptr) {
        auto abi = reinterpret_cast<int (*)()>(dlsym(h, "onnxstitch_gemm_abi"));
        g.run = reinterpret_cast<decltype(g.run)>(dlsym(h, "onnxstitch_gemm_run"));
        g.workspace = reinterpret_cast<decltype(g.workspace)>(dlsym(h, "onnxstitch_gemm_workspace"));
        if (abi == nullptr || g.run == nullptr || g.workspace == nullptr) {
          why = "it lacks onnxstitch_gemm_abi, _run or _workspace";
        } else if (abi() != 1) {
          why = "it is of ABI version " + std::to_string(abi()) + ", this library reads 1";
        }
      }
    }
    it = loaded->emplace(digest, std::make_pair(g, why)).first;
  }
  if (!it->second.second.empty()) {
    return Fail(ORT_FAIL, "the node's generated GEMM cannot be loaded: " + it->second.second);
  }
  *out = &it->second.first;
  return {};
}

// The largest power of two (up to 256) dividing a pointer: cuBLASLt's heuristic must not pick an
// algorithm needing more.
uint32_t Alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

struct ShapeKey {
  unsigned long long ctx;
  int64_t m, k, n;
  uint32_t align[5];  // A, B, bias, C, D
  bool operator<(const ShapeKey& o) const {
    return std::tie(ctx, m, k, n, align[0], align[1], align[2], align[3], align[4]) <
           std::tie(o.ctx, o.m, o.k, o.n, o.align[0], o.align[1], o.align[2], o.align[3], o.align[4]);
  }
};

// What the process shares: cuBLASLt itself, a handle per context, a workspace per stream.
struct Library {
  std::mutex mu;
  bool tried = false;
  std::string error;
  lt::Api api;
  struct Handle {
    lt::Handle handle = nullptr;
    int users = 0;
  };
  struct Workspace {
    cu::Context ctx = nullptr;
    cu::DevicePtr ptr = 0;
    int users = 0;
  };
  std::map<unsigned long long, Handle> handles;                                  // by context key
  std::map<std::pair<unsigned long long, cu::Stream>, Workspace> workspaces;     // by (context, stream)
  // The timed choice per shape and kind of node (Gemm::Kind), shared by nodes alike.
  std::mutex chosen_mu;
  std::map<std::pair<int, ShapeKey>, std::pair<lt::MatmulAlgo, size_t>> chosen;

  static Library& Get() {
    static Library* lib = new Library;  // never destroyed: nodes may outlive static destructors
    return *lib;
  }
};

// One shape's descriptors and algorithm.
struct Plan {
  const lt::Api* api = nullptr;
  lt::MatmulDesc desc = nullptr;
  lt::Layout a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  lt::MatmulAlgo algo{};
  size_t workspace = 0;
  bool generated = false;  // the node's generated GEMM runs this shape, not cuBLASLt
  ~Plan() {
    if (api == nullptr) return;
    for (lt::Layout l : {a, b, c}) {
      if (l != nullptr) api->MatrixLayoutDestroy(l);
    }
    if (desc != nullptr) api->MatmulDescDestroy(desc);
  }
};

class Gemm final : public Scheme {
 public:
  ~Gemm() override { Release(); }

  Error Init(Attrs& a, size_t n_in, size_t n_out) override {
    int64_t epilogue = 0, residual = 0, tf32 = 0, trans_a = 0, trans_b = 0;
    if (Error e = a.RequiredInt("gemm_epilogue", kRule, &epilogue)) return e;
    if (Error e = a.RequiredInt("gemm_residual", kRule, &residual)) return e;
    if (Error e = a.RequiredInt("gemm_tf32", kRule, &tf32)) return e;
    if (Error e = a.RequiredInt("gemm_trans_a", kRule, &trans_a)) return e;
    if (Error e = a.RequiredInt("gemm_trans_b", kRule, &trans_b)) return e;
    int64_t library = kTimed;  // absent: the faster as timed
    bool library_given = false;
    if (Error e = a.Int("gemm_library", &library, &library_given)) return e;
    if (library < kTimed || library > kGeneratedOnly) {
      return Fail(ORT_INVALID_ARGUMENT, "gemm_library must be 0 (the faster as timed), 1 (cuBLASLt) or 2 (generated), got " +
                                            std::to_string(library));
    }
    library_ = static_cast<int>(library);
    int64_t timed = 1;  // absent in models written before it: timed
    bool timed_given = false;
    if (Error e = a.Int("gemm_timed", &timed, &timed_given)) return e;
    if (!timed_given) timed = 1;
    if (epilogue < 0 || epilogue > kLastEpilogue) {
      return Fail(ORT_INVALID_ARGUMENT, "gemm_epilogue must be 0 (none), 1 (bias), 2 (relu_bias), 3 (gelu_bias), "
                                        "4 (relu), 5 (gelu), 6 (gelu_erf_bias) or 7 (gelu_erf), got " +
                                        std::to_string(epilogue));
    }
    for (int64_t flag : {residual, tf32, trans_a, trans_b, timed}) {
      if (flag != 0 && flag != 1) {
        return Fail(ORT_INVALID_ARGUMENT, "gemm_residual, gemm_tf32, gemm_trans_a, gemm_trans_b and gemm_timed are 0 or 1");
      }
    }
    std::vector<int64_t> dtypes;
    bool present = false;
    if (Error e = a.Ints("output_dtypes", &dtypes, &present)) return e;
    if (!present || dtypes.size() != 1 || (dtypes[0] != kFloat && dtypes[0] != kFloat16)) {
      return Fail(ORT_INVALID_ARGUMENT, "a gemm node has one output, float32 or float16 (output_dtypes)");
    }
    epilogue_ = static_cast<int>(epilogue);
    residual_ = residual != 0;
    tf32_ = tf32 != 0;
    trans_a_ = trans_a != 0;
    trans_b_ = trans_b != 0;
    timed_ = timed != 0;
    half_ = dtypes[0] == kFloat16;
    const size_t want = 2 + Biased(epilogue_) + residual_;
    if (n_in != want || n_out != 1) {
      return Fail(ORT_INVALID_ARGUMENT, "a gemm node with epilogue " + std::string(kEpilogueNames[epilogue_]) +
                                            (residual_ ? " and a residual" : "") + " takes " + std::to_string(want) +
                                            " inputs and gives 1 output, not " + std::to_string(n_in) + " and " +
                                            std::to_string(n_out));
    }
    return {};
  }

  bool OutputShapes(const std::vector<std::vector<ShapeDim>>& ins, size_t n_out,
                    std::vector<std::vector<ShapeDim>>* outs) const override {
    if (ins.size() < 2 || n_out != 1 || ins[1].size() != 2) return false;
    const std::vector<ShapeDim>& a = ins[0];
    if (a.size() < 2 || a.size() > 3 || (trans_a_ && a.size() != 2)) return false;
    std::vector<ShapeDim> y;
    if (trans_a_) {
      y.push_back(a[1]);
    } else {
      y.assign(a.begin(), a.end() - 1);
    }
    y.push_back(ins[1][trans_b_ ? 0 : 1]);
    outs->assign(1, y);
    return true;
  }

  Error Entries(const cu::Driver&, const std::string&, Loaded*) const override { return {}; }
  bool UsesImage() const override { return false; }

  // The sm_90 image, where there is one, is the node's generated GEMM (loaded at its first use).
  Error TakeImages(const std::vector<int64_t>& archs, const std::vector<std::string>& images) override {
    for (size_t i = 0; i < archs.size() && i < images.size(); ++i) {
      if (archs[i] == kGeneratedArch) generated_image_ = images[i];
    }
    if (!generated_image_.empty() && (trans_a_ || (!trans_b_ && !half_))) {
      return Fail(ORT_INVALID_ARGUMENT, "a generated GEMM reads A [M, K] and B [N, K] (in half also [K, N]): "
                                        "gemm_trans_a 0, gemm_trans_b 1");
    }
    return {};
  }

  Error Run(Call& call, Bound* b) const override {
    int64_t m = 0, k = 0, n = 0;
    std::vector<int64_t> y;
    if (Error e = Shapes(b, &m, &k, &n, &y)) return e;
    void* out = nullptr;
    if (Error e = call.Output(0, y.data(), y.size(), &out)) return e;
    if (m == 0 || n == 0) return {};  // nothing to compute (K is the weight's, never 0 here)
    cu::Stream stream = nullptr;
    const Loaded* l = nullptr;
    if (Error e = call.Enter(&stream, &l)) return e;
    const cu::Driver& d = call.Driver();
    const unsigned long long ctx = d.ContextKey(l->ctx);
    Library& lib = Library::Get();
    lt::Handle handle = nullptr;
    cu::DevicePtr workspace = 0;
    if (Error e = Resources(d, l->ctx, ctx, stream, &handle, &workspace)) return e;
    const void* bias = Biased(epilogue_) ? b->args.in[2] : nullptr;
    const void* residual = residual_ ? b->args.in[b->n_in - 1] : out;
    const ShapeKey key{ctx, m, k, n, {Alignment(b->args.in[0]), Alignment(b->args.in[1]), Alignment(bias),
                                      Alignment(residual), Alignment(out)}};
    const lt::Api& api = lib.api;
    const float alpha = 1.0f, beta = residual_ ? 1.0f : 0.0f;
    // One product with `algo` on this call's tensors, on `on` (the descriptor's bias pointer is set per call).
    auto matmul = [&](const Plan& plan, const lt::MatmulAlgo& algo, size_t algo_workspace, cu::Stream on) {
      lt::Status s = lt::kSuccess;
      if (bias != nullptr) s = api.MatmulDescSetAttribute(plan.desc, lt::kDescBiasPointer, &bias, sizeof(bias));
      if (s != lt::kSuccess) return s;
      return api.Matmul(handle, plan.desc, &alpha, b->args.in[1], plan.a, b->args.in[0], plan.b, &beta, residual,
                        plan.c, out, plan.c, &algo, reinterpret_cast<void*>(workspace), algo_workspace, on);
    };
    const Generated* gen = nullptr;
    if (!generated_image_.empty() && l->cc == kGeneratedArch) {
      if (Error e = LoadGenerated(generated_image_, &gen)) return e;
    }
    if (gen == nullptr && epilogue_ > kLastLibraryEpilogue) {
      return Fail(ORT_NOT_IMPLEMENTED, std::string("the ") + kEpilogueNames[epilogue_] + " epilogue runs only as a "
                  "generated GEMM, on compute capability 9.0 (this GPU's is " + std::to_string(l->cc / 10) + "." +
                  std::to_string(l->cc % 10) + (generated_image_.empty() ? "; the node carries none)" : ")"));
    }
    // One generated product on this call's tensors, on `on`; its error in *why.
    const GeneratedRun generated = [&](std::string* why, cu::Stream on) {
      GeneratedArgs x{m, n, k, b->args.in[0], b->args.in[1], bias, residual_ ? residual : nullptr, out,
                      reinterpret_cast<void*>(workspace), kWorkspaceBytes, on};
      char error[256] = {0};
      if (gen->run(&x, error, sizeof(error)) == 0) return true;
      if (why != nullptr) *why = error;
      return false;
    };
    std::lock_guard<std::mutex> lock(mu_);  // the descriptor is this node's, its bias pointer set per call
    const Plan* plan = nullptr;
    if (Error e = PlanFor(d, api, handle, key, stream, matmul, gen ? &generated : nullptr, &plan)) return e;
    if (plan->generated) {
      std::string why;
      if (!generated(&why, stream)) return Fail(ORT_FAIL, "the generated GEMM failed (" + What(&key) + "): " + why);
      return {};
    }
    const lt::Status s = matmul(*plan, plan->algo, plan->workspace, stream);
    if (s != lt::kSuccess) return Failed(api, "cublasLtMatmul", s, &key);
    return {};
  }

 private:
  // M, K, N and Y's dims from the bound inputs; an error naming what does not fit.
  Error Shapes(const Bound* b, int64_t* m, int64_t* k, int64_t* n, std::vector<int64_t>* y) const {
    const int64_t* a = b->shapes[0];
    const size_t ra = b->ranks[0];
    const int64_t* w = b->shapes[1];
    if (ra < 2 || ra > 3 || (trans_a_ && ra != 2) || b->ranks[1] != 2) {
      return Fail(ORT_INVALID_ARGUMENT, "A " + ShapeText(a, ra) + " and B " + ShapeText(w, b->ranks[1]) +
                                            ": A of rank 2" + (trans_a_ ? "" : " or 3") + " and B of rank 2 are needed");
    }
    *k = trans_a_ ? a[0] : a[ra - 1];
    *m = trans_a_ ? a[1] : a[0] * (ra == 3 ? a[1] : 1);
    *n = trans_b_ ? w[0] : w[1];
    if ((trans_b_ ? w[1] : w[0]) != *k) {
      return Fail(ORT_INVALID_ARGUMENT, "A " + ShapeText(a, ra) + " and B " + ShapeText(w, 2) + " do not multiply" +
                                            (trans_a_ || trans_b_ ? " (as transposed)" : ""));
    }
    if (trans_a_) {
      y->assign({*m});
    } else {
      y->assign(a, a + ra - 1);
    }
    y->push_back(*n);
    if (Biased(epilogue_) && (b->ranks[2] != 1 || b->shapes[2][0] != *n)) {
      return Fail(ORT_INVALID_ARGUMENT, "the bias " + ShapeText(b->shapes[2], b->ranks[2]) + " is not [" +
                                            std::to_string(*n) + "]");
    }
    const size_t r = b->n_in - 1;
    if (residual_ && (b->ranks[r] != y->size() || !std::equal(y->begin(), y->end(), b->shapes[r]))) {
      return Fail(ORT_INVALID_ARGUMENT, "the residual " + ShapeText(b->shapes[r], b->ranks[r]) +
                                            " is not of the product's shape " + ShapeText(y->data(), y->size()));
    }
    return {};
  }

  // cuBLASLt, the context's handle and the stream's workspace (made at their first use).
  Error Resources(const cu::Driver& d, cu::Context cuctx, unsigned long long ctx, cu::Stream stream, lt::Handle* handle,
                  cu::DevicePtr* workspace) const {
    Library& lib = Library::Get();
    std::lock_guard<std::mutex> lock(lib.mu);
    if (!lib.tried) {
      lib.tried = true;
      lib.error = lib.api.Load();
    }
    if (!lib.error.empty()) return Fail(ORT_FAIL, lib.error);
    Library::Handle& h = lib.handles[ctx];
    if (h.handle == nullptr) {
      const lt::Status s = lib.api.Create(&h.handle);
      if (s != lt::kSuccess) {
        lib.handles.erase(ctx);
        return Failed(lib.api, "cublasLtCreate", s);
      }
    }
    Library::Workspace& ws = lib.workspaces[{ctx, stream}];
    if (ws.ptr == 0) {
      const cu::Result r = d.MemAlloc(&ws.ptr, kWorkspaceBytes);
      if (r != cu::kSuccess) {
        lib.workspaces.erase({ctx, stream});
        return Fail(ORT_FAIL, "cuMemAlloc of cuBLASLt's " + std::to_string(kWorkspaceBytes >> 20) +
                                  " MiB workspace failed: " + d.ErrorText(r));
      }
      ws.ctx = cuctx;
    }
    std::lock_guard<std::mutex> mine(mu_);
    if (used_.emplace(ctx, stream).second) {
      ++h.users;
      ++ws.users;
      driver_ = d;  // a copy (entry points only): Release may run after the node's own is gone
    }
    *handle = h.handle;
    *workspace = ws.ptr;
    return {};
  }

  using Matmul = std::function<lt::Status(const Plan&, const lt::MatmulAlgo&, size_t, cu::Stream)>;
  using GeneratedRun = std::function<bool(std::string*, cu::Stream)>;

  // What, besides its shape, makes nodes' algorithms interchangeable.
  int Kind() const {
    return epilogue_ * 64 + timed_ * 32 + residual_ * 16 + half_ * 8 + tf32_ * 4 + trans_a_ * 2 + trans_b_;
  }

  // The descriptors and algorithm of one shape, made at its first call (mu_ held); with
  // `generated` (the node's generated GEMM, loaded), that GEMM where cuBLASLt cannot run the
  // epilogue, else the faster of it and cuBLASLt's choice, timed.
  Error PlanFor(const cu::Driver& d, const lt::Api& api, lt::Handle handle, const ShapeKey& key, cu::Stream stream,
                const Matmul& matmul, const GeneratedRun* generated, const Plan** out) const {
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      *out = it->second.get();
      return {};
    }
    auto p = std::make_unique<Plan>();
    p->api = &api;
    if (epilogue_ > kLastLibraryEpilogue) {  // only generated (Run checked that it is loaded)
      std::string why;
      if (!(*generated)(&why, stream)) return Fail(ORT_FAIL, "the generated GEMM failed (" + What(&key) + "): " + why);
      p->generated = true;
      *out = p.get();
      plans_.emplace(key, std::move(p));
      return {};
    }
    const int type = half_ ? lt::kR16F : lt::kR32F;
    const int compute = !half_ && tf32_ ? lt::kComputeF32FastTf32 : lt::kComputeF32;
    const int32_t op_a = trans_b_ ? lt::kOpT : lt::kOpN, op_b = trans_a_ ? lt::kOpT : lt::kOpN;
    const uint32_t epilogue = kEpilogues[epilogue_];
    lt::Status s = api.MatmulDescCreate(&p->desc, compute, lt::kR32F);
    if (s == lt::kSuccess) s = api.MatmulDescSetAttribute(p->desc, lt::kDescTransA, &op_a, sizeof(op_a));
    if (s == lt::kSuccess) s = api.MatmulDescSetAttribute(p->desc, lt::kDescTransB, &op_b, sizeof(op_b));
    if (s == lt::kSuccess) s = api.MatmulDescSetAttribute(p->desc, lt::kDescEpilogue, &epilogue, sizeof(epilogue));
    if (s != lt::kSuccess) return Failed(api, "making the matmul descriptor", s, &key);
    // Column-major, as stored: our B is [K, N] row-major = N×K (ld N), or K×N (ld K) transposed
    // by op T; our A [M, K] = K×M (ld K), or [K, M] = M×K (ld M) under op T; Y = N×M (ld N).
    const int64_t m = key.m, k = key.k, n = key.n;
    s = trans_b_ ? api.MatrixLayoutCreate(&p->a, type, k, n, k) : api.MatrixLayoutCreate(&p->a, type, n, k, n);
    if (s == lt::kSuccess) {
      s = trans_a_ ? api.MatrixLayoutCreate(&p->b, type, m, k, m) : api.MatrixLayoutCreate(&p->b, type, k, m, k);
    }
    if (s == lt::kSuccess) s = api.MatrixLayoutCreate(&p->c, type, n, m, n);
    if (s != lt::kSuccess) return Failed(api, "cublasLtMatrixLayoutCreate", s, &key);
    if (Error e = Choose(d, api, handle, key, stream, matmul, p.get())) return e;
    if (generated != nullptr && library_ == kGeneratedOnly) {
      p->generated = (*generated)(nullptr, stream);
    } else if (generated != nullptr && library_ == kTimed) {
      // cuBLASLt's choice first: where nothing can be timed (a capture), it stays. Timed as CUDA
      // graphs: the generated GEMM's per-call host work (its TMA descriptors) is not the GPU's.
      const Plan& q = *p;
      bool timed = false;
      const size_t best = Fastest(d, stream, 2, 3, 10, [&](size_t i, cu::Stream on) {
        return i == 0 ? matmul(q, q.algo, q.workspace, on) == lt::kSuccess : (*generated)(nullptr, on);
      }, &timed, /*graphed=*/true);
      p->generated = timed && best == 1;
    }
    *out = p.get();
    plans_.emplace(key, std::move(p));
    return {};
  }

  // The fastest of the heuristic's first kAlgos algorithms (gemm_algos.h) for this shape and
  // these alignments, or the one chosen before for a node alike.
  Error Choose(const cu::Driver& d, const lt::Api& api, lt::Handle handle, const ShapeKey& key, cu::Stream stream,
               const Matmul& matmul, Plan* p) const {
    Library& lib = Library::Get();
    {
      std::lock_guard<std::mutex> lock(lib.chosen_mu);
      auto it = lib.chosen.find({Kind(), key});
      if (it != lib.chosen.end()) {
        p->algo = it->second.first;
        p->workspace = it->second.second;
        return {};
      }
    }
    lt::Preference pref = nullptr;
    lt::Status s = api.MatmulPreferenceCreate(&pref);
    const uint64_t max_workspace = kWorkspaceBytes;
    // cuBLASLt's A is our B and its B our A; the bias has no preference of its own but C's bound.
    const uint32_t align_a = key.align[1], align_b = key.align[0];
    const uint32_t align_c = std::min(key.align[3], key.align[2]), align_d = key.align[4];
    if (s == lt::kSuccess) s = api.MatmulPreferenceSetAttribute(pref, lt::kPrefMaxWorkspaceBytes, &max_workspace, sizeof(max_workspace));
    if (s == lt::kSuccess) s = api.MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentA, &align_a, sizeof(align_a));
    if (s == lt::kSuccess) s = api.MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentB, &align_b, sizeof(align_b));
    if (s == lt::kSuccess) s = api.MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentC, &align_c, sizeof(align_c));
    if (s == lt::kSuccess) s = api.MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentD, &align_d, sizeof(align_d));
    lt::SearchOptions search;
    search.heuristics = timed_ ? kAlgos : 1;
    search.half = half_;
    search.max_workspace = kWorkspaceBytes;
    std::vector<lt::Candidate> candidates;
    if (s == lt::kSuccess) s = lt::Candidates(api, handle, p->desc, p->a, p->b, p->c, pref, search, &candidates);
    if (pref != nullptr) api.MatmulPreferenceDestroy(pref);
    if (s != lt::kSuccess) return Failed(api, "cublasLtMatmulAlgoGetHeuristic", s, &key);
    if (candidates.empty()) return Fail(ORT_NOT_IMPLEMENTED, "cuBLASLt has no algorithm for " + What(&key));
    // 2 rounds of 5: a product takes 5-50 µs here, and the candidates differ by a few percent.
    bool timed = false;
    const size_t best = Fastest(d, stream, candidates.size(), 2, 5, [&](size_t i, cu::Stream on) {
      return matmul(*p, candidates[i].algo, candidates[i].workspace, on) == lt::kSuccess;
    }, &timed);
    p->algo = candidates[best].algo;
    p->workspace = candidates[best].workspace;
    if (timed || candidates.size() == 1) {
      std::lock_guard<std::mutex> lock(lib.chosen_mu);
      lib.chosen.emplace(std::make_pair(Kind(), key), std::make_pair(p->algo, p->workspace));
    }
    return {};
  }

  std::string What(const ShapeKey* key) const {
    std::string s = "M " + std::to_string(key->m) + ", K " + std::to_string(key->k) + ", N " + std::to_string(key->n) +
                    ", " + (half_ ? "float16" : tf32_ ? "float32 (TF32)" : "float32") + ", epilogue " +
                    kEpilogueNames[epilogue_] + (residual_ ? " + residual" : "");
    return s;
  }

  Error Failed(const lt::Api& api, const char* what, lt::Status s, const ShapeKey* key = nullptr) const {
    return Fail(ORT_FAIL, std::string(what) + " failed: " + api.StatusText(s) + (key ? " (" + What(key) + ")" : ""));
  }

  // Gives back this node's share of the handles and workspaces it used.
  void Release() noexcept {
    plans_.clear();
    if (used_.empty()) return;
    Library& lib = Library::Get();
    std::lock_guard<std::mutex> lock(lib.mu);
    for (const auto& use : used_) {
      auto ws = lib.workspaces.find(use);
      if (ws != lib.workspaces.end() && --ws->second.users == 0) {
        // Best effort: at process exit the context may be gone already.
        if (driver_.CtxPushCurrent(ws->second.ctx) == cu::kSuccess) {
          driver_.MemFree(ws->second.ptr);
          cu::Context popped = nullptr;
          driver_.CtxPopCurrent(&popped);
        }
        lib.workspaces.erase(ws);
      }
      auto h = lib.handles.find(use.first);
      if (h != lib.handles.end() && --h->second.users == 0) {
        lib.api.Destroy(h->second.handle);
        lib.handles.erase(h);
      }
    }
    used_.clear();
  }

  std::string generated_image_;  // the shared object of the node's generated GEMM, or empty
  int epilogue_ = 0, library_ = kTimed;
  bool residual_ = false, tf32_ = false, trans_a_ = false, trans_b_ = false, half_ = false, timed_ = true;
  mutable std::mutex mu_;
  mutable std::map<ShapeKey, std::unique_ptr<Plan>> plans_;
  mutable std::set<std::pair<unsigned long long, cu::Stream>> used_;  // (context, stream) this node holds
  mutable cu::Driver driver_;
};

}  // namespace

std::unique_ptr<Scheme> MakeGemm() { return std::make_unique<Gemm>(); }

}  // namespace onnxstitch
