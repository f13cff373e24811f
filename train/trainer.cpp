#include "kiln/train/trainer.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "kiln/autograd/autocast.hpp"
#include "kiln/backends/dispatch.hpp"
#include "kiln/dist/zero.hpp"
#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/nn/hf/causal_lm.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/lora.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/optim/adafactor.hpp"
#include "kiln/optim/ema.hpp"
#include "kiln/optim/lion.hpp"
#include "kiln/optim/rmsprop.hpp"
#include "kiln/optim/scheduler.hpp"
#include "kiln/train/data.hpp"
#include "kiln/train/dist_fit.hpp"
#include "kiln/train/finetune.hpp"
#include "kiln/train/loop.hpp"

namespace kiln {

namespace {

using json = nlohmann::json;

}  // namespace

template <Backend B> std::unique_ptr<optim::Optimizer<B>> make_optimizer(const nn::Module<B>& model, const OptimizerConfig& o, bool zero) {
  const auto groups = optim::decay_groups<B>(model.named_parameters(), o.lr, o.weight_decay);
  if (o.name == "sgd") {
    const optim::SGDOptions so{
        .lr = o.lr, .momentum = o.momentum, .dampening = o.dampening, .weight_decay = o.weight_decay, .nesterov = o.nesterov};
    if (zero) return std::make_unique<dist::ZeroOptimizer<B>>(groups, so);
    return std::make_unique<optim::SGD<B>>(groups, so);
  }
  if (o.name == "rmsprop")
    return std::make_unique<optim::RMSprop<B>>(
        groups,
        optim::RMSpropOptions{
            .lr = o.lr, .alpha = o.alpha, .eps = o.eps, .weight_decay = o.weight_decay, .momentum = o.momentum, .centered = o.centered});
  if (o.name == "adagrad")
    return std::make_unique<optim::Adagrad<B>>(groups, optim::AdagradOptions{
                                                           .lr = o.lr,
                                                           .lr_decay = o.lr_decay,
                                                           .weight_decay = o.weight_decay,
                                                           .initial_accumulator_value = o.initial_accumulator_value,
                                                           .eps = o.eps,
                                                       });
  if (o.name == "lion")
    return std::make_unique<optim::Lion<B>>(
        groups, optim::LionOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .weight_decay = o.weight_decay});
  if (o.name == "adafactor")
    return std::make_unique<optim::Adafactor<B>>(
        groups, optim::AdafactorOptions{
                    .lr = o.lr, .beta2_decay = o.beta2_decay, .eps1 = o.eps1, .eps2 = o.eps2, .d = o.d, .weight_decay = o.weight_decay});
  const optim::AdamOptions ao{
      .lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay, .decoupled = o.name == "adamw"};
  if (zero) return std::make_unique<dist::ZeroOptimizer<B>>(groups, ao);
  return std::make_unique<optim::Adam<B>>(groups, ao);
}

// The options' zeros mean the run's steps and the optimizer's lr; the scheduler constructors check the values.
template <Backend B> std::shared_ptr<optim::LRScheduler> make_scheduler(optim::Optimizer<B>& opt, const TrainConfig& tc) {
  if (!tc.scheduler) return nullptr;
  using namespace optim;
  const SchedulerConfig& s = *tc.scheduler;
  if (s.type == "step") return std::make_shared<StepLR>(opt, s.step_size, s.gamma);
  if (s.type == "multistep") return std::make_shared<MultiStepLR>(opt, s.milestones, s.gamma);
  if (s.type == "exponential") return std::make_shared<ExponentialLR>(opt, s.gamma);
  if (s.type == "cosine") return std::make_shared<CosineAnnealingLR>(opt, s.T_max > 0 ? s.T_max : tc.steps, s.eta_min);
  if (s.type == "cosine_warm_restarts") return std::make_shared<CosineAnnealingWarmRestarts>(opt, s.T_0, s.T_mult, s.eta_min);
  if (s.type == "linear") return std::make_shared<LinearLR>(opt, s.start_factor, s.end_factor, s.total_iters);
  KILN_CHECK(s.type == "onecycle", "train: unknown scheduler type '{}'", s.type);
  const OneCycleLROptions o{
      .max_lr = {s.max_lr > 0 ? s.max_lr : tc.optimizer.lr},
      .total_steps = s.total_steps > 0 ? s.total_steps : tc.steps,
      .pct_start = s.pct_start,
      .anneal_strategy = s.anneal_strategy,
      .div_factor = s.div_factor,
      .final_div_factor = s.final_div_factor,
      .three_phase = s.three_phase,
      .cycle_momentum = s.cycle_momentum,
      .base_momentum = {s.base_momentum},
      .max_momentum = {s.max_momentum},
  };
  return std::make_shared<OneCycleLR>(opt, o);
}

