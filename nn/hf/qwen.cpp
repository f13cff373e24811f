// Qwen2ForCausalLM and Qwen3ForCausalLM (transformers' models/qwen2/modeling_qwen2.py,
// models/qwen3/modeling_qwen3.py): the Llama network. Qwen2 has biases on q_proj, k_proj and v_proj
// (not o_proj). Qwen3 has an RMSNorm over each head's q and k before RoPE (q_norm, k_norm: [head_dim]
// weights, eps rms_norm_eps), Llama's attention_bias (q, k, v and o) and a head_dim of 128 when the
// config gives none. Sliding-window attention (use_sliding_window with a window shorter than the
// context) is not implemented and is an error.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

namespace {

// use_sliding_window acts from layer max_window_layers on, where the window is shorter than the
// positions (both configs' rule); layer_types' sliding entries are refused by llama_family_spec.
void refuse_sliding_window(ConfigReader& c, const Spec& s) {
  const bool sliding = c.boolean("use_sliding_window", false);
  const int64_t window = c.integer("sliding_window", 0);
  const int64_t max_window_layers = c.integer("max_window_layers", s.layers);
  if (sliding && window > 0 && window < s.max_positions && max_window_layers < s.layers)
    c.unsupported("use_sliding_window",
                  fmt::format("sliding-window attention (window {} < max_position_embeddings {} from layer {}) is not "
                              "implemented",
                              window, s.max_positions, max_window_layers));
}

Spec qwen2_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s = llama_family_spec(c, d);
  s.qkv_bias = true;
  refuse_sliding_window(c, s);
  c.finish();
  return s;
}

nlohmann::json qwen2_config(const Spec& s) {
  KILN_CHECK(s.qkv_bias && !s.o_bias && !s.mlp_bias, "hf::save_pretrained: Qwen2ForCausalLM has biases on q, k and v only");
  nlohmann::json j = llama_family_config(s, "qwen2");
  j["use_sliding_window"] = false;
  return j;
}

Spec qwen3_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s = llama_family_spec(c, d, 128);  // Qwen3Config's head_dim defaults to 128, not hidden/heads
  s.qkv_bias = s.o_bias = c.boolean("attention_bias", false);
  s.qk_norm = true;
  refuse_sliding_window(c, s);
  c.finish();
  return s;
}

nlohmann::json qwen3_config(const Spec& s) {
  KILN_CHECK(s.qk_norm && s.qkv_bias == s.o_bias && !s.mlp_bias,
             "hf::save_pretrained: Qwen3ForCausalLM has q_norm/k_norm, and biases on all of q, k, v, o or on none of them");
  nlohmann::json j = llama_family_config(s, "qwen3");
  j["attention_bias"] = s.qkv_bias;
  j["use_sliding_window"] = false;
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
