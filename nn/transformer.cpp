#include "kiln/nn/transformer.hpp"

#include "kiln/nn/container.hpp"

#include <string>

namespace kiln::nn {

namespace {

void check_options(const char* op, const TransformerLayerOptions& o) {
  KILN_CHECK(o.d_model > 0 && o.n_heads > 0 && o.dim_feedforward > 0, "{}: d_model {}, n_heads {} and dim_feedforward {} must be > 0", op,
             o.d_model, o.n_heads, o.dim_feedforward);
}

// (Modules are built here and registered by the layer: registration is protected.)
template <Backend B> AnyAttention<B> make_attention(const TransformerLayerOptions& o, bool causal, bool cross) {
  AnyAttention<B> a;
  const bool rope = o.rope && !cross;  // cross-attention: never RoPE
  if (o.attention == AttentionKind::mha)
    a.mha = std::make_shared<MultiHeadAttention<B>>(AttentionOptions{
        .d_model = o.d_model,
        .n_heads = o.n_heads,
        .n_kv_heads = o.n_kv_heads,
        .causal = causal,
        .rope = rope,
        .rope_theta = o.rope_theta,
        .max_seq_len = o.max_seq_len,
        .dtype = o.dtype,
    });
  else
    a.diff = std::make_shared<DifferentialAttention<B>>(DiffAttentionOptions{
        .d_model = o.d_model,
        .n_heads = o.n_heads,
        .n_kv_heads = o.n_kv_heads,
        .depth = o.depth,
        .causal = causal,
        .rope = rope,
        .rope_theta = o.rope_theta,
        .max_seq_len = o.max_seq_len,
        .dtype = o.dtype,
    });
  return a;
}

template <Backend B> AnyNorm<B> make_norm(const TransformerLayerOptions& o) {
  AnyNorm<B> n;
  if (o.norm == NormKind::layer_norm)
    n.ln = std::make_shared<LayerNorm<B>>(LayerNormOptions{.dim = o.d_model, .eps = o.norm_eps, .bias = o.bias, .dtype = o.dtype});
  else
    n.rms = std::make_shared<RMSNorm<B>>(RMSNormOptions{.dim = o.d_model, .eps = o.norm_eps, .dtype = o.dtype});
  return n;
}

template <Backend B> std::shared_ptr<Linear<B>> make_linear(int64_t in, int64_t out, const TransformerLayerOptions& o) {
  return std::make_shared<Linear<B>>(LinearOptions{.in = in, .out = out, .bias = o.bias, .dtype = o.dtype});
}

// A stack's layers, appended to its "layers" list (named 0, 1, ...): layer i gets depth i.
template <class Layer, Backend B>
std::vector<std::shared_ptr<Layer>> stack_layers(const char* who, ModuleList<B>& list, const TransformerStackOptions& o) {
  KILN_CHECK(o.num_layers >= 1, "{}: num_layers must be >= 1, got {}", who, o.num_layers);
  std::vector<std::shared_ptr<Layer>> layers;
  for (int64_t i = 0; i < o.num_layers; ++i) {
    TransformerLayerOptions l = o.layer;
    l.depth = i;
    layers.push_back(list.push_back(std::make_shared<Layer>(l)));
  }
  return layers;
}

// Registers an AnyAttention / AnyNorm under `name` on a module (from inside its constructor).
#define KILN_REG_ANY(name, any, a, b) (any.a ? (void)this->register_module(name, any.a) : (void)this->register_module(name, any.b))

}  // namespace

// ------------------------------------------------------------------------------------------ encoder layer
template <Backend B> TransformerEncoderLayer<B>::TransformerEncoderLayer(TransformerLayerOptions o) : o_(o), act_(o.activation) {
  check_options("TransformerEncoderLayer", o_);
  self_attn_ = make_attention<B>(o_, false, false);
  KILN_REG_ANY("self_attn", self_attn_, mha, diff);
  linear1_ = this->register_module("linear1", make_linear<B>(o_.d_model, o_.dim_feedforward, o_));
  dropout_ = this->register_module("dropout", std::make_shared<Dropout<B>>(o_.dropout));
  linear2_ = this->register_module("linear2", make_linear<B>(o_.dim_feedforward, o_.d_model, o_));
  norm1_ = make_norm<B>(o_);
  KILN_REG_ANY("norm1", norm1_, ln, rms);
  norm2_ = make_norm<B>(o_);
  KILN_REG_ANY("norm2", norm2_, ln, rms);
  dropout1_ = this->register_module("dropout1", std::make_shared<Dropout<B>>(o_.dropout));
  dropout2_ = this->register_module("dropout2", std::make_shared<Dropout<B>>(o_.dropout));
}

template <Backend B>
Var<B> TransformerEncoderLayer<B>::forward(const Var<B>& src, const Tensor<B>& src_key_padding, const Tensor<B>& src_mask) const {
  const AttentionInputs<B> in{.key_padding = src_key_padding, .mask = src_mask};
  auto sa = [&](const Var<B>& x) { return dropout1_->forward(self_attn_(x, in)); };
  auto ff = [&](const Var<B>& x) { return dropout2_->forward(linear2_->forward(dropout_->forward(act_.forward(linear1_->forward(x))))); };
  Var<B> x = src;
  if (o_.norm_first) {
    x = x + sa(norm1_(x));
    return x + ff(norm2_(x));
  }
  x = norm1_(x + sa(x));
  return norm2_(x + ff(x));
}

// ------------------------------------------------------------------------------------------ decoder layer
template <Backend B> TransformerDecoderLayer<B>::TransformerDecoderLayer(TransformerLayerOptions o) : o_(o), act_(o.activation) {
  check_options("TransformerDecoderLayer", o_);
  self_attn_ = make_attention<B>(o_, true, false);
  KILN_REG_ANY("self_attn", self_attn_, mha, diff);
  cross_attn_ = make_attention<B>(o_, false, true);
  KILN_REG_ANY("multihead_attn", cross_attn_, mha, diff);
  linear1_ = this->register_module("linear1", make_linear<B>(o_.d_model, o_.dim_feedforward, o_));
  dropout_ = this->register_module("dropout", std::make_shared<Dropout<B>>(o_.dropout));
  linear2_ = this->register_module("linear2", make_linear<B>(o_.dim_feedforward, o_.d_model, o_));
  norm1_ = make_norm<B>(o_);
  KILN_REG_ANY("norm1", norm1_, ln, rms);
  norm2_ = make_norm<B>(o_);
  KILN_REG_ANY("norm2", norm2_, ln, rms);
  norm3_ = make_norm<B>(o_);
  KILN_REG_ANY("norm3", norm3_, ln, rms);
  dropout1_ = this->register_module("dropout1", std::make_shared<Dropout<B>>(o_.dropout));
  dropout2_ = this->register_module("dropout2", std::make_shared<Dropout<B>>(o_.dropout));
  dropout3_ = this->register_module("dropout3", std::make_shared<Dropout<B>>(o_.dropout));
}

template <Backend B> Var<B> TransformerDecoderLayer<B>::forward(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in) const {
  if (!in.cache) return forward(tgt, memory, in, nullptr, nullptr);
  if (in.cache->self.empty()) in.cache->self.resize(1);
  if (in.cache->cross.empty()) in.cache->cross.resize(1);
  return forward(tgt, memory, in, &in.cache->self[0], &in.cache->cross[0]);
}

template <Backend B> Var<B> TransformerDecoderLayer<B>::forward(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in,
                                                                KVCache<B>* self_cache, KVCache<B>* cross_cache) const {
  KILN_CHECK(memory.defined(), "TransformerDecoderLayer: needs the encoder's memory [B, S, {}] (tgt {})", o_.d_model,
             shape_str(tgt.shape()));
  const AttentionInputs<B> self_in{.key_padding = in.tgt_key_padding, .mask = in.tgt_mask, .cache = self_cache};
  const AttentionInputs<B> cross_in{.memory = memory, .key_padding = in.memory_key_padding, .mask = in.memory_mask, .cache = cross_cache};
  auto sa = [&](const Var<B>& x) { return dropout1_->forward(self_attn_(x, self_in)); };
  auto ca = [&](const Var<B>& x) { return dropout2_->forward(cross_attn_(x, cross_in)); };
  auto ff = [&](const Var<B>& x) { return dropout3_->forward(linear2_->forward(dropout_->forward(act_.forward(linear1_->forward(x))))); };
  Var<B> x = tgt;
  if (o_.norm_first) {
    x = x + sa(norm1_(x));
    x = x + ca(norm2_(x));
    return x + ff(norm3_(x));
  }
  x = norm1_(x + sa(x));
  x = norm2_(x + ca(x));
  return norm3_(x + ff(x));
}

// ------------------------------------------------------------------------------------------ stacks
template <Backend B> TransformerEncoder<B>::TransformerEncoder(TransformerStackOptions o) : o_(o) {
  auto list = this->register_module("layers", std::make_shared<ModuleList<B>>());
  layers_ = stack_layers<TransformerEncoderLayer<B>>("TransformerEncoder", *list, o_);
  if (o_.final_norm) {
    norm_ = make_norm<B>(o_.layer);
    KILN_REG_ANY("norm", norm_, ln, rms);
  }
}

template <Backend B>
Var<B> TransformerEncoder<B>::forward(const Var<B>& src, const Tensor<B>& src_key_padding, const Tensor<B>& src_mask) const {
  Var<B> x = src;
  for (const auto& l : layers_) x = l->forward(x, src_key_padding, src_mask);
  return o_.final_norm ? norm_(x) : x;
}

template <Backend B> TransformerDecoder<B>::TransformerDecoder(TransformerStackOptions o) : o_(o) {
  auto list = this->register_module("layers", std::make_shared<ModuleList<B>>());
  layers_ = stack_layers<TransformerDecoderLayer<B>>("TransformerDecoder", *list, o_);
  if (o_.final_norm) {
    norm_ = make_norm<B>(o_.layer);
    KILN_REG_ANY("norm", norm_, ln, rms);
  }
}

template <Backend B> Var<B> TransformerDecoder<B>::forward(const Var<B>& tgt, const Var<B>& memory, const DecoderInputs<B>& in) const {
  const size_t n = layers_.size();
  if (in.cache) {
    KILN_CHECK((in.cache->self.empty() || in.cache->self.size() == n) && (in.cache->cross.empty() || in.cache->cross.size() == n),
               "TransformerDecoder: the cache holds {} / {} layers, the decoder has {} (reset() it)", in.cache->self.size(),
               in.cache->cross.size(), n);
    in.cache->self.resize(n);
    in.cache->cross.resize(n);
  }
  Var<B> x = tgt;
  for (size_t i = 0; i < n; ++i)
    x = layers_[i]->forward(x, memory, in, in.cache ? &in.cache->self[i] : nullptr, in.cache ? &in.cache->cross[i] : nullptr);
  return o_.final_norm ? norm_(x) : x;
}

#undef KILN_REG_ANY

#define KILN_INST(B)                         \
  template class TransformerEncoderLayer<B>; \
  template class TransformerDecoderLayer<B>; \
  template class TransformerEncoder<B>;      \
  template class TransformerDecoder<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
