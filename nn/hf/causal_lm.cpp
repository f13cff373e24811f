#include "kiln/nn/hf/causal_lm.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/checkpoint.hpp"
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/nn/hf/architecture.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/layers.hpp"

namespace kiln::hf {

namespace {

// A plain holder of submodules, so parameter names read "layers.0.attn.q_proj.weight".
template <Backend B> class Group : public nn::Module<B> {
 public:
  template <class M> std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) { return this->register_module(name, m); }
};

// The Spec's RMSNorm over `dim` values (Gemma's scale by 1 + weight).
template <Backend B> std::shared_ptr<nn::RMSNorm<B>> spec_rms_norm(const Spec& s, int64_t dim, DType dt) {
  return std::make_shared<nn::RMSNorm<B>>(nn::RMSNormOptions{.dim = dim, .eps = s.norm_eps, .dtype = dt, .offset = s.norm_offset});
}

}  // namespace

// One pre-norm decoder layer: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)); with post_norms (Gemma
// 2/3) x + attn_post_norm(attn(attn_norm(x))), then x + mlp_post_norm(mlp(mlp_norm(x))).
template <Backend B> class DecoderLayer : public nn::Module<B> {
 public:
  DecoderLayer(const Spec& s, DType dt, bool sliding) : s_(s), sliding_(sliding) {
    auto norm = [&](const char* name, std::shared_ptr<nn::RMSNorm<B>>& rms, std::shared_ptr<nn::LayerNorm<B>>& ln) {
      if (s.norm == NormKind::rms)
        rms = this->register_module(name, spec_rms_norm<B>(s, s.hidden, dt));
      else
        ln = this->register_module(
            name, std::make_shared<nn::LayerNorm<B>>(nn::LayerNormOptions{.dim = s.hidden, .eps = s.norm_eps, .dtype = dt}));
    };
    auto lin = [&](Group<B>& g, const char* name, int64_t in, int64_t out, bool bias) {
      return g.add(name, std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = in, .out = out, .bias = bias, .dtype = dt}));
    };
    norm("attn_norm", attn_rms_, attn_ln_);
    auto attn = this->register_module("attn", std::make_shared<Group<B>>());
    q_ = lin(*attn, "q_proj", s.hidden, s.heads * s.head_dim, s.qkv_bias);
    k_ = lin(*attn, "k_proj", s.hidden, s.kv_heads * s.head_dim, s.qkv_bias);
    v_ = lin(*attn, "v_proj", s.hidden, s.kv_heads * s.head_dim, s.qkv_bias);
    o_ = lin(*attn, "o_proj", s.heads * s.head_dim, s.hidden, s.o_bias);
    if (s.qk_norm) {
      q_norm_ = attn->add("q_norm", spec_rms_norm<B>(s, s.head_dim, dt));
      k_norm_ = attn->add("k_norm", spec_rms_norm<B>(s, s.head_dim, dt));
    }
    if (s.post_norms) {
      KILN_CHECK(s.norm == NormKind::rms, "hf::CausalLM({}): post_norms are RMSNorms", s.architecture);
      attn_post_ = this->register_module("attn_post_norm", spec_rms_norm<B>(s, s.hidden, dt));
    }
    norm("mlp_norm", mlp_rms_, mlp_ln_);
    if (s.post_norms) mlp_post_ = this->register_module("mlp_post_norm", spec_rms_norm<B>(s, s.hidden, dt));
    auto mlp = this->register_module("mlp", std::make_shared<Group<B>>());
    if (s.mlp == MlpKind::gated) {
      gate_ = lin(*mlp, "gate_proj", s.hidden, s.intermediate, s.mlp_bias);
      up_ = lin(*mlp, "up_proj", s.hidden, s.intermediate, s.mlp_bias);
      down_ = lin(*mlp, "down_proj", s.intermediate, s.hidden, s.mlp_bias);
    } else {
      up_ = lin(*mlp, "fc", s.hidden, s.intermediate, s.mlp_bias);
      down_ = lin(*mlp, "proj", s.intermediate, s.hidden, s.mlp_bias);
    }
  }

  bool sliding() const { return sliding_; }  // a sliding-window layer (Spec::sliding_layers)

  Var<B> activation(const Var<B>& u) const {
    switch (s_.act) {
      case Act::gelu_tanh:
        return u.gelu(true);
      case Act::gelu:
        return u.gelu(false);
      case Act::relu:
        return u.relu();
      case Act::silu:
        return u.silu();
    }
    fail("hf::CausalLM({}): unknown activation", s_.architecture);
  }

  // x [B, T, D]; cos/sin [T, hd/2] (RoPE) or undefined; rows: cos/sin are [B·T, hd/2], each row's own
  // positions (nn::rope_rows); mask: bool, broadcastable to [B, H, T, S], or undefined; cache: the
  // positions before x's.
  Var<B> forward(const Var<B>& x, int64_t pos0, const Tensor<B>& cos, const Tensor<B>& sin, bool rows, const Tensor<B>& mask,
                 nn::KVCache<B>* cache, int64_t capacity) const {
    const int64_t Bn = x.size(0), T = x.size(1), H = s_.heads, Hkv = s_.kv_heads, hd = s_.head_dim;
    const Var<B> h = attn_rms_ ? attn_rms_->forward(x) : attn_ln_->forward(x);
    Var<B> q = q_->forward(h).reshape({Bn, T, H, hd});
    Var<B> k = k_->forward(h).reshape({Bn, T, Hkv, hd});
    if (q_norm_) {  // over each head's hd values
      q = q_norm_->forward(q);
      k = k_norm_->forward(k);
    }
    q = q.transpose(1, 2);  // [B, H, T, hd]
    k = k.transpose(1, 2);
    Var<B> v = v_->forward(h).reshape({Bn, T, Hkv, hd}).transpose(1, 2);
    if (cos.defined() && rows) {  // per-row positions (a left-padded batch)
      q = nn::rope_rows(q, cos, sin);
      k = nn::rope_rows(k, cos, sin);
    } else if (cos.defined()) {  // the model's own tables (any frequencies), recorded: a loaded model can be fine-tuned
      q = autograd::RopeOps<B>::rope(q, cos, sin);
      k = autograd::RopeOps<B>::rope(k, cos, sin);
    }
    if (cache) {
      auto [kc, vc] = nn::kv_cache_append(*cache, k.value(), v.value(), capacity);
      k = Var<B>(kc);
      v = Var<B>(vc);
    }
    // The kernels scale by hd^-1/2; attn_scalar^-1/2 (Gemma's query_pre_attn_scalar) goes into q.
    if (s_.attn_scalar > 0 && s_.attn_scalar != static_cast<double>(hd)) q = q.mul(std::sqrt(static_cast<double>(hd) / s_.attn_scalar));
    const Var<B> y = nn::attention(q, k, v, /*causal=*/true, pos0, {}, mask, s_.attn_softcap);  // [B, H, T, hd]
    Var<B> o = o_->forward(y.transpose(1, 2).reshape({Bn, T, H * hd}));
    if (attn_post_) o = attn_post_->forward(o);
    const Var<B> x1 = x + o;
    const Var<B> m = mlp_rms_ ? mlp_rms_->forward(x1) : mlp_ln_->forward(x1);
    Var<B> a;
    if (s_.mlp == MlpKind::gated && s_.act == Act::silu) {
      a = nn::functional::swiglu(gate_->forward(m), up_->forward(m));
    } else if (s_.mlp == MlpKind::gated) {
      a = activation(gate_->forward(m)) * up_->forward(m);
    } else {
      a = activation(up_->forward(m));
    }
    Var<B> d = down_->forward(a);
    if (mlp_post_) d = mlp_post_->forward(d);
    return x1 + d;
  }

 private:
  Spec s_;
  bool sliding_ = false;
  std::shared_ptr<nn::RMSNorm<B>> attn_rms_, mlp_rms_, q_norm_, k_norm_, attn_post_, mlp_post_;
  std::shared_ptr<nn::LayerNorm<B>> attn_ln_, mlp_ln_;
  std::shared_ptr<nn::Linear<B>> q_, k_, v_, o_, gate_, up_, down_;
};

