#pragma once
// Fine-tuning a Hugging Face model directory: the engine of `kiln train --init-from MODEL_DIR`
// (docs/lora.md). The model comes from hf::load_causal_lm; the data is a token file or a text file
// tokenized with the model's own tokenizer (text::Tokenizer, BOS/EOS as the tokenizer adds them);
// train.json's "lora" (or the --lora-* flags) puts LoRA adapters on the matching Linears and trains
// only them (r 0: every parameter). The loop is train_gpt's (kiln::fit: the schedule, clipping, JSONL
// log, checkpoints and resume, data parallelism under mpirun); with LoRA the adapter is written in
// PEFT's layout to --save DIR at the end and to CHECKPOINT.adapter/ with every checkpoint.
#include "kiln/dist/process_group.hpp"
#include "kiln/train/loop.hpp"
#include "kiln/train/trainer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// o.init_from: the model directory; o.model_path must be empty (the directory's config.json is the model).
template <Backend B> KILN_API TrainResult finetune_causal_lm(const TrainOptions& o);
// Dispatches on o.device.
KILN_API TrainResult finetune_causal_lm(const TrainOptions& o);

// The kiln::fit options of a `kiln train` run, for both engines (train_gpt and finetune_causal_lm):
// train.json's steps, accumulation, clipping, non-finite policy, precision, evaluation cadence,
// checkpoints and schedule, the command line's paths, progress and stop, and `metadata` in the
// checkpoints. Callbacks, the scheduler object and the EMA are the caller's to add.
KILN_API FitOptions fit_options(const TrainOptions& o, const TrainConfig& tc, bool main, FitHooks hooks,
                                std::map<std::string, std::string> metadata);
// train.json's keys that command-line flags override (--lora-*, --activation-checkpointing,
// --time-limit), set from `o`, the result validated.
KILN_API TrainConfig with_flags(const TrainOptions& o, TrainConfig tc);

// Data parallelism (docs/distributed.md), for both engines: under mpirun/srun every rank takes its
// contiguous share of each batch's rows, DistributedDataParallel averages the gradients, rank 0 logs,
// evaluates and writes.
struct Ranks {
  bool parallel = false;  // more than one process
  int count = 1;          // the world size
  bool main = true;       // rank 0, or the one process
  dist::RowSlice rows;    // this rank's rows of every batch
};
// This process's share of batches of `bs` rows: a kiln::Error when bs does not divide among the ranks.
// With B = Cuda and several ranks, also selects this rank's GPU (its local rank, round robin).
template <Backend B> KILN_API Ranks ranks_of(int64_t bs);

// A kiln::fit callback writing the LoRA adapter to CHECKPOINT.adapter/ (PEFT's layout) at every
// checkpoint step; a no-op without LoRA, a checkpoint path or checkpoint_every, or off the main process.
template <Backend B>
KILN_API Callback lora_checkpoints(const nn::Module<B>& model, const TrainConfig& tc, const std::string& checkpoint_path, bool main);

}  // namespace kiln
#pragma GCC visibility pop
