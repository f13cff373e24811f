#include "kiln/train/trainer.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "kiln/backends/dispatch.hpp"
#include "kiln/nn/loss.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/train/data.hpp"
#include "kiln/train/progress.hpp"

namespace kiln {

namespace {

using json = nlohmann::json;

std::atomic<int> g_signal{0};
extern "C" void on_signal(int s) { g_signal.store(s); }

// Installs SIGINT/SIGTERM handlers for its lifetime; the loop polls g_signal between steps.
struct SignalGuard {
  void (*old_int)(int);
  void (*old_term)(int);
  SignalGuard() {
    g_signal.store(0);
    old_int = std::signal(SIGINT, on_signal);
    old_term = std::signal(SIGTERM, on_signal);
  }
  ~SignalGuard() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
};

template <Backend B> std::unique_ptr<optim::Optimizer<B>> make_optimizer(const nn::GPT<B>& model, const OptimizerConfig& o) {
  const auto groups = optim::decay_groups<B>(model.named_parameters(), o.lr, o.weight_decay);
  if (o.name == "sgd")
    return std::make_unique<optim::SGD<B>>(
        groups, optim::SGDOptions{.lr = o.lr, .momentum = o.momentum, .dampening = o.dampening, .weight_decay = o.weight_decay,
                                  .nesterov = o.nesterov});
  return std::make_unique<optim::Adam<B>>(groups, optim::AdamOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps,
                                                                     .weight_decay = o.weight_decay, .decoupled = o.name == "adamw"});
}

template <Backend B> Var<B> lm_loss(const nn::GPT<B>& model, const Tensor<B>& x, const Tensor<B>& y) {
  const Var<B> logits = model.forward(x);
  return nn::cross_entropy(logits.reshape({-1, model.config().vocab_size}), y.reshape({-1}));
}

}  // namespace

template <Backend B>
double evaluate(const nn::GPT<B>& model, const TokenData& data, int64_t batches, int64_t batch_size, int64_t seq_len) {
  NoGrad ng;
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const auto [x, y] = data.batch<B>(i, batch_size, seq_len);
    total += item<double>(lm_loss(model, x, y).value());
  }
  return total / static_cast<double>(batches);
}

template <Backend B>
void save_checkpoint(const std::string& path, const nn::GPT<B>& model, const optim::Optimizer<B>* opt, int64_t step,
                     const TrainConfig& t, const std::string& data_path) {
  std::vector<std::pair<std::string, Tensor<B>>> ts;
  for (auto& [n, v] : model.state_dict()) ts.emplace_back("model." + n, v);
  if (opt)
    for (auto& [n, v] : opt->state_dict()) ts.emplace_back("optim." + n, v);
  const Generator& g = default_generator();
  safetensors::save<B>(path, ts,
                       {{"kiln_checkpoint", "1"},
                        {"step", std::to_string(step)},
                        {"rng_seed", std::to_string(g.seed())},
                        {"rng_offset", std::to_string(g.offset())},
                        {"model_config", model.config().to_json().dump()},
                        {"train_config", t.to_json().dump()},
                        {"data", data_path}});
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const auto f = safetensors::File::open(path);
  CheckpointInfo c;
  c.metadata = f.metadata();
  const auto& m = c.metadata;
  c.is_checkpoint = m.count("kiln_checkpoint") != 0;
  if (!c.is_checkpoint) return c;
  try {
    c.model = ModelConfig::from_json(json::parse(m.at("model_config")), path + ": model_config");
    if (m.count("train_config")) c.train = TrainConfig::from_json(json::parse(m.at("train_config")), path + ": train_config");
    c.step = std::stoll(m.at("step"));
    c.rng_seed = std::stoull(m.at("rng_seed"));
    c.rng_offset = std::stoull(m.at("rng_offset"));
    if (m.count("data")) c.data_path = m.at("data");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("checkpoint '{}': malformed metadata ({})", path, e.what());
  }
  return c;
}

template <Backend B> std::shared_ptr<nn::GPT<B>> load_gpt(const std::string& path, const std::string& model_json) {
  const CheckpointInfo info = read_checkpoint_info(path);
  ModelConfig cfg;
  if (!model_json.empty()) cfg = ModelConfig::load(model_json);
  else if (info.is_checkpoint) cfg = info.model;
  else fail("'{}' is a plain weights file without a model config: pass --model model.json", path);
  auto model = std::make_shared<nn::GPT<B>>(cfg);
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
    fail("{} ('{}')", e.what(), path);
  }
  return model;
}

