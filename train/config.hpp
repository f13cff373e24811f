#pragma once
// model.json and train.json (docs/specs.md §3, §4). Every key is optional; an unknown key, a wrong type
// or an invalid value is a kiln::Error naming the file, the key and the valid keys or values.
// Nested objects (optimizer, schedule) replace the defaults wholesale, as in the reference; keys
// missing inside them take the reference's defaults.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // users who call to_json/from_json include <nlohmann/json.hpp>

#include "kiln/nn/config.hpp"
#include "kiln/optim/schedule.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {


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

// LoRA fine-tuning (docs/lora.md; `kiln train --init-from MODEL_DIR`): the "lora" object of train.json.
struct LoraTrainConfig {
  int64_t r = 0;  // 0: no adapters (every parameter trains)
  double alpha = 16.0;
  double dropout = 0.0;
  std::vector<std::string> target_modules{"q_proj", "v_proj"};  // names or globs, as nn::LoraOptions
};

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
  int64_t grad_accum = 1;        // micro-batches of batch_size per step (batch s·grad_accum + j of the data)
  std::string on_nonfinite = "error";  // a non-finite loss or gradient: "error" stops, "skip" skips the step
  // Mixed precision (docs/mixed_precision.md): "f32" (off), "bf16" (autocast), "f16" (autocast with
  // dynamic loss scaling; meant for Cuda: the Cpu has no f16 matmul kernel).
  std::string precision = "f32";
  // Data parallelism (mpirun -np N kiln train; ignored in one process): ZeRO stage 0 (every rank holds
  // the whole optimizer state) or 1 (each holds 1/N: dist::ZeroOptimizer), and the gradient buckets'
  // size (dist::DDPOptions::bucket_mb).
  int64_t zero_stage = 0;
  double bucket_mb = 25;
  // Activation checkpointing (docs/memory.md): each decoder layer's activations are recomputed in
  // backward instead of kept (GPT and Hugging Face models). Same gradients; less memory, more time.
  bool activation_checkpointing = false;
  LoraTrainConfig lora;  // "lora": {"r", "alpha", "dropout", "target_modules"}

  void validate() const;
  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json& j, const std::string& where = "train config");
  static TrainConfig load(const std::string& path);
};

}  // namespace kiln
#pragma GCC visibility pop
