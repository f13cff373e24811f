#include "kiln/nn/diff2_attention.hpp"

#include "kiln/autograd/layer_ops.hpp"

namespace kiln::nn {

template <Backend B> Var<B> diff2_combine(const Var<B>& a, const Var<B>& lambda_logits) {
  return autograd::Diff2Ops<B>::combine(a, lambda_logits);  // one recorded op (autograd/ops/diff2.cpp)
}

template <Backend B> DifferentialAttentionV2<B>::DifferentialAttentionV2(Diff2AttentionOptions o) : o_(o) {
  const char* op = "DifferentialAttentionV2";
  if (o_.n_kv_heads == 0) o_.n_kv_heads = o_.n_heads;
  KILN_CHECK(o_.d_model >= 1 && o_.n_heads >= 1, "{}: d_model {} and n_heads {} must be >= 1", op, o_.d_model, o_.n_heads);
  if (o_.head_dim == 0) {
    KILN_CHECK(o_.d_model % o_.n_heads == 0, "{}: d_model {} must be divisible by n_heads {} (or give head_dim)", op, o_.d_model,
               o_.n_heads);
    o_.head_dim = o_.d_model / o_.n_heads;
  }
  KILN_CHECK(o_.head_dim >= 1, "{}: head_dim must be >= 1, got {}", op, o_.head_dim);
  KILN_CHECK(o_.n_kv_heads >= 1 && (2 * o_.n_heads) % o_.n_kv_heads == 0,
             "{}: the 2·n_heads = {} query heads must be a multiple of n_kv_heads {}", op, 2 * o_.n_heads, o_.n_kv_heads);
  KILN_CHECK(!o_.rope || o_.head_dim % 2 == 0, "{}: RoPE needs an even head width, got head_dim = {}", op, o_.head_dim);
  const int64_t D = o_.d_model, h = o_.n_heads, hkv = o_.n_kv_heads, hd = o_.head_dim;
  auto lin = [&](int64_t in, int64_t out) {
    return std::make_shared<Linear<B>>(LinearOptions{.in = in, .out = out, .bias = false, .dtype = o_.dtype});
  };
  // The official module's names and order: q_proj, k_proj, v_proj, o_proj, lambda_proj.
  q_ = this->register_module("q_proj", lin(D, 2 * h * hd));
  k_ = this->register_module("k_proj", lin(D, hkv * hd));
  v_ = this->register_module("v_proj", lin(D, hkv * hd));
  o_proj_ = this->register_module("o_proj", lin(h * hd, D));
  lambda_ = this->register_module("lambda_proj", lin(D, h));
}

template <Backend B> Var<B> DifferentialAttentionV2<B>::forward(const Var<B>& x, KVCache<B>* cache) const {
  return forward(x, AttentionInputs<B>{.cache = cache});
}

template <Backend B> Var<B> DifferentialAttentionV2<B>::forward(const Var<B>& x, const AttentionInputs<B>& in) const {
  const char* op = "DifferentialAttentionV2";
  const int64_t pos0 = detail::attention_inputs_check(op, x, in, o_.d_model, o_.rope, o_.causal, o_.max_seq_len);
  const int64_t Bn = x.size(0), T = x.size(1), h = o_.n_heads, hkv = o_.n_kv_heads, hd = o_.head_dim;
  Var<B> q = q_->forward(x).view({Bn, T, 2 * h, hd}).transpose(1, 2);  // [B, 2h, T, hd]
  if (o_.rope) q = rope_at(q, pos0, in.positions, o_.rope_theta, rope_.get());
  const auto [k, v] = detail::attention_kv(x, in, *k_, *v_, hkv, hd, o_.rope, o_.rope_theta, rope_.get(), pos0, o_.max_seq_len);
  // A mask is given per output head ([.., h, T, S] or broadcast over heads); both query heads of a pair
  // see their output head's rows.
  Tensor<B> mask = in.mask;
  if (mask.defined() && mask.dim() == 4 && mask.size(1) != 1) {
    KILN_CHECK(mask.size(1) == h, "{}: mask {} must broadcast to [B, h, T, S] with h = {} output heads", op, shape_str(mask.shape()), h);
    mask = mask.unsqueeze(2)
               .expand({mask.size(0), h, 2, mask.size(2), mask.size(3)})
               .reshape({mask.size(0), 2 * h, mask.size(2), mask.size(3)});
  }
  const Var<B> a = attention(q, k, v, o_.causal, pos0, in.key_padding, mask);  // [B, 2h, T, hd]
  const Var<B> y = diff2_combine(a, lambda_->forward(x));                      // [B, T, h, hd]
  return o_proj_->forward(y.reshape({Bn, T, h * hd}));
}

#define KILN_INST(B)                                              \
  template Var<B> diff2_combine<B>(const Var<B>&, const Var<B>&); \
  template class DifferentialAttentionV2<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
