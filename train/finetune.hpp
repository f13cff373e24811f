#pragma once
// Fine-tuning a Hugging Face model directory: the engine of `kiln train --init-from MODEL_DIR`
// (docs/lora.md). The model comes from hf::load_causal_lm; the data is a token file or a text file
// tokenized with the model's own tokenizer (text::Tokenizer, BOS/EOS as the tokenizer adds them);
// train.json's "lora" (or the --lora-* flags) puts LoRA adapters on the matching Linears and trains
// only them (r 0: every parameter). The loop is train_gpt's (kiln::fit: the schedule, clipping, JSONL
// log, checkpoints and resume, data parallelism under mpirun); with LoRA the adapter is written in
// PEFT's layout to --save DIR at the end and to CHECKPOINT.adapter/ with every checkpoint.
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

// A kiln::fit callback writing the LoRA adapter to CHECKPOINT.adapter/ (PEFT's layout) at every
// checkpoint step; a no-op without LoRA, a checkpoint path or checkpoint_every, or off the main process.
template <Backend B>
KILN_API Callback lora_checkpoints(const nn::Module<B>& model, const TrainConfig& tc, const std::string& checkpoint_path, bool main);

}  // namespace kiln
#pragma GCC visibility pop
