// Multi-tensor Adam/AdamW (contract in core/fused_optim.hpp): all parameters of a group are updated
// in one parallel region; the elements of every tensor are concatenated logically and split evenly
// over the threads, and each element is read and written once (w, m, v) in one fused loop: f32 in
// 8 (AVX2 + FMA) or 16 (AVX-512) lanes of intrinsics, f64 and the baseline element by element (a kernel
// with variants per instruction set, common.hpp).
//
// Sum of squares (the squared global gradient norm): the tensors' elements, concatenated logically,
// are cut into fixed chunks of kSumChunk elements; each chunk's Σ x² is taken in f64 and the chunk sums
// are added in chunk order. The chunks do not depend on the thread count, so neither does the result.
#include <algorithm>
#include <cmath>

#include "kiln/backends/cpu/common.hpp"
#include "kiln/core/fused_optim.hpp"

namespace kiln {
using namespace cpu;

namespace {

// The step's constants in the element type.
template <class T> struct AdamK {
  T b1, b2, ob1, ob2, decay, wd, step, inv_bc2, eps;
  bool l2, dec;
  explicit AdamK(const fused::AdamHyper& h)
      : b1(static_cast<T>(h.beta1)),
        b2(static_cast<T>(h.beta2)),
        ob1(static_cast<T>(1.0 - h.beta1)),
        ob2(static_cast<T>(1.0 - h.beta2)),
        decay(static_cast<T>(1.0 - h.lr * h.weight_decay)),
        wd(static_cast<T>(h.weight_decay)),
        step(static_cast<T>(h.lr / h.bc1)),
        inv_bc2(static_cast<T>(1.0 / h.bc2_sqrt)),
        eps(static_cast<T>(h.eps)),
        l2(!h.decoupled && h.weight_decay != 0),
        dec(h.decoupled && h.weight_decay != 0) {}
};

// f32 elements [0, n) in vectors (the same formula as the scalar loop below, lane by lane); returns
// how many were done. GCC does not vectorise the scalar loop: std::sqrt keeps errno.
inline int64_t adam_vec(Baseline, float*, float*, float*, const float*, int64_t, const AdamK<float>&) { return 0; }
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
inline int64_t adam_vec(Avx2, float* w, float* m, float* v, const float* g, int64_t n, const AdamK<float>& k) {
  const __m256 b1 = _mm256_set1_ps(k.b1), b2 = _mm256_set1_ps(k.b2), ob1 = _mm256_set1_ps(k.ob1), ob2 = _mm256_set1_ps(k.ob2),
               decay = _mm256_set1_ps(k.decay), wd = _mm256_set1_ps(k.wd), step = _mm256_set1_ps(k.step),
               inv_bc2 = _mm256_set1_ps(k.inv_bc2), eps = _mm256_set1_ps(k.eps);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wi = _mm256_loadu_ps(w + i), gi = _mm256_loadu_ps(g + i);
    if (k.dec) wi = _mm256_mul_ps(wi, decay);
    if (k.l2) gi = _mm256_fmadd_ps(wd, wi, gi);
    const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(ob1, gi));
    const __m256 vi = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(ob2, _mm256_mul_ps(gi, gi)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), inv_bc2, eps);
    _mm256_storeu_ps(w + i, _mm256_fnmadd_ps(step, _mm256_div_ps(mi, den), wi));
  }
  return i;
}
KILN_CPU_AVX2_END
KILN_CPU_AVX512_BEGIN
inline int64_t adam_vec(Avx512, float* w, float* m, float* v, const float* g, int64_t n, const AdamK<float>& k) {
  const __m512 b1 = _mm512_set1_ps(k.b1), b2 = _mm512_set1_ps(k.b2), ob1 = _mm512_set1_ps(k.ob1), ob2 = _mm512_set1_ps(k.ob2),
               decay = _mm512_set1_ps(k.decay), wd = _mm512_set1_ps(k.wd), step = _mm512_set1_ps(k.step),
               inv_bc2 = _mm512_set1_ps(k.inv_bc2), eps = _mm512_set1_ps(k.eps);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 wi = _mm512_loadu_ps(w + i), gi = _mm512_loadu_ps(g + i);
    if (k.dec) wi = _mm512_mul_ps(wi, decay);
    if (k.l2) gi = _mm512_fmadd_ps(wd, wi, gi);
    const __m512 mi = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(ob1, gi));
    const __m512 vi = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(ob2, _mm512_mul_ps(gi, gi)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 den = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_bc2, eps);
    _mm512_storeu_ps(w + i, _mm512_fnmadd_ps(step, _mm512_div_ps(mi, den), wi));
  }
  return i + adam_vec(Avx2{}, w + i, m + i, v + i, g + i, n - i, k);
}
KILN_CPU_AVX512_END
#endif

