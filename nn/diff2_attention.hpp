#pragma once
// Differential attention V2 (Differential Transformer V2, microsoft/unilm
// Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py), exactly docs/specs.md §1b.
// # Shapes
//   x [B, T, D] -> [B, T, D]; h output heads, 2h query heads, h_kv kv heads (2h a multiple of h_kv),
//   head width hd (default D / h)
//   q_proj D -> 2h·hd, k_proj D -> h_kv·hd, v_proj D -> h_kv·hd, o_proj h·hd -> D,
//   lambda_proj D -> h (no biases anywhere)
// The 2h query heads attend as one GQA attention (query head i uses kv head ⌊i / (2h/h_kv)⌋, width hd,
// scale 1/√hd, interleaved RoPE over hd): a = softmax(q kᵀ/√hd + causal) v  [B, 2h, T, hd]. Output
// head j pairs query heads 2j and 2j+1 (interleaved, not halves) with a λ per token and head:
//   λ = W_λ x [B, T, h];  o_j = a_{2j} − σ(λ_j) · a_{2j+1};  y = o_proj(concat_j o_j)
// No head-wise norm, no λ_init, no (1 − λ_init) factor. Parameters vs MultiHeadAttention with the same
// h and hd: one more D·h·hd in q_proj and D·h in lambda_proj (3D² + 2D·h_kv·hd + D·h in all when
// h·hd = D, MHA's 2D² + 2D·h_kv·hd).
// Beyond the official module (which is causal self-attention only), as MultiHeadAttention: a KV cache
// for generation, options.causal = false, cross-attention to a memory (q and λ from x, k and v from the
// memory), key_padding [B, S], and a mask broadcastable to [B, h, T, S] (h = output heads: both query
// heads of a pair see the same mask; a mask with h > 1 head rows is repeated to the 2h query heads).
// RoPE applies to self-attention only (rope = true with a memory throws).
#include <memory>

#include "kiln/nn/attention.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct Diff2AttentionOptions {
  int64_t d_model = 0;
  int64_t n_heads = 0;     // output heads h (the attention runs on 2h query heads)
  int64_t n_kv_heads = 0;  // 0: = n_heads; must divide 2·n_heads
  int64_t head_dim = 0;    // 0: d_model / n_heads
  bool causal = true;      // false: bidirectional (an encoder's self-attention, cross-attention)
  bool rope = true;        // self-attention only
  double rope_theta = 10000.0;
  int64_t max_seq_len = 256;  // RoPE positions and KV-cache capacity (self-attention)
  DType dtype = DType::f32;
};

// The pairing of the 2h query heads' attention outputs, differentiable in both (core/fused_diff2.hpp):
// a [B, 2h, T, hd], lambda_logits [B, T, h] -> [B, T, h, hd] = a[:, 0::2] − σ(λ) · a[:, 1::2] with the
// heads moved behind the tokens. One recorded op; its node keeps a (the attention node's output, not a
// copy) and the λ logits.
template <Backend B> KILN_API Var<B> diff2_combine(const Var<B>& a, const Var<B>& lambda_logits);

template <Backend B> class DifferentialAttentionV2 : public Module<B> {
 public:
  explicit DifferentialAttentionV2(Diff2AttentionOptions o);
  // cache: when given, x holds the positions after the cached ones (generation; use under NoGrad).
  Var<B> forward(const Var<B>& x, KVCache<B>* cache = nullptr) const;
  Var<B> operator()(const Var<B>& x, KVCache<B>* cache = nullptr) const { return forward(x, cache); }
  // Self- or cross-attention with masks (AttentionInputs, nn/attention.hpp).
  Var<B> forward(const Var<B>& x, const AttentionInputs<B>& in) const;
  Var<B> operator()(const Var<B>& x, const AttentionInputs<B>& in) const { return forward(x, in); }
  const Diff2AttentionOptions& options() const { return o_; }

 private:
  Diff2AttentionOptions o_;
  std::shared_ptr<Linear<B>> q_, k_, v_, o_proj_, lambda_;
  std::shared_ptr<RopeTable<B>> rope_ = std::make_shared<RopeTable<B>>();
};

#define KILN_EXTERN(B) extern template class DifferentialAttentionV2<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
