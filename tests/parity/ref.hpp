#pragma once
// Runs tests/reference/kiln_ref.py (python() + torch, common/python.hpp) for the parity tests.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/python.hpp"

namespace kiln::test {

inline std::string ref_script() { return std::string(KILN_REFERENCE_DIR) + "/kiln_ref.py"; }

// Asked once per process (importing PyTorch takes over a second; a test case's sections each ask).
inline void require_torch() {
  static const bool ok = std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", python()).c_str()) == 0;
  if (!ok)
    FAIL("PyTorch for " << python() << " is missing: run scripts/setup.sh --python (the README test command does), or set KILN_PYTHON");
}

// A fresh temporary directory per call.
inline std::filesystem::path temp_dir(const std::string& tag) {
  static int n = 0;
  const auto d = std::filesystem::temp_directory_path() / fmt::format("kiln-{}-{}-{}", tag, ::getpid(), n++);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_json(const std::filesystem::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2); }

// Runs `kiln_ref.py <args>` and fails the test (showing the command) if it does not succeed.
inline void run_ref(const std::string& args) {
  const std::string cmd = fmt::format("OMP_NUM_THREADS=2 {} {} {} >/dev/null", python(), ref_script(), args);
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
}

}  // namespace kiln::test
