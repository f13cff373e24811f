// Fused differential attention: O = FA(q1, k1, v) − λ·FA(q2, k2, v) through
// fused::diff_attention_forward (core/fused_diff_attention.hpp), which a backend overrides with one
// kernel for both branches. Saves q, k, v, λ, O, O2 and the two row log-sum-exps; the backward,
// fused::diff_attention_backward, writes dq and dk of both branches into one tensor each (no zero
// tensor and copy per branch, as selecting the branches and attending to each would record) and
// gives λ its gradient −Σ dO ⊙ O2. Every input gets a gradient when any does.
// Under autocast q, k, v are cast to the low dtype and λ to theirs.
// diff_attention_norm adds DifferentialAttention's head-wise RMSNorm and (1 − λ_init) scale as the op's
// epilogue (fused::diff_attention_norm_forward/backward): the norm's weight is one more input.
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_diff_attention.hpp"

namespace kiln::autograd {

template <Backend B> Grads<B> DiffAttentionBackward<B>::operator()(const Tensor<B>& grad_out) const {
  auto [dq, dk, dv, dlam] =
      fused::diff_attention_backward(q, k, v, lam, o, o2, lse1, lse2, grad_out, scale, causal, pos0, key_padding, mask);
  return Grads<B>{dq, dk, dv, dlam};
}

template <Backend B> Var<B> DiffAttentionOps<B>::diff_attention(const Var<B>& q_in, const Var<B>& k_in, const Var<B>& v_in,
                                                                const Var<B>& lambda, double scale, bool causal, int64_t pos0,
                                                                const Tensor<B>& key_padding, const Tensor<B>& mask) {
  constexpr auto ac = autocast::Op::attention;  // the table's attention policy (autograd/autocast.hpp)
  const Var<B> q = autocast::cast(ac, q_in), k = autocast::cast(ac, k_in), v = autocast::cast(ac, v_in);
  KILN_CHECK(lambda.defined(), "diff_attention: undefined lambda (q {})", shape_str(q.shape()));
  const Var<B> lam = lambda.dtype() == q.dtype() ? lambda : lambda.to(q.dtype());
  auto [o, o2, lse1, lse2] =
      fused::diff_attention_forward(q.value(), k.value(), v.value(), lam.value(), scale, causal, pos0, key_padding, mask);
  if (!(needs_grad(q) || needs_grad(k) || needs_grad(v) || needs_grad(lam))) return Var<B>(o);
  return record<B>(
      "diff_attention", o, {&q, &k, &v, &lam},
      DiffAttentionBackward<B>{q.value(), k.value(), v.value(), lam.value(), o, o2, lse1, lse2, key_padding, mask, scale, causal, pos0});
}

template <Backend B> Grads<B> DiffAttentionNormBackward<B>::operator()(const Tensor<B>& grad_out) const {
  auto [dq, dk, dv, dlam, dw] =
      fused::diff_attention_norm_backward(q, k, v, lam, w, o, o2, lse1, lse2, rstd, grad_out, c, scale, causal, pos0, key_padding, mask);
  if (w.defined()) return Grads<B>{dq, dk, dv, dlam, dw};
  return Grads<B>{dq, dk, dv, dlam};
}

template <Backend B> Var<B> DiffAttentionOps<B>::diff_attention_norm(const Var<B>& q_in, const Var<B>& k_in, const Var<B>& v_in,
                                                                     const Var<B>& lambda, const Var<B>& weight, double eps, double c,
                                                                     double scale, bool causal, int64_t pos0, const Tensor<B>& key_padding,
                                                                     const Tensor<B>& mask) {
  constexpr auto ac = autocast::Op::attention;
  const Var<B> q = autocast::cast(ac, q_in), k = autocast::cast(ac, k_in), v = autocast::cast(ac, v_in);
  KILN_CHECK(lambda.defined(), "diff_attention_norm: undefined lambda (q {})", shape_str(q.shape()));
  const Var<B> lam = lambda.dtype() == q.dtype() ? lambda : lambda.to(q.dtype());
  const Var<B> w = !weight.defined() || weight.dtype() == q.dtype() ? weight : weight.to(q.dtype());
  const Tensor<B> wv = w.defined() ? w.value() : Tensor<B>();
  auto [y, o, o2, lse1, lse2, rstd] =
      fused::diff_attention_norm_forward(q.value(), k.value(), v.value(), lam.value(), wv, eps, c, scale, causal, pos0, key_padding, mask);
  const bool wg = w.defined() && needs_grad(w);
  if (!(needs_grad(q) || needs_grad(k) || needs_grad(v) || needs_grad(lam) || wg)) return Var<B>(y);
  DiffAttentionNormBackward<B> bw{q.value(), k.value(), v.value(),   lam.value(), wv, o,     o2,     lse1,
                                  lse2,      rstd,      key_padding, mask,        c,  scale, causal, pos0};
  if (w.defined()) return record<B>("diff_attention_norm", y, {&q, &k, &v, &lam, &w}, std::move(bw));
  return record<B>("diff_attention_norm", y, {&q, &k, &v, &lam}, std::move(bw));
}

#define KILN_INST(B)                            \
  template struct DiffAttentionBackward<B>;     \
  template struct DiffAttentionNormBackward<B>; \
  template struct DiffAttentionOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
