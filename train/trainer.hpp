#pragma once
// Training a GPT from files: the engine of `kiln train` (docs/specs.md §4–5), usable from C++ as well.
//
// Every step s: lr from the schedule; batch s of the token data; zero_grad; mean cross-entropy;
// backward; global grad norm (before clipping); clip; optimizer step; one JSONL record
// {"step","loss","lr","grad_norm","ms","tokens_per_s"} — the reference's loop, operation for operation.
//
// Checkpoints hold the weights ("model.<name>"), the optimizer state ("optim.<key>"), and in the
// metadata the completed step count, the RNG state, both configs and the data file. Batches are a
// pure function of the step, so the step is the data position: a run resumed from step k's
// checkpoint reproduces, bit for bit, the losses of a run that never stopped. Checkpoints are written
// to a temporary file, fsync'ed and renamed. SIGINT/SIGTERM finish the current step, write a
// checkpoint (when a checkpoint path is set) and stop.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/nn/gpt.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/optim/ema.hpp"
#include "kiln/optim/optimizer.hpp"
#include "kiln/optim/scheduler.hpp"
#include "kiln/train/checkpoint.hpp"
#include "kiln/train/config.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

namespace hf {
template <Backend B> class CausalLM;  // nn/hf/causal_lm.hpp
}

struct TrainOptions {
  std::string model_path;       // model.json ("" = defaults)
  std::string train_path;       // train.json ("" = defaults)
  std::string data_path;        // tokens.safetensors (required)
  std::string eval_data_path;   // held-out tokens for periodic evaluation ("" = none)
  std::string init_from;        // initial weights (safetensors, the reference's names)
  std::string save_path;        // final weights
  std::string log_path;         // JSONL metrics
  std::string checkpoint_path;  // checkpoint written every checkpoint_every steps and at the end
  std::string resume_path;      // checkpoint to resume from
  std::string device = "cpu";
  uint64_t seed = 0;
  int64_t stop_after = -1;  // stop (with a checkpoint) after this many steps in total; -1 = run to the end
  int progress = -1;        // progress bar: -1 auto (terminal), 0 off, 1 on
  bool quiet = false;
  DType dtype = DType::f32;
  bool activation_checkpointing = false;  // --activation-checkpointing: turns train.json's key on
  std::optional<double> time_limit_s{};   // --time-limit: replaces train.json's "time_limit_s"
  // --tokenizer: a model directory, tokenizer.json or tokenizer.model; --data / --eval-data may then be
  // text files, encoded with it ("" = token files only; with --init-from MODEL_DIR: the directory's)
  std::string tokenizer;
  // LoRA (docs/lora.md): replaces train.json's "lora" (the --lora-* flags) when set.
  std::optional<LoraTrainConfig> lora{};
};

struct TrainResult {
  int64_t steps_done = 0;
  std::vector<double> losses;  // of the steps run in this call
  double final_eval_loss = -1;
  bool interrupted = false;
};

template <Backend B> KILN_API TrainResult train_gpt(const TrainOptions& o);
// Dispatches on o.device.
TrainResult train_gpt(const TrainOptions& o);

// What train.json asks for, on any model's parameters (train_gpt and finetune_causal_lm build theirs
// here): the optimizer of "optimizer" (parameter groups with and without weight decay; sharded over
// the ranks, ZeRO-1, when `zero`), the scheduler object of "scheduler" (null without one) and the EMA
// of "ema" (null without one).
template <Backend B>
KILN_API std::unique_ptr<optim::Optimizer<B>> make_optimizer(const nn::Module<B>& model, const OptimizerConfig& o, bool zero);
template <Backend B> KILN_API std::shared_ptr<optim::LRScheduler> make_scheduler(optim::Optimizer<B>& opt, const TrainConfig& tc);
template <Backend B> KILN_API std::shared_ptr<optim::EMA<B>> make_ema(const nn::Module<B>& model, const TrainConfig& tc);

// Checkpoint I/O, for `kiln train --resume`, `kiln sample` and `kiln inspect`. save_checkpoint writes
// what kiln::fit's checkpoints of IndexedBatches data hold (checkpoint_metadata in train/loop.hpp: the
// optimizer's kind beside its state, grad_accum), so `kiln train --resume` continues from it bit for bit.
template <Backend B> KILN_API void save_checkpoint(const std::string& path, const nn::GPT<B>& model, const optim::Optimizer<B>* opt,
                                                   int64_t step, const TrainConfig& t, const std::string& data_path);

// Loads a model from a checkpoint or a weights file (then model_json gives the config).
template <Backend B> KILN_API std::shared_ptr<nn::GPT<B>> load_gpt(const std::string& path, const std::string& model_json = "");

// A language model's mean cross-entropy on ids x and targets y (nn::GPT, hf::CausalLM): with chunk_rows
// > 0 through model.loss (the LM head and loss fused, nn::linear_cross_entropy, in chunks of that many
// rows), with 0 the logits [.., vocab] made whole and nn::cross_entropy. kiln train's steps take
// chunk_rows from TrainConfig::loss_chunk, evaluate from the automatic choice (nn::logits_exceed_chunk).
template <Backend B, class Model>
Var<B> lm_loss(const Model& model, int64_t vocab, const Tensor<B>& x, const Tensor<B>& y, int64_t chunk_rows) {
  if (chunk_rows > 0) return model.loss(x, y, {.chunk_rows = chunk_rows});
  return nn::cross_entropy(model.forward(x).reshape({-1, vocab}), y.reshape({-1}));
}

// Mean cross-entropy of `batches` batches of held-out data (under NoGrad), the forward under autocast
// to `precision` (f32: none), as kiln::fit evaluates a model trained with "precision".
template <Backend B> KILN_API double evaluate(const nn::GPT<B>& model, const class TokenData& data, int64_t batches, int64_t batch_size,
                                              int64_t seq_len, DType precision = DType::f32);
// The same for a Hugging Face model (hf::load_causal_lm, with a LoRA adapter loaded or not): `kiln eval`
// on a model directory.
template <Backend B> KILN_API double evaluate(const hf::CausalLM<B>& model, const class TokenData& data, int64_t batches,
                                              int64_t batch_size, int64_t seq_len, DType precision = DType::f32);

}  // namespace kiln
#pragma GCC visibility pop
