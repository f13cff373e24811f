// Every collective against its definition (dist/process_group.hpp), for every dtype, odd sizes,
// non-contiguous tensors and the errors; on the host backends. Run by 1, 2 and 3 processes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/config.hpp>
#include <kiln/dist/process_group.hpp>

// Cuda: over NCCL. Its cases (named "... - Cuda") run on the emulated device, whose NCCL moves the
// bytes with MPI (tests/cuda_emu/emu_nccl.cpp), and on a GPU; the host builds' runs leave them out.
#if defined(KILN_HAVE_CUDA_BACKEND)
#include <kiln/backends/cuda/cuda.hpp>
#define KILN_DIST_BACKENDS Cpu, Reference, Cuda
#else
#define KILN_DIST_BACKENDS Cpu, Reference
#endif

using namespace kiln;
namespace dist = kiln::dist;

namespace {

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean};
const std::vector<int64_t> kSizes = {0, 1, 7, 1031};

// Rank r's element i: small multiples of 1/4 (exact in every float type, so any summation order
// gives the same sum), bools that differ between ranks.
double value(DType d, int r, int64_t i) {
  if (d == DType::boolean) return ((i + r) % 3 == 0) ? 1 : 0;
  const double v = static_cast<double>((i * 7 + r * 5) % 19) - 9;
  return is_floating(d) ? v * 0.25 : v * 1000 + r;
}

template <Backend B> Tensor<B> rank_tensor(DType d, int r, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(d, r, i);
  return Tensor<B>::from_vector(v, {n}).to(d);
}

// The definition, computed here in double from every rank's values.
std::vector<double> reduced(DType d, dist::ReduceOp op, int64_t n, int N) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double acc = value(d, 0, i);
    for (int r = 1; r < N; ++r) {
      const double x = value(d, r, i);
      if (d == DType::boolean)
        acc = op == dist::ReduceOp::min ? (acc && x) : (acc || x);
      else if (op == dist::ReduceOp::max)
        acc = std::max(acc, x);
      else if (op == dist::ReduceOp::min)
        acc = std::min(acc, x);
      else
        acc += x;
    }
    if (op == dist::ReduceOp::avg) acc /= N;
    out[static_cast<size_t>(i)] = acc;
  }
  return out;
}

// The expected values rounded to the dtype (as kiln rounds: through Tensor::to).
std::vector<double> as_dtype(const std::vector<double>& v, DType d) {
  return to_vector<double>(Tensor<Cpu>::from_vector(v, {static_cast<int64_t>(v.size())}).to(d));
}

template <Backend B> std::vector<uint8_t> bytes(const Tensor<B>& t) {
  const Tensor<B> c = t.contiguous();
  std::vector<uint8_t> b(static_cast<size_t>(c.numel()) * dtype_size(c.dtype()));
  if (!b.empty()) c.copy_to_host(b.data(), b.size());
  return b;
}

}  // namespace

TEMPLATE_TEST_CASE("all_reduce: sum, avg, max, min of every dtype and odd sizes", "[collectives]", KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  for (DType d : kAll)
    for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::max, dist::ReduceOp::min}) {
      if (op == dist::ReduceOp::avg && !is_floating(d)) continue;
      for (int64_t n : kSizes) {
        const Tensor<B> t = rank_tensor<B>(d, r, n);
        dist::all_reduce(t, op);
        INFO(fmt::format("{} {} n={} ranks={}", d, dist::reduce_op_name(op), n, N));
        CHECK(t.dtype() == d);
        CHECK(to_vector<double>(t) == as_dtype(reduced(d, op, n, N), d));
      }
    }
}

TEMPLATE_TEST_CASE("all_reduce: bf16/f16 are summed in f32 and rounded once; integers wrap; i64 stays exact", "[collectives]",
                   KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  // 1 + N-1 times half an ulp: rounding after every addition would stay at 1 (ties to even); the f32 sum
  // rounded once moves up from three ranks on.
  for (DType d : {DType::bf16, DType::f16}) {
    const double half_ulp = d == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const Tensor<B> t = Tensor<B>::full({3}, r == 0 ? 1.0 : half_ulp, d);
    dist::all_reduce(t);
    const double exact = 1.0 + (N - 1) * half_ulp;
    CHECK(to_vector<double>(t) == as_dtype({exact, exact, exact}, d));
    if (N >= 3) CHECK(to_vector<double>(t)[0] > 1.0);
  }
  // i32 wraps around (two's complement); i64 keeps all 64 bits
  const Tensor<B> i = Tensor<B>::full({5}, r == 0 ? std::numeric_limits<int32_t>::max() : 1, DType::i32);
  dist::all_reduce(i);
  CHECK(item<int64_t>(i.select(0, 4)) == static_cast<int32_t>(static_cast<uint32_t>(std::numeric_limits<int32_t>::max()) + N - 1));
  const int64_t big = (int64_t{1} << 60) + 1;
  const Tensor<B> l = Tensor<B>::full({3}, big + r, DType::i64);
  dist::all_reduce(l);
  CHECK(item<int64_t>(l.select(0, 2)) == big * N + N * (N - 1) / 2);
}

