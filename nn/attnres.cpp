#include "nn/attnres.hpp"

#include "autograd/record.hpp"
#include "core/fused_depth.hpp"

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

// One recorded op on the fused kernel (core/fused_depth.hpp): the backward keeps α and the per-token
// rstd [n, B, T] and the sources themselves, never a stacked or normalised copy.
template <Backend B> Var<B> DepthAttention<B>::forward(const std::vector<Var<B>>& sources) const {
  check_sources(sources);
  std::vector<Tensor<B>> vs;
  vs.reserve(sources.size());
  for (const Var<B>& s : sources) vs.push_back(s.value());
  const Var<B> g = key_norm_->named_parameters().empty() ? Var<B>() : key_norm_->parameter("weight");
  const Tensor<B> wv = w_.value(), gv = g.defined() ? g.value() : Tensor<B>();
  const Tensor<B> q = gv.defined() ? wv.mul(gv) : wv;
  auto [h, alpha, rstd] = fused::depth_attention_forward(vs, q, o_.eps);
  std::vector<const Var<B>*> ins;
  for (const Var<B>& s : sources) ins.push_back(&s);
  ins.push_back(&w_);
  if (g.defined()) ins.push_back(&g);
  return autograd::record<B>("depth_attention", h, ins, [vs, wv, gv, q, alpha = alpha, rstd = rstd](const Tensor<B>& dh) {
    auto [grads, dq] = fused::depth_attention_backward(vs, q, alpha, rstd, dh);
    grads.push_back(gv.defined() ? dq.mul(gv) : dq);  // q = w ⊙ g
    if (gv.defined()) grads.push_back(dq.mul(wv));
    return grads;
  });
}

template <Backend B> Var<B> DepthAttention<B>::forward_decomposed(const std::vector<Var<B>>& sources) const {
  check_sources(sources);
  const Var<B> V = Var<B>::stack(sources, 0);                                 // [n, B, T, D]
  const Var<B> alpha = key_norm_->forward(V).matmul(w_).softmax(0);         // [n, B, T]
  return (alpha.unsqueeze(-1) * V).sum({0});
}

template <Backend B> Tensor<B> DepthAttention<B>::effective_query() const {
  const Var<B> g = key_norm_->named_parameters().empty() ? Var<B>() : key_norm_->parameter("weight");
  return g.defined() ? w_.value().mul(g.value()) : w_.value();
}

template <Backend B>
AttnResStack<B>::AttnResStack(Var<B> embedding, int64_t block_size, std::vector<const DepthAttention<B>*> schedule)
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

namespace {
// v / rms(v) over the last axis (the key norm without its weight).
template <Backend B> Tensor<B> unit_rms(const Tensor<B>& v, double eps) { return v.mul(v.square().mean({-1}, true).add(eps).rsqrt()); }
}  // namespace

// Phase 1: the block's S' queries against the n completed blocks, in one batched product.
template <Backend B> void AttnResStack<B>::phase1() {
  KILN_CHECK(j_ < static_cast<int64_t>(schedule_.size()), "AttnRes: sublayer {} beyond the {} scheduled", j_, schedule_.size());
  block_start_ = j_;
  const int64_t Sq = std::min<int64_t>(S_, static_cast<int64_t>(schedule_.size()) - j_);
  std::vector<Tensor<B>> qs, vs;
  for (int64_t r = 0; r < Sq; ++r) qs.push_back(schedule_[static_cast<size_t>(j_ + r)]->effective_query());
  for (const Var<B>& b : blocks_) vs.push_back(b.value());
  const double eps = schedule_[static_cast<size_t>(j_)]->eps();
  const Tensor<B> V = Tensor<B>::stack(vs, 2);                              // [B, T, n, D]
  const Tensor<B> Q = Tensor<B>::stack(qs, 0);                              // [S', D]
  const Tensor<B> L = unit_rms(V, eps).matmul(Q.t());                       // [B, T, n, S']
  m_ = L.max({2}, true);                                                    // [B, T, 1, S']
  const Tensor<B> E = L.sub(m_).exp();                                      // [B, T, n, S']
  l_ = E.sum({2});                                                          // [B, T, S']
  acc_ = E.transpose(2, 3).matmul(V);                                       // [B, T, S', D]
  m_ = m_.squeeze(2);                                                       // [B, T, S']
}

// Phase 2: merge the running partial (if any) into sublayer j's Phase-1 statistics.
template <Backend B> Tensor<B> AttnResStack<B>::two_phase_read(const DepthAttention<B>& res) const {
  KILN_CHECK(&res == schedule_[static_cast<size_t>(j_)], "AttnRes: sublayer {} is not the depth attention scheduled for it", j_);
  const int64_t r = j_ - block_start_;
  const Tensor<B> m = m_.select(2, r).unsqueeze(-1), l = l_.select(2, r).unsqueeze(-1);  // [B, T, 1]
  const Tensor<B> acc = acc_.select(2, r);                                                 // [B, T, D]
  if (!partial_.defined()) return acc.div(l);
  const Tensor<B> p = partial_.value();
  const Tensor<B> lp = unit_rms(p, res.eps()).matmul(res.effective_query()).unsqueeze(-1);  // [B, T, 1]
  const Tensor<B> mx = m.maximum(lp);
  const Tensor<B> a = m.sub(mx).exp(), b = lp.sub(mx).exp();
  return acc.mul(a).add(p.mul(b)).div(l.mul(a).add(b));
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
