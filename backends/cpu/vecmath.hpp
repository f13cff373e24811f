#pragma once
// Vectorised float32 math for the Cpu backend (AVX2 + FMA, 8 lanes), Cephes-style polynomials with
// Sleef-like accuracy (about 1-2 ulp over the full range), IEEE special values handled:
//   exp: round-to-nearest range reduction x = n ln2 + r (ln2 split in two), degree-6 polynomial, times
//        2^n; a vector with a lane outside [-87.3, 88] (or NaN) takes the full-range path, which
//        applies 2^n as two factors so results down to the subnormals are right and passes NaN through.
//   log: frexp-style split, degree-9 polynomial; 0 -> -inf, x < 0 -> NaN, +inf -> +inf, subnormals
//        rescaled by 2^23 first.
//   tanh: odd polynomial for |x| < 0.625, else 1 - 2 / (exp(2|x|) + 1) with the sign restored.
//   sigmoid: 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0 with e = exp(-|x|): no cancellation,
//        no overflow, exact tails. silu = x * sigmoid(x); gelu_tanh = x * sigmoid(2u) (the identity
//        0.5 (1 + tanh u) = sigmoid(2u) avoids the cancellation of 1 + tanh u for x << 0).
// Each has a scalar twin with the same formula (libm's exp, log, tanh inside). The array functions
// (exp_n, ..., row_max, exp_shift_sum) come in three variants chosen by ISA tag (common.hpp): Baseline
// runs the scalar twins, Avx2 the vector code, compiled for AVX2 + FMA whatever the build's flags, and
// Avx512 the same code on 16 lanes, compiled for AVX-512 F/BW/DQ/VL. The lanes are independent (a vector
// with a lane out of exp's fast range takes the full-range path, which gives the same bits for the
// in-range lanes), so Avx512 returns the very floats Avx2 returns, and row_max / exp_shift_sum keep
// Avx2's order of operations (two 8-lane accumulators = one 16-lane one): the same sums, bit for bit.
// tests/cpu_isa/vecmath.cpp checks all of this over the whole float range.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kiln/backends/cpu/common.hpp"

