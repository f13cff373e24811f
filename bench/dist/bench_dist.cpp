// kiln::dist side by side with raw MPI, under mpirun (bench/dist/run.sh; figures in bench/RESULTS.md).
//
//   mpirun -np 2 bench_dist allreduce     dist::all_reduce (sum and avg) of an f32 Tensor<Cpu> against
//                                          MPI_Allreduce(MPI_IN_PLACE) of a buffer of the same size,
//                                          alternated call by call; medians, bus bandwidth and ratio
//   mpirun -np 2 bench_dist overlap [steps [bucket_mb]]  DDP on the d_model 256 benchmark GPT: how much of the gradient
//                                          all-reduce backward hides. Per step: the time backward's end
//                                          waited for buckets still in flight (exposed), against the
//                                          time the same buckets take all-reduced after backward
//                                          (what a DDP without overlap would wait). hidden = 1 - exposed / that.
//
// Timing per call: a barrier, then the call, then the maximum of the ranks' times (what the job waits).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kiln/dist/ddp.hpp>
#include <kiln/dist/process_group.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Seconds of f(), the slowest rank's, after a barrier.
template <class F> double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  f();
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

void bench_allreduce() {
  const int N = dist::world_size();
  if (dist::rank() == 0) {
    std::printf("all_reduce f32 over %d ranks (in place; median of the iterations; bus bandwidth = 2(N-1)/N * bytes / time)\n", N);
    std::printf("| size | raw MPI_Allreduce | kiln all_reduce sum | kiln / raw | kiln all_reduce avg | kiln / raw |\n");
    std::printf("|---|---|---|---|---|---|\n");
  }
  for (int64_t bytes : {int64_t{4} << 10, int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20, int64_t{25} << 20, int64_t{64} << 20}) {
    const int64_t n = bytes / 4;
    const Tensor<Cpu> t = Tensor<Cpu>::full({n}, 1.0f + dist::rank());
    std::vector<float> raw(static_cast<size_t>(n), 1.0f + static_cast<float>(dist::rank()));
    const int iters = bytes >= (int64_t{16} << 20) ? 15 : bytes >= (int64_t{1} << 20) ? 60 : 400;
    std::vector<double> tr, ts, ta;
    for (int i = 0; i < iters + 3; ++i) {
      const double a = timed([&] { MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
      const double b = timed([&] { dist::all_reduce(t, dist::ReduceOp::sum); });
      const double c = timed([&] { dist::all_reduce(t, dist::ReduceOp::avg); });
      if (i >= 3) {  // warm-up
        tr.push_back(a);
        ts.push_back(b);
        ta.push_back(c);
      }
    }
    const double f = 2.0 * (N - 1) / N * static_cast<double>(bytes) / 1e9;
    const double r = median(tr), s = median(ts), a = median(ta);
    if (dist::rank() == 0)
      std::printf("| %lld KiB | %.1f us, %.2f GB/s | %.1f us, %.2f GB/s | %.2f | %.1f us, %.2f GB/s | %.2f |\n",
                  static_cast<long long>(bytes >> 10), r * 1e6, f / r, s * 1e6, f / s, r / s, a * 1e6, f / a, r / a);
  }
}

void bench_overlap(int64_t steps, double bucket_mb) {
  ModelConfig c;  // the d_model 256 benchmark model (docs/specs.md §5): 4 layers, 4 heads, vocab 256
  c.vocab_size = 256;
  c.d_model = 256;
  c.n_layers = 4;
  c.n_heads = 4;
  c.max_seq_len = 128;
  c = c.resolved();
  const int64_t B = 8, T = 128;
  nn::GPT<Cpu> model(c);
  model.init_weights(0);
  dist::DistributedDataParallel<Cpu> ddp(model, {.bucket_mb = bucket_mb});
  const auto rows = dist::batch_slice(B);
  std::vector<int64_t> ids(static_cast<size_t>(rows.count * (T + 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37 + static_cast<size_t>(dist::rank()) * 11) % 256);
  const Tensor<Cpu> all = Tensor<Cpu>::from_vector(ids, {rows.count, T + 1});
  const Tensor<Cpu> x = all.narrow(1, 0, T).contiguous(), y = all.narrow(1, 1, T).contiguous();
  std::vector<Tensor<Cpu>> grads;  // the same buckets, all-reduced after backward
  for (const auto& b : ddp.buckets()) grads.push_back(Tensor<Cpu>::zeros({b.numel + static_cast<int64_t>(b.params.size())}));

  std::vector<double> step_s, exposed_s, after_s;
  for (int64_t s = 0; s < steps + 2; ++s) {
    for (auto& [n, p] : model.named_parameters()) p.zero_grad();
    ddp.reset_stats();
    const double st = timed([&] { nn::cross_entropy(model.forward(x).reshape({-1, c.vocab_size}), y.reshape({-1})).backward(); });
    const double exposed = ddp.stats().wait_s;
    const double after = timed([&] {
      std::vector<dist::Work> w;
      for (const auto& g : grads) w.push_back(dist::all_reduce_async(g, dist::ReduceOp::avg));
      for (auto& wk : w) wk.wait();
    });
    if (s >= 2) {
      step_s.push_back(st);
      exposed_s.push_back(dist::all_reduce_scalar(exposed, dist::ReduceOp::max));
      after_s.push_back(after);
    }
  }
  int64_t params = 0;
  for (const auto& b : ddp.buckets()) params += b.numel;
  if (dist::rank() == 0) {
    const double e = median(exposed_s), a = median(after_s);
    std::printf(
        "DDP overlap, d_model 256 GPT (%lld gradient floats = %.1f MiB in %zu buckets, bucket_mb %g), %d ranks x %lld rows x T %lld:\n",
        static_cast<long long>(params), static_cast<double>(params) * 4 / (1 << 20), ddp.buckets().size(), bucket_mb, dist::world_size(),
        static_cast<long long>(rows.count), static_cast<long long>(T));
    std::printf("  forward+backward with DDP: median %.1f ms\n", median(step_s) * 1e3);
    std::printf("  all-reduce of the same buckets after backward (not overlapped): median %.2f ms\n", a * 1e3);
    std::printf("  exposed at the end of backward (overlapped): median %.2f ms\n", e * 1e3);
    std::printf("  hidden behind backward: %.0f%%\n", a > 0 ? 100.0 * std::max(0.0, 1.0 - e / a) : 0.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dist::init();
  const std::string what = argc > 1 ? argv[1] : "allreduce";
  if (what == "allreduce")
    bench_allreduce();
  else if (what == "overlap")
    bench_overlap(argc > 2 ? std::atoll(argv[2]) : 10, argc > 3 ? std::atof(argv[3]) : 25.0);
  else {
    if (dist::rank() == 0) std::fprintf(stderr, "bench_dist: allreduce | overlap [steps [bucket_mb]]\n");
    return 2;
  }
  return 0;
}
