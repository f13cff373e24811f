// Cpu backend benchmarks. Every benchmark runs kiln and its peers interleaved, one call each per
// iteration, timed separately, so both see the same machine state (other processes, clocks, caches).
// Reported time = kiln's; counters: kiln's rate, each peer's rate, and ratio = kiln / fastest peer
// (matmul, softmax) or kiln / triad bandwidth (elementwise).
//
//   KILN_NUM_THREADS=2 ./bench_cpu            (bench/run.sh builds and runs it)
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include <kiln/backends/cpu/cpu.hpp>

#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

using namespace kiln;
using C = Tensor<Cpu>;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs kiln and the peers once per iteration; returns mean seconds per call for each.
struct Interleaved {
  std::vector<double> total;
  int64_t n = 0;
  void run(benchmark::State& state, const std::function<void()>& kiln_fn, const std::vector<std::function<void()>>& peers) {
    total.assign(1 + peers.size(), 0.0);
    kiln_fn();  // warm up (oneDNN primitive creation, page faults)
    for (const auto& p : peers) p();
    for (auto _ : state) {
      double t0 = now();
      kiln_fn();
      const double tk = now() - t0;
      total[0] += tk;
      for (size_t i = 0; i < peers.size(); ++i) {
        t0 = now();
        peers[i]();
        total[i + 1] += now() - t0;
      }
      state.SetIterationTime(tk);
      ++n;
    }
  }
  double mean(size_t i) const { return total[i] / static_cast<double>(n); }
};

// ------------------------------------------------------------------------------------------ matmul
// args: batch, M, K, N, transposed_b (b given as W [N, K] viewed as W^T)
void BM_matmul(benchmark::State& state) {
  const int64_t B = state.range(0), M = state.range(1), K = state.range(2), N = state.range(3);
  const bool tb = state.range(4) != 0;
  num_threads();
  const C a = B > 1 ? C::randn({B, M, K}) : C::randn({M, K});
  const C w = tb ? (B > 1 ? C::randn({B, N, K}) : C::randn({N, K})) : (B > 1 ? C::randn({B, K, N}) : C::randn({K, N}));
  const C b = tb ? w.transpose(-1, -2) : w;
  C out = B > 1 ? C::empty({B, M, N}) : C::empty({M, N});
  const float* pa = a.storage()->as<float>();
  const float* pb = w.storage()->as<float>();
  float* pc = out.storage()->as<float>();

  auto kiln_fn = [&] { Cpu::matmul(out.mview(), a.cview(), b.cview()); };
  auto blas_fn = [&] {
    const auto TB = tb ? CblasTrans : CblasNoTrans;
    const int ldb = static_cast<int>(tb ? K : N);
    if (B == 1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, TB, M, N, K, 1.f, pa, K, pb, ldb, 0.f, pc, N);
    } else {  // the batch loop in parallel, one single-threaded GEMM per item
#pragma omp parallel for
      for (int64_t i = 0; i < B; ++i)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, TB, M, N, K, 1.f, pa + i * M * K, K, pb + i * K * N, ldb, 0.f, pc + i * M * N, N);
    }
  };
  std::vector<std::function<void()>> peers{blas_fn};
#ifdef KILN_HAVE_ONEDNN
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::desc ad({B, M, K}, memory::data_type::f32, {M * K, K, 1});
  const memory::desc bd({B, K, N}, memory::data_type::f32, tb ? memory::dims{K * N, 1, K} : memory::dims{K * N, N, 1});
  const memory::desc cd({B, M, N}, memory::data_type::f32, {M * N, N, 1});
  const dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
  memory am(ad, eng, const_cast<float*>(pa)), bm(bd, eng, const_cast<float*>(pb)), cm(cd, eng, pc);
  peers.emplace_back([&] {
    mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
  });
#endif
  Interleaved r;
  r.run(state, kiln_fn, peers);
  const double flop = 2.0 * static_cast<double>(B * M * N * K);
  state.counters["kiln_GFLOPs"] = flop / r.mean(0) / 1e9;
  state.counters["blas_GFLOPs"] = flop / r.mean(1) / 1e9;
  double best = r.mean(1);
#ifdef KILN_HAVE_ONEDNN
  state.counters["dnnl_GFLOPs"] = flop / r.mean(2) / 1e9;
  best = std::min(best, r.mean(2));
#endif
  state.counters["ratio_vs_best"] = best / r.mean(0);
}

void matmul_args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {256, 512, 1024, 2048}) b->Args({1, n, n, n, 0});
  for (int64_t k : {256, 1024, 4096})
    for (int64_t n : {256, 1024, 4096}) b->Args({1, 1024, k, n, 0});
  b->Args({64, 128, 64, 128, 0});     // per-head attention scores, [B*H] x [T, d] @ [d, T]
  b->Args({1, 1024, 1024, 1024, 1});  // x @ W^T, W [N, K]
  b->Args({1, 1024, 1024, 4096, 1});
  b->ArgNames({"B", "M", "K", "N", "tB"});
}
BENCHMARK(BM_matmul)->Apply(matmul_args)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

