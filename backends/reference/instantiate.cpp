// Tensor<Reference>'s member bodies, compiled once.
#include "kiln/backends/reference/reference.hpp"
#include "kiln/core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Reference>;
}  // namespace kiln