template <Backend B> CausalLM<B>::CausalLM(Spec s, LoadOptions o) : s_(std::move(s)), o_(o) {
  KILN_CHECK(
      s_.vocab > 0 && s_.hidden > 0 && s_.layers > 0 && s_.heads > 0 && s_.kv_heads > 0 && s_.head_dim > 0 && s_.intermediate > 0,
      "hf::CausalLM({}): sizes must be positive (vocab {}, hidden {}, layers {}, heads {}, kv heads {}, head_dim {}, intermediate {})",
      s_.architecture, s_.vocab, s_.hidden, s_.layers, s_.heads, s_.kv_heads, s_.head_dim, s_.intermediate);
  KILN_CHECK(s_.heads % s_.kv_heads == 0, "hf::CausalLM({}): {} attention heads are not a multiple of {} key/value heads", s_.architecture,
             s_.heads, s_.kv_heads);
  KILN_CHECK(
      s_.learned_positions ? s_.max_positions > 0 : (s_.head_dim % 2 == 0 && static_cast<int64_t>(s_.inv_freq.size()) == s_.head_dim / 2),
      "hf::CausalLM({}): RoPE needs an even head_dim and head_dim/2 frequencies (head_dim {}, {} frequencies)", s_.architecture,
      s_.head_dim, s_.inv_freq.size());
  embed_ = this->register_module("embed", std::make_shared<nn::Embedding<B>>(nn::EmbeddingOptions{
                                              .num = s_.vocab, .dim = s_.hidden, .dtype = o.dtype, .padding_idx = s_.padding_idx}));
  if (s_.learned_positions)
    pos_embed_ = this->register_module(
        "pos_embed", std::make_shared<nn::Embedding<B>>(nn::EmbeddingOptions{.num = s_.max_positions, .dim = s_.hidden, .dtype = o.dtype}));
  auto layers = this->register_module("layers", std::make_shared<Group<B>>());
  KILN_CHECK(s_.sliding_window >= 0 &&
                 (s_.sliding_layers.empty() ? s_.sliding_window == 0 : static_cast<int64_t>(s_.sliding_layers.size()) == s_.layers),
             "hf::CausalLM({}): sliding_window {} needs one sliding_layers entry per layer ({} for {} layers)", s_.architecture,
             s_.sliding_window, s_.sliding_layers.size(), s_.layers);
  for (int64_t i = 0; i < s_.layers; ++i) {
    const bool sliding = !s_.sliding_layers.empty() && s_.sliding_layers[static_cast<size_t>(i)];
    layers_.push_back(layers->add(std::to_string(i), std::make_shared<DecoderLayer<B>>(s_, o.dtype, sliding)));
  }
  KILN_CHECK(s_.long_inv_freq.empty() || static_cast<int64_t>(s_.long_inv_freq.size()) == s_.head_dim / 2,
             "hf::CausalLM({}): longrope's long frequencies must be head_dim/2 (head_dim {}, {} frequencies)", s_.architecture, s_.head_dim,
             s_.long_inv_freq.size());
  KILN_CHECK(s_.local_inv_freq.empty() || static_cast<int64_t>(s_.local_inv_freq.size()) == s_.head_dim / 2,
             "hf::CausalLM({}): the sliding layers' RoPE needs head_dim/2 frequencies (head_dim {}, {} frequencies)", s_.architecture,
             s_.head_dim, s_.local_inv_freq.size());
  KILN_CHECK(s_.norm_offset == 0 || s_.norm == NormKind::rms, "hf::CausalLM({}): norm_offset applies to RMSNorm", s_.architecture);
  if (s_.norm == NormKind::rms)
    rms_ = this->register_module("norm", spec_rms_norm<B>(s_, s_.hidden, o.dtype));
  else
    ln_ = this->register_module(
        "norm", std::make_shared<nn::LayerNorm<B>>(nn::LayerNormOptions{.dim = s_.hidden, .eps = s_.norm_eps, .dtype = o.dtype}));
  if (!s_.tie_embeddings)
    lm_head_ = this->register_module(
        "lm_head", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = s_.hidden, .out = s_.vocab, .bias = false, .dtype = o.dtype}));
}

