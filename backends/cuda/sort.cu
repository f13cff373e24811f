// The stable radix sort of positions by key (contract in sort.cuh).
#include "kiln/backends/cuda/device.cuh"
#include "kiln/backends/cuda/sort.cuh"
#include "kiln/core/error.hpp"

namespace kiln::cuda {

namespace {

constexpr int kDigits = 256;           // 8 bits per pass
constexpr int kSortThreads = kDigits;  // one digit counter per thread
constexpr int kSortRounds = 4;         // items per thread and tile
constexpr int kSortTile = kSortThreads * kSortRounds;
constexpr int kScanThreads = 1024;

__device__ __forceinline__ int digit_of(uint64_t key, int shift) { return static_cast<int>((key >> shift) & (kDigits - 1)); }

// counts[d * tiles + t] = items of tile t whose digit is d.
__global__ void __launch_bounds__(kSortThreads)
    radix_count(int64_t* __restrict__ counts, const uint64_t* __restrict__ keys, int64_t n, int shift, int64_t tiles) {
  __shared__ int c[kDigits];
  const int64_t tile = blockIdx.x;
  c[threadIdx.x] = 0;
  __syncthreads();
  for (int r = 0; r < kSortRounds; ++r) {
    const int64_t p = tile * kSortTile + r * kSortThreads + threadIdx.x;
    if (p < n) atomicAdd(&c[digit_of(keys[p], shift)], 1);
  }
  __syncthreads();
  counts[threadIdx.x * tiles + tile] = c[threadIdx.x];
}

// In-place exclusive prefix sum of a[0, m) by one block, tile after tile with a running carry.
__global__ void __launch_bounds__(kScanThreads) exclusive_scan(int64_t* __restrict__ a, int64_t m) {
  __shared__ int64_t warp_total[kScanThreads / kWarp];
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
  int64_t carry = 0;
  for (int64_t base = 0; base < m; base += kScanThreads) {
    const int64_t i = base + threadIdx.x;
    const int64_t v = i < m ? a[i] : 0;
    int64_t x = v;  // inclusive scan within the warp
    for (int o = 1; o < kWarp; o *= 2) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == kWarp - 1) warp_total[w] = x;
    __syncthreads();
    if (w == 0) {  // inclusive scan of the warp totals
      int64_t t = warp_total[lane];
      for (int o = 1; o < kWarp; o *= 2) {
        const int64_t y = __shfl_up_sync(0xffffffffu, t, o);
        if (lane >= o) t += y;
      }
      warp_total[lane] = t;
    }
    __syncthreads();
    if (i < m) a[i] = carry + (w > 0 ? warp_total[w - 1] : 0) + x - v;
    carry += warp_total[kWarp - 1];
    __syncthreads();  // warp_total is rewritten by the next tile
  }
}

// Moves every item of a tile to its slot: the scanned count of (digit, tile), plus the items of the
// same digit earlier in the tile (earlier rounds: running counts; this round: lower threads).
// pos_in == nullptr: the positions are 0 .. n-1 (first pass).
__global__ void __launch_bounds__(kSortThreads)
    radix_scatter(uint64_t* __restrict__ keys_out, int64_t* __restrict__ pos_out, const uint64_t* __restrict__ keys_in,
                  const int64_t* __restrict__ pos_in, const int64_t* __restrict__ first, int64_t n, int shift, int64_t tiles) {
  __shared__ int digit[kSortThreads];
  __shared__ int before[kDigits];
  const int64_t tile = blockIdx.x;
  before[threadIdx.x] = 0;
  for (int r = 0; r < kSortRounds; ++r) {
    const int64_t p = tile * kSortTile + r * kSortThreads + threadIdx.x;
    const bool live = p < n;
    const uint64_t key = live ? keys_in[p] : 0;
    const int d = live ? digit_of(key, shift) : -1;
    digit[threadIdx.x] = d;
    __syncthreads();
    if (live) {
      int rank = 0;
      for (int t = 0; t < static_cast<int>(threadIdx.x); ++t) rank += digit[t] == d;
      const int64_t slot = first[static_cast<int64_t>(d) * tiles + tile] + before[d] + rank;
      keys_out[slot] = key;
      pos_out[slot] = pos_in ? pos_in[p] : p;
    }
    __syncthreads();  // every thread has read before[] and digit[] of this round
    if (live) atomicAdd(&before[d], 1);
    __syncthreads();
  }
}

}  // namespace

SortedByKey sort_by_key(std::string_view op, std::shared_ptr<CudaStorage> keys, int64_t n, int bits) {
  KILN_CHECK(n >= 0 && bits >= 0 && bits <= 64, "{}: sort_by_key: bad arguments (n {}, bits {})", op, n, bits);
  auto keys_b = Cuda::allocate(static_cast<size_t>(n) * sizeof(uint64_t));
  auto pos_a = Cuda::allocate(static_cast<size_t>(n) * sizeof(int64_t));
  auto pos_b = Cuda::allocate(static_cast<size_t>(n) * sizeof(int64_t));
  if (n == 0) return {keys, pos_a};
  const int64_t tiles = ceil_div(n, kSortTile);
  KILN_CHECK(tiles <= 0x7fffffffLL, "{}: {} items are too many to sort", op, n);
  auto counts = Cuda::allocate(static_cast<size_t>(tiles) * kDigits * sizeof(int64_t));
  const int passes = bits == 0 ? 1 : (bits + 7) / 8;  // one pass at least: it writes the positions
  bool first_pass = true;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = 8 * pass;
    const auto grid = static_cast<unsigned>(tiles);
    radix_count<<<grid, kSortThreads, 0, stream()>>>(counts->as<int64_t>(), keys->as<uint64_t>(), n, shift, tiles);
    after_launch(op, __FILE__, __LINE__);
    exclusive_scan<<<1, kScanThreads, 0, stream()>>>(counts->as<int64_t>(), tiles * kDigits);
    after_launch(op, __FILE__, __LINE__);
    radix_scatter<<<grid, kSortThreads, 0, stream()>>>(keys_b->as<uint64_t>(), pos_b->as<int64_t>(), keys->as<uint64_t>(),
                                                       first_pass ? nullptr : pos_a->as<int64_t>(), counts->as<int64_t>(), n, shift, tiles);
    after_launch(op, __FILE__, __LINE__);
    std::swap(keys, keys_b);
    std::swap(pos_a, pos_b);
    first_pass = false;
  }
  return {keys, pos_a};
}

}  // namespace kiln::cuda