template <Backend B> TrainResult train_gpt(const TrainOptions& o) {
  KILN_CHECK(!o.data_path.empty(), "train: --data is required (a safetensors file with a 1-D integer tensor 'tokens')");
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
  const ModelConfig cfg = mc.resolved();
  const TokenData data = TokenData::load(o.data_path);
  data.check_vocab(cfg.vocab_size);
  KILN_CHECK(tc.seq_len <= cfg.max_seq_len, "train: seq_len {} exceeds the model's max_seq_len {}", tc.seq_len, cfg.max_seq_len);
  KILN_CHECK(data.size() > tc.seq_len, "train: '{}' has {} tokens; need more than seq_len={}", o.data_path, data.size(), tc.seq_len);
  std::optional<TokenData> eval_data;
  if (!o.eval_data_path.empty()) {
    eval_data = TokenData::load(o.eval_data_path);
    eval_data->check_vocab(cfg.vocab_size);
  }

  manual_seed(o.seed);
  nn::GPT<B> model(cfg, o.dtype);
  model.init_weights(o.seed);
  if (!o.init_from.empty()) model.load(o.init_from);
  auto opt = make_optimizer(model, tc.optimizer);
  int64_t start = 0;
  if (!o.resume_path.empty()) {
    const auto f = safetensors::File::open(o.resume_path);
    std::map<std::string, Tensor<B>> msd, osd;
    for (const std::string& n : f.names()) {
      if (n.rfind("model.", 0) == 0) msd.emplace(n.substr(6), f.load<B>(n));
      else if (n.rfind("optim.", 0) == 0) osd.emplace(n.substr(6), f.load<B>(n));
    }
    try {
      model.load_state_dict(msd);
      opt->load_state_dict(osd);
    } catch (const Error& e) {
      fail("{} (checkpoint '{}')", e.what(), o.resume_path);
    }
    start = resume.step;
    default_generator().set_state(resume.rng_seed, resume.rng_offset);
  }
  model.train();

  std::FILE* log = nullptr;
  if (!o.log_path.empty()) {
    log = std::fopen(o.log_path.c_str(), start > 0 ? "a" : "w");
    KILN_CHECK(log != nullptr, "train: cannot open log file '{}'", o.log_path);
  }
  struct Closer {
    std::FILE* f;
    ~Closer() {
      if (f) std::fclose(f);
    }
  } closer{log};

  const std::vector<Var<B>> params = model.parameters();
  const int64_t end = o.stop_after >= 0 ? std::min(tc.steps, o.stop_after) : tc.steps;
  const int64_t tokens_per_step = tc.batch_size * tc.seq_len;
  const bool show = !o.quiet && o.progress != 0;
  ProgressBar bar(tc.steps, stdout, o.progress < 0 ? -1 : o.progress);
  if (!o.quiet)
    fmt::print("kiln train: {} parameters, {} {}·{} tokens/step, steps {}..{} of {}, device {}\n", model.num_parameters(),
               cfg.attention, tc.batch_size, tc.seq_len, start, end, tc.steps, B::name);
  SignalGuard guard;
  TrainResult res;
  int64_t step = start;
  for (; step < end; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = tc.schedule.at(tc.optimizer.lr, step, tc.steps);
    opt->set_lr(lr);
    const auto [x, y] = data.batch<B>(step, tc.batch_size, tc.seq_len);
    opt->zero_grad();
    const Var<B> loss = lm_loss(model, x, y);
    loss.backward();
    const double norm = tc.grad_clip > 0 ? optim::clip_grad_norm(params, tc.grad_clip) : optim::grad_norm(params);
    opt->step();
    const double lv = item<double>(loss.value());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    res.losses.push_back(lv);
    json rec = {{"step", step}, {"loss", lv}, {"lr", lr}, {"grad_norm", norm}, {"ms", ms},
                {"tokens_per_s", static_cast<double>(tokens_per_step) / (ms / 1e3)}};
    std::string extra;
    if (eval_data && tc.eval_every > 0 && ((step + 1) % tc.eval_every == 0 || step + 1 == tc.steps)) {
      model.eval();
      const double ev = evaluate(model, *eval_data, tc.eval_batches, tc.batch_size, tc.seq_len);
      model.train();
      rec["eval_loss"] = ev;
      res.final_eval_loss = ev;
      extra = fmt::format("eval {:.4f}", ev);
    }
    if (log) {
      fmt::print(log, "{}\n", rec.dump());
      std::fflush(log);
    }
    if (show) bar.update(step, lv, lr, tokens_per_step, extra);
    KILN_CHECK(std::isfinite(lv), "train: loss became {} at step {} (lr {}); stopping", lv, step, lr);
    const bool periodic = tc.checkpoint_every > 0 && (step + 1) % tc.checkpoint_every == 0;
    if (!o.checkpoint_path.empty() && periodic) save_checkpoint(o.checkpoint_path, model, opt.get(), step + 1, tc, o.data_path);
    if (g_signal.load() != 0) {
      res.interrupted = true;
      ++step;
      break;
    }
  }
  if (show) bar.finish();
  res.steps_done = step;
  if (!o.checkpoint_path.empty()) save_checkpoint(o.checkpoint_path, model, opt.get(), step, tc, o.data_path);
  if (!o.save_path.empty()) model.save(o.save_path);
  if (res.interrupted && !o.quiet)
    fmt::print("kiln train: interrupted after step {}{}\n", step,
               o.checkpoint_path.empty() ? "" : fmt::format("; resume with --resume {}", o.checkpoint_path));
  return res;
}

TrainResult train_gpt(const TrainOptions& o) {
  return dispatch(o.device, [&]<Backend B>() { return train_gpt<B>(o); });
}

#define KILN_INST(B)                                                                                                      \
  template TrainResult train_gpt<B>(const TrainOptions&);                                                                \
  template void save_checkpoint<B>(const std::string&, const nn::GPT<B>&, const optim::Optimizer<B>*, int64_t,           \
                                   const TrainConfig&, const std::string&);                                              \
  template std::shared_ptr<nn::GPT<B>> load_gpt<B>(const std::string&, const std::string&);                             \
  template double evaluate<B>(const nn::GPT<B>&, const TokenData&, int64_t, int64_t, int64_t);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln
