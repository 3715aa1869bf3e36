// What cuDNN's graph API fuses on this GPU, and at what cost: GEMMs and convolutions with the
// epilogues the library epilogues would ask for (bias, exact and tanh GELU, ReLU, SiLU, a residual
// Add), each against the same call without epilogue and against cuBLASLt. One JSON line per case:
// whether an engine exists, the best of the heuristic's first plans (µs per call, events around
// 50 calls) and the largest relative error of 256 sampled outputs against a float64 reference.
//
// Built and run by scripts/gpu_cudnn.sh on the GPU machine (g++ only: cuDNN, cuBLASLt and the
// driver are loaded at run time, as the runtime library does).
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cublaslt_api.h"
#include "cudnn_graph.h"
#include "probe_cuda.h"

using namespace onnxstitch;
using namespace probe;

namespace {

double Act(const std::string& act, double v) {
  if (act == "relu") return v > 0 ? v : 0;
  if (act == "gelu") return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  if (act == "gelu_tanh") return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  if (act == "silu") return v / (1 + std::exp(-v));
  return v;
}
int PwMode(const std::string& act) {
  if (act == "relu") return dnn::kPointwiseReluFwd;
  if (act == "gelu") return dnn::kPointwiseGeluFwd;
  if (act == "gelu_tanh") return dnn::kPointwiseGeluApproxTanhFwd;
  return dnn::kPointwiseSwishFwd;
}

dnn::Api api;
dnn::Handle handle;
lt::Api ltapi;
lt::Handle lthandle;
unsigned long long workspace;
constexpr int64_t kWorkspace = int64_t{64} << 20;

// Builds the graph via `build`, times its first plans, returns (best µs, error text).
template <typename B>
std::pair<double, std::string> RunGraph(B build, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                                        int* nplans) {
  dnn::Graph g(api, handle);
  build(g);
  std::vector<dnn::Plan> plans;
  std::string err = g.Plans(kWorkspace, 4, &plans);
  *nplans = static_cast<int>(plans.size());
  if (!err.empty()) return {-1, err};
  double best = 1e30;
  size_t best_i = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    std::string e = dnn::Execute(api, handle, plans[i], uids, ptrs, reinterpret_cast<void*>(workspace));
    if (!e.empty()) { err = e; continue; }
    const double us = TimeUs([&] { dnn::Execute(api, handle, plans[i], uids, ptrs, reinterpret_cast<void*>(workspace)); });
    if (us < best) { best = us; best_i = i; }
  }
  if (best > 1e29) return {-1, err};
  dnn::Execute(api, handle, plans[best_i], uids, ptrs, reinterpret_cast<void*>(workspace));  // leave the best one's output
  cuda.CtxSynchronize();
  return {best, ""};
}

