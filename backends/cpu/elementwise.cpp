// fill, copy (strided, with dtype conversion) and where.
#include <cstring>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

// Same-size bit copies: the element types by width.
template <size_t W> struct bits_of;
template <> struct bits_of<1> { using type = uint8_t; };
template <> struct bits_of<2> { using type = uint16_t; };
template <> struct bits_of<4> { using type = uint32_t; };
template <> struct bits_of<8> { using type = uint64_t; };

#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
// dst[c * ld_dst + r] = src[r * ld_src + c] for an 8 x 8 block of 4-byte elements.
inline void transpose8x8(Avx2, const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ld_src), r2 = _mm256_loadu_ps(src + 2 * ld_src),
         r3 = _mm256_loadu_ps(src + 3 * ld_src), r4 = _mm256_loadu_ps(src + 4 * ld_src), r5 = _mm256_loadu_ps(src + 5 * ld_src),
         r6 = _mm256_loadu_ps(src + 6 * ld_src), r7 = _mm256_loadu_ps(src + 7 * ld_src);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE), u2 = _mm256_shuffle_ps(t1, t3, 0x44),
               u3 = _mm256_shuffle_ps(t1, t3, 0xEE), u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
  r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
  r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
  r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
  r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
  r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
  r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
  r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
  _mm256_storeu_ps(dst, r0);
  _mm256_storeu_ps(dst + ld_dst, r1);
  _mm256_storeu_ps(dst + 2 * ld_dst, r2);
  _mm256_storeu_ps(dst + 3 * ld_dst, r3);
  _mm256_storeu_ps(dst + 4 * ld_dst, r4);
  _mm256_storeu_ps(dst + 5 * ld_dst, r5);
  _mm256_storeu_ps(dst + 6 * ld_dst, r6);
  _mm256_storeu_ps(dst + 7 * ld_dst, r7);
}
KILN_CPU_AVX2_END
#endif

// Kernel (common.hpp) of the tiled transpose copy: the stripe of rows [b1, e1) (output dim 1) of one
// outer index, all s0 columns, in kT x kT tiles (full 4-byte tiles as 8 x 8 register transposes with
// AVX2).
constexpr int64_t kT = 32;
template <class I, class T, class S> void transpose_stripe(T* o, const S* x, int64_t b1, int64_t e1, int64_t s0, int64_t os1, int64_t is0) {
  for (int64_t b0 = 0; b0 < s0; b0 += kT) {
    const int64_t e0 = std::min(s0, b0 + kT);
    if constexpr (!std::is_same_v<I, Baseline> && std::is_same_v<T, S> && sizeof(T) == 4) {
      if (e0 - b0 == kT && e1 - b1 == kT) {  // full tile: 8 x 8 register transposes
        for (int64_t j0 = b0; j0 < e0; j0 += 8)
          for (int64_t j1 = b1; j1 < e1; j1 += 8)
            transpose8x8(I{}, reinterpret_cast<const float*>(x + j1 + j0 * is0), is0, reinterpret_cast<float*>(o + j1 * os1 + j0), os1);
        continue;
      }
    }
    for (int64_t i1 = b1; i1 < e1; ++i1) {
      T* d = o + i1 * os1;
      const S* sp = x + i1;
      for (int64_t i0 = b0; i0 < e0; ++i0) d[i0] = convert_elem<T>(sp[i0 * is0]);
    }
  }
}

template <class T, class S> void copy_kernel(Cpu::M out, Cpu::V in) {
  const Plan<2> p = make_plan<2>(out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  T* o = out.storage.as<T>();
  const S* x = in.storage.as<S>();
  const int64_t so = p.inner(0), si = p.inner(1);
  // A transpose (the output's innermost dim is the input's second, e.g. x.t().contiguous()): copy
  // 32 x 32 tiles so both sides touch whole cache lines (a kernel with variants, above).
  if (p.nd >= 2 && so == 1 && si != 1 && p.stride[1][1] == 1 && p.size[0] >= 16 && p.size[1] >= 16) {
    const int64_t s0 = p.size[0], s1 = p.size[1], os1 = p.stride[0][1], is0 = si;
    const int64_t nb1 = (s1 + kT - 1) / kT;
    int64_t outer = 1;
    for (int d = 2; d < p.nd; ++d) outer *= p.size[d];
    // only 4-byte bit copies have an AVX2 form; conversions are scalar either way
    const auto stripe = pick_if < std::is_same_v<T, S> && sizeof(T) == 4, transpose_stripe<Baseline, T, S>, transpose_stripe < Avx2, T,
               S >> ();
    parallel_for(
        outer * nb1, std::max<int64_t>(1, kGrainCheap / (kT * s0)),
        [&](int64_t ub, int64_t ue) {
          for (int64_t u = ub; u < ue; ++u) {
            int64_t rem = u / nb1, oo = p.base[0], io = p.base[1];
            for (int d = 2; d < p.nd; ++d) {
              const int64_t i = rem % p.size[d];
              rem /= p.size[d];
              oo += i * p.stride[0][d];
              io += i * p.stride[1][d];
            }
            const int64_t b1 = (u % nb1) * kT, e1 = std::min(s1, b1 + kT);
            stripe(o + oo, x + io, b1, e1, s0, os1, is0);
          }
        },
        1);
    return;
  }
  for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 2>& off, int64_t n) {
    T* d = o + off[0];
    const S* s = x + off[1];
    if (so == 1 && si == 1) {
      if constexpr (std::is_same_v<T, S>)
        std::memmove(d, s, static_cast<size_t>(n) * sizeof(T));
      else
        for (int64_t i = 0; i < n; ++i) d[i] = convert_elem<T>(s[i]);
    } else if (si == 0) {
      const T v = convert_elem<T>(s[0]);
      for (int64_t i = 0; i < n; ++i) d[i * so] = v;
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * so] = convert_elem<T>(s[i * si]);
    }
  });
}

}  // namespace