template <Backend B> std::shared_ptr<optim::EMA<B>> make_ema(const nn::Module<B>& model, const TrainConfig& tc) {
  if (!tc.ema) return nullptr;
  return std::make_shared<optim::EMA<B>>(model.named_parameters(), optim::EMAOptions{.decay = tc.ema->decay, .warmup = tc.ema->warmup});
}

namespace {

// Mean cross-entropy of batches 0..batches-1 of `data` under a model whose forward(ids) gives logits [B, T, vocab];
// through its loss(ids, targets) (the fused LM head and loss) where the logits would pass one chunk.
template <Backend B, class Model> double mean_lm_loss(const Model& model, int64_t vocab, const TokenData& data, int64_t batches,
                                                      int64_t batch_size, int64_t seq_len, DType precision) {
  KILN_CHECK(batches >= 1 && batch_size >= 1 && seq_len >= 1, "evaluate: batches {}, batch_size {} and seq_len {} must be >= 1", batches,
             batch_size, seq_len);
  NoGrad ng;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const auto [x, y] = data.batch<B>(i, batch_size, seq_len);
    const autocast::Scope ac(precision);
    const int64_t chunk = nn::logits_exceed_chunk(x.numel(), vocab) ? nn::linear_cross_entropy_chunk(vocab, 0) : 0;
    total += item<double>(lm_loss<B>(model, vocab, x, y, chunk).value());
  }
  return total / static_cast<double>(batches);
}

}  // namespace

template <Backend B>
double evaluate(const nn::GPT<B>& model, const TokenData& data, int64_t batches, int64_t batch_size, int64_t seq_len, DType precision) {
  return mean_lm_loss<B>(model, model.config().vocab_size, data, batches, batch_size, seq_len, precision);
}

template <Backend B> double evaluate(const hf::CausalLM<B>& model, const TokenData& data, int64_t batches, int64_t batch_size,
                                     int64_t seq_len, DType precision) {
  return mean_lm_loss<B>(model, model.spec().vocab, data, batches, batch_size, seq_len, precision);
}

template <Backend B> void save_checkpoint(const std::string& path, const nn::GPT<B>& model, const optim::Optimizer<B>* opt, int64_t step,
                                          const TrainConfig& t, const std::string& data_path) {
  std::vector<std::pair<std::string, Tensor<B>>> ts;
  for (auto& [n, v] : model.state_dict()) ts.emplace_back("model." + n, v);
  if (opt)
    for (auto& [n, v] : opt->state_dict()) ts.emplace_back("optim." + n, v);
  // What kiln::fit's checkpoints hold (train/loop.hpp), so `kiln train --resume` continues from it:
  // the optimizer's kind beside its state (a run with another optimizer is refused), grad_accum,
  // IndexedBatches data.
  std::map<std::string, std::string> meta = checkpoint_metadata(step, t.grad_accum, opt ? opt->kind() : std::string());
  meta["data.kind"] = "indexed";
  meta["model_config"] = model.config().to_json().dump();
  meta["train_config"] = t.to_json().dump();
  meta["data"] = data_path;
  safetensors::save<B>(path, ts, meta);
}

