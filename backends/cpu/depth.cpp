// Fused depth attention (Attention Residuals) over contiguous rows; contract and formulas in
// core/fused_depth.hpp. Rows are split over the threads. Forward: one pass over each source row for
// Σv² and q·v, one to accumulate h; backward: one pass for dh·v and q·v, one to write dv_i and
// accumulate dq. dq is summed per fixed chunk of rows, then over the chunks in order (deterministic for
// a given thread count, like RMSNorm's dw). `omp simd` reductions vectorise the row sums.
#include <cmath>
#include <vector>

#include "backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

template <class T> void depth_fwd(T* h, T* alpha, T* rstd, const std::vector<const T*>& v, const T* q, int64_t N, int64_t D, double eps) {
  const auto n = static_cast<int64_t>(v.size());
  parallel_for(N, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(n * D, 1)), [&](int64_t b, int64_t e) {
    std::vector<T> logit(static_cast<size_t>(n));
    for (int64_t t = b; t < e; ++t) {
      T m = -std::numeric_limits<T>::infinity();
      bool nan = false;
      for (int64_t i = 0; i < n; ++i) {
        const T* x = v[static_cast<size_t>(i)] + t * D;
        T ss = 0, s = 0;
#pragma omp simd reduction(+ : ss, s)
        for (int64_t k = 0; k < D; ++k) {
          ss += x[k] * x[k];
          s += q[k] * x[k];
        }
        const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps));
        rstd[i * N + t] = r;
        const T l = r * s;
        logit[static_cast<size_t>(i)] = l;
        nan = nan || l != l;
        m = l > m ? l : m;
      }
      T z = 0;
      for (int64_t i = 0; i < n; ++i) {
        T& l = logit[static_cast<size_t>(i)];
        l = nan ? std::numeric_limits<T>::quiet_NaN() : std::exp(l - m);
        z += l;
      }
      T* hr = h + t * D;
      for (int64_t i = 0; i < n; ++i) {
        const T a = logit[static_cast<size_t>(i)] / z;
        alpha[i * N + t] = a;
        const T* x = v[static_cast<size_t>(i)] + t * D;
        if (i == 0) {
#pragma omp simd
          for (int64_t k = 0; k < D; ++k) hr[k] = a * x[k];
        } else {
#pragma omp simd
          for (int64_t k = 0; k < D; ++k) hr[k] += a * x[k];
        }
      }
    }
  }, 1);
}

template <class T>
void depth_bwd(const std::vector<T*>& dv, T* dq, const std::vector<const T*>& v, const T* q, const T* alpha, const T* rstd, const T* dh,
               int64_t N, int64_t D) {
  const auto n = static_cast<int64_t>(v.size());
  const int nt = std::max(1, num_threads());
  std::vector<std::vector<T>> partial(static_cast<size_t>(nt));
  const int64_t grain = std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(n * D, 1));
  const int64_t chunk = (N + nt - 1) / nt;
  // Rows split into nt fixed chunks (not parallel_for's), so dq's summation order never changes.
  auto body = [&](int th) {
    const int64_t b = std::min<int64_t>(N, chunk * th), e = std::min<int64_t>(N, b + chunk);
    std::vector<T>& acc = partial[static_cast<size_t>(th)];
    acc.assign(static_cast<size_t>(D), T(0));
    std::vector<T> a(static_cast<size_t>(n)), s(static_cast<size_t>(n));
    for (int64_t t = b; t < e; ++t) {
      const T* g = dh + t * D;
      T dot = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* x = v[static_cast<size_t>(i)] + t * D;
        T ai = 0, si = 0;
#pragma omp simd reduction(+ : ai, si)
        for (int64_t k = 0; k < D; ++k) {
          ai += g[k] * x[k];
          si += q[k] * x[k];
        }
        a[static_cast<size_t>(i)] = ai;
        s[static_cast<size_t>(i)] = si;
        dot += alpha[i * N + t] * ai;
      }
      for (int64_t i = 0; i < n; ++i) {
        const T al = alpha[i * N + t], r = rstd[i * N + t];
        const T c = al * (a[static_cast<size_t>(i)] - dot) * r;
        const T ce = c * s[static_cast<size_t>(i)] * r * r / static_cast<T>(D);
        const T* x = v[static_cast<size_t>(i)] + t * D;
        T* d = dv[static_cast<size_t>(i)] + t * D;
        T* ac = acc.data();
#pragma omp simd
        for (int64_t k = 0; k < D; ++k) {
          d[k] = al * g[k] + c * q[k] - ce * x[k];
          ac[k] += c * x[k];
        }
      }
    }
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

}  // namespace kiln
