#pragma once
// Strict JSON object reading for config files: typed fields, then every key not asked for is an error
// that lists the valid keys.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"

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
      KILN_CHECK(v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(v.get<int64_t>())),
                 "{}: '{}' must be an integer, got {}", where_, key, v.dump());
      out = static_cast<T>(v.get<int64_t>());
    } else if constexpr (std::is_floating_point_v<T>) {
      KILN_CHECK(v.is_number(), "{}: '{}' must be a number, got {}", where_, key, v.dump());
      out = v.get<T>();
    } else {
      KILN_CHECK(v.is_string(), "{}: '{}' must be a string, got {}", where_, key, v.dump());
      out = v.get<std::string>();
    }
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
      if (std::find(keys_.begin(), keys_.end(), it.key()) == keys_.end()) unknown.push_back("'" + it.key() + "'");
    KILN_CHECK(unknown.empty(), "{}: unknown key{} {} (valid keys: {})", where_, unknown.size() > 1 ? "s" : "",
               fmt::join(unknown, ", "), fmt::join(keys_, ", "));
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
  fail("{}: '{}' is \"{}\"; valid values: {}", where, key, v, fmt::join(valid, ", "));
}

}  // namespace detail

}  // namespace kiln
#pragma GCC visibility pop
