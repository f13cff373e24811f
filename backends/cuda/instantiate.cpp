// Tensor<Cuda>'s member bodies, compiled once.
#include "kiln/backends/cuda/cuda.hpp"
#include "kiln/core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Cuda>;
}  // namespace kiln
