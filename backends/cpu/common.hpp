#pragma once
// Shared machinery of the Cpu backend's kernels (private to backends/cpu/):
//  * parallel_for: one OpenMP pool, no threads for small work, exceptions carried out of the region;
//  * Plan / for_range: an N-operand strided walk over a common shape. Dimensions are coalesced where
//    every operand allows it, the innermost dimension becomes a run handed to a kernel with its
//    per-operand strides, and the outer indices advance incrementally (one div/mod per chunk, not per
//    element);
//  * kernel variants per instruction set, chosen at run time (below, and isa.cpp);
//  * convert<T>(x): the element conversion Reference uses (through double), so copy agrees bit for bit.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"

#ifndef KILN_CPU_X86  // (-DKILN_CPU_X86=0 compiles the other architectures' form, for checking it)
#if defined(__x86_64__) || defined(__i386__)
#define KILN_CPU_X86 1
#else
#define KILN_CPU_X86 0
#endif
#endif
#if KILN_CPU_X86
// Every intrinsic is declared whatever the flags; using one needs its target. GCC 12's AVX-512 ones
// warn about their own _mm512_undefined_* (a self-initialised variable) when inlined: silenced here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace kiln::cpu {

// ---------------------------------------------------------------------------------- instruction sets
// The kernels' instruction set is chosen at run time, once (isa.cpp): KILN_CPU_ISA=baseline|avx2|avx512
// when set, else the best this CPU has. The library is compiled for the build's target (KILN_NATIVE=OFF:
// baseline x86-64), and the kernels that gain from wider vectors are compiled again for them:
//  * A kernel is a function template over an ISA tag (Baseline, Avx2, Avx512) that covers a row or a
//    chunk of rows: plain loops, no OpenMP region, no allocation, no error path. It calls the ISA's
//    primitives by tag (dot2(I{}, ...), vm::exp_n(I{}, ...)); their Avx2 overloads are defined between
//    KILN_CPU_AVX2_BEGIN and KILN_CPU_AVX2_END, which compile them for AVX2 + FMA whatever the flags,
//    their Avx512 overloads (16 lanes, the same formulas) between KILN_CPU_AVX512_BEGIN and _END.
//    Avx512 derives from Avx2: a primitive without an Avx512 overload is the Avx2 one.
//  * pick<K<Baseline>, K<Avx2>>() returns the variant isa() chose: K<Baseline> itself, or K<Avx2>
//    through Avx2Entry, a trampoline compiled for AVX2 + FMA that inlines the whole kernel (flatten),
//    so the loops GCC vectorises in it use 256-bit vectors and FMA too. pick<..., K<Avx512>>() adds the
//    AVX-512 variant (Avx512Entry, compiled for AVX-512 F/BW/DQ/VL); with two variants, an AVX-512 CPU
//    runs K<Avx2>. A caller picks once per call, before its parallel region, and calls the pointer per
//    row or chunk (never per element).
// No file is compiled with -mavx2 or -mavx512f: inline functions and template instances emitted there
// (std::vector, kiln's headers) are COMDAT, and the linker may keep an AVX copy for baseline callers.
// Templates defined outside a region stay baseline even when a region instantiates them; only functions
// whose names carry Avx2/avx2/Avx512/avx512 hold AVX instructions, which tests/cpu_isa checks on
// libkiln's disassembly. In a native build (-march=native) every variant is compiled for this machine;
// Baseline then means the portable kernels (scalar math, std::exp), still what KILN_CPU_ISA=baseline
// selects.
enum class Isa : uint8_t { baseline, avx2, avx512 };
struct Baseline {};
#if KILN_CPU_X86
struct Avx2 {};
struct Avx512 : Avx2 {};
#else
using Avx2 = Baseline;  // other architectures: the AVX instances are the baseline ones, never picked
using Avx512 = Baseline;
#endif

// The instruction set in use: KILN_CPU_ISA, else the best available (read once). Throws kiln::Error
// when KILN_CPU_ISA names an unknown set or one this CPU lacks, so call it outside parallel regions.
Isa isa();
std::string_view isa_name(Isa i);
// The best instruction set this CPU has, whatever KILN_CPU_ISA says (for what other libraries choose).
Isa best_isa();