TEMPLATE_TEST_CASE("broadcast: every dtype bit for bit from any root, odd sizes", "[collectives]", KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  for (int root : {0, N - 1})
    for (DType d : kAll)
      for (int64_t n : kSizes) {
        Tensor<B> t = rank_tensor<B>(d, r, n);
        if (d == DType::f32 && n > 1) t.narrow(0, 0, 1).fill_(std::nan(""));  // NaN bits survive
        const auto want = bytes(rank_tensor<B>(d, root, n));
        const auto mine_before = bytes(t);
        dist::broadcast(t, root);
        INFO(fmt::format("{} n={} root={}", d, n, root));
        if (d == DType::f32 && n > 1)
          CHECK(std::isnan(item<float>(t.select(0, 0))));
        else
          CHECK(bytes(t) == want);
        if (r == root) CHECK(bytes(t) == mine_before);
      }
}

TEMPLATE_TEST_CASE("all_gather: rank r's tensor in row r, every dtype, odd sizes", "[collectives]", KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  for (DType d : kAll)
    for (int64_t n : kSizes) {
      const Tensor<B> t = rank_tensor<B>(d, r, n).reshape({n, 1});
      const Tensor<B> g = dist::all_gather(t);
      INFO(fmt::format("{} n={}", d, n));
      REQUIRE(g.shape() == Shape{N, n, 1});
      for (int q = 0; q < N; ++q) CHECK(bytes(g.select(0, q)) == bytes(rank_tensor<B>(d, q, n)));
      // into a flat output
      const Tensor<B> flat = Tensor<B>::empty({N * n}, d);
      dist::all_gather_into(flat, t);
      CHECK(bytes(flat) == bytes(g));
    }
}

TEMPLATE_TEST_CASE("reduce_scatter: rank r gets row r of the reduction, every dtype, odd sizes", "[collectives]", KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  for (DType d : kAll)
    for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::max, dist::ReduceOp::min}) {
      if (op == dist::ReduceOp::avg && !is_floating(d)) continue;
      for (int64_t k : {int64_t{1}, int64_t{7}, int64_t{333}}) {
        const Tensor<B> t = rank_tensor<B>(d, r, N * k).reshape({N, k});
        const Tensor<B> out = dist::reduce_scatter(t, op);
        INFO(fmt::format("{} {} k={}", d, dist::reduce_op_name(op), k));
        REQUIRE(out.shape() == Shape{k});
        const auto all = as_dtype(reduced(d, op, N * k, N), d);
        CHECK(to_vector<double>(out) == std::vector<double>(all.begin() + r * k, all.begin() + (r + 1) * k));
      }
    }
}

TEMPLATE_TEST_CASE("collectives on non-contiguous tensors: communicated through a contiguous copy and written back", "[collectives]",
                   KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  const Tensor<B> base = rank_tensor<B>(DType::f32, r, 35).reshape({5, 7});
  const Tensor<B> t = base.t();  // [7, 5], strided
  REQUIRE(!t.is_contiguous());
  const auto before = to_vector<double>(t.contiguous());
  dist::all_reduce(t);
  std::vector<double> want(35);
  for (int q = 0; q < N; ++q) {
    const auto v = to_vector<double>(rank_tensor<B>(DType::f32, q, 35).reshape({5, 7}).t().contiguous());
    for (size_t i = 0; i < 35; ++i) want[i] += v[i];
  }
  CHECK(to_vector<double>(t.contiguous()) == want);
  CHECK(to_vector<double>(base.t().contiguous()) == want);  // written into the original's elements
  (void)before;
  // a strided slice as the output of all_gather
  const Tensor<B> big = Tensor<B>::zeros({N, 2, 3}, DType::i64);
  const Tensor<B> out = big.narrow(2, 1, 1);  // [N, 2, 1], not contiguous
  dist::all_gather_into(out, Tensor<B>::full({2, 1}, r + 10, DType::i64));
  for (int q = 0; q < N; ++q) CHECK(to_vector<int64_t>(big.select(0, q)) == std::vector<int64_t>{0, q + 10, 0, 0, q + 10, 0});
}

