// The cuBLASLt algorithms a gemm node times at its first call (launch.cc: the heuristic's first
// results), and that scripts/probe_gemm.cc lists with their times, asking more widely: more
// results, and split-K variants of the first few of them.
//
// Why look at split-K: BERT-base's products with N = 768 (attention output, FFN down) give
// 1024 × 768 outputs, 96 tiles of 64 × 128 for 132 SMs (H100) — under one wave, each tile walking
// all of K. Measured (H200, cuBLASLt 13.1, bench/results/nvidia-h200/gemm-search/): no split-K
// variant was the fastest at any BERT shape, float32 or float16; Hopper's float32 kernels the
// heuristic returns already carry split-K = -1 (their own K segmentation), and offer no others.
// So nodes ask for none (SearchOptions::varied = 0).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cublaslt_api.h"

namespace onnxstitch {
namespace lt {

// One algorithm to time: as the heuristic or AlgoCheck gave it, with what tells it apart.
struct Candidate {
  MatmulAlgo algo{};
  size_t workspace = 0;
  int32_t id = -1;           // the algorithm's ID (kAlgoConfigId)
  uint32_t tile = 0;         // its tile (kAlgoConfigTileId)
  uint32_t split_k = 1;      // pieces K is cut into (kAlgoConfigSplitK; 0xffffffff: the kernel's own)
  uint32_t reduction = 0;    // how the pieces are summed (kAlgoConfigReduction), 0 without split-K
  bool heuristic = true;     // as the heuristic returned it (false: a split-K variant of one)
};

struct SearchOptions {
  int heuristics = 16;                  // the heuristic's results asked for, each a candidate
  int varied = 0;                       // of those, the first this many get split-K variants
  std::vector<uint32_t> splits{2, 3, 4};
  bool half = false;                    // float16 output: no in-place reduction (partial sums in half)
  size_t max_workspace = 0;
};

namespace detail {
template <typename T>
T Config(const Api& api, const MatmulAlgo& algo, int attr, T fallback) {
  T v = fallback;
  size_t written = 0;
  if (api.MatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != kSuccess || written != sizeof(v)) {
    return fallback;
  }
  return v;
}
}  // namespace detail

// The candidates for one product (`pref` holds the workspace bound and the alignments). Returns
// the heuristic's status; candidates it gave are usable, variants passed cublasLtMatmulAlgoCheck.
inline Status Candidates(const Api& api, Handle handle, MatmulDesc desc, Layout a, Layout b, Layout c, Preference pref,
                         const SearchOptions& o, std::vector<Candidate>* out) {
  out->clear();
  std::vector<HeuristicResult> results(static_cast<size_t>(o.heuristics > 0 ? o.heuristics : 1));
  std::memset(results.data(), 0, results.size() * sizeof(HeuristicResult));
  int found = 0;
  const Status s = api.MatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, static_cast<int>(results.size()),
                                              results.data(), &found);
  if (s != kSuccess) return s;
  auto describe = [&](const MatmulAlgo& algo, size_t workspace, bool heuristic) {
    Candidate k;
    k.algo = algo;
    k.workspace = workspace;
    k.id = detail::Config<int32_t>(api, algo, kAlgoConfigId, -1);
    k.tile = detail::Config<uint32_t>(api, algo, kAlgoConfigTileId, 0);
    k.split_k = detail::Config<uint32_t>(api, algo, kAlgoConfigSplitK, 1);
    k.reduction = k.split_k > 1 ? detail::Config<uint32_t>(api, algo, kAlgoConfigReduction, 0) : 0;
    k.heuristic = heuristic;
    return k;
  };
  for (int i = 0; i < found; ++i) out->push_back(describe(results[i].algo, results[i].workspaceSize, true));
  const size_t given = out->size();
  for (size_t i = 0; i < given && static_cast<int>(i) < o.varied; ++i) {
    const Candidate base = (*out)[i];
    if (base.split_k != 1) continue;
    int32_t supported = 0;
    uint32_t mask = 0;
    size_t written = 0;
    if (api.MatmulAlgoCapGetAttribute(&base.algo, kAlgoCapSplitK, &supported, sizeof(supported), &written) !=
            kSuccess || supported == 0 ||
        api.MatmulAlgoCapGetAttribute(&base.algo, kAlgoCapReductionMask, &mask, sizeof(mask), &written) != kSuccess) {
      continue;
    }
    for (uint32_t scheme : {kReductionComputeType, kReductionInplace}) {
      if ((mask & scheme) == 0 || (o.half && scheme == kReductionInplace)) continue;
      for (uint32_t split : o.splits) {
        MatmulAlgo algo = base.algo;
        if (api.MatmulAlgoConfigSetAttribute(&algo, kAlgoConfigSplitK, &split, sizeof(split)) != kSuccess ||
            api.MatmulAlgoConfigSetAttribute(&algo, kAlgoConfigReduction, &scheme, sizeof(scheme)) != kSuccess) {
          continue;
        }
        HeuristicResult checked;
        std::memset(&checked, 0, sizeof(checked));
        if (api.MatmulAlgoCheck(handle, desc, a, b, c, c, &algo, &checked) != kSuccess ||
            checked.workspaceSize > o.max_workspace) {
          continue;
        }
        bool seen = false;
        for (const Candidate& k : *out) seen = seen || std::memcmp(&k.algo, &algo, sizeof(algo)) == 0;
        if (!seen) out->push_back(describe(algo, checked.workspaceSize, false));
      }
    }
  }
  return kSuccess;
}

}  // namespace lt
}  // namespace onnxstitch
