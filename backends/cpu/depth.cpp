// Fused depth attention (Attention Residuals) over contiguous rows, and the two primitives of its
// two-phase inference; contract and formulas in core/fused_depth.hpp. Rows are split over the threads. Forward: one pass over each source
// row for Σv² and q·v, one to accumulate h; backward: one pass for dh·v and q·v, one to write dv_i and accumulate dq. dq is summed per
// fixed chunk of rows, then over the chunks in order (deterministic for a given thread count, like RMSNorm's dw). Row sums through dot2
// (common.hpp); the row loops are kernels with variants per instruction set (common.hpp).
#include <cmath>
#include <vector>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

// out = w·x (first) or out += w·x over a row.
template <class T> inline void weighted_add(T* out, T w, const T* x, int64_t D, bool first) {
  if (first) {
#pragma omp simd
    for (int64_t k = 0; k < D; ++k) out[k] = w * x[k];
  } else {
#pragma omp simd
    for (int64_t k = 0; k < D; ++k) out[k] += w * x[k];
  }
}

// ---------------------------------------------------------------------------------- kernels
// Kernels (common.hpp), each over rows [b, e) of D elements; v holds the n source row pointers.

// Forward; logit: n scratch values.
template <class I, class T> void depth_fwd_rows(T* h, T* alpha, T* rstd, const T* const* v, int64_t n, const T* q, int64_t b, int64_t e,
                                                int64_t N, int64_t D, double eps, T* logit) {
  for (int64_t t = b; t < e; ++t) {
    T m = -std::numeric_limits<T>::infinity();
    bool nan = false;
    for (int64_t i = 0; i < n; ++i) {
      const T* x = v[i] + t * D;
      T ss, s;
      dot2(I{}, x, x, q, D, ss, s);
      const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps));
      rstd[i * N + t] = r;
      const T l = r * s;
      logit[i] = l;
      nan = nan || l != l;
      m = l > m ? l : m;
    }
    T z = 0;
    for (int64_t i = 0; i < n; ++i) {
      T& l = logit[i];
      l = nan ? std::numeric_limits<T>::quiet_NaN() : std::exp(l - m);
      z += l;
    }
    T* hr = h + t * D;
    for (int64_t i = 0; i < n; ++i) {
      const T a = logit[i] / z;
      alpha[i * N + t] = a;
      weighted_add(hr, a, v[i] + t * D, D, i == 0);
    }
  }
}

// Backward: dv rows written, dq's terms accumulated into acc (D wide); a, s: n scratch values each.
template <class I, class T> void depth_bwd_rows(T* const* dv, T* acc, const T* const* v, int64_t n, const T* q, const T* alpha,
                                                const T* rstd, const T* dh, int64_t b, int64_t e, int64_t N, int64_t D, T* a, T* s) {
  for (int64_t t = b; t < e; ++t) {
    const T* g = dh + t * D;
    T dot = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* x = v[i] + t * D;
      T ai, si;
      dot2(I{}, x, g, q, D, ai, si);
      a[i] = ai;
      s[i] = si;
      dot += alpha[i * N + t] * ai;
    }
    for (int64_t i = 0; i < n; ++i) {
      const T al = alpha[i * N + t], r = rstd[i * N + t];
      const T c = al * (a[i] - dot) * r;
      const T ce = c * s[i] * r * r / static_cast<T>(D);
      const T* x = v[i] + t * D;
      T* d = dv[i] + t * D;
#pragma omp simd
      for (int64_t k = 0; k < D; ++k) {
        d[k] = al * g[k] + c * q[k] - ce * x[k];
        acc[k] += c * x[k];
      }
    }
  }
}