template <Backend B> std::pair<Tensor<B>, Tensor<B>> CausalLM<B>::rope_tables(int64_t pos0, int64_t T, bool local) const {
  std::lock_guard<std::mutex> lk(rope_mu_);
  local = local && !s_.local_inv_freq.empty();
  // longrope: a forward whose last position is past original_max_position_embeddings takes the long
  // frequencies for all its positions (transformers' choice per call; cached keys keep theirs)
  const bool long_ = !local && !s_.long_inv_freq.empty() && static_cast<double>(pos0 + T) > s_.rope.original_max_position_embeddings;
  const std::vector<double>& inv_freq = local ? s_.local_inv_freq : long_ ? s_.long_inv_freq : s_.inv_freq;
  const RopeSpec& rope = local ? s_.local_rope : s_.rope;
  const int table = local ? 1 : long_ ? 2 : 0;
  Tensor<B>& cos_table = cos_[table];
  Tensor<B>& sin_table = sin_[table];
  const int64_t have = cos_table.defined() ? cos_table.size(0) : 0, half = s_.head_dim / 2;
  if (pos0 + T > have) {
    const int64_t P = std::max<int64_t>({pos0 + T, 2 * have, 64});
    std::vector<float> c(static_cast<size_t>(P * half)), s(c.size());
    const float af = static_cast<float>(rope.attention_factor);
    const int64_t turned = detail::rotary_dim(rope, s_.head_dim) / 2;  // the pairs after them pass through: cos 1, sin 0
    for (int64_t t = 0; t < P; ++t)
      for (int64_t k = 0; k < half; ++k) {
        if (k >= turned) {
          c[static_cast<size_t>(t * half + k)] = 1.0f;
          s[static_cast<size_t>(t * half + k)] = 0.0f;
          continue;
        }
        // transformers: angle = f32(position · f32(inv_freq)), cos/sin of it in f32
        const double ang =
            static_cast<float>(static_cast<double>(t) * static_cast<double>(static_cast<float>(inv_freq[static_cast<size_t>(k)])));
        // yarn's attention factor scales both (transformers: cos(emb) * attention_scaling in f32; 1 otherwise)
        c[static_cast<size_t>(t * half + k)] = static_cast<float>(std::cos(ang)) * af;
        s[static_cast<size_t>(t * half + k)] = static_cast<float>(std::sin(ang)) * af;
      }
    cos_table = Tensor<B>::from_vector(c, {P, half});
    sin_table = Tensor<B>::from_vector(s, {P, half});
  }
  return {cos_table.narrow(0, pos0, T), sin_table.narrow(0, pos0, T)};
}

