// Rotary position embedding (autograd/layer_ops.hpp) on the fused kernel (core/fused_rope.hpp):
//   y = rope_forward(x, cos, sin)        dx = rope_backward(dy, cos, sin), the inverse rotation
// The node saves only the tables (views of the caller's, never a copy of x); its backward turns the
// incoming gradient in place when it is the gradient's only holder.
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_rope.hpp"

namespace kiln::autograd {

template <Backend B> Var<B> RopeOps<B>::rope(const Var<B>& x, const Tensor<B>& c, const Tensor<B>& s) {
  return record<B>("rope", fused::rope_forward(x.value(), c, s), {&x}, [c, s](const Tensor<B>& g) {
    // The pass hands a node its gradient as the only handle on its storage unless something else holds
    // it (autograd/var.cpp); then dx is written over dy by the kernel (f32/f64, unit-stride rows, no
    // shared elements), sparing a fresh buffer, whose first writes cost more than the turn (a cold
    // 1 MiB block per call in the d256 model).
    if (fused::HasRope<B> && g.sole_owner() && (g.dtype() == DType::f32 || g.dtype() == DType::f64) && g.strides().back() == 1 &&
        fused::detail::non_overlapping(g.shape(), g.strides())) {
      Tensor<B> dx = g;
      return Grads<B>{fused::rope_backward_(dx, c, s)};
    }
    return Grads<B>{fused::rope_backward(g, c, s)};
  });
}

#define KILN_INST(B) template struct RopeOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