// ------------------------------------------------------------------------------------------ elementwise
// STREAM triad a = b + s c over the same number of elements (three arrays, as add/mul read two and
// write one), parallel over the same threads.
void triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// args: op (0 add, 1 mul, 2 exp), n
void BM_elementwise(benchmark::State& state) {
  const int op = static_cast<int>(state.range(0));
  const int64_t n = state.range(1);
  num_threads();
  const C x = C::randn({n}), y = C::randn({n});
  C out = C::empty({n});
  std::vector<float> ta(static_cast<size_t>(n)), tb(static_cast<size_t>(n), 1.f), tc(static_cast<size_t>(n), 2.f);
  auto kiln_fn = [&] {
    if (op == 0)
      Cpu::binary<op::Add>(out.mview(), x.cview(), y.cview());
    else if (op == 1)
      Cpu::binary<op::Mul>(out.mview(), x.cview(), y.cview());
    else
      Cpu::unary<op::Exp>(out.mview(), x.cview());
  };
  auto triad_fn = [&] { triad(ta.data(), tb.data(), tc.data(), 3.f, n); };
  Interleaved r;
  r.run(state, kiln_fn, {triad_fn});
  const double arrays = op == 2 ? 2.0 : 3.0;
  const double bytes_kiln = arrays * 4.0 * static_cast<double>(n), bytes_triad = 3.0 * 4.0 * static_cast<double>(n);
  state.counters["kiln_GBs"] = bytes_kiln / r.mean(0) / 1e9;
  state.counters["triad_GBs"] = bytes_triad / r.mean(1) / 1e9;
  state.counters["pct_of_triad"] = 100.0 * (bytes_kiln / r.mean(0)) / (bytes_triad / r.mean(1));
}
BENCHMARK(BM_elementwise)
    ->ArgsProduct({{0, 1, 2}, {1 << 20, 1 << 24}})
    ->ArgNames({"op", "n"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);

// ------------------------------------------------------------------------------------------ softmax
void BM_softmax(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  num_threads();
  const C x = C::randn({rows, cols});
  C out = C::empty({rows, cols});
  auto kiln_fn = [&] { Cpu::softmax_lastdim(out.mview(), x.cview(), false); };
  std::vector<std::function<void()>> peers;
#ifdef KILN_HAVE_ONEDNN
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::desc d({rows, cols}, memory::data_type::f32, memory::format_tag::ab);
  const softmax_forward sm(softmax_forward::primitive_desc(softmax_forward::desc(prop_kind::forward_inference, d, 1), eng));
  std::vector<float> dst(static_cast<size_t>(rows * cols));
  memory src_m(d, eng, const_cast<float*>(x.storage()->as<float>())), dst_m(d, eng, dst.data());
  peers.emplace_back([&] {
    sm.execute(s, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_DST, dst_m}});
    s.wait();
  });
#endif
  Interleaved r;
  r.run(state, kiln_fn, peers);
  const double bytes = 2.0 * 4.0 * static_cast<double>(rows * cols);
  state.counters["kiln_GBs"] = bytes / r.mean(0) / 1e9;
#ifdef KILN_HAVE_ONEDNN
  state.counters["dnnl_GBs"] = bytes / r.mean(1) / 1e9;
  state.counters["ratio_vs_dnnl"] = r.mean(1) / r.mean(0);
#endif
}
BENCHMARK(BM_softmax)
    ->Args({4096, 1024})
    ->Args({8192, 256})
    ->ArgNames({"rows", "cols"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(1.0);

// ------------------------------------------------------------------------------------------ transpose copy
// x.t().contiguous() for a square matrix vs a plain contiguous copy of the same bytes (memcpy).
void BM_transpose_copy(benchmark::State& state) {
  const int64_t n = state.range(0);
  num_threads();
  const C x = C::randn({n, n});
  const C xt = x.t();
  C out = C::empty({n, n});
  std::vector<float> dst(static_cast<size_t>(n * n));
  Interleaved r;
  r.run(state, [&] { Cpu::copy(out.mview(), xt.cview()); }, {[&] { std::memcpy(dst.data(), x.storage()->as<float>(), dst.size() * 4); }});
  const double bytes = 2.0 * 4.0 * static_cast<double>(n * n);
  state.counters["kiln_GBs"] = bytes / r.mean(0) / 1e9;
  state.counters["memcpy_GBs"] = bytes / r.mean(1) / 1e9;
}
BENCHMARK(BM_transpose_copy)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
