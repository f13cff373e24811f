// Tensor<Cpu>'s member bodies, compiled once.
#include "backends/cpu/cpu.hpp"
#include "core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Cpu>;
}  // namespace kiln
