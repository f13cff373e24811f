// Multi-tensor Adam/AdamW (contract in core/fused_optim.hpp): all parameters of a group are updated
// in one parallel region; the elements of every tensor are concatenated logically and split evenly
// over the threads, and each element is read and written once (w, m, v) in a fused loop the compiler
// vectorises (a kernel with variants per instruction set, common.hpp: SSE2 at baseline, AVX2 + FMA).
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

// Kernel (common.hpp): n elements of one parameter.
template <class I, class T>
void adam_range(T* w, T* m, T* v, const T* g, int64_t n, const fused::AdamHyper& h) {
  const T b1 = static_cast<T>(h.beta1), b2 = static_cast<T>(h.beta2), ob1 = static_cast<T>(1.0 - h.beta1),
          ob2 = static_cast<T>(1.0 - h.beta2);
  const T decay = static_cast<T>(1.0 - h.lr * h.weight_decay), wd = static_cast<T>(h.weight_decay);
  const T step = static_cast<T>(h.lr / h.bc1), inv_bc2 = static_cast<T>(1.0 / h.bc2_sqrt), eps = static_cast<T>(h.eps);
  const bool l2 = !h.decoupled && h.weight_decay != 0, dec = h.decoupled && h.weight_decay != 0;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T wi = w[i], gi = g[i];
    if (dec) wi *= decay;
    if (l2) gi += wd * wi;
    const T mi = b1 * m[i] + ob1 * gi;
    const T vi = b2 * v[i] + ob2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step * (mi / (std::sqrt(vi) * inv_bc2 + eps));
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
  parallel_for(chunks, std::max<int64_t>(1, kGrainCheap / kSumChunk), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      double acc = 0;
      for_pieces(start, c * kSumChunk, std::min(start.back(), (c + 1) * kSumChunk), [&](size_t i, int64_t lo, int64_t hi) {
        const V& x = xs[i];
        acc += x.dtype == DType::f32 ? f32(x.storage.as<float>() + x.layout.offset + lo, hi - lo)
                                     : f64(x.storage.as<double>() + x.layout.offset + lo, hi - lo);
      });
      part[static_cast<size_t>(c)] = acc;
    }
  }, 1);
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
  const auto range_f32 = pick<adam_range<Baseline, float>, adam_range<Avx2, float>>();
  const auto range_f64 = pick<adam_range<Baseline, double>, adam_range<Avx2, double>>();
  parallel_for(start.back(), kGrainCheap / 4, [&](int64_t b, int64_t e) {
    for_pieces(start, b, e, [&](size_t i, int64_t lo, int64_t hi) {
      auto run = [&]<class T>(void (*range)(T*, T*, T*, const T*, int64_t, const fused::AdamHyper&)) {
        range(w[i].storage.as<T>() + w[i].layout.offset + lo, m[i].storage.as<T>() + m[i].layout.offset + lo,
              v[i].storage.as<T>() + v[i].layout.offset + lo, g[i].storage.as<T>() + g[i].layout.offset + lo, hi - lo, h);
      };
      if (w[i].dtype == DType::f32) run(range_f32);
      else run(range_f64);
    });
  });
}

}  // namespace kiln
