#pragma once
// The GPT model family of docs/specs.md §3: pre-RMSNorm decoder, SwiGLU MLP, causal attention ("mha",
// "diff" or "diff2") with optional RoPE and GQA, no biases, optionally tied embeddings; residuals "standard"
// (x = x + f(x)) or Attention Residuals ("attnres_full": every sublayer reads a depth attention over
// all earlier outputs; "attnres_block": over completed blocks of S sublayers plus the running partial).
// # Shapes
//   ids [B, T] (i32/i64, T ≤ max_seq_len) -> logits [B, T, vocab_size]
// Parameter names are the reference's (tok_emb.weight, layers.{i}.attn.q_proj.weight, ..., lm_head.weight),
// registered in the reference's order, so state dicts and safetensors files interchange with it.
#include <memory>
#include <vector>

#include "kiln/nn/attention.hpp"
#include "kiln/nn/attnres.hpp"
#include "kiln/nn/config.hpp"
#include "kiln/nn/diff2_attention.hpp"
#include "kiln/nn/diff_attention.hpp"
#include "kiln/nn/embedding.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/nn/norm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// One decoder layer: attn_norm, attn (MHA, differential or differential V2), mlp_norm, mlp — two sublayers — and,
// with Attention Residuals, attn_res and mlp_res (the depth attention in front of each sublayer).
template <Backend B> class GPTLayer : public Module<B> {
 public:
  GPTLayer(const ModelConfig& c, int64_t depth);
  // The two sublayer functions f(h): attention(attn_norm(h)) and mlp(mlp_norm(h)).
  // rows: each row's positions and padding mask (a left-padded batch in generation; nn::RowInputs).
  Var<B> attn_sublayer(const Var<B>& h, KVCache<B>* cache, const RowInputs<B>& rows = {}) const;
  Var<B> mlp_sublayer(const Var<B>& h) const;
  const DepthAttention<B>& attn_res() const { return *attn_res_; }
  const DepthAttention<B>& mlp_res() const { return *mlp_res_; }

 private:
  std::shared_ptr<RMSNorm<B>> attn_norm_, mlp_norm_;
  std::shared_ptr<MultiHeadAttention<B>> mha_;
  std::shared_ptr<DifferentialAttention<B>> diff_;
  std::shared_ptr<DifferentialAttentionV2<B>> diff2_;
  std::shared_ptr<SwiGLU<B>> mlp_;
  std::shared_ptr<DepthAttention<B>> attn_res_, mlp_res_;
};

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  uint64_t seed = 0;
  // > 0: sample only ids below this (a tokenizer with fewer tokens than the model's vocabulary, e.g. a
  // character-level alphabet smaller than vocab_size); 0: every id.
  int64_t vocab_limit = 0;
};

template <Backend B> class GPT : public Module<B> {
 public:
  explicit GPT(const ModelConfig& c, DType dtype = DType::f32);
  const ModelConfig& config() const { return c_; }

  Var<B> forward(const Tensor<B>& ids) const;
  Var<B> operator()(const Tensor<B>& ids) const { return forward(ids); }
  // With per-layer KV caches (generation): ids are the positions after the cached ones.
  Var<B> forward(const Tensor<B>& ids, std::vector<KVCache<B>>& caches) const;
  // A left-padded batch (batched generation, nn/generate.hpp): each row's positions and a mask that
  // hides the padding (nn::RowInputs; the caches' length counts the padding).
  Var<B> forward(const Tensor<B>& ids, std::vector<KVCache<B>>& caches, const RowInputs<B>& rows) const;

  // The final norm's output [B, T, d_model]: the forward without the LM head.
  Var<B> hidden(const Tensor<B>& ids) const;
  // The LM head's matrix [vocab_size, d_model] (the token embedding's when tie_embeddings).
  Var<B> head_weight() const;
  // The mean next-token cross-entropy of forward(ids) against targets [B, T] (cross_entropy's
  // ignore_index and label_smoothing), through nn::linear_cross_entropy: the [B·T, vocab] logits are
  // never kept whole. With an adapter on lm_head (LoRA) the head is more than its matrix, and the loss
  // goes through forward and cross_entropy.
  Var<B> loss(const Tensor<B>& ids, const Tensor<B>& targets, LinearCrossEntropyOptions o = {}) const;

  // docs/specs.md §3 init: matrices and embeddings N(0, 0.02²), norm weights 1, λ vectors N(0, 0.1²),
  // AttnRes queries 0, drawn from a Philox generator seeded with `seed` in named_parameters() order.
  void init_weights(uint64_t seed);

  // Samples a continuation of `prompt` with the KV cache (under NoGrad). When the context would exceed
  // max_seq_len, it re-reads the last max_seq_len/2 tokens and goes on.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, const SampleOptions& o) const;

  // AttnRes models under NoGrad use two-phase inference (nn/attnres.hpp) unless this is turned off.
  void set_two_phase(bool on) { two_phase_ = on; }

  // Activation checkpointing (autograd/checkpoint.hpp, docs/memory.md): when on, a forward that
  // records (grad mode on, no KV cache) keeps no activations inside the decoder layers; backward
  // recomputes them, layer by layer. Standard residual: one segment per layer (x -> x + attn, + mlp);
  // AttnRes: one per sublayer function f(h) (norm and attention, norm and MLP), the depth attentions
  // and the block state stay outside. The gradients are the same as without it.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

 private:
  Var<B> run(const Tensor<B>& ids, std::vector<KVCache<B>>* caches, const RowInputs<B>& rows = {}, bool head = true) const;
  ModelConfig c_;
  bool two_phase_ = true;
  bool checkpointing_ = false;
  std::shared_ptr<Embedding<B>> tok_emb_;
  std::vector<std::shared_ptr<GPTLayer<B>>> layers_;
  std::shared_ptr<DepthAttention<B>> final_res_;
  std::shared_ptr<RMSNorm<B>> norm_;
  std::shared_ptr<Linear<B>> lm_head_;
};

// The model FLOPs of one training step (forward + backward) on one sequence of T tokens: the work a
// model of this configuration needs, whatever the implementation does. Multiply-add = 2 FLOPs.
//   dense:     6 · T · (matmul parameters): q/k/v/out, gate/up/down and the LM head (the tied
//              embedding matrix when tie_embeddings; the embedding lookup itself is no matmul);
//              forward 2 per parameter and token, backward 4 (input gradient and weight gradient).
//   attention: 3 · Σ_heads Σ_branches 2 · (d_qk + d_v) · T(T+1)/2 per layer: Q·Kᵀ and P·V on the causal
//              triangle only (the T(T+1)/2 query-key pairs a causal kernel must compute, not T²);
//              backward twice the forward. mha: 1 branch, d_qk = d_v = D/h; diff: 2 branches of
//              d_qk = D/2h, d_v = D/h, so 1.5 times mha's; diff2: 2 query heads per output head, each
//              d_qk = d_v = D/h, so twice mha's (and its dense part counts q_proj's 2D·D and lambda_proj).
//   depth:     AttnRes: 3 · 4 · D · T per source of each depth attention (the logit dot product and
//              the weighted sum; the key RMSNorm and softmax are not counted, as norms are nowhere).
// Norms, softmax, RoPE, SwiGLU's gating and the loss are not counted (the usual MFU convention).
struct GPTFlops {
  double dense = 0, attention = 0, depth = 0;
  double total() const { return dense + attention + depth; }
};
GPTFlops gpt_flops(const ModelConfig& config, int64_t T);

#define KILN_EXTERN(B)               \
  extern template class GPTLayer<B>; \
  extern template class GPT<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
