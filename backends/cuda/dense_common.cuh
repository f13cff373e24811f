#pragma once
// Private helpers of the Cuda backend's dense kernels (softmax.cu, norm.cu, attention.cu): precise
// math overloads for float and double, a NaN-propagating max, and host-side dtype dispatch.
// Include from .cu files only.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "kiln/backends/cuda/device.cuh"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"

namespace kiln::cuda::dense {

// Full-precision libdevice functions (never the __expf-style intrinsics): the kernels must agree
// with the Cpu backend to a few ulp.
__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }

template <class C> __device__ __forceinline__ C neg_inf() { return -std::numeric_limits<C>::infinity(); }

// max(a, b) that propagates a NaN in b (a is a running maximum, so a NaN there stays).
template <class C> __device__ __forceinline__ C max_nan(C a, C b) { return (b > a || b != b) ? b : a; }

// out[c] = Σ_{p < P} partial[p, c], in order: the second pass of the deterministic column sums
// (RMSNorm's dw, the depth attention's dq), one thread per column.
template <class T> __global__ void sum_partials_in_order(T* __restrict__ out, const T* __restrict__ partial, int64_t P, int64_t D) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < D; c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T s = 0;
    for (int64_t p = 0; p < P; ++p) s += partial[p * D + c];
    out[c] = s;
  }
}

// Calls f(type_tag<T>{}) for the float storage types; throws naming the op and shape otherwise.
template <class F> void visit_float(DType d, std::string_view op, const Shape& shape, F&& f) {
  switch (d) {
    case DType::f32:
      return f(type_tag<float>{});
    case DType::f64:
      return f(type_tag<double>{});
    case DType::bf16:
      return f(type_tag<bf16>{});
    case DType::f16:
      return f(type_tag<f16>{});
    default:
      fail("{}: needs a float dtype, got {} (shape {})", op, d, shape_str(shape));
  }
}

// Calls f(type_tag<T>{}) for f32 and f64 only (the fused kernels' contract).
template <class F> void visit_f32_f64(DType d, std::string_view op, const Shape& shape, F&& f) {
  switch (d) {
    case DType::f32:
      return f(type_tag<float>{});
    case DType::f64:
      return f(type_tag<double>{});
    default:
      fail("{}: the Cuda kernel takes f32 or f64, got {} (shape {})", op, d, shape_str(shape));
  }
}

}  // namespace kiln::cuda::dense
