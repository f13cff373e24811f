#pragma once
// Helpers of the tests/text cases.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

namespace kt {

// The bytes of a file the test needs (a failed REQUIRE when it cannot be opened).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kt
