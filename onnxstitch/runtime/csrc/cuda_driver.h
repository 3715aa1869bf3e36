// Minimal CUDA driver API surface for the onnxstitch runtime, resolved at run time.
//
// Why not cuda.h: building the library must not need a CUDA toolkit, and linking libcuda would
// stop it from loading on machines without a GPU. So the few types and constants used here are
// declared by hand (values from the CUDA 13.0 cuda.h; they are part of the driver ABI and never
// change), libcuda.so.1 is dlopen()ed on first use, and every entry point is fetched through
// cuGetProcAddress with an explicit CUDA version paired with the prototype of that version.
// That pairing matters: cuGetProcAddress("cuStreamGetCtx", 12050) hands back cuStreamGetCtx_v2,
// which takes three arguments; calling it through the two-argument prototype writes through a
// garbage pointer (this crashed ORT intermittently before).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <string>

namespace onnxstitch {
namespace cu {

using Result = int;  // CUresult
using Device = int;  // CUdevice
using DevicePtr = unsigned long long;  // CUdeviceptr
typedef struct CUctx_st* Context;
typedef struct CUmod_st* Module;
typedef struct CUfunc_st* Function;
typedef struct CUstream_st* Stream;
typedef struct CUgreenCtx_st* GreenCtx;
typedef struct CUevent_st* Event;
typedef struct CUgraph_st* Graph;
typedef struct CUgraphExec_st* GraphExec;

constexpr Result kSuccess = 0;

// CUdevice_attribute values.
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

// CUjit_option values used for PTX JIT error reporting.
constexpr int kFuncMaxDynamicSharedBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kJitErrorLogBuffer = 5;
constexpr int kJitErrorLogBufferSizeBytes = 6;
constexpr int kStreamCaptureModeRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr unsigned int kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING

// Driver entry points, each with the prototype of the version it was fetched at.
struct Driver {
  Result (*Init)(unsigned int) = nullptr;                                   // cuInit (dlsym)
  Result (*DriverGetVersion)(int*) = nullptr;                               // @2020
  Result (*GetErrorName)(Result, const char**) = nullptr;                   // @6000
  Result (*GetErrorString)(Result, const char**) = nullptr;                 // @6000
  Result (*StreamGetCtx3)(Stream, Context*, GreenCtx*) = nullptr;           // @12050 (_v2)
  Result (*StreamGetCtx2)(Stream, Context*) = nullptr;                      // @9020, old drivers
  Result (*CtxGetCurrent)(Context*) = nullptr;                              // @4000
  Result (*CtxPushCurrent)(Context) = nullptr;                              // @4000 (_v2)
  Result (*CtxPopCurrent)(Context*) = nullptr;                              // @4000 (_v2)
  Result (*CtxGetDevice)(Device*) = nullptr;                                // @2000 (1 arg)
  Result (*CtxGetId)(Context, unsigned long long*) = nullptr;               // @12000, optional
  Result (*DeviceGetAttribute)(int*, int, Device) = nullptr;                // @2000
  Result (*ModuleLoadDataEx)(Module*, const void*, unsigned int, int*, void**) = nullptr;  // @2010
  Result (*ModuleUnload)(Module) = nullptr;                                 // @2000
  Result (*ModuleGetFunction)(Function*, Module, const char*) = nullptr;    // @2000
  Result (*LaunchKernel)(Function, unsigned int, unsigned int, unsigned int, unsigned int,
                         unsigned int, unsigned int, unsigned int, Stream, void**,
                         void**) = nullptr;                                 // @4000
  Result (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, Function, int, size_t) = nullptr;  // @6050, optional
  Result (*FuncSetAttribute)(Function, int, int) = nullptr;                 // @9000
  Result (*MemAlloc)(DevicePtr*, size_t) = nullptr;                         // @3020 (_v2): the gemm scheme's workspace
  Result (*MemFree)(DevicePtr) = nullptr;                                   // @3020 (_v2)
  // Optional: the conv scheme times cuDNN's candidate plans once per shape, outside capture.
  Result (*StreamIsCapturing)(Stream, int*) = nullptr;                      // @10000
  Result (*EventCreate)(Event*, unsigned int) = nullptr;                    // @2000
  Result (*EventRecord)(Event, Stream) = nullptr;                           // @2000
  Result (*EventSynchronize)(Event) = nullptr;                              // @2000
  Result (*EventElapsedTime)(float*, Event, Event) = nullptr;               // @2000
  Result (*EventDestroy)(Event) = nullptr;                                  // @4000 (_v2)
  // Optional: the conv scheme's plan loader thread works beside ORT's CUDA-graph captures.
  Result (*ThreadExchangeStreamCaptureMode)(int*) = nullptr;                // @10010
  Result (*DeviceGet)(Device*, int) = nullptr;                              // @2000, optional
  Result (*DevicePrimaryCtxRetain)(Context*, Device) = nullptr;             // @7000, optional
  // Optional: candidates timed as CUDA graphs of their runs (Fastest's `graphed`).
  Result (*StreamCreate)(Stream*, unsigned int) = nullptr;                  // @2000
  Result (*StreamDestroy)(Stream) = nullptr;                                // @4000 (_v2)
  Result (*StreamBeginCapture)(Stream, int) = nullptr;                      // @10010 (_v2)
  Result (*StreamEndCapture)(Stream, Graph*) = nullptr;                     // @10000
  Result (*GraphInstantiate)(GraphExec*, Graph, unsigned long long) = nullptr;  // @11040 (WithFlags)
  Result (*GraphLaunch)(GraphExec, Stream) = nullptr;                       // @10000
  Result (*GraphExecDestroy)(GraphExec) = nullptr;                          // @10000
  Result (*GraphDestroy)(Graph) = nullptr;                                  // @10000

