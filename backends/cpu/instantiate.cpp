// Tensor<Cpu>'s member bodies, compiled once.
#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Cpu>;
}  // namespace kiln
