#pragma once
// Strided N-operand walks for the Cuda backend's elementwise, reduction, indexing and random kernels
// (include from .cu files only).
//
// Walk<N> describes a common iteration shape shared by N operands, each with its own strides and base
// offset (in elements). The host builds it once per launch the way the Cpu backend builds its Plan:
// size-1 dims dropped, adjacent dims merged wherever every operand allows it, dim 0 innermost. A
// kernel turns a row-major linear index into each operand's element offset with offsets(); when every
// operand is contiguous over the whole shape that is a single addition, and when the shape has fewer
// than 2^31 elements the index arithmetic runs in 32 bits (the GPU has no 64-bit divider). The struct
// travels by value as a kernel parameter (at most 16 merged dims: under 1 KiB for 4 operands).
//
// Launches go through launch_elementwise(): 256 threads, a grid-stride loop over the elements, the
// launch checked (KILN_CUDA_LAUNCHED). Functors that support it (VectorFunctor) run with 16-byte
// vector loads and stores when every operand is contiguous and aligned.
#include <array>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "kiln/backends/cuda/device.cuh"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"

namespace kiln::cuda {

inline constexpr int kWalkDims = 16;

template <int N> struct Walk {
  int nd = 0;               // merged dims (>= 1)
  bool contiguous = false;  // every operand: offset = base + linear index
  bool small = false;       // numel < 2^31: 32-bit index arithmetic
  int64_t numel = 0;
  int64_t size[kWalkDims] = {};
  int64_t stride[kWalkDims][N] = {};
  int64_t base[N] = {};

  // Element offsets of every operand for the row-major linear index i (callable on the host too, for
  // backends/cuda/testing.hpp).
  __host__ __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = base[k];
    if (contiguous) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i;
      return;
    }
    if (small) {
      auto r = static_cast<uint32_t>(i);
#pragma unroll
      for (int d = 0; d < kWalkDims; ++d) {
        if (d == nd) break;
        const auto n = static_cast<uint32_t>(size[d]);
        const uint32_t q = r / n, idx = r - q * n;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(idx) * stride[d][k];
        r = q;
      }
      return;
    }
#pragma unroll
    for (int d = 0; d < kWalkDims; ++d) {
      if (d == nd) break;
      const int64_t q = i / size[d], idx = i - q * size[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += idx * stride[d][k];
      i = q;
    }
  }
};

// The walk over `shape` for operands with strides[k] (over `shape`) and base offsets offsets[k].
template <int N> Walk<N> make_walk(std::string_view op, const Shape& shape, const std::array<const Strides*, N>& strides,
                                   const std::array<int64_t, N>& offsets) {
  Walk<N> w;
  w.numel = kiln::numel(shape);
  for (int k = 0; k < N; ++k) w.base[k] = offsets[static_cast<size_t>(k)];
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t s = shape[d];
    if (s == 1) continue;
    bool merge = w.nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = (*strides[static_cast<size_t>(k)])[d] == w.stride[w.nd - 1][k] * w.size[w.nd - 1];
    if (merge) {
      w.size[w.nd - 1] *= s;
      continue;
    }
    KILN_CHECK(w.nd < kWalkDims, "{}: shape {} has more than {} dims that cannot be merged (the Cuda backend's limit)", op,
               shape_str(shape), kWalkDims);
    for (int k = 0; k < N; ++k) w.stride[w.nd][k] = (*strides[static_cast<size_t>(k)])[d];
    w.size[w.nd++] = s;
  }
  if (w.nd == 0) {  // one element (or none)
    w.nd = 1;
    w.size[0] = w.numel > 0 ? w.numel : 1;
    for (int k = 0; k < N; ++k) w.stride[0][k] = 1;
  }
  w.contiguous = w.nd == 1;
  for (int k = 0; k < N && w.contiguous; ++k) w.contiguous = w.stride[0][k] == 1;
  w.small = w.numel < (int64_t{1} << 31);
  return w;
}

// One thread per element, grid-stride: f(off) with off[k] the element offset of operand k.
template <int N, class F> __global__ void __launch_bounds__(256) walk_kernel(const Walk<N> w, const F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < w.numel; i += step) {
    int64_t off[N];
    w.offsets(i, off);
    f(off);
  }
}

