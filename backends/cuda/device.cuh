#pragma once
// Device-side helpers shared by the Cuda backend's kernels (include from .cu files only).
//  * Element access: kiln's storage types (float, double, bf16, f16, int32, int64, bool) loaded into
//    and stored from their compute type (compute_t: float for the half types), with the hardware
//    conversion instructions for bf16/f16 (round to nearest even, like kiln's host conversion).
//  * Warp and block reductions (shuffles; a block is at most 1024 threads = 32 warps).
//  * Launch arithmetic.
//  * Asynchronous copies from global to shared memory (cp.async, sm_80 and later).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/runtime.hpp"
#include "kiln/core/dtype.hpp"

namespace kiln::cuda {

inline constexpr int kWarp = 32;

KILN_HD inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for n work items at `threads` per block, capped for grid-stride loops.
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535LL * 32) {
  const int64_t g = ceil_div(n, threads);
  return static_cast<unsigned>(g < 1 ? 1 : (g > cap ? cap : g));
}

// ---------------------------------------------------------------------------------- element access
// Conversions by value (memcpy between kiln's half types and CUDA's, never a pointer cast: a value
// written through an __nv_bfloat16* into a kiln::bf16 object would break the aliasing rules, and the
// compiler may then drop the write, as g++ did for a local Pack in the host emulator).
template <class T> __device__ __forceinline__ compute_t<T> to_compute(T x) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat16 h;
    memcpy(&h, &x, sizeof h);
    return __bfloat162float(h);
  } else if constexpr (std::is_same_v<T, f16>) {
    __half h;
    memcpy(&h, &x, sizeof h);
    return __half2float(h);
  } else {
    return x;
  }
}
template <class T> __device__ __forceinline__ T from_compute(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    T r;
    if constexpr (std::is_same_v<T, bf16>) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      memcpy(&r, &h, sizeof r);
    } else {
      const __half h = __float2half_rn(v);
      memcpy(&r, &h, sizeof r);
    }
    return r;
  } else {
    return v;
  }
}
template <class T> __device__ __forceinline__ compute_t<T> ld(const T* p) { return to_compute(*p); }
template <class T> __device__ __forceinline__ void st(T* p, compute_t<T> v) { *p = from_compute<T>(v); }

// ---------------------------------------------------------------------------------- reductions
template <class T> __device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T> __device__ __forceinline__ T warp_max(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const T u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u > v || u != u) ? u : v;  // NaN propagates
  }
  return v;
}
// Sum / max over the whole block (blockDim.x a multiple of 32); every thread gets the result.
// `scratch` holds 32 values of T in shared memory; it may be reused after the call returns.
template <class T> __device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : T(0);
  return warp_sum(v);
}
template <class T> __device__ T block_max(T v, T* scratch, T lowest) {
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : lowest;
  return warp_max(v);
}

// ---------------------------------------------------------------------------------- asynchronous copies
// cp.async: 16 bytes from global to shared memory (both addresses 16-byte aligned) that do not pass
// through registers. The copies a thread issues between two commits form a group; cp_async_wait<N>
// returns when at most N of the thread's committed groups are still in flight. Other threads see the
// bytes only after the issuing thread's wait and a barrier; the destination must not be read or written
// by anyone between the issue and then. The host emulator (tests/cuda_emu) lands a copy either when
// issued or only at the wait that covers it (emu.hpp), so in its tests a kernel that breaks either
// rule reads the wrong bytes.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(KILN_CUDA_EMU)
  ::emu::cp_async16(smem, gmem);
#elif defined(__CUDA_ARCH__)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  (void)smem, (void)gmem;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(KILN_CUDA_EMU)
  ::emu::cp_async_commit();
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(KILN_CUDA_EMU)
  ::emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace kiln::cuda
