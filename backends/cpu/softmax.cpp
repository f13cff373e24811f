// Fused softmax / log_softmax over the last axis of a contiguous tensor, forward and backward.
// Forward, per row (f32): one pass for the max, one fused pass y = exp(x - max) with the running sum
// (vecmath.hpp: AVX2 exp, or libm's at baseline), one pass scaling by 1/sum (log: y = (x - max) -
// log sum). Rows are in L1 between passes, so the row is read from memory once and written once.
// bf16/f16 rows go through a float buffer; f64 rows use scalar double math. Rows are split over the
// threads; each chunk of rows runs the kernel variant for the instruction set (common.hpp).
#include <vector>

#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/cpu/vecmath.hpp"

namespace kiln {
using namespace cpu;

namespace {

// One row of softmax / log_softmax in f32.
template <class I> void softmax_row_f32(const float* x, float* y, int64_t n, bool log) {
  const float m = vm::row_max(I{}, x, n);
  if (log) {
    // y is scratch for the exponentials, then overwritten
    const float ls = std::log(vm::exp_shift_sum(I{}, x, y, n, m));
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  } else {
    const float s = vm::exp_shift_sum(I{}, x, y, n, m);
    const float r = 1.0f / s;
    for (int64_t i = 0; i < n; ++i) y[i] *= r;
  }
}

void softmax_row_f64(const double* x, double* y, int64_t n, bool log) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = (x[i] > m || x[i] != x[i]) ? x[i] : m;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  if (log) {
    const double ls = std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - m) / s;
  }
}

// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
template <class I, class F> void softmax_bwd_row(const F* y, const F* dy, F* dx, int64_t n, bool log) {
  using A = std::conditional_t<std::is_same_v<F, float>, double, F>;
  A s = 0;
  if (log) {
    for (int64_t i = 0; i < n; ++i) s += static_cast<A>(dy[i]);
    const F sf = static_cast<F>(s);
    if constexpr (std::is_same_v<F, float>) {
      vm::exp_n(I{}, y, dx, n);
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] - dx[i] * sf;
    } else {
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] - std::exp(y[i]) * sf;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) s += static_cast<A>(dy[i]) * static_cast<A>(y[i]);
    const F sf = static_cast<F>(s);
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - sf);
  }
}

// Kernels (common.hpp): rows [r0, r1) of n elements; buf holds 2n (forward) or 3n (backward) floats
// for bf16/f16 rows, which go through f32.
template <class I, class T> void softmax_rows(const T* x, T* y, int64_t r0, int64_t r1, int64_t n, bool log, float* buf) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    if constexpr (std::is_same_v<T, float>) {
      softmax_row_f32<I>(xr, yr, n, log);
    } else if constexpr (std::is_same_v<T, double>) {
      softmax_row_f64(xr, yr, n, log);
    } else {
      for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(xr[i]);
      softmax_row_f32<I>(buf, buf + n, n, log);
      for (int64_t i = 0; i < n; ++i) yr[i] = T(buf[n + i]);
    }
  }
}

template <class I, class T> void softmax_bwd_rows(const T* y, const T* dy, T* dx, int64_t r0, int64_t r1, int64_t n, bool log, float* buf) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * n;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      softmax_bwd_row<I, T>(y + o, dy + o, dx + o, n, log);
    } else {
      float* by = buf;
      float* bg = by + n;
      float* bd = bg + n;
      for (int64_t i = 0; i < n; ++i) {
        by[i] = static_cast<float>(y[o + i]);
        bg[i] = static_cast<float>(dy[o + i]);
      }
      softmax_bwd_row<I, float>(by, bg, bd, n, log);
      for (int64_t i = 0; i < n; ++i) dx[o + i] = T(bd[i]);
    }
  }
}

void check_args(const char* op, Cpu::M out, Cpu::V x) {
  KILN_CHECK(out.layout.shape == x.layout.shape && out.dtype == x.dtype, "{}: out {} {} vs input {} {}", op, shape_str(out.layout.shape),
             out.dtype, shape_str(x.layout.shape), x.dtype);
  KILN_CHECK(x.layout.is_contiguous() && out.layout.is_contiguous(), "{}: needs contiguous tensors (shape {})", op,
             shape_str(x.layout.shape));
  KILN_CHECK(is_floating(x.dtype), "{}: needs a float dtype, got {} (shape {})", op, x.dtype, shape_str(x.layout.shape));
}

// Splits the rows of a contiguous tensor over the threads; kernel(r0, r1, n, buf) gets a chunk of rows
// and a buffer of `buf_rows` x n floats when T is a half type.
template <class T, class K> void for_rows(const Layout& l, int64_t buf_rows, K&& kernel) {
  const int64_t n = l.rank() == 0 ? 1 : l.shape.back();
  if (n == 0) return;
  const int64_t rows = l.numel() / n;
  parallel_for(
      rows, std::max<int64_t>(1, kGrainMath / n),
      [&](int64_t b, int64_t e) {
        std::vector<float> buf(is_float_v<T> && !std::is_same_v<T, float> && !std::is_same_v<T, double> ? static_cast<size_t>(buf_rows * n)
                                                                                                        : 0);
        kernel(b, e, n, buf.data());
      },
      1);
}

}  // namespace