template <Backend B> std::shared_ptr<nn::GPT<B>> load_gpt(const std::string& path, const std::string& model_json) {
  const CheckpointInfo info = read_checkpoint_info(path);
  ModelConfig cfg;
  if (!model_json.empty())
    cfg = ModelConfig::load(model_json);
  else if (info.is_checkpoint)
    cfg = info.model;
  else
    fail("'{}' is a plain weights file without a model config: pass --model model.json", path);
  const auto model = [&] {
    nn::init::SkipInit every_parameter_is_loaded_below;  // load_state_dict is strict
    return std::make_shared<nn::GPT<B>>(cfg);
  }();
  const auto f = safetensors::File::open(path);
  std::map<std::string, Tensor<B>> sd;
  for (const std::string& n : f.names()) {
    if (info.is_checkpoint) {
      if (n.rfind("model.", 0) == 0) sd.emplace(n.substr(6), f.load<B>(n));
    } else {
      sd.emplace(n, f.load<B>(n));
    }
  }
  try {
    model->load_state_dict(sd);
  } catch (const Error& e) {
    fail("{} ('{}')", printable(e.what(), std::string::npos), path);  // it may quote the file's tensor names
  }
  return model;
}

namespace {

// The run's model and train configurations: the files given, else those a --resume checkpoint holds
// (whose model must match the one given).
struct RunConfigs {
  ModelConfig model;  // resolved
  TrainConfig train;
  CheckpointInfo resume;
};
RunConfigs run_configs(const TrainOptions& o) {
  ModelConfig mc = ModelConfig::load(o.model_path);
  TrainConfig tc = TrainConfig::load(o.train_path);
  CheckpointInfo resume;
  if (!o.resume_path.empty()) {
    resume = read_checkpoint_info(o.resume_path);
    KILN_CHECK(resume.is_checkpoint, "train: --resume '{}' is not a kiln checkpoint (no kiln_checkpoint metadata)", o.resume_path);
    if (o.model_path.empty()) mc = resume.model;
    if (o.train_path.empty() && resume.train) tc = *resume.train;
    KILN_CHECK(mc.resolved().to_json() == resume.model.resolved().to_json(),
               "train: --model {} differs from the model of checkpoint '{}': {} vs {}", o.model_path, o.resume_path,
               mc.resolved().to_json().dump(), resume.model.resolved().to_json().dump());
  }
  tc = with_flags(o, tc);
  KILN_CHECK(tc.lora.r == 0 || !o.init_from.empty() || !o.resume_path.empty(),
             "train: LoRA (r {}) adapts trained weights: give --init-from (kiln weights or a Hugging Face model directory)", tc.lora.r);
  KILN_CHECK(tc.lora.r == 0 || tc.zero_stage == 0, "train: LoRA with zero_stage {} is not implemented (use 0)", tc.zero_stage);
  return {mc.resolved(), tc, resume};
}

// The line `kiln train` prints before the first step.
template <Backend B> void print_banner(const TrainOptions& o, const ModelConfig& cfg, const TrainConfig& tc, const Ranks& ranks,
                                       int64_t num_parameters, double seq_flops, int64_t first_step) {
  const int64_t bs = tc.batch_size, T = tc.seq_len;
  std::string isa;  // the Cpu kernels' instruction set (a Reference-only build has no cpu_isa to call)
  if constexpr (std::is_same_v<B, Cpu>) isa = fmt::format(" ({})", cpu_isa());
  fmt::print("kiln train: {} parameters, {} {}{}·{} tokens/step, {:.1f} MFLOP/token, steps {}..{} of {}, device {}{}{}{}\n", num_parameters,
             cfg.attention, tc.grad_accum > 1 ? fmt::format("{}·", tc.grad_accum) : "", bs, T, seq_flops / static_cast<double>(T) / 1e6,
             first_step, o.stop_after >= 0 ? std::min(tc.steps, o.stop_after) : tc.steps, tc.steps, B::name, isa,
             ranks.parallel ? fmt::format(", {} ranks × {} rows{}", ranks.count, ranks.rows.count, tc.zero_stage == 1 ? ", ZeRO-1" : "")
                            : std::string(),
             tc.precision == "f32" ? std::string() : fmt::format(", precision {} (autocast)", tc.precision));
  if (tc.activation_checkpointing) fmt::print("kiln train: activation checkpointing on (layer activations recomputed in backward)\n");
  fmt::print("{}", tc.time_limit_note());
  fmt::print("{}", tc.loss_chunk_note(ranks.rows.count * T, cfg.vocab_size));
}

// After the loop: the model or its LoRA adapter saved (rank 0), every rank waiting for rank 0's files, the closing lines.
template <Backend B> TrainResult finish(const TrainOptions& o, const FitResult& r, const nn::GPT<B>& model, const Ranks& ranks, bool lora) {
  TrainResult res;
  res.steps_done = r.steps_done;
  res.losses = r.losses;
  res.final_eval_loss = r.eval_losses.empty() ? -1 : r.eval_losses.back();
  res.interrupted = r.interrupted;
  // With LoRA only the adapter is written (PEFT's layout), beside the final checkpoint and to --save.
  if (lora && ranks.main && !o.checkpoint_path.empty()) nn::save_lora(model, o.checkpoint_path + ".adapter");
  if (!o.save_path.empty() && ranks.main) {
    if (lora)
      nn::save_lora(model, o.save_path);
    else
      model.save(o.save_path);
  }
  // Every rank waits for rank 0's files: a rank leaving early with a non-zero status (an interrupted
  // run) would end the job (dist: MPI_Abort) while rank 0 still writes.
  if (ranks.parallel) dist::barrier();
  if (!ranks.main) return res;
  if (!o.quiet && r.skipped > 0) fmt::print("kiln train: {} non-finite steps skipped\n", r.skipped);
  if (res.interrupted && !o.quiet)
    fmt::print("kiln train: interrupted after step {}{}\n", r.steps_done,
               o.checkpoint_path.empty() ? "" : fmt::format("; resume with --resume {}", o.checkpoint_path));
  return res;
}

}  // namespace

