// SwiGLU (autograd/layer_ops.hpp) on the fused kernel (core/fused_swiglu.hpp):
//   y = silu(a)·b          da, db = swiglu_backward(a, b, dy)
// The node saves the gate a and the up projection b.
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_swiglu.hpp"

namespace kiln::autograd {

template <Backend B> Var<B> SwiGLUOps<B>::swiglu(const Var<B>& gate, const Var<B>& up) {
  const Tensor<B> a = gate.value(), b = up.value();
  // The backward writes da over a, db over b when nothing can read them again, else over g when the
  // engine alone holds it (core/fused_swiglu.hpp): the captured Vars let it ask.
  return record<B>("swiglu", fused::swiglu_forward(a, b), {&gate, &up}, [a, b, gate, up](const Tensor<B>& g) {
    auto [da, db] = fused::swiglu_backward_reusing(a, b, g, saved_input_is_dead(gate, a), saved_input_is_dead(up, b));
    return Grads<B>{da, db};
  });
}

#define KILN_INST(B) template struct SwiGLUOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