// ---------------------------------------------------------------------------------- vector access
// V consecutive elements of T, aligned to their size (at most 16 bytes: one 128-bit load or store).
template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };
template <int V, class T> __device__ __forceinline__ Pack<T, V> ldv(const T* p) { return *reinterpret_cast<const Pack<T, V>*>(p); }
template <int V, class T> __device__ __forceinline__ void stv(T* p, const Pack<T, V>& x) { *reinterpret_cast<Pack<T, V>*>(p) = x; }
template <int V, class T> bool aligned_for(const T* p) { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0; }

// An elementwise functor that can also run vectorised: kWidest (its widest operand's element size),
// shifted(base) (a copy with every pointer advanced by the walk's base offsets, so that element i of
// every operand is at offset i), aligned<V>() (every pointer aligned for V-element packs) and vec<V>(i)
// (elements i .. i + V - 1 with one pack load per input and one pack store).
template <class F, int N>
concept VectorFunctor = requires(const F& f, const int64_t (&b)[N]) {
  { F::kWidest } -> std::convertible_to<size_t>;
  { f.shifted(b) } -> std::same_as<F>;
  { f.template aligned<2>() } -> std::same_as<bool>;
};

// Every operand contiguous: thread t handles packs t, t + stride, ... of V elements, then the n % V
// tail elements one by one.
template <int N, int V, class F> __global__ void __launch_bounds__(256) vec_kernel(const int64_t n, const F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += step) f.template vec<V>(p * V);
  for (int64_t i = packs * V + first; i < n; i += step) {
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i;
    f(off);
  }
}

// The launch of an elementwise op: vectorised (16-byte packs of the widest operand) when every operand
// is contiguous and suitably aligned, else the strided walk.
template <int N, class F> void launch_elementwise(std::string_view op, const Walk<N>& w, const F& f) {
  if (w.numel == 0) return;
  constexpr int kThreads = 256;
  if constexpr (VectorFunctor<F, N>) {
    constexpr int V = static_cast<int>(16 / F::kWidest);
    if constexpr (V > 1) {
      if (w.contiguous && w.numel >= V) {
        const F g = f.shifted(w.base);
        if (g.template aligned<V>()) {
          vec_kernel<N, V, F><<<grid_for(ceil_div(w.numel, V), kThreads), kThreads, 0, stream()>>>(w.numel, g);
          after_launch(op, __FILE__, __LINE__);
          return;
        }
      }
    }
  }
  walk_kernel<N, F><<<grid_for(w.numel, kThreads), kThreads, 0, stream()>>>(w, f);
  after_launch(op, __FILE__, __LINE__);
}

// ------------------------------------------------------------------------------------ conversions
// Exactly the Cpu/Reference element conversion (backends/cpu/common.hpp convert_elem): through
// double; bool is "!= 0"; the half types through float with kiln's own rounding (so NaN payloads and
// ties agree bit for bit).
template <class T, class S> __device__ __forceinline__ T convert_elem(S x) {
  if constexpr (std::is_same_v<T, S>) {
    return x;
  } else {
    double d;
    if constexpr (std::is_same_v<S, bool>)
      d = x ? 1.0 : 0.0;
    else if constexpr (std::is_same_v<S, bf16> || std::is_same_v<S, f16>)
      d = static_cast<double>(static_cast<float>(x));
    else
      d = static_cast<double>(x);
    if constexpr (std::is_same_v<T, bool>)
      return d != 0.0;
    else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      return T(static_cast<float>(d));
    else
      return static_cast<T>(d);
  }
}

// Same-width element types for bit copies.
template <size_t W> struct bits_of;
template <> struct bits_of<1> { using type = uint8_t; };
template <> struct bits_of<2> { using type = uint16_t; };
template <> struct bits_of<4> { using type = uint32_t; };
template <> struct bits_of<8> { using type = uint64_t; };

// Calls f(type_tag<U>{}) with the unsigned integer type as wide as an element of d.
template <class F> void visit_width(DType d, F&& f) {
  switch (dtype_size(d)) {
    case 1:
      return f(type_tag<uint8_t>{});
    case 2:
      return f(type_tag<uint16_t>{});
    case 4:
      return f(type_tag<uint32_t>{});
    default:
      return f(type_tag<uint64_t>{});
  }
}

}  // namespace kiln::cuda
