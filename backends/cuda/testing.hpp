#pragma once
// Host-side views of the Cuda backend's index arithmetic, for tests that run without a GPU
// (tests/cuda/). Not part of the user API.
#include <array>
#include <cstdint>
#include <vector>

#include "kiln/core/shape.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::cuda::testing {

// The element offsets the Cuda kernels compute (indexing.cuh: make_walk + Walk::offsets, evaluated on
// the host) for three operands with `strides` and base `offsets` over `shape`, at each linear index.
std::vector<std::array<int64_t, 3>> walk_offsets(const Shape& shape, const std::array<Strides, 3>& strides,
                                                 const std::array<int64_t, 3>& offsets, const std::vector<int64_t>& linear);

}  // namespace kiln::cuda::testing
#pragma GCC visibility pop
