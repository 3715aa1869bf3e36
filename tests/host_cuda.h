// Host stand-ins for the CUDA built-ins the generated kernels use, so a kernel can run on the
// CPU in tests (tests/host_kernels.py). Blocks run one after another (the blocks of a cluster
// together); each CUDA thread of a block is a std::thread, so __syncthreads, warp shuffles and
// cluster barriers keep their meaning. Shared memory is per block: host_kernels.py rewrites
// each `__shared__` declaration into a reference to the running block's storage, which other
// blocks of its cluster reach through stitch_cluster_ptr. Not a simulator of timing or of the
// memory model beyond what barriers order.

#include <array>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define STITCH_CLUSTERS 1

struct stitch_dim3 { unsigned x = 0, y = 1, z = 1; };
inline thread_local stitch_dim3 threadIdx, blockIdx, blockDim, gridDim;

using std::ceil; using std::cos; using std::erf; using std::exp; using std::expm1; using std::floor;
using std::fmod; using std::log; using std::log1p; using std::pow; using std::rint; using std::sin;
using std::sqrt; using std::tanh; using std::fabs;

namespace stitch_host {
struct Cluster;
struct Block {
  explicit Block(int threads) : sync(threads), slots((threads + 31) / 32), mma((threads + 31) / 32) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.emplace_back(std::make_unique<std::barrier<>>(32));
  }
  std::barrier<> sync;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<std::array<unsigned long long, 32>> slots;
  // Per warp: each lane's operands of an mma.sync (stitch_mma_tf32, _f16, _bf16): a[0..3], b0,
  // b1, as register bits.
  std::vector<std::array<std::array<unsigned, 6>, 32>> mma;
  // Shared memory: one allocation per declaration (its id), made by the first thread there,
  // poisoned (all bits set: NaN in floats, -1 in integers) as a kernel must write before it reads.
  std::mutex m;
  std::map<int, std::pair<std::unique_ptr<unsigned char[]>, size_t>> shared;
  unsigned rank = 0;
  Cluster* cluster = nullptr;

  unsigned char* storage(int id, size_t bytes) {
    std::lock_guard<std::mutex> lock(m);
    auto& e = shared[id];
    if (!e.first) {
      e = {std::unique_ptr<unsigned char[]>(new unsigned char[bytes]), bytes};
      std::memset(e.first.get(), 0xff, bytes);
    }
    return e.first.get();
  }
};
struct Cluster {
  explicit Cluster(int threads) : sync(threads) {}
  std::barrier<> sync;
  std::vector<Block*> blocks;
};
inline thread_local Block* block = nullptr;

// The running block's storage for the `__shared__` declaration `id`, of type A (an array type).
template <typename A>
inline A& shared(int id) { return *reinterpret_cast<A*>(block->storage(id, sizeof(A))); }

inline float h2f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
inline unsigned short f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h; }
inline float bf2f(unsigned short h) { unsigned u = (unsigned)h << 16; float f; std::memcpy(&f, &u, 4); return f; }
// float32 → bfloat16, round to nearest even; NaN stays a (quiet) NaN.
inline unsigned short f2bf(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// ex2.approx.ftz: a float32 subnormal result is flushed to (signed) zero.
inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
inline float max_nan(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
inline float min_nan(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
}  // namespace stitch_host

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }  // (the GPU's is within 2 ulp of this)
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __int_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }

inline void __syncthreads() { stitch_host::block->sync.arrive_and_wait(); }
// Every lane of the warp takes part (the kernels call it with all 32 lanes).
inline void __syncwarp(unsigned = 0xffffffffu) { stitch_host::block->warps[threadIdx.x / 32]->arrive_and_wait(); }

// CUDA's vector types (16- and 8-byte aligned, as on the device) and their constructors.
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
using ::exp2f; using ::fmaf; using ::fmaxf; using ::fminf;

namespace stitch_host {
// One m16n8kK mma.sync for the whole warp: every lane deposits its registers, `place` puts one
// lane's (g, t) elements into the 16×K A and K×8 B, then each lane computes its own
// c = C(g, 2t), C(g, 2t+1), C(g+8, 2t), C(g+8, 2t+1), accumulating in float.
template <int K, typename Place>
inline void mma_m16n8(float* c, const unsigned* a, unsigned b0, unsigned b1, Place place) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  auto& ops = block->mma[warp];
  auto& bar = *block->warps[warp];
  ops[lane] = {a[0], a[1], a[2], a[3], b0, b1};
  bar.arrive_and_wait();
  float A[16][K], B[K][8];
  for (int l = 0; l < 32; ++l) place(ops[l], A, B, l / 4, l % 4);
  bar.arrive_and_wait();  // every lane has read the fragments before any writes the next ones
  const int g = lane / 4, t = lane % 4;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  for (int e = 0; e < 4; ++e) {
    float sum = 0.f;
    for (int k = 0; k < K; ++k) sum += A[rows[e]][k] * B[k][cols[e]];
    c[e] += sum;
  }
}
}  // namespace stitch_host