#if KILN_CPU_X86
#if defined(__clang__)
#define KILN_CPU_AVX2_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define KILN_CPU_AVX2_END _Pragma("clang attribute pop")
#define KILN_CPU_AVX512_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,avx512f,avx512bw,avx512dq,avx512vl\"))), apply_to = function)")
#define KILN_CPU_AVX512_END _Pragma("clang attribute pop")
#else
#define KILN_CPU_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
#define KILN_CPU_AVX2_END _Pragma("GCC pop_options")
#define KILN_CPU_AVX512_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,avx512f,avx512bw,avx512dq,avx512vl\")")
#define KILN_CPU_AVX512_END _Pragma("GCC pop_options")
#endif
#endif

// The entry point of a kernel instance F compiled for AVX2 + FMA (AVX-512): F's whole body inlined.
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
template <auto F> struct Avx2Entry;
template <class R, class... A, R (*F)(A...)> struct Avx2Entry<F> {
  [[gnu::flatten]] static R run(A... a) { return F(std::forward<A>(a)...); }
};
KILN_CPU_AVX2_END
KILN_CPU_AVX512_BEGIN
template <auto F> struct Avx512Entry;
template <class R, class... A, R (*F)(A...)> struct Avx512Entry<F> {
  [[gnu::flatten]] static R run(A... a) { return F(std::forward<A>(a)...); }
};
KILN_CPU_AVX512_END
#endif

// The variant of a kernel for isa(): FB = K<Baseline, ...>, FA = K<Avx2, ...>.
template <auto FB, auto FA> auto pick() -> decltype(FB) {
  static_assert(std::is_same_v<decltype(FB), decltype(FA)>, "pick: the variants of a kernel have one signature");
#if KILN_CPU_X86
  if (isa() != Isa::baseline) return &Avx2Entry<FA>::run;
#endif
  return FB;
}
// ... and FZ = K<Avx512, ...>: for the kernels whose primitives have Avx512 overloads (vecmath).
template <auto FB, auto FA, auto FZ> auto pick() -> decltype(FB) {
  static_assert(std::is_same_v<decltype(FB), decltype(FZ)>, "pick: the variants of a kernel have one signature");
#if KILN_CPU_X86
  if (isa() == Isa::avx512) return &Avx512Entry<FZ>::run;
#endif
  return pick<FB, FA>();
}
// pick<FB, FA>() where Vary, else FB alone (no AVX2 instance is compiled): for instances that gain
// little from AVX2 and would cost compile time.
template <bool Vary, auto FB, auto FA> auto pick_if() -> decltype(FB) {
  if constexpr (Vary)
    return pick<FB, FA>();
  else
    return FB;
}
template <bool Vary, auto FB, auto FA, auto FZ> auto pick_if() -> decltype(FB) {
  if constexpr (Vary)
    return pick<FB, FA, FZ>();
  else
    return FB;
}
// The dtypes whose generic elementwise kernels (binary, reduce) get an AVX2 variant: f32 and f64.
// Integers, bool and the half types stay baseline there (rare in training; each variant of the many
// op x dtype instances costs compile time). unary varies every float type (its vector math).
template <class T> inline constexpr bool avx2_dtype_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

// ---------------------------------------------------------------------------------- threads
// Work units (elements, rows, ...) per thread below which a loop stays on the calling thread.
inline constexpr int64_t kGrainCheap = 32768;  // memory-bound elementwise (add, copy, fill)
inline constexpr int64_t kGrainMath = 4096;    // transcendental elementwise (exp, tanh, ...)

// Calls f(begin, end) over [0, n) split into one contiguous chunk per thread (chunk starts rounded to
// `align` units). Runs inline when n < 2 * grain, when one thread is configured, or when already inside
// a parallel region (nested calls, e.g. BLAS from a batch loop). An exception thrown by f is rethrown on
// the calling thread after the region.
template <class F> void parallel_for(int64_t n, int64_t grain, F&& f, int64_t align = 16) {
  if (n <= 0) return;
  const int nt_max = num_threads();
  const int64_t want = grain > 0 ? n / grain : n;
  const int nt = static_cast<int>(std::min<int64_t>(nt_max, want));
  if (nt <= 1 || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  std::exception_ptr err = nullptr;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t chunk = (n + T - 1) / T;
    chunk = (chunk + align - 1) / align * align;
    const int64_t b = std::min<int64_t>(n, chunk * t), e = std::min<int64_t>(n, b + chunk);
    if (b < e) {
      try {
        f(b, e);
      } catch (...) {
#pragma omp critical(kiln_cpu_err)
        if (!err) err = std::current_exception();
      }
    }
  }
  if (err) std::rethrow_exception(err);
}

