// The Cuda backend's runtime: the caching allocator (host-tested with malloc, so it runs everywhere),
// and, on a GPU, device memory, statistics, errors and the CPU <-> GPU round trip. Tests that need a
// device are tagged [cuda] or named for Cuda and skip themselves without one (tests/catch_main.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/backends/dispatch.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/tensor.hpp>

#if defined(KILN_HAVE_CUDA_BACKEND)
#include <kiln/backends/cuda/allocator.hpp>
#include <kiln/backends/cuda/cuda.hpp>
#include <kiln/backends/cuda/testing.hpp>
#endif

using namespace kiln;

#if defined(KILN_HAVE_CUDA_BACKEND)

namespace {

// A raw allocator over malloc with a byte budget, counting its calls.
struct FakeDevice {
  size_t budget = size_t{1} << 40, used = 0;
  std::map<void*, size_t> live;  // pointer -> bytes
  std::vector<size_t> sizes;
  cuda::CachingAllocator make(cuda::CachingAllocator::Mode mode = cuda::CachingAllocator::Mode::caching) {
    return cuda::CachingAllocator(
        "fake allocator",
        [this](size_t n) -> void* {
          if (used + n > budget) return nullptr;
          void* p = std::malloc(n);
          used += n;
          live.emplace(p, n);
          sizes.push_back(n);
          return p;
        },
        [this](void* p) {
          REQUIRE(live.count(p) == 1);
          used -= live[p];  // the budget counts what is held, like a device's free memory
          live.erase(p);
          std::free(p);
        },
        mode);
  }
};

}  // namespace

TEST_CASE("cuda allocator: size classes", "[cuda-host][allocator]") {
  using A = cuda::CachingAllocator;
  CHECK(A::round_size(0) == 0);
  CHECK(A::round_size(1) == 512);
  CHECK(A::round_size(512) == 512);
  CHECK(A::round_size(513) == 1024);
  CHECK(A::round_size(size_t{1} << 20) == size_t{1} << 20);
  CHECK(A::round_size((size_t{1} << 20) + 1) == size_t{2} << 20);
  CHECK(A::round_size((size_t{5} << 20) + 7) == size_t{6} << 20);
}

TEST_CASE("cuda allocator: freed blocks are reused by size class, statistics add up", "[cuda-host][allocator]") {
  FakeDevice dev;
  auto alloc = dev.make();
  auto a = alloc.allocate(1000);  // class 1024
  auto b = alloc.allocate(3000);  // class 3072
  CHECK(a.size == 1024);
  CHECK(b.size == 3072);
  auto s = alloc.stats();
  CHECK(s.allocated_bytes == 4096);
  CHECK(s.requested_bytes == 4000);
  CHECK(s.reserved_bytes == 4096);
  CHECK(s.num_raw_allocs == 2);
  alloc.release(a, 1000);
  auto c = alloc.allocate(600);  // class 1024: a's block again
  CHECK(c.ptr == a.ptr);
  auto d = alloc.allocate(100);  // class 512: a new block (small classes match exactly)
  CHECK(d.ptr != a.ptr);
  s = alloc.stats();
  CHECK(s.num_cache_hits == 1);
  CHECK(s.num_raw_allocs == 3);
  CHECK(s.allocated_bytes == 1024 + 3072 + 512);
  CHECK(s.peak_allocated_bytes == 1024 + 3072 + 512);
  alloc.release(b, 3000);
  alloc.release(c, 600);
  alloc.release(d, 100);
  s = alloc.stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.requested_bytes == 0);
  CHECK(s.reserved_bytes == 4608);
  CHECK(s.cached_blocks == 3);
  alloc.reset_peak();
  CHECK(alloc.stats().peak_allocated_bytes == 0);
  alloc.empty_cache();
  s = alloc.stats();
  CHECK(s.reserved_bytes == 0);
  CHECK(s.num_raw_frees == 3);
  CHECK(dev.live.empty());
  CHECK(alloc.allocate(0).ptr == nullptr);
}

