#pragma once
// kiln::Error: every failure kiln reports. Messages start with the op name and carry the offending
// shapes, dtypes, values or paths: "matmul: [2, 3] @ [4, 5]: inner dims 3 != 4".
#include "kiln/config.hpp"  // generated: the C++20 check, which backends this kiln has

#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <class... A> [[noreturn]] void fail(fmt::format_string<A...> f, A&&... a) { throw Error(fmt::format(f, std::forward<A>(a)...)); }

}  // namespace kiln

// KILN_CHECK(cond, "op: fmt {}", args...) throws kiln::Error when cond is false.
#define KILN_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::kiln::fail(__VA_ARGS__); \
  } while (0)
#pragma GCC visibility pop
