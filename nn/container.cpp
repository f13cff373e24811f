#include "kiln/nn/container.hpp"

#include <cxxabi.h>

#include <cstdlib>

namespace kiln::nn {

namespace detail {

std::string demangle(const char* name) {
  int status = 0;
  char* s = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && s ? s : name;
  std::free(s);
  return out;
}

size_t container_index(const char* what, int64_t i, size_t size) {
  const auto n = static_cast<int64_t>(size);
  KILN_CHECK(i >= -n && i < n, "{}: index {} is out of range for {} modules", what, i, n);
  return static_cast<size_t>(i < 0 ? i + n : i);
}

}  // namespace detail

template <Backend B> Var<B> Sequential<B>::forward(const Var<B>& x) const {
  Var<B> y = x;
  for (const auto& call : calls_) y = call(y);
  return y;
}

#define KILN_INST(B)            \
  template class Sequential<B>; \
  template class ModuleList<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
