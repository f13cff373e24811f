// Tensor<Reference>'s member bodies, compiled once, and its fused overrides checked against their Has* concepts.
#include "kiln/backends/reference/reference.hpp"
#include "kiln/core/fused_overrides.hpp"
#include "kiln/core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Reference>;
static_assert(fused::overrides_checked<Reference>());
}  // namespace kiln