// TF32 tensor cores (the device forms are inline PTX in codegen_attention.MMA_PRELUDE).
// cvt.rna.tf32.f32: round to nearest, ties away from zero, to 10 explicit mantissa bits; the
// float32 bit pattern with its low 13 bits zero. NaN and infinities pass through.
inline unsigned stitch_tf32(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & ~0x1fffu;  // a carry out of the mantissa steps the exponent (to inf past the largest)
}
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, c += a · b, for the whole warp: every
// lane deposits its fragments (lane = 4g + t: a = A(g, t), A(g+8, t), A(g, t+4), A(g+8, t+4);
// b0 = B(t, g), b1 = B(t+4, g)), then computes its own c = C(g, 2t), C(g, 2t+1), C(g+8, 2t),
// C(g+8, 2t+1) from the assembled 16×8 A and 8×8 B, accumulating in float.
inline void stitch_mma_tf32(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  stitch_host::mma_m16n8<8>(c, a, b0, b1, [](const std::array<unsigned, 6>& f, float (*A)[8], float (*B)[8], int g, int t) {
    A[g][t] = __uint_as_float(f[0]), A[g + 8][t] = __uint_as_float(f[1]);
    A[g][t + 4] = __uint_as_float(f[2]), A[g + 8][t + 4] = __uint_as_float(f[3]);
    B[t][g] = __uint_as_float(f[4]), B[t + 4][g] = __uint_as_float(f[5]);
  });
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, c += a · b: two elements a
// register, the lower-indexed in the low 16 bits (lane = 4g + t: a[0] = A(g, 2t..2t+1),
// a[1] = A(g+8, 2t..2t+1), a[2] = A(g, 2t+8..2t+9), a[3] = A(g+8, 2t+8..2t+9); b0 =
// B(2t..2t+1, g), b1 = B(2t+8..2t+9, g)); c as m16n8k8's. Products of half-precision values
// are exact in float; the sums accumulate in float.
template <float (*Cvt)(unsigned short)>
inline void stitch_mma_k16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  stitch_host::mma_m16n8<16>(c, a, b0, b1, [](const std::array<unsigned, 6>& f, float (*A)[16], float (*B)[8], int g, int t) {
    const auto lo = [](unsigned r) { return Cvt((unsigned short)(r & 0xffffu)); };
    const auto hi = [](unsigned r) { return Cvt((unsigned short)(r >> 16)); };
    A[g][2 * t] = lo(f[0]), A[g][2 * t + 1] = hi(f[0]), A[g + 8][2 * t] = lo(f[1]), A[g + 8][2 * t + 1] = hi(f[1]);
    A[g][2 * t + 8] = lo(f[2]), A[g][2 * t + 9] = hi(f[2]), A[g + 8][2 * t + 8] = lo(f[3]), A[g + 8][2 * t + 9] = hi(f[3]);
    B[2 * t][g] = lo(f[4]), B[2 * t + 1][g] = hi(f[4]), B[2 * t + 8][g] = lo(f[5]), B[2 * t + 9][g] = hi(f[5]);
  });
}
inline void stitch_mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  stitch_mma_k16<stitch_host::h2f>(c, a, b0, b1);
}
inline void stitch_mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  stitch_mma_k16<stitch_host::bf2f>(c, a, b0, b1);
}
// cvt.rn.{f16,bf16}x2.f32 d, hi, lo: lo's rounding in the low 16 bits.
inline unsigned stitch_pack_f16(float lo, float hi) {
  return (unsigned)stitch_host::f2h(lo) | ((unsigned)stitch_host::f2h(hi) << 16);
}
inline unsigned stitch_pack_bf16(float lo, float hi) {
  return (unsigned)stitch_host::f2bf(lo) | ((unsigned)stitch_host::f2bf(hi) << 16);
}