namespace kiln::cpu::vm {

// ------------------------------------------------------------------------------------------ scalar
inline float exp_s(float x) { return std::exp(x); }
inline float log_s(float x) { return std::log(x); }
inline float tanh_s(float x) { return std::tanh(x); }
inline float sigmoid_s(float x) {
  const float e = std::exp(-std::fabs(x));
  const float s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}
inline float silu_s(float x) { return x * sigmoid_s(x); }
inline float gelu_tanh_s(float x) {
  const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return x * sigmoid_s(2.0f * u);
}
inline float gelu_s(float x) { return 0.5f * x * std::erfc(-x * 0.70710678118654752440f); }

#if KILN_CPU_X86
// ------------------------------------------------------------------------------------------ AVX2
KILN_CPU_AVX2_BEGIN
namespace avx2 {
// exp polynomial on r in [-ln2/2, ln2/2] with n = round(x / ln2): returns (p(r), n).
inline __m256 exp_poly(__m256 x, __m256& n) {
  n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  return _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

// Every lane in [-87.3, 88]: 2^n is one normal float.
inline __m256 exp8_inrange(__m256 x) {
  __m256 n;
  const __m256 p = exp_poly(x, n);
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// The full range: overflow to inf, results down to the subnormals (2^n applied as two factors), 0
// below, NaN passes through.
inline __m256 exp8_full(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228394f), lo = _mm256_set1_ps(-104.0f);
  const __m256 xin = x;
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 n;
  const __m256 p = exp_poly(x, n);
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(xin, hi, _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(xin, lo, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, xin, _mm256_cmp_ps(xin, xin, _CMP_UNORD_Q));
}

inline __m256 exp8(__m256 x) {
  const __m256 out =
      _mm256_or_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_NGE_UQ), _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_NLE_UQ));
  if (__builtin_expect(_mm256_movemask_ps(out) != 0, 0)) return exp8_full(x);
  return exp8_inrange(x);
}

inline __m256 log8(__m256 x) {
  const __m256 xin = x;
  const __m256 one = _mm256_set1_ps(1.0f);
  // subnormals: scale by 2^23
  const __m256 sub = _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
  x = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), sub);
  __m256i xi = _mm256_castps_si256(x);
  __m256i ei = _mm256_sub_epi32(_mm256_srli_epi32(xi, 23), _mm256_set1_epi32(126));
  __m256 e = _mm256_cvtepi32_ps(ei);
  e = _mm256_sub_ps(e, _mm256_and_ps(sub, _mm256_set1_ps(23.0f)));
  // mantissa in [0.5, 1)
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(xi, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  const __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(small, one));
  m = _mm256_add_ps(_mm256_sub_ps(m, one), _mm256_and_ps(small, m));  // m < sqrt(1/2): 2m - 1, else m - 1
  const __m256 z = _mm256_mul_ps(m, m);
  __m256 y = _mm256_set1_ps(7.0376836292E-2f);
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.1514610310E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.1676998740E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.2420140846E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(1.4249322787E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-1.6668057665E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(2.0000714765E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(-2.4999993993E-1f));
  y = _mm256_fmadd_ps(y, m, _mm256_set1_ps(3.3333331174E-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, m), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  __m256 r = _mm256_add_ps(m, y);
  r = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), r);
  // specials
  r = _mm256_blendv_ps(r, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(xin, _mm256_setzero_ps(), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(xin, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, _mm256_set1_ps(NAN), _mm256_cmp_ps(xin, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_blendv_ps(r, xin, _mm256_cmp_ps(xin, xin, _CMP_UNORD_Q));
}

inline __m256 abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

inline __m256 tanh8(__m256 x) {
  const __m256 ax = abs8(x);
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
  // small: x + x^3 P(x^2)
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745E-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036E-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422E-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  // large: 1 - 2 / (exp(2|x|) + 1)
  const __m256 e = exp8(_mm256_add_ps(ax, ax));
  const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  const __m256 r = _mm256_blendv_ps(_mm256_or_ps(big, sign), small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
  return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), abs8(x)));
  const __m256 s = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  return _mm256_blendv_ps(_mm256_mul_ps(e, s), s, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
}
inline __m256 silu8(__m256 x) { return _mm256_mul_ps(x, sigmoid8(x)); }
inline __m256 gelu_tanh8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.79788456080286535588f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
  return _mm256_mul_ps(x, sigmoid8(_mm256_add_ps(u, u)));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline double hsum4d(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}
}  // namespace avx2
KILN_CPU_AVX2_END

// ------------------------------------------------------------------------------------------ AVX-512
// The AVX2 formulas on 16 lanes, with mask registers for the selections: bit for bit the same results.
KILN_CPU_AVX512_BEGIN
namespace avx512 {
inline __m512 exp_poly(__m512 x, __m512& n) {
  n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  return _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

inline __m512 exp16_inrange(__m512 x) {
  __m512 n;
  const __m512 p = exp_poly(x, n);
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

inline __m512 exp16_full(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.7228394f), lo = _mm512_set1_ps(-104.0f);
  const __m512 xin = x;
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  __m512 n;
  const __m512 p = exp_poly(x, n);
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, hi, _CMP_GT_OQ), y, _mm512_set1_ps(INFINITY));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, xin, _CMP_UNORD_Q), y, xin);
}

inline __m512 exp16(__m512 x) {
  const __mmask16 out =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NGE_UQ) | _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_NLE_UQ);
  if (__builtin_expect(out != 0, 0)) return exp16_full(x);
  return exp16_inrange(x);
}

