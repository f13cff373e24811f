// Flash attention on the Cpu backend, forward and backward (contract: core/fused.hpp).
//
// Forward (FlashAttention-2 loop order): the work units are (batch, head, query tile of kBr rows),
// spread over the OpenMP threads with a dynamic schedule (heaviest causal tiles first). A unit walks
// the key tiles of kBc keys its rows can see (causal: tiles entirely above the diagonal are never
// visited) and keeps, per query row, the running max m and sum l of the online softmax:
//   S = scale · Q_i K_jᵀ (a tile product, kBr × kBc, in a thread-local buffer), the user's attention
//   mask added (additive) or applied (bool), mask (causal, padding, bool mask) to −inf,
//   m' = max(m, rowmax S), P = exp(S − m'), l = l·e^(m−m') + ΣP, O = O·e^(m−m') + P V_j.
// At the end O /= l and LSE = m + log l. The [T, S] matrix never exists; per thread the scratch is one
// kBr × kBc tile, and O accumulates directly in the output's rows (any layout with unit-stride rows:
// core/fused.hpp hands over O in q's memory order, dq, dk, dv in q's, k's, v's).
//
// Backward (recompute from LSE): D = rowsum(dO ⊙ O) first; then the units are (batch, kv head) and
// each walks its key tiles; for a key tile it loops over the query heads of its GQA group and the
// query tiles that can see the tile and accumulates
//   P = exp(S − LSE), dV_j += Pᵀ dO_i, dP = dO_i V_jᵀ, dS = scale · P ⊙ (dP − D),
//   dK_j += dSᵀ Q_i, dQ_i += dS K_j.
// A unit owns dK, dV of its kv head and dQ of its group's query heads, so no two threads ever write
// the same element. They arrive uninitialised: the first product into each row writes it (beta 0; key
// tile 0 reaches every query row), and only rows no product reaches are zeroed. The forward's O rows
// likewise come from key tile 0's P V with beta 0, not from a memset. When
// there are fewer (batch, kv head) units than threads (e.g. B = 1, one kv head, long sequences), the
// units become (batch, kv head, key tile), dealt to the threads round robin (not dynamically, so that
// the result does not depend on timing), and each thread accumulates dQ in a private buffer; the
// buffers are summed in thread order at the end.
//
// A causal tile that crosses the diagonal is cut into blocks of query rows, each multiplied against
// only the keys its last row can see (for_diag_blocks), so the products skip most of the hidden triangle.
//
// The f32 tile products run in this file's register-blocked kernels (AVX2 + FMA or AVX-512, "tile
// products" below; no library call per tile), f64 and the baseline ISA in OpenBLAS (single-threaded
// inside the parallel region), both with the operands' row strides as leading dimensions, so strided
// q/k/v/dO views (heads interleaved, a sliced KV cache) cost no copy. The two products against a
// transposed tile, S = Q Kᵀ and dP = dO Vᵀ, would be dot products along rows (and OpenBLAS's row-major
// NT case, which at these sizes takes its packing path at about half the rate of its small-matrix
// kernels); so a key tile of K (and V) is transposed once into a thread-local buffer (8×8 register
// transposes) and the products run as NN, reused by every query tile and GQA head that sees the tile
// (the forward keeps a thread's transposed key tiles tagged by (batch, kv head, tile): kKtSlots).
// Tiles of fewer than kMinRowsT query rows (decoding) keep the NT form, in OpenBLAS. f32 rows use
// the exp of vecmath.hpp (AVX2/AVX-512, or libm's at baseline); f64 uses std::exp.
// The row work between the f32 products runs in their micro-kernels' epilogues ("epilogues" below) on
// the accumulators in registers: the backward's P = exp(S − LSE) (EpProbs) and dS (EpDs), and on
// AVX-512 the forward's online-softmax step (EpSoftmax; a 64-key row is 4 registers; on AVX2, where
// it is 8 of 16, the same step right after the product on the tile in L1: softmax_row256). Tiles with
// key padding or a user mask, f64 and the baseline ISA run the same formulas as separate row passes,
// kernel variants chosen per call for the instruction set (common.hpp), one call per tile; both
// forms give the same floats (test_attention checks it bit for bit). A soft cap (Gemma 2: S = cap ·
// tanh(S / cap) before the masks) also runs as row passes (cap_row; the backward keeps its derivative
// in a scratch tile and multiplies dS by it).
#include <cblas.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/cpu/vecmath.hpp"

namespace kiln {
using namespace cpu;

namespace {

// Tiles (measured at B=8, H=4, d=64, T=128/512, one thread: 32..128 rows × 32..128 keys are within
// ~10% of each other, 64 × 64 among the best for both passes; see bench/attention/RESULTS.md).
constexpr int64_t kBr = 64;        // forward: query rows per tile
constexpr int64_t kBc = 64;        // forward: keys per tile
constexpr int64_t kBrB = 64;       // backward: query rows per tile
constexpr int64_t kBcB = 64;       // backward: keys per tile
constexpr int64_t kMinRowsT = 16;  // query rows per key tile from which the key tile is transposed
// A causal tile on the diagonal runs as blocks of query rows, each against only the keys its last row
// can see, so the products skip most of the hidden upper triangle (a 64 × 64 tile in 32-row blocks
// does 3/4 of its work, in 16-row blocks 5/8). Measured at T = 128 and 512 (bench/attention): 16 rows
// for both passes (the backward took 32 while its row work ran as separate passes per block; with
// that work in the products' epilogues, 16 is 4% faster at T = 128 and even at T = 512).
constexpr int64_t kDiagRows = 16;
constexpr int64_t kDiagRowsB = 16;

template <class T> void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
                             T beta, T* c, int64_t ldc) {
  const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  const auto m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, m, n, k, alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
  else
    cblas_dgemm(CblasRowMajor, TA, TB, m, n, k, alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
}

// ---------------------------------------------------------------------------------- tile products (f32)
// C [M, N] = alpha · op(A) · B + beta · C for the f32 tile products of the AVX2 and AVX-512 kernels, in
// place of an OpenBLAS call per tile (whose call and packing overhead is a large part of a 64 × 64 × 64
// product): B row-major [K, N] with row stride ldb (a transposed key tile, a V or dO tile, rows of q or
// k), op(A) = A [M, K] with row stride lda, or with ta, Aᵀ of an A stored [K, M] (dV += Pᵀ dO,
// dK += dSᵀ Q). beta is 0 (C is not read: it may be uninitialised) or 1. No packing: at tile sizes B's
// rows stay in L1/L2, and the micro-kernel holds an MR × (NV vectors) block of C in registers over the
// whole K loop, broadcasting one A element per row and loading NV vectors of B's row per step. The
// ragged right edge is a masked last vector, the ragged bottom edge runs blocks of 4, 2 and 1 rows.
// Each product of the sum is one fused multiply-add in K order, so results differ from OpenBLAS's
// (another summation order) by rounding only.
// Epilogues: what the micro-kernel does with a finished row r of its block (acc: the sums for columns
// [c0, c0 + width) of C, the last vector masked by tail; c: the row's first element of the block).
struct EpPlain {  // C = alpha · acc + beta · C (beta 0: C is not read)
  float alpha, beta;
};
// The backward's P = exp(alpha · acc − lse[r]) (tile_probs' formula, bit for bit) for the columns
// c < vis0 + r (a causal row's visible prefix; vis0 >= the width: every column), 0 beyond them and in
// rows whose lse is −inf. Only for tiles without padding or a user mask.
struct EpProbs {
  float alpha;
  const float* lse;
  int64_t vis0;
};
// The backward's dS = f0 · C ⊙ (acc − D0[r]) in place of C (which holds P), and with c1 set the second
// branch's f1 · C1 ⊙ (acc − D1[r]) in place of C1 (row stride ld, same columns): tile_ds for dP = acc.
struct EpDs {
  const float* D0;
  float f0;
  float* c1;
  const float* D1;
  float f1;
  int64_t ld;
};
// The forward's online-softmax step on a tile of S = alpha · acc whose rows are whole in the block
// (AVX-512, at most 64 columns; on AVX2, softmax_row256 on the finished tile), tile_softmax's
// formulas bit for bit over the columns c < vis0 + r (vis0 >= the width: every column): the new max
// mn[r] = max(m[r], the row's max) and P = exp(S − mn[r]) in place of S, its sum in sum[r] (0 beyond
// the visible columns; a row with nothing visible yet, mn[r] = −∞, becomes zeros). The scalar rest of
// the step (e^(m − m'), l, O's rescale: softmax_update) runs after the product, so no libm call sits
// among the live accumulators. Only for tiles without padding or a user mask.
struct EpSoftmax {
  float alpha;
  const float* m;
  float *mn, *sum;
  int64_t vis0;
};
// The visible columns of a row from c0 on, where there are at most w: lanes [0, n) of each vector.
inline int64_t lanes_in(int64_t vis, int64_t j, int64_t w) { return std::clamp<int64_t>(vis - j * w, 0, w); }

#if KILN_CPU_X86
KILN_CPU_AVX512_BEGIN
template <int NV>
[[gnu::always_inline]] inline void ep_row512(const EpPlain& e, __m512 (&acc)[NV], __mmask16 tail, float* c, int64_t, int64_t) {
  const __m512 va = _mm512_set1_ps(e.alpha), vb = _mm512_set1_ps(e.beta);
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    const __mmask16 m = j + 1 < NV ? __mmask16(0xffff) : tail;
    __m512 r = _mm512_mul_ps(va, acc[j]);
    if (e.beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, c + 16 * j), r);
    _mm512_mask_storeu_ps(c + 16 * j, m, r);
  }
}
template <int NV>
[[gnu::always_inline]] inline void ep_row512(const EpProbs& e, __m512 (&acc)[NV], __mmask16 tail, float* c, int64_t r, int64_t c0) {
  const float L = e.lse[r];
  const int64_t vis = L == -std::numeric_limits<float>::infinity() ? 0 : e.vis0 + r - c0;
  const __m512 va = _mm512_set1_ps(e.alpha), vl = _mm512_set1_ps(L);
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    const int64_t n = lanes_in(vis, j, 16);
    const auto v = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
    __m512 y = _mm512_setzero_ps();  // hidden lanes: exp of 0, then zeroed (no −∞ through the exp)
    // (a masked difference: GCC does not fuse it with the product, so S is rounded first, as tile_probs)
    if (n > 0) y = _mm512_maskz_mov_ps(v, vm::avx512::exp16(_mm512_maskz_sub_ps(v, _mm512_mul_ps(va, acc[j]), vl)));
    _mm512_mask_storeu_ps(c + 16 * j, j + 1 < NV ? __mmask16(0xffff) : tail, y);
  }
}
template <int NV>
[[gnu::always_inline]] inline void ep_row512(const EpDs& e, __m512 (&acc)[NV], __mmask16 tail, float* c, int64_t r, int64_t c0) {
  const __m512 d0 = _mm512_set1_ps(e.D0[r]), f0 = _mm512_set1_ps(e.f0);
  float* c1 = e.c1 ? e.c1 + r * e.ld + c0 : nullptr;
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    const __mmask16 m = j + 1 < NV ? __mmask16(0xffff) : tail;
    _mm512_mask_storeu_ps(c + 16 * j, m, _mm512_mul_ps(_mm512_mul_ps(f0, _mm512_maskz_loadu_ps(m, c + 16 * j)), _mm512_sub_ps(acc[j], d0)));
  }
  if (!c1) return;
  const __m512 d1 = _mm512_set1_ps(e.D1[r]), f1 = _mm512_set1_ps(e.f1);
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    const __mmask16 m = j + 1 < NV ? __mmask16(0xffff) : tail;
    _mm512_mask_storeu_ps(c1 + 16 * j, m,
                          _mm512_mul_ps(_mm512_mul_ps(f1, _mm512_maskz_loadu_ps(m, c1 + 16 * j)), _mm512_sub_ps(acc[j], d1)));
  }
}

