// What the GPU probes (probe_cudnn.cc, probe_gemm.cc) share: the driver entry points they use,
// loaded at run time as the runtime library does; float16 conversions; device buffers with host
// copies; a timer of calls by events.
#pragma once

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace probe {

struct Cuda {
  using R = int;
  R (*Init)(unsigned);
  R (*DeviceGet)(int*, int);
  R (*PrimaryCtxRetain)(void**, int);
  R (*CtxSetCurrent)(void*);
  R (*MemAlloc)(unsigned long long*, size_t);
  R (*MemFree)(unsigned long long);
  R (*HtoD)(unsigned long long, const void*, size_t);
  R (*DtoH)(void*, unsigned long long, size_t);
  R (*EventCreate)(void**, unsigned);
  R (*EventRecord)(void*, void*);
  R (*EventSynchronize)(void*);
  R (*EventElapsed)(float*, void*, void*);
  R (*CtxSynchronize)();
  R (*DeviceGetName)(char*, int, int);
  void Load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { std::fprintf(stderr, "no libcuda\n"); std::exit(1); }
    auto get = [&](const char* n) {
      void* f = dlsym(lib, n);
      if (!f) { std::fprintf(stderr, "libcuda has no %s\n", n); std::exit(1); }
      return f;
    };
    Init = (R(*)(unsigned))get("cuInit");
    DeviceGet = (R(*)(int*, int))get("cuDeviceGet");
    PrimaryCtxRetain = (R(*)(void**, int))get("cuDevicePrimaryCtxRetain");
    CtxSetCurrent = (R(*)(void*))get("cuCtxSetCurrent");
    MemAlloc = (R(*)(unsigned long long*, size_t))get("cuMemAlloc_v2");
    MemFree = (R(*)(unsigned long long))get("cuMemFree_v2");
    HtoD = (R(*)(unsigned long long, const void*, size_t))get("cuMemcpyHtoD_v2");
    DtoH = (R(*)(void*, unsigned long long, size_t))get("cuMemcpyDtoH_v2");
    EventCreate = (R(*)(void**, unsigned))get("cuEventCreate");
    EventRecord = (R(*)(void*, void*))get("cuEventRecord");
    EventSynchronize = (R(*)(void*))get("cuEventSynchronize");
    EventElapsed = (R(*)(float*, void*, void*))get("cuEventElapsedTime");
    CtxSynchronize = (R(*)())get("cuCtxSynchronize");
    DeviceGetName = (R(*)(char*, int, int))get("cuDeviceGetName");
  }
};
inline Cuda cuda;

inline uint16_t ToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  int e = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffff;
  if (e <= 0) return static_cast<uint16_t>(sign);
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  uint32_t h = sign | (e << 10) | (m >> 13);
  if ((m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}
inline float FromHalf(uint16_t h) {
  const uint32_t sign = (h & 0x8000) << 16;
  const int e = (h >> 10) & 0x1f;
  const uint32_t m = h & 0x3ff;
  uint32_t x;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// A device buffer of n values with host copies (as float, already rounded to the dtype).
struct Buf {
  unsigned long long ptr = 0;
  std::vector<float> host;
  bool half = false;
  Buf(size_t n, bool h, std::mt19937& rng, float scale) : host(n), half(h) {
    std::normal_distribution<float> d(0.f, scale);
    for (float& v : host) v = d(rng);
    if (half) {
      std::vector<uint16_t> hv(n);
      for (size_t i = 0; i < n; ++i) { hv[i] = ToHalf(host[i]); host[i] = FromHalf(hv[i]); }
      cuda.MemAlloc(&ptr, n * 2);
      cuda.HtoD(ptr, hv.data(), n * 2);
    } else {
      cuda.MemAlloc(&ptr, n * 4);
      cuda.HtoD(ptr, host.data(), n * 4);
    }
  }
  Buf(size_t n, bool h) : host(n), half(h) { cuda.MemAlloc(&ptr, n * (h ? 2 : 4)); }
  ~Buf() { cuda.MemFree(ptr); }
  void* p() const { return reinterpret_cast<void*>(ptr); }
  std::vector<float> Read() const {
    std::vector<float> out(host.size());
    if (half) {
      std::vector<uint16_t> hv(host.size());
      cuda.DtoH(hv.data(), ptr, hv.size() * 2);
      for (size_t i = 0; i < hv.size(); ++i) out[i] = FromHalf(hv[i]);
    } else {
      cuda.DtoH(out.data(), ptr, out.size() * 4);
    }
    return out;
  }
};

template <typename F>
double TimeUs(F run, int iters = 50) {
  for (int i = 0; i < 5; ++i) run();
  void *a, *b;
  cuda.EventCreate(&a, 0);
  cuda.EventCreate(&b, 0);
  cuda.EventRecord(a, nullptr);
  for (int i = 0; i < iters; ++i) run();
  cuda.EventRecord(b, nullptr);
  cuda.EventSynchronize(b);
  float ms = 0;
  cuda.EventElapsed(&ms, a, b);
  return 1000.0 * ms / iters;
}

// The current device's primary context made current; its name in `name`.
inline void Start(char* name, int size) {
  cuda.Load();
  cuda.Init(0);
  int dev = 0;
  void* ctx = nullptr;
  cuda.DeviceGet(&dev, 0);
  cuda.PrimaryCtxRetain(&ctx, dev);
  cuda.CtxSetCurrent(ctx);
  cuda.DeviceGetName(name, size, dev);
}

}  // namespace probe