// Phase 1 of two-phase inference: S queries against n sources, per row; w: n·S scratch values.
template <class I, class T> void depth_phase1_rows(T* m, T* l, T* acc, const T* const* v, int64_t n, const T* Q, int64_t S, int64_t b,
                                                   int64_t e, int64_t N, int64_t D, double eps, T* w) {
  for (int64_t t = b; t < e; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      const T* x = v[i] + t * D;
      const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(dot(I{}, x, x, D)) / static_cast<double>(D) + eps));
      for (int64_t j = 0; j < S; ++j) w[i * S + j] = r * dot(I{}, x, Q + j * D, D);
    }
    for (int64_t j = 0; j < S; ++j) {
      T mj = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        const T x = w[i * S + j];
        mj = (x > mj || x != x) ? x : mj;  // NaN propagates
      }
      T lj = 0;
      for (int64_t i = 0; i < n; ++i) {
        T& x = w[i * S + j];
        x = std::exp(x - mj);
        lj += x;
      }
      m[j * N + t] = mj;
      l[j * N + t] = lj;
      T* a = acc + (j * N + t) * D;
      for (int64_t i = 0; i < n; ++i) weighted_add(a, w[i * S + j], v[i] + t * D, D, i == 0);
    }
  }
}

// Phase 2: one online-softmax step merging the partial p (or none) into a query's statistics.
template <class I, class T>
void depth_merge_rows(T* h, const T* m, const T* l, const T* acc, const T* p, const T* q, int64_t b, int64_t e, int64_t D, double eps) {
  for (int64_t t = b; t < e; ++t) {
    const T* a = acc + t * D;
    T* hr = h + t * D;
    if (!p) {
      const T lt = l[t];
#pragma omp simd
      for (int64_t k = 0; k < D; ++k) hr[k] = a[k] / lt;
      continue;
    }
    const T* x = p + t * D;
    T ss, s;
    dot2(I{}, x, x, q, D, ss, s);
    const T lp = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps)) * s;
    const T mt = m[t], mx = (lp > mt || lp != lp) ? lp : mt;
    const T wa = std::exp(mt - mx), wb = std::exp(lp - mx);
    const T z = l[t] * wa + wb;
#pragma omp simd
    for (int64_t k = 0; k < D; ++k) hr[k] = (a[k] * wa + x[k] * wb) / z;
  }
}

// ---------------------------------------------------------------------------------- drivers
template <class T> void depth_fwd(T* h, T* alpha, T* rstd, const std::vector<const T*>& v, const T* q, int64_t N, int64_t D, double eps) {
  const auto n = static_cast<int64_t>(v.size());
  const auto rows = pick<depth_fwd_rows<Baseline, T>, depth_fwd_rows<Avx2, T>>();
  parallel_for(
      N, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(n * D, 1)),
      [&](int64_t b, int64_t e) {
        std::vector<T> logit(static_cast<size_t>(n));
        rows(h, alpha, rstd, v.data(), n, q, b, e, N, D, eps, logit.data());
      },
      1);
}

template <class T> void depth_bwd(const std::vector<T*>& dv, T* dq, const std::vector<const T*>& v, const T* q, const T* alpha,
                                  const T* rstd, const T* dh, int64_t N, int64_t D) {
  const auto n = static_cast<int64_t>(v.size());
  const int nt = std::max(1, num_threads());
  std::vector<std::vector<T>> partial(static_cast<size_t>(nt));
  const int64_t grain = std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(n * D, 1));
  const int64_t chunk = (N + nt - 1) / nt;
  const auto rows = pick<depth_bwd_rows<Baseline, T>, depth_bwd_rows<Avx2, T>>();
  // Rows split into nt fixed chunks (not parallel_for's), so dq's summation order never changes.
  auto body = [&](int th) {
    const int64_t b = std::min<int64_t>(N, chunk * th), e = std::min<int64_t>(N, b + chunk);
    std::vector<T>& acc = partial[static_cast<size_t>(th)];
    acc.assign(static_cast<size_t>(D), T(0));
    std::vector<T> a(static_cast<size_t>(n)), s(static_cast<size_t>(n));
    rows(dv.data(), acc.data(), v.data(), n, q, alpha, rstd, dh, b, e, N, D, a.data(), s.data());
  };
  if (nt > 1 && N >= 2 * grain && !omp_in_parallel()) {
#pragma omp parallel num_threads(nt)
    body(omp_get_thread_num());
  } else {
    for (int th = 0; th < nt; ++th) body(th);
  }
  for (int64_t k = 0; k < D; ++k) dq[k] = T(0);
  for (int th = 0; th < nt; ++th)
    for (int64_t k = 0; k < D; ++k) dq[k] += partial[static_cast<size_t>(th)][static_cast<size_t>(k)];
}