template <int NV>
[[gnu::always_inline]] inline void ep_row512(const EpSoftmax& e, __m512 (&acc)[NV], __mmask16 tail, float* c, int64_t r, int64_t) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const int64_t n = std::clamp<int64_t>(e.vis0 + r, 0, 16 * (NV - 1) + __builtin_popcount(tail));  // visible columns
  const __m512 va = _mm512_set1_ps(e.alpha);
  __m512 x[NV], mx = _mm512_set1_ps(ninf);
  __mmask16 v[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    x[j] = _mm512_mul_ps(va, acc[j]);
    const int64_t nl = lanes_in(n, j, 16);
    v[j] = static_cast<__mmask16>(nl >= 16 ? 0xffffu : (1u << nl) - 1u);
    mx = _mm512_mask_max_ps(mx, v[j], mx, x[j]);
  }
  const float mnew = std::max(e.m[r], _mm512_reduce_max_ps(mx));
  e.mn[r] = mnew;
  if (mnew == ninf) {  // nothing visible yet
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_mask_storeu_ps(c + 16 * j, j + 1 < NV ? __mmask16(0xffff) : tail, _mm512_setzero_ps());
    return;
  }
  const __m512 vmax = _mm512_set1_ps(mnew);
  __m512 y[NV], s = _mm512_setzero_ps();
  const int64_t nfull = n / 16, rem = n - 16 * nfull;
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    y[j] = _mm512_setzero_ps();  // hidden lanes: exp of 0, then zeroed (no −∞ through the exp)
    if (v[j]) y[j] = _mm512_maskz_mov_ps(v[j], vm::avx512::exp16(_mm512_maskz_sub_ps(v[j], x[j], vmax)));
    _mm512_mask_storeu_ps(c + 16 * j, j + 1 < NV ? __mmask16(0xffff) : tail, y[j]);
    if (j < nfull) s = _mm512_add_ps(s, y[j]);
  }
  // Σ P in vm::exp_shift_sum's order: 16-lane blocks, then 8 lanes, the halves added, then one by one
  __m256 lo = vm::avx512::lo8(s);
  int64_t t = 0;
  if (rem >= 8) {
    lo = _mm256_add_ps(lo, vm::avx512::lo8(y[nfull]));
    t = 8;
  }
  float sum = vm::avx2::hsum8(_mm256_add_ps(lo, vm::avx512::hi8(s)));
  for (; t < rem; ++t) sum += c[16 * nfull + t];
  e.sum[r] = sum;
}

template <int MR, int NV, bool TA, class E>
[[gnu::always_inline]] inline void tile_ukr_avx512(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                                                   int64_t ldc, __mmask16 tail, const E& ep, int64_t r0, int64_t c0) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j + 1 < NV; ++j) bv[j] = _mm512_loadu_ps(b + 16 * j);
    bv[NV - 1] = _mm512_maskz_loadu_ps(tail, b + 16 * (NV - 1));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(TA ? A[k * lda + i] : A[i * lda + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(a, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ep_row512(ep, acc[i], tail, C + i * ldc, r0 + i, c0);
}

// Columns [0, 16·NV) of C (the last vector masked by tail), every row.
// Columns [0, 16·NV) of C (the last vector masked by tail), every row; c0: the block's first column in C.
template <int NV, bool TA, class E> void tile_cols_avx512(int64_t M, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                                                          float* C, int64_t ldc, __mmask16 tail, const E& ep, int64_t c0) {
  constexpr int MR = NV == 4 ? 6 : 8;  // MR · NV accumulators + NV vectors of B + a broadcast within 32 registers
  auto a_at = [&](int64_t i) { return TA ? A + i : A + i * lda; };
  int64_t i = 0;
  for (; i + MR <= M; i += MR) tile_ukr_avx512<MR, NV, TA>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
  if (M - i >= 4) {
    tile_ukr_avx512<4, NV, TA>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
    i += 4;
  }
  if (M - i >= 2) {
    tile_ukr_avx512<2, NV, TA>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
    i += 2;
  }
  if (M - i >= 1) tile_ukr_avx512<1, NV, TA>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
}

template <bool TA, class E> void tile_gemm_avx512_t(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                                                    int64_t ldb, float* C, int64_t ldc, const E& ep) {
  for (int64_t j = 0; j < N; j += 64) {
    const int64_t w = std::min<int64_t>(64, N - j), nv = (w + 15) / 16;
    const auto tail = static_cast<__mmask16>((1u << (w - 16 * (nv - 1))) - 1u);
    const float* b = B + j;
    float* c = C + j;
    switch (nv) {
      case 1:
        tile_cols_avx512<1, TA>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
        break;
      case 2:
        tile_cols_avx512<2, TA>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
        break;
      case 3:
        tile_cols_avx512<3, TA>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
        break;
      default:
        tile_cols_avx512<4, TA>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
        break;
    }
  }
}
void tile_gemm_avx512(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                      float beta, float* C, int64_t ldc) {
  const EpPlain ep{alpha, beta};
  if (ta)
    tile_gemm_avx512_t<true>(M, N, K, A, lda, B, ldb, C, ldc, ep);
  else
    tile_gemm_avx512_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
void tile_probs_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                       const EpProbs& ep) {
  tile_gemm_avx512_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
void tile_softmax_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                         const EpSoftmax& ep) {
  tile_gemm_avx512_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
void tile_ds_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                    const EpDs& ep) {
  tile_gemm_avx512_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
KILN_CPU_AVX512_END

KILN_CPU_AVX2_BEGIN
// The epilogues on 8 lanes; Tail: the last vector is masked by tail (maskload / maskstore).
template <bool Tail> [[gnu::always_inline]] inline __m256 load_row256(const float* c, bool masked, __m256i tail) {
  return Tail && masked ? _mm256_maskload_ps(c, tail) : _mm256_loadu_ps(c);
}
template <bool Tail> [[gnu::always_inline]] inline void store_row256(float* c, bool masked, __m256i tail, __m256 x) {
  if (Tail && masked)
    _mm256_maskstore_ps(c, tail, x);
  else
    _mm256_storeu_ps(c, x);
}
template <bool Tail, int NV>
[[gnu::always_inline]] inline void ep_row256(const EpPlain& e, __m256 (&acc)[NV], __m256i tail, float* c, int64_t, int64_t) {
  const __m256 va = _mm256_set1_ps(e.alpha), vb = _mm256_set1_ps(e.beta);
#pragma GCC unroll 2
  for (int j = 0; j < NV; ++j) {
    const bool masked = j + 1 == NV;
    __m256 r = _mm256_mul_ps(va, acc[j]);
    if (e.beta != 0.0f) r = _mm256_fmadd_ps(vb, load_row256<Tail>(c + 8 * j, masked, tail), r);
    store_row256<Tail>(c + 8 * j, masked, tail, r);
  }
}
template <bool Tail, int NV>
[[gnu::always_inline]] inline void ep_row256(const EpProbs& e, __m256 (&acc)[NV], __m256i tail, float* c, int64_t r, int64_t c0) {
  const float L = e.lse[r];
  const int64_t vis = L == -std::numeric_limits<float>::infinity() ? 0 : e.vis0 + r - c0;
  const __m256 va = _mm256_set1_ps(e.alpha), vl = _mm256_set1_ps(L);
#pragma GCC unroll 2
  for (int j = 0; j < NV; ++j) {
    const int64_t n = lanes_in(vis, j, 8);
    __m256 y = _mm256_setzero_ps();  // hidden lanes: exp of 0, then zeroed (no −∞ through the exp)
    if (n > 0) {
      const __m256 v =
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
      // (the `and` between the product and the difference keeps GCC, whose C++ default is
      // -ffp-contract=fast, from fusing them into one rounding: tile_probs rounds S first)
      const __m256 x = _mm256_and_ps(v, _mm256_sub_ps(_mm256_and_ps(v, _mm256_mul_ps(va, acc[j])), vl));
      y = _mm256_and_ps(v, vm::avx2::exp8(x));
    }
    store_row256<Tail>(c + 8 * j, j + 1 == NV, tail, y);
  }
}
template <bool Tail, int NV>
[[gnu::always_inline]] inline void ep_row256(const EpDs& e, __m256 (&acc)[NV], __m256i tail, float* c, int64_t r, int64_t c0) {
  const __m256 d0 = _mm256_set1_ps(e.D0[r]), f0 = _mm256_set1_ps(e.f0);
#pragma GCC unroll 2
  for (int j = 0; j < NV; ++j) {
    const bool masked = j + 1 == NV;
    const __m256 p = load_row256<Tail>(c + 8 * j, masked, tail);
    store_row256<Tail>(c + 8 * j, masked, tail, _mm256_mul_ps(_mm256_mul_ps(f0, p), _mm256_sub_ps(acc[j], d0)));
  }
  if (!e.c1) return;
  float* c1 = e.c1 + r * e.ld + c0;
  const __m256 d1 = _mm256_set1_ps(e.D1[r]), f1 = _mm256_set1_ps(e.f1);
#pragma GCC unroll 2
  for (int j = 0; j < NV; ++j) {
    const bool masked = j + 1 == NV;
    const __m256 p = load_row256<Tail>(c1 + 8 * j, masked, tail);
    store_row256<Tail>(c1 + 8 * j, masked, tail, _mm256_mul_ps(_mm256_mul_ps(f1, p), _mm256_sub_ps(acc[j], d1)));
  }
}

// The forward's online-softmax step (EpSoftmax) on 8 lanes, for row r of a finished tile of S (N <= 64
// columns at c, already scaled: S = alpha · acc was rounded in the plain product's epilogue, so
// e.alpha is not applied again). A 64-key row is 8 registers here, more than a 16-register micro-kernel
// can keep beside its accumulators, so this runs right after the product, on the tile in L1, with the
// row in registers and every lane masked in vector form: tile_softmax's formulas bit for bit (the
// exps of vm::exp_shift_sum lane for lane, its sum's order: 16-lane blocks in two 8-lane halves, an
// 8-lane block, the halves added, then the last lanes one by one), where the row pass takes scalar
// loops and a store-forwarded buffer for every causal row's ragged end.
[[gnu::always_inline]] inline void softmax_row256(const EpSoftmax& e, float* c, int64_t r, int64_t N) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const int64_t n = std::clamp<int64_t>(e.vis0 + r, 0, N), nv = (N + 7) / 8;  // visible columns, vectors
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i ntail = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(N - 8 * (nv - 1))), lane);
  __m256 x[8], v[8], mx = _mm256_set1_ps(ninf);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    if (j >= nv) break;
    x[j] = j + 1 < nv ? _mm256_loadu_ps(c + 8 * j) : _mm256_maskload_ps(c + 8 * j, ntail);
    v[j] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes_in(n, j, 8))), lane));
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(mx, x[j], v[j]));
  }
  const float mnew = std::max(e.m[r], vm::avx2::hmax8(mx));
  e.mn[r] = mnew;
  const __m256 vmax = _mm256_set1_ps(mnew);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  const int64_t nfull = n / 16, rem = n - 16 * nfull;
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    if (j >= nv) break;
    __m256 y = _mm256_setzero_ps();  // hidden lanes (and every lane of a row with nothing visible yet): 0
    const int64_t nl = lanes_in(n, j, 8);
    if (nl == 8 && mnew != ninf)
      y = vm::avx2::exp8(_mm256_sub_ps(x[j], vmax));
    else if (nl > 0 && mnew != ninf)  // hidden lanes: exp of 0, then zeroed (no −∞ or garbage through the exp)
      y = _mm256_and_ps(v[j], vm::avx2::exp8(_mm256_and_ps(v[j], _mm256_sub_ps(x[j], vmax))));
    if (j + 1 < nv)
      _mm256_storeu_ps(c + 8 * j, y);
    else
      _mm256_maskstore_ps(c + 8 * j, ntail, y);
    if (j < 2 * nfull) {
      if (j % 2 == 0)
        s0 = _mm256_add_ps(s0, y);
      else
        s1 = _mm256_add_ps(s1, y);
    } else if (j == 2 * nfull && rem >= 8) {
      s0 = _mm256_add_ps(s0, y);
    }
  }
  float sum = vm::avx2::hsum8(_mm256_add_ps(s0, s1));
  for (int64_t t = 16 * nfull + (rem >= 8 ? 8 : 0); t < n; ++t) sum += c[t];
  e.sum[r] = sum;
}

