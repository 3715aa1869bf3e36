// Which cuBLASLt algorithms win at BERT-base's product shapes on this GPU, among those a gemm
// node times (onnxstitch/schemes/gemm/gemm_algos.h: the heuristic's results and split-K
// variants of its first few), asked for more widely than the node does. One JSON line per
// product, dtype and epilogue: the heuristic's first, the best of what the node times, the best
// of the wider search, and the fastest few with their ID, tile, split-K and reduction. Each time
// is events around 50 calls after 5 warm-ups, best of 3 such rounds.
//
// Built and run by scripts/gpu_cudnn.sh gemm on the GPU machine (g++ only, cuBLASLt loaded at
// run time as the runtime library does).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cublaslt_api.h"
#include "gemm_algos.h"
#include "probe_cuda.h"

using namespace onnxstitch;
using namespace probe;

namespace {

constexpr size_t kWorkspace = size_t{32} << 20;  // as the gemm scheme's

struct Timed {
  lt::Candidate c;
  double us;
  bool node;  // among what a gemm node times (its heuristics and varied counts)
};

std::string Json(const Timed& t) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "{\"id\": %d, \"tile\": %u, \"split_k\": %u, \"reduction\": %u, \"heuristic\": %s, \"us\": %.2f}",
                t.c.id, t.c.tile, t.c.split_k, t.c.reduction, t.c.heuristic ? "true" : "false", t.us);
  return buf;
}

void Product(lt::Api& api, lt::Handle handle, unsigned long long workspace, std::mt19937& rng, const char* gpu,
             int64_t M, int64_t K, int64_t N, bool half, const char* epilogue) {
  const std::string e = epilogue;
  const bool bias_on = e != "none", residual = e == "residual";
  const uint32_t epi = e == "none" ? lt::kEpilogueDefault : e == "gelu" ? lt::kEpilogueGeluBias : lt::kEpilogueBias;
  Buf a(M * K, half, rng, 1.f), b(K * N, half, rng, 1.f), bias(N, half, rng, 0.5f), res(M * N, half, rng, 1.f),
      y(M * N, half);
  lt::MatmulDesc desc;
  lt::Layout la, lb, lc;
  api.MatmulDescCreate(&desc, half ? lt::kComputeF32 : lt::kComputeF32FastTf32, lt::kR32F);
  api.MatmulDescSetAttribute(desc, lt::kDescEpilogue, &epi, sizeof(epi));
  const void* bp = bias.p();
  if (bias_on) api.MatmulDescSetAttribute(desc, lt::kDescBiasPointer, &bp, sizeof(bp));
  const int t = half ? lt::kR16F : lt::kR32F;
  // Row-major Y = A·B as column-major Yᵀ = Bᵀ·Aᵀ, as the gemm scheme calls it.
  api.MatrixLayoutCreate(&la, t, N, K, N);
  api.MatrixLayoutCreate(&lb, t, K, M, K);
  api.MatrixLayoutCreate(&lc, t, N, M, N);
  lt::Preference pref;
  api.MatmulPreferenceCreate(&pref);
  const uint64_t ws = kWorkspace;
  api.MatmulPreferenceSetAttribute(pref, lt::kPrefMaxWorkspaceBytes, &ws, sizeof(ws));
  lt::SearchOptions node, wide;  // node: what a gemm node times (launch.cc's kAlgos)
  wide.half = half;
  wide.max_workspace = kWorkspace;
  wide.heuristics = 64;
  wide.varied = 16;
  wide.splits = {2, 3, 4, 6, 8, 12, 16};
  std::vector<lt::Candidate> all;
  lt::Candidates(api, handle, desc, la, lb, lc, pref, wide, &all);
  const float one = 1.f, beta = residual ? 1.f : 0.f;
  std::vector<Timed> timed;
  size_t mine = 0;  // the node's candidates: the heuristic's first results (it is deterministic)
  for (size_t i = 0; i < all.size(); ++i) {
    const lt::Candidate& c = all[i];
    const bool in_node = c.heuristic && static_cast<int>(i) < node.heuristics;
    mine += in_node;
    auto run = [&] {
      return api.Matmul(handle, desc, &one, b.p(), la, a.p(), lb, &beta, residual ? res.p() : y.p(), lc, y.p(), lc,
                        &c.algo, reinterpret_cast<void*>(workspace), c.workspace, nullptr);
    };
    if (run() != lt::kSuccess) continue;
    double us = 1e30;
    for (int r = 0; r < 3; ++r) us = std::min(us, TimeUs(run));
    timed.push_back({c, us, in_node});
  }
  if (timed.empty()) return;
  const double first = timed[0].us;
  double node_best = 1e30;
  for (const Timed& x : timed) {
    if (x.node) node_best = std::min(node_best, x.us);
  }
  std::sort(timed.begin(), timed.end(), [](const Timed& p, const Timed& q) { return p.us < q.us; });
  std::string best;
  for (size_t i = 0; i < timed.size() && i < 6; ++i) best += (i ? ", " : "") + Json(timed[i]);
  std::printf("{\"gpu\": \"%s\", \"dtype\": \"%s\", \"m\": %ld, \"k\": %ld, \"n\": %ld, \"epilogue\": \"%s\", "
              "\"candidates\": %zu, \"node_candidates\": %zu, \"heuristic_first_us\": %.2f, \"node_best_us\": %.2f, "
              "\"wide_best_us\": %.2f, \"fastest\": [%s]}\n",
              gpu, half ? "float16" : "float32", static_cast<long>(M), static_cast<long>(K), static_cast<long>(N), epilogue,
              timed.size(), mine, first, node_best, timed[0].us, best.c_str());
  std::fflush(stdout);
  api.MatmulPreferenceDestroy(pref);
  api.MatrixLayoutDestroy(la);
  api.MatrixLayoutDestroy(lb);
  api.MatrixLayoutDestroy(lc);
  api.MatmulDescDestroy(desc);
}

}  // namespace

int main() {
  char name[128] = {0};
  Start(name, sizeof(name));
  lt::Api api;
  const std::string err = api.Load();
  if (!err.empty()) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  lt::Handle handle;
  if (api.Create(&handle) != lt::kSuccess) return 1;
  unsigned long long workspace = 0;
  cuda.MemAlloc(&workspace, kWorkspace);
  std::fprintf(stderr, "cuBLASLt %zu on %s\n", api.GetVersion(), name);
  std::mt19937 rng(20261126);
  // BERT-base at batch 8 × 128 tokens: attention output, FFN up, FFN down, fused QKV.
  const int64_t shapes[][3] = {{1024, 768, 768}, {1024, 768, 3072}, {1024, 3072, 768}, {1024, 768, 2304}};
  for (bool half : {false, true}) {
    for (const auto& s : shapes) {
      for (const char* epilogue : {"none", "bias", "residual", "gelu"}) {
        Product(api, handle, workspace, rng, name, s[0], s[1], s[2], half, epilogue);
      }
    }
  }
  return 0;
}
