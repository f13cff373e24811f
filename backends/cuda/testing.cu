// backends/cuda/testing.hpp: the kernels' index arithmetic evaluated on the host.
#include "kiln/backends/cuda/indexing.cuh"
#include "kiln/backends/cuda/testing.hpp"

namespace kiln::cuda::testing {

std::vector<std::array<int64_t, 3>> walk_offsets(const Shape& shape, const std::array<Strides, 3>& strides,
                                                 const std::array<int64_t, 3>& offsets, const std::vector<int64_t>& linear) {
  const Walk<3> w = make_walk<3>("walk_offsets", shape, {&strides[0], &strides[1], &strides[2]}, offsets);
  std::vector<std::array<int64_t, 3>> out;
  out.reserve(linear.size());
  for (const int64_t i : linear) {
    int64_t off[3];
    w.offsets(i, off);
    out.push_back({off[0], off[1], off[2]});
  }
  return out;
}

}  // namespace kiln::cuda::testing
