#pragma once
// Shared by the fuzz targets: the input as a file (the readers take paths), and the contract that a
// reader either succeeds or throws kiln::Error. Any other exception escapes LLVMFuzzerTestOneInput,
// terminates the process and is reported by libFuzzer as a crash, like a sanitizer finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln/core/error.hpp>

namespace kiln::fuzz {

// The scratch files of this process, removed when it exits (libFuzzer exits normally at the end of a
// run; a crash leaves them).
struct Scratch {
  std::set<std::string> paths;
  ~Scratch() {
    for (const std::string& p : paths) std::remove(p.c_str());
  }
};

// A per-process scratch file holding `n` bytes (in /dev/shm when it exists: no disk traffic).
inline std::string file(const uint8_t* data, size_t n, const char* tag = "in") {
  static const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  static Scratch scratch;
  const std::string path = fmt::format("{}/kiln-fuzz-{}-{}", dir, getpid(), tag);
  scratch.paths.insert(path);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (n && std::fwrite(data, 1, n, f) != n) std::abort();
  std::fclose(f);
  return path;
}

// A property that must hold for every input the reader accepted: a failure is a bug.
#define KILN_FUZZ_ASSERT(cond, ...)                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fmt::print(stderr, "fuzz property failed: {}: {}\n", #cond, fmt::format(__VA_ARGS__)); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

}  // namespace kiln::fuzz
