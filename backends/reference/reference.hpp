#pragma once
// The Reference backend: naive loops over logical indices, float64 arithmetic and accumulation for
// float dtypes. It is the oracle every other backend is tested against: clarity over speed.
#include <memory>
#include <string_view>

#include "kiln/backends/host_storage.hpp"
#include "kiln/backends/primitives.hpp"
#include "kiln/core/backend.hpp"
#include "kiln/core/conv_params.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct Reference {
  using Storage = HostStorage;
  using V = View<Storage>;
  using M = MutView<Storage>;
  static constexpr std::string_view name = "reference";

  static std::shared_ptr<Storage> allocate(size_t bytes) { return HostStorage::make(bytes); }
  static void write(Storage& s, size_t off, const void* src, size_t n) { s.write(off, src, n); }
  static void read(const Storage& s, size_t off, void* dst, size_t n) { s.read(off, dst, n); }

  KILN_BACKEND_PRIMITIVES  // backends/primitives.hpp
                           // convolution and pooling, naive loops in double (backends/reference/conv.cpp)
      KILN_FUSED_CONV_POOL
};
static_assert(Backend<Reference>);

extern template class Tensor<Reference>;

}  // namespace kiln
#pragma GCC visibility pop
