// The vector math (backends/cpu/vecmath.hpp) per instruction set, in one run: each array function and
// a softmax row (row_max + exp_shift_sum + scale) on the baseline (scalar, libm), AVX2 and AVX-512
// variants, interleaved round by round so that load from elsewhere hits all alike; prints the median
// rate of each (Gelem/s, one thread) and the AVX-512 / AVX2 ratio. On a CPU without AVX-512 it prints
// AVX2 and baseline only.
//   bench_vecmath [n = 4096: floats per call, L1/L2-resident] [rounds = 41]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <kiln/backends/cpu/vecmath.hpp>

namespace {

using namespace kiln::cpu;
using Clock = std::chrono::steady_clock;

template <class I> struct Kernels {
  static void exp(const float* x, float* y, int64_t n) { vm::exp_n(I{}, x, y, n); }
  static void log(const float* x, float* y, int64_t n) { vm::log_n(I{}, x, y, n); }
  static void tanh(const float* x, float* y, int64_t n) { vm::tanh_n(I{}, x, y, n); }
  static void sigmoid(const float* x, float* y, int64_t n) { vm::sigmoid_n(I{}, x, y, n); }
  static void silu(const float* x, float* y, int64_t n) { vm::silu_n(I{}, x, y, n); }
  static void gelu_tanh(const float* x, float* y, int64_t n) { vm::gelu_tanh_n(I{}, x, y, n); }
  static void softmax(const float* x, float* y, int64_t n) {
    const float m = vm::row_max(I{}, x, n);
    const float r = 1.0f / vm::exp_shift_sum(I{}, x, y, n, m);
    for (int64_t i = 0; i < n; ++i) y[i] *= r;
  }
};
using Fn = void (*)(const float*, float*, int64_t);
struct Row {
  const char* name;
  Fn fn[3];  // baseline, avx2, avx512
};
const Row kRows[] = {
    {"exp", {Kernels<Baseline>::exp, Kernels<Avx2>::exp, Kernels<Avx512>::exp}},
    {"log", {Kernels<Baseline>::log, Kernels<Avx2>::log, Kernels<Avx512>::log}},
    {"tanh", {Kernels<Baseline>::tanh, Kernels<Avx2>::tanh, Kernels<Avx512>::tanh}},
    {"sigmoid", {Kernels<Baseline>::sigmoid, Kernels<Avx2>::sigmoid, Kernels<Avx512>::sigmoid}},
    {"silu", {Kernels<Baseline>::silu, Kernels<Avx2>::silu, Kernels<Avx512>::silu}},
    {"gelu_tanh", {Kernels<Baseline>::gelu_tanh, Kernels<Avx2>::gelu_tanh, Kernels<Avx512>::gelu_tanh}},
    {"softmax row", {Kernels<Baseline>::softmax, Kernels<Avx2>::softmax, Kernels<Avx512>::softmax}},
};

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 41;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("this CPU has no AVX2 + FMA: nothing to compare\n");
    return 0;
  }
  const int variants = has_avx512() ? 3 : 2;
  std::vector<float> x(static_cast<size_t>(n)), y(x.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);  // the range activations and softmax inputs live in
  for (float& v : x) v = u(rng);
  // calls per timing: about 1 ms of AVX2 work
  const int64_t reps = std::max<int64_t>(1, 2000000 / std::max<int64_t>(n, 1));
  std::printf("vecmath, one thread, n = %lld floats per call, median of %d interleaved rounds (Gelem/s)\n", static_cast<long long>(n),
              rounds);
  std::printf("%-12s %10s %10s %10s %14s\n", "function", "baseline", "avx2", "avx512", "avx512/avx2");
  for (const Row& r : kRows) {
    std::vector<double> rate[3];
    for (int round = 0; round < rounds; ++round) {
      for (int v = 0; v < variants; ++v) {
        const auto t0 = Clock::now();
        for (int64_t k = 0; k < reps; ++k) r.fn[v](x.data(), y.data(), n);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        rate[v].push_back(static_cast<double>(n * reps) / s * 1e-9);
      }
    }
    double med[3] = {0, 0, 0};
    for (int v = 0; v < variants; ++v) {
      std::nth_element(rate[v].begin(), rate[v].begin() + rate[v].size() / 2, rate[v].end());
      med[v] = rate[v][rate[v].size() / 2];
    }
    if (variants == 3)
      std::printf("%-12s %10.3f %10.3f %10.3f %13.2fx\n", r.name, med[0], med[1], med[2], med[2] / med[1]);
    else
      std::printf("%-12s %10.3f %10.3f %10s %14s\n", r.name, med[0], med[1], "-", "-");
  }
  return 0;
}
