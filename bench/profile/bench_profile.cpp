// The profiler's cost per op (docs/profiling.md): a tiny Cpu add timed three ways in the same run,
// interleaved, median of rounds:
//   baseline  the backend call alone (what an op dispatch was before instrumentation)
//   off       the same call behind KILN_PROFILED with the profiler off (the cost every user pays)
//   on        the same with the profiler recording (two clock reads, the operand shapes, the buffer)
// and the whole Tensor op (checks, allocation, dispatch) off and on, for scale.
//   bench_profile [--elements N] [--iters N] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/core/profile.hpp>
#include <kiln/core/tensor.hpp>

using kiln::Cpu;
using T = kiln::Tensor<Cpu>;

namespace {

template <class F> double ns_per_call(F&& f, int iters) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}

// The dispatch as core/tensor.hpp writes it, with and without the profiler's guard.
template <class B> [[gnu::noinline]] void bare(T& out, const T& a, const T& b) {
  B::template binary<kiln::op::Add>(out.mview(), a.cview(), b.cview());
}
template <class B> [[gnu::noinline]] void guarded(T& out, const T& a, const T& b) {
  KILN_PROFILED("add", out, a, b) B::template binary<kiln::op::Add>(out.mview(), a.cview(), b.cview());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 16;
  int iters = 20000, rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--elements")
      n = std::atoll(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
  }
  const T a = T::ones({n}), b = T::ones({n});
  T out = T::empty({n});
  std::vector<double> base, off, on, op_off, op_on;
  kiln::profile::stop();
  for (int r = 0; r < rounds; ++r) {
    base.push_back(ns_per_call([&] { bare<Cpu>(out, a, b); }, iters));
    off.push_back(ns_per_call([&] { guarded<Cpu>(out, a, b); }, iters));
    op_off.push_back(ns_per_call([&] { (void)a.add(b); }, iters));
    kiln::profile::start();  // a fresh session each round: the buffers stay small
    on.push_back(ns_per_call([&] { guarded<Cpu>(out, a, b); }, iters));
    op_on.push_back(ns_per_call([&] { (void)a.add(b); }, iters));
    kiln::profile::stop();
  }
  const double mb = median(base), mo = median(off), mn = median(on), to = median(op_off), tn = median(op_on);
  std::printf("profiler overhead, Cpu add of %lld f32 elements, median of %d rounds x %d calls (ns per call)\n", static_cast<long long>(n),
              rounds, iters);
  std::printf("  backend call, uninstrumented   %8.1f\n", mb);
  std::printf("  backend call, profiler off     %8.1f   (%+.1f ns vs uninstrumented)\n", mo, mo - mb);
  std::printf("  backend call, profiler on      %8.1f   (%+.1f ns: the cost of one recorded op)\n", mn, mn - mb);
  std::printf("  Tensor::add, profiler off      %8.1f\n", to);
  std::printf("  Tensor::add, profiler on       %8.1f   (%+.1f%%)\n", tn, 100.0 * (tn - to) / to);
  return 0;
}
