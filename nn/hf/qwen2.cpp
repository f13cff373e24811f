// Qwen2ForCausalLM (transformers' models/qwen2/modeling_qwen2.py): the Llama network with biases on
// q_proj, k_proj and v_proj (not o_proj). Sliding-window attention (use_sliding_window with a window
// shorter than the context) is not implemented and is an error.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

Spec llama_family_spec(ConfigReader& c, const ModelDir& d);
std::map<std::string, TensorSource> llama_family_tensors(const Spec& s, const ModelDir* d);
nlohmann::json llama_family_config(const Spec& s, const char* model_type);

namespace {

Spec qwen2_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s = llama_family_spec(c, d);
  s.qkv_bias = true;
  const bool sliding = c.boolean("use_sliding_window", false);
  const int64_t window = c.integer("sliding_window", 0);
  const int64_t max_window_layers = c.integer("max_window_layers", s.layers);
  if (sliding && window > 0 && window < s.max_positions && max_window_layers < s.layers)
    c.unsupported("use_sliding_window",
                  fmt::format("sliding-window attention (window {} < max_position_embeddings {} from layer {}) is not "
                              "implemented",
                              window, s.max_positions, max_window_layers));
  c.finish();
  return s;
}

nlohmann::json qwen2_config(const Spec& s) {
  KILN_CHECK(s.qkv_bias && !s.o_bias && !s.mlp_bias, "hf::save_pretrained: Qwen2ForCausalLM has biases on q, k and v only");
  nlohmann::json j = llama_family_config(s, "qwen2");
  j["use_sliding_window"] = false;
  return j;
}

}  // namespace

Architecture qwen2_architecture() {
  return {"Qwen2ForCausalLM", qwen2_spec, llama_family_tensors, {"rotary_emb.inv_freq"}, qwen2_config, {"q_proj", "v_proj"}};
}

}  // namespace kiln::hf::detail
