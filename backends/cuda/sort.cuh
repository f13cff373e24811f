#pragma once
// A stable sort of positions by key on the GPU (include from .cu files only): the grouping step of the
// deterministic scatter_add (index.cu).
//
// LSD radix sort, 8 bits per pass. Each pass cuts the n items into tiles of kSortTile; per tile it
// counts the items of every digit (digit-major table [256, tiles]), one exclusive scan of that table
// gives every (digit, tile) its first output slot, and the scatter ranks the items of a tile that share
// a digit by their position. Every pass is therefore stable, and so is the sort: items with equal keys
// come out in ascending position. All counts are integers, so the result never depends on the order
// in which the GPU runs blocks or threads.
#include <cstdint>
#include <memory>
#include <string_view>

#include "kiln/backends/cuda/storage.hpp"

#pragma GCC visibility push(default)  // exported from libkiln for the tests (tests/cuda)
namespace kiln::cuda {

struct SortedByKey {
  std::shared_ptr<CudaStorage> keys;  // uint64_t [n], ascending
  std::shared_ptr<CudaStorage> pos;   // int64_t [n]: the input position of each key; equal keys ascending
};

// Sorts the n keys (uint64_t, each < 2^bits; 0 <= bits <= 64) of `keys` together with their positions
// 0 .. n-1. `keys` may be reused as scratch. Queued on the current device's stream.
SortedByKey sort_by_key(std::string_view op, std::shared_ptr<CudaStorage> keys, int64_t n, int bits);

}  // namespace kiln::cuda
#pragma GCC visibility pop
