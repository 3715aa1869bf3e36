// The registry of the runtime's schemes: a node's shape rule names its scheme. Adding a scheme is
// its launch.cc in onnxstitch/schemes/<name>/ and one line here (docs/architecture.md).
#include <memory>
#include <string>

#include "scheme.h"

namespace onnxstitch {

std::unique_ptr<Scheme> MakeElementwise();  // schemes/elementwise/launch.cc
std::unique_ptr<Scheme> MakeRows();         // schemes/rows/launch.cc
std::unique_ptr<Scheme> MakeAttention();    // schemes/attention/launch.cc
std::unique_ptr<Scheme> MakeGemm();         // schemes/gemm/launch.cc
std::unique_ptr<Scheme> MakeConv();         // schemes/conv/launch.cc

std::unique_ptr<Scheme> MakeScheme(const std::string& shape_rule) {
  if (shape_rule == "broadcast") return MakeElementwise();
  if (shape_rule == "rows") return MakeRows();
  if (shape_rule == "attention") return MakeAttention();
  if (shape_rule == "gemm") return MakeGemm();
  if (shape_rule == "conv") return MakeConv();
  return nullptr;
}

}  // namespace onnxstitch
