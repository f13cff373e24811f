#pragma once
// Reference values from PyTorch, made at test time: runs a generator script of this repository
// (`python script out.json`, fixed seeds) once per test process and returns its JSON. Without Python and
// the modules the script needs, the test FAILS (it never skips silently).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <unistd.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/python.hpp"

namespace kiln::test {

// script: relative to the source tree (e.g. "tests/conv/make_cases.py"); modules: what it imports
// ("torch", "torch, numpy"), checked first for a clear message.
inline nlohmann::json run_case_script(const std::string& script, const std::string& modules = "torch") {
  const std::string py = python();
  const std::string stem = std::filesystem::path(script).stem().string();
  const auto path = std::filesystem::temp_directory_path() / fmt::format("kiln_{}_{}.json", stem, ::getpid());
  const std::string cmd = fmt::format("{} '{}/{}' '{}'", py, KILN_SOURCE_DIR, script, path.string());
  const int rc = std::system(cmd.c_str());
  // the modules are asked for only when the script fails (each import of PyTorch costs over a second)
  if (rc != 0 && std::system(fmt::format("{} -c 'import {}' > /dev/null 2>&1", py, modules).c_str()) != 0)
    FAIL(script << " needs " << py << " with " << modules << "; run `scripts/setup.sh --python` (python3-torch, python3-numpy), "
                << "or set KILN_PYTHON");
  if (rc != 0) FAIL(script << " failed (exit " << rc << "): " << cmd);
  std::ifstream f(path);
  nlohmann::json out = nlohmann::json::parse(f);
  std::filesystem::remove(path);
  return out;
}

}  // namespace kiln::test