TEMPLATE_TEST_CASE("all_reduce_async: started, then waited for; its result is the blocking one's", "[collectives][async]",
                   KILN_DIST_BACKENDS) {
  using B = TestType;
  const int r = dist::rank(), N = dist::world_size();
  const Tensor<B> a = rank_tensor<B>(DType::f32, r, 1031), b = rank_tensor<B>(DType::bf16, r, 77);
  dist::Work wa = dist::all_reduce_async(a, dist::ReduceOp::avg);
  dist::Work wb = dist::all_reduce_async(b, dist::ReduceOp::sum);
  wb.wait();
  wa.wait();
  CHECK(wa.completed());
  CHECK(wa.test());
  CHECK(to_vector<double>(a) == as_dtype(reduced(DType::f32, dist::ReduceOp::avg, 1031, N), DType::f32));
  CHECK(to_vector<double>(b) == as_dtype(reduced(DType::bf16, dist::ReduceOp::sum, 77, N), DType::bf16));
  CHECK(dist::all_reduce_scalar(r + 1.0) == N * (N + 1) / 2.0);
  CHECK(dist::all_reduce_scalar(r, dist::ReduceOp::max) == N - 1);
  dist::barrier();
}

TEST_CASE("collective errors are raised on every rank, naming the op, the ranks and the values", "[collectives]") {
  const int r = dist::rank(), N = dist::world_size();
  // a shape that differs between ranks
  if (N > 1) {
    const Tensor<Cpu> t = Tensor<Cpu>::zeros({r == 0 ? 3 : 5});
    CHECK_THROWS_WITH(dist::all_reduce(t), Catch::Contains("all_reduce: the ranks disagree") &&
                                               Catch::Contains("rank 0: all_reduce f32 [3]") &&
                                               Catch::Contains("rank 1: all_reduce f32 [5]"));
    // dtypes
    const Tensor<Cpu> u = Tensor<Cpu>::zeros({4}, r == 0 ? DType::f32 : DType::f64);
    CHECK_THROWS_WITH(dist::broadcast(u), Catch::Contains("broadcast: the ranks disagree") && Catch::Contains("f64"));
    // one rank calls another collective
    const Tensor<Cpu> v = Tensor<Cpu>::zeros({4});
    if (r == 0)
      CHECK_THROWS_WITH(dist::all_reduce(v), Catch::Contains("rank 0: all_reduce") && Catch::Contains("rank 1: broadcast"));
    else
      CHECK_THROWS_WITH(dist::broadcast(v), Catch::Contains("rank 0: all_reduce") && Catch::Contains("rank 1: broadcast"));
    // a rank whose own arguments are wrong: it says why, the others that it failed
    const Tensor<Cpu> w = r == 1 ? Tensor<Cpu>::zeros({1}).expand({4}) : Tensor<Cpu>::zeros({4});
    if (r == 1)
      CHECK_THROWS_WITH(dist::all_reduce(w), Catch::Contains("overlapping elements"));
    else
      CHECK_THROWS_WITH(dist::all_reduce(w), Catch::Contains("all_reduce: rank 1 failed its own checks"));
  }
  const Tensor<Cpu> t = Tensor<Cpu>::zeros({4});
  CHECK_THROWS_WITH(dist::broadcast(t, N), Catch::Contains(fmt::format("broadcast: root {} is not a rank of this group of {}", N, N)));
  CHECK_THROWS_WITH(dist::broadcast(t, -1), Catch::Contains("root -1"));
  CHECK_THROWS_WITH(dist::all_reduce(Tensor<Cpu>::zeros({4}, DType::i32), dist::ReduceOp::avg),
                    Catch::Contains("all_reduce: avg needs a floating dtype, got i32"));
  CHECK_THROWS_WITH(dist::all_gather_into(Tensor<Cpu>::zeros({4 * N + 1}), t), Catch::Contains("all_gather: the output is f32 ["));
  CHECK_THROWS_WITH(dist::reduce_scatter(Tensor<Cpu>::zeros({N + 1, 2})),
                    Catch::Contains("reduce_scatter: the input's first axis must have one row per rank"));
  CHECK_THROWS_WITH(dist::all_reduce(Tensor<Cpu>::zeros({1}).expand({3})), Catch::Contains("overlapping elements"));
  // the group is still usable afterwards
  const Tensor<Cpu> ok = Tensor<Cpu>::ones({2});
  dist::all_reduce(ok);
  CHECK(to_vector<float>(ok) == std::vector<float>{static_cast<float>(N), static_cast<float>(N)});
}