template <class T>
void depth_phase1(T* m, T* l, T* acc, const std::vector<const T*>& v, const T* Q, int64_t S, int64_t N, int64_t D, double eps) {
  const auto n = static_cast<int64_t>(v.size());
  const auto rows = pick<depth_phase1_rows<Baseline, T>, depth_phase1_rows<Avx2, T>>();
  parallel_for(
      N, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(n * D * S, 1)),
      [&](int64_t b, int64_t e) {
        std::vector<T> w(static_cast<size_t>(n * S));  // logits, then weights, [i * S + j]
        rows(m, l, acc, v.data(), n, Q, S, b, e, N, D, eps, w.data());
      },
      1);
}

template <class T> void depth_merge(T* h, const T* m, const T* l, const T* acc, const T* p, const T* q, int64_t N, int64_t D, double eps) {
  const auto rows = pick<depth_merge_rows<Baseline, T>, depth_merge_rows<Avx2, T>>();
  parallel_for(
      N, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) { rows(h, m, l, acc, p, q, b, e, D, eps); },
      1);
}

template <class T, class X> const T* at(const X& x) { return ptr<T>(x.storage) + x.layout.offset; }
template <class T> T* at_mut(const Cpu::M& x) { return ptr<T>(x.storage) + x.layout.offset; }

}  // namespace

void Cpu::depth_attention_forward(M h, M alpha, M rstd, const std::vector<V>& v, V q, double eps) {
  const int64_t D = h.layout.shape.back(), N = h.layout.numel() / std::max<int64_t>(D, 1);
  float_types(h.dtype, "depth_attention", [&]<class T>(type_tag<T>) {
    std::vector<const T*> vp;
    for (const V& x : v) vp.push_back(at<T>(x));
    depth_fwd<T>(at_mut<T>(h), at_mut<T>(alpha), at_mut<T>(rstd), vp, at<T>(q), N, D, eps);
  });
}

void Cpu::depth_attention_backward(const std::vector<M>& dv, M dq, const std::vector<V>& v, V q, V alpha, V rstd, V dh) {
  const int64_t D = dh.layout.shape.back(), N = dh.layout.numel() / std::max<int64_t>(D, 1);
  float_types(dh.dtype, "depth_attention_backward", [&]<class T>(type_tag<T>) {
    std::vector<const T*> vp;
    std::vector<T*> dp;
    for (const V& x : v) vp.push_back(at<T>(x));
    for (const M& x : dv) dp.push_back(at_mut<T>(x));
    depth_bwd<T>(dp, at_mut<T>(dq), vp, at<T>(q), at<T>(alpha), at<T>(rstd), at<T>(dh), N, D);
  });
}

void Cpu::depth_attention_phase1(M m, M l, M acc, const std::vector<V>& v, V Q, double eps) {
  const int64_t S = Q.layout.shape[0], D = Q.layout.shape[1], N = m.layout.numel() / std::max<int64_t>(S, 1);
  float_types(Q.dtype, "depth_attention_phase1", [&]<class T>(type_tag<T>) {
    std::vector<const T*> vp;
    for (const V& x : v) vp.push_back(at<T>(x));
    depth_phase1<T>(at_mut<T>(m), at_mut<T>(l), at_mut<T>(acc), vp, at<T>(Q), S, N, D, eps);
  });
}

void Cpu::depth_attention_merge(M h, V m, V l, V acc, const V* p, V q, double eps) {
  const int64_t D = h.layout.shape.back(), N = h.layout.numel() / std::max<int64_t>(D, 1);
  float_types(h.dtype, "depth_attention_merge", [&]<class T>(type_tag<T>) {
    depth_merge<T>(at_mut<T>(h), at<T>(m), at<T>(l), at<T>(acc), p ? at<T>(*p) : nullptr, at<T>(q), N, D, eps);
  });
}

}  // namespace kiln
