#include "kiln/nn/attnres.hpp"

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/core/fused_depth.hpp"

namespace kiln::nn {

template <Backend B> DepthAttention<B>::DepthAttention(DepthAttentionOptions o) : o_(o) {
  KILN_CHECK(o.d_model >= 1, "DepthAttention: d_model must be >= 1, got {}", o.d_model);
  w_ = this->register_parameter("query", Tensor<B>::zeros({o.d_model}, o.dtype));
  key_norm_ = this->register_module("key_norm", std::make_shared<RMSNorm<B>>(RMSNormOptions{
                                                    .dim = o.d_model, .eps = o.eps, .affine = o.key_norm_affine, .dtype = o.dtype}));
}

template <Backend B> Var<B> DepthAttention<B>::logits(const std::vector<Var<B>>& sources) const {
  check_sources(sources);
  return key_norm_->forward(Var<B>::stack(sources, 0)).matmul(w_);  // [n, B, T, D] -> [n, B, T]
}

template <Backend B> void DepthAttention<B>::check_sources(const std::vector<Var<B>>& sources) const {
  KILN_CHECK(!sources.empty(), "DepthAttention: no sources");
  for (size_t i = 0; i < sources.size(); ++i)
    KILN_CHECK(sources[i].shape() == sources[0].shape() && sources[i].shape().back() == o_.d_model,
               "DepthAttention: source {} has shape {}, source 0 {} (last dim must be d_model {})", i, shape_str(sources[i].shape()),
               shape_str(sources[0].shape()), o_.d_model);
}

// One recorded op on the fused kernel (autograd/ops/depth_attention.cpp).
template <Backend B> Var<B> DepthAttention<B>::forward(const std::vector<Var<B>>& sources) const {
  check_sources(sources);
  return autograd::DepthAttentionOps<B>::depth_attention(sources, w_, key_norm_weight(), o_.eps);
}

template <Backend B> Var<B> DepthAttention<B>::forward_decomposed(const std::vector<Var<B>>& sources) const {
  check_sources(sources);
  const Var<B> V = Var<B>::stack(sources, 0);                        // [n, B, T, D]
  const Var<B> alpha = key_norm_->forward(V).matmul(w_).softmax(0);  // [n, B, T]
  return (alpha.unsqueeze(-1) * V).sum({0});
}

template <Backend B> Var<B> DepthAttention<B>::key_norm_weight() const {
  return key_norm_->named_parameters().empty() ? Var<B>() : key_norm_->parameter("weight");
}

template <Backend B> Tensor<B> DepthAttention<B>::effective_query() const {
  const Var<B> g = key_norm_weight();
  return g.defined() ? w_.value().mul(g.value()) : w_.value();
}

template <Backend B> AttnResStack<B>::AttnResStack(Var<B> embedding, int64_t block_size, std::vector<const DepthAttention<B>*> schedule)
    : S_(block_size), blocks_{std::move(embedding)}, schedule_(std::move(schedule)) {
  KILN_CHECK(block_size >= 1, "AttnRes: block size must be >= 1 sublayer, got {}", block_size);
  KILN_CHECK(schedule_.empty() || !grad_enabled(), "AttnRes: two-phase inference runs under NoGrad (it is not differentiable)");
}

template <Backend B> void AttnResStack<B>::boundary() {
  if (j_ > 0 && j_ % S_ == 0) {
    blocks_.push_back(partial_);
    partial_ = Var<B>();
  }
  if (!schedule_.empty() && j_ % S_ == 0) phase1();
}

// Phase 1: the block's S' queries against the n completed blocks, in one pass over the blocks
// (fused::depth_attention_phase1).
template <Backend B> void AttnResStack<B>::phase1() {
  KILN_CHECK(j_ < static_cast<int64_t>(schedule_.size()), "AttnRes: sublayer {} beyond the {} scheduled", j_, schedule_.size());
  block_start_ = j_;
  const int64_t Sq = std::min<int64_t>(S_, static_cast<int64_t>(schedule_.size()) - j_);
  std::vector<Tensor<B>> qs, vs;
  for (int64_t r = 0; r < Sq; ++r) qs.push_back(schedule_[static_cast<size_t>(j_ + r)]->effective_query());
  for (const Var<B>& b : blocks_) vs.push_back(b.value());
  Q_ = Tensor<B>::stack(qs, 0);  // the merges of this block reuse their rows
  std::tie(m_, l_, acc_) = fused::depth_attention_phase1(vs, Q_, schedule_[static_cast<size_t>(j_)]->eps());
}

// Phase 2: merge the running partial (if any) into sublayer j's Phase-1 statistics.
template <Backend B> Tensor<B> AttnResStack<B>::two_phase_read(const DepthAttention<B>& res) const {
  KILN_CHECK(&res == schedule_[static_cast<size_t>(j_)], "AttnRes: sublayer {} is not the depth attention scheduled for it", j_);
  const int64_t r = j_ - block_start_;
  const Tensor<B> p = partial_.defined() ? partial_.value() : Tensor<B>();
  const Tensor<B> h = fused::depth_attention_merge(m_.select(0, r), l_.select(0, r), acc_.select(0, r), p, Q_.select(0, r), res.eps());
  return h.to(blocks_.front().dtype());
}

template <Backend B> void AttnResStack<B>::add(const Var<B>& out) {
  // Under autocast a sublayer's output may be low precision; the blocks (the residual stream) stay f32.
  const Var<B> o = autocast::cast(autocast::Op::residual_stream, out);
  partial_ = partial_.defined() ? partial_ + o : o;
  ++j_;
}

template <Backend B> std::vector<Var<B>> AttnResStack<B>::sources() const {
  std::vector<Var<B>> src = blocks_;
  if (partial_.defined()) src.push_back(partial_);
  return src;
}

#define KILN_INST(B)                \
  template class DepthAttention<B>; \
  template class AttnResStack<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