// ---------------------------------------------------------------------------------- strided walks
inline constexpr int kMaxDims = 24;

// A coalesced iteration space shared by N operands; dim 0 is the innermost.
template <int N> struct Plan {
  int nd = 0;
  int64_t numel = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};
  int64_t base[N] = {};

  // Inner-run strides of every operand.
  int64_t inner(int k) const { return stride[k][0]; }
  bool inner_all_unit() const {
    for (int k = 0; k < N; ++k)
      if (stride[k][0] != 1) return false;
    return true;
  }
};

// shape: the common iteration shape; strides[k] / offsets[k]: operand k's strides (over `shape`).
template <int N>
Plan<N> make_plan(const Shape& shape, const std::array<const Strides*, N>& strides, const std::array<int64_t, N>& offsets) {
  Plan<N> p;
  p.numel = kiln::numel(shape);
  for (int k = 0; k < N; ++k) p.base[k] = offsets[static_cast<size_t>(k)];
  KILN_CHECK(shape.size() < static_cast<size_t>(kMaxDims), "cpu: rank {} exceeds the supported {}", shape.size(), kMaxDims - 1);
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t s = shape[d];
    if (s == 1) continue;
    bool merge = p.nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = (*strides[static_cast<size_t>(k)])[d] == p.stride[k][p.nd - 1] * p.size[p.nd - 1];
    if (merge) {
      p.size[p.nd - 1] *= s;
    } else {
      for (int k = 0; k < N; ++k) p.stride[k][p.nd] = (*strides[static_cast<size_t>(k)])[d];
      p.size[p.nd++] = s;
    }
  }
  if (p.nd == 0) {  // a single element (or none)
    p.size[0] = p.numel;
    for (int k = 0; k < N; ++k) p.stride[k][0] = 1;
    p.nd = 1;
  }
  return p;
}

// Calls kernel(off, n) for the runs covering linear elements [begin, end): off[k] is operand k's
// element offset of the run's first element; the run advances by plan.inner(k) per element.
template <int N, class K> void for_range(const Plan<N>& p, int64_t begin, int64_t end, K&& kernel) {
  if (begin >= end) return;
  int64_t idx[kMaxDims];
  std::array<int64_t, N> off;
  for (int k = 0; k < N; ++k) off[static_cast<size_t>(k)] = p.base[k];
  int64_t rem = begin;
  for (int d = 0; d < p.nd; ++d) {
    idx[d] = rem % p.size[d];
    rem /= p.size[d];
    for (int k = 0; k < N; ++k) off[static_cast<size_t>(k)] += idx[d] * p.stride[k][d];
  }
  int64_t pos = begin;
  while (pos < end) {
    const int64_t n = std::min(p.size[0] - idx[0], end - pos);
    kernel(off, n);
    pos += n;
    if (pos >= end) break;
    idx[0] += n;
    for (int k = 0; k < N; ++k) off[static_cast<size_t>(k)] += n * p.stride[k][0];
    for (int d = 0; d + 1 < p.nd && idx[d] == p.size[d]; ++d) {
      for (int k = 0; k < N; ++k) off[static_cast<size_t>(k)] += p.stride[k][d + 1] - idx[d] * p.stride[k][d];
      idx[d] = 0;
      ++idx[d + 1];
    }
  }
}

// The whole plan, in parallel chunks of at least `grain` elements per thread.
template <int N, class K> void for_each_parallel(const Plan<N>& p, int64_t grain, K&& kernel) {
  parallel_for(
      p.numel, grain, [&](int64_t b, int64_t e) { for_range(p, b, e, kernel); }, 64);
}

// Calls f(type_tag<T>{}) for f32 and f64, the fused kernels' dtypes; throws naming the op otherwise.
template <class F> void float_types(DType d, const char* op, F&& f) {
  if (d == DType::f32)
    f(type_tag<float>{});
  else if (d == DType::f64)
    f(type_tag<double>{});
  else
    fail("{}: the Cpu kernel takes f32 or f64, got {}", op, d);
}

