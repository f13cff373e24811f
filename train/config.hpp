#pragma once
// model.json and train.json (SPECS.md §3, §4). Every key is optional; an unknown key, a wrong type
// or an invalid value is a kiln::Error naming the file, the key and the valid keys or values.
// Nested objects (optimizer, schedule) replace the defaults wholesale, as in the reference; keys
// missing inside them take the reference's defaults.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/schedule.hpp"

namespace kiln {

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0: = n_heads
  int64_t ffn_hidden = 0;  // 0: ceil64(8 * d_model / 3)
  int64_t max_seq_len = 256;
  std::string attention = "mha";      // mha | diff
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

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | adam | sgd
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.0;  // sgd
  double dampening = 0.0;  // sgd
  bool nesterov = false;  // sgd
};

using ScheduleConfig = LrSchedule;

struct TrainConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 64;
  int64_t steps = 20;
  double grad_clip = 1.0;  // 0 = off
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  // kiln's own keys (the reference ignores none of these because it has none of them)
  int64_t eval_every = 0;        // 0 = never
  int64_t eval_batches = 8;
  int64_t checkpoint_every = 0;  // 0 = only at the end (when --checkpoint is given)

  void validate() const;
  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json& j, const std::string& where = "train config");
  static TrainConfig load(const std::string& path);
};

// Reads a JSON file; throws naming the file on a missing file or a syntax error (with line/column).
nlohmann::json read_json_file(const std::string& path);

}  // namespace kiln
