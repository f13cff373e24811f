#pragma once
// Warp-level tensor-core products for the Cuda backend's kernels (include from .cu files only): PTX's
// mma.sync m16n8k8 with TF32 operands and f32 accumulation (sm_80 and later), and the split form
// ("3xTF32") that keeps f32 accuracy: x = hi + lo with hi = tf32(x), lo = tf32(x − hi), and
// a·b ≈ lo_a·hi_b + hi_a·lo_b + hi_a·hi_b (the dropped lo_a·lo_b is below f32's roundoff). Three
// tensor-core products in place of one, still several times the FMA units' f32 rate; two or one where
// an operand is already TF32 (bf16/f16 data).
//
// Fragments (g = lane / 4, t = lane % 4), for a 16 x 8 (A), 8 x 8 (B) and 16 x 8 (C) block:
//   A: A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4)
//   B: B(t, g), B(t + 4, g)
//   C: C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1)
// bf16/f16 operands (m16n8k16, f32 accumulation; mma_h below): each 32-bit register holds two values,
// the lower column (A) or row (B) in its low 16 bits, for a 16 x 16 (A) and 16 x 8 (B) block:
//   A: A(g, 2t..2t+1), A(g + 8, 2t..2t+1), A(g, 2t+8..2t+9), A(g + 8, 2t+8..2t+9)
//   B: B(2t..2t+1, g), B(2t+8..2t+9, g)
//   C: as above
// Their fragments come from shared memory by ldmatrix (ldsm_x4 below). Under the host emulator
// (tests/cuda_emu, which defines KILN_CUDA_EMU) the instructions and the conversion are emulated lane by
// lane with these layouts.
#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/device.cuh"

namespace kiln::cuda::mma {

// cvt.rna.tf32.f32: to 10 mantissa bits, nearest with ties away from zero.
__device__ __forceinline__ float to_tf32(float x) {
#if defined(KILN_CUDA_EMU)
  return ::emu::tf32_round(x);
#elif defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
#else
  return x;
#endif
}

// c += a b for one warp (every lane calls it), a, b already TF32 values.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const float (&a)[4], const float (&b)[2]) {
#if defined(KILN_CUDA_EMU)
  ::emu::mma_m16n8k8_tf32(c, a, b);
#elif defined(__CUDA_ARCH__)
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])), "r"(__float_as_uint(a[3])),
                 "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#else
  (void)c, (void)a, (void)b;
#endif
}

// x split into hi + lo, both TF32. kExact: x is already a TF32 value (bf16 or f16 data widened to f32:
// TF32 keeps f32's 8 exponent bits and 10 mantissa bits, so it holds both exactly), hi = x and lo = 0,
// which the products below skip.
template <int N> struct Split { float hi[N], lo[N]; };
template <bool kExact, int N> __device__ __forceinline__ Split<N> split(const float (&x)[N]) {
  Split<N> s;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s.hi[i] = kExact ? x[i] : to_tf32(x[i]);
    s.lo[i] = kExact ? 0.f : to_tf32(x[i] - s.hi[i]);
  }
  return s;
}

// c += a b to f32 accuracy (three TF32 products, the small ones first), without the products of an
// exact operand's zero low part (kExactA, kExactB: the same sum, as those products add zeros).
template <bool kExactA, bool kExactB> __device__ __forceinline__ void mma_3xtf32(float (&c)[4], const Split<4>& a, const Split<2>& b) {
  if constexpr (!kExactA) mma_tf32(c, a.lo, b.hi);
  if constexpr (!kExactB) mma_tf32(c, a.hi, b.lo);
  mma_tf32(c, a.hi, b.hi);
}

