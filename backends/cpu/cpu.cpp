// TEMPORARY: forwards every primitive to the Reference backend until the real kernels land.
#include "backends/cpu/cpu.hpp"

#include "backends/reference/reference.hpp"
#include "core/fused.hpp"

namespace kiln {

void Cpu::fill(M out, Scalar value) { Reference::fill(out, value); }
void Cpu::copy(M out, V in) { Reference::copy(out, in); }
template <class Op> void Cpu::unary(M out, V in) { Reference::unary<Op>(out, in); }
template <class Op> void Cpu::binary(M out, V a, V b) { Reference::binary<Op>(out, a, b); }
void Cpu::where(M out, V cond, V a, V b) { Reference::where(out, cond, a, b); }
template <class Op> void Cpu::reduce(M out, V in, int axis) { Reference::reduce<Op>(out, in, axis); }
void Cpu::matmul(M out, V a, V b) { Reference::matmul(out, a, b); }
void Cpu::gather(M out, V src, int axis, V index) { Reference::gather(out, src, axis, index); }
void Cpu::scatter_add(M out, int axis, V index, V src) { Reference::scatter_add(out, axis, index, src); }
void Cpu::rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi) {
  Reference::rand_uniform(out, seed, offset, lo, hi);
}
void Cpu::rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std) {
  Reference::rand_normal(out, seed, offset, mean, std);
}
namespace {
Tensor<Reference> wrap(Cpu::V v) {
  auto* s = const_cast<HostStorage*>(&v.storage);
  return Tensor<Reference>(std::shared_ptr<HostStorage>(s, [](HostStorage*) {}), v.layout, v.dtype);
}
}  // namespace
void Cpu::softmax_lastdim(M out, V x, bool log) {
  const Tensor<Reference> y = log ? wrap(x).log_softmax(-1) : wrap(x).softmax(-1);
  Reference::copy(out, y.cview());
}
void Cpu::softmax_lastdim_backward(M dx, V y, V dy, bool log) {
  const Tensor<Reference> g = fused::softmax_backward(wrap(y), wrap(dy), -1, log);
  Reference::copy(dx, g.cview());
}

int num_threads() { return 1; }
void set_num_threads(int) {}

#define KILN_INST_UNARY(OP) template void Cpu::unary<op::OP>(M, V);
#define KILN_INST_BINARY(OP) template void Cpu::binary<op::OP>(M, V, V);
#define KILN_INST_REDUCE(OP) template void Cpu::reduce<op::OP>(M, V, int);
KILN_UNARY_OPS(KILN_INST_UNARY)
KILN_BINARY_OPS(KILN_INST_BINARY)
KILN_REDUCE_OPS(KILN_INST_REDUCE)
KILN_INDEX_REDUCE_OPS(KILN_INST_REDUCE)

}  // namespace kiln