template <Backend B> Var<B> CausalLM<B>::forward(const Tensor<B>& ids) const { return run(ids, nullptr, 0, {}); }

template <Backend B> Var<B> CausalLM<B>::forward(const Tensor<B>& ids, std::vector<nn::KVCache<B>>& caches, int64_t capacity) const {
  return forward(ids, caches, capacity, {});
}

template <Backend B> Var<B> CausalLM<B>::forward(const Tensor<B>& ids, std::vector<nn::KVCache<B>>& caches, int64_t capacity,
                                                 const nn::RowInputs<B>& rows) const {
  KILN_CHECK(static_cast<int64_t>(caches.size()) == s_.layers, "hf::CausalLM: {} KV caches for {} layers (use make_caches())",
             caches.size(), s_.layers);
  return run(ids, &caches, capacity, rows);
}

template <Backend B> Var<B> CausalLM<B>::hidden(const Tensor<B>& ids) const { return run(ids, nullptr, 0, {}, false); }

template <Backend B> Var<B> CausalLM<B>::loss(const Tensor<B>& ids, const Tensor<B>& targets, nn::LinearCrossEntropyOptions o) const {
  if (s_.final_softcap > 0 || (lm_head_ && lm_head_->adapter()))
    return nn::cross_entropy(forward(ids), targets, {.ignore_index = o.ignore_index, .label_smoothing = o.label_smoothing});
  std::optional<autocast::Scope> scope;  // the head's product in the forward's dtype
  if (o_.autocast != DType::f32) scope.emplace(o_.autocast);
  return nn::linear_cross_entropy(hidden(ids), lm_head_ ? lm_head_->weight() : embed_->weight(), targets, o);
}