// The AVX2 + FMA form (16 registers): blocks of up to 2 vectors (16 columns); a ragged last vector
// (Tail) goes through maskload / maskstore with the lanes in `tail`.
template <int MR, int NV, bool TA, bool Tail, class E>
[[gnu::always_inline]] inline void tile_ukr_avx2(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                                                 __m256i tail, const E& ep, int64_t r0, int64_t c0) {
  __m256 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) bv[j] = Tail && j + 1 == NV ? _mm256_maskload_ps(b + 8 * j, tail) : _mm256_loadu_ps(b + 8 * j);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(TA ? A + k * lda + i : A + i * lda + k);
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(a, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ep_row256<Tail>(ep, acc[i], tail, C + i * ldc, r0 + i, c0);
}

template <int NV, bool TA, bool Tail, class E> void tile_cols_avx2(int64_t M, int64_t K, const float* A, int64_t lda, const float* B,
                                                                   int64_t ldb, float* C, int64_t ldc, __m256i tail, const E& ep,
                                                                   int64_t c0) {
  constexpr int MR = NV == 2 ? 6 : 8;  // MR · NV accumulators + NV vectors of B + a broadcast within 16 registers
  auto a_at = [&](int64_t i) { return TA ? A + i : A + i * lda; };
  int64_t i = 0;
  for (; i + MR <= M; i += MR) tile_ukr_avx2<MR, NV, TA, Tail>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
  if (M - i >= 4) {
    tile_ukr_avx2<4, NV, TA, Tail>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
    i += 4;
  }
  if (M - i >= 2) {
    tile_ukr_avx2<2, NV, TA, Tail>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
    i += 2;
  }
  if (M - i >= 1) tile_ukr_avx2<1, NV, TA, Tail>(K, a_at(i), lda, B, ldb, C + i * ldc, ldc, tail, ep, i, c0);
}

template <bool TA, class E> void tile_gemm_avx2_t(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                                                  float* C, int64_t ldc, const E& ep) {
  for (int64_t j = 0; j < N; j += 16) {
    const int64_t w = std::min<int64_t>(16, N - j), nv = (w + 7) / 8, lanes = w - 8 * (nv - 1);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const float* b = B + j;
    float* c = C + j;
    if (lanes == 8) {
      if (nv == 2)
        tile_cols_avx2<2, TA, false>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
      else
        tile_cols_avx2<1, TA, false>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
    } else if (nv == 2) {
      tile_cols_avx2<2, TA, true>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
    } else {
      tile_cols_avx2<1, TA, true>(M, K, A, lda, b, ldb, c, ldc, tail, ep, j);
    }
  }
}
void tile_gemm_avx2(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                    float beta, float* C, int64_t ldc) {
  const EpPlain ep{alpha, beta};
  if (ta)
    tile_gemm_avx2_t<true>(M, N, K, A, lda, B, ldb, C, ldc, ep);
  else
    tile_gemm_avx2_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
void tile_probs_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                     const EpProbs& ep) {
  tile_gemm_avx2_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
void tile_ds_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                  const EpDs& ep) {
  tile_gemm_avx2_t<false>(M, N, K, A, lda, B, ldb, C, ldc, ep);
}
// S = alpha · A B (the plain epilogue), then the online-softmax step row by row on the tile in L1.
void tile_softmax_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                       const EpSoftmax& ep) {
  tile_gemm_avx2_t<false>(M, N, K, A, lda, B, ldb, C, ldc, EpPlain{ep.alpha, 0.0f});
  for (int64_t r = 0; r < M; ++r) softmax_row256(ep, C + r * ldc, r, N);
}
KILN_CPU_AVX2_END
#endif

using TileGemmF32 = void (*)(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*, int64_t);
template <class E>
using TileEpF32 = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, const E&);

// The f32 tile products for isa(): nullptr at baseline (OpenBLAS then).
inline TileGemmF32 pick_tile_gemm() {
#if KILN_CPU_X86
  if (isa() == Isa::avx512) return &tile_gemm_avx512;
  if (isa() == Isa::avx2) return &tile_gemm_avx2;
#endif
  return nullptr;
}
inline TileEpF32<EpProbs> pick_tile_probs() {
#if KILN_CPU_X86
  if (isa() == Isa::avx512) return &tile_probs_avx512;
  if (isa() == Isa::avx2) return &tile_probs_avx2;
#endif
  return nullptr;
}
inline TileEpF32<EpSoftmax> pick_tile_softmax() {  // rows of at most 64 columns
#if KILN_CPU_X86
  if (isa() == Isa::avx512) return &tile_softmax_avx512;
  if (isa() == Isa::avx2) return &tile_softmax_avx2;
#endif
  return nullptr;
}
inline TileEpF32<EpDs> pick_tile_ds() {
#if KILN_CPU_X86
  if (isa() == Isa::avx512) return &tile_ds_avx512;
  if (isa() == Isa::avx2) return &tile_ds_avx2;
#endif
  return nullptr;
}

// dst (8 rows, stride ldd) = the transpose of the 8×8 block at src (row stride lds).
template <class T> inline void transpose8(Baseline, const T* src, int64_t lds, T* dst, int64_t ldd) {
  for (int64_t c = 0; c < 8; ++c)
    for (int64_t r = 0; r < 8; ++r) dst[c * ldd + r] = src[r * lds + c];
}
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
inline void transpose8(Avx2, const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);  // a0 b0 a1 b1 | a4 b4 a5 b5
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // rows 4i..4i+3: columns {0,4}, {1,5}, {2,6}, {3,7}
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
inline void transpose8(Avx2, const double* src, int64_t lds, double* dst, int64_t ldd) { transpose8(Baseline{}, src, lds, dst, ldd); }
KILN_CPU_AVX2_END
#endif

// Kernel: dst (cols rows, row stride ldd) = the transpose of src (rows rows of cols, row stride lds).
// Prefetches rows [r0, r1) of an operand (row stride ld elements, w wide) into the caches: q, k, v and
// dO rows arrive from the projections' outputs, heads interleaved (row strides of H·d or 3·H·d floats,
// so each row starts on another page, where the hardware's stream prefetchers do not follow).
template <class T> inline void prefetch_rows(const T* p, int64_t ld, int64_t r0, int64_t r1, int64_t w) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < w; c += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(p + r * ld + c, 0, 3);
}

template <class I, class T> void transpose_tile(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t rows, int64_t cols) {
  const int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  prefetch_rows(src, lds, 0, std::min<int64_t>(rows, 16), cols);
  for (int64_t r0 = 0; r0 < r8; r0 += 8) {
    prefetch_rows(src, lds, std::min(rows, r0 + 16), std::min(rows, r0 + 24), cols);  // 16 rows ahead
    for (int64_t c0 = 0; c0 < c8; c0 += 8) transpose8(I{}, src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
  }
  for (int64_t c = 0; c < cols; ++c)  // the ragged edges
    for (int64_t r = (c < c8 ? r8 : 0); r < rows; ++r) dst[c * ldd + r] = src[r * lds + c];
}

// A [B, H, N, w] operand with unit-stride rows (E = const T for inputs, T for outputs).
template <class E> struct RowsOf {
  E* p = nullptr;
  int64_t sb = 0, sh = 0, st = 0, ld = 0;
  RowsOf() = default;
  RowsOf(E* p_, int64_t sb_, int64_t sh_, int64_t st_, int64_t ld_) : p(p_), sb(sb_), sh(sh_), st(st_), ld(ld_) {}
  template <class View> RowsOf(const View& v) {  // NOLINT
    const Layout& l = v.layout;
    p = v.storage.template as<std::remove_const_t<E>>() + l.offset;
    sb = l.strides[0];
    sh = l.strides[1];
    st = l.strides[2];
    ld = std::max<int64_t>({l.shape[2] > 1 ? st : 0, l.shape[3], 1});
  }
  E* row(int64_t b, int64_t h, int64_t t) const { return p + b * sb + h * sh + t * st; }
  // Zeroes rows [t0, t0 + n) of (b, h), w wide.
  void zero(int64_t b, int64_t h, int64_t t0, int64_t n, int64_t w) const {
    for (int64_t t = t0; t < t0 + n; ++t) std::fill(row(b, h, t), row(b, h, t) + w, E(0));
  }
};
template <class T> using Rows = RowsOf<const T>;
template <class T> using OutRows = RowsOf<T>;

// ---------------------------------------------------------------------------------- row kernels
template <class I, class T> T row_max(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return vm::row_max(I{}, x, n);
  } else {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
}

// y = exp(x − c) in place; returns Σ y.
template <class I, class T> T exp_shift_sum(T* x, int64_t n, T c) {
  if constexpr (std::is_same_v<T, float>) {
    return vm::exp_shift_sum(I{}, x, x, n, c);
  } else {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[i] = std::exp(x[i] - c);
      s += x[i];
    }
    return s;
  }
}

// The user's attention mask over one tile: element (r, c) at add/keep + r·st + c·ss (a view of the
// [B, H, T, S] expanded mask at the tile's origin: zero strides on broadcast dims). At most one of
// add (additive, the compute dtype) and keep (bool) is set.
template <class T> struct TileMask {
  const T* add = nullptr;
  const bool* keep = nullptr;
  int64_t st = 0, ss = 0;
  bool any() const { return add || keep; }
};

// Sets the scores of the keys a row may not see to −inf, besides causality (visible() cuts the row at
// the causal limit first): the user's mask (row r of the tile: added when additive, −inf where false
// when bool) and padding (kp[j0 + c] false).
template <class T> void mask_row(T* row, int64_t bc, int64_t j0, const bool* kp, const TileMask<T>& um, int64_t r) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  if (um.add) {
    const T* a = um.add + r * um.st;
    if (um.ss == 1)
      for (int64_t c = 0; c < bc; ++c) row[c] += a[c];
    else
      for (int64_t c = 0; c < bc; ++c) row[c] += a[c * um.ss];
  } else if (um.keep) {
    const bool* a = um.keep + r * um.st;
    for (int64_t c = 0; c < bc; ++c) row[c] = a[c * um.ss] ? row[c] : ninf;
  }
  if (kp)
    for (int64_t c = 0; c < bc; ++c)
      if (!kp[j0 + c]) row[c] = ninf;
}

