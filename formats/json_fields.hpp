#pragma once
// Strict JSON object reading for config files: typed fields, then every key not asked for is an error
// that lists the valid keys.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/formats/printable.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {
namespace detail {

using json = nlohmann::json;

// Reads the keys of one JSON object into typed fields, then rejects whatever key was not asked for.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    KILN_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where_, j.dump());
  }

  template <class T> void get(const char* key, T& out) {
    keys_.emplace_back(key);
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return;
    const json& v = *it;
    if constexpr (std::is_same_v<T, bool>) {
      KILN_CHECK(v.is_boolean(), "{}: '{}' must be true or false, got {}", where_, key, v.dump());
      out = v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      out = integer<T>(v, key);
    } else if constexpr (std::is_floating_point_v<T>) {
      KILN_CHECK(v.is_number(), "{}: '{}' must be a number, got {}", where_, key, v.dump());
      out = v.get<T>();
    } else {
      KILN_CHECK(v.is_string(), "{}: '{}' must be a string, got {}", where_, key, v.dump());
      out = v.get<std::string>();
    }
  }
  // An integer JSON value (or a float with an integral value, 2.0) that fits T; anything else names
  // the key and the value. Never converts out of range (that would be undefined behaviour).
  template <class T> T integer(const json& v, const char* key) const {
    using L = std::numeric_limits<T>;
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      KILN_CHECK(u <= static_cast<uint64_t>(L::max()), "{}: '{}' = {} is too large (at most {})", where_, key, u, L::max());
      return static_cast<T>(u);
    }
    if (v.is_number_integer()) {
      const auto i = v.get<int64_t>();
      const bool fits = L::is_signed ? i >= static_cast<int64_t>(L::min()) && i <= static_cast<int64_t>(L::max())
                                     : i >= 0 && static_cast<uint64_t>(i) <= static_cast<uint64_t>(L::max());
      KILN_CHECK(fits, "{}: '{}' = {} is out of range [{}, {}]", where_, key, i, L::min(), L::max());
      return static_cast<T>(i);
    }
    KILN_CHECK(v.is_number_float(), "{}: '{}' must be an integer, got {}", where_, key, v.dump());
    const double d = v.get<double>();
    // T holds exactly the integers in [-2^digits, 2^digits) (signed) or [0, 2^digits): powers of two,
    // exact in a double, so the comparison is exact too.
    const double top = std::ldexp(1.0, L::digits), bottom = L::is_signed ? -top : 0.0;
    KILN_CHECK(std::isfinite(d) && d == std::floor(d) && d >= bottom && d < top, "{}: '{}' must be an integer in [{}, {}], got {}", where_,
               key, L::min(), L::max(), v.dump());
    return static_cast<T>(d);
  }

  const json* object(const char* key) {
    keys_.emplace_back(key);
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void finish() const {
    std::vector<std::string> unknown;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(keys_.begin(), keys_.end(), it.key()) == keys_.end()) unknown.push_back("'" + printable(it.key()) + "'");
    KILN_CHECK(unknown.empty(), "{}: unknown key{} {} (valid keys: {})", where_, unknown.size() > 1 ? "s" : "", fmt::join(unknown, ", "),
               fmt::join(keys_, ", "));
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::vector<std::string> keys_;
};

inline void one_of(const std::string& where, const char* key, const std::string& v, std::initializer_list<const char*> valid) {
  for (const char* s : valid)
    if (v == s) return;
  fail("{}: '{}' is \"{}\"; valid values: {}", where, key, printable(v), fmt::join(valid, ", "));
}

}  // namespace detail

}  // namespace kiln
#pragma GCC visibility pop
