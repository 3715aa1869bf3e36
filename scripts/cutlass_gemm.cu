// Issue 38's second candidate measured: a CUTLASS 3.x SM90 GEMM (TMA loads, wgmma, a persistent
// warp-specialized cooperative kernel) with its epilogue inside, at the shapes
// scripts/bench_triton_gemm.py times. One configuration per build (macros below); built here with
// nvcc and the nvidia-cutlass wheel's headers (scripts/build_cutlass_gemm.sh), run on the GPU:
//
//   cutlass_gemm M N K [M N K ...]     prints: config M N K microseconds max-rel-err
//
// CONFIG_F16: half inputs and output, else float inputs on TF32 tensor cores (float output).
// CONFIG_EPI: 0 none, 1 per-column bias, 2 per-column bias then exact (erf) GELU.
// CONFIG_TN: the tile's N (128 or 64; M is 128, K 32 for float and 64 for half).
// The weight is stored K-major ([N, K]), as the optimizer may write it: Hopper's TF32 wgmma
// reads B only K-major. Timed as CUDA-graph replays of back-to-back launches (no launch gaps),
// after a check of 512 sampled outputs against a double-precision product on the host.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <random>
#include <vector>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#ifndef CONFIG_F16
#define CONFIG_F16 0
#endif
#ifndef CONFIG_EPI
#define CONFIG_EPI 0
#endif
#ifndef CONFIG_TN
#define CONFIG_TN 128
#endif

using namespace cute;

#if CONFIG_F16
using Element = cutlass::half_t;
using TileShape = Shape<_128, Int<CONFIG_TN>, _64>;
#else
using Element = float;
using TileShape = Shape<_128, Int<CONFIG_TN>, _32>;
#endif
using Acc = float;
using LayoutA = cutlass::layout::RowMajor;     // activations [M, K]
using LayoutB = cutlass::layout::ColumnMajor;  // the weight K-major: [N, K] in memory
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
using ClusterShape = Shape<_1, _1, _1>;

#if CONFIG_EPI == 0
using Fusion = cutlass::epilogue::fusion::LinearCombination<Element, Acc, Element, Acc>;
#elif CONFIG_EPI == 1
using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<Element, Acc, Element, Element, Acc>;
#else
using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, Element, Acc,
                                                                  Element, Element, Acc>;
#endif

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Acc, Acc, void, LayoutD, kAlign, Element, LayoutD, kAlign,
    cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, Acc,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));              \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

static float to_float(Element v) { return static_cast<float>(v); }

static double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

int main(int argc, char** argv) {
  if (argc < 4 || (argc - 1) % 3) {
    std::fprintf(stderr, "usage: %s M N K [M N K ...]\n", argv[0]);
    return 2;
  }
  const char* name = CONFIG_F16 ? "f16" : "f32";
  const char* epi = CONFIG_EPI == 0 ? "none" : CONFIG_EPI == 1 ? "bias" : "gelu";
  for (int s = 1; s + 2 < argc; s += 3) {
    const int M = std::atoi(argv[s]), N = std::atoi(argv[s + 1]), K = std::atoi(argv[s + 2]);
    std::mt19937 rng(M * 7 + N * 3 + K);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<Element> a(size_t(M) * K), b(size_t(N) * K), bias(N);
    for (auto& v : a) v = Element(normal(rng));
    for (auto& v : b) v = Element(normal(rng) / std::sqrt(float(K)));
    for (auto& v : bias) v = Element(normal(rng));
    Element *dA, *dB, *dBias, *dD;
    CHECK(cudaMalloc(&dA, a.size() * sizeof(Element)));
    CHECK(cudaMalloc(&dB, b.size() * sizeof(Element)));
    CHECK(cudaMalloc(&dBias, bias.size() * sizeof(Element)));
    CHECK(cudaMalloc(&dD, size_t(M) * N * sizeof(Element)));
    CHECK(cudaMemcpy(dA, a.data(), a.size() * sizeof(Element), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, b.data(), b.size() * sizeof(Element), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dBias, bias.data(), bias.size() * sizeof(Element), cudaMemcpyHostToDevice));

    auto sA = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideA{}, {M, K, 1});
    auto sB = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideB{}, {N, K, 1});
    auto sD = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideD{}, {M, N, 1});
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1}, {dA, sA, dB, sB},
                                  {{}, nullptr, sD, dD, sD}};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
#if CONFIG_EPI > 0
    args.epilogue.thread.bias_ptr = dBias;
#endif
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
      std::printf("%s %s tn%d %d %d %d unsupported\n", name, epi, CONFIG_TN, M, N, K);
      continue;
    }
    void* workspace = nullptr;
    const size_t ws = Gemm::get_workspace_size(args);
    if (ws) CHECK(cudaMalloc(&workspace, ws));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess || gemm.run(stream) != cutlass::Status::kSuccess) {
      std::printf("%s %s tn%d %d %d %d failed\n", name, epi, CONFIG_TN, M, N, K);
      continue;
    }
    CHECK(cudaStreamSynchronize(stream));
    // 512 sampled outputs against a double-precision product.
    std::vector<Element> d(size_t(M) * N);
    CHECK(cudaMemcpy(d.data(), dD, d.size() * sizeof(Element), cudaMemcpyDeviceToHost));
    double worst = 0, scale = 1e-6;
    std::vector<std::pair<int, int>> picks;
    for (int i = 0; i < 512; ++i) picks.emplace_back(rng() % M, rng() % N);
    std::vector<double> want;
    for (auto [i, j] : picks) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += double(to_float(a[size_t(i) * K + k])) * double(to_float(b[size_t(j) * K + k]));
      if (CONFIG_EPI > 0) acc += to_float(bias[j]);
      if (CONFIG_EPI == 2) acc = gelu(acc);
      want.push_back(acc);
      scale = std::max(scale, std::fabs(acc));
    }
    for (size_t p = 0; p < picks.size(); ++p)
      worst = std::max(worst, std::fabs(double(to_float(d[size_t(picks[p].first) * N + picks[p].second])) - want[p]));
    // Timing: a CUDA graph of 20 launches, replayed.
    const int per_graph = 20, replays = 30;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per_graph; ++i) gemm.run(stream);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    std::vector<float> times;
    for (int r = 0; r < replays; ++r) {
      CHECK(cudaEventRecord(t0, stream));
      CHECK(cudaGraphLaunch(exec, stream));
      CHECK(cudaEventRecord(t1, stream));
      CHECK(cudaEventSynchronize(t1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      times.push_back(ms * 1000.f / per_graph);
    }
    std::sort(times.begin(), times.end());
    std::printf("%s %s tn%d %d %d %d %.2f %.1e\n", name, epi, CONFIG_TN, M, N, K, times[times.size() / 2], worst / scale);
    std::fflush(stdout);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    cudaFree(dA), cudaFree(dB), cudaFree(dBias), cudaFree(dD);
    if (workspace) cudaFree(workspace);
    CHECK(cudaStreamDestroy(stream));
  }
  return 0;
}