TEST_CASE("all_reduce_async: a disagreement raises at the call on every rank, naming each rank's arguments",
          "[collectives][async-errors]") {
  const int r = dist::rank(), N = dist::world_size();
  if (N > 1) {
    // shapes (so counts) that differ: the data's MPI_Iallreduce would be erroneous; it never starts
    const Tensor<Cpu> t = Tensor<Cpu>::zeros({r == 0 ? 3 : 5});
    CHECK_THROWS_WITH(dist::all_reduce_async(t), Catch::Contains("all_reduce_async: the ranks disagree") &&
                                                     Catch::Contains("rank 0: all_reduce_async f32 [3] (3 elements) sum") &&
                                                     Catch::Contains("rank 1: all_reduce_async f32 [5] (5 elements) sum"));
    // the reduction
    const Tensor<Cpu> u = Tensor<Cpu>::zeros({4});
    CHECK_THROWS_WITH(dist::all_reduce_async(u, r == 0 ? dist::ReduceOp::sum : dist::ReduceOp::max),
                      Catch::Contains("all_reduce_async: the ranks disagree") &&
                          Catch::Contains("rank 0: all_reduce_async f32 [4] (4 elements) sum") &&
                          Catch::Contains("rank 1: all_reduce_async f32 [4] (4 elements) max"));
    // the same shape and op, one rank asynchronous and the other blocking: MPI would not match them
    if (r == 0)
      CHECK_THROWS_WITH(dist::all_reduce_async(u), Catch::Contains("all_reduce_async: the ranks disagree") &&
                                                       Catch::Contains("rank 0: all_reduce_async f32 [4]") &&
                                                       Catch::Contains("rank 1: all_reduce f32 [4]"));
    else
      CHECK_THROWS_WITH(dist::all_reduce(u), Catch::Contains("all_reduce: the ranks disagree") &&
                                                 Catch::Contains("rank 0: all_reduce_async f32 [4]") &&
                                                 Catch::Contains("rank 1: all_reduce f32 [4]"));
    // a rank whose own arguments are wrong: it says why, the others that it failed
    const Tensor<Cpu> w = Tensor<Cpu>::zeros({4}, r == 1 ? DType::i32 : DType::f32);
    if (r == 1)
      CHECK_THROWS_WITH(dist::all_reduce_async(w, dist::ReduceOp::avg),
                        Catch::Contains("all_reduce_async: avg needs a floating dtype, got i32"));
    else
      CHECK_THROWS_WITH(dist::all_reduce_async(w, dist::ReduceOp::avg), Catch::Contains("all_reduce_async: rank 1 failed its own checks"));
  }
  CHECK_THROWS_WITH(dist::all_reduce_async(Tensor<Cpu>::zeros({1}).expand({3})),
                    Catch::Contains("all_reduce_async") && Catch::Contains("overlapping elements"));
  // the group is still usable afterwards, asynchronously too
  const Tensor<Cpu> ok = Tensor<Cpu>::ones({2});
  dist::Work work = dist::all_reduce_async(ok);
  work.wait();
  CHECK(to_vector<float>(ok) == std::vector<float>{static_cast<float>(N), static_cast<float>(N)});
}

TEST_CASE("the group: rank, size, local rank, batch slices", "[collectives]") {
  const int r = dist::rank(), N = dist::world_size();
  CHECK(dist::is_initialized());
  CHECK(r >= 0);
  CHECK(r < N);
  CHECK(dist::local_rank() >= 0);
  CHECK(dist::local_rank() < dist::local_world_size());
  CHECK(dist::is_main_process() == (r == 0));
  CHECK(dist::all_reduce_scalar(1.0) == N);
  const auto s = dist::batch_slice(6 * N);
  CHECK(s.start == 6 * r);
  CHECK(s.count == 6);
  CHECK_THROWS_WITH(dist::batch_slice(10, 0, 4), Catch::Contains("a global batch of 10 rows does not divide among 4 ranks"));
  const Tensor<Cpu> x = Tensor<Cpu>::arange(4 * N).reshape({2 * N, 2});
  CHECK(to_vector<int64_t>(dist::local_rows(x)) == std::vector<int64_t>{4 * r, 4 * r + 1, 4 * r + 2, 4 * r + 3});
}

TEST_CASE("a collective before init() is an error naming the op", "[uninit]") {
  CHECK_FALSE(dist::is_initialized());
  const Tensor<Cpu> t = Tensor<Cpu>::zeros({2});
  CHECK_THROWS_WITH(dist::all_reduce(t),
                    Catch::Contains("all_reduce: the process group is not initialised: call kiln::dist::init() first"));
  CHECK_THROWS_WITH(dist::broadcast(t), Catch::Contains("broadcast: the process group is not initialised"));
  CHECK_THROWS_WITH(dist::rank(), Catch::Contains("dist::rank: the process group is not initialised"));
  CHECK_THROWS_WITH(dist::barrier(), Catch::Contains("barrier: the process group is not initialised"));
}
