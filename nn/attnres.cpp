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

template <Backend B> AttnResStack<B>::AttnResStack(Var<B> embedding, int64_t block_size) : S_(block_size), blocks_{std::move(embedding)} {
  KILN_CHECK(block_size >= 1, "AttnRes: block size must be >= 1 sublayer, got {}", block_size);
}

template <Backend B> void AttnResStack<B>::boundary() {
  if (j_ > 0 && j_ % S_ == 0) {
    blocks_.push_back(partial_);
    partial_ = Var<B>();
  }
}

template <Backend B> void AttnResStack<B>::add(const Var<B>& out) {
  partial_ = partial_.defined() ? partial_ + out : out;
  ++j_;
}

template <Backend B> std::vector<Var<B>> AttnResStack<B>::sources() const {
  std::vector<Var<B>> src = blocks_;
  if (partial_.defined()) src.push_back(partial_);
  return src;
}

#define KILN_INST(B) template class DepthAttention<B>; template class AttnResStack<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
