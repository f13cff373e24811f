// Differential attention V2's head pairing as one recorded op on the fused kernel (core/fused_diff2.hpp).
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_diff2.hpp"

namespace kiln::autograd {

template <Backend B> Var<B> Diff2Ops<B>::combine(const Var<B>& a, const Var<B>& lambda_logits) {
  const Tensor<B> av = a.value(), lv = lambda_logits.value();
  return record<B>("diff2_combine", fused::diff2_combine_forward(av, lv), {&a, &lambda_logits}, [av, lv](const Tensor<B>& g) {
    auto [da, dl] = fused::diff2_combine_backward(av, lv, g);
    return Grads<B>{da, dl};
  });
}

#define KILN_INST(B) template struct Diff2Ops<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
