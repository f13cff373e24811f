// Fused RoPE (contract in core/fused_rope.hpp): one pass over x's rows of d, split over the threads; a
// row's pairs turn by its position's cos/sin row. Rows are walked through x's and y's layouts (an
// odometer, common.hpp's Plan) in x's memory order, which is y's too (y is allocated in x's memory
// order): for attention's [B, H, T, hd] view of [B, T, H, hd], x and y are read and written front to
// back, the H rows of a position in turn, not hd-wide rows H·hd apart. A kernel call takes the plan's two
// innermost dimensions as a block of rows (there: T positions of H rows), so the ISA variant is called
// once per block, not once per row.
//
// Arithmetic: GCC contracts a·b ± c·d in C++ where FMA is available, at -O2 and above (-ffp-contract=fast
// is its C++ default even with -std=c++20), fusing the first product with the rounded second one:
//   forward  y0 = fma(x0, c, −(x1·s)),  y1 = fma(x0, s, x1·c)
//   inverse  y0 = fma(x0, c, x1·s),     y1 = fma(x1, c, −(x0·s))
// The AVX2 and AVX-512 variants spell these fused forms (intrinsics, std::fma for a row's last pairs),
// so they give the bits the scalar formula gives in a native optimised build, which is what the kernel
// computed before it had vectors of its own; the baseline kernel is the scalar formula as compiled (the
// same bits there; a portable build's baseline, or an -O0/-O1 one, rounds both products).
// tests/nn/test_fused_rope.cpp checks those bits on every ISA.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {
// Pairs [0, h) of one row in vectors; returns how many were done (the rest go to rope_tail, the scalar loop).
// Baseline: none (the portable loop, which GCC vectorises with SSE2).
template <bool Inv, class T> inline int64_t rope_vec(Baseline, T*, const T*, const T*, const T*, int64_t) { return 0; }
// The vector forms keep pairs as they lie in memory (x0 x1 x0 x1 ...); fmaddsub computes a·b − q in even
// lanes and a·b + q in odd ones, fmsubadd the other way round, so
//   forward  y = fmaddsub([x0, x0], [c, s], [x1, x1]·[s, c])     inverse  y = fmsubadd(x, [c, c], swap(x)·[s, s])
// are the fused forms above lane by lane (swap exchanges the two elements of each pair).
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
// AVX2 f32 splits 8 pairs into their first and second elements (shufps leaves them in the pair order
// 0 1 4 5 2 3 6 7, which the tables take by one 64-bit permute), turns them and interleaves them back
// (unpack restores the order): 3 shuffles per 8 outputs, against 6 for the swap-and-duplicate form.
template <bool Inv> inline int64_t rope_vec(Avx2, float* y, const float* x, const float* c, const float* s, int64_t h) {
  int64_t k = 0;
  for (; k + 8 <= h; k += 8) {
    const __m256 xa = _mm256_loadu_ps(x + 2 * k), xb = _mm256_loadu_ps(x + 2 * k + 8);
    const __m256 x0 = _mm256_shuffle_ps(xa, xb, 0x88), x1 = _mm256_shuffle_ps(xa, xb, 0xDD);
    const __m256 cv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(c + k)), 0xD8));
    const __m256 sv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_loadu_ps(s + k)), 0xD8));
    __m256 y0, y1;
    if constexpr (Inv) {
      y0 = _mm256_fmadd_ps(x0, cv, _mm256_mul_ps(x1, sv));
      y1 = _mm256_fmsub_ps(x1, cv, _mm256_mul_ps(x0, sv));
    } else {
      y0 = _mm256_fmsub_ps(x0, cv, _mm256_mul_ps(x1, sv));
      y1 = _mm256_fmadd_ps(x0, sv, _mm256_mul_ps(x1, cv));
    }
    _mm256_storeu_ps(y + 2 * k, _mm256_unpacklo_ps(y0, y1));
    _mm256_storeu_ps(y + 2 * k + 8, _mm256_unpackhi_ps(y0, y1));
  }
  for (; k + 4 <= h; k += 4) {  // 4 to 7 pairs left: the in-place forms
    const __m128 c4 = _mm_loadu_ps(c + k), s4 = _mm_loadu_ps(s + k);
    const __m256 xv = _mm256_loadu_ps(x + 2 * k);
    if constexpr (Inv) {
      const __m256 cc = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
      const __m256 ss = _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
      _mm256_storeu_ps(y + 2 * k, _mm256_fmsubadd_ps(xv, cc, _mm256_mul_ps(_mm256_permute_ps(xv, 0xB1), ss)));
    } else {
      const __m256 cs = _mm256_set_m128(_mm_unpackhi_ps(c4, s4), _mm_unpacklo_ps(c4, s4));
      const __m256 q = _mm256_mul_ps(_mm256_movehdup_ps(xv), _mm256_permute_ps(cs, 0xB1));
      _mm256_storeu_ps(y + 2 * k, _mm256_fmaddsub_ps(_mm256_moveldup_ps(xv), cs, q));
    }
  }
  return k;
}
template <bool Inv> inline int64_t rope_vec(Avx2, double* y, const double* x, const double* c, const double* s, int64_t h) {
  int64_t k = 0;
  for (; k + 2 <= h; k += 2) {
    const __m128d c2 = _mm_loadu_pd(c + k), s2 = _mm_loadu_pd(s + k);
    const __m256d xv = _mm256_loadu_pd(x + 2 * k);
    if constexpr (Inv) {
      const __m256d cc = _mm256_set_m128d(_mm_unpackhi_pd(c2, c2), _mm_unpacklo_pd(c2, c2));
      const __m256d ss = _mm256_set_m128d(_mm_unpackhi_pd(s2, s2), _mm_unpacklo_pd(s2, s2));
      _mm256_storeu_pd(y + 2 * k, _mm256_fmsubadd_pd(xv, cc, _mm256_mul_pd(_mm256_permute_pd(xv, 0x5), ss)));
    } else {
      const __m256d cs = _mm256_set_m128d(_mm_unpackhi_pd(c2, s2), _mm_unpacklo_pd(c2, s2));
      const __m256d q = _mm256_mul_pd(_mm256_permute_pd(xv, 0xF), _mm256_permute_pd(cs, 0x5));
      _mm256_storeu_pd(y + 2 * k, _mm256_fmaddsub_pd(_mm256_movedup_pd(xv), cs, q));
    }
  }
  return k;
}
KILN_CPU_AVX2_END
KILN_CPU_AVX512_BEGIN
template <bool Inv> inline int64_t rope_vec(Avx512, float* y, const float* x, const float* c, const float* s, int64_t h) {
  const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i ilv = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);  // c0 s0 c1 s1 ...
  int64_t k = 0;
  for (; k + 8 <= h; k += 8) {
    const __m512 c8 = _mm512_castps256_ps512(_mm256_loadu_ps(c + k)), s8 = _mm512_castps256_ps512(_mm256_loadu_ps(s + k));
    const __m512 xv = _mm512_loadu_ps(x + 2 * k);
    if constexpr (Inv) {
      const __m512 cc = _mm512_permutexvar_ps(dup, c8), ss = _mm512_permutexvar_ps(dup, s8);
      _mm512_storeu_ps(y + 2 * k, _mm512_fmsubadd_ps(xv, cc, _mm512_mul_ps(_mm512_permute_ps(xv, 0xB1), ss)));
    } else {
      const __m512 cs = _mm512_permutex2var_ps(c8, ilv, s8);
      const __m512 q = _mm512_mul_ps(_mm512_movehdup_ps(xv), _mm512_permute_ps(cs, 0xB1));
      _mm512_storeu_ps(y + 2 * k, _mm512_fmaddsub_ps(_mm512_moveldup_ps(xv), cs, q));
    }
  }
  return k + rope_vec<Inv>(Avx2{}, y + 2 * k, x + 2 * k, c + k, s + k, h - k);
}
template <bool Inv> inline int64_t rope_vec(Avx512, double* y, const double* x, const double* c, const double* s, int64_t h) {
  const __m512i dup = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0), ilv = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  int64_t k = 0;
  for (; k + 4 <= h; k += 4) {
    const __m512d c4 = _mm512_castpd256_pd512(_mm256_loadu_pd(c + k)), s4 = _mm512_castpd256_pd512(_mm256_loadu_pd(s + k));
    const __m512d xv = _mm512_loadu_pd(x + 2 * k);
    if constexpr (Inv) {
      const __m512d cc = _mm512_permutexvar_pd(dup, c4), ss = _mm512_permutexvar_pd(dup, s4);
      _mm512_storeu_pd(y + 2 * k, _mm512_fmsubadd_pd(xv, cc, _mm512_mul_pd(_mm512_permute_pd(xv, 0x55), ss)));
    } else {
      const __m512d cs = _mm512_permutex2var_pd(c4, ilv, s4);
      const __m512d q = _mm512_mul_pd(_mm512_permute_pd(xv, 0xFF), _mm512_permute_pd(cs, 0x55));
      _mm512_storeu_pd(y + 2 * k, _mm512_fmaddsub_pd(_mm512_movedup_pd(xv), cs, q));
    }
  }
  return k + rope_vec<Inv>(Avx2{}, y + 2 * k, x + 2 * k, c + k, s + k, h - k);
}
KILN_CPU_AVX512_END
#endif