inline __m512 log16(__m512 x) {
  const __m512 xin = x;
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 sub = _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
  x = _mm512_mask_mul_ps(x, sub, x, _mm512_set1_ps(8388608.0f));
  const __m512i xi = _mm512_castps_si512(x);
  const __m512i ei = _mm512_sub_epi32(_mm512_srli_epi32(xi, 23), _mm512_set1_epi32(126));
  __m512 e = _mm512_cvtepi32_ps(ei);
  e = _mm512_mask_sub_ps(e, sub, e, _mm512_set1_ps(23.0f));
  __m512 m = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(xi, _mm512_set1_epi32(0x007fffff)), _mm512_set1_epi32(0x3f000000)));
  const __mmask16 small = _mm512_cmp_ps_mask(m, _mm512_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm512_mask_sub_ps(e, small, e, one);
  m = _mm512_add_ps(_mm512_sub_ps(m, one), _mm512_maskz_mov_ps(small, m));  // m < sqrt(1/2): 2m - 1, else m - 1
  const __m512 z = _mm512_mul_ps(m, m);
  __m512 y = _mm512_set1_ps(7.0376836292E-2f);
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.1514610310E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(1.1676998740E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.2420140846E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(1.4249322787E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.6668057665E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(2.0000714765E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-2.4999993993E-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(3.3333331174E-1f));
  y = _mm512_mul_ps(_mm512_mul_ps(y, m), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
  y = _mm512_fnmadd_ps(z, _mm512_set1_ps(0.5f), y);
  __m512 r = _mm512_add_ps(m, y);
  r = _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), r);
  r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, _mm512_setzero_ps(), _CMP_EQ_OQ), r, _mm512_set1_ps(-INFINITY));
  r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ), r, _mm512_set1_ps(INFINITY));
  r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, _mm512_setzero_ps(), _CMP_LT_OQ), r, _mm512_set1_ps(NAN));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(xin, xin, _CMP_UNORD_Q), r, xin);
}

inline __m512 abs16(__m512 x) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x); }

inline __m512 tanh16(__m512 x) {
  const __m512 ax = abs16(x);
  const __m512 sign = _mm512_and_ps(x, _mm512_set1_ps(-0.0f));
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745E-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036E-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422E-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp16(_mm512_add_ps(ax, ax));
  const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), _mm512_or_ps(big, sign), small);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, x);
}

inline __m512 sigmoid16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), abs16(x)));
  const __m512 s = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), _mm512_mul_ps(e, s), s);
}
inline __m512 silu16(__m512 x) { return _mm512_mul_ps(x, sigmoid16(x)); }
inline __m512 gelu_tanh16(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286535588f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
  return _mm512_mul_ps(x, sigmoid16(_mm512_add_ps(u, u)));
}

// The two 8-lane halves, as Avx2's two accumulators.
inline __m256 lo8(__m512 v) { return _mm512_castps512_ps256(v); }
inline __m256 hi8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
}  // namespace avx512
KILN_CPU_AVX512_END
#endif

// ------------------------------------------------------------------------------------------ arrays
// y[i] = f(x[i]) for n floats (x and y may be the same array). Avx2: tails go through the vector
// formula too (padded), so every element sees the same function.
#define KILN_VM_ARRAY(NAME, SCALAR)                                 \
  inline void NAME(Baseline, const float* x, float* y, int64_t n) { \
    for (int64_t i = 0; i < n; ++i) y[i] = SCALAR(x[i]);            \
  }
KILN_VM_ARRAY(exp_n, exp_s)
KILN_VM_ARRAY(log_n, log_s)
KILN_VM_ARRAY(tanh_n, tanh_s)
KILN_VM_ARRAY(sigmoid_n, sigmoid_s)
KILN_VM_ARRAY(silu_n, silu_s)
KILN_VM_ARRAY(gelu_tanh_n, gelu_tanh_s)
#undef KILN_VM_ARRAY

// The largest of n floats (-inf for n = 0).
inline float row_max(Baseline, const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// y = exp(x - c) (y may be x); returns the sum of y.
inline float exp_shift_sum(Baseline, const float* x, float* y, int64_t n, float c) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - c);
    s += y[i];
  }
  return s;
}

#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
#define KILN_VM_ARRAY(NAME, VEC)                                                           \
  inline void NAME(Avx2, const float* x, float* y, int64_t n) {                            \
    int64_t i = 0;                                                                         \
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, avx2::VEC(_mm256_loadu_ps(x + i))); \
    if (i < n) {                                                                           \
      alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                 \
      for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];                                   \
      _mm256_store_ps(buf, avx2::VEC(_mm256_load_ps(buf)));                                \
      for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];                                   \
    }                                                                                      \
  }