template <Backend B> Var<B> CausalLM<B>::run(const Tensor<B>& ids, std::vector<nn::KVCache<B>>* caches, int64_t capacity,
                                             const nn::RowInputs<B>& rows, bool head) const {
  KILN_CHECK(ids.dim() == 2 && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32),
             "hf::CausalLM({}): ids must be i32/i64 [B, T], got {} {}", s_.architecture, ids.dtype(), shape_str(ids.shape()));
  const int64_t T = ids.size(1), pos0 = caches ? (*caches)[0].len : 0;
  if (caches)
    KILN_CHECK(pos0 + T <= capacity, "hf::CausalLM({}): {} cached + {} new positions exceed the caches' capacity {}", s_.architecture, pos0,
               T, capacity);
  const bool per_row = rows.positions.defined();
  // The positions' range: pos0..pos0+T-1, or each row's own.
  int64_t first = pos0, last = pos0 + T - 1;
  if (per_row) {
    std::tie(first, last) = nn::detail::row_positions_check("hf::CausalLM", rows, ids.size(0), T, pos0 + T);
  }
  if (s_.learned_positions)
    KILN_CHECK(last < s_.max_positions, "hf::CausalLM({}): positions {}..{} exceed the model's {} learned positions (n_positions)",
               s_.architecture, first, last, s_.max_positions);
  std::optional<autocast::Scope> scope;
  if (o_.autocast != DType::f32) scope.emplace(o_.autocast);
  Var<B> x = embed_->forward(ids);  // [B, T, D]
  if (s_.embed_scale > 0) {         // in the parameters' dtype, as transformers' Gemma
    const Tensor<B> scale = Tensor<B>::full({}, s_.embed_scale, embed_->weight().dtype());
    x = x.mul(static_cast<double>(scale.to(DType::f32).template item<float>()));
  }
  // The RoPE tables: [0] every layer's, [1] the sliding layers' (the same unless Spec::local_inv_freq).
  Tensor<B> c[2], s[2];
  if (s_.learned_positions) {
    x = x + (per_row ? pos_embed_->forward(rows.positions)
                     : pos_embed_->forward(Tensor<B>::arange(static_cast<double>(pos0), static_cast<double>(pos0 + T), 1.0, DType::i64))
                           .unsqueeze(0));
  } else {
    for (const bool local : {false, true}) {
      if (per_row) {
        // up to the cache's length, which also decides longrope's factors (transformers: the largest
        // position of the batch, a row that ended included: the padded length)
        std::tie(c[local], s[local]) = rope_tables(0, pos0 + T, local);
        const Tensor<B> at = rows.positions.reshape({-1});
        c[local] = c[local].index_select(0, at);
        s[local] = s[local].index_select(0, at);
      } else {
        std::tie(c[local], s[local]) = rope_tables(pos0, T, local);
      }
      if (s_.local_inv_freq.empty()) {
        c[1] = c[0], s[1] = s[0];
        break;
      }
    }
  }
  const Tensor<B>& mask = rows.mask;
  // Sliding-window layers also hide the keys W or more positions back (transformers: kv > q - W), built
  // only when the sequence reaches that far. Key j and query pos0 + t are cache indices; a left-padded
  // row's positions are those minus its padding, so the differences, and this mask, are the same.
  Tensor<B> window_mask = mask;
  if (const int64_t W = s_.sliding_window; W > 0 && pos0 + T > W) {
    const Tensor<B> q = Tensor<B>::arange(static_cast<double>(pos0), static_cast<double>(pos0 + T), 1.0, DType::i64).reshape({T, 1});
    const Tensor<B> k = Tensor<B>::arange(0.0, static_cast<double>(pos0 + T), 1.0, DType::i64).reshape({1, pos0 + T});
    const Tensor<B> near = k.add(static_cast<double>(W)).gt(q).reshape({1, 1, T, pos0 + T});  // [1, 1, T, S], true = may attend
    window_mask = mask.defined() ? mask.logical_and(near) : near;
  }
  const bool keep_nothing = checkpointing_ && !caches && grad_enabled();  // one segment per layer, which it captures by value
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto& layer = layers_[i];
    const bool sliding = layer->sliding();
    const Tensor<B> m = sliding ? window_mask : mask, lc = c[sliding], ls = s[sliding];
    if (keep_nothing)
      x = kiln::checkpoint<B>(
          [layer, pos0, lc, ls, per_row, m](const Var<B>& h) { return layer->forward(h, pos0, lc, ls, per_row, m, nullptr, 0); }, x);
    else
      x = layer->forward(x, pos0, lc, ls, per_row, m, caches ? &(*caches)[i] : nullptr, capacity);
  }
  x = rms_ ? rms_->forward(x) : ln_->forward(x);
  if (!head) return x;
  Var<B> logits = lm_head_
                      ? lm_head_->forward(x)
                      : autograd::Linalg<B>::linear(x.reshape({-1, s_.hidden}), embed_->weight(), {}).reshape({ids.size(0), T, s_.vocab});
  if (s_.final_softcap > 0) logits = logits.div(s_.final_softcap).tanh().mul(s_.final_softcap);
  return logits.dtype() == DType::f32 ? logits : logits.to(DType::f32);
}