template <Backend B> Ranks ranks_of(int64_t bs) {
  Ranks r{.parallel = dist::is_initialized() && dist::world_size() > 1, .count = 1, .main = true, .rows = {0, bs}};
  r.count = r.parallel ? dist::world_size() : 1;
  r.main = !r.parallel || dist::is_main_process();
  if (r.parallel) {
    KILN_CHECK(bs % r.count == 0,
               "train: batch_size {} does not divide among {} ranks (each rank takes batch_size / ranks rows of "
               "every batch): use a multiple of {}",
               bs, r.count, r.count);
    r.rows = dist::batch_slice(bs);
#if defined(KILN_HAVE_CUDA_BACKEND)
    // One GPU per rank: the rank's place on its machine picks it (round robin when ranks outnumber GPUs).
    if constexpr (std::is_same_v<B, Cuda>) {
      const int gpus = cuda::device_count();
      KILN_CHECK(gpus > 0, "train: --device cuda on rank {}: no CUDA device ({})", dist::rank(), cuda::unavailable_reason());
      cuda::set_device(dist::local_rank() % gpus);
    }
#endif
  }
  return r;
}

TrainConfig with_flags(const TrainOptions& o, TrainConfig tc) {
  if (o.lora) tc.lora = *o.lora;
  if (o.activation_checkpointing) tc.activation_checkpointing = true;
  if (o.time_limit_s) tc.time_limit_s = *o.time_limit_s;
  tc.validate();
  return tc;
}

