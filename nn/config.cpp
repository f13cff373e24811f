#include "kiln/nn/config.hpp"

#include "kiln/formats/json_fields.hpp"
#include "kiln/formats/json_file.hpp"

namespace kiln {

using json = nlohmann::json;
using detail::Fields;
using detail::one_of;

// ---------------------------------------------------------------------------------------- model
ModelConfig ModelConfig::from_json(const json& j, const std::string& where) {
  ModelConfig c;
  Fields f(j, where);
  f.get("vocab_size", c.vocab_size);
  f.get("d_model", c.d_model);
  f.get("n_layers", c.n_layers);
  f.get("n_heads", c.n_heads);
  f.get("n_kv_heads", c.n_kv_heads);
  f.get("ffn_hidden", c.ffn_hidden);
  f.get("max_seq_len", c.max_seq_len);
  f.get("attention", c.attention);
  f.get("residual", c.residual);
  f.get("attnres_block_size", c.attnres_block_size);
  f.get("rope", c.rope);
  f.get("rope_theta", c.rope_theta);
  f.get("tie_embeddings", c.tie_embeddings);
  f.get("norm_eps", c.norm_eps);
  f.get("diff_subln_affine", c.diff_subln_affine);
  f.get("attnres_key_norm_affine", c.attnres_key_norm_affine);
  f.finish();
  (void)c.resolved();  // validate now, so the error names the file
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  if (path.empty()) return ModelConfig{};
  return from_json(read_json_file(path), path);
}

ModelConfig ModelConfig::resolved() const {
  ModelConfig c = *this;
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  if (c.ffn_hidden == 0) c.ffn_hidden = ((8 * c.d_model / 3) + 63) / 64 * 64;
  const char* w = "model config";
  one_of(w, "attention", c.attention, {"mha", "diff", "diff2"});
  one_of(w, "residual", c.residual, {"standard", "attnres_full", "attnres_block"});
  KILN_CHECK(c.vocab_size >= 1, "{}: vocab_size must be >= 1, got {}", w, c.vocab_size);
  KILN_CHECK(c.d_model >= 1, "{}: d_model must be >= 1, got {}", w, c.d_model);
  KILN_CHECK(c.n_layers >= 0, "{}: n_layers must be >= 0, got {}", w, c.n_layers);
  KILN_CHECK(c.n_heads >= 1, "{}: n_heads must be >= 1, got {}", w, c.n_heads);
  if (c.attention == "diff2")  // the attention runs on 2·n_heads query heads (docs/specs.md §1b)
    KILN_CHECK(c.n_kv_heads >= 1 && (2 * c.n_heads) % c.n_kv_heads == 0,
               "{}: attention \"diff2\" needs 2·n_heads ({}) to be a multiple of n_kv_heads ({})", w, 2 * c.n_heads, c.n_kv_heads);
  else
    KILN_CHECK(c.n_kv_heads >= 1 && c.n_heads % c.n_kv_heads == 0, "{}: n_heads ({}) must be a multiple of n_kv_heads ({})", w, c.n_heads,
               c.n_kv_heads);
  KILN_CHECK(c.ffn_hidden >= 1, "{}: ffn_hidden must be >= 1, got {}", w, c.ffn_hidden);
  KILN_CHECK(c.max_seq_len >= 1, "{}: max_seq_len must be >= 1, got {}", w, c.max_seq_len);
  KILN_CHECK(c.norm_eps > 0, "{}: norm_eps must be > 0, got {}", w, c.norm_eps);
  KILN_CHECK(c.rope_theta > 0, "{}: rope_theta must be > 0, got {}", w, c.rope_theta);
  KILN_CHECK(c.attnres_block_size >= 1, "{}: attnres_block_size must be >= 1, got {}", w, c.attnres_block_size);
  if (c.attention == "diff") {
    KILN_CHECK(c.d_model % (2 * c.n_heads) == 0, "{}: attention \"diff\" needs d_model ({}) divisible by 2·n_heads ({})", w, c.d_model,
               2 * c.n_heads);
    if (c.rope)
      KILN_CHECK((c.d_model / c.n_heads / 2) % 2 == 0, "{}: RoPE needs an even sub-head width; d_model / n_heads / 2 = {} is odd", w,
                 c.d_model / c.n_heads / 2);
  } else {
    KILN_CHECK(c.d_model % c.n_heads == 0, "{}: d_model ({}) must be divisible by n_heads ({})", w, c.d_model, c.n_heads);
    if (c.rope)
      KILN_CHECK((c.d_model / c.n_heads) % 2 == 0, "{}: RoPE needs an even head width; d_model / n_heads = {} is odd", w,
                 c.d_model / c.n_heads);
  }
  return c;
}

json ModelConfig::to_json() const {
  const ModelConfig c = resolved();
  return {{"vocab_size", c.vocab_size},
          {"d_model", c.d_model},
          {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads},
          {"ffn_hidden", c.ffn_hidden},
          {"max_seq_len", c.max_seq_len},
          {"attention", c.attention},
          {"residual", c.residual},
          {"attnres_block_size", c.attnres_block_size},
          {"rope", c.rope},
          {"rope_theta", c.rope_theta},
          {"tie_embeddings", c.tie_embeddings},
          {"norm_eps", c.norm_eps},
          {"diff_subln_affine", c.diff_subln_affine},
          {"attnres_key_norm_affine", c.attnres_key_norm_affine}};
}

}  // namespace kiln
