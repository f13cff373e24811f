// The host block cache (core/host_alloc.hpp).
#include "kiln/core/host_alloc.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"

namespace kiln {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kLarge = size_t{64} << 10;  // blocks from here on are cached (host_alloc.hpp)

// The size class of a large request: rounded up to a quarter of its power of two.
size_t size_class(size_t bytes) {
  size_t pow2 = kLarge;
  while (pow2 * 2 <= bytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

// KILN_HOST_CACHE_MB, else 2048; a malformed value is a kiln::Error at the first allocation and every
// later one (the cache is then never built).
size_t cap_from_env() {
  const long long mb = detail::env_whole("KILN_HOST_CACHE_MB", 0, std::numeric_limits<long long>::max(), "MiB").value_or(2048);
  return static_cast<size_t>(std::min(mb, 1ll << 40)) << 20;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;  // size class -> blocks
  size_t cached = 0, cap = cap_from_env();
  int64_t hits = 0, misses = 0;

  void release_locked() {
    for (auto& [size, blocks] : free)
      for (void* p : blocks) std::free(p);
    free.clear();
    cached = 0;
  }
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: storages may be freed during static destruction
  return *c;
}

void* raw_alloc(size_t bytes) { return std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign); }

// KILN_HOST_POISON=1: every block handed out is filled with 0xFF bytes (NaN in every float dtype, -1 in
// the integers), so a kernel that leaves part of an uninitialised output unwritten shows as NaN. Unset,
// empty or 0: off; anything else is a kiln::Error at every allocation.
bool poison() {
  static const bool on = [] {
    const char* s = std::getenv("KILN_HOST_POISON");
    if (!s || !*s) return false;
    KILN_CHECK(std::strcmp(s, "0") == 0 || std::strcmp(s, "1") == 0, "KILN_HOST_POISON='{}': use 0 or 1", s);
    return s[0] == '1';
  }();
  return on;
}
void* poisoned(void* p, size_t bytes) {
  if (p && poison()) std::memset(p, 0xFF, bytes);
  return p;
}

}  // namespace

void* host_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes < kLarge) return poisoned(raw_alloc(bytes), bytes);
  const size_t cls = size_class(bytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    auto it = c.free.find(cls);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= cls;
      ++c.hits;
      return poisoned(p, bytes);
    }
    ++c.misses;
  }
  if (void* p = raw_alloc(cls)) return poisoned(p, bytes);
  host_cache_release();  // out of memory: give the cache back and try once more
  return poisoned(raw_alloc(cls), bytes);
}

void host_free(void* p, size_t bytes) {
  if (!p) return;
  if (bytes < kLarge) {
    std::free(p);
    return;
  }
  const size_t cls = size_class(bytes);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    if (c.cached + cls <= c.cap) {
      c.free[cls].push_back(p);
      c.cached += cls;
      return;
    }
  }
  std::free(p);
}

HostCacheStats host_cache_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  return {c.cached, c.hits, c.misses};
}

void host_cache_release() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.release_locked();
}

}  // namespace kiln