  // Loads libcuda.so.1 and resolves every entry point. Returns "" on success, else why not.
  std::string Load() {
    // RTLD_NOLOAD first: ORT's CUDA EP has normally loaded the driver already.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      return std::string("cannot load the CUDA driver libcuda.so.1 (") + (why ? why : "unknown") +
             "); a GPU with an NVIDIA driver is required";
    }
    // The library is never dlclose()d: unloading the driver under a live process is unsafe.
    // cuInit is an unversioned export; initialise before asking for any other entry point.
    Init = reinterpret_cast<Result (*)(unsigned int)>(dlsym(lib, "cuInit"));
    if (Init == nullptr) return "libcuda.so.1 has no cuInit";
    const Result init = Init(0);
    using GetProcV2 = Result (*)(const char*, void**, int, std::uint64_t, int*);  // 12000+
    using GetProcV1 = Result (*)(const char*, void**, int, std::uint64_t);        // 11030+
    auto v2 = reinterpret_cast<GetProcV2>(dlsym(lib, "cuGetProcAddress_v2"));
    auto v1 = v2 ? nullptr : reinterpret_cast<GetProcV1>(dlsym(lib, "cuGetProcAddress"));
    if (v2 == nullptr && v1 == nullptr) {
      return "the CUDA driver is too old: it has no cuGetProcAddress (CUDA 11.3+ required)";
    }
    auto get = [&](const char* name, int version, void** out) -> bool {
      *out = nullptr;
      Result r;
      if (v2 != nullptr) {
        int found = 0;
        r = v2(name, out, version, 0 /* CU_GET_PROC_ADDRESS_DEFAULT */, &found);
        if (found != 0) *out = nullptr;  // CU_GET_PROC_ADDRESS_SUCCESS == 0
      } else {
        r = v1(name, out, version, 0);
      }
      if (r != kSuccess) *out = nullptr;
      return *out != nullptr;
    };
    struct Want {
      const char* name;
      int version;
      void** slot;
      bool required;
    };
    const Want wants[] = {
        {"cuDriverGetVersion", 2020, reinterpret_cast<void**>(&DriverGetVersion), true},
        {"cuGetErrorName", 6000, reinterpret_cast<void**>(&GetErrorName), true},
        {"cuGetErrorString", 6000, reinterpret_cast<void**>(&GetErrorString), true},
        {"cuCtxGetCurrent", 4000, reinterpret_cast<void**>(&CtxGetCurrent), true},
        {"cuCtxPushCurrent", 4000, reinterpret_cast<void**>(&CtxPushCurrent), true},
        {"cuCtxPopCurrent", 4000, reinterpret_cast<void**>(&CtxPopCurrent), true},
        {"cuCtxGetDevice", 2000, reinterpret_cast<void**>(&CtxGetDevice), true},
        {"cuCtxGetId", 12000, reinterpret_cast<void**>(&CtxGetId), false},
        {"cuDeviceGetAttribute", 2000, reinterpret_cast<void**>(&DeviceGetAttribute), true},
        {"cuModuleLoadDataEx", 2010, reinterpret_cast<void**>(&ModuleLoadDataEx), true},
        {"cuModuleUnload", 2000, reinterpret_cast<void**>(&ModuleUnload), true},
        {"cuModuleGetFunction", 2000, reinterpret_cast<void**>(&ModuleGetFunction), true},
        {"cuLaunchKernel", 4000, reinterpret_cast<void**>(&LaunchKernel), true},
        {"cuFuncSetAttribute", 9000, reinterpret_cast<void**>(&FuncSetAttribute), true},
        {"cuMemAlloc", 3020, reinterpret_cast<void**>(&MemAlloc), true},
        {"cuMemFree", 3020, reinterpret_cast<void**>(&MemFree), true},
        {"cuStreamIsCapturing", 10000, reinterpret_cast<void**>(&StreamIsCapturing), false},
        {"cuEventCreate", 2000, reinterpret_cast<void**>(&EventCreate), false},
        {"cuEventRecord", 2000, reinterpret_cast<void**>(&EventRecord), false},
        {"cuEventSynchronize", 2000, reinterpret_cast<void**>(&EventSynchronize), false},
        {"cuEventElapsedTime", 2000, reinterpret_cast<void**>(&EventElapsedTime), false},
        {"cuEventDestroy", 4000, reinterpret_cast<void**>(&EventDestroy), false},
        {"cuThreadExchangeStreamCaptureMode", 10010, reinterpret_cast<void**>(&ThreadExchangeStreamCaptureMode), false},
        {"cuDeviceGet", 2000, reinterpret_cast<void**>(&DeviceGet), false},
        {"cuDevicePrimaryCtxRetain", 7000, reinterpret_cast<void**>(&DevicePrimaryCtxRetain), false},
        {"cuStreamCreate", 2000, reinterpret_cast<void**>(&StreamCreate), false},
        {"cuStreamDestroy", 4000, reinterpret_cast<void**>(&StreamDestroy), false},
        {"cuStreamBeginCapture", 10010, reinterpret_cast<void**>(&StreamBeginCapture), false},
        {"cuStreamEndCapture", 10000, reinterpret_cast<void**>(&StreamEndCapture), false},
        {"cuGraphInstantiateWithFlags", 11040, reinterpret_cast<void**>(&GraphInstantiate), false},
        {"cuGraphLaunch", 10000, reinterpret_cast<void**>(&GraphLaunch), false},
        {"cuGraphExecDestroy", 10000, reinterpret_cast<void**>(&GraphExecDestroy), false},
        {"cuGraphDestroy", 10000, reinterpret_cast<void**>(&GraphDestroy), false},
        {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,
         reinterpret_cast<void**>(&OccupancyMaxActiveBlocksPerMultiprocessor), false},
    };
    for (const Want& w : wants) {
      if (!get(w.name, w.version, w.slot) && w.required) {
        return std::string("the CUDA driver does not provide ") + w.name;
      }
    }
    if (init != kSuccess) return "cuInit failed: " + ErrorText(init);
    int driver_version = 0;
    if (DriverGetVersion(&driver_version) != kSuccess) driver_version = 0;
    // Only a driver that knows CUDA 12.5 can hand out the three-argument cuStreamGetCtx_v2; an
    // older one asked for version 12050 would return its two-argument symbol instead.
    if (driver_version >= 12050) {
      get("cuStreamGetCtx", 12050, reinterpret_cast<void**>(&StreamGetCtx3));
    }
    if (StreamGetCtx3 == nullptr &&
        !get("cuStreamGetCtx", 9020, reinterpret_cast<void**>(&StreamGetCtx2))) {
      return "the CUDA driver does not provide cuStreamGetCtx";
    }
    return "";
  }

  // The context that owns `stream` (ORT's compute stream).
  Result StreamContext(Stream stream, Context* ctx) const {
    *ctx = nullptr;
    if (StreamGetCtx3 != nullptr) {
      GreenCtx green = nullptr;
      return StreamGetCtx3(stream, ctx, &green);
    }
    return StreamGetCtx2(stream, ctx);
  }

  // A key for `ctx` in per-context tables: its unique id where the driver has one (a destroyed
  // context's address can be reused by a new one), else its address.
  unsigned long long ContextKey(Context ctx) const {
    unsigned long long id = 0;
    if (CtxGetId != nullptr && CtxGetId(ctx, &id) == kSuccess) return id;
    return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ctx));
  }

  std::string ErrorText(Result r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (GetErrorName == nullptr || GetErrorName(r, &name) != kSuccess) name = nullptr;
    if (GetErrorString == nullptr || GetErrorString(r, &text) != kSuccess) text = nullptr;
    std::string out = name ? name : ("CUresult " + std::to_string(r));
    if (text) out += std::string(" (") + text + ")";
    return out;
  }
};

}  // namespace cu
}  // namespace onnxstitch