void Matmuls(std::mt19937& rng, const char* gpu) {
  const int64_t shapes[][3] = {{1024, 768, 3072}, {1024, 3072, 768}, {1024, 768, 768}, {1024, 768, 2304}, {128, 768, 3072}};
  for (bool half : {false, true}) {
    const int dt = half ? dnn::kHalf : dnn::kFloat;
    for (const auto& s : shapes) {
      const int64_t M = s[0], K = s[1], N = s[2];
      Buf a(M * K, half, rng, 1.f), b(K * N, half, rng, 1.f / std::sqrt(static_cast<float>(K))), bias(N, half, rng, 0.5f),
          res(M * N, half, rng, 1.f), y(M * N, half);
      // cuBLASLt, as the gemm scheme calls it (row-major via Yᵀ = Bᵀ·Aᵀ): plain, bias, tanh GELU.
      for (uint32_t epi : {lt::kEpilogueDefault, lt::kEpilogueBias, lt::kEpilogueGeluBias}) {
        lt::MatmulDesc desc;
        lt::Layout la, lb, lc;
        ltapi.MatmulDescCreate(&desc, half ? lt::kComputeF32 : lt::kComputeF32FastTf32, lt::kR32F);
        ltapi.MatmulDescSetAttribute(desc, lt::kDescEpilogue, &epi, sizeof(epi));
        const void* bp = bias.p();
        ltapi.MatmulDescSetAttribute(desc, lt::kDescBiasPointer, &bp, sizeof(bp));
        const int t = half ? lt::kR16F : lt::kR32F;
        ltapi.MatrixLayoutCreate(&la, t, N, K, N);
        ltapi.MatrixLayoutCreate(&lb, t, K, M, K);
        ltapi.MatrixLayoutCreate(&lc, t, N, M, N);
        lt::Preference pref;
        ltapi.MatmulPreferenceCreate(&pref);
        uint64_t ws = kWorkspace;
        ltapi.MatmulPreferenceSetAttribute(pref, lt::kPrefMaxWorkspaceBytes, &ws, sizeof(ws));
        lt::HeuristicResult r{};
        int found = 0;
        ltapi.MatmulAlgoGetHeuristic(lthandle, desc, la, lb, lc, lc, pref, 1, &r, &found);
        const float one = 1.f, zero = 0.f;
        double us = -1;
        if (found) {
          us = TimeUs([&] {
            ltapi.Matmul(lthandle, desc, &one, b.p(), la, a.p(), lb, &zero, y.p(), lc, y.p(), lc, &r.algo,
                         reinterpret_cast<void*>(workspace), kWorkspace, nullptr);
          });
        }
        const char* name = epi == lt::kEpilogueDefault ? "none" : epi == lt::kEpilogueBias ? "bias" : "bias_gelu_tanh";
        std::printf("{\"gpu\": \"%s\", \"op\": \"matmul\", \"library\": \"cublaslt\", \"dtype\": \"%s\", \"m\": %ld, \"k\": %ld, "
                    "\"n\": %ld, \"epilogue\": \"%s\", \"us\": %.2f}\n",
                    gpu, half ? "float16" : "float32", M, K, N, name, us);
        ltapi.MatmulPreferenceDestroy(pref);
        ltapi.MatrixLayoutDestroy(la);
        ltapi.MatrixLayoutDestroy(lb);
        ltapi.MatrixLayoutDestroy(lc);
        ltapi.MatmulDescDestroy(desc);
      }
      for (std::string epi : {"none", "bias", "bias_gelu", "bias_gelu_tanh", "bias_relu", "bias_residual"}) {
        const bool has_bias = epi != "none", has_res = epi == "bias_residual";
        const std::string act = epi == "bias_gelu" ? "gelu" : epi == "bias_gelu_tanh" ? "gelu_tanh" : epi == "bias_relu" ? "relu" : "";
        std::vector<int64_t> uids = {1, 2, 9};
        std::vector<void*> ptrs = {a.p(), b.p(), y.p()};
        if (has_bias) { uids.push_back(3); ptrs.push_back(bias.p()); }
        if (has_res) { uids.push_back(4); ptrs.push_back(res.p()); }
        int nplans = 0;
        auto r = RunGraph(
            [&](dnn::Graph& g) {
              auto T = [&](int64_t uid, int dtype, std::vector<int64_t> dims, bool virt) {
                return g.Tensor({uid, dtype, dims, dnn::PackedStrides(dims), virt, 16});
              };
              const bool last_mm = !has_bias;
              auto ta = T(1, dt, {1, M, K}, false), tb = T(2, dt, {1, K, N}, false);
              auto cur = T(last_mm ? 9 : 100, last_mm ? dt : dnn::kFloat, {1, M, N}, !last_mm);
              g.Matmul(ta, tb, cur);
              if (!has_bias) return;
              auto tbias = T(3, dt, {1, 1, N}, false);
              const bool last_bias = act.empty() && !has_res;
              auto nb = T(last_bias ? 9 : 101, last_bias ? dt : dnn::kFloat, {1, M, N}, !last_bias);
              g.Pointwise(dnn::kPointwiseAdd, cur, tbias, nb);
              cur = nb;
              if (has_res) {
                auto tres = T(4, dt, {1, M, N}, false);
                auto nr = T(9, dt, {1, M, N}, false);
                g.Pointwise(dnn::kPointwiseAdd, cur, tres, nr);
              } else if (!act.empty()) {
                auto na = T(9, dt, {1, M, N}, false);
                g.Pointwise(PwMode(act), cur, nullptr, na);
              }
            },
            uids, ptrs, &nplans);
        double err = -1;
        if (r.first > 0) {
          std::vector<float> out = y.Read();
          std::uniform_int_distribution<int64_t> dm(0, M - 1), dn(0, N - 1);
          err = 0;
          for (int i = 0; i < 256; ++i) {
            const int64_t m = dm(rng), n = dn(rng);
            double v = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) { v += double(a.host[m * K + k]) * b.host[k * N + n]; mag += std::fabs(double(a.host[m * K + k]) * b.host[k * N + n]); }
            if (has_bias) v += bias.host[n];
            if (has_res) v += res.host[m * N + n];
            v = Act(act, v);
            err = std::max(err, std::fabs(out[m * N + n] - v) / (mag + 1e-6));
          }
        }
        std::printf("{\"gpu\": \"%s\", \"op\": \"matmul\", \"library\": \"cudnn\", \"dtype\": \"%s\", \"m\": %ld, \"k\": %ld, "
                    "\"n\": %ld, \"epilogue\": \"%s\", \"us\": %.2f, \"plans\": %d, \"err\": %.3g, \"why\": \"%s\"}\n",
                    gpu, half ? "float16" : "float32", M, K, N, epi.c_str(), r.first, nplans, err, r.second.c_str());
        std::fflush(stdout);
      }
    }
  }
}

