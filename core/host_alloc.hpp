#pragma once
// Host memory for the Reference and Cpu backends' storages: 64-byte aligned blocks, with a cache of
// freed large blocks.
//
// A training step allocates and frees the same activations and gradients every time. Handed back to
// the C library, a block of hundreds of KiB goes back to the kernel (munmap, or a trim of the heap)
// and the next step pays a page fault and a zeroed page for every 4 KiB of it again: a third of a small
// CNN's step went there, and a d256 GPT step still took ~400 faults per step in blocks under 1 MiB
// while the cache started at 1 MiB. So blocks of at least 64 KiB are rounded up to a size
// class (4 per power of two: at most 25% more than asked) and, when freed, kept for the next request
// of their class, up to a cap on the bytes kept (KILN_HOST_CACHE_MB, default 2048; 0 turns the cache
// off). Smaller blocks go straight to aligned_alloc/free. A failed allocation empties the cache and
// tries once more.
// Thread-safe. Memory from the cache is not zeroed (neither is aligned_alloc's); KILN_HOST_POISON=1
// fills every block with 0xFF bytes (NaN floats) instead, which the tests use to catch outputs a kernel
// leaves partly unwritten.
#include <cstddef>
#include <cstdint>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// A block of at least `bytes` (nullptr for 0; nullptr when out of memory). Free it with host_free
// and the same `bytes`.
void* host_alloc(size_t bytes);
void host_free(void* p, size_t bytes);

struct HostCacheStats {
  size_t cached_bytes = 0;  // held in the cache, free for reuse
  int64_t hits = 0;         // large allocations served from the cache
  int64_t misses = 0;       // large allocations that went to the C library
};
HostCacheStats host_cache_stats();
// Returns every cached block to the C library.
void host_cache_release();

}  // namespace kiln
#pragma GCC visibility pop
