#pragma once
// The Reference backend: naive loops over logical indices, float64 arithmetic and accumulation for
// float dtypes. It is the oracle every other backend is tested against: clarity over speed.
#include <memory>
#include <string_view>

#include "kiln/backends/host_storage.hpp"
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

  static void fill(M out, Scalar value);
  static void copy(M out, V in);
  template <class Op> static void unary(M out, V in);
  template <class Op> static void binary(M out, V a, V b);
  static void where(M out, V cond, V a, V b);
  template <class Op> static void reduce(M out, V in, int axis);
  static void matmul(M out, V a, V b);
  static void gather(M out, V src, int axis, V index);
  static void scatter_add(M out, int axis, V index, V src);
  static void rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi);
  static void rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std);

  // convolution and pooling, naive loops in double (backends/reference/conv.cpp; contract in core/fused_conv.hpp)
  static bool conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p);
  static bool conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p);
  static bool conv2d_backward_weight(M dw, M* db, V dy, V x, const Conv2dParams& p);
  static bool max_pool2d_forward(M y, M idx, V x, const Pool2dParams& p);
  static bool max_pool2d_backward(M dx, V dy, V idx, const Pool2dParams& p);
  static bool avg_pool2d_forward(M y, V x, const Pool2dParams& p);
  static bool avg_pool2d_backward(M dx, V dy, const Pool2dParams& p);
};
static_assert(Backend<Reference>);

extern template class Tensor<Reference>;

}  // namespace kiln
#pragma GCC visibility pop
