// Fused RoPE (contract in core/fused_rope.hpp): one pass over x's rows of d, split over the threads; a
// row's pairs turn by its position's cos/sin row. Rows are addressed through x's layout, so a transposed
// [B, H, T, hd] view is read in place (its last axis is contiguous). The pair loop is a kernel with
// variants per instruction set (common.hpp): GCC vectorises it with SSE2 at baseline, AVX2 + FMA.
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
  KILN_CHECK(rank >= 2 && x.layout.strides.back() == 1 && y.layout.is_contiguous() && cos.layout.is_contiguous() &&
                 sin.layout.is_contiguous() && x.dtype == y.dtype && cos.dtype == x.dtype && sin.dtype == x.dtype,
             "rope: the Cpu kernel takes x with a unit-stride last axis and contiguous y, cos, sin of one dtype (x {}, cos {})",
             shape_str(x.layout.shape), shape_str(cos.layout.shape));
  const int64_t d = x.layout.shape.back(), T = x.layout.shape[static_cast<size_t>(rank - 2)], h = d / 2;
  const int64_t rows = x.layout.numel() / d;
  float_types(x.dtype, "rope", [&]<class T_>(type_tag<T_>) {
    const auto run = inverse ? pick<rope_row_inverse<Baseline, T_>, rope_row_inverse<Avx2, T_>>()
                             : pick<rope_row<Baseline, T_>, rope_row<Avx2, T_>>();
    T_* py = ptr<T_>(y.storage) + y.layout.offset;
    const T_* px = ptr<T_>(x.storage);
    const T_ *pc = ptr<T_>(cos.storage) + cos.layout.offset, *ps = ptr<T_>(sin.storage) + sin.layout.offset;
    const bool flat = x.layout.is_contiguous();
    parallel_for(rows, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r % T;
        const T_* xr = px + (flat ? x.layout.offset + r * d : x.layout.offset_of(r * d));
        run(py + r * d, xr, pc + t * h, ps + t * h, h);
      }
    });
  });
}

}  // namespace kiln
