// The runtime side of a kernel scheme (docs/architecture.md, "Schemes"). The FusedKernel op
// (fused_kernel.cc) reads what every node has (name, inputs and their boxes/windows, output
// dtypes, images), binds the inputs of each Compute, and hands the rest to the scheme named by
// the node's shape_rule: its own attributes, its output shapes, its entries in a loaded module
// and its launch. Each scheme's implementation lives in its folder, onnxstitch/schemes/<name>/
// launch.cc, and is registered in MakeScheme (schemes.cc).
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "output_views.h"
#include "stitch_abi.h"

namespace onnxstitch {

// An error on its way to becoming an OrtStatus (whose message the node's name prefixes).
struct Error {
  OrtErrorCode code = ORT_OK;
  std::string message;
  explicit operator bool() const { return code != ORT_OK; }
};

inline Error Fail(OrtErrorCode code, std::string message) { return Error{code, std::move(message)}; }

inline std::string ShapeText(const int64_t* dims, size_t rank) {
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// A node's attributes, read alike when its kernel is created (OrtKernelInfo) and in shape
// inference (OrtShapeInferContext), so a scheme parses them in one place. An absent attribute
// leaves *present false; one of another type is an error.
class Attrs {
 public:
  virtual ~Attrs() = default;
  virtual Error Int(const char* name, int64_t* out, bool* present) = 0;
  virtual Error Ints(const char* name, std::vector<int64_t>* out, bool* present) = 0;
  virtual Error String(const char* name, std::string* out, bool* present) = 0;
  // The ordinal of the device whose execution provider the node is created for, -1 where that
  // is not known (shape inference, a CPU node): what a scheme may prepare before the first run.
  virtual int DeviceOrdinal() { return -1; }

  // A required INT: absent is an error naming the shape rule that needs it.
  Error RequiredInt(const char* name, const char* rule, int64_t* out) {
    bool present = false;
    if (Error e = Int(name, out, &present)) return e;
    if (!present) {
      return Fail(ORT_INVALID_ARGUMENT, std::string("missing INT attribute '") + name + "' (shape_rule \"" + rule + "\")");
    }
    return {};
  }
};

// The inputs of one Compute: device pointers in args.in, each input's shape as the kernel sees
// it (a box's extent, a window's total), its own contiguous strides, and its kind (0 FULL, 1
// BROADCAST).
struct Bound {
  StitchArgs args;
  int64_t shapes[STITCH_MAX_IN][STITCH_MAX_RANK];
  long long own[STITCH_MAX_IN][STITCH_MAX_RANK];
  size_t ranks[STITCH_MAX_IN];
  const int64_t* kinds = nullptr;
  size_t n_in = 0, n_out = 0;
};

constexpr int kEntries = 2;  // a kernel's variants: 32-bit and 64-bit indexing (or vector, scalar)

// A node's module as loaded in one CUDA context, with the entries its scheme found there.
struct Loaded {
  cu::Context ctx = nullptr;
  cu::Module module = nullptr;
  cu::Function entry[kEntries] = {nullptr, nullptr};
  cu::Function cluster[kEntries] = {nullptr, nullptr};  // rows split over clusters, where the GPU has them
  cu::Function more[kEntries] = {nullptr, nullptr};     // a scheme's other entries (attention: decode, merge)
  int sm_count = 1;
  int cc = 0;                     // the device's compute capability, major*10+minor
  int blocks_per_sm = 0;          // resident blocks of entry[0] per multiprocessor (0: unknown)
  int cluster_blocks_per_sm = 0;  // the same for the cluster entries
};

// What a scheme's launch may ask of the node that runs it.
class Call {
 public:
  virtual ~Call() = default;
  // Output o of the given shape, allocated by ORT.
  virtual Error Output(size_t o, const int64_t* dims, size_t rank, void** data) = 0;
  // ORT's compute stream with its CUDA context current (until the Compute returns) and the
  // node's module loaded there: called only when there is work to launch.
  virtual Error Enter(cu::Stream* stream, const Loaded** l) = 0;
  virtual const cu::Driver& Driver() const = 0;
  virtual const std::string& KernelName() const = 0;
  // `bytes` of device memory for this Compute's launches, from ORT's allocator of the outputs'
  // device (call after Output): freed when the Compute returns, its launches queued on the
  // stream, as ORT's own kernels free their scratch buffers (stream-ordered reuse; CUDA graphs
  // replay the captured addresses).
  virtual Error Scratch(size_t bytes, void** data) = 0;

  // Launches fn (a 1-D grid) and words a failure with the entry's name.
  Error Launch(cu::Function fn, const char* suffix, long long grid, long long block, long long shared,
               cu::Stream stream, void** params) {
    const cu::Result r = Driver().LaunchKernel(fn, static_cast<unsigned int>(grid), 1, 1, static_cast<unsigned int>(block),
                                               1, 1, static_cast<unsigned int>(shared), stream, params, nullptr);
    if (r == cu::kSuccess) return {};
    return Fail(ORT_FAIL, "cuLaunchKernel(" + KernelName() + suffix + ", grid " + std::to_string(grid) +
                              ") failed: " + Driver().ErrorText(r));
  }
};

// One scheme's runtime side.
class Scheme {
 public:
  virtual ~Scheme() = default;
  // Its own attributes (after the common ones: the input and output counts are known).
  virtual Error Init(Attrs& a, size_t n_in, size_t n_out) = 0;
  // The outputs' shapes from the inputs' (named dims kept) for shape inference; false where
  // they are not certain.
  virtual bool OutputShapes(const std::vector<std::vector<ShapeDim>>& ins, size_t n_out,
                            std::vector<std::vector<ShapeDim>>* outs) const = 0;
  // Its entry functions in a module just loaded (its context current).
  virtual Error Entries(const cu::Driver& d, const std::string& kernel_name, Loaded* l) const = 0;
  // One Compute: the outputs allocated through `call`, the kernel launched on its stream.
  virtual Error Run(Call& call, Bound* b) const = 0;
  // Whether the node carries a kernel image to load; a library call (the gemm scheme) has none,
  // and Enter then makes the stream's context current without loading a module.
  virtual bool UsesImage() const { return true; }
  // A scheme that loads no cubin may still carry code of its own in the node's images (the
  // gemm scheme's generated GEMMs: shared objects, one per arch): given them once, after Init.
  virtual Error TakeImages(const std::vector<int64_t>& /*archs*/, const std::vector<std::string>& /*images*/) {
    return {};
  }
};

// The scheme of a shape rule ("broadcast", "rows", "attention", "gemm"); nullptr for another.
std::unique_ptr<Scheme> MakeScheme(const std::string& shape_rule);

// Finds `entry` in l's module; words a failure.
inline Error GetEntry(const cu::Driver& d, const Loaded* l, const std::string& entry, cu::Function* fn) {
  const cu::Result r = d.ModuleGetFunction(fn, l->module, entry.c_str());
  if (r == cu::kSuccess) return {};
  *fn = nullptr;
  return Fail(ORT_FAIL, "the kernel image has no entry '" + entry + "': " + d.ErrorText(r));
}

// `reps` runs of candidate i captured into one CUDA graph on `side`, a stream of our own, in
// relaxed mode, instantiated; nullptr where the driver cannot or a run fails under capture.
// (Not on ORT's stream: while a blocking stream captures, another thread's work on the legacy
// stream fails — an ORT session loading beside this one did, in the gate.)
inline cu::GraphExec CapturedRuns(const cu::Driver& d, cu::Stream side, int reps, size_t i,
                                  const std::function<bool(size_t, cu::Stream)>& run) {
  if (d.StreamBeginCapture(side, cu::kStreamCaptureModeRelaxed) != cu::kSuccess) return nullptr;
  bool ok = true;
  for (int k = 0; k < reps && ok; ++k) ok = run(i, side);
  cu::Graph graph = nullptr;
  const bool ended = d.StreamEndCapture(side, &graph) == cu::kSuccess && graph != nullptr;  // (always ends it)
  cu::GraphExec exec = nullptr;
  if (ok && ended && d.GraphInstantiate(&exec, graph, 0) != cu::kSuccess) exec = nullptr;
  if (graph != nullptr) d.GraphDestroy(graph);
  return ok && ended ? exec : nullptr;
}

// The index of the fastest of `count` candidates on `stream`: each runs once to warm up (one whose
// run(i, s) — candidate i enqueued on s — fails is skipped), then `rounds` times `reps` runs timed
// with events, the rounds interleaved across candidates so a clock change does not favour one.
// With `graphed`, each candidate's `reps` runs are captured into a CUDA graph (`CapturedRuns`) and
// the graph's launch on `stream` is timed: what the GPU spends, not what enqueueing costs the
// host (a generated GEMM builds its TMA descriptors per call; in CUDA graphs, as models are run
// for speed, that host work is gone), as long as every candidate captures (else they are timed
// as runs). 0 (the library heuristic's first) where
// timing is not possible: the stream is being captured into a CUDA graph (ORT's warm-up runs
// come before the capture, so plans are made then), the driver lacks events, or nothing ran;
// *timed says whether the choice was timed. The conv and gemm schemes choose among their
// library's top candidates with it.
inline size_t Fastest(const cu::Driver& d, cu::Stream stream, size_t count, int rounds, int reps,
                      const std::function<bool(size_t, cu::Stream)>& run, bool* timed = nullptr,
                      bool graphed = false) {
  if (timed != nullptr) *timed = false;
  if (count < 2 || d.StreamIsCapturing == nullptr || d.EventCreate == nullptr || d.EventRecord == nullptr ||
      d.EventSynchronize == nullptr || d.EventElapsedTime == nullptr || d.EventDestroy == nullptr) {
    return 0;
  }
  int capturing = 1;
  if (d.StreamIsCapturing(stream, &capturing) != cu::kSuccess || capturing != 0) return 0;
  cu::Event start = nullptr, stop = nullptr;
  if (d.EventCreate(&start, 0) != cu::kSuccess) return 0;
  if (d.EventCreate(&stop, 0) != cu::kSuccess) {
    d.EventDestroy(start);
    return 0;
  }
  std::vector<float> total(count, 0.0f);
  std::vector<bool> ok(count, false);
  for (size_t i = 0; i < count; ++i) ok[i] = run(i, stream);
  std::vector<cu::GraphExec> graphs(count, nullptr);
  cu::Stream side = nullptr;
  bool all_graphed = graphed && d.StreamCreate != nullptr && d.StreamDestroy != nullptr &&
                     d.StreamBeginCapture != nullptr && d.StreamEndCapture != nullptr && d.GraphInstantiate != nullptr &&
                     d.GraphLaunch != nullptr && d.GraphExecDestroy != nullptr && d.GraphDestroy != nullptr &&
                     d.StreamCreate(&side, cu::kStreamNonBlocking) == cu::kSuccess;
  for (size_t i = 0; i < count && all_graphed; ++i) {
    if (ok[i]) all_graphed = (graphs[i] = CapturedRuns(d, side, reps, i, run)) != nullptr;
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < count; ++i) {
      if (!ok[i]) continue;
      d.EventRecord(start, stream);
      if (all_graphed) {
        ok[i] = d.GraphLaunch(graphs[i], stream) == cu::kSuccess;
      } else {
        for (int k = 0; k < reps; ++k) ok[i] = run(i, stream) && ok[i];
      }
      d.EventRecord(stop, stream);
      float ms = 0;
      if (d.EventSynchronize(stop) != cu::kSuccess || d.EventElapsedTime(&ms, start, stop) != cu::kSuccess) {
        ok[i] = false;
        continue;
      }
      total[i] += ms;
    }
  }
  for (cu::GraphExec g : graphs) {
    if (g != nullptr) d.GraphExecDestroy(g);
  }
  if (side != nullptr) d.StreamDestroy(side);
  d.EventDestroy(start);
  d.EventDestroy(stop);
  size_t best = 0;
  bool any = false;
  for (size_t i = 0; i < count; ++i) {
    if (ok[i] && (!any || total[i] < total[best])) {
      best = i;
      any = true;
    }
  }
  if (timed != nullptr) *timed = any;
  return best;
}

}  // namespace onnxstitch
