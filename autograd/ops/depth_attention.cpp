// Depth attention (autograd/layer_ops.hpp; Attention Residuals, docs/specs.md §2) on the fused kernel
// (core/fused_depth.hpp, whose header has the forward and backward formulas). One recorded op: the
// backward keeps α and the per-token rstd [n, B, T] and the sources themselves, never a stacked or
// normalised copy. The query is q = w ⊙ g, so dw = dq ⊙ g and dg = dq ⊙ w.
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_depth.hpp"

namespace kiln::autograd {

template <Backend B>
Var<B> DepthAttentionOps<B>::depth_attention(const std::vector<Var<B>>& sources, const Var<B>& w, const Var<B>& g, double eps) {
  std::vector<Tensor<B>> vs;
  vs.reserve(sources.size());
  for (const Var<B>& s : sources) vs.push_back(s.value());
  const Tensor<B> wv = w.value(), gv = g.defined() ? g.value() : Tensor<B>();
  const Tensor<B> q = gv.defined() ? wv.mul(gv) : wv;
  auto [h, alpha, rstd] = fused::depth_attention_forward(vs, q, eps);
  std::vector<const Var<B>*> ins;
  for (const Var<B>& s : sources) ins.push_back(&s);
  ins.push_back(&w);
  if (g.defined()) ins.push_back(&g);
  return record<B>("depth_attention", h, ins, [vs, wv, gv, q, alpha = alpha, rstd = rstd](const Tensor<B>& dh) {
    auto [grads, dq] = fused::depth_attention_backward(vs, q, alpha, rstd, dh);
    grads.push_back(gv.defined() ? dq.mul(gv) : dq);  // q = w ⊙ g
    if (gv.defined()) grads.push_back(dq.mul(wv));
    return grads;
  });
}

#define KILN_INST(B) template struct DepthAttentionOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
