// Fused softmax / log_softmax over the last axis of a contiguous tensor, forward and backward.
// Forward, per row (f32, AVX2): one pass for the max, one fused pass y = exp(x - max) with the running
// sum, one pass scaling by 1/sum (log: y = (x - max) - log sum). Rows are in L1 between passes, so the
// row is read from memory once and written once. bf16/f16 rows go through a float buffer; f64 rows use
// scalar double math. Rows are split over the threads.
#include <vector>

#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/cpu/vecmath.hpp"

namespace kiln {
using namespace cpu;

namespace {

float row_max(const float* x, int64_t n) {
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
#ifdef KILN_CPU_AVX2
  __m256 m0 = _mm256_set1_ps(m), m1 = m0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  m = vm::hmax8(_mm256_max_ps(m0, m1));
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// y = exp(x - c), returns the sum of y.
float exp_shift_sum(const float* x, float* y, int64_t n, float c) {
  int64_t i = 0;
  float s = 0.0f;
#ifdef KILN_CPU_AVX2
  const __m256 cv = _mm256_set1_ps(c);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 a = vm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), cv));
    const __m256 b = vm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), cv));
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  if (i + 8 <= n) {
    const __m256 a = vm::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), cv));
    _mm256_storeu_ps(y + i, a);
    s0 = _mm256_add_ps(s0, a);
    i += 8;
  }
  s = vm::hsum8(_mm256_add_ps(s0, s1));
  if (i < n) {
    alignas(32) float buf[8];
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j] - c;
    for (int64_t j = n - i; j < 8; ++j) buf[j] = -std::numeric_limits<float>::infinity();
    _mm256_store_ps(buf, vm::exp8(_mm256_load_ps(buf)));
    for (int64_t j = i; j < n; ++j) {
      y[j] = buf[j - i];
      s += buf[j - i];
    }
  }
#else
  for (; i < n; ++i) {
    y[i] = std::exp(x[i] - c);
    s += y[i];
  }
#endif
  return s;
}

void softmax_row_f32(const float* x, float* y, int64_t n, bool log) {
  const float m = row_max(x, n);
  if (log) {
    // y is scratch for the exponentials, then overwritten
    const float ls = std::log(exp_shift_sum(x, y, n, m));
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  } else {
    const float s = exp_shift_sum(x, y, n, m);
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
template <class F> void softmax_bwd_row(const F* y, const F* dy, F* dx, int64_t n, bool log) {
  using A = std::conditional_t<std::is_same_v<F, float>, double, F>;
  A s = 0;
  if (log) {
    for (int64_t i = 0; i < n; ++i) s += static_cast<A>(dy[i]);
    const F sf = static_cast<F>(s);
    if constexpr (std::is_same_v<F, float>) {
      vm::exp_n(y, dx, n);
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

void check_args(const char* op, Cpu::M out, Cpu::V x) {
  KILN_CHECK(out.layout.shape == x.layout.shape && out.dtype == x.dtype, "{}: out {} {} vs input {} {}", op, shape_str(out.layout.shape),
             out.dtype, shape_str(x.layout.shape), x.dtype);
  KILN_CHECK(x.layout.is_contiguous() && out.layout.is_contiguous(), "{}: needs contiguous tensors (shape {})", op,
             shape_str(x.layout.shape));
  KILN_CHECK(is_floating(x.dtype), "{}: needs a float dtype, got {} (shape {})", op, x.dtype, shape_str(x.layout.shape));
}

template <class T, class RowF> void for_rows(const Layout& l, RowF&& row) {
  const int64_t n = l.rank() == 0 ? 1 : l.shape.back();
  if (n == 0) return;
  const int64_t rows = l.numel() / n;
  parallel_for(rows, std::max<int64_t>(1, kGrainMath / n), [&](int64_t b, int64_t e) {
    std::vector<float> buf;
    for (int64_t r = b; r < e; ++r) row(r * n, n, buf);
  }, 1);
}

}  // namespace

void Cpu::softmax_lastdim(M out, V x, bool log) {
  check_args(log ? "log_softmax" : "softmax", out, x);
  visit_dtype(x.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (is_float_v<T>) {
      const T* xp = x.storage.as<T>() + x.layout.offset;
      T* yp = out.storage.as<T>() + out.layout.offset;
      for_rows<T>(x.layout, [&](int64_t o, int64_t n, std::vector<float>& buf) {
        if constexpr (std::is_same_v<T, float>) {
          softmax_row_f32(xp + o, yp + o, n, log);
        } else if constexpr (std::is_same_v<T, double>) {
          softmax_row_f64(xp + o, yp + o, n, log);
        } else {
          buf.resize(static_cast<size_t>(2 * n));
          for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = static_cast<float>(xp[o + i]);
          softmax_row_f32(buf.data(), buf.data() + n, n, log);
          for (int64_t i = 0; i < n; ++i) yp[o + i] = T(buf[static_cast<size_t>(n + i)]);
        }
      });
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
      for_rows<T>(y.layout, [&](int64_t o, int64_t n, std::vector<float>& buf) {
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          softmax_bwd_row<T>(yp + o, gp + o, dp + o, n, log);
        } else {
          buf.resize(static_cast<size_t>(3 * n));
          float* by = buf.data();
          float* bg = by + n;
          float* bd = bg + n;
          for (int64_t i = 0; i < n; ++i) {
            by[i] = static_cast<float>(yp[o + i]);
            bg[i] = static_cast<float>(gp[o + i]);
          }
          softmax_bwd_row<float>(by, bg, bd, n, log);
          for (int64_t i = 0; i < n; ++i) dp[o + i] = T(bd[i]);
        }
      });
    }
  });
}


// ------------------------------------------------------------------------------ cross-entropy
// Fused softmax cross-entropy (contract in core/fused_loss.hpp): rows of contiguous f32/f64 logits
// [N, C], one row per task. The forward makes one pass for the max and one for Σ exp (into a scratch
// row); the backward writes exp(x − lse) straight into dx and finishes the row in place.
namespace {

template <class T> void ce_check_views(const char* op, const Layout& x, DType d) {
  KILN_CHECK(x.rank() == 2 && x.is_contiguous(), "{}: logits must be contiguous [N, C], got {}", op, shape_str(x.shape));
  KILN_CHECK(d == DType::f32 || d == DType::f64, "{}: f32/f64 logits only, got {}", op, d);
}

template <class T> T ce_row_lse(const T* x, int64_t C, std::vector<float>& scratch) {
  if constexpr (std::is_same_v<T, float>) {
    const float m = row_max(x, C);
    if (m == -std::numeric_limits<float>::infinity()) return m;
    scratch.resize(static_cast<size_t>(C));
    return m + std::log(exp_shift_sum(x, scratch.data(), C, m));
  } else {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[c]);
    if (m == -std::numeric_limits<T>::infinity()) return m;
    T s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[c] - m);
    return m + std::log(s);
  }
}

}  // namespace

