// Tensor<Cuda>'s member bodies, compiled once.
#include "backends/cuda/cuda.hpp"
#include "core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Cuda>;
}  // namespace kiln
