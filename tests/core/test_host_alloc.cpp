// The host block cache (core/host_alloc.hpp): which blocks it keeps and hands back.
#include "common/kiln_test.hpp"
#include "kiln/core/host_alloc.hpp"

using namespace kiln;

namespace {
int64_t hits() { return host_cache_stats().hits; }
int64_t large() {
  const HostCacheStats s = host_cache_stats();
  return s.hits + s.misses;
}
}  // namespace

TEST_CASE("host_alloc: blocks from 64 KiB on come back from the cache, in their size class", "[host_alloc]") {
  // A weight gradient of a [256, 256] f32 Linear (256 KiB): freed, the next request of its size class
  // gets the same block, not a new one from the C library (whose pages would fault again).
  // (first request, second request of the same class: rounded up to a quarter of its power of two)
  const std::pair<size_t, size_t> cases[] = {{size_t{64} << 10, size_t{64} << 10},
                                             {size_t{256} << 10, (size_t{256} << 10) - 100},
                                             {size_t{704} << 10, (size_t{640} << 10) + 64},
                                             {size_t{3} << 20, (size_t{5} << 19) + 1}};
  for (const auto& [bytes, again] : cases) {
    INFO("bytes " << bytes << ", then " << again);
    void* a = host_alloc(bytes);
    REQUIRE(a != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(a) % 64 == 0);
    host_free(a, bytes);
    const int64_t before = hits();
    void* b = host_alloc(again);
    CHECK(b == a);
    CHECK(hits() == before + 1);
    host_free(b, again);
  }
  // Below 64 KiB: straight to the C library, not counted.
  const int64_t before = large();
  void* s = host_alloc((size_t{64} << 10) - 64);
  REQUIRE(s != nullptr);
  host_free(s, (size_t{64} << 10) - 64);
  CHECK(large() == before);
  // Another class is not served from this one: 256 KiB and 384 KiB are different classes.
  void* c = host_alloc(size_t{256} << 10);
  host_free(c, size_t{256} << 10);
  void* d = host_alloc(size_t{384} << 10);
  CHECK(d != c);
  host_free(d, size_t{384} << 10);
}
