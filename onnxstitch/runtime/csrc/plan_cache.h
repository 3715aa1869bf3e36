// Library plans kept on disk between processes. A cuDNN plan for a convolution with its epilogue
// is chosen at its first use by compiling and timing several engines (about a second each); a
// stitched ResNet-50 spent 34 s in its first inference doing so, and optimize paid it again in
// every stage that ran the model. The choice (and, for runtime-compiled engines, the compiled
// plan itself) is written here under a digest of everything it depends on (the library's own
// sources among them: ONNXSTITCH_SOURCES), so a later session or process only loads it.
//
// Folder: $ONNXSTITCH_CACHE/plans, else $HOME/.cache/onnxstitch/plans (the optimizer's kernel
// cache beside it); ONNXSTITCH_PLAN_CACHE=0 turns it off. Every failure here only means the plan
// is chosen again: the cache is never a reason for a node to fail.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "sha256.h"

namespace onnxstitch {
namespace plan_cache {

// The folder, or "" when there is none.
inline std::string Folder() {
  const char* off = std::getenv("ONNXSTITCH_PLAN_CACHE");
  if (off != nullptr && std::string(off) == "0") return "";
  const char* root = std::getenv("ONNXSTITCH_CACHE");
  if (root != nullptr && root[0] != '\0') return std::string(root) + "/plans";
  const char* home = std::getenv("HOME");
  if (home == nullptr || home[0] == '\0') return "";
  return std::string(home) + "/.cache/onnxstitch/plans";
}

// The file of a key in the folder ("" when there is no folder).
inline std::string PathOf(const std::string& key) {
  const std::string folder = Folder();
  if (folder.empty()) return "";
  Sha256 h;
  h.Update(key.data(), key.size());
  return folder + "/" + h.HexDigest() + ".plan";
}

// The whole file, or false.
inline bool Read(const std::string& path, std::string* out) {
  if (path.empty()) return false;
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream text;
  text << f.rdbuf();
  *out = text.str();
  return static_cast<bool>(f) || f.eof();
}

// Writes the file whole or not at all (a temporary file renamed over it: processes that check
// models side by side may write the same plan at once).
inline void Write(const std::string& path, const std::string& data) {
  if (path.empty()) return;
  // Each folder of the path in turn (one that exists is fine; any other failure shows at open).
  for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1)) {
    mkdir(path.substr(0, at).c_str(), 0755);
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace plan_cache
}  // namespace onnxstitch
