#pragma once
// Runs a shell command and captures what it prints (the tests of the command line).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kt {

struct CommandResult {
  int status;       // the exit status
  std::string out;  // stdout (and stderr where the command redirects it: "2>&1")
};

inline CommandResult run_command(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WEXITSTATUS(st), out};
}

#ifdef KILN_CLI
// The `kiln` binary: KILN_TEST_CLI where set (the emulated-device build runs its own, tests/cuda_emu),
// else the one built beside the tests.
inline std::string kiln_cli() {
  const char* e = std::getenv("KILN_TEST_CLI");
  return e && *e ? e : KILN_CLI;
}
#endif

}  // namespace kt
