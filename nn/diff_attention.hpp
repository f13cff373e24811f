#pragma once
// Differential attention (Differential Transformer V1, arXiv 2410.05258), exactly docs/specs.md §1.
// # Shapes
//   x [B, T, D] -> [B, T, D]; h heads, h_kv kv groups, sub-head width d = D / h / 2
//   q_proj D -> h·2d, k_proj D -> h_kv·2d, v_proj D -> h_kv·2d, out_proj h·2d -> D (no biases)
//   lambda_q1, lambda_k1, lambda_q2, lambda_k2 [d]; subln.weight [2d] (if diff_subln_affine)
// Q and K in stripes: within head i's 2d columns the first d are branch 1, the next d branch 2.
// Head i uses kv group ⌊i/(h/h_kv)⌋ for both branches. λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init,
// λ_init = 0.8 − 0.6·exp(−0.3·depth), trained through (never detached).
//   O_i = (A1 − λ·A2) V_g = FA(Q1,K1,V) − λ·FA(Q2,K2,V);  O_i ← RMSNorm(O_i)·(1 − λ_init);  y = out_proj(O)
// Beyond causal self-attention (AttentionInputs, nn/attention.hpp): options.causal = false makes it
// bidirectional; a memory [B, S, D] makes it cross-attention (Q from x, K and V from the memory, same
// projections and the same formulas); key_padding [B, S] and the attention mask (bool or additive,
// broadcastable to [B, h, T, S], h = differential heads) apply to both softmax maps A1 and A2 alike.
// RoPE applies to self-attention only (rope = true with a memory throws).
#include <memory>

#include "kiln/nn/attention.hpp"
#include "kiln/nn/norm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

double diff_lambda_init(int64_t depth);

// The two softmax maps of differential heads over one V, as one fused op (core/fused_diff_attention.hpp;
// on Cpu one kernel for both branches, forward and backward):
//   q [B, H, 2, T, d], k [B, Hkv, 2, S, d] (axis 2: branch 1, branch 2), v [B, Hkv, S, dv], lambda one
//   element  ->  softmax(q1 k1ᵀ/√d + mask) v − λ·softmax(q2 k2ᵀ/√d + mask) v   [B, H, T, dv]
// causal, pos0, key_padding and mask as nn::attention (nn/attention.hpp), applied to both maps alike.
// Differentiable in q, k, v and lambda.
template <Backend B> KILN_API Var<B> diff_attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, const Var<B>& lambda, bool causal,
                                                    int64_t pos0, const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {});

// diff_attention followed by DifferentialAttention's head-wise norm and output scale, as one fused op
// (core/fused_diff_attention.hpp's diff_attention_norm_forward: on Cpu the norm runs in the kernel's
// epilogue and its backward in the kernel's row pass):
//   O = diff_attention(q, k, v, lambda, ...);  Y = O / √(mean(O²) + eps) · weight · out_scale  per row
// of O (its dv channels), weight [dv] or undefined (1). Y [B, H, T, dv]; on Cpu its memory is a
// [B, T, H, dv] block, so Y.transpose(1, 2).reshape({B, T, H·dv}) is a view. Differentiable in q, k,
// v, lambda and weight.
template <Backend B> KILN_API Var<B> diff_attention_norm(const Var<B>& q, const Var<B>& k, const Var<B>& v, const Var<B>& lambda,
                                                         const Var<B>& weight, double eps, double out_scale, bool causal, int64_t pos0,
                                                         const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {});

struct DiffAttentionOptions {
  int64_t d_model = 0;
  int64_t n_heads = 0;     // differential heads
  int64_t n_kv_heads = 0;  // 0: = n_heads
  int64_t depth = 0;       // 0-based layer index (sets λ_init)
  bool causal = true;      // false: bidirectional (an encoder's self-attention, cross-attention)
  bool rope = true;        // self-attention only
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool subln_affine = false;
  bool subln = true;          // false only for tests of the paper's identities
  double lambda_init = -1.0;  // < 0: from depth (the paper); >= 0: this value (tests)
  int64_t max_seq_len = 256;
  DType dtype = DType::f32;
};

template <Backend B> class DifferentialAttention : public Module<B> {
 public:
  explicit DifferentialAttention(DiffAttentionOptions o);
  // key_padding: optional bool [B, S] (true = a real token, false = padding never attended to).
  Var<B> forward(const Var<B>& x, KVCache<B>* cache = nullptr, const Tensor<B>& key_padding = {}) const;
  Var<B> operator()(const Var<B>& x, KVCache<B>* cache = nullptr) const { return forward(x, cache); }
  // Self- or cross-attention with masks (AttentionInputs, nn/attention.hpp).
  Var<B> forward(const Var<B>& x, const AttentionInputs<B>& in) const;
  Var<B> operator()(const Var<B>& x, const AttentionInputs<B>& in) const { return forward(x, in); }
  Var<B> lambda() const;  // the scalar λ, differentiable
  double lambda_init() const { return lambda_init_; }
  const DiffAttentionOptions& options() const { return o_; }

 private:
  DiffAttentionOptions o_;
  int64_t d_;
  double lambda_init_;
  Var<B> lq1_, lk1_, lq2_, lk2_;
  std::shared_ptr<Linear<B>> q_, k_, v_, out_;
  std::shared_ptr<RMSNorm<B>> subln_;
  std::shared_ptr<RopeTable<B>> rope_ = std::make_shared<RopeTable<B>>();
};

#define KILN_EXTERN(B) extern template class DifferentialAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
