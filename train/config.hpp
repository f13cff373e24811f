#pragma once
// model.json and train.json (docs/specs.md §3, §4). Every key is optional; an unknown key, a wrong type
// or an invalid value is a kiln::Error naming the file, the key and the valid keys or values.
// Nested objects (optimizer, schedule) replace the defaults wholesale, as in the reference; keys
// missing inside them take the reference's defaults.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // users who call to_json/from_json include <nlohmann/json.hpp>

#include "kiln/nn/config.hpp"
#include "kiln/optim/schedule.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct OptimizerConfig {
  // adamw | adam | sgd | rmsprop | adagrad | lion | adafactor (train.json: "name", or "type")
  std::string name = "adamw";
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.0;   // sgd
  double dampening = 0.0;  // sgd
  bool nesterov = false;   // sgd
  // The optimizers of optim/rmsprop.hpp, lion.hpp, adafactor.hpp (kiln's own: the reference has none of them)
  double alpha = 0.99;                     // rmsprop (momentum above, eps above)
  bool centered = false;                   // rmsprop
  double lr_decay = 0.0;                   // adagrad (eps above)
  double initial_accumulator_value = 0.0;  // adagrad
  double beta2_decay = -0.8;               // adafactor
  std::optional<double> eps1{};            // adafactor (unset: the dtype's machine epsilon)
  double eps2 = 1e-3;                      // adafactor
  double d = 1.0;                          // adafactor: update clipping threshold
};

// "ema": {"decay": 0.999, "warmup": false}: an exponential moving average of the weights
// (optim/ema.hpp), updated after every optimizer step, used for evaluation, saved in checkpoints.
// "scheduler": {"type": ..., its options}: a scheduler object of optim/scheduler.hpp stepped after
// every optimizer step (instead of "schedule"), with torch's option names and defaults:
//   step (step_size, gamma 0.1) · multistep (milestones, gamma 0.1) · exponential (gamma) ·
//   cosine (T_max = steps, eta_min 0) · cosine_warm_restarts (T_0, T_mult 1, eta_min 0) ·
//   linear (start_factor 1/3, end_factor 1, total_iters 5) · onecycle (max_lr = the optimizer's lr,
//   total_steps = steps, pct_start 0.3, anneal_strategy "cos", div_factor 25, final_div_factor 1e4,
//   three_phase false, cycle_momentum true, base_momentum 0.85, max_momentum 0.95)
struct SchedulerConfig {
  std::string type;
  int64_t step_size = 0;
  double gamma = 0.1;
  std::vector<int64_t> milestones{};
  int64_t T_max = 0;  // 0: steps
  double eta_min = 0.0;
  int64_t T_0 = 0, T_mult = 1;
  double start_factor = 1.0 / 3, end_factor = 1.0;
  int64_t total_iters = 5;
  double max_lr = 0.0;      // 0: the optimizer's lr
  int64_t total_steps = 0;  // 0: steps
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";
  double div_factor = 25.0, final_div_factor = 1e4;
  bool three_phase = false, cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95;
};

struct EmaConfig {
  double decay = 0.999;
  bool warmup = false;
};

using ScheduleConfig = LrSchedule;

// LoRA fine-tuning (docs/lora.md; `kiln train --init-from MODEL_DIR`): the "lora" object of train.json.
struct LoraTrainConfig {
  int64_t r = 0;  // 0: no adapters (every parameter trains)
  double alpha = 16.0;
  double dropout = 0.0;
  // Names or globs, as nn::LoraOptions; empty: the model's default (nn::default_lora_targets, PEFT's:
  // c_attn on GPT-2, q_proj and v_proj on Llama, Mistral, Qwen2, Qwen3 and kiln's GPT).
  std::vector<std::string> target_modules;
};

struct TrainConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 64;
  int64_t steps = 20;
  double grad_clip = 1.0;  // 0 = off
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  std::optional<EmaConfig> ema;              // none unless train.json has "ema"
  std::optional<SchedulerConfig> scheduler;  // none unless train.json has "scheduler" (then no "schedule")
  // kiln's own keys (the reference ignores none of these because it has none of them)
  int64_t eval_every = 0;  // 0 = never
  int64_t eval_batches = 8;
  bool eval_at_start = false;          // with eval_every > 0: also evaluate before the first step (FitOptions::eval_at_start)
  int64_t checkpoint_every = 0;        // 0 = only at the end (when --checkpoint is given)
  int64_t grad_accum = 1;              // micro-batches of batch_size per step (batch s·grad_accum + j of the data)
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
  // The LM head and its cross-entropy fused (nn::linear_cross_entropy: no [B·T, vocab] logits kept): 0
  // where the logits would exceed nn::kLinearCrossEntropyChunkElements (2^25), in chunks of rows that
  // stay under it; N > 0 always, N rows per chunk; -1 never (the logits made whole, then the loss).
  int64_t loss_chunk_rows = 0;
  // The rows per chunk of the fused LM head and loss for a step over `tokens` token positions and a
  // vocabulary of `vocab`; 0: not fused (the logits made whole).
  int64_t loss_chunk(int64_t tokens, int64_t vocab) const;
  // The line kiln train prints before the first step where it fuses them (empty where it does not).
  std::string loss_chunk_note(int64_t tokens, int64_t vocab) const;
  // Rows read the token data's windows in a seeded order, every window once per epoch (train/data.hpp);
  // false: the reference's consecutive rows (docs/specs.md §4).
  bool shuffle = false;
  // Wall seconds for the whole run (FitOptions::time_limit_s): after 23 steps the run plans the steps
  // that fit and ends its schedule with them (revised as it goes), and stops at the limit whatever the
  // plan; 0 = none.
  double time_limit_s = 0;
  // The line kiln train prints before the first step with a time limit (empty without one).
  std::string time_limit_note() const;
  LoraTrainConfig lora;  // "lora": {"r", "alpha", "dropout", "target_modules"}

  void validate() const;
  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json& j, const std::string& where = "train config");
  static TrainConfig load(const std::string& path);
};

}  // namespace kiln
#pragma GCC visibility pop