void Convs(std::mt19937& rng, const char* gpu) {
  struct C { int64_t n, c, h, w, k, r, stride, pad, groups; };
  const C cases[] = {{8, 64, 56, 56, 64, 3, 1, 1, 1},   {8, 128, 28, 28, 128, 3, 1, 1, 1}, {8, 256, 14, 14, 256, 3, 1, 1, 1},
                     {8, 256, 56, 56, 64, 1, 1, 0, 1},  {8, 64, 56, 56, 256, 1, 1, 0, 1},  {8, 96, 56, 56, 96, 3, 1, 1, 96},
                     {1, 64, 56, 56, 64, 3, 1, 1, 1},   {1, 16, 320, 320, 32, 3, 2, 1, 1}};
  for (bool half : {false, true}) {
    const int dt = half ? dnn::kHalf : dnn::kFloat;
    for (const C& c : cases) {
      const int64_t cg = c.c / c.groups;
      const int64_t ho = (c.h + 2 * c.pad - c.r) / c.stride + 1, wo = (c.w + 2 * c.pad - c.r) / c.stride + 1;
      Buf x(c.n * c.c * c.h * c.w, half, rng, 1.f), w(c.k * cg * c.r * c.r, half, rng, 1.f / std::sqrt(float(cg * c.r * c.r))),
          bias(c.k, half, rng, 0.5f), res(c.n * c.k * ho * wo, half, rng, 1.f), y(c.n * c.k * ho * wo, half);
      for (bool nhwc : {false, true}) {
        // dims are always N, C, H, W; the layout is in the strides.
        auto strides = [&](int64_t n, int64_t ch, int64_t h, int64_t ww) -> std::vector<int64_t> {
          if (nhwc) return {h * ww * ch, 1, ww * ch, ch};
          return {ch * h * ww, h * ww, ww, 1};
        };
        for (std::string epi : {"none", "bias_relu", "bias_silu", "bias_residual_relu"}) {
          const bool has_bias = epi != "none", has_res = epi == "bias_residual_relu";
          const std::string act = epi == "bias_silu" ? "silu" : has_bias ? "relu" : "";
          std::vector<int64_t> uids = {1, 2, 9};
          std::vector<void*> ptrs = {x.p(), w.p(), y.p()};
          if (has_bias) { uids.push_back(3); ptrs.push_back(bias.p()); }
          if (has_res) { uids.push_back(4); ptrs.push_back(res.p()); }
          int nplans = 0;
          auto r = RunGraph(
              [&](dnn::Graph& g) {
                auto T = [&](int64_t uid, int dtype, int64_t n, int64_t ch, int64_t h, int64_t ww, bool virt) {
                  return g.Tensor({uid, dtype, {n, ch, h, ww}, strides(n, ch, h, ww), virt, 16});
                };
                auto tx = T(1, dt, c.n, c.c, c.h, c.w, false), tw = T(2, dt, c.k, cg, c.r, c.r, false);
                auto cur = T(has_bias ? 100 : 9, has_bias ? dnn::kFloat : dt, c.n, c.k, ho, wo, has_bias);
                g.ConvForward(tx, tw, cur, {c.pad, c.pad}, {c.pad, c.pad}, {c.stride, c.stride}, {1, 1});
                if (!has_bias) return;
                auto tb = T(3, dt, 1, c.k, 1, 1, false);
                auto nb = T(101, dnn::kFloat, c.n, c.k, ho, wo, true);
                g.Pointwise(dnn::kPointwiseAdd, cur, tb, nb);
                cur = nb;
                if (has_res) {
                  auto tr = T(4, dt, c.n, c.k, ho, wo, false);
                  auto nr = T(102, dnn::kFloat, c.n, c.k, ho, wo, true);
                  g.Pointwise(dnn::kPointwiseAdd, cur, tr, nr);
                  cur = nr;
                }
                auto ty = T(9, dt, c.n, c.k, ho, wo, false);
                g.Pointwise(PwMode(act), cur, nullptr, ty);
              },
              uids, ptrs, &nplans);
          std::printf("{\"gpu\": \"%s\", \"op\": \"conv\", \"dtype\": \"%s\", \"layout\": \"%s\", \"n\": %ld, \"c\": %ld, \"hw\": %ld, "
                      "\"k\": %ld, \"r\": %ld, \"stride\": %ld, \"groups\": %ld, \"epilogue\": \"%s\", \"us\": %.2f, \"plans\": %d, "
                      "\"why\": \"%s\"}\n",
                      gpu, half ? "float16" : "float32", nhwc ? "NHWC" : "NCHW", c.n, c.c, c.h, c.k, c.r, c.stride, c.groups,
                      epi.c_str(), r.first, nplans, r.second.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
}


// MobileNetV3-large's convolutions at batch 8 (224²): its depthwise ones (3×3 and 5×5, stride 1
// and 2) and some of its 1×1 ones, in NCHW without epilogue (ORT's call) and in NHWC with each
// epilogue its blocks write: none, bias, bias + ReLU, bias + HardSwish (x · relu6(x + 3) / 6 as
// pointwise ops, the scalars passed by value). The weights' KCRS and KRSC orders agree for
// these (depthwise or 1×1), so one buffer serves both layouts.
void MobileNet(std::mt19937& rng, const char* gpu) {
  struct C { int64_t c, hw, k, r, stride, groups; };
  const C cases[] = {{16, 112, 16, 3, 1, 16},    {64, 112, 64, 3, 2, 64},     {72, 56, 72, 3, 1, 72},
                     {72, 56, 72, 5, 2, 72},     {120, 28, 120, 5, 1, 120},   {240, 28, 240, 3, 2, 240},
                     {200, 14, 200, 3, 1, 200},  {480, 14, 480, 3, 1, 480},   {672, 14, 672, 5, 2, 672},
                     {960, 7, 960, 5, 1, 960},   {16, 112, 64, 1, 1, 1},      {40, 28, 240, 1, 1, 1},
                     {240, 14, 80, 1, 1, 1},     {112, 14, 672, 1, 1, 1},     {160, 7, 960, 1, 1, 1}};
  const int64_t n = 8;
  const float three = 3.f, sixth = 1.f / 6.f, zero = 0.f, one = 1.f;
  for (bool half : {false, true}) {
    const int dt = half ? dnn::kHalf : dnn::kFloat;
    for (const C& c : cases) {
      const int64_t cg = c.c / c.groups, pad = c.r / 2;
      const int64_t ho = (c.hw + 2 * pad - c.r) / c.stride + 1;
      Buf x(n * c.c * c.hw * c.hw, half, rng, 1.f), w(c.k * cg * c.r * c.r, half, rng, 1.f / std::sqrt(float(cg * c.r * c.r))),
          bias(c.k, half, rng, 0.5f), y(n * c.k * ho * ho, half);
      for (bool nhwc : {false, true}) {
        auto strides = [&](int64_t ch, int64_t h) -> std::vector<int64_t> {
          if (nhwc) return {h * h * ch, 1, h * ch, ch};
          return {ch * h * h, h * h, h, 1};
        };
        // bias_max: ReLU as MAX(x, 0) with a by-value 0; bias_mul1: the bias, then MUL by a
        // by-value 1 (does a scalar operand alone move the graph to another engine?).
        for (std::string epi : {"none", "bias", "bias_relu", "bias_hardswish", "bias_max", "bias_mul1"}) {
          if (!nhwc && epi != "none") continue;
          const bool has_bias = epi != "none";
          std::vector<int64_t> uids = {1, 2, 9};
          std::vector<void*> ptrs = {x.p(), w.p(), y.p()};
          if (has_bias) { uids.push_back(3); ptrs.push_back(bias.p()); }
          if (epi == "bias_hardswish") {
            uids.insert(uids.end(), {50, 51});
            ptrs.insert(ptrs.end(), {const_cast<float*>(&three), const_cast<float*>(&sixth)});
          } else if (epi == "bias_max" || epi == "bias_mul1") {
            uids.push_back(52);
            ptrs.push_back(const_cast<float*>(epi == "bias_max" ? &zero : &one));
          }
          int nplans = 0;
          auto r = RunGraph(
              [&](dnn::Graph& g) {
                auto T = [&](int64_t uid, int dtype, int64_t ch, int64_t h, bool virt) {
                  return g.Tensor({uid, dtype, {n, ch, h, h}, strides(ch, h), virt, 16});
                };
                auto tx = T(1, dt, c.c, c.hw, false);
                auto tw = g.Tensor({2, dt, {c.k, cg, c.r, c.r}, nhwc ? std::vector<int64_t>{cg * c.r * c.r, 1, c.r * cg, cg}
                                                                     : dnn::PackedStrides({c.k, cg, c.r, c.r}), false, 16});
                const bool last = !has_bias;
                auto cur = T(last ? 9 : 100, last ? dt : dnn::kFloat, c.k, ho, !last);
                g.ConvForward(tx, tw, cur, {pad, pad}, {pad, pad}, {c.stride, c.stride}, {1, 1});
                if (!has_bias) return;
                auto tb = g.Tensor({3, dt, {1, c.k, 1, 1}, {c.k, 1, c.k, c.k}, false, 16});
                const bool bias_last = epi == "bias";
                auto nb = T(bias_last ? 9 : 101, bias_last ? dt : dnn::kFloat, c.k, ho, !bias_last);
                g.Pointwise(dnn::kPointwiseAdd, cur, tb, nb);
                cur = nb;
                if (epi == "bias_relu") {
                  g.Pointwise(dnn::kPointwiseReluFwd, cur, nullptr, T(9, dt, c.k, ho, false));
                } else if (epi == "bias_max" || epi == "bias_mul1") {
                  auto s = g.Tensor(dnn::ScalarSpec(52));
                  g.Pointwise(epi == "bias_max" ? dnn::kPointwiseMax : dnn::kPointwiseMul, cur, s, T(9, dt, c.k, ho, false));
                } else if (epi == "bias_hardswish") {
                  auto s3 = g.Tensor(dnn::ScalarSpec(50)), s6 = g.Tensor(dnn::ScalarSpec(51));
                  auto t1 = T(102, dnn::kFloat, c.k, ho, true), t2 = T(103, dnn::kFloat, c.k, ho, true),
                       t3 = T(104, dnn::kFloat, c.k, ho, true);
                  g.Pointwise(dnn::kPointwiseAdd, cur, s3, t1);
                  g.Pointwise(dnn::kPointwiseReluFwd, t1, nullptr, t2,
                              {{dnn::kAttrPointwiseReluLowerClip, 0.0}, {dnn::kAttrPointwiseReluUpperClip, 6.0}});
                  g.Pointwise(dnn::kPointwiseMul, t2, s6, t3);
                  g.Pointwise(dnn::kPointwiseMul, cur, t3, T(9, dt, c.k, ho, false));
                }
              },
              uids, ptrs, &nplans);
          double err = -1;
          if (r.first > 0) {  // 256 sampled outputs against a float64 reference
            std::vector<float> out = y.Read();
            std::uniform_int_distribution<int64_t> dn(0, n - 1), dk(0, c.k - 1), dh(0, ho - 1);
            err = 0;
            for (int i = 0; i < 256; ++i) {
              const int64_t b = dn(rng), k = dk(rng), oh = dh(rng), ow = dh(rng);
              double v = 0, mag = 0;
              for (int64_t ci = 0; ci < cg; ++ci)
                for (int64_t u = 0; u < c.r; ++u)
                  for (int64_t q = 0; q < c.r; ++q) {
                    const int64_t ih = oh * c.stride - pad + u, iw = ow * c.stride - pad + q;
                    if (ih < 0 || iw < 0 || ih >= c.hw || iw >= c.hw) continue;
                    const int64_t cin = (k / (c.k / c.groups)) * cg + ci;
                    const double xv = x.host[nhwc ? ((b * c.hw + ih) * c.hw + iw) * c.c + cin : ((b * c.c + cin) * c.hw + ih) * c.hw + iw];
                    const double wv = w.host[((k * cg + ci) * c.r + u) * c.r + q];
                    v += xv * wv;
                    mag += std::fabs(xv * wv);
                  }
              if (has_bias) v += bias.host[k];
              if (epi == "bias_relu" || epi == "bias_max") v = v > 0 ? v : 0;
              if (epi == "bias_hardswish") v = v * std::min(std::max(v + 3, 0.0), 6.0) / 6;
              const int64_t at = nhwc ? ((b * ho + oh) * ho + ow) * c.k + k : ((b * c.k + k) * ho + oh) * ho + ow;
              err = std::max(err, std::fabs(out[at] - v) / (mag + 1));
            }
          }
          std::printf("{\"gpu\": \"%s\", \"op\": \"conv\", \"model\": \"mobilenetv3\", \"dtype\": \"%s\", \"layout\": \"%s\", "
                      "\"c\": %ld, \"hw\": %ld, \"k\": %ld, \"r\": %ld, \"stride\": %ld, \"groups\": %ld, \"epilogue\": \"%s\", "
                      "\"us\": %.2f, \"plans\": %d, \"err\": %.3g, \"why\": \"%s\"}\n",
                      gpu, half ? "float16" : "float32", nhwc ? "NHWC" : "NCHW", c.c, c.hw, c.k, c.r, c.stride, c.groups,
                      epi.c_str(), r.first, nplans, err, r.second.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  char name[128] = {0};
  Start(name, sizeof(name));
  std::string err = api.Load();
  if (!err.empty()) { std::fprintf(stderr, "%s\n", err.c_str()); return 1; }
  err = ltapi.Load();
  if (!err.empty()) { std::fprintf(stderr, "%s\n", err.c_str()); return 1; }
  std::fprintf(stderr, "cuDNN %zu on %s\n", api.GetVersion(), name);
  if (api.Create(&handle) != dnn::kSuccess || ltapi.Create(&lthandle) != lt::kSuccess) return 1;
  cuda.MemAlloc(&workspace, kWorkspace);
  std::mt19937 rng(20261126);
  const std::string what = argc > 1 ? argv[1] : "all";
  if (what == "all" || what == "matmul") Matmuls(rng, name);
  if (what == "all" || what == "conv") Convs(rng, name);
  if (what == "all" || what == "mobilenet") MobileNet(rng, name);
  return 0;
}
