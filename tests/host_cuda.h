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
  explicit Block(int threads) : sync(threads), slots((threads + 31) / 32) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.emplace_back(std::make_unique<std::barrier<>>(32));
  }
  std::barrier<> sync;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<std::array<unsigned long long, 32>> slots;
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
// ex2.approx.ftz: a float32 subnormal result is flushed to (signed) zero.
inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
inline float max_nan(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
inline float min_nan(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
}  // namespace stitch_host

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __int_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }

inline void __syncthreads() { stitch_host::block->sync.arrive_and_wait(); }

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

struct StitchArgs;
// A kernel whose threads miss a barrier or a shuffle would hang the test run: after a minute
// the watchdog aborts the process with a message instead.
struct stitch_watchdog {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread t{[this] {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [this] { return done; })) {
      std::fprintf(stderr, "host kernel launch did not finish in 60 s (a barrier or shuffle not reached by every thread?)\n");
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
