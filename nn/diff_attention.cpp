#include "kiln/nn/diff_attention.hpp"

#include <cmath>

#include "kiln/autograd/ops.hpp"
#include "kiln/nn/init.hpp"

namespace kiln::nn {

double diff_lambda_init(int64_t depth) { return 0.8 - 0.6 * std::exp(-0.3 * static_cast<double>(depth)); }

template <Backend B> Var<B> diff_attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, const Var<B>& lambda, bool causal,
                                           int64_t pos0, const Tensor<B>& key_padding, const Tensor<B>& mask) {
  KILN_CHECK(q.dim() == 5, "diff_attention: q {} must be [B, H, 2, T, d]", shape_str(q.shape()));
  return autograd::DiffAttentionOps<B>::diff_attention(q, k, v, lambda, 1.0 / std::sqrt(static_cast<double>(q.size(4))), causal, pos0,
                                                       key_padding, mask);
}

template <Backend B> Var<B> diff_attention_norm(const Var<B>& q, const Var<B>& k, const Var<B>& v, const Var<B>& lambda,
                                                const Var<B>& weight, double eps, double out_scale, bool causal, int64_t pos0,
                                                const Tensor<B>& key_padding, const Tensor<B>& mask) {
  KILN_CHECK(q.dim() == 5, "diff_attention_norm: q {} must be [B, H, 2, T, d]", shape_str(q.shape()));
  return autograd::DiffAttentionOps<B>::diff_attention_norm(
      q, k, v, lambda, weight, eps, out_scale, 1.0 / std::sqrt(static_cast<double>(q.size(4))), causal, pos0, key_padding, mask);
}

template <Backend B> DifferentialAttention<B>::DifferentialAttention(DiffAttentionOptions o) : o_(o) {
  if (o_.n_kv_heads == 0) o_.n_kv_heads = o_.n_heads;
  KILN_CHECK(o_.n_heads >= 1 && o_.d_model % (2 * o_.n_heads) == 0, "DifferentialAttention: d_model {} must be divisible by 2·n_heads = {}",
             o_.d_model, 2 * o_.n_heads);
  KILN_CHECK(o_.n_kv_heads >= 1 && o_.n_heads % o_.n_kv_heads == 0, "DifferentialAttention: n_heads {} must be a multiple of n_kv_heads {}",
             o_.n_heads, o_.n_kv_heads);
  KILN_CHECK(o_.depth >= 0, "DifferentialAttention: depth must be >= 0, got {}", o_.depth);
  d_ = o_.d_model / o_.n_heads / 2;
  KILN_CHECK(!o_.rope || d_ % 2 == 0, "DifferentialAttention: RoPE needs an even sub-head width, got d = D/h/2 = {}", d_);
  lambda_init_ = o_.lambda_init >= 0 ? o_.lambda_init : diff_lambda_init(o_.depth);
  // Registration order is the reference's named_parameters() order: own λ vectors, then submodules.
  lq1_ = this->register_parameter("lambda_q1", Tensor<B>::zeros({d_}, o_.dtype));
  lk1_ = this->register_parameter("lambda_k1", Tensor<B>::zeros({d_}, o_.dtype));
  lq2_ = this->register_parameter("lambda_q2", Tensor<B>::zeros({d_}, o_.dtype));
  lk2_ = this->register_parameter("lambda_k2", Tensor<B>::zeros({d_}, o_.dtype));
  for (Var<B>* l : {&lq1_, &lk1_, &lq2_, &lk2_}) init::normal_(*l, 0.0, 0.1);
  const int64_t D = o_.d_model, h = o_.n_heads, hkv = o_.n_kv_heads;
  auto lin = [&](int64_t in, int64_t out) {
    return std::make_shared<Linear<B>>(LinearOptions{.in = in, .out = out, .bias = false, .dtype = o_.dtype});
  };
  q_ = this->register_module("q_proj", lin(D, h * 2 * d_));
  k_ = this->register_module("k_proj", lin(D, hkv * 2 * d_));
  v_ = this->register_module("v_proj", lin(D, hkv * 2 * d_));
  out_ = this->register_module("out_proj", lin(h * 2 * d_, D));
  if (o_.subln)
    subln_ = this->register_module("subln", std::make_shared<RMSNorm<B>>(RMSNormOptions{
                                                .dim = 2 * d_, .eps = o_.norm_eps, .affine = o_.subln_affine, .dtype = o_.dtype}));
}