// docs/specs.md §4 on the generic loop: the schedule over tc.steps from the optimizer's lr, clipping,
// one record per step, checkpoints that carry the configurations.
FitOptions fit_options(const TrainOptions& o, const TrainConfig& tc, bool main, FitHooks hooks,
                       std::map<std::string, std::string> metadata) {
  return FitOptions{.steps = tc.steps,
                    .grad_accum = tc.grad_accum,
                    .grad_clip = tc.grad_clip,
                    .on_nonfinite = tc.on_nonfinite == "skip" ? NonFinite::skip : NonFinite::error,
                    .precision = parse_dtype(tc.precision),
                    .eval_every = tc.eval_every,
                    .eval_at_start = tc.eval_at_start,
                    .checkpoint_path = o.checkpoint_path,
                    .checkpoint_every = tc.checkpoint_every,
                    .resume_path = o.resume_path,
                    .log_path = o.log_path,
                    .progress = o.quiet || !main ? 0 : o.progress,
                    .stop_after = o.stop_after,
                    .time_limit_s = tc.time_limit_s,
                    .metadata = std::move(metadata),
                    .hooks = std::move(hooks),
                    .schedule = tc.schedule};  // peak: the optimizer's lr, tc.optimizer.lr
}

template <Backend B> TrainResult train_gpt(const TrainOptions& o) {
  KILN_CHECK(!o.data_path.empty(), "train: --data is required (a safetensors file with a 1-D integer tensor 'tokens')");
  const RunConfigs rc = run_configs(o);
  const ModelConfig& cfg = rc.model;
  const TrainConfig& tc = rc.train;
  const bool lora = tc.lora.r > 0;
  const auto tokenizer = training_tokenizer(o.tokenizer, cfg.vocab_size);
  TokenData data = TokenData::load_or_tokenize(o.data_path, tokenizer ? &*tokenizer : nullptr);
  if (tc.shuffle) data.shuffle(o.seed);  // train.json "shuffle": windows in a seeded order per epoch
  data.check_vocab(cfg.vocab_size);
  KILN_CHECK(tc.seq_len <= cfg.max_seq_len, "train: seq_len {} exceeds the model's max_seq_len {}", tc.seq_len, cfg.max_seq_len);
  KILN_CHECK(data.size() > tc.seq_len, "train: '{}' has {} tokens; need more than seq_len={}", o.data_path, data.size(), tc.seq_len);
  std::optional<TokenData> eval_data;
  if (!o.eval_data_path.empty()) {
    eval_data = TokenData::load_or_tokenize(o.eval_data_path, tokenizer ? &*tokenizer : nullptr);
    eval_data->check_vocab(cfg.vocab_size);
  }
  const int64_t bs = tc.batch_size, T = tc.seq_len;
  const Ranks ranks = ranks_of<B>(bs);

  manual_seed(o.seed);
  KILN_CHECK(tc.precision == "f32" || o.dtype == DType::f32,
             "train: precision \"{}\" keeps f32 master weights; it does not combine with --dtype {}", tc.precision, o.dtype);
  nn::GPT<B> model(cfg, o.dtype);
  model.init_weights(o.seed);
  if (!o.init_from.empty()) model.load(o.init_from);
  model.set_activation_checkpointing(tc.activation_checkpointing);
  // LoRA on the loaded GPT (docs/lora.md): only the adapters train; --save writes them in PEFT's layout.
  if (lora)
    nn::apply_lora(model, {.r = tc.lora.r,
                           .alpha = tc.lora.alpha,
                           .dropout = tc.lora.dropout,
                           .target_modules = tc.lora.target_modules,
                           .base_model_name_or_path = o.init_from});
  std::unique_ptr<dist::DistributedDataParallel<B>> ddp;
  if (ranks.parallel) ddp = std::make_unique<dist::DistributedDataParallel<B>>(model, dist::DDPOptions{.bucket_mb = tc.bucket_mb});
  auto opt = make_optimizer(model, tc.optimizer, ranks.parallel && tc.zero_stage == 1);

  // Batch i of the token data, mean cross-entropy; the step is the data position.
  const double seq_flops = nn::gpt_flops(cfg, T).total();  // the model FLOPs of one row's forward + backward
  auto step = [&](const std::pair<Tensor<B>, Tensor<B>>& b) {
    const int64_t n = b.first.size(0);
    return StepOutput<B>{.loss = lm_loss<B>(model, cfg.vocab_size, b.first, b.second, tc.loss_chunk(b.first.numel(), cfg.vocab_size)),
                         .metrics = {},
                         .samples = n,
                         .tokens = n * T,
                         .flops = static_cast<double>(n) * seq_flops};
  };
  // The batch functions' types spelled out: clang 14 (fuzz/) deduces no aggregate from designated initializers.
  auto train_batch = [&](int64_t i) { return data.rows<B>(i, bs, T, ranks.rows.start, ranks.rows.count); };
  auto eval_batch = [&](int64_t i) { return eval_data->batch<B>(i, bs, T); };
  const IndexedBatches<decltype(train_batch)> train{
      .batch = train_batch, .count = 0, .fingerprint = fmt::format("{} tokens, batches of {}x{}", data.size(), bs, T)};
  const bool with_eval = eval_data && tc.eval_every > 0;
  const IndexedBatches<decltype(eval_batch)> eval{.batch = eval_batch, .count = tc.eval_batches, .fingerprint = ""};
  std::map<std::string, std::string> meta{
      {"model_config", cfg.to_json().dump()}, {"train_config", tc.to_json().dump()}, {"data", o.data_path}};
  if (tokenizer) meta["tokenizer_path"] = std::filesystem::absolute(tokenizer->path()).lexically_normal().string();  // for kiln sample
  FitOptions fo = fit_options(o, tc, ranks.main, ddp ? dist::fit_hooks(*ddp) : FitHooks{}, std::move(meta));
  fo.callbacks = {lora_checkpoints(model, tc, o.checkpoint_path, ranks.main)};
  fo.scheduler = make_scheduler(*opt, tc);
  fo.ema = make_ema(model, tc);
  if (!o.quiet && ranks.main) print_banner<B>(o, cfg, tc, ranks, model.num_parameters(), seq_flops, rc.resume.step);
  const FitResult r = with_eval ? fit(model, *opt, train, eval, step, fo) : fit(model, *opt, train, step, fo);
  return finish(o, r, model, ranks, lora);
}

