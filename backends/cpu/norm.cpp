// Fused RMSNorm forward/backward over contiguous rows (contract in core/fused_norm.hpp). One pass
// over a row for mean(x²), one to write y; backward one pass for mean(g·x), one for dx, and dw
// accumulated per thread over its rows, then summed in thread order (deterministic for a given thread
// count). Rows are split over the threads; `omp simd` reductions vectorise the row sums. The row loops
// are kernels with variants per instruction set (common.hpp): SSE2 at baseline, AVX2 + FMA, AVX-512.
#include <vector>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

// Kernels (common.hpp). Forward: rows [r0, r1) of D elements.
template <class I, class T> void rms_fwd_rows(T* y, T* rstd, const T* x, const T* w, int64_t r0, int64_t r1, int64_t D, double eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const T rs = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps));
    rstd[r] = rs;
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * rs * w[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * rs;
    }
  }
}

// Backward: rows [r0, r1); acc (D wide, or null) accumulates dw's terms.
template <class I, class T>
void rms_bwd_rows(T* dx, T* acc, const T* x, const T* w, const T* rstd, const T* dy, int64_t r0, int64_t r1, int64_t D) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    const T* gr = dy + r * D;
    T* dxr = dx + r * D;
    const T rs = rstd[r];
    T dot = 0;
    if (w) {
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < D; ++i) dot += gr[i] * w[i] * xr[i];
    } else {
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < D; ++i) dot += gr[i] * xr[i];
    }
    const T c = rs * rs * rs * dot / static_cast<T>(D);
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) dxr[i] = rs * gr[i] * w[i] - xr[i] * c;
    } else {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) dxr[i] = rs * gr[i] - xr[i] * c;
    }
    if (acc) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) acc[i] += gr[i] * xr[i] * rs;
    }
  }
}

template <class T> void rms_fwd(T* y, T* rstd, const T* x, const T* w, int64_t N, int64_t D, double eps) {
  const auto rows = pick<rms_fwd_rows<Baseline, T>, rms_fwd_rows<Avx2, T>, rms_fwd_rows<Avx512, T>>();
  parallel_for(
      N, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) { rows(y, rstd, x, w, b, e, D, eps); }, 1);
}

template <class T> void rms_bwd(T* dx, T* dw, const T* x, const T* w, const T* rstd, const T* dy, int64_t N, int64_t D) {
  const int nt = std::max(1, num_threads());
  std::vector<std::vector<T>> partial(dw ? static_cast<size_t>(nt) : 0);
  const int64_t grain = std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(D, 1));
  const int64_t chunk = (N + nt - 1) / nt;
  const auto rows = pick<rms_bwd_rows<Baseline, T>, rms_bwd_rows<Avx2, T>, rms_bwd_rows<Avx512, T>>();
  // Rows split into nt fixed chunks (not parallel_for's), so dw's summation order never changes.
  auto body = [&](int t) {
    const int64_t b = std::min<int64_t>(N, chunk * t), e = std::min<int64_t>(N, b + chunk);
    T* acc = nullptr;
    if (dw) {
      partial[static_cast<size_t>(t)].assign(static_cast<size_t>(D), T(0));
      acc = partial[static_cast<size_t>(t)].data();
    }
    rows(dx, acc, x, w, rstd, dy, b, e, D);
  };
  if (nt > 1 && N >= 2 * grain && !omp_in_parallel()) {
#pragma omp parallel num_threads(nt)
    body(omp_get_thread_num());
  } else {
    for (int t = 0; t < nt; ++t) body(t);
  }
  if (dw) {
    for (int64_t i = 0; i < D; ++i) dw[i] = T(0);
    for (int t = 0; t < nt; ++t)
      for (int64_t i = 0; i < D; ++i) dw[i] += partial[static_cast<size_t>(t)][static_cast<size_t>(i)];
  }
}

}  // namespace

void Cpu::rms_norm_forward(M y, M rstd, V x, const V* w, double eps) {
  const int64_t D = x.layout.shape.back(), N = x.layout.numel() / std::max<int64_t>(D, 1);
  float_types(x.dtype, "rms_norm", [&]<class T>(type_tag<T>) {
    rms_fwd<T>(ptr<T>(y.storage) + y.layout.offset, ptr<T>(rstd.storage) + rstd.layout.offset, ptr<T>(x.storage) + x.layout.offset,
               w ? ptr<T>(w->storage) + w->layout.offset : nullptr, N, D, eps);
  });
}

void Cpu::rms_norm_backward(M dx, M* dw, V x, const V* w, V rstd, V dy) {
  const int64_t D = x.layout.shape.back(), N = x.layout.numel() / std::max<int64_t>(D, 1);
  float_types(x.dtype, "rms_norm_backward", [&]<class T>(type_tag<T>) {
    rms_bwd<T>(ptr<T>(dx.storage) + dx.layout.offset, dw ? ptr<T>(dw->storage) + dw->layout.offset : nullptr,
               ptr<T>(x.storage) + x.layout.offset, w ? ptr<T>(w->storage) + w->layout.offset : nullptr,
               ptr<T>(rstd.storage) + rstd.layout.offset, ptr<T>(dy.storage) + dy.layout.offset, N, D);
  });
}

}  // namespace kiln
