// Run a stitched model from C++: ONNX Runtime's C++ API, the onnxstitch custom-op library
// registered with RegisterCustomOpsLibrary, random inputs, each output's shape printed.
//
//   run_stitched MODEL [--library PATH] [--cpu] [--dim NAME=VALUE]... [--default-dim N] [--runs N]
//                [--profile PREFIX]
//
// --library registers libonnxstitch_ops.so (a bundle's copy: `onnxstitch optimize --bundle`).
// The CUDA execution provider comes first unless --cpu; the fused nodes need it together with
// the library. With --cpu and no --library, ONNX Runtime runs the fused nodes' fallback
// functions instead. Symbolic input dims take --dim's value for their name, else
// --default-dim (2). --profile writes ONNX Runtime's profile (which provider ran each node) to
// PREFIX_<time>.json. Build: examples/cpp/build.sh.
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string model;
  std::string library;
  bool cpu = false;
  std::map<std::string, int64_t> dims;
  int64_t default_dim = 2;
  int runs = 1;
  std::string profile;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "run_stitched: %s\nusage: run_stitched MODEL [--library PATH] [--cpu] [--dim NAME=VALUE]... "
               "[--default-dim N] [--runs N] [--profile PREFIX]\n",
               why.c_str());
  std::exit(2);
}

int64_t ParseInt(const std::string& text, const std::string& what) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0) Usage(what + ": expected a non-negative integer, got '" + text + "'");
  return v;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--library") {
      o.library = value();
    } else if (a == "--cpu") {
      o.cpu = true;
    } else if (a == "--dim") {
      std::string d = value();
      size_t eq = d.find('=');
      if (eq == std::string::npos || eq == 0) Usage("--dim " + d + ": expected NAME=VALUE");
      o.dims[d.substr(0, eq)] = ParseInt(d.substr(eq + 1), "--dim " + d);
    } else if (a == "--default-dim") {
      o.default_dim = ParseInt(value(), a);
    } else if (a == "--profile") {
      o.profile = value();
    } else if (a == "--runs") {
      o.runs = static_cast<int>(std::max<int64_t>(1, ParseInt(value(), a)));
    } else if (!a.empty() && a[0] == '-') {
      Usage("unknown option " + a);
    } else if (o.model.empty()) {
      o.model = a;
    } else {
      Usage("one model only (got " + o.model + " and " + a + ")");
    }
  }
  if (o.model.empty()) Usage("no model given");
  return o;
}

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "other";
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Fills n elements of T: floats uniform in [-1, 1), integers in [0, 4) (valid as small
// indices, ids and masks), booleans 0/1.
template <typename T, typename Make>
void Fill(Ort::Value& v, size_t n, std::mt19937& rng, Make make) {
  T* p = v.GetTensorMutableData<T>();
  for (size_t i = 0; i < n; ++i) p[i] = make(rng);
}

Ort::Value RandomTensor(OrtAllocator* alloc, const std::vector<int64_t>& shape, ONNXTensorElementDataType type,
                        std::mt19937& rng) {
  Ort::Value v = Ort::Value::CreateTensor(alloc, shape.data(), shape.size(), type);
  size_t n = v.GetTensorTypeAndShapeInfo().GetElementCount();
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 3);
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: Fill<float>(v, n, rng, [&](auto& r) { return real(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: Fill<double>(v, n, rng, [&](auto& r) { return real(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      Fill<Ort::Float16_t>(v, n, rng, [&](auto& r) { return Ort::Float16_t(real(r)); });
      break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      Fill<Ort::BFloat16_t>(v, n, rng, [&](auto& r) { return Ort::BFloat16_t(real(r)); });
      break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: Fill<int64_t>(v, n, rng, [&](auto& r) { return small(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: Fill<int32_t>(v, n, rng, [&](auto& r) { return small(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: Fill<int16_t>(v, n, rng, [&](auto& r) { return small(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: Fill<int8_t>(v, n, rng, [&](auto& r) { return small(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: Fill<uint8_t>(v, n, rng, [&](auto& r) { return small(r); }); break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: Fill<bool>(v, n, rng, [&](auto& r) { return small(r) & 1; }); break;
    default: throw std::runtime_error(std::string("no random values for element type ") + std::to_string(type));
  }
  return v;
}

// An input's shape with its symbolic dims sized: --dim by name, else the default.
std::vector<int64_t> Sized(const Ort::ConstTensorTypeAndShapeInfo& info, const Options& o) {
  std::vector<int64_t> shape = info.GetShape();
  std::vector<const char*> names(shape.size(), nullptr);
  info.GetSymbolicDimensions(names.data(), names.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] >= 0) continue;
    auto it = names[d] ? o.dims.find(names[d]) : o.dims.end();
    shape[d] = it != o.dims.end() ? it->second : o.default_dim;
  }
  return shape;
}

int Run(const Options& o) {
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "run_stitched");
  Ort::SessionOptions so;
  if (!o.library.empty()) so.RegisterCustomOpsLibrary(o.library.c_str());
  if (!o.profile.empty()) so.EnableProfiling(o.profile.c_str());
  if (!o.cpu) {
    OrtCUDAProviderOptions cuda{};
    cuda.device_id = 0;
    so.AppendExecutionProvider_CUDA(cuda);
  }
  Ort::Session session(env, o.model.c_str(), so);
  Ort::AllocatorWithDefaultOptions alloc;
  std::mt19937 rng(0);

  std::vector<Ort::AllocatedStringPtr> keep;  // owns the names below
  std::vector<const char*> in_names, out_names;
  std::vector<Ort::Value> inputs;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    keep.push_back(session.GetInputNameAllocated(i, alloc));
    in_names.push_back(keep.back().get());
    Ort::TypeInfo type = session.GetInputTypeInfo(i);
    auto info = type.GetTensorTypeAndShapeInfo();
    std::vector<int64_t> shape = Sized(info, o);
    inputs.push_back(RandomTensor(alloc, shape, info.GetElementType(), rng));
    std::printf("input  %s %s %s\n", in_names.back(), TypeName(info.GetElementType()), ShapeText(shape).c_str());
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    keep.push_back(session.GetOutputNameAllocated(i, alloc));
    out_names.push_back(keep.back().get());
  }

  std::vector<double> ms;
  std::vector<Ort::Value> outputs;
  for (int r = 0; r < o.runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    outputs = session.Run(Ort::RunOptions{nullptr}, in_names.data(), inputs.data(), inputs.size(), out_names.data(),
                          out_names.size());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto info = outputs[i].GetTensorTypeAndShapeInfo();
    std::printf("output %s %s %s\n", out_names[i], TypeName(info.GetElementType()),
                ShapeText(info.GetShape()).c_str());
  }
  if (!o.profile.empty()) std::printf("profile %s\n", session.EndProfilingAllocated(alloc).get());
  std::sort(ms.begin(), ms.end());
  std::printf("ran %d time(s) on %s, median %.3f ms (the first run included)\n", o.runs,
              o.cpu ? "CPUExecutionProvider" : "CUDAExecutionProvider", ms[ms.size() / 2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  try {
    return Run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_stitched: error: %s\n", e.what());
    return 1;
  }
}
