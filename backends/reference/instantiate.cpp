// Tensor<Reference>'s member bodies, compiled once.
#include "backends/reference/reference.hpp"
#include "core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Reference>;
}  // namespace kiln
