// LlamaForCausalLM (transformers' models/llama/modeling_llama.py) and MistralForCausalLM, which is
// the same network: RMSNorm, rotate-half RoPE (theta; default, linear, llama3 or yarn scaling), GQA,
// a gated MLP (SwiGLU, or another hidden_act), tied or untied head, optional attention/MLP biases.
// Mistral's sliding window acts in every layer. q_proj/k_proj rows are re-ordered for kiln's
// interleaved RoPE (nn/hf/causal_lm.hpp).
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

// Shared by Llama, Mistral, Qwen2 and Qwen3: the fields of their configs and the tensor names of their
// decoders ("model.layers.{i}.self_attn.q_proj.weight", ...).
Spec llama_family_spec(ConfigReader& c, const ModelDir& d, const FamilyDefaults& def) {
  Spec s;
  s.architecture = d.architecture();
  s.vocab = c.integer("vocab_size");
  s.hidden = c.integer("hidden_size");
  s.intermediate = c.integer("intermediate_size");
  s.layers = c.integer("num_hidden_layers");
  s.heads = c.integer("num_attention_heads");
  // absent: the config class's default; null: num_attention_heads (transformers' `is None` rule)
  s.kv_heads = c.json().contains("num_key_value_heads") ? c.integer("num_key_value_heads", s.heads)
               : def.kv_heads > 0                       ? def.kv_heads
                                                        : s.heads;
  KILN_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
             "{}: num_attention_heads {} must be a positive multiple of num_key_value_heads {}", c.path(), s.heads, s.kv_heads);
  s.head_dim = c.integer("head_dim", def.head_dim > 0 ? def.head_dim : s.hidden / s.heads);
  KILN_CHECK(s.head_dim > 0 && s.head_dim % 2 == 0, "{}: head_dim {} must be even and positive", c.path(), s.head_dim);
  s.max_positions = c.integer("max_position_embeddings", def.max_positions);
  s.norm = NormKind::rms;
  s.norm_eps = c.number("rms_norm_eps", 1e-6);
  s.mlp = MlpKind::gated;  // down(act(gate(x)) * up(x)), any of ACT2FN's activations kiln has
  s.act = read_act(c, def.act_field, def.act);
  s.tie_embeddings = c.boolean("tie_word_embeddings", def.tie_embeddings);
  // transformers' nn.Embedding(padding_idx=pad_token_id): the pad token's row gets no gradient from lookups
  if (const auto it = c.json().find("pad_token_id"); it != c.json().end() && !it->is_null()) {
    KILN_CHECK(it->is_number_integer() && it->get<int64_t>() >= -s.vocab && it->get<int64_t>() < s.vocab,
               "{}: field 'pad_token_id' = {} must be an integer in [-vocab_size, vocab_size) = [{}, {}) (transformers' embedding "
               "takes it as padding_idx)",
               c.path(), it->dump(), -s.vocab, s.vocab);
    s.padding_idx = it->get<int64_t>();
  }
  if (def.rope) {
    s.rope = read_rope(c, def.rope_theta, s.max_positions, def.rope_rules);
    // transformers 4 spells partial_rotary_factor at the top level, 5 in rope_parameters
    if (const auto* v = c.raw("partial_rotary_factor")) {
      const double f = c.number("partial_rotary_factor");
      KILN_CHECK(c.raw("rope_parameters") == nullptr || !c.raw("rope_parameters")->contains("partial_rotary_factor") ||
                     s.rope.partial_rotary_factor == f,
                 "{}: 'partial_rotary_factor' ({}) and 'rope_parameters.partial_rotary_factor' ({}) disagree", c.path(), v->dump(),
                 s.rope.partial_rotary_factor);
      s.rope.partial_rotary_factor = f;
    }
    const double f = s.rope.partial_rotary_factor;
    const auto turned = static_cast<int64_t>(static_cast<double>(s.head_dim) * f);  // int() as transformers
    KILN_CHECK(f > 0 && f <= 1 && turned >= 2 && turned % 2 == 0,
               "{}: partial_rotary_factor {} of head_dim {} turns {} values; kiln needs an even number in [2, head_dim]", c.path(), f,
               s.head_dim, turned);
    if (s.rope.partial_rotary_factor != 1.0 && !def.partial_rotary)
      c.unsupported("partial_rotary_factor",
                    fmt::format("transformers' {} turns every value of a head (only Phi-3 has partial RoPE)", d.architecture()));
    if (s.rope.type == "longrope") {  // one factor per turned pair
      const int64_t pairs = rotary_dim(s.rope, s.head_dim) / 2;
      const char* field = c.raw("rope_parameters") ? "rope_parameters" : "rope_scaling";
      for (const auto& [name, factors] : {std::pair{"short_factor", &s.rope.short_factor}, std::pair{"long_factor", &s.rope.long_factor}})
        KILN_CHECK(static_cast<int64_t>(factors->size()) == pairs,
                   "{}: '{}.{}' has {} factors; longrope needs {} ({} of head_dim {} turned, in pairs)", c.path(), field, name,
                   factors->size(), pairs, 2 * pairs, s.head_dim);
    }
    s.inv_freq = rope_inv_freq(s.rope, s.head_dim);
    s.long_inv_freq = rope_long_inv_freq(s.rope, s.head_dim);
  }
  // transformers 4.5x+/5: a type per layer, full or sliding-window attention; the architecture's reader
  // gives the sliding layers their window (Spec::sliding_window) or refuses them.
  if (const auto* v = c.raw("layer_types")) {
    KILN_CHECK(v->is_array() && static_cast<int64_t>(v->size()) == s.layers,
               "{}: field 'layer_types' must be a list of {} layer types, got {}", c.path(), s.layers, v->dump());
    for (const auto& t : *v) {
      const bool full = t.is_string() && t.get<std::string>() == "full_attention";
      if (!full && !(t.is_string() && t.get<std::string>() == "sliding_attention"))
        c.unsupported("layer_types",
                      fmt::format("layer type {} is not implemented (kiln has \"full_attention\" and \"sliding_attention\")", t.dump()));
      s.sliding_layers.push_back(!full);
    }
  }
  return s;
}

std::map<std::string, TensorSource> llama_family_tensors(const Spec& s, const ModelDir*) {
  const int64_t D = s.hidden, I = s.intermediate, H = s.heads, Hkv = s.kv_heads, hd = s.head_dim;
  using Op = TensorSource::Op;
  std::map<std::string, TensorSource> t;
  // q/k rows re-ordered for kiln's RoPE: the turned ones of each head (partial RoPE: not all)
  const int64_t rd = rotary_dim(s.rope, hd) == hd ? 0 : rotary_dim(s.rope, hd);
  const auto rope_rows = [&](std::string name, Shape shape, int64_t heads) {
    return TensorSource{.name = std::move(name), .shape = std::move(shape), .op = Op::rope_rows, .heads = heads, .rotary = rd};
  };
  t["embed.weight"] = {"model.embed_tokens.weight", {s.vocab, D}};
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string k = fmt::format("layers.{}.", i), h = fmt::format("model.layers.{}.", i);
    t[k + "attn_norm.weight"] = {h + "input_layernorm.weight", {D}};
    t[k + "attn.q_proj.weight"] = rope_rows(h + "self_attn.q_proj.weight", {H * hd, D}, H);
    t[k + "attn.k_proj.weight"] = rope_rows(h + "self_attn.k_proj.weight", {Hkv * hd, D}, Hkv);
    t[k + "attn.v_proj.weight"] = {h + "self_attn.v_proj.weight", {Hkv * hd, D}};
    t[k + "attn.o_proj.weight"] = {h + "self_attn.o_proj.weight", {D, H * hd}};
    if (s.qkv_bias) {
      t[k + "attn.q_proj.bias"] = rope_rows(h + "self_attn.q_proj.bias", {H * hd}, H);
      t[k + "attn.k_proj.bias"] = rope_rows(h + "self_attn.k_proj.bias", {Hkv * hd}, Hkv);
      t[k + "attn.v_proj.bias"] = {h + "self_attn.v_proj.bias", {Hkv * hd}};
    }
    if (s.o_bias) t[k + "attn.o_proj.bias"] = {h + "self_attn.o_proj.bias", {D}};
    if (s.qk_norm) {  // one head's hd weights, re-ordered as each head's q/k rows
      t[k + "attn.q_norm.weight"] = rope_rows(h + "self_attn.q_norm.weight", {hd}, 1);
      t[k + "attn.k_norm.weight"] = rope_rows(h + "self_attn.k_norm.weight", {hd}, 1);
    }
    t[k + "mlp_norm.weight"] = {h + "post_attention_layernorm.weight", {D}};
    const char* names[] = {"gate_proj", "up_proj", "down_proj"};
    for (const char* n : names) {
      const bool down = std::string(n) == "down_proj";
      t[k + "mlp." + n + ".weight"] = {h + "mlp." + n + ".weight", down ? Shape{D, I} : Shape{I, D}};
      if (s.mlp_bias) t[k + "mlp." + n + ".bias"] = {h + "mlp." + n + ".bias", {down ? D : I}};
    }
  }
  t["norm.weight"] = {"model.norm.weight", {D}};
  t["lm_head.weight"] = {"lm_head.weight", {s.vocab, D}};
  return t;
}

std::optional<int64_t> sliding_window_field(ConfigReader& c) {
  if (!c.json().contains("sliding_window")) return 4096;
  const auto* w = c.raw("sliding_window");
  if (w == nullptr) return std::nullopt;
  KILN_CHECK(w->is_number_integer(), "{}: field 'sliding_window' must be an integer or null, got {}", c.path(), w->dump());
  return w->get<int64_t>();
}

nlohmann::json layer_types_field(const Spec& s) {
  nlohmann::json types = nlohmann::json::array();
  for (const bool sliding : s.sliding_layers) types.push_back(sliding ? "sliding_attention" : "full_attention");
  return types;
}

// The fields llama_family_spec reads, from a Spec (the export's config.json).
nlohmann::json llama_family_config(const Spec& s, const char* model_type) {
  const std::string type = model_type;
  KILN_CHECK(!s.qk_norm || type == "qwen3" || type == "gemma3_text",
             "hf::save_pretrained: {} has no q_norm/k_norm (Qwen3ForCausalLM and Gemma3ForCausalLM have)", s.architecture);
  KILN_CHECK(type.starts_with("gemma") || (s.norm_offset == 0 && s.embed_scale == 0 && !s.post_norms && s.attn_scalar == 0 &&
                                           s.attn_softcap == 0 && s.final_softcap == 0 && s.local_inv_freq.empty()),
             "hf::save_pretrained: {} has none of Gemma's (1 + w) norms, embedding scale, post norms, score scale, soft caps or local RoPE",
             s.architecture);
  nlohmann::json j;
  j["architectures"] = {s.architecture};
  j["model_type"] = model_type;
  j["vocab_size"] = s.vocab;
  j["hidden_size"] = s.hidden;
  j["intermediate_size"] = s.intermediate;
  j["num_hidden_layers"] = s.layers;
  j["num_attention_heads"] = s.heads;
  j["num_key_value_heads"] = s.kv_heads;
  j["head_dim"] = s.head_dim;
  j["max_position_embeddings"] = s.max_positions;
  j["rms_norm_eps"] = s.norm_eps;
  j["hidden_act"] = act_spelling(s, "hidden_act", std::string(model_type) == "gemma");
  j["tie_word_embeddings"] = s.tie_embeddings;
  write_rope(s.rope, j);
  return j;
}

namespace {

Spec llama_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s = llama_family_spec(c, d, {.kv_heads = d.architecture() == "MistralForCausalLM" ? 8 : 0});  // MistralConfig: 8
  const bool mistral = d.architecture() == "MistralForCausalLM";
  // Llama has full attention in every layer; Mistral's sliding_window, when set, acts in every layer
  // (transformers' MistralModel ignores layer_types).
  const bool any_sliding = std::find(s.sliding_layers.begin(), s.sliding_layers.end(), true) != s.sliding_layers.end();
  if (!mistral && any_sliding) c.unsupported("layer_types", "LlamaForCausalLM has no sliding-window layers");
  s.sliding_layers.clear();
  if (mistral) {
    if (const auto w = sliding_window_field(c)) {
      KILN_CHECK(*w > 0, "{}: field 'sliding_window' must be a positive integer or null, got {}", c.path(), *w);
      s.sliding_window = *w;
      s.sliding_layers.assign(static_cast<size_t>(s.layers), true);
    }
  } else {
    s.qkv_bias = s.o_bias = c.boolean("attention_bias", false);
    s.mlp_bias = c.boolean("mlp_bias", false);
    c.accept({"pretraining_tp"});  // the same products, split in slices
  }
  c.finish();
  return s;
}

nlohmann::json llama_config(const Spec& s) {
  const bool mistral = s.architecture == "MistralForCausalLM";
  nlohmann::json j = llama_family_config(s, mistral ? "mistral" : "llama");
  if (mistral) {
    KILN_CHECK(!s.qkv_bias && !s.o_bias && !s.mlp_bias, "hf::save_pretrained: MistralForCausalLM has no biases");
    KILN_CHECK(std::find(s.sliding_layers.begin(), s.sliding_layers.end(), false) == s.sliding_layers.end(),
               "hf::save_pretrained: MistralForCausalLM's sliding window acts in every layer or in none");
    // null: full attention (transformers' default would be a window of 4096)
    j["sliding_window"] = s.sliding_window > 0 ? nlohmann::json(s.sliding_window) : nlohmann::json(nullptr);
  } else {
    KILN_CHECK(s.sliding_window == 0, "hf::save_pretrained: LlamaForCausalLM has no sliding-window attention");
    KILN_CHECK(s.qkv_bias == s.o_bias, "hf::save_pretrained: LlamaForCausalLM has biases on all of q, k, v, o or on none of them");
    j["attention_bias"] = s.qkv_bias;
    j["mlp_bias"] = s.mlp_bias;
  }
  return j;
}

}  // namespace

Architecture llama_architecture(const std::string& name) {
  return {name, llama_spec, llama_family_tensors, {"rotary_emb.inv_freq"}, llama_config, {"q_proj", "v_proj"}};
}

}  // namespace kiln::hf::detail
