// GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM (transformers' models/gemma, gemma2 and
// gemma3 as of 5.24): the Llama network with
//   - RMSNorms that scale by (1 + weight) (Spec::norm_offset; the checkpoint's weights are kept as stored);
//   - the embeddings times √hidden_size, rounded to the parameters' dtype;
//   - a gated MLP with the tanh GELU (hidden_act, or Gemma 2/3's hidden_activation);
//   - a tied head and a head_dim of 256 unless the config says otherwise.
// Gemma 2 and 3 add an RMSNorm after the attention and after the MLP (post_attention_layernorm,
// post_feedforward_layernorm; the MLP's input norm is pre_feedforward_layernorm), the scale
// query_pre_attn_scalar^-1/2 (Spec::attn_scalar), and sliding-window layers (every other layer in Gemma 2, five of six in
// Gemma 3, or layer_types). Gemma 2 caps the attention scores and the logits (cap · tanh(x / cap));
// Gemma 3 has q_norm/k_norm as Qwen3, a final cap only when configured, and the sliding layers' own
// RoPE (rope_local_base_freq, or rope_parameters.sliding_attention). Gemma3ForConditionalGeneration (the
// 4B, 12B and 27B checkpoints) loads as its text model: text_config, and the tensors under language_model.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

namespace {

int gemma_version(const std::string& architecture) {
  if (architecture == "GemmaForCausalLM") return 1;
  if (architecture == "Gemma2ForCausalLM") return 2;
  KILN_CHECK(architecture == "Gemma3ForCausalLM" || architecture == "Gemma3ForConditionalGeneration",
             "hf: '{}' is not a Gemma architecture", architecture);
  return 3;
}

// A soft cap: the default when absent, none (0) when null, else a positive number.
double softcap_field(ConfigReader& c, const char* key, double def) {
  if (!c.json().contains(key)) return def;
  if (c.raw(key) == nullptr) return 0;
  const double v = c.number(key);
  KILN_CHECK(v > 0 && std::isfinite(v), "{}: field '{}' must be a positive number or null, got {}", c.path(), key, v);
  return v;
}

// Gemma 3's two RoPEs: transformers 5 spells them "rope_parameters": {"full_attention": {...},
// "sliding_attention": {...}}; 4.x "rope_theta" and "rope_scaling" (the full-attention layers') and
// "rope_local_base_freq" (the sliding layers', always the default type).
void read_gemma3_rope(ConfigReader& c, Spec& s) {
  s.rope.theta = c.number("rope_theta", 1e6);
  s.local_rope.theta = c.number("rope_local_base_freq", 10000.0);
  const nlohmann::json* params = c.raw("rope_parameters");
  if (params == nullptr) {
    // Gemma3TextConfig (transformers 5) sets rope_type "default" before merging rope_scaling in, so a
    // type spelled "type" is ignored there, where 4.x applied it: ambiguous, refused.
    if (const auto* sc = c.raw("rope_scaling"); sc != nullptr && sc->is_object() && sc->contains("type") && !sc->contains("rope_type"))
      c.unsupported("rope_scaling",
                    "Gemma 3's config class in transformers 5 ignores 'type' (its RoPE stays default), 4.x applied "
                    "it: spell it 'rope_type'");
    s.rope = read_rope(c, s.rope.theta, s.max_positions);
  } else {
    KILN_CHECK(params->is_object() && (params->contains("full_attention") || params->contains("sliding_attention")),
               "{}: Gemma 3's 'rope_parameters' must hold \"full_attention\" and \"sliding_attention\" parameters, got {}", c.path(),
               params->dump());
    KILN_CHECK(c.raw("rope_scaling") == nullptr,
               "{}: both 'rope_parameters' (transformers 5) and 'rope_scaling' (transformers 4) are set; which one holds?", c.path());
    for (auto it = params->begin(); it != params->end(); ++it) {
      const bool full = it.key() == "full_attention";
      if (!full && it.key() != "sliding_attention")
        c.unsupported("rope_parameters", fmt::format("'{}' is no layer type (Gemma 3 has full_attention and sliding_attention)", it.key()));
      if (!it->is_null()) read_rope_params(c, *it, "rope_parameters." + it.key(), full ? s.rope : s.local_rope, s.max_positions);
    }
  }
  const auto* top = c.raw("partial_rotary_factor");
  if (s.rope.partial_rotary_factor != 1.0 || s.local_rope.partial_rotary_factor != 1.0 ||
      (top != nullptr && !(top->is_number() && top->get<double>() == 1.0)))
    c.unsupported("rope_parameters", "Gemma 3 turns every value of a head (partial_rotary_factor is Phi-3's)");
  if (s.rope.type == "longrope" || s.local_rope.type == "longrope")
    c.unsupported("rope_parameters", "longrope in Gemma 3's per-layer-type RoPE is not implemented");
  s.inv_freq = rope_inv_freq(s.rope, s.head_dim);
  s.local_inv_freq = rope_inv_freq(s.local_rope, s.head_dim);
}

// The text model's fields (c: config.json, or its text_config).
Spec gemma_text_spec(ConfigReader& c, const ModelDir& d, int version) {
  Spec s = llama_family_spec(c, d,
                             {.head_dim = 256,
                              .kv_heads = version == 1 ? 16 : 4,
                              .max_positions = version == 3 ? 131072 : 8192,
                              .act_field = version == 1 ? "hidden_act" : "hidden_activation",
                              .act = "gelu_pytorch_tanh",
                              .tie_embeddings = true,
                              .rope = version != 3});
  if (version == 1) {
    // transformers 5 reads hidden_act, "gelu" (the first releases' value) meaning the tanh GELU; 4.x
    // read hidden_activation when set: both must then agree.
    if (s.act == Act::gelu) s.act = Act::gelu_tanh;
    if (c.raw("hidden_activation") != nullptr && read_act(c, "hidden_activation", "gelu_pytorch_tanh") != s.act)
      c.unsupported("hidden_activation", fmt::format("it disagrees with hidden_act \"{}\" (transformers 4 read hidden_activation, 5 reads "
                                                     "hidden_act)",
                                                     act_name(s.act)));
  } else {
    c.accept({"hidden_act"});  // carried by Gemma 2/3 configs; their MLP reads hidden_activation
  }
  s.norm_offset = 1;
  s.embed_scale = std::sqrt(static_cast<double>(s.hidden));
  s.qkv_bias = s.o_bias = c.boolean("attention_bias", false);
  if (c.boolean("use_bidirectional_attention", false))
    c.unsupported("use_bidirectional_attention", "bidirectional attention (an embedding model's) is not a causal LM");
  // the KV cache generate() makes; Gemma 3 configs also carry "_sliding_window_pattern", which transformers
  // overwrites (sliding_window_pattern, default 6, when layer_types is absent)
  c.accept({"cache_implementation", "_sliding_window_pattern"});
  if (version == 1) {
    if (std::find(s.sliding_layers.begin(), s.sliding_layers.end(), true) != s.sliding_layers.end())
      c.unsupported("layer_types", "GemmaForCausalLM has no sliding-window layers");
    s.sliding_layers.clear();
    c.finish();
    return s;
  }
  s.post_norms = true;
  s.attn_scalar = c.number("query_pre_attn_scalar", 256);
  KILN_CHECK(s.attn_scalar > 0, "{}: field 'query_pre_attn_scalar' must be positive, got {}", c.path(), s.attn_scalar);
  if (version == 2) {
    s.attn_softcap = softcap_field(c, "attn_logit_softcapping", 50.0);
    s.final_softcap = softcap_field(c, "final_logit_softcapping", 30.0);
  } else {
    // transformers 5's Gemma 3 attention keeps the field but never applies it; no Gemma 3 sets it.
    if (softcap_field(c, "attn_logit_softcapping", 0) != 0)
      c.unsupported("attn_logit_softcapping", "Gemma 3's attention does not apply it in transformers 5; kiln does not guess");
    s.final_softcap = softcap_field(c, "final_logit_softcapping", 0);
    s.qk_norm = true;
    read_gemma3_rope(c, s);
  }
  // The layer types: layer_types, else every other layer (Gemma 2) or all but every sliding_window_pattern-th
  // (Gemma 3, default 6) slide. A null window leaves every layer's attention full (Gemma 3's sliding
  // layers keep their RoPE).
  const int64_t pattern = version == 2 ? 2 : c.integer("sliding_window_pattern", 6);
  KILN_CHECK(pattern > 0, "{}: field 'sliding_window_pattern' must be positive, got {}", c.path(), pattern);
  if (s.sliding_layers.empty())
    for (int64_t i = 0; i < s.layers; ++i) s.sliding_layers.push_back((i + 1) % pattern != 0);
  if (const auto w = sliding_window_field(c)) {
    KILN_CHECK(*w > 0, "{}: field 'sliding_window' must be a positive integer or null, got {}", c.path(), *w);
    s.sliding_window = *w;
  }
  c.finish();
  return s;
}

Spec gemma_spec(const ModelDir& d) {
  ConfigReader c(d);
  return gemma_text_spec(c, d, gemma_version(d.architecture()));
}

// Gemma3ForConditionalGeneration (Gemma 3 4B, 12B, 27B): its text model, from text_config; the vision
// tower and the projector are not built (their tensors are skipped), so images are not read.
Spec gemma3_multimodal_spec(const ModelDir& d) {
  ConfigReader top(d);
  top.accept({"text_config", "vision_config", "boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image",
              "initializer_range"});
  const bool tied = top.boolean("tie_word_embeddings", true);
  top.finish();
  ConfigReader c(d, "text_config");
  Spec s = gemma_text_spec(c, d, 3);
  KILN_CHECK(s.tie_embeddings == tied, "{}: tie_word_embeddings is {} but text_config's is {}", d.config_path(), tied, s.tie_embeddings);
  return s;
}

std::map<std::string, TensorSource> gemma_tensors(const Spec& s, const ModelDir* d) {
  std::map<std::string, TensorSource> t = llama_family_tensors(s, d);
  if (s.post_norms)  // Gemma 2/3: post_attention_layernorm is the attention's output norm
    for (int64_t i = 0; i < s.layers; ++i) {
      const std::string k = fmt::format("layers.{}.", i), h = fmt::format("model.layers.{}.", i);
      t[k + "mlp_norm.weight"] = {h + "pre_feedforward_layernorm.weight", {s.hidden}};
      t[k + "attn_post_norm.weight"] = {h + "post_attention_layernorm.weight", {s.hidden}};
      t[k + "mlp_post_norm.weight"] = {h + "post_feedforward_layernorm.weight", {s.hidden}};
    }
  return t;
}

nlohmann::json gemma_config(const Spec& s) {
  const int version = gemma_version(s.architecture);
  KILN_CHECK(s.norm_offset == 1 && s.embed_scale == std::sqrt(static_cast<double>(s.hidden)) && s.qkv_bias == s.o_bias && !s.mlp_bias &&
                 s.post_norms == (version > 1) && s.qk_norm == (version == 3) && (version == 2 || s.attn_softcap == 0),
             "hf::save_pretrained: {} does not have this network (Gemma's (1 + w) norms, scaled embeddings, post norms from Gemma 2, "
             "q/k norms in Gemma 3, the attention cap in Gemma 2 only)",
             s.architecture);
  nlohmann::json j = llama_family_config(s, version == 1 ? "gemma" : version == 2 ? "gemma2" : "gemma3_text");
  j["attention_bias"] = s.qkv_bias;
  if (version == 1) {
    KILN_CHECK(s.sliding_layers.empty(), "hf::save_pretrained: GemmaForCausalLM has no sliding-window layers");
    return j;
  }
  j.erase("hidden_act");
  j["hidden_activation"] = act_spelling(s, "hidden_activation");
  j["query_pre_attn_scalar"] =
      s.attn_scalar == std::floor(s.attn_scalar) ? nlohmann::json(static_cast<int64_t>(s.attn_scalar)) : nlohmann::json(s.attn_scalar);
  j["final_logit_softcapping"] = s.final_softcap > 0 ? nlohmann::json(s.final_softcap) : nlohmann::json(nullptr);
  j["attn_logit_softcapping"] = s.attn_softcap > 0 ? nlohmann::json(s.attn_softcap) : nlohmann::json(nullptr);
  j["sliding_window"] = s.sliding_window > 0 ? nlohmann::json(s.sliding_window) : nlohmann::json(nullptr);
  j["layer_types"] = layer_types_field(s);
  if (version == 3) {  // the full layers' RoPE as rope_theta/rope_scaling, the sliding layers' default one as rope_local_base_freq
    KILN_CHECK(s.local_rope.type == "default", "hf::save_pretrained: Gemma 3's sliding layers have a default RoPE, not \"{}\"",
               s.local_rope.type);
    j["rope_local_base_freq"] = s.local_rope.theta;
  }
  return j;
}

}  // namespace

