// rand_uniform / rand_normal on the GPU: element i (row-major over the output's shape) is the same
// function of (seed, offset, i) as on the CPU backends (core/rng.hpp): one Philox-4x32-10 block per
// four consecutive elements, computed by one thread, the draws formed in double with the same
// expressions (the affine step an explicit FMA, philox_affine) and stored through the same roundings
// (round_uniform, kiln's bf16/f16 conversion).
//
// Uniform and normal fills agree bit for bit with the CPU: Box-Muller uses kiln's own log/sin/cos
// (core/rng.hpp rng_math), not CUDA's libm.
#include "kiln/backends/cuda/indexing.cuh"
#include "kiln/core/rng.hpp"

namespace kiln {

namespace {

using namespace cuda;

template <class T> __device__ __forceinline__ T store_draw(double x) {
  if constexpr (std::is_same_v<T, bool>)
    return x != 0.0;
  else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return T(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

// Thread g fills elements 4g .. 4g + 3 from Philox block offset + g.
template <bool Uniform, class T> __global__ void __launch_bounds__(256)
    rand_kernel(T* __restrict__ o, const Walk<1> w, uint64_t seed, uint64_t offset, double a, double b) {
  const int64_t groups = ceil_div(w.numel, 4);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += step) {
    const Philox4x32 r = philox4x32_10(offset + static_cast<uint64_t>(g), seed);
    double z[4];
    if constexpr (Uniform) {
#pragma unroll
      for (int l = 0; l < 4; ++l) z[l] = philox_affine(a, b - a, philox_uniform(r.v[l]));
    } else {
#pragma unroll
      for (int l = 0; l < 4; ++l) z[l] = philox_affine(a, b, philox_normal_from(r, static_cast<unsigned>(l)));
    }
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const int64_t i = 4 * g + l;
      if (i >= w.numel) break;
      int64_t off[1];
      w.offsets(i, off);
      if constexpr (Uniform && is_float_v<T>)
        o[off[0]] = round_uniform<T>(z[l], b);
      else
        o[off[0]] = store_draw<T>(z[l]);
    }
  }
}

template <bool Uniform> void rand_fill(const char* op, Cuda::M out, uint64_t seed, uint64_t offset, double a, double b) {
  if (out.layout.numel() == 0) return;
  check_device(out.storage, op);
  const Walk<1> w = make_walk<1>(op, out.layout.shape, {&out.layout.strides}, {out.layout.offset});
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    constexpr int kThreads = 256;
    rand_kernel<Uniform, T>
        <<<grid_for(ceil_div(w.numel, 4), kThreads), kThreads, 0, stream()>>>(out.storage.as<T>(), w, seed, offset, a, b);
    after_launch(op, __FILE__, __LINE__);
  });
}

}  // namespace

void Cuda::rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi) {
  rand_fill<true>("rand_uniform", out, seed, offset, lo, hi);
}

void Cuda::rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std) {
  rand_fill<false>("rand_normal", out, seed, offset, mean, std);
}

}  // namespace kiln
