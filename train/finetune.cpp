#include "kiln/train/finetune.hpp"

#include <filesystem>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/backends/dispatch.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/nn/hf/causal_lm.hpp"
#include "kiln/nn/hf/export.hpp"
#include "kiln/nn/lora.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/text/tokenizer.hpp"
#include "kiln/train/data.hpp"
#include "kiln/train/dist_fit.hpp"
#include "kiln/train/loop.hpp"
#include "kiln/train/text.hpp"

namespace kiln {

namespace {

// A token file (safetensors with 'tokens'), or a text file encoded with --tokenizer or else the model's tokenizer.
TokenData finetune_data(const std::string& path, const TrainOptions& o, int64_t vocab) {
  if (path.ends_with(".safetensors")) return TokenData::load(path);
  const auto tok = training_tokenizer(o.tokenizer.empty() ? o.init_from : o.tokenizer, vocab);
  return TokenData::load_or_tokenize(path, &*tok);
}

}  // namespace

template <Backend B> TrainResult finetune_causal_lm(const TrainOptions& o) {
  KILN_CHECK(!o.data_path.empty(), "train: --data is required (a token file, or a text file for the model's tokenizer)");
  KILN_CHECK(o.model_path.empty(),
             "train: --model {} does not combine with --init-from {} (a model directory: its config.json is the model)", o.model_path,
             o.init_from);
  KILN_CHECK(o.dtype == DType::f32 || o.dtype == DType::f64, "train: --dtype must be f32 or f64, got {}", o.dtype);
  TrainConfig tc = TrainConfig::load(o.train_path);
  if (!o.resume_path.empty() && o.train_path.empty()) {
    // The checkpoint's train.json (read_checkpoint_info expects a GPT's model_config).
    const auto meta = safetensors::File::open(o.resume_path).metadata();
    KILN_CHECK(meta.count("kiln_checkpoint") && meta.count("train_config"),
               "train: --resume '{}' is not a checkpoint of `kiln train --init-from` (no kiln_checkpoint/train_config metadata)",
               o.resume_path);
    tc = TrainConfig::from_json(nlohmann::json::parse(meta.at("train_config")), o.resume_path + ": train_config");
  }
  tc = with_flags(o, tc);
  const int64_t bs = tc.batch_size, T = tc.seq_len;
  const Ranks ranks = ranks_of<B>(bs);
  KILN_CHECK(tc.zero_stage == 0, "train: zero_stage {} with --init-from MODEL_DIR is not implemented (use 0)", tc.zero_stage);
  // Mixed precision (docs/mixed_precision.md): f32 master weights, the step under fit's autocast scope.
  KILN_CHECK(tc.precision == "f32" || o.dtype == DType::f32,
             "train: precision \"{}\" keeps f32 master weights; it does not combine with --dtype {}", tc.precision, o.dtype);

  manual_seed(o.seed);
  auto model = hf::load_causal_lm<B>(o.init_from, {.dtype = o.dtype});
  if (!o.tokenizer.empty()) training_tokenizer(o.tokenizer, model->spec().vocab);  // checked even for token files
  TokenData data = finetune_data(o.data_path, o, model->spec().vocab);
  if (tc.shuffle) data.shuffle(o.seed);  // train.json "shuffle": windows in a seeded order per epoch
  data.check_vocab(model->spec().vocab);
  KILN_CHECK(data.size() > T, "train: '{}' has {} tokens; need more than seq_len={}", o.data_path, data.size(), T);
  if (model->max_positions() > 0)
    KILN_CHECK(T <= model->max_positions(), "train: seq_len {} exceeds the model's {} positions", T, model->max_positions());
  std::optional<TokenData> eval_data;  // --eval-data: a token file or a text file, as --data
  if (!o.eval_data_path.empty()) {
    eval_data = finetune_data(o.eval_data_path, o, model->spec().vocab);
    eval_data->check_vocab(model->spec().vocab);
    KILN_CHECK(eval_data->size() > T, "train: '{}' has {} tokens; need more than seq_len={}", o.eval_data_path, eval_data->size(), T);
  }
  const bool lora = tc.lora.r > 0;
  // --save of a full fine-tune: FILE.safetensors is the state dict (kiln names, nn::Module::load); any
  // other path a Hugging Face model directory, checked here so that a run never ends unable to save.
  const bool save_dir = !lora && !o.save_path.empty() && !o.save_path.ends_with(".safetensors");
  if (save_dir) {
    hf::require_writable(model->spec());
    std::error_code ec;
    const bool usable =
        !std::filesystem::exists(o.save_path, ec) ||
        (std::filesystem::is_directory(o.save_path, ec) && (std::filesystem::is_empty(o.save_path, ec) || hf::is_model_dir(o.save_path)));
    KILN_CHECK(usable,
               "train: --save {} is neither absent, an empty directory nor a Hugging Face model directory: a full fine-tune of a model "
               "directory writes one there (FILE.safetensors writes kiln's state dict instead)",
               o.save_path);
  }
  if (lora && tc.lora.target_modules.empty()) tc.lora.target_modules = nn::default_lora_targets(*model);  // PEFT's for the architecture
  if (lora)
    nn::apply_lora(*model, {.r = tc.lora.r,
                            .alpha = tc.lora.alpha,
                            .dropout = tc.lora.dropout,
                            .target_modules = tc.lora.target_modules,
                            .base_model_name_or_path = o.init_from});
  model->set_activation_checkpointing(tc.activation_checkpointing);  // one segment per decoder layer (docs/memory.md)
  std::unique_ptr<dist::DistributedDataParallel<B>> ddp;
  if (ranks.parallel) ddp = std::make_unique<dist::DistributedDataParallel<B>>(*model, dist::DDPOptions{.bucket_mb = tc.bucket_mb});
  const auto opt = make_optimizer(*model, tc.optimizer, false);  // zero_stage 1 is refused above

  const int64_t V = model->spec().vocab;
  auto step = [&](const std::pair<Tensor<B>, Tensor<B>>& b) {
    const int64_t n = b.first.size(0);
    const Var<B> loss = lm_loss<B>(*model, V, b.first, b.second, tc.loss_chunk(b.first.numel(), V));
    return StepOutput<B>{.loss = loss, .metrics = {}, .samples = n, .tokens = n * T, .flops = 0};
  };
  auto train_batch = [&](int64_t i) { return data.rows<B>(i, bs, T, ranks.rows.start, ranks.rows.count); };
  const IndexedBatches<decltype(train_batch)> train{
      .batch = train_batch, .count = 0, .fingerprint = fmt::format("{} tokens, batches of {}x{}", data.size(), bs, T)};
  auto eval_batch = [&](int64_t i) { return eval_data->batch<B>(i, bs, T); };
  const IndexedBatches<decltype(eval_batch)> eval{.batch = eval_batch, .count = tc.eval_batches, .fingerprint = ""};
  const bool with_eval = eval_data && tc.eval_every > 0;
  FitOptions fo = fit_options(o, tc, ranks.main, ddp ? dist::fit_hooks(*ddp) : FitHooks{},
                              {{"train_config", tc.to_json().dump()}, {"data", o.data_path}, {"init_from", o.init_from}});
  fo.callbacks = {lora_checkpoints(*model, tc, o.checkpoint_path, ranks.main)};
  fo.scheduler = make_scheduler(*opt, tc);
  fo.ema = make_ema(*model, tc);
  if (!o.quiet && ranks.main) {
    int64_t trainable = 0;
    for (const auto& [n, p] : model->named_parameters()) trainable += p.requires_grad() ? p.numel() : 0;
    fmt::print("kiln train: {} from {}: {} parameters, {} trainable{}, {}·{} tokens/step, {} tokens, steps {}, device {}{}\n",
               model->spec().architecture, o.init_from, model->num_parameters(), trainable,
               lora ? fmt::format(" (LoRA r {} on {})", tc.lora.r, fmt::join(tc.lora.target_modules, ",")) : std::string(), bs, T,
               data.size(), tc.steps, B::name,
               tc.precision == "f32" ? std::string() : fmt::format(", precision {} (autocast)", tc.precision));
  }
  if (!o.quiet && ranks.main && tc.activation_checkpointing)
    fmt::print("kiln train: activation checkpointing on (layer activations recomputed in backward)\n");
  if (!o.quiet && ranks.main) fmt::print("{}{}", tc.loss_chunk_note(ranks.rows.count * T, model->spec().vocab), tc.time_limit_note());
  const FitResult r = with_eval ? fit(*model, *opt, train, eval, step, fo) : fit(*model, *opt, train, step, fo);
  TrainResult res;
  res.steps_done = r.steps_done;
  res.losses = r.losses;
  res.final_eval_loss = r.eval_losses.empty() ? -1 : r.eval_losses.back();
  res.interrupted = r.interrupted;
  if (ranks.main) {
    if (lora && !o.checkpoint_path.empty()) nn::save_lora(*model, o.checkpoint_path + ".adapter");  // beside the final checkpoint
    if (!o.save_path.empty()) {
      if (lora)
        nn::save_lora(*model, o.save_path);
      else if (save_dir)  // in the parameters' dtype, as transformers' save_pretrained; the tokenizer beside it
        hf::save_pretrained(*model, o.save_path,
                            {.dtype = o.dtype == DType::f64 ? DType::f32 : o.dtype,
                             .tokenizer_from = hf::has_tokenizer_files(o.init_from) ? o.init_from : std::string(),
                             .overwrite = true});
      else
        model->save(o.save_path);
    }
  }
  if (ranks.parallel) dist::barrier();
  return res;
}

template <Backend B>
Callback lora_checkpoints(const nn::Module<B>& model, const TrainConfig& tc, const std::string& checkpoint_path, bool main) {
  if (tc.lora.r == 0 || checkpoint_path.empty() || tc.checkpoint_every == 0 || !main) return {};
  // fit writes a checkpoint after step s when (s + 1) % checkpoint_every == 0: the adapter of the same step.
  return {.on_step = [&model, every = tc.checkpoint_every, dir = checkpoint_path + ".adapter"](FitState& st) {
    if ((st.step + 1) % every == 0) nn::save_lora(model, dir);
  }};
}

TrainResult finetune_causal_lm(const TrainOptions& o) {
  return dispatch(o.device, [&]<Backend B>() { return finetune_causal_lm<B>(o); });
}

#define KILN_INST(B)                                               \
  template TrainResult finetune_causal_lm<B>(const TrainOptions&); \
  template Callback lora_checkpoints<B>(const nn::Module<B>&, const TrainConfig&, const std::string&, bool);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln
