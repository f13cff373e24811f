#pragma once
// The caching allocator behind Cuda storage (pure C++: the raw allocate/free functions are injected,
// so the caching logic is tested on the host with malloc, with or without a GPU).
//
// Why: cudaMalloc and cudaFree are slow and cudaFree synchronises the device. A training step frees
// and allocates the same sizes every step, so freed blocks are kept in bins and handed out again.
//
//  * Size classes: a request is rounded up to a multiple of 512 bytes when it is at most 1 MiB (the
//    small bins), else to a multiple of 2 MiB (the large bins). Bins are keyed by the rounded size.
//    A small request takes a cached block of exactly its class; a large one the smallest cached block
//    of at least its class and at most 1/8 (or 2 MiB) larger, so one huge cached block does not
//    serve a stream of small requests.
//  * Stream-ordered reuse: every kernel of a device runs on that device's one stream (runtime.hpp),
//    so a block freed on the host while kernels that use it are still queued can be handed to the
//    next request at once: the new user's kernels are queued after the old ones on the same stream.
//  * Out of memory: the cache is emptied (every cached block freed) and the raw allocation retried
//    once; a second failure throws kiln::Error with the request and the current statistics.
//  * Thread-safe (one mutex).
//  * Mode::exact (KILN_CUDA_NO_CACHE=1 in the environment, see runtime.cpp) turns caching off: every
//    request is its own raw allocation of exactly the requested size, freed when released. Slow (on a
//    GPU cudaFree synchronises), but an out-of-bounds access is then outside any allocation, which is
//    what compute-sanitizer's memcheck (or AddressSanitizer on the emulated device) needs to see it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::cuda {

struct MemoryStats {
  size_t allocated_bytes = 0;       // held by live storage (rounded sizes)
  size_t reserved_bytes = 0;        // allocated + cached, i.e. obtained from the raw allocator
  size_t peak_allocated_bytes = 0;  // since creation or reset_peak()
  size_t peak_reserved_bytes = 0;
  size_t requested_bytes = 0;    // held by live storage, as requested (before rounding)
  uint64_t num_allocs = 0;       // allocate() calls
  uint64_t num_cache_hits = 0;   // ... served from the cache
  uint64_t num_raw_allocs = 0;   // raw allocations (cudaMalloc)
  uint64_t num_raw_frees = 0;    // raw frees (cudaFree), from empty_cache() and OOM retries
  uint64_t num_oom_retries = 0;  // raw allocations that failed once and were retried after emptying the cache
  size_t cached_blocks = 0;
};

class CachingAllocator {
 public:
  // raw_alloc returns nullptr when out of memory; raw_free releases what raw_alloc returned.
  using RawAlloc = std::function<void*(size_t)>;
  using RawFree = std::function<void(void*)>;

  static constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
  static constexpr size_t kSmallRound = 512;
  static constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB

  enum class Mode { caching, exact };
  CachingAllocator(std::string name, RawAlloc raw_alloc, RawFree raw_free, Mode mode = Mode::caching);
  ~CachingAllocator();  // frees the cached blocks (live ones belong to their storage)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The size class of a request (what allocate reserves for it). 0 stays 0.
  static size_t round_size(size_t bytes);

  struct Block {
    void* ptr = nullptr;
    size_t size = 0;  // the block's size (>= the request's size class)
  };
  // A block of at least `bytes` (nullptr for 0 bytes). Throws kiln::Error when memory runs out.
  Block allocate(size_t bytes);
  // Gives a block back to the cache. `requested` is what allocate was asked for.
  void release(Block b, size_t requested);
  // Frees every cached block.
  void empty_cache();
  MemoryStats stats() const;
  void reset_peak();

 private:
  void* raw(size_t size, size_t requested);
  void free_cached_locked();

  std::string name_;
  Mode mode_;
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;  // size -> cached block
  MemoryStats st_;
};

}  // namespace kiln::cuda
#pragma GCC visibility pop