TEST_CASE("cuda allocator: large blocks are reused only when not much larger", "[cuda-host][allocator]") {
  FakeDevice dev;
  auto alloc = dev.make();
  const size_t MiB = size_t{1} << 20;
  auto big = alloc.allocate(64 * MiB);
  alloc.release(big, 64 * MiB);
  auto small = alloc.allocate(4 * MiB);  // 64 MiB is far more than 4 + max(2, 4/8) MiB: not reused
  CHECK(small.ptr != big.ptr);
  auto near = alloc.allocate(60 * MiB);  // 64 <= 60 + 60/8 = 67.5: reused
  CHECK(near.ptr == big.ptr);
  CHECK(near.size == 64 * MiB);
  alloc.release(small, 4 * MiB);
  alloc.release(near, 60 * MiB);
}

TEST_CASE("cuda allocator: out of memory empties the cache, retries, then names the request", "[cuda-host][allocator]") {
  FakeDevice dev;
  const size_t MiB = size_t{1} << 20;
  dev.budget = 10 * MiB;
  auto alloc = dev.make();
  auto a = alloc.allocate(4 * MiB);
  auto b = alloc.allocate(4 * MiB);
  alloc.release(a, 4 * MiB);         // cached; 8 MiB of 10 reserved
  auto c = alloc.allocate(6 * MiB);  // fails, frees the cached 4 MiB, succeeds
  CHECK(c.ptr != nullptr);
  CHECK(alloc.stats().num_oom_retries == 1);
  CHECK(alloc.stats().num_raw_frees == 1);
  try {
    (void)alloc.allocate(8 * MiB);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("fake allocator") && Catch::Contains("out of memory allocating 8388608 bytes"));
  }
  alloc.release(b, 4 * MiB);
  alloc.release(c, 6 * MiB);
}

TEST_CASE("cuda allocator: exact mode (KILN_CUDA_NO_CACHE) allocates exact sizes and frees at once", "[cuda-host][allocator]") {
  FakeDevice dev;
  auto alloc = dev.make(cuda::CachingAllocator::Mode::exact);
  auto a = alloc.allocate(1000);
  CHECK(a.size == 1000);
  CHECK(dev.sizes == std::vector<size_t>{1000});  // not rounded to the 512-byte class
  alloc.release(a, 1000);
  CHECK(dev.live.empty());  // freed, not cached
  auto b = alloc.allocate(1000);
  auto c = alloc.allocate(3 << 20);
  CHECK(c.size == size_t{3} << 20);  // not rounded to 2 MiB
  const auto s = alloc.stats();
  CHECK(s.num_cache_hits == 0);
  CHECK(s.num_raw_allocs == 3);
  CHECK(s.num_raw_frees == 1);
  CHECK(s.allocated_bytes == 1000 + (size_t{3} << 20));
  CHECK(s.reserved_bytes == s.allocated_bytes);
  CHECK(s.cached_blocks == 0);
  alloc.release(b, 1000);
  alloc.release(c, size_t{3} << 20);
  CHECK(dev.live.empty());
  CHECK(alloc.stats().reserved_bytes == 0);
}

TEST_CASE("cuda allocator: concurrent allocate/release from several threads", "[cuda-host][allocator]") {
  FakeDevice dev;
  auto alloc = dev.make();
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&alloc, t] {
      for (int i = 0; i < 2000; ++i) {
        const size_t n = static_cast<size_t>(1 + (i * 37 + t * 101) % 5000);
        auto blk = alloc.allocate(n);
        static_cast<char*>(blk.ptr)[n - 1] = 1;
        alloc.release(blk, n);
      }
    });
  for (auto& x : th) x.join();
  const auto s = alloc.stats();
  CHECK(s.allocated_bytes == 0);
  CHECK(s.num_allocs == 8000);
  CHECK(s.num_cache_hits + s.num_raw_allocs == 8000);
}