template <Backend B> Var<B> DifferentialAttention<B>::lambda() const {
  return (lq1_ * lk1_).sum().exp() - (lq2_ * lk2_).sum().exp() + lambda_init_;
}

template <Backend B> Var<B> DifferentialAttention<B>::forward(const Var<B>& x, KVCache<B>* cache, const Tensor<B>& key_padding) const {
  return forward(x, AttentionInputs<B>{.key_padding = key_padding, .cache = cache});
}

template <Backend B> Var<B> DifferentialAttention<B>::forward(const Var<B>& x, const AttentionInputs<B>& in) const {
  const int64_t pos0 = detail::attention_inputs_check("DifferentialAttention", x, in, o_.d_model, o_.rope, o_.causal, o_.max_seq_len);
  const int64_t Bn = x.size(0), T = x.size(1), h = o_.n_heads, hkv = o_.n_kv_heads, d = d_;
  const bool cross = in.memory.defined();
  // Stripes: [B, T, heads, 2, d] -> [B, heads, 2, T, d]; branch b of head i is [:, i, b].
  Var<B> q = q_->forward(x).view({Bn, T, h, 2, d}).permute({0, 2, 3, 1, 4});
  if (o_.rope) q = rope_at(q, pos0, in.positions, o_.rope_theta, rope_.get());  // each d-wide sub-head rotates on its own
  Var<B> k, v;
  if (cross && in.cache && in.cache->len > 0) {  // the memory's keys and values, projected by an earlier call
    const int64_t S = in.cache->len;
    k = Var<B>(in.cache->k.narrow(2, 0, S).view({Bn, hkv, 2, S, d}));
    v = Var<B>(in.cache->v.narrow(2, 0, S));
  } else {
    const Var<B>& src = cross ? in.memory : x;
    const int64_t S = src.size(1);
    k = k_->forward(src).view({Bn, S, hkv, 2, d}).permute({0, 2, 3, 1, 4});  // [B, hkv, 2, S, d]
    v = v_->forward(src).view({Bn, S, hkv, 2 * d}).transpose(1, 2);          // [B, hkv, S, 2d]
    if (o_.rope) k = rope_at(k, pos0, in.positions, o_.rope_theta, rope_.get());
    if (in.cache) {                         // the cache holds K as [B, 2·hkv, S, d] (branches interleaved per group) and V
      if (cross) *in.cache = KVCache<B>{};  // sized for this memory
      auto [kc, vc] = kv_cache_append(*in.cache, k.value().reshape({Bn, 2 * hkv, S, d}), v.value(), cross ? S : o_.max_seq_len);
      const int64_t Sc = kc.size(2);
      k = Var<B>(kc.view({Bn, hkv, 2, Sc, d}));
      v = Var<B>(vc);
    }
  }
  // FA(Q1, K1, V) − λ·FA(Q2, K2, V) [B, h, T, 2d]: both branches in one fused op, with the head-wise
  // norm and the (1 − λ_init) scale in its epilogue (its output a [B, T, h, 2d] block on Cpu, so the
  // head merge below is a view)
  Var<B> o;
  if (o_.subln)
    o = diff_attention_norm(q, k, v, lambda(), o_.subln_affine ? subln_->parameter("weight") : Var<B>(), o_.norm_eps, 1.0 - lambda_init_,
                            o_.causal, pos0, in.key_padding, in.mask);
  else
    o = diff_attention(q, k, v, lambda(), o_.causal, pos0, in.key_padding, in.mask).mul(1.0 - lambda_init_);
  return out_->forward(o.transpose(1, 2).reshape({Bn, T, h * 2 * d}));
}

#define KILN_INST(B)                                                                                                                   \
  template class DifferentialAttention<B>;                                                                                             \
  template Var<B> diff_attention(const Var<B>&, const Var<B>&, const Var<B>&, const Var<B>&, bool, int64_t, const Tensor<B>&,          \
                                 const Tensor<B>&);                                                                                    \
  template Var<B> diff_attention_norm(const Var<B>&, const Var<B>&, const Var<B>&, const Var<B>&, const Var<B>&, double, double, bool, \
                                      int64_t, const Tensor<B>&, const Tensor<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