void Cpu::softmax_lastdim(M out, V x, bool log) {
  check_args(log ? "log_softmax" : "softmax", out, x);
  visit_dtype(x.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (is_float_v<T>) {
      const T* xp = x.storage.as<T>() + x.layout.offset;
      T* yp = out.storage.as<T>() + out.layout.offset;
      const auto rows = pick<softmax_rows<Baseline, T>, softmax_rows<Avx2, T>, softmax_rows<Avx512, T>>();
      for_rows<T>(x.layout, 2, [&](int64_t b, int64_t e, int64_t n, float* buf) { rows(xp, yp, b, e, n, log, buf); });
    }
  });
}

void Cpu::softmax_lastdim_backward(M dx, V y, V dy, bool log) {
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  check_args(name, dx, y);
  check_args(name, dx, dy);
  visit_dtype(y.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (is_float_v<T>) {
      const T* yp = y.storage.as<T>() + y.layout.offset;
      const T* gp = dy.storage.as<T>() + dy.layout.offset;
      T* dp = dx.storage.as<T>() + dx.layout.offset;
      const auto rows = pick<softmax_bwd_rows<Baseline, T>, softmax_bwd_rows<Avx2, T>, softmax_bwd_rows<Avx512, T>>();
      for_rows<T>(y.layout, 3, [&](int64_t b, int64_t e, int64_t n, float* buf) { rows(yp, gp, dp, b, e, n, log, buf); });
    }
  });
}

// ------------------------------------------------------------------------------ cross-entropy
// Fused softmax cross-entropy (contract in core/fused_loss.hpp): rows of contiguous f32/f64/bf16/f16
// logits [N, C], one row per task. The forward makes one pass for the max and one for Σ exp (into a
// scratch row); the backward writes exp(x − lse) straight into dx and finishes the row in place. A
// bf16/f16 row is widened into a float row first and the f32 kernel runs on it (loss, lse and g f32);
// the backward's f32 row is rounded once into dx.
namespace {

void ce_check_views(const char* op, const Layout& x) {
  KILN_CHECK(x.rank() == 2 && x.is_contiguous(), "{}: logits must be contiguous [N, C], got {}", op, shape_str(x.shape));
}

// scratch: C floats (f32 rows).
template <class I, class T> T ce_row_lse(const T* x, int64_t C, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    const float m = vm::row_max(I{}, x, C);
    if (m == -std::numeric_limits<float>::infinity()) return m;
    return m + std::log(vm::exp_shift_sum(I{}, x, scratch, C, m));
  } else {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c]);
    if (m == -std::numeric_limits<T>::infinity()) return m;
    T s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[c] - m);
    return m + std::log(s);
  }
}

// Kernels (common.hpp) over rows [r0, r1) of [N, C] logits x with targets t.
template <class I, class T> void ce_forward_rows(const T* x, const int64_t* t, T* lp, T* lsp, int64_t r0, int64_t r1, int64_t C,
                                                 int64_t ignore_index, double smoothing, float* scratch) {
  const T s = static_cast<T>(smoothing);
  for (int64_t i = r0; i < r1; ++i) {
    const T* row = x + i * C;
    const T l = ce_row_lse<I, T>(row, C, scratch);
    lsp[i] = l;
    if (t[i] == ignore_index) {
      lp[i] = 0;
      continue;
    }
    T v = l - (T(1) - s) * row[t[i]];
    if (smoothing > 0) {
      T sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += row[c];
      v -= s * sum / static_cast<T>(C);
    }
    lp[i] = v;
  }
}

template <class I, class T> void ce_backward_rows(const T* x, const T* lsp, const T* gp, const int64_t* t, T* dx, int64_t r0, int64_t r1,
                                                  int64_t C, int64_t ignore_index, double smoothing) {
  const T s = static_cast<T>(smoothing), sc = s / static_cast<T>(C);
  for (int64_t i = r0; i < r1; ++i) {
    const T* row = x + i * C;
    T* d = dx + i * C;
    if (t[i] == ignore_index) {
      std::fill(d, d + C, T(0));
      continue;
    }
    const T gi = gp[i];
    if constexpr (std::is_same_v<T, float>)
      (void)vm::exp_shift_sum(I{}, row, d, C, lsp[i]);
    else
      for (int64_t c = 0; c < C; ++c) d[c] = std::exp(row[c] - lsp[i]);
    for (int64_t c = 0; c < C; ++c) d[c] = gi * (d[c] - sc);
    d[t[i]] -= gi * (T(1) - s);
  }
}