// Gemma 2's soft cap on the visible prefix of a scaled score row, before any mask: s = cap · tanh(s / cap)
// (the vector tanh of vecmath.hpp for f32, as the Tanh op; std::tanh for f64), and with deriv set its
// derivative 1 − tanh² there (the backward's factor on dS). The forward and the backward run this same
// function, so the backward's P = exp(s − LSE) matches the forward's softmax.
template <class I, class T> void cap_row(T* row, int64_t n, T cap, T* deriv) {
  for (int64_t c = 0; c < n; ++c) row[c] /= cap;
  if constexpr (std::is_same_v<T, float>)
    vm::tanh_n(I{}, row, row, n);
  else
    for (int64_t c = 0; c < n; ++c) row[c] = std::tanh(row[c]);
  if (deriv)
    for (int64_t c = 0; c < n; ++c) deriv[c] = T(1) - row[c] * row[c];
  for (int64_t c = 0; c < n; ++c) row[c] *= cap;
}

// The causal prefix of a tile row: keys c <= last (the row's position minus the tile's first key) are
// visible; only those are masked further and exponentiated, and the rest become exact zeros, so a
// causal row's hidden keys never reach the vector exp as −∞ (which takes its slow, range-checked path).
inline int64_t visible(bool diag, int64_t last, int64_t bc) { return diag ? std::clamp<int64_t>(last + 1, 0, bc) : bc; }

// ---------------------------------------------------------------------------------- tile kernels
// Kernels (common.hpp), one call per tile; s holds br rows of bc scores with row stride ld.

// Forward: the soft cap (cap > 0), mask (causal when diag: the row's visible prefix; padding kp; the user's mask), then the
// online-softmax step of each row: the new max
// m', P = exp(S − m') in place, l = l·e^(m−m') + ΣP, and the output rows orow (dv wide, row stride
// ldo) rescaled by e^(m−m'); orow null: the first key tile, whose P·V product overwrites the rows.
// Rows with nothing visible yet become zeros.
template <class I, class T> void tile_softmax(T* s, int64_t ld, int64_t br, int64_t bc, int64_t i0, int64_t j0, bool diag, int64_t pos0,
                                              const bool* kp, const TileMask<T>& um, T cap, T* m, T* l, T* orow, int64_t ldo, int64_t dv) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const bool masked = kp || um.any();
  for (int64_t r = 0; r < br; ++r) {
    T* row = s + r * ld;
    const int64_t n = visible(diag, pos0 + i0 + r - j0, bc);
    if (cap > 0) cap_row<I>(row, n, cap, static_cast<T*>(nullptr));
    if (masked) mask_row(row, n, j0, kp, um, r);
    const T mnew = std::max(m[r], n ? row_max<I>(row, n) : ninf);
    if (mnew == ninf) {  // nothing visible yet
      std::fill(row, row + bc, T(0));
      continue;
    }
    const T alpha = m[r] == ninf ? T(0) : std::exp(m[r] - mnew);
    const T sum = exp_shift_sum<I>(row, n, mnew);
    std::fill(row + n, row + bc, T(0));
    l[r] = l[r] * alpha + sum;
    m[r] = mnew;
    if (orow && alpha != T(1)) {
      T* orr = orow + r * ldo;
      for (int64_t c = 0; c < dv; ++c) orr[c] *= alpha;
    }
  }
}

// Forward, after the last key tile: O /= l and LSE = m + log l for br rows.
template <class I, class T> void tile_finish(T* orow, int64_t ldo, T* lse, const T* m, const T* l, int64_t br, int64_t dv) {
  for (int64_t r = 0; r < br; ++r) {
    const T inv = T(1) / l[r];  // l = 0 (no visible key): 0 · inf = NaN, as PyTorch
    T* orr = orow + r * ldo;
    for (int64_t c = 0; c < dv; ++c) orr[c] *= inv;
    lse[r] = m[r] + std::log(l[r]);
  }
}

// Forward, after a product with the EpSoftmax epilogue: the rest of tile_softmax's step for br rows
// from their new max mn and the sum of their P: l = l·e^(m−m') + ΣP, m = m', the output rows orow
// rescaled by e^(m−m') (orow null: the first key tile). Rows with nothing visible yet stay as they are.
template <class I, class T> void softmax_update(T* m, T* l, const T* mn, const T* sum, T* orow, int64_t ldo, int64_t br, int64_t dv) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < br; ++r) {
    if (mn[r] == ninf) continue;
    const T alpha = m[r] == ninf ? T(0) : std::exp(m[r] - mn[r]);
    l[r] = l[r] * alpha + sum[r];
    m[r] = mn[r];
    if (orow && alpha != T(1)) {
      T* orr = orow + r * ldo;
      for (int64_t c = 0; c < dv; ++c) orr[c] *= alpha;
    }
  }
}

// Backward: P = exp(S − LSE) in place after the soft cap (cap > 0) and the mask (the visible prefix,
// as the forward); rows whose LSE is −inf (no visible key) become zeros. With cap > 0, the cap's
// derivative goes to cf (same layout; 0 where P is 0) for tile_cap_ds.
template <class I, class T> void tile_probs(T* s, int64_t ld, int64_t br, int64_t bc, const T* lse, int64_t i0, int64_t j0, bool diag,
                                            int64_t pos0, const bool* kp, const TileMask<T>& um, T cap, T* cf) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const bool masked = kp || um.any();
  for (int64_t r = 0; r < br; ++r) {
    T* row = s + r * ld;
    T* crow = cap > 0 ? cf + r * ld : nullptr;
    const T L = lse[r];
    if (L == ninf) {  // a row with no visible key contributes nothing
      std::fill(row, row + bc, T(0));
      if (crow) std::fill(crow, crow + bc, T(0));
      continue;
    }
    const int64_t n = visible(diag, pos0 + i0 + r - j0, bc);
    if (crow) {
      cap_row<I>(row, n, cap, crow);
      std::fill(crow + n, crow + bc, T(0));
    }
    if (masked) mask_row(row, n, j0, kp, um, r);
    exp_shift_sum<I>(row, n, L);
    std::fill(row + n, row + bc, T(0));
  }
}

// Backward: dS = scale · P ⊙ (dP − D) in place of P (D: one value per row).
template <class I, class T> void tile_ds(T* p, const T* dp, int64_t ld, int64_t br, int64_t bc, const T* D, T scale) {
  for (int64_t r = 0; r < br; ++r) {
    const T Dr = D[r];
    T* pr = p + r * ld;
    const T* dr = dp + r * ld;
    for (int64_t c = 0; c < bc; ++c) pr[c] = scale * pr[c] * (dr[c] - Dr);
  }
}

// Backward with a soft cap: dS ⊙= the cap's derivative (tile_probs' cf), in place.
template <class I, class T> void tile_cap_ds(T* ds, const T* cf, int64_t ld, int64_t br, int64_t bc) {
  for (int64_t r = 0; r < br; ++r) {
    T* dr = ds + r * ld;
    const T* fr = cf + r * ld;
    for (int64_t c = 0; c < bc; ++c) dr[c] *= fr[c];
  }
}

// Backward of differential attention: out = P1 − λ·P2 (the map that multiplies V).
template <class I, class T> void tile_combine(const T* p1, const T* p2, T* out, int64_t ld, int64_t br, int64_t bc, T lam) {
  for (int64_t r = 0; r < br; ++r) {
    const T *a = p1 + r * ld, *b = p2 + r * ld;
    T* o = out + r * ld;
    for (int64_t c = 0; c < bc; ++c) o[c] = a[c] - lam * b[c];
  }
}

// Backward: D[x] = Σ_c o[x, c] · g[x, c] over the rows x of the [B·H·T] row space, through common.hpp's
// row dot product (0 for rows with no visible key: their O is NaN), for positions [y0, y0 + n) of o's
// memory order: with the heads interleaved ([B, T, H, w] memory, as the projections hand q over and O
// follows it), y runs (b, t, h), so consecutive rows are adjacent in memory; else (b, h, t). (Taken in
// (b, h, t) order, those rows lie H·w apart, and each w-wide piece of a page is read at another time:
// the pass took ~3× its time on contiguous operands.) Any order gives each D the same bits.
template <class I, class T>
void rows_dot(T* D, const T* lse, int64_t y0, int64_t n, const Rows<T>& o, const Rows<T>& g, int64_t H, int64_t Tn, int64_t w) {
  const bool heads_inner = H > 1 && Tn > 1 && o.sh < o.st;
  for (int64_t y = y0; y < y0 + n; ++y) {
    int64_t b, h, t;
    if (heads_inner) {
      h = y % H;
      t = y / H % Tn;
      b = y / (H * Tn);
    } else {
      t = y % Tn;
      h = y / Tn % H;
      b = y / (Tn * H);
    }
    const int64_t x = (b * H + h) * Tn + t;
    D[x] = lse[x] == -std::numeric_limits<T>::infinity() ? T(0) : dot(I{}, o.row(b, h, t), g.row(b, h, t), w);
  }
}

