// Qwen2ForCausalLM and Qwen3ForCausalLM (transformers' models/qwen2/modeling_qwen2.py,
// models/qwen3/modeling_qwen3.py): the Llama network. Qwen2 has biases on q_proj, k_proj and v_proj
// (not o_proj). Qwen3 has an RMSNorm over each head's q and k before RoPE (q_norm, k_norm: [head_dim]
// weights, eps rms_norm_eps), Llama's attention_bias (q, k, v and o) and a head_dim of 128 when the
// config gives none. Both may have sliding-window layers (use_sliding_window, sliding_window,
// max_window_layers or layer_types).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

namespace {

// Both configs' rule (transformers 5): the window is sliding_window (4096 when absent, none when null)
// where use_sliding_window, else none; the sliding layers are layer_types' "sliding_attention" entries, or
// without layer_types those from max_window_layers (default 28) on. Without a window every layer has
// full attention.
void read_sliding_window(ConfigReader& c, Spec& s) {
  const bool use = c.boolean("use_sliding_window", false);
  const std::optional<int64_t> window = sliding_window_field(c);
  const int64_t from = c.integer("max_window_layers", 28);
  if (!use || !window) {
    s.sliding_layers.clear();
    return;
  }
  KILN_CHECK(*window > 0, "{}: use_sliding_window needs a positive sliding_window, got {}", c.path(), *window);
  s.sliding_window = *window;
  if (s.sliding_layers.empty())  // no layer_types
    for (int64_t i = 0; i < s.layers; ++i) s.sliding_layers.push_back(i >= from);
}

// use_sliding_window, sliding_window and layer_types as read_sliding_window reads them back.
void write_sliding_window(const Spec& s, nlohmann::json& j) {
  j["use_sliding_window"] = s.sliding_window > 0;
  if (s.sliding_window == 0) return;  // the source's sliding_window and max_window_layers (if any) act on nothing
  j["sliding_window"] = s.sliding_window;
  j["layer_types"] = layer_types_field(s);
}

Spec qwen2_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s = llama_family_spec(c, d, {.kv_heads = 32});  // Qwen2Config's default
  s.qkv_bias = true;
  read_sliding_window(c, s);
  c.finish();
  return s;
}

nlohmann::json qwen2_config(const Spec& s) {
  KILN_CHECK(s.qkv_bias && !s.o_bias && !s.mlp_bias, "hf::save_pretrained: Qwen2ForCausalLM has biases on q, k and v only");
  nlohmann::json j = llama_family_config(s, "qwen2");
  write_sliding_window(s, j);
  return j;
}

Spec qwen3_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s = llama_family_spec(c, d, {.head_dim = 128, .kv_heads = 32});  // Qwen3Config's defaults (head_dim not hidden/heads)
  s.qkv_bias = s.o_bias = c.boolean("attention_bias", false);
  s.qk_norm = true;
  read_sliding_window(c, s);
  c.finish();
  return s;
}

nlohmann::json qwen3_config(const Spec& s) {
  KILN_CHECK(s.qk_norm && s.qkv_bias == s.o_bias && !s.mlp_bias,
             "hf::save_pretrained: Qwen3ForCausalLM has q_norm/k_norm, and biases on all of q, k, v, o or on none of them");
  nlohmann::json j = llama_family_config(s, "qwen3");
  j["attention_bias"] = s.qkv_bias;
  write_sliding_window(s, j);
  return j;
}

}  // namespace

Architecture qwen2_architecture() {
  return {"Qwen2ForCausalLM", qwen2_spec, llama_family_tensors, {"rotary_emb.inv_freq"}, qwen2_config, {"q_proj", "v_proj"}};
}

Architecture qwen3_architecture() {
  return {"Qwen3ForCausalLM", qwen3_spec, llama_family_tensors, {"rotary_emb.inv_freq"}, qwen3_config, {"q_proj", "v_proj"}};
}

}  // namespace kiln::hf::detail