// ------------------------------------------------------------------------------------------ loading

namespace {

template <Backend B> Tensor<B> transform(Tensor<B> t, const TensorSource& src) {
  switch (src.op) {
    case TensorSource::Op::copy:
      break;
    case TensorSource::Op::transpose:
      t = t.transpose(0, 1);
      break;
    case TensorSource::Op::rope_rows:
      break;
  }
  if (src.rows > 0) {
    t = t.narrow(0, src.row0, src.rows);
  } else if (src.parts > 1) {
    const int64_t n = t.size(0) / src.parts;
    t = t.narrow(0, src.part * n, n);
  }
  if (src.op == TensorSource::Op::rope_rows) t = rope_rows_order(t, src.heads, src.rotary, /*to_kiln=*/true);
  return t;
}

}  // namespace

template <Backend B> std::shared_ptr<CausalLM<B>> load_causal_lm(const ModelDir& d, const LoadOptions& o) {
  KILN_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16 || o.dtype == DType::f16 || o.dtype == DType::f64,
             "hf::load_causal_lm: the parameters' dtype must be a float type, got {}", o.dtype);
  const Architecture* a = find_architecture(d.architecture());
  KILN_CHECK(a != nullptr, "{}: architecture '{}' is not supported (kiln reads: {})", d.config_path(), d.architecture(),
             fmt::join(architectures(), ", "));
  Spec s = a->spec(d);
  s.source_config = std::make_shared<const nlohmann::json>(d.config());
  if (d.generation_config()) s.source_generation_config = std::make_shared<const nlohmann::json>(*d.generation_config());
  const std::map<std::string, TensorSource> table = a->tensors(s, &d);
  NoGrad no_grad;
  const auto model = [&] {
    nn::init::SkipInit every_parameter_is_loaded_below;  // a parameter without a tensor is an error
    return std::make_shared<CausalLM<B>>(s, o);
  }();
  const std::string where = d.sharded() ? d.dir() + "/model.safetensors.index.json" : d.dir() + "/model.safetensors";
  std::set<std::string> used;
  std::vector<std::string> problems;
  for (const auto& [name, var] : model->named_parameters()) {
    const auto it = table.find(name);
    KILN_CHECK(it != table.end(), "hf::load_causal_lm({}): the table has no source for parameter '{}' (a bug in nn/hf)", s.architecture,
               name);
    const TensorSource& src = it->second;
    if (!d.contains(src.name)) {
      problems.push_back(fmt::format("missing tensor '{}' (for {} {})", src.name, s.architecture, name));
      continue;
    }
    const safetensors::File& f = d.file_of(src.name);
    const safetensors::TensorInfo& info = f.info(src.name);
    if (info.shape != src.shape) {
      problems.push_back(fmt::format("{}: tensor '{}' is {} but {} makes it {}", f.path(), src.name, shape_str(info.shape), d.config_path(),
                                     shape_str(src.shape)));
      continue;
    }
    if (!(info.dtype == DType::f32 || info.dtype == DType::bf16 || info.dtype == DType::f16 || info.dtype == DType::f64)) {
      problems.push_back(fmt::format("{}: tensor '{}' is {} (weights must be F32, F16 or BF16)", f.path(), src.name, info.st_dtype));
      continue;
    }
    used.insert(src.name);
    Tensor<B> p = var.value();
    p.copy_(transform(f.load<B>(src.name), src));
    if (src.parts == 1 || src.part == src.parts - 1) f.release(src.name);  // GPT-2's c_attn: after its last third
  }
  KILN_CHECK(problems.empty(), "hf::load_causal_lm: {} does not fit {}: {}", where, d.config_path(), fmt::join(problems, "; "));
  // A tied head: a stored lm_head copy must be the embedding (transformers would drop it silently).
  if (s.tie_embeddings) {
    const auto lm = table.find("lm_head.weight"), emb = table.find("embed.weight");
    if (lm != table.end() && d.contains(lm->second.name)) {
      const auto& f = d.file_of(lm->second.name);
      KILN_CHECK(f.info(lm->second.name).shape == emb->second.shape, "{}: tensor '{}' is {}, the embedding {} is {}", f.path(),
                 lm->second.name, shape_str(f.info(lm->second.name).shape), emb->second.name, shape_str(emb->second.shape));
      const Tensor<B> diff =
          f.load<B>(lm->second.name).to(DType::f32).sub(d.file_of(emb->second.name).load<B>(emb->second.name).to(DType::f32)).abs().max();
      KILN_CHECK(diff.template item<float>() == 0.0f,
                 "{}: 'tie_word_embeddings' is true but tensor '{}' in {} differs from '{}' (set tie_word_embeddings to false to use it)",
                 d.config_path(), lm->second.name, f.path(), emb->second.name);
      used.insert(lm->second.name);
    }
  }
  std::vector<std::string> extra;
  for (const std::string& n : d.tensor_names()) {
    if (used.count(n)) continue;
    const bool ignored =
        std::any_of(a->ignored_suffixes.begin(), a->ignored_suffixes.end(), [&](const std::string& suf) { return n.ends_with(suf); }) ||
        std::any_of(a->ignored_prefixes.begin(), a->ignored_prefixes.end(), [&](const std::string& pre) { return n.starts_with(pre); });
    if (!ignored) extra.push_back(fmt::format("'{}' ({})", n, d.file_of(n).path()));
  }
  KILN_CHECK(extra.empty(), "hf::load_causal_lm: {} holds tensor{} that {} with {} has no place for: {}", d.dir(),
             extra.size() > 1 ? "s" : "", s.architecture, d.config_path(), fmt::join(extra, ", "));
  model->eval();
  return model;
}

template <Backend B> std::shared_ptr<CausalLM<B>> load_causal_lm(const std::string& dir, const LoadOptions& o) {
  return load_causal_lm<B>(ModelDir::open(dir), o);
}

#define KILN_INST(B)                                                                            \
  template class DecoderLayer<B>;                                                               \
  template class CausalLM<B>;                                                                   \
  template std::shared_ptr<CausalLM<B>> load_causal_lm<B>(const ModelDir&, const LoadOptions&); \
  template std::shared_ptr<CausalLM<B>> load_causal_lm<B>(const std::string&, const LoadOptions&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::hf
