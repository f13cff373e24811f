#include "kiln/backends/cuda/allocator.hpp"

#include <algorithm>
#include <utility>

#include "kiln/core/error.hpp"

namespace kiln::cuda {

CachingAllocator::CachingAllocator(std::string name, RawAlloc raw_alloc, RawFree raw_free, Mode mode)
    : name_(std::move(name)), mode_(mode), raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  free_cached_locked();
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= kSmallLimit) return (bytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingAllocator::raw(size_t size, size_t requested) {
  void* p = raw_alloc_(size);
  if (!p && !cache_.empty()) {  // give the cache back and try once more
    ++st_.num_oom_retries;
    free_cached_locked();
    p = raw_alloc_(size);
  }
  if (!p)
    fail("{}: out of memory allocating {} bytes (size class {}; {} bytes allocated, {} reserved, peak {})", name_, requested, size,
         st_.allocated_bytes, st_.reserved_bytes, st_.peak_allocated_bytes);
  ++st_.num_raw_allocs;
  st_.reserved_bytes += size;
  st_.peak_reserved_bytes = std::max(st_.peak_reserved_bytes, st_.reserved_bytes);
  return p;
}

CachingAllocator::Block CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return {};
  const size_t size = mode_ == Mode::exact ? bytes : round_size(bytes);
  KILN_CHECK(size >= bytes, "{}: allocation of {} bytes is too large", name_, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++st_.num_allocs;
  Block b;
  auto it = cache_.lower_bound(size);
  const size_t slack = size <= kSmallLimit ? 0 : std::max(kLargeRound, size / 8);
  if (it != cache_.end() && it->first <= size + slack) {
    b = {it->second, it->first};
    cache_.erase(it);
    ++st_.num_cache_hits;
    --st_.cached_blocks;
  } else {
    b = {raw(size, bytes), size};
  }
  st_.allocated_bytes += b.size;
  st_.requested_bytes += bytes;
  st_.peak_allocated_bytes = std::max(st_.peak_allocated_bytes, st_.allocated_bytes);
  return b;
}

void CachingAllocator::release(Block b, size_t requested) {
  if (!b.ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  st_.allocated_bytes -= b.size;
  st_.requested_bytes -= requested;
  if (mode_ == Mode::exact) {
    raw_free_(b.ptr);
    ++st_.num_raw_frees;
    st_.reserved_bytes -= b.size;
    return;
  }
  cache_.emplace(b.size, b.ptr);
  ++st_.cached_blocks;
}

void CachingAllocator::free_cached_locked() {
  for (auto& [size, p] : cache_) {
    raw_free_(p);
    ++st_.num_raw_frees;
    st_.reserved_bytes -= size;
  }
  cache_.clear();
  st_.cached_blocks = 0;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  free_cached_locked();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  st_.peak_allocated_bytes = st_.allocated_bytes;
  st_.peak_reserved_bytes = st_.reserved_bytes;
}

}  // namespace kiln::cuda