// The variants for this call.
template <class T> struct TileKernels {
  decltype(&tile_softmax<Baseline, T>) softmax = pick<tile_softmax<Baseline, T>, tile_softmax<Avx2, T>, tile_softmax<Avx512, T>>();
  decltype(&softmax_update<Baseline, T>) update = pick<softmax_update<Baseline, T>, softmax_update<Avx2, T>, softmax_update<Avx512, T>>();
  decltype(&tile_finish<Baseline, T>) finish = pick<tile_finish<Baseline, T>, tile_finish<Avx2, T>, tile_finish<Avx512, T>>();
  decltype(&tile_probs<Baseline, T>) probs = pick<tile_probs<Baseline, T>, tile_probs<Avx2, T>, tile_probs<Avx512, T>>();
  decltype(&tile_ds<Baseline, T>) ds = pick<tile_ds<Baseline, T>, tile_ds<Avx2, T>, tile_ds<Avx512, T>>();
  decltype(&tile_cap_ds<Baseline, T>) cap_ds = pick<tile_cap_ds<Baseline, T>, tile_cap_ds<Avx2, T>, tile_cap_ds<Avx512, T>>();
  decltype(&tile_combine<Baseline, T>) combine = pick<tile_combine<Baseline, T>, tile_combine<Avx2, T>, tile_combine<Avx512, T>>();
  decltype(&rows_dot<Baseline, T>) dot = pick<rows_dot<Baseline, T>, rows_dot<Avx2, T>, rows_dot<Avx512, T>>();
  decltype(&transpose_tile<Baseline, T>) transpose = pick<transpose_tile<Baseline, T>, transpose_tile<Avx2, T>>();
  TileGemmF32 f32_gemm = std::is_same_v<T, float> ? pick_tile_gemm() : nullptr;
  TileEpF32<EpProbs> f32_probs = std::is_same_v<T, float> ? pick_tile_probs() : nullptr;
  TileEpF32<EpDs> f32_ds = std::is_same_v<T, float> ? pick_tile_ds() : nullptr;
  TileEpF32<EpSoftmax> f32_softmax = std::is_same_v<T, float> ? pick_tile_softmax() : nullptr;
  // The forward's S = alpha · A B with the online-softmax step in the epilogue (tile_softmax; rows of at
  // most 64 keys, no padding, no user mask); false: not available here.
  bool mm_softmax(int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, const T* m,
                  T* mn, T* sum, int64_t vis0) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!f32_softmax || N > 64) return false;
      f32_softmax(M, N, K, a, lda, b, ldb, c, ldc, EpSoftmax{alpha, m, mn, sum, vis0});
      return true;
    }
    return false;
  }
  // The backward's products with their row work in the epilogue (f32 kernels only, NN form): P = exp(S −
  // LSE) straight from S = alpha · A B (tile_probs: no padding, no user mask), and dS from dP = A B
  // (tile_ds). False: not available here, the caller runs the product and the row pass.
  bool mm_probs(int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, const T* lse,
                int64_t vis0) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!f32_probs) return false;
      f32_probs(M, N, K, a, lda, b, ldb, c, ldc, EpProbs{alpha, lse, vis0});
      return true;
    }
    return false;
  }
  bool mm_ds(int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, const EpDs& ep) const {
    if constexpr (std::is_same_v<T, float>) {
      if (!f32_ds) return false;
      f32_ds(M, N, K, a, lda, b, ldb, c, ldc, ep);
      return true;
    }
    return false;
  }
  // A tile product C = alpha · op(A) · op(B) + beta · C: the f32 kernels above where B is not
  // transposed and the ISA has them, else OpenBLAS (f64, baseline, the NT form of decoding tiles).
  void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
          int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (f32_gemm && !tb) {
        f32_gemm(ta, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    gemm<T>(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

// ---------------------------------------------------------------------------------- problem
template <class T> struct Problem {
  Rows<T> q, k, v;
  int64_t B = 0, H = 0, Hkv = 0, T_ = 0, S = 0, d = 0, dv = 0, rep = 1;
  T scale = 1;
  T cap = 0;  // the soft cap (0: none): attention only, never a differential branch
  bool causal = false;
  int64_t pos0 = 0;
  const bool* kp = nullptr;     // [B, S] contiguous or nullptr
  const T* madd = nullptr;      // the user's mask, [B, H, T, S] strides msb, msh, mst, mss: additive
  const bool* mkeep = nullptr;  // or bool
  int64_t msb = 0, msh = 0, mst = 0, mss = 0;
  Problem(Cpu::V q_, Cpu::V k_, Cpu::V v_) : q(q_), k(k_), v(v_) {}

  const bool* kp_row(int64_t b) const { return kp ? kp + b * S : nullptr; }
  // The user's mask over the tile with origin (query i0, key j0) of (b, h).
  TileMask<T> tile_mask(int64_t b, int64_t h, int64_t i0, int64_t j0) const {
    const int64_t off = b * msb + h * msh + i0 * mst + j0 * mss;
    return {madd ? madd + off : nullptr, mkeep ? mkeep + off : nullptr, mst, mss};
  }
  // Keys [0, kend) are visible to some query of [i0, i0 + br).
  int64_t key_end(int64_t i0, int64_t br) const { return causal ? std::min(S, pos0 + i0 + br) : S; }
};

// Calls f(r0, rb, bcs) for the row blocks of the (query tile [i0, i0 + br), key tile [j0, j0 + bc))
// pair: the whole tile, or, when the tile crosses the causal diagonal, blocks of `rows` rows, each
// with the bcs <= bc keys its last row can see (blocks that see none are skipped: their rows get
// nothing from this tile).
template <class T, class F> void for_diag_blocks(const Problem<T>& P, int64_t rows, int64_t i0, int64_t br, int64_t j0, int64_t bc, F&& f) {
  if (!P.causal || j0 + bc - 1 <= P.pos0 + i0 || br <= rows) {
    f(int64_t{0}, br, bc);
    return;
  }
  for (int64_t r0 = 0; r0 < br; r0 += rows) {
    const int64_t rb = std::min(rows, br - r0), bcs = std::min(bc, P.key_end(i0 + r0, rb) - j0);
    if (bcs > 0) f(r0, rb, bcs);
  }
}

int threads_for(int64_t units) {
  if (omp_in_parallel()) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads(), units)));
}

// The forward keeps the key tiles it transposed (for the NN form of S = Q Kᵀ) in up to kKtSlots
// slots per thread, tagged with (batch, kv head, tile), so the query tiles and GQA heads of one kv
// head transpose each key tile once (a thread takes all query tiles of a (batch, head) together when
// the (batch, head) pairs share out evenly over the threads).
constexpr int64_t kKtSlots = 16;

template <class T> void forward(const Problem<T>& P, const OutRows<T>& o, T* lse) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const int64_t nqt = (P.T_ + kBr - 1) / kBr, nkt = (P.S + kBc - 1) / kBc;
  const int64_t units = P.B * P.H * nqt;
  const int nt = threads_for(units);
  // units per grab: a whole (batch, head) where those share out evenly (or nearly: 8 per thread)
  const int64_t chunk = P.B * P.H % nt == 0 || P.B * P.H >= 8 * nt ? nqt : 1;
  const int64_t slots = std::clamp<int64_t>(nkt, 1, kKtSlots);
  const TileKernels<T> K;
  const size_t per_thread = static_cast<size_t>(kBr * kBc + 4 * kBr + slots * P.d * kBc);
  // scratch: every element is written before it is read (from the host cache, not zeroed)
  HostStorage scratch(static_cast<size_t>(nt) * per_thread * sizeof(T));
  std::vector<int64_t> tags(static_cast<size_t>(nt * slots), -1);
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    T* s = scratch.as<T>() + static_cast<size_t>(tid) * per_thread;
    T* m = s + kBr * kBc;
    T* l = m + kBr;
    T* mn = l + kBr;  // a block's new row maxima and sums of P (mm_softmax)
    T* rsum = mn + kBr;
    T* kts = rsum + kBr;  // transposed key tiles: slots × [d, kBc]
    int64_t* tag = tags.data() + static_cast<size_t>(tid) * static_cast<size_t>(slots);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t qt = nqt - 1 - u % nqt, bh = u / nqt, b = bh / P.H, h = bh % P.H, hk = h / P.rep;
      const int64_t i0 = qt * kBr, br = std::min(kBr, P.T_ - i0);
      T* orow = o.row(b, h, i0);
      const int64_t kend = P.key_end(i0, br);
      if (kend <= 0) o.zero(b, h, i0, br, P.dv);             // else the first key tile's P·V writes every row (beta 0)
      prefetch_rows(P.q.row(b, h, i0), P.q.ld, 0, br, P.d);  // (read by the first S product, after K's transpose)
      std::fill(m, m + br, ninf);
      std::fill(l, l + br, T(0));
      const bool* kp = P.kp_row(b);
      for (int64_t j0 = 0; j0 < kend; j0 += kBc) {
        const int64_t bc = std::min(kBc, kend - j0);
        const bool nn = br >= kMinRowsT;
        const bool fused = nn && !kp && !P.madd && !P.mkeep && P.cap == 0;  // the softmax step in the S product's epilogue
        const int64_t jt = j0 / kBc;
        T* kt = kts + (jt % slots) * P.d * kBc;
        if (nn && tag[jt % slots] != (b * P.Hkv + hk) * nkt + jt) {  // the whole tile, whatever this query tile sees of it
          K.transpose(P.k.row(b, hk, j0), P.k.ld, kt, kBc, std::min(kBc, P.S - j0), P.d);
          tag[jt % slots] = (b * P.Hkv + hk) * nkt + jt;
        }
        prefetch_rows(P.v.row(b, hk, j0), P.v.ld, 0, bc, P.dv);  // (read by the P·V products, after S)
        for_diag_blocks(P, kDiagRows, i0, br, j0, bc, [&](int64_t r0, int64_t rb, int64_t bcs) {
          const int64_t ii = i0 + r0;
          const bool diag = P.causal && j0 + bcs - 1 > P.pos0 + ii;  // some key of the block is hidden from its row 0
          T* ob = orow + r0 * o.ld;
          const bool first = j0 == 0;  // every block of key tile 0 sees a key: its product writes the rows
          if (fused && K.mm_softmax(rb, bcs, P.d, P.scale, P.q.row(b, h, ii), P.q.ld, kt, kBc, s, kBc, m + r0, mn, rsum,
                                    diag ? P.pos0 + ii - j0 + 1 : bcs)) {
            K.update(m + r0, l + r0, mn, rsum, first ? nullptr : ob, o.ld, rb, P.dv);
          } else {
            if (nn)
              K.mm(false, false, rb, bcs, P.d, P.scale, P.q.row(b, h, ii), P.q.ld, kt, kBc, T(0), s, kBc);
            else
              K.mm(false, true, rb, bcs, P.d, P.scale, P.q.row(b, h, ii), P.q.ld, P.k.row(b, hk, j0), P.k.ld, T(0), s, kBc);
            K.softmax(s, kBc, rb, bcs, ii, j0, diag, P.pos0, kp, P.tile_mask(b, h, ii, j0), P.cap, m + r0, l + r0, first ? nullptr : ob,
                      o.ld, P.dv);
          }
          K.mm(false, false, rb, P.dv, bcs, T(1), s, kBc, P.v.row(b, hk, j0), P.v.ld, T(first ? 0 : 1), ob, o.ld);
        });
      }
      K.finish(orow, o.ld, lse + bh * P.T_ + i0, m, l, br, P.dv);
    }
  }
}

// The softmax maps of one backward pass over one V: one (attention) or two (differential attention,
// core/fused_diff_attention.hpp: dO1 = dO, dO2 = −λ·dO, so dV = (P1 − λ P2)ᵀ dO and one dP = dO Vᵀ
// serves both). Branch x has its own q, k (P[x]; P[0] carries the shared sizes, v and masks), LSE,
// row values D[x] and dS factor: dS_x = dsf[x] · scale · P_x ⊙ (dP − D_x).
template <class T> struct Branches {
  int n = 1;
  const Problem<T>* P[2] = {};
  const T* lse[2] = {};
  const T* D[2] = {};
  T dsf[2] = {1, 1};
  T lam = 0;
  OutRows<T> dq[2], dk[2];
};

// Per-thread scratch of the backward: the score tiles s[x], dp, the soft cap's derivative cf, and the key
// tile's Kᵀ per branch and Vᵀ.
template <class T> struct BwdScratch {
  T* s[2] = {};
  T* dp = nullptr;
  T* cf = nullptr;
  T* kt[2] = {};
  T* vt = nullptr;
  static size_t size(int n, int64_t d, int64_t dv) { return static_cast<size_t>(((n + 2) * kBrB + n * d + dv) * kBcB); }
  BwdScratch(T* p, int n, int64_t d) {
    for (int x = 0; x < n; ++x, p += kBrB * kBcB) s[x] = p;
    dp = p;
    p += kBrB * kBcB;
    cf = p;
    p += kBrB * kBcB;
    for (int x = 0; x < n; ++x, p += d * kBcB) kt[x] = p;
    vt = p;
  }
};

