// Fused attention: O = softmax(scale · q kᵀ + mask) v (with a soft cap: softcap · tanh(scale · q kᵀ /
// softcap) + mask) through fused::attention_forward, which a
// backend overrides with a flash kernel. Saves q, k, v, O and LSE (and the bool key padding and the
// user's attention mask as given, never expanded; the mask gets no gradient); the
// backward is fused::attention_backward (FlashAttention-2: P recomputed from LSE). Every input gets a
// gradient when any does (the fused backward produces all three at once).
// Under autocast q, k, v are cast to the low dtype (the kernels compute in f32 and round O once).
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused.hpp"

namespace kiln::autograd {

template <Backend B> Grads<B> AttentionBackward<B>::operator()(const Tensor<B>& grad_out) const {
  auto [dq, dk, dv] = fused::attention_backward(q, k, v, o, lse, grad_out, scale, causal, pos0, key_padding, mask, softcap);
  return Grads<B>{dq, dk, dv};
}

template <Backend B> Var<B> AttentionOps<B>::attention(const Var<B>& q_in, const Var<B>& k_in, const Var<B>& v_in, double scale,
                                                       bool causal, int64_t pos0, const Tensor<B>& key_padding, const Tensor<B>& mask,
                                                       double softcap) {
  constexpr auto op = autocast::Op::attention;
  const Var<B> q = autocast::cast(op, q_in), k = autocast::cast(op, k_in), v = autocast::cast(op, v_in);
  auto [o, lse] = fused::attention_forward(q.value(), k.value(), v.value(), scale, causal, pos0, key_padding, mask, softcap);
  if (!(needs_grad(q) || needs_grad(k) || needs_grad(v))) return Var<B>(o);
  return record<B>("attention", o, {&q, &k, &v},
                   AttentionBackward<B>{q.value(), k.value(), v.value(), o, lse, key_padding, mask, scale, causal, pos0, softcap});
}

#define KILN_INST(B)                    \
  template struct AttentionBackward<B>; \
  template struct AttentionOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
