#include "nn/attnres.hpp"

namespace kiln::nn {

template <Backend B> DepthAttention<B>::DepthAttention(DepthAttentionOptions o) : o_(o) {
  KILN_CHECK(o.d_model >= 1, "DepthAttention: d_model must be >= 1, got {}", o.d_model);
  w_ = this->register_parameter("query", Tensor<B>::zeros({o.d_model}, o.dtype));
  key_norm_ = this->register_module("key_norm", std::make_shared<RMSNorm<B>>(RMSNormOptions{
                                                    .dim = o.d_model, .eps = o.eps, .affine = o.key_norm_affine, .dtype = o.dtype}));
}

template <Backend B> Var<B> DepthAttention<B>::logits(const std::vector<Var<B>>& sources) const {
  KILN_CHECK(!sources.empty(), "DepthAttention: no sources");
  for (size_t i = 0; i < sources.size(); ++i)
    KILN_CHECK(sources[i].shape() == sources[0].shape() && sources[i].shape().back() == o_.d_model,
               "DepthAttention: source {} has shape {}, source 0 {} (last dim must be d_model {})", i, shape_str(sources[i].shape()),
               shape_str(sources[0].shape()), o_.d_model);
  return key_norm_->forward(Var<B>::stack(sources, 0)).matmul(w_);  // [n, B, T, D] -> [n, B, T]
}

template <Backend B> Var<B> DepthAttention<B>::forward(const std::vector<Var<B>>& sources) const {
  (void)logits({sources.front()});  // validates the first source's width
  for (size_t i = 1; i < sources.size(); ++i)
    KILN_CHECK(sources[i].shape() == sources[0].shape(), "DepthAttention: source {} has shape {}, source 0 {}", i,
               shape_str(sources[i].shape()), shape_str(sources[0].shape()));
  const Var<B> V = Var<B>::stack(sources, 0);                                 // [n, B, T, D]
  const Var<B> alpha = key_norm_->forward(V).matmul(w_).softmax(0);         // [n, B, T]
  return (alpha.unsqueeze(-1) * V).sum({0});
}

#define KILN_INST(B) template class DepthAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