// One key tile [j0, j0 + bc) of (b, hk): writes dk (each branch's), dv (rows of that tile, which arrive
// uninitialised: the first block's products write them, beta 0, after zeroing the rows it does not
// reach) and accumulates into dq[x] (the output's rows or a thread's private [B, H, T, d] buffers;
// dq_first: dq's rows arrive uninitialised, and this tile, key tile 0, writes every one of them).
template <class T> void backward_key_tile(const Branches<T>& X, const TileKernels<T>& K, const Rows<T>& g, int64_t b, int64_t hk,
                                          int64_t j0, const OutRows<T>& dv, const OutRows<T>* dq, bool dq_first, const BwdScratch<T>& w) {
  const Problem<T>& P = *X.P[0];
  const int64_t bc = std::min(kBcB, P.S - j0);
  const bool* kp = P.kp_row(b);
  T* dv_t = dv.row(b, hk, j0);
  const int64_t i_first = P.causal ? std::max<int64_t>(0, j0 - P.pos0) : 0;  // queries that see key j0 or later
  const bool nn = P.rep * (P.T_ - i_first) >= kMinRowsT;                     // enough query rows: Kᵀ and Vᵀ of the tile, NN products
  for (int x = 0; x < X.n; ++x)                                              // the first block's q rows (read after the transposes)
    prefetch_rows(X.P[x]->q.row(b, hk * P.rep, 0), X.P[x]->q.ld, i_first, std::min(P.T_, i_first + 16), P.d);
  if (nn) {
    for (int x = 0; x < X.n; ++x) K.transpose(X.P[x]->k.row(b, hk, j0), X.P[x]->k.ld, w.kt[x], kBcB, bc, P.d);
    K.transpose(P.v.row(b, hk, j0), P.v.ld, w.vt, kBcB, bc, P.dv);
  }
  // The row work in the products' epilogues where the f32 kernels run them (NN form, no padding, no user mask).
  const bool fused = nn && !kp && !P.madd && !P.mkeep && P.cap == 0;
  bool kv_written = false;
  for (int64_t hr = 0; hr < P.rep; ++hr) {
    const int64_t h = hk * P.rep + hr, bh = b * P.H + h;
    for (int64_t it = i_first; it < P.T_; it += kBrB) {
      for_diag_blocks(P, kDiagRowsB, it, std::min(kBrB, P.T_ - it), j0, bc, [&](int64_t r0, int64_t br, int64_t n) {  // n keys of the tile
        const int64_t i0 = it + r0;
        const T kv_beta = kv_written ? T(1) : T(0);
        if (!kv_written) {  // the first block: its products write rows [0, n) of the tile; the rest start at zero
          for (int x = 0; x < X.n; ++x) X.dk[x].zero(b, hk, j0 + n, bc - n, P.d);
          dv.zero(b, hk, j0 + n, bc - n, P.dv);
          kv_written = true;
        }
        const bool diag = P.causal && j0 + n - 1 > P.pos0 + i0;
        prefetch_rows(g.row(b, h, i0), g.ld, 0, br, P.dv);  // (dO: read by dV += Pᵀ dO, after the S products)
        for (int x = 0; x < X.n; ++x)                       // the next 16 rows of q (the next block's S product)
          prefetch_rows(X.P[x]->q.row(b, h, 0), X.P[x]->q.ld, std::min(P.T_, i0 + br), std::min(P.T_, i0 + br + 16), P.d);
        for (int x = 0; x < X.n; ++x) {  // P_x = exp(S_x − LSE_x)
          const Problem<T>& Px = *X.P[x];
          const T* lse = X.lse[x] + bh * P.T_ + i0;
          if (fused && K.mm_probs(br, n, P.d, P.scale, Px.q.row(b, h, i0), Px.q.ld, w.kt[x], kBcB, w.s[x], kBcB, lse,
                                  diag ? P.pos0 + i0 - j0 + 1 : n))
            continue;
          if (nn)
            K.mm(false, false, br, n, P.d, P.scale, Px.q.row(b, h, i0), Px.q.ld, w.kt[x], kBcB, T(0), w.s[x], kBcB);
          else
            K.mm(false, true, br, n, P.d, P.scale, Px.q.row(b, h, i0), Px.q.ld, Px.k.row(b, hk, j0), Px.k.ld, T(0), w.s[x], kBcB);
          K.probs(w.s[x], kBcB, br, n, lse, i0, j0, diag, P.pos0, kp, P.tile_mask(b, h, i0, j0), Px.cap, w.cf);
        }
        const T* grow = g.row(b, h, i0);
        const T* pv = w.s[0];
        if (X.n == 2) {  // the map that multiplies V: P1 − λ P2 (in dp until dP overwrites it)
          K.combine(w.s[0], w.s[1], w.dp, kBcB, br, n, X.lam);
          pv = w.dp;
        }
        K.mm(true, false, n, P.dv, br, T(1), pv, kBcB, grow, g.ld, kv_beta, dv_t, dv.ld);  // dV += Pᵀ dO
        bool ds_done = false;  // dS (scaled) of every branch, from dP = dO Vᵀ in the product's epilogue
        if constexpr (std::is_same_v<T, float>) {
          if (fused) {
            const bool two = X.n == 2;
            const EpDs e{X.D[0] + bh * P.T_ + i0,         X.dsf[0] * P.scale,
                         two ? w.s[1] : nullptr,          two ? X.D[1] + bh * P.T_ + i0 : nullptr,
                         two ? X.dsf[1] * P.scale : 0.0f, kBcB};
            ds_done = K.mm_ds(br, n, P.dv, grow, g.ld, w.vt, kBcB, w.s[0], kBcB, e);
          }
        }
        if (ds_done) {
        } else if (nn) {
          K.mm(false, false, br, n, P.dv, T(1), grow, g.ld, w.vt, kBcB, T(0), w.dp, kBcB);  // dP = dO Vᵀ
        } else {
          K.mm(false, true, br, n, P.dv, T(1), grow, g.ld, P.v.row(b, hk, j0), P.v.ld, T(0), w.dp, kBcB);
        }
        for (int x = 0; x < X.n; ++x) {
          const Problem<T>& Px = *X.P[x];
          if (!ds_done) K.ds(w.s[x], w.dp, kBcB, br, n, X.D[x] + bh * P.T_ + i0, X.dsf[x] * P.scale);  // dS (scaled)
          if (Px.cap > 0) K.cap_ds(w.s[x], w.cf, kBcB, br, n);                                         // through the soft cap
          K.mm(true, false, n, P.d, br, T(1), w.s[x], kBcB, Px.q.row(b, h, i0), Px.q.ld, kv_beta, X.dk[x].row(b, hk, j0),
               X.dk[x].ld);  // dK += dSᵀ Q
          K.mm(false, false, br, P.d, n, T(1), w.s[x], kBcB, Px.k.row(b, hk, j0), Px.k.ld, T(dq_first ? 0 : 1), dq[x].row(b, h, i0),
               dq[x].ld);  // dQ += dS K
        }
      });
    }
  }
  if (!kv_written) {  // no query sees this tile
    for (int x = 0; x < X.n; ++x) X.dk[x].zero(b, hk, j0, bc, P.d);
    dv.zero(b, hk, j0, bc, P.dv);
  }
}

// The backward pass of X's branches. X.D is filled here: D_x = rowsum(dO ⊙ O_x) (0 for rows with no
// visible key: their O is NaN); with two branches o is the combined O = O1 − λ O2 and o2 is O2, so
// D_1 = rowsum(dO ⊙ O) + λ E, D_2 = E = rowsum(dO ⊙ O2) (dO2 = −λ dO is folded into dsf[1] = −λ), and
// *dlam = −Σ E.
// (X.D already set: the caller ran that pass, as the head-wise norm's backward does with its own, and
// set dsf[1] and *dlam; o, o2 and dlam are then unused.)
template <class T> void backward(Branches<T> X, const Rows<T>& o, const Rows<T>* o2, const Rows<T>& g, const OutRows<T>& dv, T* dlam) {
  const Problem<T>& P = *X.P[0];
  const int64_t rows = P.B * P.H * P.T_;
  // D's rows pass runs in the key tiles' parallel region below (one fork and join per call, not two:
  // with libgomp's short spin, each region wakes the sleeping threads again), before its first barrier.
  std::vector<T> D(X.D[0] ? 0 : static_cast<size_t>(X.n * rows));
  const TileKernels<T> K;
  if (!D.empty()) {
    for (int x = 0; x < X.n; ++x) X.D[x] = D.data() + x * rows;
    if (X.n == 2) X.dsf[1] = -X.lam;
  }
  constexpr int64_t kDotRows = 64;  // rows per share of D's pass (each row's D is one dot product: any split gives its bits)
  auto rows_pass = [&] {
#pragma omp for schedule(static)
    for (int64_t c = 0; c < (rows + kDotRows - 1) / kDotRows; ++c) {
      const int64_t rb = c * kDotRows, n = std::min(kDotRows, rows - rb);
      K.dot(D.data(), X.lse[0], rb, n, o, g, P.H, P.T_, P.dv);
      if (X.n == 2) K.dot(D.data() + rows, X.lse[1], rb, n, *o2, g, P.H, P.T_, P.dv);
    }
    // (implicit barrier) the two branches' D1 += λ E and dλ = −Σ E, in row order on one thread
    if (X.n == 2) {
#pragma omp single
      {
        T e = 0;
        for (int64_t x = 0; x < rows; ++x) {
          D[static_cast<size_t>(x)] += X.lam * D[static_cast<size_t>(rows + x)];
          e += D[static_cast<size_t>(rows + x)];
        }
        *dlam = -e;
      }
    }
  };

  const int64_t nkt = (P.S + kBcB - 1) / kBcB;
  const int64_t units = P.B * P.Hkv;
  const int nt_max = threads_for(units * nkt);
  const bool per_unit = units >= nt_max;  // enough (batch, kv head) units: no shared dQ rows
  const int nt = per_unit ? threads_for(units) : nt_max;
  const size_t tile = BwdScratch<T>::size(X.n, P.d, P.dv);
  HostStorage scratch(static_cast<size_t>(nt) * tile * sizeof(T));  // written before read: not zeroed
  const size_t nq = static_cast<size_t>(rows * P.d);
  std::vector<T> priv(per_unit ? 0 : static_cast<size_t>(nt * X.n) * nq, T(0));
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    const BwdScratch<T> w(scratch.as<T>() + static_cast<size_t>(tid) * tile, X.n, P.d);
    if (!D.empty()) rows_pass();
    if (per_unit) {  // a unit owns dk, dv of (b, hk) and dq of its group's query heads, written by its first products
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; ++u) {
        const int64_t b = u / P.Hkv, hk = u % P.Hkv;
        if (nkt == 0)  // no keys: dq is zero; else key tile 0 writes all of dq's rows (every query sees key 0)
          for (int x = 0; x < X.n; ++x)
            for (int64_t hr = 0; hr < P.rep; ++hr) X.dq[x].zero(b, hk * P.rep + hr, 0, P.T_, P.d);
        for (int64_t jt = 0; jt < nkt; ++jt) backward_key_tile(X, K, g, b, hk, jt * kBcB, dv, X.dq, jt == 0, w);
      }
    } else {  // a work item owns dk, dv of its key tile; dq goes to the thread's private buffers
      OutRows<T> mine[2];
      for (int x = 0; x < X.n; ++x)
        mine[x] = OutRows<T>(priv.data() + static_cast<size_t>(tid * X.n + x) * nq, P.H * P.T_ * P.d, P.T_ * P.d, P.d, P.d);
        // static: which key tiles a thread adds into its dQ buffer must not depend on timing, or dq's
        // last bits would change from run to run (the buffers are summed in thread order below)
#pragma omp for schedule(static, 1)
      for (int64_t wi = 0; wi < units * nkt; ++wi) {
        const int64_t u = wi / nkt, jt = wi % nkt, b = u / P.Hkv, hk = u % P.Hkv;
        backward_key_tile(X, K, g, b, hk, jt * kBcB, dv, mine, false, w);
      }
      // (implicit barrier) sum the private dQ buffers into dq's rows
      const int team = omp_get_num_threads();
#pragma omp for schedule(static)
      for (int64_t xr = 0; xr < rows; ++xr) {
        const int64_t t = xr % P.T_, bh = xr / P.T_;
        for (int x = 0; x < X.n; ++x) {
          T* out = X.dq[x].row(bh / P.H, bh % P.H, t);
          for (int64_t c = 0; c < P.d; ++c) {
            T acc = 0;
            for (int th = 0; th < team; ++th) acc += priv[static_cast<size_t>(th * X.n + x) * nq + static_cast<size_t>(xr * P.d + c)];
            out[c] = acc;
          }
        }
      }
    }
  }
}