Architecture gemma_architecture(const std::string& name) {
  return {name, gemma_spec, gemma_tensors, {"rotary_emb.inv_freq"}, gemma_config, {"q_proj", "v_proj"}};
}

Architecture gemma3_multimodal_architecture() {
  // The text model's tensors under "language_model." (the checkpoints' and transformers 5's save_pretrained
  // names), or "model.language_model." with lm_head at the top (transformers 5's module names).
  const auto tensors = [](const Spec& s, const ModelDir* d) {
    std::map<std::string, TensorSource> t = gemma_tensors(s, d);
    const bool modules = d != nullptr && d->contains("model.language_model.embed_tokens.weight");
    for (auto& [name, src] : t) {
      if (!modules)
        src.name = "language_model." + src.name;
      else if (src.name.starts_with("model."))
        src.name = "model.language_model." + src.name.substr(6);
    }
    return t;
  };
  return {.name = "Gemma3ForConditionalGeneration",
          .spec = gemma3_multimodal_spec,
          .tensors = tensors,
          .ignored_suffixes = {"rotary_emb.inv_freq"},
          .config = gemma_config,
          .lora_targets = {"q_proj", "v_proj"},
          .ignored_prefixes = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."},
          .read_only =
              "kiln reads its text model only (no vision tower): it can generate and evaluate text, not write the model "
              "or LoRA adapters for it"};
}

}  // namespace kiln::hf::detail
