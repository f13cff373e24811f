// Fused combine of Differential Transformer V2 (contract in core/fused_diff2.hpp): one pass over the
// B·T·h output rows of hd, split over the threads. Row (b, t, j) reads the rows of heads 2j and 2j+1 of
// a through a's strides (for the [B, T, 2h, hd] block the Cpu attention kernel writes, the two rows sit
// side by side), one σ per row; the row loops are kernels with variants per instruction set (common.hpp).
#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {
// y = e − s·o over a row of n.
template <class I, class T> void diff2_row(T* y, const T* e, const T* o, T s, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] = e[c] - s * o[c];
}
// de = g, do = −s·g; returns Σ g·o.
template <class I, class T> T diff2_row_backward(T* de, T* dodd, const T* g, const T* o, T s, int64_t n) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t c = 0; c < n; ++c) {
    de[c] = g[c];
    dodd[c] = -s * g[c];
    dot += g[c] * o[c];
  }
  return dot;
}

struct Diff2Rows {
  int64_t T, h, hd, a0, a1, a2, d0, d1, d2;  // sizes; a's and da's strides over (b, head, t)
  Diff2Rows(const Layout& a, const Layout* da)
      : T(a.shape[2]),
        h(a.shape[1] / 2),
        hd(a.shape[3]),
        a0(a.strides[0]),
        a1(a.strides[1]),
        a2(a.strides[2]),
        d0(da ? da->strides[0] : 0),
        d1(da ? da->strides[1] : 0),
        d2(da ? da->strides[2] : 0) {}
  // Row r = (b, t, j) of y: the offsets of head 2j's row at token t in a (and in da).
  int64_t a_even(int64_t r) const { return (r / (T * h)) * a0 + 2 * (r % h) * a1 + ((r / h) % T) * a2; }
  int64_t d_even(int64_t r) const { return (r / (T * h)) * d0 + 2 * (r % h) * d1 + ((r / h) % T) * d2; }
};

void diff2_check_views(const char* op, const Layout& a, const Layout& l, const Layout& y) {
  KILN_CHECK(a.rank() == 4 && (a.shape[3] <= 1 || a.strides[3] == 1) && l.is_contiguous() && y.is_contiguous(),
             "{}: the Cpu kernel takes a [B, 2h, T, hd] with unit-stride rows and contiguous lambda logits and output (a {}, l {}, y {})",
             op, shape_str(a.shape), shape_str(l.shape), shape_str(y.shape));
}
}  // namespace

void Cpu::diff2_combine_forward(M y, V a, V l) {
  diff2_check_views("diff2_combine", a.layout, l.layout, y.layout);
  const Diff2Rows g(a.layout, nullptr);
  const int64_t rows = a.layout.shape[0] * g.T * g.h;
  float_types(a.dtype, "diff2_combine", [&]<class T_>(type_tag<T_>) {
    const auto run = pick<diff2_row<Baseline, T_>, diff2_row<Avx2, T_>, diff2_row<Avx512, T_>>();
    T_* py = ptr<T_>(y.storage) + y.layout.offset;
    const T_* pa = ptr<T_>(a.storage) + a.layout.offset;
    const T_* pl = ptr<T_>(l.storage) + l.layout.offset;
    parallel_for(rows, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(g.hd, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T_* e = pa + g.a_even(r);
        run(py + r * g.hd, e, e + g.a1, op::Sigmoid::f<T_>(pl[r]), g.hd);
      }
    });
  });
}

void Cpu::diff2_combine_backward(M da, M dl, V a, V l, V dy) {
  diff2_check_views("diff2_combine_backward", a.layout, l.layout, dy.layout);
  KILN_CHECK(da.layout.shape == a.layout.shape && (a.layout.shape[3] <= 1 || da.layout.strides[3] == 1) && dl.layout.is_contiguous(),
             "diff2_combine_backward: the Cpu kernel takes da of a's shape {} with unit-stride rows and a contiguous dl (da {}, dl {})",
             shape_str(a.layout.shape), shape_str(da.layout.shape), shape_str(dl.layout.shape));
  const Diff2Rows g(a.layout, &da.layout);
  const int64_t rows = a.layout.shape[0] * g.T * g.h;
  float_types(a.dtype, "diff2_combine_backward", [&]<class T_>(type_tag<T_>) {
    const auto run = pick<diff2_row_backward<Baseline, T_>, diff2_row_backward<Avx2, T_>, diff2_row_backward<Avx512, T_>>();
    T_* pda = ptr<T_>(da.storage) + da.layout.offset;
    T_* pdl = ptr<T_>(dl.storage) + dl.layout.offset;
    const T_* pa = ptr<T_>(a.storage) + a.layout.offset;
    const T_* pl = ptr<T_>(l.storage) + l.layout.offset;
    const T_* pg = ptr<T_>(dy.storage) + dy.layout.offset;
    parallel_for(rows, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(2 * g.hd, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T_ s = op::Sigmoid::f<T_>(pl[r]);
        T_* de = pda + g.d_even(r);
        const T_ dot = run(de, de + g.d1, pg + r * g.hd, pa + g.a_even(r) + g.a1, s, g.hd);
        pdl[r] = -s * (T_(1) - s) * dot;
      }
    });
  });
}

}  // namespace kiln