// An output the kernels can write: rank 4, unit-stride rows that do not overlap (row stride >= width).
bool out_rows(const Cpu::M& m) {
  const Layout& l = m.layout;
  return l.rank() == 4 && (l.shape[3] <= 1 || l.strides[3] == 1) && (l.shape[2] <= 1 || l.strides[2] >= l.shape[3]);
}

void check_views(const char* op, std::initializer_list<Cpu::V> vs, DType dt) {
  for (const Cpu::V& v : vs) {
    KILN_CHECK(v.dtype == dt && v.layout.rank() == 4 && (v.layout.shape[3] <= 1 || v.layout.strides[3] == 1),
               "{}: needs {} [B, H, N, w] operands with unit-stride rows, got {} {}", op, dt, v.dtype, shape_str(v.layout.shape));
  }
}

template <class T> Problem<T> make_problem(Cpu::V q, Cpu::V k, Cpu::V v, const Cpu::V* key_padding, const Cpu::V* mask, double scale,
                                           bool causal, int64_t pos0) {
  Problem<T> P(q, k, v);
  const Shape &qs = q.layout.shape, &ks = k.layout.shape, &vs = v.layout.shape;
  P.B = qs[0];
  P.H = qs[1];
  P.T_ = qs[2];
  P.d = qs[3];
  P.Hkv = ks[1];
  P.S = ks[2];
  P.dv = vs[3];
  KILN_CHECK(ks[0] == P.B && vs[0] == P.B && ks[3] == P.d && vs[1] == P.Hkv && vs[2] == P.S && P.Hkv >= 1 && P.H % P.Hkv == 0,
             "attention: q {}, k {}, v {} do not fit", shape_str(qs), shape_str(ks), shape_str(vs));
  P.rep = P.H / P.Hkv;
  P.scale = static_cast<T>(scale);
  P.causal = causal;
  P.pos0 = pos0;
  if (key_padding) {
    KILN_CHECK(
        key_padding->dtype == DType::boolean && key_padding->layout.is_contiguous() && key_padding->layout.shape == Shape({P.B, P.S}),
        "attention: key_padding must be a contiguous bool [{}, {}], got {} {}", P.B, P.S, key_padding->dtype,
        shape_str(key_padding->layout.shape));
    P.kp = key_padding->storage.as<bool>() + key_padding->layout.offset;
  }
  if (mask) {
    KILN_CHECK((mask->dtype == DType::boolean || mask->dtype == q.dtype) && mask->layout.shape == Shape({P.B, P.H, P.T_, P.S}),
               "attention: mask must be a bool or {} [{}, {}, {}, {}] view, got {} {}", q.dtype, P.B, P.H, P.T_, P.S, mask->dtype,
               shape_str(mask->layout.shape));
    const Layout& l = mask->layout;
    P.msb = l.strides[0];
    P.msh = l.strides[1];
    P.mst = l.strides[2];
    P.mss = l.strides[3];
    if (mask->dtype == DType::boolean)
      P.mkeep = mask->storage.as<bool>() + l.offset;
    else
      P.madd = mask->storage.as<T>() + l.offset;
  }
  return P;
}

// The outputs of a forward: o [B, H, T, dv] with unit-stride rows, lse a contiguous [B, H, T].
void check_forward_outputs(const char* op, const Cpu::M& o, const Cpu::M& lse, const Cpu::V& q, const Cpu::V& v) {
  KILN_CHECK(q.dtype == DType::f32 || q.dtype == DType::f64, "{}: cpu kernel takes f32 or f64, got {}", op, q.dtype);
  KILN_CHECK(out_rows(o) && lse.layout.is_contiguous() && o.dtype == q.dtype && lse.dtype == q.dtype &&
                 o.layout.shape == Shape({q.layout.shape[0], q.layout.shape[1], q.layout.shape[2], v.layout.shape[3]}) &&
                 lse.layout.shape == Shape({q.layout.shape[0], q.layout.shape[1], q.layout.shape[2]}),
             "{}: outputs o {} and lse {} must be [B, H, T, dv] with unit-stride rows and a contiguous [B, H, T] (q {}, v {})", op,
             shape_str(o.layout.shape), shape_str(lse.layout.shape), shape_str(q.layout.shape), shape_str(v.layout.shape));
}

// The outputs of a backward: dq, dk, dv with unit-stride rows and the shapes of q, k, v.
void check_backward_outputs(const char* op, const Cpu::M& dq, const Cpu::M& dk, const Cpu::M& dv, const Cpu::V& q, const Cpu::V& k,
                            const Cpu::V& v, const Cpu::V& o, const Cpu::V& dout, const Cpu::V& lse) {
  KILN_CHECK(q.dtype == DType::f32 || q.dtype == DType::f64, "{}: cpu kernel takes f32 or f64, got {}", op, q.dtype);
  KILN_CHECK(out_rows(dq) && out_rows(dk) && out_rows(dv) && lse.layout.is_contiguous() && dq.layout.shape == q.layout.shape &&
                 dk.layout.shape == k.layout.shape && dv.layout.shape == v.layout.shape && o.layout.shape == dout.layout.shape &&
                 lse.dtype == q.dtype,
             "{}: dq {}, dk {}, dv {} must have unit-stride rows and the shapes of q {}, k {}, v {}", op, shape_str(dq.layout.shape),
             shape_str(dk.layout.shape), shape_str(dv.layout.shape), shape_str(q.layout.shape), shape_str(k.layout.shape),
             shape_str(v.layout.shape));
}

// The second branch of differential attention has the first's shapes and dtype.
void check_branches(const char* op, const Cpu::V& a, const Cpu::V& b) {
  KILN_CHECK(a.layout.shape == b.layout.shape && a.dtype == b.dtype, "{}: the branches' operands differ: {} {} and {} {}", op,
             shape_str(a.layout.shape), a.dtype, shape_str(b.layout.shape), b.dtype);
}

template <class T> T scalar_of(const Cpu::V& x) {
  KILN_CHECK(x.layout.numel() == 1 && x.dtype == dtype_of<T>, "diff_attention: lambda must be one {} element, got {} {}", dtype_of<T>,
             x.dtype, shape_str(x.layout.shape));
  return x.storage.as<T>()[x.layout.offset];
}

// ------------------------------------------------------------------- differential attention's epilogue
// The head-wise norm (core/fused_diff_attention.hpp): Y = O·r·wc per row of O, r = 1/√(mean(O²) + eps).
template <class T> struct NormOut {
  OutRows<T> y;
  T* rstd = nullptr;  // [B, H, T]
  const T* wc = nullptr;
  double eps = 0;
};

// Rows [rb, re) of O = O1 − λ O2 (out holds O1, out2 O2), then the norm's rows where nrm is given.
template <class I, class T>
void combine_chunk(const Problem<T>* P, const OutRows<T>* out, const OutRows<T>* out2, T l, const NormOut<T>* nrm, int64_t rb, int64_t re) {
  const int64_t dv = P->dv;
  for (int64_t x = rb; x < re; ++x) {
    const int64_t t = x % P->T_, bh = x / P->T_, b = bh / P->H, h = bh % P->H;
    T* a = out->row(b, h, t);
    const T* c = out2->row(b, h, t);
    for (int64_t i = 0; i < dv; ++i) a[i] -= l * c[i];
    if (!nrm) continue;
    const T r = T(1) / std::sqrt(dot(I{}, a, a, dv) / static_cast<T>(dv) + static_cast<T>(nrm->eps));
    nrm->rstd[x] = r;
    T* y = nrm->y.row(b, h, t);
    const T* w = nrm->wc;
    for (int64_t i = 0; i < dv; ++i) y[i] = a[i] * r * w[i];
  }
}

template <class T> void combine_rows(const Problem<T>& P, const OutRows<T>& out, const OutRows<T>& out2, T l, const NormOut<T>* nrm) {
  const auto k = pick<combine_chunk<Baseline, T>, combine_chunk<Avx2, T>, combine_chunk<Avx512, T>>();
  parallel_for(
      P.B * P.H * P.T_, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(P.dv, 1)),
      [&](int64_t rb, int64_t re) { k(&P, &out, &out2, l, nrm, rb, re); }, 1);
}

// The operands of the norm's backward (norm_rows_backward below).
template <class T> struct NormBwd {
  const Problem<T>* P;
  Rows<T> o, o2, dy;
  const T *rstd, *wc, *lse;
  T lam;
  OutRows<T> go;
  T *D1, *D2;
  static constexpr int64_t kBlock = 64;  // rows per partial sum
};

// Block k of kBlock rows: dO, D1, D2 per row, and the block's sums of dY ⊙ O·r (part[0, dv)) and of the
// live rows' E (part[dv]).
template <class I, class T> void norm_bwd_block(const NormBwd<T>* A, int64_t k, T* part) {
  const Problem<T>& P = *A->P;
  const int64_t rows = P.B * P.H * P.T_, dv = P.dv;
  std::fill(part, part + dv + 1, T(0));
  for (int64_t x = k * A->kBlock; x < std::min(rows, (k + 1) * A->kBlock); ++x) {
    const int64_t t = x % P.T_, bh = x / P.T_, b = bh / P.H, h = bh % P.H;
    const T *a = A->o.row(b, h, t), *a2 = A->o2.row(b, h, t), *gy = A->dy.row(b, h, t), *w = A->wc;
    T* d = A->go.row(b, h, t);
    const T r = A->rstd[x];
    for (int64_t i = 0; i < dv; ++i) {
      d[i] = gy[i] * w[i];
      part[i] += gy[i] * a[i] * r;
    }
    const T f = r * r * r * dot(I{}, d, a, dv) / static_cast<T>(dv);
    for (int64_t i = 0; i < dv; ++i) d[i] = r * d[i] - a[i] * f;
    T d1, e;
    dot2(I{}, d, a, a2, dv, d1, e);
    const bool live = A->lse[x] != -std::numeric_limits<T>::infinity();
    A->D1[x] = live ? d1 + A->lam * e : T(0);
    A->D2[x] = live ? e : T(0);
    if (live) part[dv] += e;
  }
}

// The norm's backward with the differential backward's row pass, for every row x of [B·H·T]:
//   g = dY ⊙ wc, m = mean(g ⊙ O), dO = r·g − O·r³·m (into go, a contiguous [B, H, T, dv]),
//   E = rowsum(dO ⊙ O2), D1 = rowsum(dO ⊙ O) + λ E, D2 = E (0 for rows with no visible key),
//   dwc = Σ_x dY ⊙ O·r,  dλ = −Σ_x E.
// The sums over rows go through fixed blocks of rows (summed in order, in f64), so they do not depend
// on the thread count.
template <class T> void norm_rows_backward(const NormBwd<T>& A, T* dwc, T* dlam) {
  const Problem<T>& P = *A.P;
  const int64_t rows = P.B * P.H * P.T_, nblk = (rows + A.kBlock - 1) / A.kBlock, dv = P.dv;
  std::vector<T> part(static_cast<size_t>(nblk * (dv + 1)));
  const auto k = pick<norm_bwd_block<Baseline, T>, norm_bwd_block<Avx2, T>, norm_bwd_block<Avx512, T>>();
  parallel_for(
      nblk, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(A.kBlock * dv, 1)),
      [&](int64_t kb, int64_t ke) {
        for (int64_t j = kb; j < ke; ++j) k(&A, j, part.data() + j * (dv + 1));
      },
      1);
  std::vector<double> acc(static_cast<size_t>(dv + 1), 0.0);
  for (int64_t j = 0; j < nblk; ++j)
    for (int64_t i = 0; i <= dv; ++i) acc[static_cast<size_t>(i)] += part[static_cast<size_t>(j * (dv + 1) + i)];
  for (int64_t i = 0; i < dv; ++i) dwc[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
  *dlam = static_cast<T>(-acc[static_cast<size_t>(dv)]);
}

