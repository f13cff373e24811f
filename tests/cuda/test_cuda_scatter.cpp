// The Cuda backend's deterministic scatter_add (backends/cuda/index.cu, sort.cu): the stable radix
// sort against std::stable_sort, and scatter_add / index_add / the embedding gradient equal to the Cpu
// backend bit for bit (same order, same rounding), whatever the GPU's block and thread schedule.
// Without a device these skip (tests/catch_main.cpp); the emulated device runs them, also under shuffled
// schedules (tests/cuda_emu/CMakeLists.txt).
#include "common/kiln_test.hpp"

#if defined(KILN_HAVE_CUDA_BACKEND)
#include <algorithm>
#include <bit>
#include <numeric>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/cuda/cuda.hpp>
#include <kiln/backends/cuda/sort.cuh>

using namespace kiln;
using namespace kt;

namespace {

std::vector<uint64_t> device_u64(const CudaStorage& s, int64_t n) {
  std::vector<uint64_t> v(static_cast<size_t>(n));
  if (n) Cuda::read(s, 0, v.data(), v.size() * sizeof(uint64_t));
  return v;
}

}  // namespace

TEST_CASE("cuda sort_by_key: a stable sort of positions by key (every tile and pass boundary)", "[cuda][scatter]") {
  Gen g(4242);
  for (const int64_t n : {0, 1, 2, 255, 256, 1023, 1024, 1025, 3000}) {
    for (const int bits : {0, 1, 5, 8, 9, 16, 23, 64}) {
      std::vector<uint64_t> keys(static_cast<size_t>(n));
      // few distinct keys (long runs of equal keys) or many
      const uint64_t range = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
      const uint64_t distinct = g.coin() ? std::min<uint64_t>(range, 7) : range;
      std::vector<uint64_t> pool(8);
      for (auto& k : pool) k = static_cast<uint64_t>(g.rng()) & range;
      for (auto& k : keys) k = distinct <= 7 ? pool[static_cast<size_t>(g.integer(0, 7))] : (static_cast<uint64_t>(g.rng()) & range);
      auto dev = Cuda::allocate(std::max<size_t>(1, keys.size()) * sizeof(uint64_t));
      if (n) Cuda::write(*dev, 0, keys.data(), keys.size() * sizeof(uint64_t));
      const cuda::SortedByKey s = cuda::sort_by_key("test", dev, n, bits);
      std::vector<int64_t> want(static_cast<size_t>(n));
      std::iota(want.begin(), want.end(), int64_t{0});
      std::stable_sort(want.begin(), want.end(),
                       [&](int64_t a, int64_t b) { return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)]; });
      std::vector<int64_t> pos(static_cast<size_t>(n));
      if (n) Cuda::read(*s.pos, 0, pos.data(), pos.size() * sizeof(int64_t));
      INFO("n " << n << " bits " << bits);
      CHECK(pos == want);
      std::vector<uint64_t> sorted_keys(static_cast<size_t>(n));
      for (size_t i = 0; i < sorted_keys.size(); ++i) sorted_keys[i] = keys[static_cast<size_t>(want[i])];
      CHECK(device_u64(*s.keys, n) == sorted_keys);
    }
  }
}

TEST_CASE("cuda scatter_add, index_add: equal to the Cpu backend bit for bit (views, broadcast indices, every dtype)", "[cuda][scatter]") {
  Gen g(5151);
  for (int it = 0; it < 150; ++it) {
    const DType d = g.pick(std::vector<DType>{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64});
    const DType id = g.coin() ? DType::i64 : DType::i32;
    const Shape s = g.shape(1, 4, 6, 0.0);
    const auto r = static_cast<int64_t>(s.size());
    const int64_t a = g.integer(-r, r - 1);
    const auto ua = static_cast<size_t>(a < 0 ? a + r : a);
    // an index with many repeats (often a handful of targets), src at least as large
    Shape is = s;
    for (size_t i = 0; i < is.size(); ++i) is[i] = i == ua ? g.integer(0, 40) : g.integer(1, s[i]);
    const int64_t hi = g.coin() ? std::min<int64_t>(s[ua] - 1, 2) : s[ua] - 1;
    Tensor<Cpu> ci = Tensor<Cpu>::from_vector(g.values(numel(is), DType::i64, 0, static_cast<double>(hi)), is).to(id);
    if (g.coin(0.3)) {  // broadcast the index over the non-axis dims: one row of targets shared by every column
      Shape row(is.size(), 1);
      row[ua] = is[ua];
      ci = Tensor<Cpu>::from_vector(g.values(is[ua], DType::i64, 0, static_cast<double>(hi)), row).to(id).expand(is);
    }
    Shape ss = is;
    for (auto& x : ss) x += g.integer(0, 1);
    // values of mixed magnitude, so that another order of the sums would change the bits
    RT rx, rsrc;
    Tensor<Cpu> cx, csrc;
    g.make_pair(s, d, g.pick(kLayouts), rx, cx, -100, 100);
    g.make_pair(ss, d, g.pick(kLayouts), rsrc, csrc, -100, 100);
    if (is_floating(d)) csrc = csrc.mul(Tensor<Cpu>::from_vector(g.values(numel(ss), DType::f64, -6, 3), ss).exp().to(d));
    const std::string w =
        fmt::format("{} axis {} index {} {} src {}", describe(s, d, Lay::contiguous), a, shape_str(is), dtype_name(id), shape_str(ss));
    INFO(w);
    const Tensor<Cpu> want = cx.scatter_add(a, ci, csrc);
    const Tensor<Cuda> got = cx.to<Cuda>().scatter_add(a, ci.to<Cuda>(), csrc.to<Cuda>());
    check_bits(got, want, "scatter_add");
    // index_add with a strided 1-D index
    const int64_t m = g.integer(0, 30);
    const Tensor<Cpu> ii =
        Tensor<Cpu>::from_vector(g.values(2 * m, DType::i64, 0, static_cast<double>(hi)), {2 * m}).to(id).slice(0, 0, 2 * m, 2);
    Shape as = s;
    as[ua] = m;
    const Tensor<Cpu> asrc = Tensor<Cpu>::from_vector(g.values(numel(as), DType::f64, -100, 100), as).to(d);
    check_bits(cx.to<Cuda>().index_add(a, ii.to<Cuda>(), asrc.to<Cuda>()), cx.index_add(a, ii, asrc), "index_add");
  }
}

