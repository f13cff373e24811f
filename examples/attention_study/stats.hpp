#pragma once
// The statistics of the attention study (examples/attention_study/attention_study.cpp), kept apart so
// the smoke test (--self-test) checks them on samples with known answers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace study {

// Mean and sample standard deviation (divisor n − 1; 0 for one value) of the finite values; n counts them.
struct MeanStd {
  double mean = std::numeric_limits<double>::quiet_NaN(), std = std::numeric_limits<double>::quiet_NaN();
  int64_t n = 0;
};

inline MeanStd mean_std(const std::vector<double>& xs) {
  MeanStd r;
  double s = 0;
  for (double x : xs)
    if (std::isfinite(x)) s += x, ++r.n;
  if (r.n == 0) return r;
  r.mean = s / static_cast<double>(r.n);
  double ss = 0;
  for (double x : xs)
    if (std::isfinite(x)) ss += (x - r.mean) * (x - r.mean);
  r.std = r.n > 1 ? std::sqrt(ss / static_cast<double>(r.n - 1)) : 0.0;
  return r;
}

// Pearson kurtosis m4 / m2² with population moments (a Gaussian gives 3, not the excess 0): the
// statistic outlier studies report for activations. Accumulated in double. NaN for an empty or constant sample.
inline double kurtosis(const std::vector<float>& x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  double mu = 0;
  for (float v : x) mu += v;
  mu /= static_cast<double>(x.size());
  double m2 = 0, m4 = 0;
  for (float v : x) {
    const double d = v - mu, d2 = d * d;
    m2 += d2;
    m4 += d2 * d2;
  }
  m2 /= static_cast<double>(x.size());
  m4 /= static_cast<double>(x.size());
  return m2 > 0 ? m4 / (m2 * m2) : std::numeric_limits<double>::quiet_NaN();
}

// The largest magnitudes of a sample, as the Diff Transformer paper's Table 6 reports them: the k-th
// largest |x| for k = 1, 10, 100 (NaN when the sample is smaller) and the median |x| (for an even
// count, the mean of the two middle values).
struct Magnitudes {
  double top1 = 0, top10 = 0, top100 = 0, median = 0;
};

inline Magnitudes magnitudes(const std::vector<float>& x) {
  std::vector<double> a(x.size());
  for (size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(static_cast<double>(x[i]));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (a.empty()) return {nan, nan, nan, nan};
  auto kth_largest = [&](size_t k) {
    if (k > a.size()) return nan;
    std::nth_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(k - 1), a.end(), std::greater<double>());
    return a[k - 1];
  };
  Magnitudes m;
  m.top1 = kth_largest(1);
  m.top10 = kth_largest(10);
  m.top100 = kth_largest(100);
  const size_t n = a.size(), mid = n / 2;
  std::nth_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(mid), a.end());
  const double hi = a[mid];
  if (n % 2 == 1) {
    m.median = hi;
  } else {
    const double lo = *std::max_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(mid));
    m.median = 0.5 * (lo + hi);
  }
  return m;
}

// The compute at which a loss curve first reaches `target`: the curve is (flops[i], loss[i]) with flops
// increasing, linearly interpolated between points; the first segment that goes from above the target
// to at or below it gives the crossing. A curve that starts at or below the target gives flops[0]; one
// that never reaches it gives NaN (the reader is told "not reached within the budget", never an
// extrapolation).
inline double flops_to_reach(const std::vector<double>& flops, const std::vector<double>& loss, double target) {
  const size_t n = std::min(flops.size(), loss.size());
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  if (loss[0] <= target) return flops[0];
  for (size_t i = 1; i < n; ++i) {
    if (loss[i] <= target) {
      const double t = (loss[i - 1] - target) / (loss[i - 1] - loss[i]);
      return flops[i - 1] + t * (flops[i] - flops[i - 1]);
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace study
