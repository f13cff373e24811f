// SwiGLU (autograd/layer_ops.hpp) on the fused kernel (core/fused_swiglu.hpp):
//   y = silu(a)·b          da, db = swiglu_backward(a, b, dy)
// The node saves the gate a and the up projection b; the backward writes db over the incoming gradient
// when nothing else holds it (fused::swiglu_backward_reusing).
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_swiglu.hpp"

namespace kiln::autograd {

template <Backend B> Var<B> SwiGLUOps<B>::swiglu(const Var<B>& gate, const Var<B>& up) {
  const Tensor<B> a = gate.value(), b = up.value();
  return record<B>("swiglu", fused::swiglu_forward(a, b), {&gate, &up}, [a, b](const Tensor<B>& g) {
    auto [da, db] = fused::swiglu_backward_reusing(a, b, g);  // db over g's memory when the engine alone holds g
    return Grads<B>{da, db};
  });
}

#define KILN_INST(B) template struct SwiGLUOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