KILN_VM_ARRAY(exp_n, exp8)
KILN_VM_ARRAY(log_n, log8)
KILN_VM_ARRAY(tanh_n, tanh8)
KILN_VM_ARRAY(sigmoid_n, sigmoid8)
KILN_VM_ARRAY(silu_n, silu8)
KILN_VM_ARRAY(gelu_tanh_n, gelu_tanh8)
#undef KILN_VM_ARRAY

inline float row_max(Avx2, const float* x, int64_t n) {
  int64_t i = 0;
  __m256 m0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  float m = avx2::hmax8(_mm256_max_ps(m0, m1));
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// exp_shift_sum from element i on (a multiple of 16), with the accumulators s0 (lanes 0-7 of every
// 16-element block) and s1 (lanes 8-15) so far: the rest of the Avx2 variant, shared with Avx512's.
inline float exp_shift_rest(Avx2, const float* x, float* y, int64_t n, float c, int64_t i, __m256 s0, __m256 s1) {
  const __m256 cv = _mm256_set1_ps(c);
  if (i + 8 <= n) {
    const __m256 a = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), cv));
    _mm256_storeu_ps(y + i, a);
    s0 = _mm256_add_ps(s0, a);
    i += 8;
  }
  float s = avx2::hsum8(_mm256_add_ps(s0, s1));
  if (i < n) {
    alignas(32) float buf[8];
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j] - c;
    for (int64_t j = n - i; j < 8; ++j) buf[j] = 0.0f;  // unused lanes: in range, so no slow path for them
    _mm256_store_ps(buf, avx2::exp8(_mm256_load_ps(buf)));
    for (int64_t j = i; j < n; ++j) {
      y[j] = buf[j - i];
      s += buf[j - i];
    }
  }
  return s;
}

inline float exp_shift_sum(Avx2, const float* x, float* y, int64_t n, float c) {
  int64_t i = 0;
  const __m256 cv = _mm256_set1_ps(c);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 a = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), cv));
    const __m256 b = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), cv));
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  return exp_shift_rest(Avx2{}, x, y, n, c, i, s0, s1);
}
KILN_CPU_AVX2_END

KILN_CPU_AVX512_BEGIN
// Tails: a masked load (zeros beyond n, as Avx2's padded buffer) and a masked store.
#define KILN_VM_ARRAY(NAME, VEC)                                                               \
  inline void NAME(Avx512, const float* x, float* y, int64_t n) {                              \
    int64_t i = 0;                                                                             \
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, avx512::VEC(_mm512_loadu_ps(x + i))); \
    if (i < n) {                                                                               \
      const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);                         \
      _mm512_mask_storeu_ps(y + i, k, avx512::VEC(_mm512_maskz_loadu_ps(k, x + i)));           \
    }                                                                                          \
  }
KILN_VM_ARRAY(exp_n, exp16)
KILN_VM_ARRAY(log_n, log16)
KILN_VM_ARRAY(tanh_n, tanh16)
KILN_VM_ARRAY(sigmoid_n, sigmoid16)
KILN_VM_ARRAY(silu_n, silu16)
KILN_VM_ARRAY(gelu_tanh_n, gelu_tanh16)
#undef KILN_VM_ARRAY

// The 16-element blocks on 16 lanes, the rest as Avx2 from its two accumulators' state.
inline float row_max(Avx512, const float* x, int64_t n) {
  int64_t i = 0;
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  float r = avx2::hmax8(_mm256_max_ps(avx512::lo8(m), avx512::hi8(m)));
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

inline float exp_shift_sum(Avx512, const float* x, float* y, int64_t n, float c) {
  const int64_t n16 = n / 16 * 16;
  const __m512 cv = _mm512_set1_ps(c);
  __m512 s = _mm512_setzero_ps();
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 a = avx512::exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), cv));
    _mm512_storeu_ps(y + i, a);
    s = _mm512_add_ps(s, a);
  }
  return exp_shift_rest(Avx2{}, x, y, n, c, n16, avx512::lo8(s), avx512::hi8(s));
}
KILN_CPU_AVX512_END
#endif

}  // namespace kiln::cpu::vm
