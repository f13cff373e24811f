// softmax / log_softmax along one axis: x [*] -> y [*]. Saves the output only.
//   softmax:      dx = y * (dy - sum(dy * y, axis))
//   log_softmax:  dx = dy - exp(y) * sum(dy, axis)
// both through fused::softmax_backward, which a backend may override with a fused kernel.
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused.hpp"

namespace kiln::autograd {

template <Backend B> Var<B> SoftmaxOps<B>::softmax(const Var<B>& x_in, int64_t axis, bool log) {
  const Var<B> x = autocast::cast(log ? autocast::Op::log_softmax : autocast::Op::softmax, x_in);
  Tensor<B> y = fused::softmax(x.value(), axis, log);
  return record<B>(log ? "log_softmax" : "softmax", y, {&x},
                   [y, axis, log](const Tensor<B>& g) { return Grads<B>{fused::softmax_backward(y, g, axis, log)}; });
}

#define KILN_INST(B) template struct SoftmaxOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
