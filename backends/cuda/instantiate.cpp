// Tensor<Cuda>'s member bodies, compiled once, and its fused overrides checked against their Has* concepts.
#include "kiln/backends/cuda/cuda.hpp"
#include "kiln/core/fused_overrides.hpp"
#include "kiln/core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Cuda>;
static_assert(fused::overrides_checked<Cuda>());
}  // namespace kiln