// Kernel (common.hpp): n elements of one parameter; f32 in vectors (adam_vec), the rest element by element.
template <class I, class T> void adam_range(T* w, T* m, T* v, const T* g, int64_t n, const fused::AdamHyper& h) {
  const AdamK<T> k(h);
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) i = adam_vec(I{}, w, m, v, g, n, k);
  for (; i < n; ++i) {
    T wi = w[i], gi = g[i];
    if (k.dec) wi *= k.decay;
    if (k.l2) gi += k.wd * wi;
    const T mi = k.b1 * m[i] + k.ob1 * gi;
    const T vi = k.b2 * v[i] + k.ob2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - k.step * (mi / (std::sqrt(vi) * k.inv_bc2 + k.eps));
  }
}

// Kernel: Σ x² of n elements, each squared and summed in f64 (8 independent partial sums).
template <class I, class T> double sumsq_range(const T* x, int64_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]);
    acc += d * d;
  }
  return acc;
}

constexpr int64_t kSumChunk = 1 << 16;

// Calls f(i, lo, hi) for the pieces [lo, hi) of tensor i that make up [b, e) of the concatenation
// (start: the prefix sums of the tensors' sizes).
template <class F> void for_pieces(const std::vector<int64_t>& start, int64_t b, int64_t e, F&& f) {
  size_t i = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
  for (int64_t pos = b; pos < e; ++i) {
    const int64_t lo = pos - start[i], hi = std::min(e, start[i + 1]) - start[i];
    if (hi > lo) f(i, lo, hi);
    pos = start[i] + hi;
  }
}

}  // namespace

void Cpu::sum_squares(M out, const std::vector<V>& xs) {
  KILN_CHECK(out.dtype == DType::f64 && out.layout.numel() == 1, "sum_squares: out must be one f64, got {} {}", out.dtype,
             shape_str(out.layout.shape));
  std::vector<int64_t> start(xs.size() + 1, 0);
  for (size_t i = 0; i < xs.size(); ++i) {
    KILN_CHECK((xs[i].dtype == DType::f32 || xs[i].dtype == DType::f64) && xs[i].layout.is_contiguous(),
               "sum_squares: contiguous f32/f64 tensors only, got {} {} (tensor {})", xs[i].dtype, shape_str(xs[i].layout.shape), i);
    start[i + 1] = start[i] + xs[i].layout.numel();
  }
  const auto f32 = pick<sumsq_range<Baseline, float>, sumsq_range<Avx2, float>, sumsq_range<Avx512, float>>();
  const auto f64 = pick<sumsq_range<Baseline, double>, sumsq_range<Avx2, double>, sumsq_range<Avx512, double>>();
  const int64_t chunks = (start.back() + kSumChunk - 1) / kSumChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  parallel_for(
      chunks, std::max<int64_t>(1, kGrainCheap / kSumChunk),
      [&](int64_t cb, int64_t ce) {
        for (int64_t c = cb; c < ce; ++c) {
          double acc = 0;
          for_pieces(start, c * kSumChunk, std::min(start.back(), (c + 1) * kSumChunk), [&](size_t i, int64_t lo, int64_t hi) {
            const V& x = xs[i];
            acc += x.dtype == DType::f32 ? f32(x.storage.as<float>() + x.layout.offset + lo, hi - lo)
                                         : f64(x.storage.as<double>() + x.layout.offset + lo, hi - lo);
          });
          part[static_cast<size_t>(c)] = acc;
        }
      },
      1);
  double total = 0;
  for (double p : part) total += p;
  out.storage.as<double>()[out.layout.offset] = total;
}

void Cpu::adam_step(const std::vector<M>& w, const std::vector<M>& m, const std::vector<M>& v, const std::vector<V>& g,
                    const fused::AdamHyper& h) {
  std::vector<int64_t> start(w.size() + 1, 0);
  for (size_t i = 0; i < w.size(); ++i) {
    KILN_CHECK(w[i].dtype == DType::f32 || w[i].dtype == DType::f64, "adam_step: f32/f64 only, got {}", w[i].dtype);
    start[i + 1] = start[i] + w[i].layout.numel();
  }
  const auto range_f32 = pick<adam_range<Baseline, float>, adam_range<Avx2, float>, adam_range<Avx512, float>>();
  const auto range_f64 = pick<adam_range<Baseline, double>, adam_range<Avx2, double>>();
  parallel_for(start.back(), kGrainCheap / 4, [&](int64_t b, int64_t e) {
    for_pieces(start, b, e, [&](size_t i, int64_t lo, int64_t hi) {
      auto run = [&]<class T>(void (*range)(T*, T*, T*, const T*, int64_t, const fused::AdamHyper&)) {
        range(w[i].storage.as<T>() + w[i].layout.offset + lo, m[i].storage.as<T>() + m[i].layout.offset + lo,
              v[i].storage.as<T>() + v[i].layout.offset + lo, g[i].storage.as<T>() + g[i].layout.offset + lo, hi - lo, h);
      };
      if (w[i].dtype == DType::f32)
        run(range_f32);
      else
        run(range_f64);
    });
  });
}

}  // namespace kiln
