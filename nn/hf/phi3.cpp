// Phi3ForCausalLM (transformers' models/phi3 as of 5.24: Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini):
// the Llama network with q, k and v fused in one qkv_proj ([H·hd + 2·Hkv·hd, D], q first) and gate and up
// in one gate_up_proj ([2I, D], gate first), no biases, partial RoPE (partial_rotary_factor: the first
// int(hd · factor) values of each head turn, the rest pass through), Phi-3's long-context RoPE
// ("longrope", which its config class also makes of "su" and "yarn": short_factor, or long_factor in a
// forward that reaches past original_max_position_embeddings) and an optional sliding window in every layer.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

namespace {

Spec phi3_spec(const ModelDir& d) {
  ConfigReader c(d);
  // Phi3Config renames rope types "su" and "yarn" to "longrope", and its original_max_position_embeddings
  // (4096 by default) is the one llama3, yarn and longrope scale from, whatever the RoPE object says.
  const auto original = static_cast<double>(c.integer("original_max_position_embeddings", 4096));
  KILN_CHECK(original > 0, "{}: field 'original_max_position_embeddings' must be positive, got {}", c.path(), original);
  Spec s = llama_family_spec(c, d,
                             {.max_positions = 4096,
                              .partial_rotary = true,
                              .rope_rules = {.aliases = {{"su", "longrope"}, {"yarn", "longrope"}}, .original_max_positions = original}});
  // Phi3Config: no window unless sliding_window is set; then in every layer.
  if (c.raw("sliding_window") != nullptr) {
    s.sliding_window = c.integer("sliding_window");
    KILN_CHECK(s.sliding_window > 0, "{}: field 'sliding_window' must be a positive integer or null, got {}", c.path(), s.sliding_window);
  }
  if (std::find(s.sliding_layers.begin(), s.sliding_layers.end(), true) != s.sliding_layers.end())
    c.unsupported("layer_types", "Phi3ForCausalLM's window, when set, acts in every layer");
  s.sliding_layers.assign(s.sliding_window > 0 ? static_cast<size_t>(s.layers) : 0, true);
  if (s.rope.type == "longrope") s.rebuild_caches_at = static_cast<int64_t>(s.rope.original_max_position_embeddings);
  c.accept({"resid_pdrop", "embd_pdrop"});
  c.finish();
  return s;
}

std::map<std::string, TensorSource> phi3_tensors(const Spec& s, const ModelDir* d) {
  std::map<std::string, TensorSource> t = llama_family_tensors(s, d);
  const int64_t D = s.hidden, I = s.intermediate, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string k = fmt::format("layers.{}.", i), h = fmt::format("model.layers.{}.", i);
    const std::string qkv = h + "self_attn.qkv_proj.weight", gate_up = h + "mlp.gate_up_proj.weight";
    const Shape qkv_shape{q + 2 * kv, D};
    const auto slice = [&](const char* name, int64_t part, int64_t row0, int64_t rows) {
      TensorSource& src = t[k + "attn." + name + ".weight"];  // the Llama entry (q, k: rope_rows with their heads)
      src.name = qkv;
      src.shape = qkv_shape;
      src.part = part, src.parts = 3, src.row0 = row0, src.rows = rows;
    };
    slice("q_proj", 0, 0, q);
    slice("k_proj", 1, q, kv);
    slice("v_proj", 2, q + kv, kv);
    t[k + "mlp.gate_proj.weight"] = {gate_up, {2 * I, D}, TensorSource::Op::copy, 0, 2};
    t[k + "mlp.up_proj.weight"] = {gate_up, {2 * I, D}, TensorSource::Op::copy, 1, 2};
  }
  return t;
}

nlohmann::json phi3_config(const Spec& s) {
  KILN_CHECK(!s.qkv_bias && !s.o_bias && !s.mlp_bias, "hf::save_pretrained: Phi3ForCausalLM has no biases");
  KILN_CHECK(s.sliding_window == 0 || std::find(s.sliding_layers.begin(), s.sliding_layers.end(), false) == s.sliding_layers.end(),
             "hf::save_pretrained: Phi3ForCausalLM's sliding window acts in every layer or in none");
  nlohmann::json j = llama_family_config(s, "phi3");
  j["sliding_window"] = s.sliding_window > 0 ? nlohmann::json(s.sliding_window) : nlohmann::json(nullptr);
  return j;
}

}  // namespace

Architecture phi3_architecture() {
  // PEFT has no default LoRA targets for phi3: nn::default_lora_targets asks for target_modules, as PEFT does.
  return {"Phi3ForCausalLM", phi3_spec, phi3_tensors, {"rotary_emb.inv_freq"}, phi3_config, {}};
}

}  // namespace kiln::hf::detail
