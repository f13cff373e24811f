#pragma once
// Transformer encoder and decoder layers (PyTorch's nn.TransformerEncoderLayer / DecoderLayer, batch
// first) and their stacks (nn.TransformerEncoder / Decoder), with multi-head or differential attention.
// # Shapes
//   encoder layer: src [B, S, D] -> [B, S, D]
//   decoder layer: tgt [B, T, D], memory [B, S, D] -> [B, T, D]
//   src_key_padding bool [B, S], tgt_key_padding bool [B, T], memory_key_padding bool [B, S]:
//     true = a real token, false = padding (the inverse of PyTorch's *_key_padding_mask);
//   src_mask, tgt_mask [.., T|S, T|S] and memory_mask [.., T, S]: bool (true = may attend) or additive,
//     broadcastable to [B, H, query length, key length] (nn/attention.hpp).
// Names: self_attn, multihead_attn (decoder: cross-attention), linear1 D -> dim_feedforward, linear2
// back to D, norm1, norm2 (, norm3); the stacks: layers.0, layers.1, ..., norm (final_norm).
//
// Encoder (norm_first = false, post-norm, PyTorch's default):
//   x = norm1(x + dropout1(self_attn(x)));  x = norm2(x + dropout2(ff(x)))
// norm_first = true (pre-norm):
//   x = x + dropout1(self_attn(norm1(x)));  x = x + dropout2(ff(norm2(x)))
// ff(x) = linear2(dropout(activation(linear1(x)))). The decoder adds, between the two, the
// cross-attention block x (+)= dropout2(multihead_attn(x, memory)) with norm2, and its ff block uses
// norm3 and dropout3. The encoder's self-attention is bidirectional; the decoder's is causal (query i
// sees keys j <= i), its cross-attention sees every memory key.
//
// Differences from PyTorch, on purpose: the attention projections have no biases (MultiHeadAttention,
// DifferentialAttention: set torch's in_proj_bias and out_proj.bias to zero to compare), and dropout
// is not applied to the attention probabilities (the fused attention kernel has none; PyTorch's
// MultiheadAttention dropout); it is applied to every sublayer output and inside ff as in PyTorch.
//
// Generation: DecoderCache keeps, per layer, the self-attention's keys and values (one new position
// per step) and the cross-attention's memory keys and values (projected once per sequence, on the
// first step). Use it under NoGrad; reset() for a new batch of sequences.
#include <memory>
#include <vector>

#include "kiln/nn/attention.hpp"
#include "kiln/nn/diff_attention.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/nn/norm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

enum class AttentionKind { mha, diff };        // MultiHeadAttention or DifferentialAttention
enum class NormKind { layer_norm, rms_norm };  // LayerNorm or RMSNorm

struct TransformerLayerOptions {
  int64_t d_model = 0;
  int64_t n_heads = 0;     // nhead (diff: differential heads, d_model / n_heads / 2 wide sub-heads)
  int64_t n_kv_heads = 0;  // 0: = n_heads (grouped-query attention otherwise)
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  Activation activation = Activation::relu;
  bool norm_first = false;
  NormKind norm = NormKind::layer_norm;
  double norm_eps = 1e-5;  // layer_norm_eps
  bool bias = true;        // biases of linear1, linear2 and the LayerNorms (the attention has none)
  AttentionKind attention = AttentionKind::mha;
  int64_t depth = 0;  // the layer's index (diff: sets λ_init = 0.8 − 0.6·exp(−0.3·depth))
  bool rope = false;  // RoPE in the self-attention (never in cross-attention)
  double rope_theta = 10000.0;
  int64_t max_seq_len = 256;  // with rope or a DecoderCache: positions of the self-attention
  DType dtype = DType::f32;
};

// One attention module of either kind, registered under its parent's name for it.
template <Backend B> struct AnyAttention {
  std::shared_ptr<MultiHeadAttention<B>> mha;
  std::shared_ptr<DifferentialAttention<B>> diff;
  Var<B> operator()(const Var<B>& x, const AttentionInputs<B>& in) const { return mha ? mha->forward(x, in) : diff->forward(x, in); }
};
// One norm of either kind.
template <Backend B> struct AnyNorm {
  std::shared_ptr<LayerNorm<B>> ln;
  std::shared_ptr<RMSNorm<B>> rms;
  Var<B> operator()(const Var<B>& x) const { return ln ? ln->forward(x) : rms->forward(x); }
};

