// GPT2LMHeadModel (transformers' models/gpt2/modeling_gpt2.py): learned positions, pre-LayerNorm with
// biases, fused c_attn, GELU (tanh) MLP, tied head. Its Conv1D layers store weights [in, out]:
// transposed here to Linear's [out, in]; c_attn's [D, 3D] is q, k, v side by side.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/nn/hf/architecture.hpp"

namespace kiln::hf::detail {

namespace {

Spec gpt2_spec(const ModelDir& d) {
  ConfigReader c(d);
  Spec s;
  s.architecture = d.architecture();
  s.vocab = c.integer("vocab_size");
  s.max_positions = c.integer("n_positions");
  s.hidden = c.integer("n_embd");
  s.layers = c.integer("n_layer");
  s.heads = s.kv_heads = c.integer("n_head");
  KILN_CHECK(s.heads > 0 && s.hidden % s.heads == 0, "{}: n_embd {} is not a multiple of n_head {}", c.path(), s.hidden, s.heads);
  s.head_dim = s.hidden / s.heads;
  s.intermediate = c.integer("n_inner", 4 * s.hidden);
  s.norm = NormKind::layer;
  s.norm_eps = c.number("layer_norm_epsilon", 1e-5);
  s.mlp = MlpKind::fc;
  s.act = read_act(c, "activation_function", "gelu_new");
  s.qkv_bias = s.o_bias = s.mlp_bias = true;
  s.learned_positions = true;
  s.tie_embeddings = c.boolean("tie_word_embeddings", true);
  if (!c.boolean("scale_attn_weights", true)) c.unsupported("scale_attn_weights", "unscaled attention scores are not implemented");
  if (c.boolean("scale_attn_by_inverse_layer_idx", false))
    c.unsupported("scale_attn_by_inverse_layer_idx", "scores scaled by the layer index are not implemented");
  if (const auto* n = c.raw("n_ctx"))  // old configs: the context, equal to n_positions
    if (!(n->is_number_integer() && n->get<int64_t>() == s.max_positions)) c.unsupported("n_ctx", "must equal n_positions");
  // reorder_and_upcast_attn only computes the scores in f32 (kiln's f32 path always does); the rest is
  // dropout and the double-heads model's summary head.
  c.accept({"reorder_and_upcast_attn", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
            "summary_proj_to_labels", "summary_first_dropout"});
  c.finish();
  return s;
}

std::map<std::string, TensorSource> gpt2_tensors(const Spec& s, const ModelDir* d) {
  // save_pretrained of GPT2LMHeadModel prefixes "transformer."; the original OpenAI export does not.
  const std::string p = d && d->contains("wte.weight") && !d->contains("transformer.wte.weight") ? "" : "transformer.";
  const int64_t D = s.hidden, I = s.intermediate;
  using Op = TensorSource::Op;
  std::map<std::string, TensorSource> t;
  t["embed.weight"] = {p + "wte.weight", {s.vocab, D}};
  t["pos_embed.weight"] = {p + "wpe.weight", {s.max_positions, D}};
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string k = fmt::format("layers.{}.", i), h = fmt::format("{}h.{}.", p, i);
    t[k + "attn_norm.weight"] = {h + "ln_1.weight", {D}};
    t[k + "attn_norm.bias"] = {h + "ln_1.bias", {D}};
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int64_t j = 0; j < 3; ++j) {
      t[k + "attn." + qkv[j] + ".weight"] = {h + "attn.c_attn.weight", {D, 3 * D}, Op::transpose, j, 3};
      t[k + "attn." + qkv[j] + ".bias"] = {h + "attn.c_attn.bias", {3 * D}, Op::copy, j, 3};
    }
    t[k + "attn.o_proj.weight"] = {h + "attn.c_proj.weight", {D, D}, Op::transpose};
    t[k + "attn.o_proj.bias"] = {h + "attn.c_proj.bias", {D}};
    t[k + "mlp_norm.weight"] = {h + "ln_2.weight", {D}};
    t[k + "mlp_norm.bias"] = {h + "ln_2.bias", {D}};
    t[k + "mlp.fc.weight"] = {h + "mlp.c_fc.weight", {D, I}, Op::transpose};
    t[k + "mlp.fc.bias"] = {h + "mlp.c_fc.bias", {I}};
    t[k + "mlp.proj.weight"] = {h + "mlp.c_proj.weight", {I, D}, Op::transpose};
    t[k + "mlp.proj.bias"] = {h + "mlp.c_proj.bias", {D}};
  }
  t["norm.weight"] = {p + "ln_f.weight", {D}};
  t["norm.bias"] = {p + "ln_f.bias", {D}};
  t["lm_head.weight"] = {"lm_head.weight", {s.vocab, D}};
  return t;
}

nlohmann::json gpt2_config(const Spec& s) {
  KILN_CHECK(s.norm == NormKind::layer && s.mlp == MlpKind::fc && s.learned_positions && s.heads == s.kv_heads &&
                 s.head_dim * s.heads == s.hidden && s.qkv_bias && s.o_bias && s.mlp_bias,
             "hf::save_pretrained: this decoder is not GPT2LMHeadModel's shape (LayerNorm, fc MLP, learned positions, MHA, biases)");
  nlohmann::json j;
  j["architectures"] = {s.architecture};
  j["model_type"] = "gpt2";
  j["vocab_size"] = s.vocab;
  j["n_positions"] = s.max_positions;
  j["n_embd"] = s.hidden;
  j["n_layer"] = s.layers;
  j["n_head"] = s.heads;
  j["n_inner"] = s.intermediate;
  j["layer_norm_epsilon"] = s.norm_eps;
  j["activation_function"] = s.act == Act::gelu_tanh ? "gelu_new" : act_name(s.act);  // GPT-2's own name for the tanh GELU
  j["tie_word_embeddings"] = s.tie_embeddings;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  return j;
}

}  // namespace

Architecture gpt2_architecture() {
  return {"GPT2LMHeadModel", gpt2_spec, gpt2_tensors, {".attn.bias", ".attn.masked_bias"}, gpt2_config, {"c_attn"}};
}

}  // namespace kiln::hf::detail
