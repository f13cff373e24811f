// Tensor<Cpu>'s member bodies, compiled once, and its fused overrides checked against their Has* concepts.
#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/core/fused_overrides.hpp"
#include "kiln/core/tensor_impl.hpp"

namespace kiln {
template class Tensor<Cpu>;
static_assert(fused::overrides_checked<Cpu>());
}  // namespace kiln
