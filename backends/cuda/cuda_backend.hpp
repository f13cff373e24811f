#pragma once
// The Cuda backend's type (plain C++: included by kernels' .cu files and by generic code alike).
// Users include backends/cuda/cuda.hpp.
//
// Every primitive runs asynchronously on the current device's stream (runtime.hpp); read() waits for
// it. Kernels live in backends/cuda/*.cu, GEMMs go to cuBLAS (matmul.cpp).
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kiln/backends/cuda/storage.hpp"
#include "kiln/core/backend.hpp"
#include "kiln/core/fused_optim_params.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct Cuda {
  using Storage = CudaStorage;
  using V = View<Storage>;
  using M = MutView<Storage>;
  static constexpr std::string_view name = "cuda";

  // memory (runtime.cpp): allocate from the current device's caching allocator; write/read copy
  // between host and device, ordered with the device's stream (read waits for queued kernels).
  static std::shared_ptr<Storage> allocate(size_t bytes);
  static void write(Storage& s, size_t off, const void* src, size_t n);
  static void read(const Storage& s, size_t off, void* dst, size_t n);

  // elementwise.cu
  static void fill(M out, Scalar value);
  static void copy(M out, V in);
  template <class Op> static void unary(M out, V in);
  template <class Op> static void binary(M out, V a, V b);
  static void where(M out, V cond, V a, V b);
  // reduce.cu
  template <class Op> static void reduce(M out, V in, int axis);
  // matmul.cpp (cuBLAS)
  static void matmul(M out, V a, V b);
  // index.cu
  static void gather(M out, V src, int axis, V index);
  static void scatter_add(M out, int axis, V index, V src);
  // random.cu (the Philox stream of core/rng.hpp: bit-identical to the CPU backends)
  static void rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi);
  static void rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std);

  // fused ops (contracts in core/fused.hpp, core/fused_norm.hpp)
  static void softmax_lastdim(M out, V x, bool log);                        // softmax.cu
  static void softmax_lastdim_backward(M dx, V y, V dy, bool log);          // softmax.cu
  static void rms_norm_forward(M y, M rstd, V x, const V* w, double eps);   // norm.cu
  static void rms_norm_backward(M dx, M* dw, V x, const V* w, V rstd, V dy);
  static void cross_entropy_forward(M loss, M lse, V logits, V targets, int64_t ignore_index, double smoothing);  // loss.cu
  static void cross_entropy_backward(M dlogits, V logits, V lse, V targets, V g, int64_t ignore_index, double smoothing);
  // depth.cu (contract in core/fused_depth.hpp)
  static void depth_attention_forward(M h, M alpha, M rstd, const std::vector<V>& v, V q, double eps);
  static void depth_attention_backward(const std::vector<M>& dv, M dq, const std::vector<V>& v, V q, V alpha, V rstd, V dh);
  static void depth_attention_phase1(M m, M l, M acc, const std::vector<V>& v, V Q, double eps);
  static void depth_attention_merge(M h, V m, V l, V acc, const V* p, V q, double eps);
  static void adam_step(const std::vector<M>& w, const std::vector<M>& m, const std::vector<M>& v, const std::vector<V>& g,
                        const fused::AdamHyper& h);  // optim.cu
  static void attention_forward(M o, M lse, V q, V k, V v, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0);  // attention.cu
  static void attention_backward(M dq, M dk, M dv, V q, V k, V v, V o, V lse, V dout, const V* key_padding, const V* mask, double scale,
                                 bool causal, int64_t pos0);
};
static_assert(Backend<Cuda>);

}  // namespace kiln
#pragma GCC visibility pop