TEST_CASE("cuda without a device: clear errors, never a crash", "[cuda-host]") {
  if (cuda::available()) return;  // covered by the [cuda] tests on a GPU
  CHECK(cuda::device_count() == 0);
  CHECK(!cuda::unavailable_reason().empty());
  CHECK_THROWS_WITH(Tensor<Cuda>::zeros({2, 3}), Catch::Contains("no CUDA device"));
  CHECK_THROWS_WITH(dispatch("cuda", []<Backend B>() { return 0; }), Catch::Contains("device 'cuda': no CUDA device"));
  CHECK_THROWS_WITH(cuda::memory_stats(), Catch::Contains("no CUDA device"));
  CHECK_THROWS_WITH(cuda::set_device(0), Catch::Contains("device 0 does not exist"));
}

// ------------------------------------------------------------------------------------ on a GPU
TEST_CASE("cuda: every dtype round-trips CPU -> GPU -> CPU bit for bit, views included", "[cuda]") {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean}) {
    Generator g(7);
    const Tensor<Cpu> x = Tensor<Cpu>::randn({5, 7}, DType::f32, &g).mul(10.0).to(d);
    const Tensor<Cuda> y = x.to<Cuda>();
    CHECK(y.dtype() == d);
    const Tensor<Cpu> back = y.to<Cpu>();
    CHECK(to_vector<double>(back.to(DType::f64)) == to_vector<double>(x.to(DType::f64)));
    const Tensor<Cpu> view = y.transpose(0, 1).narrow(0, 2, 3).to<Cpu>();  // a strided view, copied on the GPU
    CHECK(to_vector<double>(view.to(DType::f64)) == to_vector<double>(x.transpose(0, 1).narrow(0, 2, 3).to(DType::f64)));
  }
}

TEST_CASE("cuda: memory statistics follow tensors, the cache reuses freed blocks", "[cuda]") {
  cuda::synchronize();
  cuda::empty_cache();
  if (const char* e = std::getenv("KILN_CUDA_NO_CACHE"); e && *e && std::string(e) != "0") {  // caching off: exact sizes, no reuse
    const auto s0 = cuda::memory_stats();
    {
      const Tensor<Cuda> a = Tensor<Cuda>::zeros({1000, 1000});
      CHECK(cuda::memory_stats().allocated_bytes - s0.allocated_bytes == 4000000);
    }
    const auto s1 = cuda::memory_stats();
    CHECK(s1.allocated_bytes == s0.allocated_bytes);
    CHECK(s1.reserved_bytes == s1.allocated_bytes);
    CHECK(s1.num_cache_hits == 0);
    return;
  }
  const auto s0 = cuda::memory_stats();
  {
    const Tensor<Cuda> a = Tensor<Cuda>::zeros({1000, 1000});  // 4 MB
    const auto s1 = cuda::memory_stats();
    CHECK(s1.allocated_bytes - s0.allocated_bytes == size_t{4} << 20);  // rounded to 2 MiB classes
    CHECK(s1.requested_bytes - s0.requested_bytes == 4000000);
  }
  const auto s2 = cuda::memory_stats();
  CHECK(s2.allocated_bytes == s0.allocated_bytes);
  const Tensor<Cuda> b = Tensor<Cuda>::zeros({1000, 1000});
  CHECK(cuda::memory_stats().num_cache_hits > s2.num_cache_hits);
  CHECK(cuda::memory_stats().peak_allocated_bytes >= s0.allocated_bytes + (size_t{4} << 20));
}

TEST_CASE("cuda: an impossible allocation is a kiln::Error naming the size, and the device stays usable", "[cuda]") {
  CHECK_THROWS_WITH(Tensor<Cuda>::empty({int64_t{1} << 45}), Catch::Contains("out of memory") && Catch::Contains("140737488355328"));
  CHECK(item<float>(Tensor<Cuda>::ones({3}).sum()) == 3.0f);
}

