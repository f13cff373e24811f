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
#include "kiln/backends/primitives.hpp"
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

  // backends/primitives.hpp: elementwise.cu (fill, copy, unary, binary, where), reduce.cu, matmul.cpp
  // (cuBLAS), index.cu (gather, scatter_add), random.cu (the Philox stream of core/rng.hpp:
  // bit-identical to the CPU backends)
  // attention.cu takes bf16/f16 q, k, v as they are (core/fused.hpp): its tensor-core kernels save the
  // products that half inputs make redundant
  static constexpr bool attention_half = true;
  // loss.cu reads bf16/f16 logits as they are and writes their gradient in their dtype (core/fused_loss.hpp)
  static constexpr bool cross_entropy_half = true;
  KILN_BACKEND_PRIMITIVES
  KILN_FUSED_SOFTMAX                                // softmax.cu
      KILN_FUSED_RMS_NORM                           // norm.cu
          KILN_FUSED_CROSS_ENTROPY                  // loss.cu
              KILN_FUSED_DEPTH_ATTENTION            // depth.cu
                  KILN_FUSED_ADAM                   // optim.cu
                      KILN_FUSED_ATTENTION          // attention.cu
                          KILN_FUSED_DIFF2_COMBINE  // diff2.cu
};
static_assert(Backend<Cuda>);

}  // namespace kiln
#pragma GCC visibility pop