// The A fragment of the 16 x 8 block at column k0 of a row-major array X (leading dimension ld) whose
// first row is the block's.
template <bool kExact> __device__ __forceinline__ Split<4> load_a(const float* X, int ld, int k0, int g, int t) {
  const float x[4] = {X[g * ld + k0 + t], X[(g + 8) * ld + k0 + t], X[g * ld + k0 + t + 4], X[(g + 8) * ld + k0 + t + 4]};
  return split<kExact>(x);
}
// The B fragment of the 8 x 8 block (k0, n0) of B = Xᵀ: B(k, n) = X[n ld + k] (X's rows are B's columns).
template <bool kExact> __device__ __forceinline__ Split<2> load_bt(const float* X, int ld, int k0, int n0, int g, int t) {
  const float x[2] = {X[(n0 + g) * ld + k0 + t], X[(n0 + g) * ld + k0 + t + 4]};
  return split<kExact>(x);
}
// The B fragment of the 8 x 8 block (k0, n0) of B = X: B(k, n) = X[k ld + n].
template <bool kExact> __device__ __forceinline__ Split<2> load_b(const float* X, int ld, int k0, int n0, int g, int t) {
  const float x[2] = {X[(k0 + t) * ld + n0 + g], X[(k0 + t + 4) * ld + n0 + g]};
  return split<kExact>(x);
}

// c[n] += A B[:, 8n : 8n + 8] for n < nt (<= NT): A is 16 x K (row-major from A, leading dimension lda),
// B is K x 8nt, read as Xᵀ (kTransposed: B(k, n) = X[n ldb + k]) or as X (B(k, n) = X[k ldb + n]).
// K a multiple of 8. kExactA, kExactB: that operand's values are TF32 values (see split). One warp,
// every lane.
template <int NT, bool kTransposed, bool kExactA = false, bool kExactB = false>
__device__ __forceinline__ void warp_gemm(float (&c)[NT][4], const float* A, int lda, const float* X, int ldb, int K, int nt, int g,
                                          int t) {
  for (int k0 = 0; k0 < K; k0 += 8) {
    const Split<4> a = load_a<kExactA>(A, lda, k0, g, t);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if (n < nt) {
        const Split<2> b = kTransposed ? load_bt<kExactB>(X, ldb, k0, 8 * n, g, t) : load_b<kExactB>(X, ldb, k0, 8 * n, g, t);
        mma_3xtf32<kExactA, kExactB>(c[n], a, b);
      }
    }
  }
}

// ------------------------------------------------------------------------------ bf16 / f16 operands
// c += a b for one warp (every lane calls it): A 16 x 16, B 16 x 8 of H = kiln::bf16 or kiln::f16 values
// in the register layout above, f32 accumulation (a product of two such values is exact in f32).
template <class H> __device__ __forceinline__ void mma_h(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<H, bf16> || std::is_same_v<H, f16>);
#if defined(KILN_CUDA_EMU)
  ::emu::mma_m16n8k16<std::is_same_v<H, bf16>>(c, a, b);
#elif defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<H, bf16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)c, (void)a, (void)b;
#endif
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: four 8 x 8 matrices of 16-bit values from shared
// memory for one warp (every lane calls it). Lane 8i + r gives the address of row r of matrix i (8
// values, 16 bytes, 16-byte aligned); register i of lane 4r + w receives values 2w (low 16 bits) and
// 2w + 1 of row r of matrix i, or with kTrans of its transpose (rows 2w, 2w + 1 of column r). Row r of
// a matrix at rows g and columns 2t.. of a fragment is thus A's layout above, and kTrans turns a
// row-major [k][n] block into B's.
template <bool kTrans> __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
#if defined(KILN_CUDA_EMU)
  ::emu::ldmatrix_x4<kTrans>(r, p);
#elif defined(__CUDA_ARCH__)
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
  (void)p;
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

// Two f32 values as one register of H values, rounded to nearest even: x0 (the lower index) in the low
// 16 bits.
template <class H> __device__ __forceinline__ uint32_t pack_h(float x0, float x1) {
  return static_cast<uint32_t>(from_compute<H>(x0).bits) | (static_cast<uint32_t>(from_compute<H>(x1).bits) << 16);
}

}  // namespace kiln::cuda::mma