TEST_CASE("cuda: ops on a missing device index fail cleanly", "[cuda]") {
  CHECK_THROWS_WITH(cuda::set_device(cuda::device_count()), Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(dispatch("cuda:x", []<Backend B>() { return 0; }), Catch::Contains("unknown device 'cuda:x'"));
  CHECK(!cuda::device_name().empty());
}

#else

TEST_CASE("cuda backend not built: --device cuda says how to get it", "[cuda-host]") {
  CHECK_THROWS_WITH(dispatch("cuda", []<Backend B>() { return 0; }), Catch::Contains("built without the CUDA backend"));
}

#endif

#if defined(KILN_HAVE_CUDA_BACKEND)
// The index arithmetic of every Cuda elementwise, reduction, indexing and random kernel (indexing.cuh),
// evaluated on the host: each operand's offset for linear index i must be Layout::offset_of(i), for
// merged and unmerged dims, size-1 dims, broadcast (zero) strides, negative-free transposes, base
// offsets, 0-d shapes, and the 64-bit path (more than 2^31 elements, offsets only: nothing allocated).
TEST_CASE("cuda walk: kernel offsets equal the layout's for any strides (host)", "[cuda-host][walk]") {
  std::mt19937_64 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int it = 0; it < 400; ++it) {
    const auto rank = static_cast<size_t>(pick(0, 6));
    Shape shape(rank);
    for (auto& d : shape) d = pick(0, 9) == 0 ? 1 : pick(1, 5);
    std::array<Strides, 3> strides;
    std::array<int64_t, 3> base{};
    for (int k = 0; k < 3; ++k) {
      Strides st = contiguous_strides(shape);
      // operand kinds: contiguous, permuted (transposed), broadcast dims, stepped
      const int64_t kind = pick(0, 3);
      if (kind == 1 && rank >= 2) {
        Shape perm_shape = shape;
        std::vector<size_t> perm(rank);
        for (size_t d = 0; d < rank; ++d) perm[d] = d;
        std::shuffle(perm.begin(), perm.end(), rng);
        Shape ps(rank);
        for (size_t d = 0; d < rank; ++d) ps[d] = shape[perm[d]];
        const Strides pst = contiguous_strides(ps);
        for (size_t d = 0; d < rank; ++d) st[perm[d]] = pst[d];
      } else if (kind == 2) {
        for (size_t d = 0; d < rank; ++d)
          if (pick(0, 2) == 0) st[d] = 0;
      } else if (kind == 3) {
        for (auto& s : st) s *= pick(1, 3);
      }
      strides[static_cast<size_t>(k)] = st;
      base[static_cast<size_t>(k)] = pick(0, 50);
    }
    const int64_t n = numel(shape);
    std::vector<int64_t> lin;
    for (int64_t i = 0; i < n; ++i) lin.push_back(i);
    const auto got = cuda::testing::walk_offsets(shape, strides, base, lin);
    for (int k = 0; k < 3; ++k) {
      const Layout L(shape, strides[static_cast<size_t>(k)], base[static_cast<size_t>(k)]);
      for (int64_t i = 0; i < n; ++i) {
        INFO("shape " << shape_str(shape) << " operand " << k << " strides " << shape_str(L.strides) << " element " << i);
        REQUIRE(got[static_cast<size_t>(i)][static_cast<size_t>(k)] == L.offset_of(i));
      }
    }
  }
  // 2^33 elements: the 64-bit index path, sampled
  const Shape big{1 << 11, 3, 1 << 11, 1 << 11};
  const std::array<Strides, 3> bs{contiguous_strides(big), Strides{1, 0, int64_t{1} << 12, 2}, Strides{0, 1, 3, int64_t{1} << 30}};
  std::vector<int64_t> lin{0, 1, (int64_t{1} << 31) - 1, int64_t{1} << 31, (int64_t{1} << 32) + 12345, numel(big) - 1};
  const auto got = cuda::testing::walk_offsets(big, bs, {7, 0, 3}, lin);
  for (int k = 0; k < 3; ++k) {
    const Layout L(big, bs[static_cast<size_t>(k)], std::array<int64_t, 3>{7, 0, 3}[static_cast<size_t>(k)]);
    for (size_t j = 0; j < lin.size(); ++j) CHECK(got[j][static_cast<size_t>(k)] == L.offset_of(lin[j]));
  }
}
#endif