TrainResult train_gpt(const TrainOptions& o) {
  return dispatch(o.device, [&]<Backend B>() { return train_gpt<B>(o); });
}

#define KILN_INST(B)                                                                                                               \
  template TrainResult train_gpt<B>(const TrainOptions&);                                                                          \
  template void save_checkpoint<B>(const std::string&, const nn::GPT<B>&, const optim::Optimizer<B>*, int64_t, const TrainConfig&, \
                                   const std::string&);                                                                            \
  template std::shared_ptr<nn::GPT<B>> load_gpt<B>(const std::string&, const std::string&);                                        \
  template double evaluate<B>(const nn::GPT<B>&, const TokenData&, int64_t, int64_t, int64_t, DType);                              \
  template double evaluate<B>(const hf::CausalLM<B>&, const TokenData&, int64_t, int64_t, int64_t, DType);                         \
  template std::unique_ptr<optim::Optimizer<B>> make_optimizer<B>(const nn::Module<B>&, const OptimizerConfig&, bool);             \
  template std::shared_ptr<optim::LRScheduler> make_scheduler<B>(optim::Optimizer<B>&, const TrainConfig&);                        \
  template std::shared_ptr<optim::EMA<B>> make_ema<B>(const nn::Module<B>&, const TrainConfig&);                                   \
  template Ranks ranks_of<B>(int64_t);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln
