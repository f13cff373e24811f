#include "kiln/nn/gpt.hpp"

#include <algorithm>
#include <cmath>

#include "kiln/autograd/checkpoint.hpp"
#include "kiln/nn/init.hpp"

namespace kiln::nn {

namespace {
// A module holding a list of submodules named 0, 1, ... (PyTorch's ModuleList), for the "layers.{i}" names.
template <Backend B> class ModuleList : public Module<B> {
 public:
  template <class M> std::shared_ptr<M> push(std::shared_ptr<M> m) { return this->register_module(std::to_string(n_++), std::move(m)); }

 private:
  int64_t n_ = 0;
};
}  // namespace

template <Backend B> GPTLayer<B>::GPTLayer(const ModelConfig& c, int64_t depth) {
  const DType dt = DType::f32;
  auto norm = [&] { return std::make_shared<RMSNorm<B>>(RMSNormOptions{.dim = c.d_model, .eps = c.norm_eps, .dtype = dt}); };
  attn_norm_ = this->register_module("attn_norm", norm());
  if (c.attention == "diff") {
    diff_ = this->register_module("attn", std::make_shared<DifferentialAttention<B>>(DiffAttentionOptions{
                                              .d_model = c.d_model,
                                              .n_heads = c.n_heads,
                                              .n_kv_heads = c.n_kv_heads,
                                              .depth = depth,
                                              .rope = c.rope,
                                              .rope_theta = c.rope_theta,
                                              .norm_eps = c.norm_eps,
                                              .subln_affine = c.diff_subln_affine,
                                              .max_seq_len = c.max_seq_len,
                                              .dtype = dt,
                                          }));
  } else if (c.attention == "diff2") {
    diff2_ = this->register_module("attn", std::make_shared<DifferentialAttentionV2<B>>(Diff2AttentionOptions{
                                               .d_model = c.d_model,
                                               .n_heads = c.n_heads,
                                               .n_kv_heads = c.n_kv_heads,
                                               .rope = c.rope,
                                               .rope_theta = c.rope_theta,
                                               .max_seq_len = c.max_seq_len,
                                               .dtype = dt,
                                           }));
  } else {
    mha_ = this->register_module("attn", std::make_shared<MultiHeadAttention<B>>(AttentionOptions{
                                             .d_model = c.d_model,
                                             .n_heads = c.n_heads,
                                             .n_kv_heads = c.n_kv_heads,
                                             .rope = c.rope,
                                             .rope_theta = c.rope_theta,
                                             .max_seq_len = c.max_seq_len,
                                             .dtype = dt,
                                         }));
  }
  mlp_norm_ = this->register_module("mlp_norm", norm());
  mlp_ = this->register_module("mlp", std::make_shared<SwiGLU<B>>(SwiGLUOptions{.dim = c.d_model, .hidden = c.ffn_hidden, .dtype = dt}));
  if (c.residual != "standard") {
    const DepthAttentionOptions r{.d_model = c.d_model, .eps = c.norm_eps, .key_norm_affine = c.attnres_key_norm_affine, .dtype = dt};
    attn_res_ = this->register_module("attn_res", std::make_shared<DepthAttention<B>>(r));
    mlp_res_ = this->register_module("mlp_res", std::make_shared<DepthAttention<B>>(r));
  }
}

template <Backend B> Var<B> GPTLayer<B>::attn_sublayer(const Var<B>& h, KVCache<B>* cache, const RowInputs<B>& rows) const {
  const Var<B> n = attn_norm_->forward(h);
  const AttentionInputs<B> in{.mask = rows.mask, .positions = rows.positions, .cache = cache};
  if (diff2_) return diff2_->forward(n, in);
  return diff_ ? diff_->forward(n, in) : mha_->forward(n, in);
}
template <Backend B> Var<B> GPTLayer<B>::mlp_sublayer(const Var<B>& h) const { return mlp_->forward(mlp_norm_->forward(h)); }

template <Backend B> GPT<B>::GPT(const ModelConfig& config, DType dtype) : c_(config.resolved()) {
  tok_emb_ = this->register_module("tok_emb", std::make_shared<Embedding<B>>(EmbeddingOptions{.num = c_.vocab_size, .dim = c_.d_model}));
  auto list = this->register_module("layers", std::make_shared<ModuleList<B>>());
  for (int64_t i = 0; i < c_.n_layers; ++i) layers_.push_back(list->push(std::make_shared<GPTLayer<B>>(c_, i)));
  if (c_.residual != "standard")
    final_res_ =
        this->register_module("final_res", std::make_shared<DepthAttention<B>>(DepthAttentionOptions{
                                               .d_model = c_.d_model, .eps = c_.norm_eps, .key_norm_affine = c_.attnres_key_norm_affine}));
  norm_ = this->register_module("norm", std::make_shared<RMSNorm<B>>(RMSNormOptions{.dim = c_.d_model, .eps = c_.norm_eps}));
  if (!c_.tie_embeddings)
    lm_head_ =
        this->register_module("lm_head", std::make_shared<Linear<B>>(LinearOptions{.in = c_.d_model, .out = c_.vocab_size, .bias = false}));
  init_weights(0);
  if (dtype != DType::f32) this->to(dtype);
}

template <Backend B> void GPT<B>::init_weights(uint64_t seed) {
  Generator g(seed);
  for (auto& [name, p] : this->named_parameters()) {
    const bool query = name.size() >= 5 && name.compare(name.size() - 5, 5, "query") == 0;
    if (query)
      init::zeros_(p);
    else if (name.find(".lambda_") != std::string::npos)
      init::normal_(p, 0.0, 0.1, &g);
    else if (p.dim() >= 2)
      init::normal_(p, 0.0, 0.02, &g);
    else
      init::ones_(p);
  }
}

template <Backend B> Var<B> GPT<B>::run(const Tensor<B>& ids, std::vector<KVCache<B>>* caches, const RowInputs<B>& rows, bool head) const {
  KILN_CHECK(ids.dim() == 2, "GPT: ids must be [B, T], got {}", shape_str(ids.shape()));
  const int64_t pos0 = caches && !caches->empty() ? (*caches)[0].len : 0;
  KILN_CHECK(pos0 + ids.size(1) <= c_.max_seq_len, "GPT: sequence length {} exceeds max_seq_len {}", pos0 + ids.size(1), c_.max_seq_len);
  if (caches && caches->size() != layers_.size()) caches->assign(layers_.size(), KVCache<B>{});
  Var<B> x = tok_emb_->forward(ids);
  auto cache_of = [&](size_t i) { return caches ? &(*caches)[i] : nullptr; };
  // Activation checkpointing: the segments capture their layer by value (they run again in backward).
  const bool ckpt = checkpointing_ && !caches && grad_enabled();
  if (c_.residual == "standard") {
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (ckpt) {
        x = kiln::checkpoint<B>(
            [layer = layers_[i]](const Var<B>& h) {
              const Var<B> y = h + layer->attn_sublayer(h, nullptr);
              return y + layer->mlp_sublayer(y);
            },
            x);
        continue;
      }
      x = x + layers_[i]->attn_sublayer(x, cache_of(i), rows);
      x = x + layers_[i]->mlp_sublayer(x);
    }
  } else if (ckpt) {
    AttnResStack<B> stack(x, c_.residual == "attnres_full" ? 1 : c_.attnres_block_size);
    for (const auto& layer : layers_) {  // one segment per sublayer: its depth attention and its function
      stack.checkpointed_step(
          [layer](const std::vector<Var<B>>& src) { return layer->attn_sublayer(layer->attn_res().forward(src), nullptr); });
      stack.checkpointed_step([layer](const std::vector<Var<B>>& src) { return layer->mlp_sublayer(layer->mlp_res().forward(src)); });
    }
    x = stack.finish(*final_res_);
  } else {
    std::vector<const DepthAttention<B>*> schedule;
    if (two_phase_ && !grad_enabled())
      for (const auto& l : layers_) schedule.insert(schedule.end(), {&l->attn_res(), &l->mlp_res()});
    AttnResStack<B> stack(x, c_.residual == "attnres_full" ? 1 : c_.attnres_block_size, std::move(schedule));
    for (size_t i = 0; i < layers_.size(); ++i) {
      stack.step(layers_[i]->attn_res(), [&](const Var<B>& h) { return layers_[i]->attn_sublayer(h, cache_of(i), rows); });
      stack.step(layers_[i]->mlp_res(), [&](const Var<B>& h) { return layers_[i]->mlp_sublayer(h); });
    }
    x = stack.finish(*final_res_);
  }
  x = norm_->forward(x);
  if (!head) return x;
  if (c_.tie_embeddings) return x.matmul(tok_emb_->weight().t());
  return lm_head_->forward(x);
}

template <Backend B> Var<B> GPT<B>::hidden(const Tensor<B>& ids) const { return run(ids, nullptr, {}, false); }
template <Backend B> Var<B> GPT<B>::head_weight() const { return c_.tie_embeddings ? tok_emb_->weight() : lm_head_->weight(); }

template <Backend B> Var<B> GPT<B>::loss(const Tensor<B>& ids, const Tensor<B>& targets, LinearCrossEntropyOptions o) const {
  if (!c_.tie_embeddings && lm_head_->adapter())
    return cross_entropy(forward(ids), targets, {.ignore_index = o.ignore_index, .label_smoothing = o.label_smoothing});
  return linear_cross_entropy(hidden(ids), head_weight(), targets, o);
}

template <Backend B> Var<B> GPT<B>::forward(const Tensor<B>& ids) const { return run(ids, nullptr); }
template <Backend B> Var<B> GPT<B>::forward(const Tensor<B>& ids, std::vector<KVCache<B>>& caches) const { return run(ids, &caches); }
template <Backend B> Var<B> GPT<B>::forward(const Tensor<B>& ids, std::vector<KVCache<B>>& caches, const RowInputs<B>& rows) const {
  return run(ids, &caches, rows);
}

template <Backend B> std::vector<int64_t> GPT<B>::generate(const std::vector<int64_t>& prompt, const SampleOptions& o) const {
  KILN_CHECK(!prompt.empty(), "generate: the prompt is empty");
  KILN_CHECK(o.temperature >= 0, "generate: temperature must be >= 0, got {}", o.temperature);
  for (int64_t t : prompt)
    KILN_CHECK(t >= 0 && t < c_.vocab_size, "generate: prompt token {} outside the vocabulary [0, {})", t, c_.vocab_size);
  KILN_CHECK(o.vocab_limit >= 0, "generate: vocab_limit must be >= 0, got {}", o.vocab_limit);
  NoGrad ng;
  Generator g(o.seed);
  std::vector<int64_t> all = prompt, out;
  std::vector<KVCache<B>> caches;
  auto prefill = [&](int64_t keep) {
    for (auto& c : caches) c.reset();
    const std::vector<int64_t> ctx(all.end() - std::min<int64_t>(keep, static_cast<int64_t>(all.size())), all.end());
    return run(Tensor<B>::from_vector(ctx, {1, static_cast<int64_t>(ctx.size())}), &caches);
  };
  Var<B> logits = prefill(c_.max_seq_len);
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    std::vector<float> l = to_vector<float>(logits.value().select(1, -1).reshape({-1}));
    if (o.vocab_limit > 0 && o.vocab_limit < static_cast<int64_t>(l.size())) l.resize(static_cast<size_t>(o.vocab_limit));
    int64_t next = 0;
    if (o.temperature == 0) {
      next = std::max_element(l.begin(), l.end()) - l.begin();
    } else {
      std::vector<float> sorted = l;
      float cut = -INFINITY;
      if (o.top_k > 0 && o.top_k < static_cast<int64_t>(l.size())) {
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
        cut = sorted[static_cast<size_t>(o.top_k - 1)];
      }
      const float mx = *std::max_element(l.begin(), l.end());
      std::vector<double> p(l.size());
      double total = 0;
      for (size_t i = 0; i < l.size(); ++i) {
        p[i] = l[i] < cut ? 0.0 : std::exp((static_cast<double>(l[i]) - mx) / o.temperature);
        total += p[i];
      }
      const double u = philox_uniform_at(g.seed(), g.advance(1), 0) * total;
      double acc = 0;
      next = static_cast<int64_t>(l.size()) - 1;
      for (size_t i = 0; i < p.size(); ++i) {
        acc += p[i];
        if (u < acc) {
          next = static_cast<int64_t>(i);
          break;
        }
      }
    }
    all.push_back(next);
    out.push_back(next);
    if (n + 1 == o.max_new_tokens) break;
    if (caches[0].len + 1 > c_.max_seq_len)
      logits = prefill(std::max<int64_t>(1, c_.max_seq_len / 2));
    else
      logits = run(Tensor<B>::from_vector(std::vector<int64_t>{next}, {1, 1}), &caches);
  }
  return out;
}

GPTFlops gpt_flops(const ModelConfig& config, int64_t T) {
  KILN_CHECK(T >= 1, "gpt_flops: T must be >= 1, got {}", T);
  const ModelConfig c = config.resolved();
  const double D = static_cast<double>(c.d_model), t = static_cast<double>(T), L = static_cast<double>(c.n_layers);
  const double head = D / static_cast<double>(c.n_heads), kv = static_cast<double>(c.n_kv_heads) * head;  // k and v widths
  double per_layer = D * D + 2 * D * kv + D * D + 3 * D * static_cast<double>(c.ffn_hidden);
  if (c.attention == "diff2") per_layer += D * D + D * static_cast<double>(c.n_heads);  // q_proj's second half, lambda_proj
  GPTFlops f;
  f.dense = 6 * t * (L * per_layer + D * static_cast<double>(c.vocab_size));
  const double pairs = t * (t + 1) / 2;
  // Σ_branches d_qk + d_v per (output) head: diff2's 2 query heads of width head each
  const double qk_v = c.attention == "diff" ? 2 * (head / 2 + head) : c.attention == "diff2" ? 2 * (head + head) : head + head;
  f.attention = 3 * L * static_cast<double>(c.n_heads) * 2 * qk_v * pairs;
  if (c.residual != "standard") {
    const int64_t S = c.residual == "attnres_full" ? 1 : c.attnres_block_size, J = 2 * c.n_layers;
    int64_t sources = 2 + (J - 1) / S;  // final_res: the completed blocks and the last partial
    for (int64_t j = 0; j < J; ++j) sources += 1 + j / S + (j % S != 0 ? 1 : 0);
    f.depth = 3 * 4 * D * t * static_cast<double>(sources);
  }
  return f;
}

#define KILN_INST(B)          \
  template class GPTLayer<B>; \
  template class GPT<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