// The rows a kernel call covers: n1 runs of n0 rows each; row (i1, i0) lies at y + i1·y1 + i0·y0 and
// x + i1·x1 + i0·x0 and turns by table row i1·t1 + i0·t0 (the strides count elements, the table's rows).
struct RopeBlock {
  int64_t n1, y1, x1, t1, n0, y0, x0, t0;
};

// One row's pairs [k0, h) as the scalar formula: the baseline kernel's whole row, contracted as the
// compiler does it (fused where it may use FMA and does at -O2 and above; a portable build's baseline
// and an -O0/-O1 build round both products); the AVX variants' last pairs, fused explicitly as their
// vectors are, so that a row never mixes the two forms whatever the build's flags.
template <class I, class T, bool Inv> inline void rope_tail(T* y, const T* x, const T* c, const T* s, int64_t k0, int64_t h) {
  if constexpr (std::is_same_v<I, Baseline>) {
#pragma omp simd
    for (int64_t k = k0; k < h; ++k) {
      const T x0 = x[2 * k], x1 = x[2 * k + 1];
      if constexpr (Inv) {
        y[2 * k] = x0 * c[k] + x1 * s[k];
        y[2 * k + 1] = x1 * c[k] - x0 * s[k];
      } else {
        y[2 * k] = x0 * c[k] - x1 * s[k];
        y[2 * k + 1] = x0 * s[k] + x1 * c[k];
      }
    }
  } else {
    for (int64_t k = k0; k < h; ++k) {
      const T x0 = x[2 * k], x1 = x[2 * k + 1];
      if constexpr (Inv) {
        y[2 * k] = std::fma(x0, c[k], x1 * s[k]);
        y[2 * k + 1] = std::fma(x1, c[k], -(x0 * s[k]));
      } else {
        y[2 * k] = std::fma(x0, c[k], -(x1 * s[k]));
        y[2 * k + 1] = std::fma(x0, s[k], x1 * c[k]);
      }
    }
  }
}