void Cpu::fill(M out, Scalar value) {
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    const T v = value.to<T>();
    const Plan<1> p = make_plan<1>(out.layout.shape, {&out.layout.strides}, {out.layout.offset});
    T* o = out.storage.as<T>();
    const int64_t so = p.inner(0);
    for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 1>& off, int64_t n) {
      T* d = o + off[0];
      if (so == 1)
        std::fill_n(d, n, v);
      else
        for (int64_t i = 0; i < n; ++i) d[i * so] = v;
    });
  });
}

void Cpu::copy(M out, V in) {
  KILN_CHECK(out.layout.shape == in.layout.shape, "copy: shapes differ: out {} vs in {}", shape_str(out.layout.shape),
             shape_str(in.layout.shape));
  if (out.dtype == in.dtype) {
    // Same dtype: an exact bit copy (Reference's round trip through double would only disturb NaN
    // payloads and i64 values beyond 2^53).
    switch (dtype_size(in.dtype)) {
      case 1:
        return copy_kernel<uint8_t, uint8_t>(out, in);
      case 2:
        return copy_kernel<uint16_t, uint16_t>(out, in);
      case 4:
        return copy_kernel<uint32_t, uint32_t>(out, in);
      default:
        return copy_kernel<uint64_t, uint64_t>(out, in);
    }
  }
  visit_dtype(in.dtype, [&]<class S>(type_tag<S>) { visit_dtype(out.dtype, [&]<class T>(type_tag<T>) { copy_kernel<T, S>(out, in); }); });
}

void Cpu::where(M out, V cond, V a, V b) {
  KILN_CHECK(cond.dtype == DType::boolean, "where: cond must be bool, got {} (shape {})", cond.dtype, shape_str(cond.layout.shape));
  KILN_CHECK(a.dtype == b.dtype && a.dtype == out.dtype, "where: dtypes differ: a {}, b {}, out {}", a.dtype, b.dtype, out.dtype);
  const auto go = [&]<class T>(type_tag<T>) {
    const Plan<4> p = make_plan<4>(out.layout.shape, {&out.layout.strides, &cond.layout.strides, &a.layout.strides, &b.layout.strides},
                                   {out.layout.offset, cond.layout.offset, a.layout.offset, b.layout.offset});
    T* o = out.storage.template as<T>();
    const bool* c = cond.storage.template as<bool>();
    const T* x = a.storage.template as<T>();
    const T* y = b.storage.template as<T>();
    const int64_t so = p.inner(0), sc = p.inner(1), sa = p.inner(2), sb = p.inner(3);
    for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 4>& off, int64_t n) {
      T* d = o + off[0];
      const bool* cc = c + off[1];
      const T* xa = x + off[2];
      const T* yb = y + off[3];
      if (so == 1 && sc == 1 && sa == 1 && sb == 1) {
        for (int64_t i = 0; i < n; ++i) d[i] = cc[i] ? xa[i] : yb[i];
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * so] = cc[i * sc] ? xa[i * sa] : yb[i * sb];
      }
    });
  };
  // where moves elements without arithmetic: dispatch on the element width only.
  switch (dtype_size(a.dtype)) {
    case 1:
      return go(type_tag<uint8_t>{});
    case 2:
      return go(type_tag<uint16_t>{});
    case 4:
      return go(type_tag<uint32_t>{});
    default:
      return go(type_tag<uint64_t>{});
  }
}

}  // namespace kiln