void Cpu::cross_entropy_forward(M loss, M lse, V logits, V targets, int64_t ignore_index, double smoothing) {
  const int64_t N = logits.layout.shape[0], C = logits.layout.shape[1];
  visit_dtype(logits.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      ce_check_views<T>("cross_entropy", logits.layout, logits.dtype);
      const T* x = logits.storage.as<T>() + logits.layout.offset;
      const int64_t* t = targets.storage.as<int64_t>() + targets.layout.offset;
      T* lp = loss.storage.as<T>() + loss.layout.offset;
      T* lsp = lse.storage.as<T>() + lse.layout.offset;
      const T s = static_cast<T>(smoothing);
      parallel_for(N, std::max<int64_t>(1, kGrainMath / C), [&](int64_t b, int64_t e) {
        std::vector<float> scratch;
        for (int64_t i = b; i < e; ++i) {
          const T* row = x + i * C;
          const T l = ce_row_lse<T>(row, C, scratch);
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
      });
    } else {
      fail("cross_entropy: f32/f64 logits only, got {}", logits.dtype);
    }
  });
}

void Cpu::cross_entropy_backward(M dlogits, V logits, V lse, V targets, V g, int64_t ignore_index, double smoothing) {
  const int64_t N = logits.layout.shape[0], C = logits.layout.shape[1];
  visit_dtype(logits.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      ce_check_views<T>("cross_entropy_backward", logits.layout, logits.dtype);
      const T* x = logits.storage.as<T>() + logits.layout.offset;
      const T* lsp = lse.storage.as<T>() + lse.layout.offset;
      const T* gp = g.storage.as<T>() + g.layout.offset;
      const int64_t* t = targets.storage.as<int64_t>() + targets.layout.offset;
      T* dx = dlogits.storage.as<T>() + dlogits.layout.offset;
      const T s = static_cast<T>(smoothing), sc = s / static_cast<T>(C);
      parallel_for(N, std::max<int64_t>(1, kGrainMath / C), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const T* row = x + i * C;
          T* d = dx + i * C;
          if (t[i] == ignore_index) {
            std::fill(d, d + C, T(0));
            continue;
          }
          const T gi = gp[i];
          if constexpr (std::is_same_v<T, float>) (void)exp_shift_sum(row, d, C, lsp[i]);
          else
            for (int64_t c = 0; c < C; ++c) d[c] = std::exp(row[c] - lsp[i]);
          for (int64_t c = 0; c < C; ++c) d[c] = gi * (d[c] - sc);
          d[t[i]] -= gi * (T(1) - s);
        }
      });
    } else {
      fail("cross_entropy_backward: f32/f64 logits only, got {}", logits.dtype);
    }
  });
}

}  // namespace kiln
