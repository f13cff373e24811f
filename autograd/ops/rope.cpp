// Rotary position embedding (autograd/layer_ops.hpp) on the fused kernel (core/fused_rope.hpp):
//   y = rope_forward(x, cos, sin)        dx = rope_backward(dy, cos, sin), the inverse rotation
// The node saves only the tables (views of the caller's, never a copy of x).
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_rope.hpp"

namespace kiln::autograd {

template <Backend B> Var<B> RopeOps<B>::rope(const Var<B>& x, const Tensor<B>& c, const Tensor<B>& s) {
  return record<B>("rope", fused::rope_forward(x.value(), c, s), {&x},
                   [c, s](const Tensor<B>& g) { return Grads<B>{fused::rope_backward(g, c, s)}; });
}

#define KILN_INST(B) template struct RopeOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
