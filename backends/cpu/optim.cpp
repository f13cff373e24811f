// Multi-tensor Adam/AdamW (contract in core/fused_optim.hpp): all parameters of a group are updated
// in one parallel region; the elements of every tensor are concatenated logically and split evenly
// over the threads, and each element is read and written once (w, m, v) in a fused loop the compiler
// vectorises (a kernel with variants per instruction set, common.hpp: SSE2 at baseline, AVX2 + FMA).
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

}  // namespace

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
    size_t i = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    for (int64_t pos = b; pos < e; ++i) {
      const int64_t lo = pos - start[i], hi = std::min(e, start[i + 1]) - start[i];
      if (hi > lo) {
        auto run = [&]<class T>(void (*range)(T*, T*, T*, const T*, int64_t, const fused::AdamHyper&)) {
          range(w[i].storage.as<T>() + w[i].layout.offset + lo, m[i].storage.as<T>() + m[i].layout.offset + lo,
                v[i].storage.as<T>() + v[i].layout.offset + lo, g[i].storage.as<T>() + g[i].layout.offset + lo, hi - lo, h);
        };
        if (w[i].dtype == DType::f32) run(range_f32);
        else run(range_f64);
      }
      pos = start[i] + hi;
    }
  });
}

}  // namespace kiln