// Kernel (common.hpp): a block of rows of h pairs each.
template <class I, class T, bool Inv> void rope_rows(T* y, const T* x, const T* c, const T* s, int64_t h, const RopeBlock& b) {
  for (int64_t i1 = 0; i1 < b.n1; ++i1)
    for (int64_t i0 = 0; i0 < b.n0; ++i0) {
      T* yr = y + i1 * b.y1 + i0 * b.y0;
      const T* xr = x + i1 * b.x1 + i0 * b.x0;
      const int64_t t = (i1 * b.t1 + i0 * b.t0) * h;
      rope_tail<I, T, Inv>(yr, xr, c + t, s + t, rope_vec<Inv>(I{}, yr, xr, c + t, s + t, h), h);
    }
}
template <class T, bool Inv> auto pick_rope() {
  return pick<rope_rows<Baseline, T, Inv>, rope_rows<Avx2, T, Inv>, rope_rows<Avx512, T, Inv>>();
}
}  // namespace

void Cpu::rope(M y, V x, V cos, V sin, bool inverse) {
  const int64_t rank = x.layout.rank();
  KILN_CHECK(rank >= 2 && x.layout.strides.back() == 1 && y.layout.shape == x.layout.shape && y.layout.strides.back() == 1 &&
                 cos.layout.is_contiguous() && sin.layout.is_contiguous() && x.dtype == y.dtype && cos.dtype == x.dtype &&
                 sin.dtype == x.dtype,
             "rope: the Cpu kernel takes x and y of one shape with unit-stride last axes and contiguous cos, sin of one dtype "
             "(x {}, y {}, cos {})",
             shape_str(x.layout.shape), shape_str(y.layout.shape), shape_str(cos.layout.shape));
  if (x.layout.numel() == 0) return;
  const int64_t d = x.layout.shape.back(), h = d / 2;
  // The rows: x's and y's leading axes, and a third operand counting the position (stride 1 on the T
  // axis, 0 elsewhere) that picks the table row. They are walked in x's memory order (largest stride
  // outermost), which is y's too: for attention's [B, H, T, hd] view of [B, T, H, hd] both are then read
  // and written front to back, the H rows of a position in turn, rather than hd-wide rows H·hd apart.
  const int64_t nr = rank - 1;
  std::vector<int64_t> order(static_cast<size_t>(nr));
  for (int64_t i = 0; i < nr; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return x.layout.strides[static_cast<size_t>(a)] > x.layout.strides[static_cast<size_t>(b)];
  });
  Shape rows(static_cast<size_t>(nr));
  Strides xs(rows.size()), ys(rows.size()), ts(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto a = static_cast<size_t>(order[i]);
    rows[i] = x.layout.shape[a];
    xs[i] = x.layout.strides[a];
    ys[i] = y.layout.strides[a];
    ts[i] = a + 1 == rows.size() ? 1 : 0;
  }
  const Plan<3> plan = make_plan<3>(rows, {&xs, &ys, &ts}, {x.layout.offset, y.layout.offset, 0});
  // A kernel call takes the plan's two innermost dimensions as a block (for that view: the H rows of
  // one position, then the positions), handed out by a walk over the outer ones (`outer`, in blocks).
  Plan<3> outer = plan;
  RopeBlock blk{1, 0, 0, 0, plan.size[0], plan.stride[1][0], plan.stride[0][0], plan.stride[2][0]};
  if (plan.nd > 1) {
    outer.nd = plan.nd - 1;
    outer.numel = plan.numel / plan.size[0];
    for (int i = 0; i < outer.nd; ++i) {
      outer.size[i] = plan.size[i + 1];
      for (int k = 0; k < 3; ++k) outer.stride[k][i] = plan.stride[k][i + 1];
    }
  } else {
    outer.numel = outer.size[0] = 1;
  }
  float_types(x.dtype, "rope", [&]<class T_>(type_tag<T_>) {
    const auto run = inverse ? pick_rope<T_, true>() : pick_rope<T_, false>();
    T_* py = ptr<T_>(y.storage);
    const T_* px = ptr<T_>(x.storage);
    const T_ *pc = ptr<T_>(cos.storage) + cos.layout.offset, *ps = ptr<T_>(sin.storage) + sin.layout.offset;
    const int64_t grain = std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(d * blk.n0, 1));
    parallel_for(
        outer.numel, grain,
        [&](int64_t r0, int64_t r1) {
          for_range(outer, r0, r1, [&](const std::array<int64_t, 3>& off, int64_t n) {
            RopeBlock b = blk;
            b.n1 = n;
            b.y1 = outer.inner(1);
            b.x1 = outer.inner(0);
            b.t1 = outer.inner(2);
            run(py + off[1], px + off[0], pc + off[2] * h, ps + off[2] * h, h, b);
          });
        },
        1);
  });
}

}  // namespace kiln