// ---------------------------------------------------------------------------------- row dot products
// Σ x·u and Σ x·w over n elements (u or w may be x), for the fused row kernels. Baseline: one scalar
// sum each. AVX2 + FMA: two 8-wide (f32) or 4-wide (f64) accumulators per sum; GCC 12 compiled the
// portable forms (`omp simd reduction`, or unrolled partial-sum arrays) into gathers and shuffles, 2-3x
// slower. The summation order is fixed per ISA, so results never depend on the thread count.
template <class T> inline void dot2(Baseline, const T* x, const T* u, const T* w, int64_t n, T& xu, T& xw) {
  T sa = 0, sb = 0;
  for (int64_t k = 0; k < n; ++k) {
    sa += x[k] * u[k];
    sb += x[k] * w[k];
  }
  xu = sa;
  xw = sb;
}
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
template <class T> inline void dot2(Avx2, const T* x, const T* u, const T* w, int64_t n, T& xu, T& xw) {
  int64_t k = 0;
  T sa = 0, sb = 0;
  if constexpr (std::is_same_v<T, float>) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    for (; k + 16 <= n; k += 16) {
      const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
      a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(u + k), a0);
      a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(u + k + 8), a1);
      b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k), b0);
      b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + k + 8), b1);
    }
    alignas(32) float la[8], lb[8];
    _mm256_store_ps(la, _mm256_add_ps(a0, a1));
    _mm256_store_ps(lb, _mm256_add_ps(b0, b1));
    for (int j = 0; j < 8; ++j) {
      sa += la[j];
      sb += lb[j];
    }
  } else if constexpr (std::is_same_v<T, double>) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
    for (; k + 8 <= n; k += 8) {
      const __m256d x0 = _mm256_loadu_pd(x + k), x1 = _mm256_loadu_pd(x + k + 4);
      a0 = _mm256_fmadd_pd(x0, _mm256_loadu_pd(u + k), a0);
      a1 = _mm256_fmadd_pd(x1, _mm256_loadu_pd(u + k + 4), a1);
      b0 = _mm256_fmadd_pd(x0, _mm256_loadu_pd(w + k), b0);
      b1 = _mm256_fmadd_pd(x1, _mm256_loadu_pd(w + k + 4), b1);
    }
    alignas(32) double la[4], lb[4];
    _mm256_store_pd(la, _mm256_add_pd(a0, a1));
    _mm256_store_pd(lb, _mm256_add_pd(b0, b1));
    for (int j = 0; j < 4; ++j) {
      sa += la[j];
      sb += lb[j];
    }
  }
  for (; k < n; ++k) {
    sa += x[k] * u[k];
    sb += x[k] * w[k];
  }
  xu = sa;
  xw = sb;
}
KILN_CPU_AVX2_END
#endif
template <class I, class T> inline T dot(I, const T* x, const T* u, int64_t n) {
  T r, unused;
  dot2(I{}, x, u, u, n, r, unused);
  return r;
}

// ---------------------------------------------------------------------------------- conversions
// Exactly Reference's convert<T>(U): through double; bool is "!= 0"; half types round from float.
template <class T, class U> inline T convert(U x) {
  if constexpr (std::is_same_v<T, U>)
    return x;  // exact (an i64 beyond 2^53 survives)
  else if constexpr (std::is_same_v<T, bool>)
    return static_cast<double>(x) != 0.0;
  else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return T(static_cast<float>(static_cast<double>(x)));
  else
    return static_cast<T>(static_cast<double>(x));
}

// An element of storage type S as Reference reads it for conversion to T (copy semantics).
template <class T, class S> inline T convert_elem(S x) {
  if constexpr (std::is_same_v<S, bool>)
    return convert<T>(x ? 1 : 0);
  else if constexpr (std::is_same_v<S, bf16> || std::is_same_v<S, f16>)
    return convert<T>(static_cast<float>(x));
  else if constexpr (std::is_same_v<S, T>)
    return x;  // same type: exact
  else
    return convert<T>(x);
}

// Load as compute type / store from compute type.
template <class T> inline compute_t<T> ld(T x) { return static_cast<compute_t<T>>(x); }
template <class T> inline T st(compute_t<T> x) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return T(x);
  else
    return x;
}

template <class T> T* ptr(HostStorage& s) { return s.as<T>(); }
template <class T> const T* ptr(const HostStorage& s) { return s.as<T>(); }

}  // namespace kiln::cpu