// Thread-block clusters (the device forms are inline PTX in codegen_rows.CLUSTER_PRELUDE).
inline unsigned stitch_cluster_rank() { return stitch_host::block->rank; }
inline void stitch_cluster_sync() { stitch_host::block->cluster->sync.arrive_and_wait(); }
template <typename V>
inline const V* stitch_cluster_ptr(const V* p, unsigned rank) {
  stitch_host::Block* me = stitch_host::block;
  const auto* at = reinterpret_cast<const unsigned char*>(p);
  int id = -1;
  size_t offset = 0, bytes = 0;
  {
    std::lock_guard<std::mutex> lock(me->m);
    for (auto& [k, e] : me->shared) {
      if (at >= e.first.get() && at < e.first.get() + e.second) id = k, offset = at - e.first.get(), bytes = e.second;
    }
  }
  if (id < 0 || rank >= me->cluster->blocks.size()) {
    std::fprintf(stderr, "stitch_cluster_ptr: not a shared address, or rank %u outside the cluster\n", rank);
    std::abort();
  }
  return reinterpret_cast<const V*>(me->cluster->blocks[rank]->storage(id, bytes) + offset);
}

// Every lane of the warp takes part (the kernels call shuffles with all 32 lanes).
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  auto& slot = stitch_host::block->slots[warp];
  auto& bar = *stitch_host::block->warps[warp];
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slot[lane] = bits;
  bar.arrive_and_wait();
  int src = lane ^ mask;
  if (src / width != lane / width) src = lane;
  T out;
  std::memcpy(&out, &slot[src], sizeof(T));
  bar.arrive_and_wait();
  return out;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 for the whole warp: lane 8i + j gives the
// address of row j of 8×8 matrix i; lane (g, t) receives per matrix i its elements (g, 2t) and
// (g, 2t+1) — with .trans (2t, g) and (2t+1, g) — the first in the low half.
namespace stitch_host {
template <bool Trans>
inline void ldsm_x4(unsigned* r, const unsigned short* row) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  auto& slot = block->slots[warp];
  auto& bar = *block->warps[warp];
  slot[lane] = reinterpret_cast<unsigned long long>(row);
  bar.arrive_and_wait();
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    auto at = [&](int j) { return reinterpret_cast<const unsigned short*>(slot[8 * i + j]); };
    const unsigned lo = Trans ? at(2 * t)[g] : at(g)[2 * t], hi = Trans ? at(2 * t + 1)[g] : at(g)[2 * t + 1];
    r[i] = lo | (hi << 16);
  }
  bar.arrive_and_wait();  // every lane has read the addresses before any writes the next ones
}
}  // namespace stitch_host
inline void stitch_ldsm_x4(unsigned* r, const unsigned short* row) { stitch_host::ldsm_x4<false>(r, row); }
inline void stitch_ldsm_x4_trans(unsigned* r, const unsigned short* row) { stitch_host::ldsm_x4<true>(r, row); }

struct StitchArgs;
// A kernel whose threads miss a barrier or a shuffle would hang the test run: after five minutes
// the watchdog aborts the process with a message instead (after five: two test workers on a
// loaded 2-core machine took over a minute for one 8 × 12-head attention launch).
struct stitch_watchdog {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread t{[this] {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(300), [this] { return done; })) {
      std::fprintf(stderr, "host kernel launch did not finish in 300 s (a barrier or shuffle not reached by every thread?)\n");
      std::abort();
    }
  }};
  ~stitch_watchdog() {
    { std::lock_guard<std::mutex> lock(m); done = true; }
    cv.notify_all();
    t.join();
  }
};

// A grid of clusters of `ks` blocks (grid a multiple of ks): a cluster's blocks run together.
template <typename F>
inline void stitch_host_launch_clusters(F entry, const StitchArgs& a, int grid, int threads, int ks) {
  stitch_watchdog watchdog;
  for (int c = 0; c < grid / ks; ++c) {
    stitch_host::Cluster cl(threads * ks);
    std::vector<std::unique_ptr<stitch_host::Block>> blocks;
    for (int r = 0; r < ks; ++r) {
      blocks.emplace_back(std::make_unique<stitch_host::Block>(threads));
      blocks.back()->rank = r, blocks.back()->cluster = &cl;
      cl.blocks.push_back(blocks.back().get());
    }
    std::vector<std::thread> ts;
    ts.reserve(threads * ks);
    for (int r = 0; r < ks; ++r)
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, r, t] {
          stitch_host::block = blocks[r].get();
          threadIdx.x = t; blockIdx.x = c * ks + r; blockDim.x = threads; gridDim.x = grid;
          entry(a);
        });
    for (auto& th : ts) th.join();
  }
}

template <typename F>
inline void stitch_host_launch(F entry, const StitchArgs& a, int grid, int threads) {
  stitch_watchdog watchdog;
  for (int b = 0; b < grid; ++b) {
    stitch_host::Block blk(threads);
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, b, t] {
        stitch_host::block = &blk;
        threadIdx.x = t; blockIdx.x = b; blockDim.x = threads; gridDim.x = grid;
        entry(a);
      });
    for (auto& th : ts) th.join();
  }
}
