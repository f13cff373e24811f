// Fused RoPE (contract in core/fused_rope.hpp): one pass over x's rows of d, split over the threads; a
// row's pairs turn by its position's cos/sin row. Rows are walked through x's and y's layouts (an
// odometer, common.hpp's Plan), so a transposed [B, H, T, hd] view of [B, T, H, hd] is read in place and
// y, allocated in x's memory order, is written in place too. The pair loop is a kernel with
// variants per instruction set (common.hpp): GCC vectorises it with SSE2 at baseline, AVX2 + FMA, AVX-512.
#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {
// y = x turned pairwise: (x0, x1) -> (x0·c − x1·s, x0·s + x1·c), h pairs.
template <class I, class T> void rope_row(T* y, const T* x, const T* c, const T* s, int64_t h) {
#pragma omp simd
  for (int64_t k = 0; k < h; ++k) {
    const T x0 = x[2 * k], x1 = x[2 * k + 1];
    y[2 * k] = x0 * c[k] - x1 * s[k];
    y[2 * k + 1] = x0 * s[k] + x1 * c[k];
  }
}
template <class I, class T> void rope_row_inverse(T* y, const T* x, const T* c, const T* s, int64_t h) {
#pragma omp simd
  for (int64_t k = 0; k < h; ++k) {
    const T x0 = x[2 * k], x1 = x[2 * k + 1];
    y[2 * k] = x0 * c[k] + x1 * s[k];
    y[2 * k + 1] = x1 * c[k] - x0 * s[k];
  }
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
  const int64_t d = x.layout.shape.back(), h = d / 2;
  // The rows: x's and y's leading axes, and a third operand counting the position (stride 1 on the T
  // axis, 0 elsewhere) that picks the table row.
  const Shape rows(x.layout.shape.begin(), x.layout.shape.end() - 1);
  const Strides xs(x.layout.strides.begin(), x.layout.strides.end() - 1), ys(y.layout.strides.begin(), y.layout.strides.end() - 1);
  Strides ts(rows.size(), 0);
  ts.back() = 1;
  const Plan<3> plan = make_plan<3>(rows, {&xs, &ys, &ts}, {x.layout.offset, y.layout.offset, 0});
  float_types(x.dtype, "rope", [&]<class T_>(type_tag<T_>) {
    const auto run = inverse ? pick<rope_row_inverse<Baseline, T_>, rope_row_inverse<Avx2, T_>, rope_row_inverse<Avx512, T_>>()
                             : pick<rope_row<Baseline, T_>, rope_row<Avx2, T_>, rope_row<Avx512, T_>>();
    T_* py = ptr<T_>(y.storage);
    const T_* px = ptr<T_>(x.storage);
    const T_ *pc = ptr<T_>(cos.storage) + cos.layout.offset, *ps = ptr<T_>(sin.storage) + sin.layout.offset;
    parallel_for(plan.numel, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
      for_range(plan, r0, r1, [&](const std::array<int64_t, 3>& off, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = off[2] + i * plan.inner(2);
          run(py + off[1] + i * plan.inner(1), px + off[0] + i * plan.inner(0), pc + t * h, ps + t * h, h);
        }
      });
    });
  });
}

}  // namespace kiln
