#pragma once
// Whole numbers from kiln's own environment variables (KILN_NUM_THREADS, KILN_HOST_CACHE_MB,
// KILN_PROFILE_MAX_EVENTS): unset or empty is "not given"; a value that is not a whole number in
// [lo, hi] (a sign, a unit, "1e6", an overflow) is a kiln::Error naming the variable, the value and
// what it counts, never a silent default. Private to the library (cmake/KilnInstall.cmake).
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"

namespace kiln::detail {

inline std::optional<long long> env_whole(const char* name, long long lo, long long hi, std::string_view what) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  const std::string range = hi == std::numeric_limits<long long>::max() ? fmt::format(">= {}", lo) : fmt::format("from {} to {}", lo, hi);
  KILN_CHECK(end != v && *end == '\0' && errno == 0 && n >= lo && n <= hi, "{}='{}': expected a whole number of {} {}", name, v, what,
             range);
  return n;
}

}  // namespace kiln::detail