template <Backend B> class TransformerEncoderLayer : public Module<B> {
 public:
  explicit TransformerEncoderLayer(TransformerLayerOptions o);
  Var<B> forward(const Var<B>& src, const Tensor<B>& src_key_padding = {}, const Tensor<B>& src_mask = {}) const;
  Var<B> operator()(const Var<B>& src, const Tensor<B>& src_key_padding = {}, const Tensor<B>& src_mask = {}) const {
    return forward(src, src_key_padding, src_mask);
  }
  const TransformerLayerOptions& options() const { return o_; }

 private:
  TransformerLayerOptions o_;
  AnyAttention<B> self_attn_;
  std::shared_ptr<Linear<B>> linear1_, linear2_;
  AnyNorm<B> norm1_, norm2_;
  std::shared_ptr<Dropout<B>> dropout_, dropout1_, dropout2_;
  Act<B> act_;
};

// Keys and values of a decoder's layers for generation (see the top of the file).
template <Backend B> struct DecoderCache {
  std::vector<KVCache<B>> self, cross;  // one per layer
  void reset() {
    self.clear();
    cross.clear();
  }
};

template <Backend B> struct DecoderInputs {
  Tensor<B> tgt_key_padding{};     // bool [B, T] (with a cache: [B, cached + T])
  Tensor<B> tgt_mask{};            // on top of the causal mask
  Tensor<B> memory_key_padding{};  // bool [B, S]
  Tensor<B> memory_mask{};
  DecoderCache<B>* cache = nullptr;  // tgt holds the positions after the cached ones
};

template <Backend B> class TransformerDecoderLayer : public Module<B> {
 public:
  explicit TransformerDecoderLayer(TransformerLayerOptions o);
  Var<B> forward(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in = {}) const;
  Var<B> operator()(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in = {}) const { return forward(tgt, memory, in); }
  // The same with this layer's caches given directly (in.cache is ignored): what a stack calls.
  Var<B> forward(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in, KVCache<B>* self_cache,
                 KVCache<B>* cross_cache) const;
  const TransformerLayerOptions& options() const { return o_; }

 private:
  TransformerLayerOptions o_;
  AnyAttention<B> self_attn_, cross_attn_;
  std::shared_ptr<Linear<B>> linear1_, linear2_;
  AnyNorm<B> norm1_, norm2_, norm3_;
  std::shared_ptr<Dropout<B>> dropout_, dropout1_, dropout2_, dropout3_;
  Act<B> act_;
};

struct TransformerStackOptions {
  TransformerLayerOptions layer;  // layer i gets depth = i
  int64_t num_layers = 1;
  bool final_norm = false;  // a last norm ("norm"), as PyTorch's norm= argument (use with norm_first)
};

template <Backend B> class TransformerEncoder : public Module<B> {
 public:
  explicit TransformerEncoder(TransformerStackOptions o);
  Var<B> forward(const Var<B>& src, const Tensor<B>& src_key_padding = {}, const Tensor<B>& src_mask = {}) const;
  Var<B> operator()(const Var<B>& src, const Tensor<B>& src_key_padding = {}, const Tensor<B>& src_mask = {}) const {
    return forward(src, src_key_padding, src_mask);
  }
  const std::vector<std::shared_ptr<TransformerEncoderLayer<B>>>& layers() const { return layers_; }

 private:
  TransformerStackOptions o_;
  std::vector<std::shared_ptr<TransformerEncoderLayer<B>>> layers_;
  AnyNorm<B> norm_;
};

template <Backend B> class TransformerDecoder : public Module<B> {
 public:
  explicit TransformerDecoder(TransformerStackOptions o);
  Var<B> forward(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in = {}) const;
  Var<B> operator()(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in = {}) const { return forward(tgt, memory, in); }
  const std::vector<std::shared_ptr<TransformerDecoderLayer<B>>>& layers() const { return layers_; }

 private:
  TransformerStackOptions o_;
  std::vector<std::shared_ptr<TransformerDecoderLayer<B>>> layers_;
  AnyNorm<B> norm_;
};

#define KILN_EXTERN(B)                              \
  extern template class TransformerEncoderLayer<B>; \
  extern template class TransformerDecoderLayer<B>; \
  extern template class TransformerEncoder<B>;      \
  extern template class TransformerDecoder<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