// The checks and problems both differential entries share.
template <class T> struct DiffProblems {
  Problem<T> P1, P2;
  DiffProblems(const char* op, Cpu::V q1, Cpu::V q2, Cpu::V k1, Cpu::V k2, Cpu::V v, const Cpu::V* key_padding, const Cpu::V* mask,
               double scale, bool causal, int64_t pos0)
      : P1(make_problem<T>(q1, k1, v, key_padding, mask, scale, causal, pos0)),
        P2(make_problem<T>(q2, k2, v, key_padding, mask, scale, causal, pos0)) {
    check_views(op, {q1, q2, k1, k2, v}, q1.dtype);
    check_branches(op, q1, q2);
    check_branches(op, k1, k2);
  }
  // Both branches of the backward, writing dq1, dq2, dk1, dk2.
  Branches<T> branches(Cpu::M dq1, Cpu::M dq2, Cpu::M dk1, Cpu::M dk2, Cpu::V lse1, Cpu::V lse2, Cpu::V lam) const {
    Branches<T> X;
    X.n = 2;
    X.P[0] = &P1;
    X.P[1] = &P2;
    X.lse[0] = lse1.storage.as<T>() + lse1.layout.offset;
    X.lse[1] = lse2.storage.as<T>() + lse2.layout.offset;
    X.lam = scalar_of<T>(lam);
    X.dq[0] = OutRows<T>(dq1);
    X.dq[1] = OutRows<T>(dq2);
    X.dk[0] = OutRows<T>(dk1);
    X.dk[1] = OutRows<T>(dk2);
    return X;
  }
};

// A contiguous f32/f64 [n] vector (the norm's weight and its gradient).
void check_vector(const char* op, const char* what, const Cpu::V& x, DType dt, int64_t n) {
  KILN_CHECK(x.dtype == dt && x.layout.is_contiguous() && x.layout.shape == Shape({n}), "{}: {} must be a contiguous {} [{}], got {} {}",
             op, what, dt, n, x.dtype, shape_str(x.layout.shape));
}

}  // namespace

void Cpu::attention_forward(M o, M lse, V q, V k, V v, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0,
                            double softcap) {
  check_forward_outputs("attention_forward", o, lse, q, v);
  check_views("attention_forward", {q, k, v}, q.dtype);
  auto run = [&]<class T>(type_tag<T>) {
    Problem<T> P = make_problem<T>(q, k, v, key_padding, mask, scale, causal, pos0);
    P.cap = static_cast<T>(softcap);
    forward(P, OutRows<T>(o), lse.storage.as<T>() + lse.layout.offset);
  };
  if (q.dtype == DType::f32)
    run(type_tag<float>{});
  else
    run(type_tag<double>{});
}

void Cpu::attention_backward(M dq, M dk, M dv, V q, V k, V v, V o, V lse, V dout, const V* key_padding, const V* mask, double scale,
                             bool causal, int64_t pos0, double softcap) {
  check_backward_outputs("attention_backward", dq, dk, dv, q, k, v, o, dout, lse);
  check_views("attention_backward", {q, k, v, o, dout}, q.dtype);
  auto run = [&]<class T>(type_tag<T>) {
    Problem<T> P = make_problem<T>(q, k, v, key_padding, mask, scale, causal, pos0);
    P.cap = static_cast<T>(softcap);
    Branches<T> X;
    X.P[0] = &P;
    X.lse[0] = lse.storage.as<T>() + lse.layout.offset;
    X.dq[0] = OutRows<T>(dq);
    X.dk[0] = OutRows<T>(dk);
    backward<T>(X, Rows<T>(o), nullptr, Rows<T>(dout), OutRows<T>(dv), nullptr);
  };
  if (q.dtype == DType::f32)
    run(type_tag<float>{});
  else
    run(type_tag<double>{});
}

// Differential attention (core/fused_diff_attention.hpp): the two branches' flash forwards, then
// O = O1 − λ O2 row by row (and the head-wise norm in the same pass); the backward runs both branches
// in one pass over the key tiles (one dV and one dP product for both).
void Cpu::diff_attention_forward(M o, M o2, M lse1, M lse2, V q1, V q2, V k1, V k2, V v, V lam, const V* key_padding, const V* mask,
                                 double scale, bool causal, int64_t pos0) {
  const char* op = "diff_attention_forward";
  check_forward_outputs(op, o, lse1, q1, v);
  check_forward_outputs(op, o2, lse2, q1, v);
  float_types(q1.dtype, op, [&]<class T>(type_tag<T>) {
    const DiffProblems<T> X(op, q1, q2, k1, k2, v, key_padding, mask, scale, causal, pos0);
    const OutRows<T> out(o), out2(o2);
    forward(X.P1, out, lse1.storage.as<T>() + lse1.layout.offset);
    forward(X.P2, out2, lse2.storage.as<T>() + lse2.layout.offset);
    combine_rows<T>(X.P1, out, out2, scalar_of<T>(lam), nullptr);
  });
}

void Cpu::diff_attention_backward(M dq1, M dq2, M dk1, M dk2, M dv, M dlam, V q1, V q2, V k1, V k2, V v, V lam, V o, V o2, V lse1, V lse2,
                                  V dout, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0) {
  const char* op = "diff_attention_backward";
  check_backward_outputs(op, dq1, dk1, dv, q1, k1, v, o, dout, lse1);
  check_backward_outputs(op, dq2, dk2, dv, q2, k2, v, o2, dout, lse2);
  check_views(op, {o, o2, dout}, q1.dtype);
  KILN_CHECK(dlam.layout.numel() == 1 && dlam.dtype == q1.dtype, "{}: dlam must be one {} element, got {} {}", op, q1.dtype, dlam.dtype,
             shape_str(dlam.layout.shape));
  float_types(q1.dtype, op, [&]<class T>(type_tag<T>) {
    const DiffProblems<T> D(op, q1, q2, k1, k2, v, key_padding, mask, scale, causal, pos0);
    const Rows<T> r2(o2);
    backward(D.branches(dq1, dq2, dk1, dk2, lse1, lse2, lam), Rows<T>(o), &r2, Rows<T>(dout), OutRows<T>(dv),
             dlam.storage.as<T>() + dlam.layout.offset);
  });
}

void Cpu::diff_attention_norm_forward(M y, M rstd, M o, M o2, M lse1, M lse2, V q1, V q2, V k1, V k2, V v, V lam, V wc,
                                      const V* key_padding, const V* mask, double eps, double scale, bool causal, int64_t pos0) {
  const char* op = "diff_attention_norm_forward";
  check_forward_outputs(op, o, lse1, q1, v);
  check_forward_outputs(op, o2, lse2, q1, v);
  check_forward_outputs(op, y, rstd, q1, v);
  check_vector(op, "the norm's weight", wc, q1.dtype, v.layout.shape[3]);
  float_types(q1.dtype, op, [&]<class T>(type_tag<T>) {
    const DiffProblems<T> X(op, q1, q2, k1, k2, v, key_padding, mask, scale, causal, pos0);
    const OutRows<T> out(o), out2(o2);
    forward(X.P1, out, lse1.storage.as<T>() + lse1.layout.offset);
    forward(X.P2, out2, lse2.storage.as<T>() + lse2.layout.offset);
    const NormOut<T> nrm{OutRows<T>(y), rstd.storage.as<T>() + rstd.layout.offset, wc.storage.as<T>() + wc.layout.offset, eps};
    combine_rows<T>(X.P1, out, out2, scalar_of<T>(lam), &nrm);
  });
}

void Cpu::diff_attention_norm_backward(M dq1, M dq2, M dk1, M dk2, M dv, M dlam, M dwc, V q1, V q2, V k1, V k2, V v, V lam, V wc, V o, V o2,
                                       V lse1, V lse2, V rstd, V dy, const V* key_padding, const V* mask, double scale, bool causal,
                                       int64_t pos0) {
  const char* op = "diff_attention_norm_backward";
  check_backward_outputs(op, dq1, dk1, dv, q1, k1, v, o, dy, lse1);
  check_backward_outputs(op, dq2, dk2, dv, q2, k2, v, o2, dy, rstd);
  check_views(op, {o, o2, dy}, q1.dtype);
  KILN_CHECK(dlam.layout.numel() == 1 && dlam.dtype == q1.dtype, "{}: dlam must be one {} element, got {} {}", op, q1.dtype, dlam.dtype,
             shape_str(dlam.layout.shape));
  const int64_t width = v.layout.shape[3];
  check_vector(op, "the norm's weight", wc, q1.dtype, width);
  KILN_CHECK(dwc.dtype == q1.dtype && dwc.layout.is_contiguous() && dwc.layout.shape == Shape({width}),
             "{}: dwc must be a contiguous {} [{}], got {} {}", op, q1.dtype, width, dwc.dtype, shape_str(dwc.layout.shape));
  KILN_CHECK(rstd.layout.shape == lse2.layout.shape && lse2.layout.is_contiguous(), "{}: rstd {} and lse2 {} must be contiguous [B, H, T]",
             op, shape_str(rstd.layout.shape), shape_str(lse2.layout.shape));
  float_types(q1.dtype, op, [&]<class T>(type_tag<T>) {
    const DiffProblems<T> D(op, q1, q2, k1, k2, v, key_padding, mask, scale, causal, pos0);
    Branches<T> X = D.branches(dq1, dq2, dk1, dk2, lse1, lse2, lam);
    const Problem<T>& P = D.P1;
    const int64_t rows = P.B * P.H * P.T_;
    // dO: every element written below; from the host cache (a std::vector would zero it and, at 1 MiB
    // and up, fault in fresh pages every call)
    HostStorage go(static_cast<size_t>(rows * P.dv) * sizeof(T));
    std::vector<T> rowvals(static_cast<size_t>(2 * rows));
    const OutRows<T> gout(go.as<T>(), P.H * P.T_ * P.dv, P.T_ * P.dv, P.dv, P.dv);
    const NormBwd<T> A{&P,
                       Rows<T>(o),
                       Rows<T>(o2),
                       Rows<T>(dy),
                       rstd.storage.as<T>() + rstd.layout.offset,
                       wc.storage.as<T>() + wc.layout.offset,
                       X.lse[0],
                       X.lam,
                       gout,
                       rowvals.data(),
                       rowvals.data() + rows};
    norm_rows_backward<T>(A, dwc.storage.as<T>() + dwc.layout.offset, dlam.storage.as<T>() + dlam.layout.offset);
    X.D[0] = rowvals.data();
    X.D[1] = rowvals.data() + rows;
    X.dsf[1] = -X.lam;
    const Rows<T> g(go.as<T>(), P.H * P.T_ * P.dv, P.T_ * P.dv, P.dv, P.dv);
    backward<T>(X, Rows<T>(o), nullptr, g, OutRows<T>(dv), nullptr);
  });
}

}  // namespace kiln

#include "kiln/core/fused.hpp"
#include "kiln/core/fused_diff_attention.hpp"
static_assert(kiln::fused::HasAttention<kiln::Cpu> && kiln::fused::HasAttentionBackward<kiln::Cpu>,
              "Cpu's flash attention must match the override signatures of core/fused.hpp");
static_assert(kiln::fused::HasDiffAttention<kiln::Cpu> && kiln::fused::HasDiffAttentionNorm<kiln::Cpu>,
              "Cpu's differential attention must match the override signatures of core/fused_diff_attention.hpp");