TEST_CASE("cuda scatter_add: large index_add (several sort tiles and passes, skewed targets) equals the Cpu backend", "[cuda][scatter]") {
  Gen g(6161);
  for (const auto& [vocab, tokens, width] : std::vector<std::array<int64_t, 3>>{{5000, 3000, 8}, {70000, 2100, 3}, {3, 2500, 5}}) {
    // Zipf-like targets: a few very frequent rows, a long tail
    std::vector<double> ids(static_cast<size_t>(tokens));
    for (auto& x : ids) x = std::floor(std::pow(static_cast<double>(vocab), g.real(0, 1))) - 1;
    const Tensor<Cpu> idx = Tensor<Cpu>::from_vector(ids).to(DType::i64);
    for (const DType d : {DType::f32, DType::bf16}) {
      const Tensor<Cpu> src = Tensor<Cpu>::from_vector(g.values(tokens * width, DType::f64, -1, 1), {tokens, width}).to(d);
      const Tensor<Cpu> base = Tensor<Cpu>::from_vector(g.values(vocab * width, DType::f64, -1, 1), {vocab, width}).to(d);
      INFO("vocab " << vocab << " tokens " << tokens << " " << dtype_name(d));
      check_bits(base.to<Cuda>().index_add(0, idx.to<Cuda>(), src.to<Cuda>()), base.index_add(0, idx, src), "index_add axis 0");
      // the same along the last axis of a transposed output
      const Tensor<Cpu> bt = base.t();
      check_bits(bt.to<Cuda>().index_add(1, idx.to<Cuda>(), src.t().to<Cuda>()), bt.index_add(1, idx, src.t()), "index_add axis 1");
    }
  }
}

TEST_CASE("cuda embedding lookup: the weight gradient equals the Cpu backend's bit for bit", "[cuda][scatter]") {
  Generator gen(99);
  const Tensor<Cpu> w0 = Tensor<Cpu>::randn({300, 24}, DType::f32, &gen);
  Gen g(7);
  std::vector<double> ids(8 * 64);
  for (auto& x : ids) x = static_cast<double>(g.integer(0, 9) < 7 ? g.integer(0, 5) : g.integer(0, 299));  // frequent tokens collide
  const Tensor<Cpu> tok = Tensor<Cpu>::from_vector(ids, {8, 64}).to(DType::i64);
  const Tensor<Cpu> up = Tensor<Cpu>::randn({8, 64, 24}, DType::f32, &gen);
  // nn::Embedding's forward (nn/embedding.cpp) on both backends, from the same weights
  Var<Cpu> wc(w0, true);
  Var<Cuda> wg(w0.to<Cuda>(), true);
  wc.index_select(0, tok.reshape({-1})).reshape({8, 64, 24}).mul(Var<Cpu>(up)).sum().backward();
  wg.index_select(0, tok.to<Cuda>().reshape({-1})).reshape({8, 64, 24}).mul(Var<Cuda>(up.to<Cuda>())).sum().backward();
  check_bits(wg.grad(), wc.grad(), "embedding weight gradient");
}

TEST_CASE("cuda scatter_add: an out-of-range index (backend call) fails before the output is touched", "[cuda][scatter]") {
  Tensor<Cuda> out = Tensor<Cuda>::full({4, 3}, 5.0);
  const Tensor<Cuda> idx = Tensor<Cuda>::from_vector(std::vector<int64_t>{0, 1, 4, 2, 2, 0}, {2, 3});
  const Tensor<Cuda> src = Tensor<Cuda>::ones({2, 3});
  CHECK_THROWS_WITH(Cuda::scatter_add(out.mview(), 0, idx.cview(), src.cview()),
                    Catch::Contains("scatter_add: index out of range for dimension 0 of size 4"));
  CHECK(to_vector<float>(out) == std::vector<float>(12, 5.f));
  Cuda::scatter_add(out.mview(), 1, idx.slice(1, 0, 2).contiguous().cview(), src.cview());
  CHECK(to_vector<float>(out) == std::vector<float>{6, 6, 5, 5, 5, 7, 5, 5, 5, 5, 5, 5});  // rows [0, 1] and [2, 2]
}

#endif
