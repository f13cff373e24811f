#pragma once
// model.json (docs/specs.md §3): the GPT family's configuration. Every key is optional; an unknown key, a
// wrong type or an invalid value is a kiln::Error naming the file, the key and the valid keys/values.
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>  // users who call to_json/from_json include <nlohmann/json.hpp>

#include "kiln/formats/json_file.hpp"  // read_json_file

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0: = n_heads
  int64_t ffn_hidden = 0;  // 0: ceil64(8 * d_model / 3)
  int64_t max_seq_len = 256;
  std::string attention = "mha";      // mha | diff | diff2
  std::string residual = "standard";  // standard | attnres_full | attnres_block
  int64_t attnres_block_size = 4;     // sublayers per block (attnres_block)
  bool rope = true;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  double norm_eps = 1e-5;
  bool diff_subln_affine = false;
  bool attnres_key_norm_affine = true;

  // n_kv_heads and ffn_hidden filled in, every value checked (throws naming the values).
  ModelConfig resolved() const;
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where = "model config");
  static ModelConfig load(const std::string& path);  // empty path: defaults
};

}  // namespace kiln
#pragma GCC visibility pop