// bf16/f16 rows H through the f32 kernels: buf holds 2C floats (the widened row, then the forward's
// scratch or the backward's f32 dx row).
template <class I, class H> void ce_forward_rows_half(const H* x, const int64_t* t, float* lp, float* lsp, int64_t r0, int64_t r1,
                                                      int64_t C, int64_t ignore_index, double smoothing, float* buf) {
  for (int64_t i = r0; i < r1; ++i) {
    const H* row = x + i * C;
    for (int64_t c = 0; c < C; ++c) buf[c] = static_cast<float>(row[c]);
    ce_forward_rows<I, float>(buf, t + i, lp + i, lsp + i, 0, 1, C, ignore_index, smoothing, buf + C);
  }
}

template <class I, class H> void ce_backward_rows_half(const H* x, const float* lsp, const float* gp, const int64_t* t, H* dx, int64_t r0,
                                                       int64_t r1, int64_t C, int64_t ignore_index, double smoothing, float* buf) {
  for (int64_t i = r0; i < r1; ++i) {
    const H* row = x + i * C;
    H* d = dx + i * C;
    for (int64_t c = 0; c < C; ++c) buf[c] = static_cast<float>(row[c]);
    ce_backward_rows<I, float>(buf, lsp + i, gp + i, t + i, buf + C, 0, 1, C, ignore_index, smoothing);
    for (int64_t c = 0; c < C; ++c) d[c] = H(buf[C + c]);
  }
}

}  // namespace

void Cpu::cross_entropy_forward(M loss, M lse, V logits, V targets, int64_t ignore_index, double smoothing) {
  ce_check_views("cross_entropy", logits.layout);
  const int64_t N = logits.layout.shape[0], C = logits.layout.shape[1];
  const int64_t* t = targets.storage.as<int64_t>() + targets.layout.offset;
  const int64_t grain = std::max<int64_t>(1, kGrainMath / C);
  visit_dtype(logits.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* x = logits.storage.as<T>() + logits.layout.offset;
      T* lp = loss.storage.as<T>() + loss.layout.offset;
      T* lsp = lse.storage.as<T>() + lse.layout.offset;
      const auto rows = pick<ce_forward_rows<Baseline, T>, ce_forward_rows<Avx2, T>, ce_forward_rows<Avx512, T>>();
      parallel_for(N, grain, [&](int64_t b, int64_t e) {
        std::vector<float> scratch(std::is_same_v<T, float> ? static_cast<size_t>(C) : 0);
        rows(x, t, lp, lsp, b, e, C, ignore_index, smoothing, scratch.data());
      });
    } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const T* x = logits.storage.as<T>() + logits.layout.offset;
      float* lp = loss.storage.as<float>() + loss.layout.offset;
      float* lsp = lse.storage.as<float>() + lse.layout.offset;
      const auto rows = pick<ce_forward_rows_half<Baseline, T>, ce_forward_rows_half<Avx2, T>, ce_forward_rows_half<Avx512, T>>();
      parallel_for(N, grain, [&](int64_t b, int64_t e) {
        std::vector<float> buf(static_cast<size_t>(2 * C));
        rows(x, t, lp, lsp, b, e, C, ignore_index, smoothing, buf.data());
      });
    } else {
      fail("cross_entropy: float logits only, got {}", logits.dtype);
    }
  });
}

void Cpu::cross_entropy_backward(M dlogits, V logits, V lse, V targets, V g, int64_t ignore_index, double smoothing) {
  ce_check_views("cross_entropy_backward", logits.layout);
  const int64_t N = logits.layout.shape[0], C = logits.layout.shape[1];
  const int64_t* t = targets.storage.as<int64_t>() + targets.layout.offset;
  const int64_t grain = std::max<int64_t>(1, kGrainMath / C);
  visit_dtype(logits.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* x = logits.storage.as<T>() + logits.layout.offset;
      const T* lsp = lse.storage.as<T>() + lse.layout.offset;
      const T* gp = g.storage.as<T>() + g.layout.offset;
      T* dx = dlogits.storage.as<T>() + dlogits.layout.offset;
      const auto rows = pick<ce_backward_rows<Baseline, T>, ce_backward_rows<Avx2, T>, ce_backward_rows<Avx512, T>>();
      parallel_for(N, grain, [&](int64_t b, int64_t e) { rows(x, lsp, gp, t, dx, b, e, C, ignore_index, smoothing); });
    } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const T* x = logits.storage.as<T>() + logits.layout.offset;
      const float* lsp = lse.storage.as<float>() + lse.layout.offset;
      const float* gp = g.storage.as<float>() + g.layout.offset;
      T* dx = dlogits.storage.as<T>() + dlogits.layout.offset;
      const auto rows = pick<ce_backward_rows_half<Baseline, T>, ce_backward_rows_half<Avx2, T>, ce_backward_rows_half<Avx512, T>>();
      parallel_for(N, grain, [&](int64_t b, int64_t e) {
        std::vector<float> buf(static_cast<size_t>(2 * C));
        rows(x, lsp, gp, t, dx, b, e, C, ignore_index, smoothing, buf.data());
      });
    } else {
      fail("cross_entropy_backward: float logits only, got {}", logits.dtype);
    }
  });
}

}  // namespace kiln
