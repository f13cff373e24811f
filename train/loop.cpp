#include "kiln/train/loop.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"
#include "kiln/train/progress.hpp"

namespace kiln {

namespace {

using json = nlohmann::json;

std::atomic<int> g_signal{0};
// The first SIGINT/SIGTERM asks the loop to stop after the step; a second one acts as if no handler
// were installed (checkpoints are written atomically, so killing is safe).
extern "C" void on_fit_signal(int s) {
  g_signal.store(s);
  std::signal(s, SIG_DFL);
}

// Installs SIGINT/SIGTERM handlers for its lifetime; the loop polls g_signal between steps.
struct SignalGuard {
  bool on;
  void (*old_int)(int) = nullptr;
  void (*old_term)(int) = nullptr;
  explicit SignalGuard(bool install) : on(install) {
    g_signal.store(0);
    if (!on) return;
    old_int = std::signal(SIGINT, on_fit_signal);
    old_term = std::signal(SIGTERM, on_fit_signal);
  }
  ~SignalGuard() {
    if (!on) return;
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
};

// The metadata keys the loop owns; options.metadata may not use them.
bool loop_key(const std::string& k) {
  static const char* keys[] = {"kiln_checkpoint", "step",          "rng_seed", "rng_offset", "grad_accum",
                               "optimizer",       "skipped_steps", "kiln_fit", "loss_scale", "loss_scale_good_steps",
                               "optimizer_kinds"};
  for (const char* x : keys)
    if (k == x) return true;
  return k.rfind("data.", 0) == 0 || k == "scheduler" || k.rfind("scheduler.", 0) == 0 || k.rfind("time_limit.", 0) == 0;
}

const std::string& need(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path) {
  const auto it = m.find(key);
  KILN_CHECK(it != m.end(), "fit: resume checkpoint '{}' has no '{}' metadata", path, key);
  return it->second;
}

// Metadata `key` as a T, the whole string (from_chars: no prefix, no spaces, nothing out of range).
template <class T> T parse(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path) {
  const std::string& s = need(m, key, path);
  T v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && p == s.data() + s.size(), "fit: resume checkpoint '{}': '{}' = '{}' is not {}", path, key,
             printable(s, 40), std::is_integral_v<T> ? "an integer" : "a number");
  return v;
}

}  // namespace

namespace fit_detail {

void truncate_log(const std::string& path, int64_t before) {
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  KILN_CHECK(in.good(), "fit: cannot read log file '{}'", path);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (r.is_object() && r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() < before) kept += line + "\n";
  }
  safetensors::write_atomically(path, {{kept.data(), kept.size()}});
}

}  // namespace fit_detail

namespace {

// The engine's state for one fit() call.
template <Backend B> class Engine {
 public:
  Engine(nn::Module<B>& model, optim::Optimizer<B>& opt, fit_detail::Source& train, const std::function<StepOutput<B>()>& step,
         fit_detail::Source* eval, const std::function<StepOutput<B>()>* eval_step, const FitOptions& o)
      : model_(model), opt_(opt), train_(train), step_(step), eval_(eval), eval_step_(eval_step), o_(o) {}

  FitResult run();

 private:
  void prepare();
  std::FILE* open_log();
  void report(int64_t step, json& rec, const FitState& st, std::FILE* log, ProgressBar* bar);
  bool should_stop(bool asked, int64_t step, FitResult& res);
  void validate();
  void resume();
  // One optimizer step, in the named steps below.
  void one_step(int64_t step, json& rec, FitState& st);
  struct StepSums {
    int64_t m = 0;                          // micro-batches in the window
    std::vector<Tensor<B>> losses;          // each micro-batch's
    double loss = 0;                        // their mean (over the processes too), from reduce_losses
    std::map<std::string, double> metrics;  // summed over the window
    int64_t samples = 0, tokens = 0;
    double flops = 0;
  };
  struct Update {
    bool finite = true, overflow = false;
  };
  double schedule_lr(int64_t step);
  StepSums run_window(int64_t step);
  double finish_gradients(double loss_scale);
  void reduce_losses(StepSums& sums);
  Update update(int64_t step, double loss, double norm, double loss_scale);
  json step_record(int64_t step, const StepSums& sums, double lr, double norm, double ms, double loss_scale, Update u) const;
  void after_update(int64_t step, int64_t epoch, json& rec, FitState& st);
  double evaluate(std::map<std::string, double>& metrics);
  double evaluate_weights(std::map<std::string, double>& metrics);  // the EMA's when there is one
  void evaluate_at_start(FitResult& res, std::FILE* log, ProgressBar* bar);
  void save_checkpoint(int64_t step_count);
  [[noreturn]] void fail_nonfinite(int64_t step, double loss, double norm, double loss_scale);
  // The time limit (FitOptions::time_limit_s, loop.hpp): the run's clock, the plan, the stop.
  double elapsed_s() const;  // of the whole run: before this call (a resumed checkpoint's) and since run() began
  bool out_of_time();        // rank 0's clock past the limit; the same answer on every process
  struct Plan {
    bool changed = false;  // the run's total
    std::string line;      // to print ("" = none)
  };
  Plan plan_for_time(int64_t step);  // before `step`
  double planned_cost(int64_t done, int64_t n, double step_s, double eval_s, double checkpoint_s) const;

  nn::Module<B>& model_;
  optim::Optimizer<B>& opt_;
  fit_detail::Source& train_;
  const std::function<StepOutput<B>()>& step_;
  fit_detail::Source* eval_;
  const std::function<StepOutput<B>()>* eval_step_;
  const FitOptions& o_;

  std::vector<std::pair<std::string, Var<B>>> named_;
  std::vector<Var<B>> params_;
  std::vector<double> peaks_;
  int64_t k_ = 1, spe_ = 0, total_ = 0, start_ = 0, end_ = 0, skipped_ = 0;
  int64_t last_samples_ = 0, last_tokens_ = 0;  // of the last step, for the progress bar
  double last_flops_ = 0;
  std::optional<autocast::GradScaler> scaler_;  // precision f16
  optim::EMA<B>* ema_ = nullptr;                // options.ema
  // The time limit's state.
  std::chrono::steady_clock::time_point t0_{};
  double elapsed_before_ = 0;                        // seconds the run had taken at the resumed checkpoint
  int64_t plans_ = 0;                                // plans made (the first, then its revisions)
  int64_t full_total_ = 0;                           // the run's steps as the options give them (a plan's most)
  int64_t planned_ = 0;                              // the total the plan set (0: none)
  int64_t shown_total_ = 0;                          // the total the last plan's line gave
  int64_t last_step_ = -1;                           // the step the limit made the last
  std::vector<double> step_s_;                       // wall seconds of the loop's iterations timed since the last plan
  std::chrono::steady_clock::time_point iter_t0_{};  // when the last iteration began
  bool iter_timed_ = false;                          // whether it counts (no evaluation or checkpoint in it)
  bool evaluates_ = false;                           // the last step was one that evaluates (on rank 0; every rank knows)
  double forward_s_ = 0;                             // of the training micro-batches' forwards, in total
  int64_t forwards_ = 0;
  double eval_s_ = -1, checkpoint_s_ = -1;  // the last evaluation's and checkpoint's wall seconds (-1: none yet)
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <Backend B> void Engine<B>::validate() {
  KILN_CHECK(o_.epochs >= 0, "fit: epochs must be >= 0, got {}", o_.epochs);
  KILN_CHECK(o_.steps >= 0, "fit: steps must be >= 0, got {}", o_.steps);
  KILN_CHECK((o_.epochs > 0) != (o_.steps > 0), "fit: set exactly one of epochs and steps (> 0), got epochs={} steps={}", o_.epochs,
             o_.steps);
  KILN_CHECK(o_.grad_accum >= 1, "fit: grad_accum must be >= 1, got {}", o_.grad_accum);
  KILN_CHECK(std::isfinite(o_.grad_clip) && o_.grad_clip >= 0, "fit: grad_clip must be >= 0 (0 = off), got {}", o_.grad_clip);
  KILN_CHECK(std::isfinite(o_.lr) && o_.lr >= 0, "fit: lr must be >= 0 (0 = the optimizer's), got {}", o_.lr);
  KILN_CHECK(o_.eval_every >= 0, "fit: eval_every must be >= 0, got {}", o_.eval_every);
  KILN_CHECK(o_.checkpoint_every >= 0, "fit: checkpoint_every must be >= 0, got {}", o_.checkpoint_every);
  KILN_CHECK(o_.checkpoint_every == 0 || !o_.checkpoint_path.empty(), "fit: checkpoint_every = {} needs a checkpoint_path",
             o_.checkpoint_every);
  KILN_CHECK(o_.stop_after >= -1, "fit: stop_after must be >= 0 (or -1 = never), got {}", o_.stop_after);
  KILN_CHECK(std::isfinite(o_.time_limit_s) && o_.time_limit_s >= 0, "fit: time_limit_s must be >= 0 seconds (0 = none), got {}",
             o_.time_limit_s);
  KILN_CHECK(o_.progress >= -1 && o_.progress <= 1, "fit: progress must be -1 (auto), 0 or 1, got {}", o_.progress);
  KILN_CHECK(o_.schedule.warmup_steps >= 0, "fit: schedule.warmup_steps must be >= 0, got {}", o_.schedule.warmup_steps);
  for (const auto& [key, value] : o_.metadata)
    KILN_CHECK(!loop_key(key), "fit: metadata key '{}' is the loop's own (step, rng_*, grad_accum, optimizer, data.*, ...)", key);
  if (!o_.checkpoint_path.empty()) {
    const auto dir = std::filesystem::path(o_.checkpoint_path).parent_path();
    KILN_CHECK(dir.empty() || std::filesystem::is_directory(dir), "fit: checkpoint_path '{}': no directory '{}'", o_.checkpoint_path,
               dir.string());
  }
  if (!o_.log_path.empty()) {
    const auto dir = std::filesystem::path(o_.log_path).parent_path();
    KILN_CHECK(dir.empty() || std::filesystem::is_directory(dir), "fit: log_path '{}': no directory '{}'", o_.log_path, dir.string());
  }
  if (o_.scheduler) {
    KILN_CHECK(o_.schedule.name == "constant" && o_.schedule.warmup_steps == 0 && o_.lr == 0,
               "fit: a scheduler object ({}) sets the lr: leave schedule (now '{}', warmup_steps {}) and lr (now {}) at their defaults",
               o_.scheduler->kind(), o_.schedule.name, o_.schedule.warmup_steps, o_.lr);
    KILN_CHECK(o_.scheduler->optimizer_id() == static_cast<const void*>(&opt_), "fit: the scheduler ({}) was built on another optimizer",
               o_.scheduler->kind());
    KILN_CHECK(!o_.scheduler->needs_metric() || eval_ != nullptr, "fit: {} steps on the evaluation loss: give fit evaluation data",
               o_.scheduler->kind());
  }
  if (o_.ema) {
    ema_ = dynamic_cast<optim::EMA<B>*>(o_.ema.get());
    KILN_CHECK(ema_ != nullptr, "fit: options.ema must be an optim::EMA of this backend ({})", B::name);
    KILN_CHECK(!ema_->swapped(), "fit: the EMA's averages are swapped into the model: swap() them back before fit");
  }
  k_ = o_.grad_accum;
  if (train_.indexed()) {
    KILN_CHECK(o_.epochs == 0, "fit: epochs = {} needs a DataLoader; IndexedBatches have no epochs: set steps", o_.epochs);
  } else {
    KILN_CHECK(train_.batches_per_epoch() > 0,
               "fit: the training DataLoader has no batches (empty dataset, or drop_last with fewer "
               "samples than batch_size)");
    spe_ = (train_.batches_per_epoch() + k_ - 1) / k_;
  }
  if (eval_) {
    KILN_CHECK(!eval_->loader() || eval_->loader() != train_.loader(),
               "fit: the same DataLoader trains and evaluates; evaluation would move the training position: give it its own");
    KILN_CHECK(eval_->batches_per_epoch() > 0, "fit: the evaluation data has no batches{}",
               eval_->indexed() ? " (set IndexedBatches::count)" : "");
  }
  total_ = full_total_ = o_.epochs > 0 ? o_.epochs * spe_ : o_.steps;
  (void)o_.schedule.at(1.0, 0, total_);  // an unknown schedule name throws here, before anything runs
  (void)o_.schedule.at(1.0, total_ - 1, total_);
}

template <Backend B> void Engine<B>::resume() {
  const std::string& path = o_.resume_path;
  const auto f = safetensors::File::open(path);  // names the file when it is missing or malformed
  const auto& m = f.metadata();
  KILN_CHECK(m.count("kiln_checkpoint"), "fit: '{}' is not a kiln checkpoint (no kiln_checkpoint metadata)", path);
  const int64_t step = parse<int64_t>(m, "step", path);
  const int64_t accum = m.count("grad_accum") ? parse<int64_t>(m, "grad_accum", path) : 1;
  KILN_CHECK(accum == k_, "fit: resume checkpoint '{}' was written with grad_accum {}, this run has grad_accum {}", path, accum, k_);
  if (m.count("optimizer")) {
    // Without `optimizer_kinds`, an older kiln wrote it: a typeid name, or "adam" for AdamW too (Optimizer::reads_kind).
    const std::string kind = opt_.kind();
    const bool legacy = !m.count("optimizer_kinds");
    KILN_CHECK(opt_.reads_kind(m.at("optimizer"), legacy),
               "fit: resume checkpoint '{}' holds the state of optimizer '{}', this run uses '{}'", path,
               printable(optim::legacy_optimizer_kind(m.at("optimizer"))), kind);
  }
  const std::string data_kind = m.count("data.kind") ? m.at("data.kind") : "indexed";
  const std::string mine = train_.indexed() ? "indexed" : "loader";
  KILN_CHECK(data_kind == mine, "fit: resume checkpoint '{}' was trained on {} data, this run on {}", path,
             data_kind == "loader" ? "DataLoader" : "IndexedBatches", mine == "loader" ? "DataLoader" : "IndexedBatches");
  // A time limit's state: the time spent, and the plan's total (kept where this run's steps allow it).
  if (o_.time_limit_s > 0 && m.count("time_limit.elapsed_s")) elapsed_before_ = parse<double>(m, "time_limit.elapsed_s", path);
  if (o_.time_limit_s > 0 && m.count("time_limit.planned_steps")) {
    const auto planned = parse<int64_t>(m, "time_limit.planned_steps", path);
    if (planned >= step && planned <= total_) {
      planned_ = total_ = planned;
      plans_ = 1;
    }
  }
  KILN_CHECK(step >= 0 && step <= total_, "fit: resume checkpoint '{}' is at step {}, beyond this run's {} steps", path, step, total_);
  try {
    train_.load_state(m);
  } catch (const Error& e) {
    fail("{} (resume checkpoint '{}')", printable(e.what(), std::string::npos), path);  // it may quote the file's names
  }
  if (!train_.indexed()) {
    const int64_t at = train_.epoch() * spe_ + (train_.position() + k_ - 1) / k_;
    KILN_CHECK(o_.epochs == 0 || at == step,
               "fit: resume checkpoint '{}': step {} does not match its data position (epoch {}, batch {}: step {})", path, step,
               train_.epoch(), train_.position(), at);
  }
  const std::string sched = m.count("scheduler") ? m.at("scheduler") : std::string();
  KILN_CHECK(sched == (o_.scheduler ? o_.scheduler->kind() : std::string()), "fit: resume checkpoint '{}' was written {}, this run has {}",
             path, sched.empty() ? std::string("without a scheduler object") : "with scheduler " + sched,
             o_.scheduler ? "scheduler " + o_.scheduler->kind() : std::string("none"));
  std::map<std::string, Tensor<B>> msd, osd, esd;
  for (const std::string& n : f.names()) {
    if (n.rfind("model.", 0) == 0)
      msd.emplace(n.substr(6), f.load<B>(n));
    else if (n.rfind("optim.", 0) == 0)
      osd.emplace(n.substr(6), f.load<B>(n));
    else if (n.rfind("ema.", 0) == 0)
      esd.emplace(n.substr(4), f.load<B>(n));
  }
  KILN_CHECK(esd.empty() == (ema_ == nullptr), "fit: resume checkpoint '{}' was written {} an EMA of the weights, this run has {}", path,
             esd.empty() ? "without" : "with", ema_ ? "one" : "none");
  try {
    model_.load_state_dict(msd);
    opt_.load_state_dict(osd);
    if (ema_) ema_->load_state_dict(esd);
    if (o_.scheduler) {
      optim::SchedulerState ss;
      for (const auto& [k, v] : m)
        if (k.rfind("scheduler.", 0) == 0) ss.emplace(k.substr(10), v);
      o_.scheduler->load_state_dict(ss);
    }
  } catch (const Error& e) {
    fail("{} (resume checkpoint '{}')", printable(e.what(), std::string::npos), path);  // it may quote the file's names
  }
  default_generator().set_state(parse<uint64_t>(m, "rng_seed", path), parse<uint64_t>(m, "rng_offset", path));
  skipped_ = m.count("skipped_steps") ? parse<int64_t>(m, "skipped_steps", path) : 0;
  if (scaler_ && m.count("loss_scale"))
    scaler_->set_state(parse<double>(m, "loss_scale", path),
                       m.count("loss_scale_good_steps") ? parse<int64_t>(m, "loss_scale_good_steps", path) : 0);
  start_ = step;
}

template <Backend B> void Engine<B>::fail_nonfinite(int64_t step, double loss, double norm, double loss_scale) {
  std::string bad;
  for (const auto& [name, p] : named_) {
    const Tensor<B> g = p.grad();
    if (!g.defined()) continue;
    if (!std::isfinite(item<double>(g.to(DType::f64).mul(0.0).sum()))) {  // x·0 is NaN exactly for inf and NaN
      bad = name;
      break;
    }
  }
  // f16 with a finite loss: the gradients overflowed at the scaler's floor (a non-finite loss says so itself).
  const std::string scaled = scaler_ && std::isfinite(loss)
                                 ? fmt::format(" with the f16 loss scale {} at its floor min_scale {}: not finite at any scale", loss_scale,
                                               o_.loss_scale.min_scale)
                                 : std::string();
  if (!bad.empty())
    fail("fit: non-finite gradient at step {}{}: first in parameter '{}' (loss {}, grad norm {}, lr {})", step, scaled, bad, loss, norm,
         opt_.groups().empty() ? 0.0 : opt_.groups()[0].lr);
  fail("fit: non-finite loss {} at step {} (every gradient finite, grad norm {}, lr {})", loss, step, norm,
       opt_.groups().empty() ? 0.0 : opt_.groups()[0].lr);
}

template <Backend B> double Engine<B>::evaluate(std::map<std::string, double>& metrics) {
  const auto t0 = std::chrono::steady_clock::now();
  NoGrad ng;
  const bool was_training = model_.is_training();
  model_.eval();
  const int64_t n = eval_->batches_per_epoch();
  if (!eval_->indexed()) eval_->set_epoch(0);
  std::vector<double> losses, weights;
  std::map<std::string, std::vector<double>> values;
  for (int64_t i = 0; i < n; ++i) {
    eval_->fetch(i);
    StepOutput<B> out;
    {
      autocast::Scope ac(o_.precision);
      out = (*eval_step_)();
    }
    KILN_CHECK(out.loss.defined() && out.loss.numel() == 1, "fit: the step function must return a scalar loss, got {}",
               out.loss.defined() ? shape_str(out.loss.shape()) : std::string("an undefined Var"));
    losses.push_back(item<double>(out.loss.value()));
    weights.push_back(static_cast<double>(out.samples));
    for (const auto& [k, v] : out.metrics) values[k].push_back(v);
  }
  model_.train(was_training);
  // Batches of different sizes (a short last batch) are weighted by their samples, so the result
  // is the mean over samples; equal batches by plain averaging.
  bool weighted = false;
  for (double w : weights) weighted |= w != weights[0];
  for (double w : weights) weighted &= w > 0;
  auto mean = [&](const std::vector<double>& x) {
    double s = 0, ws = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      s += weighted && x.size() == weights.size() ? x[i] * weights[i] : x[i];
      ws += weighted && x.size() == weights.size() ? weights[i] : 1.0;
    }
    return s / ws;
  };
  for (const auto& [k, v] : values) metrics["eval_" + k] = mean(v);
  eval_s_ = seconds_since(t0);  // for a time limit's plan
  return mean(losses);
}

template <Backend B> double Engine<B>::evaluate_weights(std::map<std::string, double>& metrics) {
  if (!ema_) return evaluate(metrics);
  ema_->swap();  // evaluate the averages; swapped back even if the step function throws
  struct Back {
    optim::EMA<B>* e;
    ~Back() { e->swap(); }
  } back{ema_};
  return evaluate(metrics);
}

// The evaluation before the first step (eval_at_start): a record {"step": -1, "eval_loss": ...} (the
// weights "after step -1"), the on_eval callbacks with FitState::step = -1, and the first entry of
// FitResult::eval_losses (eval_steps 0). No scheduler steps on it.
template <Backend B> void Engine<B>::evaluate_at_start(FitResult& res, std::FILE* log, ProgressBar* bar) {
  FitState st;
  st.step = -1;
  st.total_steps = total_;
  st.epoch = train_.epoch();
  st.lr = opt_.groups().empty() ? 0.0 : opt_.groups()[0].lr;
  st.eval_loss = evaluate_weights(st.metrics);
  st.evaluated = true;
  json rec = {{"step", -1}, {"eval_loss", st.eval_loss}};
  for (const auto& cb : o_.callbacks)
    if (cb.on_eval) cb.on_eval(st);
  for (const auto& [k, v] : st.metrics) {
    KILN_CHECK(!rec.contains(k), "fit: metric '{}' at the evaluation before training has the name of a built-in log key", k);
    rec[k] = v;
  }
  if (log) {
    fmt::print(log, "{}\n", rec.dump());
    std::fflush(log);
  }
  if (bar) bar->message(fmt::format("before training: eval {:.4f}", st.eval_loss));
  for (const std::string& line : st.messages) {  // what the callbacks print(), as after a step
    if (bar)
      bar->message(line);
    else
      fmt::print("{}\n", line);
  }
  res.eval_losses.push_back(st.eval_loss);
  res.eval_steps.push_back(0);
}

template <Backend B> void Engine<B>::save_checkpoint(int64_t step_count) {
  const auto t = std::chrono::steady_clock::now();
  // Never replace a good checkpoint with a diverged model: every parameter must be finite.
  {
    NoGrad ng;
    Tensor<B> total;
    for (const auto& p : params_) {
      const Tensor<B> z = p.value().to(DType::f64).mul(0.0).sum();
      total = total.defined() ? total.add(z) : z;
    }
    if (total.defined() && !std::isfinite(item<double>(total)))
      for (const auto& [name, p] : named_)
        KILN_CHECK(std::isfinite(item<double>(p.value().to(DType::f64).mul(0.0).sum())),
                   "fit: parameter '{}' is not finite after step {}: checkpoint '{}' not written (the last good one is kept)", name,
                   step_count - 1, o_.checkpoint_path);
  }
  std::vector<std::pair<std::string, Tensor<B>>> ts;
  for (auto& [n, v] : model_.state_dict()) ts.emplace_back("model." + n, v);
  for (auto& [n, v] : opt_.state_dict()) ts.emplace_back("optim." + n, v);  // collective for a sharded optimizer
  if (ema_)
    for (auto& [n, v] : ema_->state_dict()) ts.emplace_back("ema." + n, v);
  if (!o_.hooks.main_process) return;  // rank 0 writes
  std::map<std::string, std::string> meta = o_.metadata;
  for (auto& [k, v] : checkpoint_metadata(step_count, k_, opt_.kind())) meta[k] = v;
  meta["skipped_steps"] = std::to_string(skipped_);
  if (o_.scheduler) {
    meta["scheduler"] = o_.scheduler->kind();
    for (auto& [k, v] : o_.scheduler->state_dict()) meta["scheduler." + k] = v;
  }
  if (scaler_) {
    meta["loss_scale"] = fmt::format("{}", scaler_->scale());
    meta["loss_scale_good_steps"] = std::to_string(scaler_->good_steps());
  }
  meta["data.kind"] = train_.indexed() ? "indexed" : "loader";
  for (auto& [k, v] : train_.state()) meta[k] = v;
  if (o_.time_limit_s > 0) meta["time_limit.elapsed_s"] = fmt::format("{}", elapsed_s());
  if (planned_ > 0) meta["time_limit.planned_steps"] = std::to_string(planned_);
  safetensors::save<B>(o_.checkpoint_path, ts, meta);
  checkpoint_s_ = seconds_since(t);
}

template <Backend B> FitResult Engine<B>::run() {
  prepare();
  // Everything is checked: from here on files are written.
  const bool main = o_.hooks.main_process;
  std::FILE* log = main ? open_log() : nullptr;
  struct Closer {
    std::FILE* f;
    ~Closer() {
      if (f) std::fclose(f);
    }
  } closer{log};

  const bool show = main && o_.progress != 0;
  ProgressBar bar(total_, stdout);  // a bar on a terminal, plain lines in a file or pipe
  bar.start_at(start_);
  struct BarGuard {
    ProgressBar* b;
    ~BarGuard() {
      if (b) b->finish();
    }
  } bar_guard{show ? &bar : nullptr};

  model_.train();
  SignalGuard signals(o_.handle_signals);
  t0_ = std::chrono::steady_clock::now();
  FitResult res;
  res.start_step = start_;
  int64_t step = start_, last_checkpoint = -1;
  if (eval_ && o_.eval_at_start && start_ == 0 && end_ > 0 && main) evaluate_at_start(res, log, show ? &bar : nullptr);
  bool stop = false;
  while (step < end_ && !stop) {
    json rec;
    FitState st;
    const Plan plan = o_.time_limit_s > 0 ? plan_for_time(step) : Plan{};
    one_step(step, rec, st);
    if (plan.changed) rec["planned_steps"] = planned_;  // the first step under a plan
    if (o_.progress != 0 && !plan.line.empty()) st.messages.insert(st.messages.begin(), plan.line);
    res.losses.push_back(st.loss);
    if (st.evaluated) {
      res.eval_losses.push_back(st.eval_loss);
      res.eval_steps.push_back(step + 1);
    }
    report(step, rec, st, log, show ? &bar : nullptr);
    ++step;
    if (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) {
      save_checkpoint(step);
      last_checkpoint = step;
    }
    iter_timed_ = step - start_ > kTimePlanSkip && !evaluates_ && last_checkpoint != step;  // the same on every process
    stop = should_stop(st.stop, step, res);
    if (step == last_step_ + 1) {
      stop = true;
      res.out_of_time = true;
    }
  }
  if (step < total_ && !res.interrupted) res.stopped = true;
  res.steps_done = step;
  res.skipped = skipped_;
  res.planned_steps = planned_;
  if (!o_.checkpoint_path.empty() && last_checkpoint != step) save_checkpoint(step);
  return res;
}

// The options checked, the parameters gathered, and the steps to run [start_, end_): from the resume
// checkpoint, or from the DataLoader's position.
template <Backend B> void Engine<B>::prepare() {
  validate();
  KILN_CHECK(o_.precision == DType::f32 || o_.precision == DType::bf16 || o_.precision == DType::f16,
             "fit: precision must be f32, bf16 or f16, got {}", o_.precision);
  if (o_.precision == DType::f16) scaler_.emplace(o_.loss_scale);
  named_ = model_.named_parameters();
  for (const auto& [n, p] : named_) params_.push_back(p);
  for (const auto& g : opt_.groups()) peaks_.push_back(o_.lr > 0 ? o_.lr : g.lr);

  if (!o_.resume_path.empty()) {
    resume();
  } else if (!train_.indexed()) {
    // Training starts at the loader's position (0 for a fresh loader); windows start at epoch starts.
    if (train_.position() == train_.batches_per_epoch()) train_.set_epoch(train_.epoch() + 1);
    KILN_CHECK(train_.position() % k_ == 0, "fit: the DataLoader is at batch {} of its epoch, not a multiple of grad_accum {}",
               train_.position(), k_);
    start_ = o_.epochs > 0 ? std::min(total_, train_.epoch() * spe_ + train_.position() / k_) : 0;
  }
  end_ = o_.stop_after >= 0 ? std::min(total_, std::max(start_, o_.stop_after)) : total_;
}

// The JSONL log (none without log_path): a resumed run keeps the records before its first step.
template <Backend B> std::FILE* Engine<B>::open_log() {
  if (o_.log_path.empty()) return nullptr;
  if (start_ > 0) fit_detail::truncate_log(o_.log_path, start_);
  std::FILE* log = std::fopen(o_.log_path.c_str(), start_ > 0 ? "a" : "w");
  KILN_CHECK(log != nullptr, "fit: cannot open log file '{}'", o_.log_path);
  return log;
}

// A step's record in the log (with the step function's and callbacks' metrics), its messages, and
// the progress bar (when shown).
template <Backend B> void Engine<B>::report(int64_t step, json& rec, const FitState& st, std::FILE* log, ProgressBar* bar) {
  const bool main = o_.hooks.main_process;
  for (const auto& [k, v] : st.metrics) {
    KILN_CHECK(!rec.contains(k), "fit: metric '{}' at step {} has the name of a built-in log key", k, step);
    rec[k] = v;
  }
  if (log) {
    fmt::print(log, "{}\n", rec.dump());
    std::fflush(log);
  }
  for (const std::string& line : st.messages) {
    if (bar)
      bar->message(line);
    else if (main)
      fmt::print("{}\n", line);
  }
  if (bar) {
    std::string extra;
    if (o_.epochs > 0) extra = fmt::format("epoch {}/{}", st.epoch + 1, o_.epochs);
    if (st.evaluated) extra += fmt::format("{}eval {:.4f}", extra.empty() ? "" : " ", st.eval_loss);
    if (skipped_ > 0) extra += fmt::format("{}skipped {}", extra.empty() ? "" : " ", skipped_);
    if (step == start_) bar->set_unit(last_tokens_ > 0 ? "tok" : "samples");
    bar->set_total(total_);  // a time limit's plan may have shortened the run
    bar->update(step, st.loss, st.lr, last_tokens_ > 0 ? last_tokens_ : last_samples_, extra, last_flops_);
  }
}

// Whether the run ends after `step` steps: a callback asked (res.stopped when steps were left) or a
// signal came; with several processes, when any of them says so, so that all stop after the same step.
template <Backend B> bool Engine<B>::should_stop(bool asked, int64_t step, FitResult& res) {
  bool signalled = g_signal.load() != 0, stop = false;
  if (o_.hooks.sum_over_processes) {
    std::vector<double> flags{asked ? 1.0 : 0.0, signalled ? 1.0 : 0.0};
    o_.hooks.sum_over_processes(flags);
    asked = flags[0] > 0;
    signalled = flags[1] > 0;
  }
  if (asked) {
    stop = true;
    res.stopped = step < total_;
  }
  if (signalled) {
    stop = true;
    res.interrupted = true;
  }
  return stop;
}

template <Backend B> void Engine<B>::one_step(int64_t step, json& rec, FitState& st) {
  const profile::Scope prof("fit.step", "step");
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = schedule_lr(step);
  const int64_t epoch = train_.epoch();
  StepSums sums = run_window(step);
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const double norm = finish_gradients(loss_scale);
  reduce_losses(sums);
  const Update u = update(step, sums.loss, norm, loss_scale);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Past the time limit: this step is the last (it evaluates as the last one does; the loop stops after it).
  if (o_.time_limit_s > 0 && step + 1 < total_ && out_of_time()) {
    last_step_ = step;
    if (o_.progress != 0)  // the loop's own lines go with its progress output
      st.print(fmt::format("time limit {:g} s reached after step {} of {} ({:.1f} s): the run ends here", o_.time_limit_s, step + 1, total_,
                           elapsed_s()));
  }

  rec = step_record(step, sums, lr, norm, ms, loss_scale, u);
  st.step = step;
  st.total_steps = total_;
  st.epoch = epoch;
  st.loss = sums.loss;
  st.lr = lr;
  st.grad_norm = norm;
  st.skipped = !u.finite;
  for (const auto& [k, v] : sums.metrics) st.metrics[k] = v / static_cast<double>(sums.m);
  after_update(step, epoch, rec, st);
  last_samples_ = sums.samples;
  last_tokens_ = sums.tokens;
  last_flops_ = sums.flops;
}

// Each group's lr from the schedule (unless a scheduler object sets them); group 0's, as logged.
template <Backend B> double Engine<B>::schedule_lr(int64_t step) {
  auto& groups = opt_.groups();
  for (size_t i = 0; i < groups.size() && !o_.scheduler; ++i) {
    const double lr = o_.schedule.at(peaks_[i], step, total_);
    KILN_CHECK(lr >= 0 && std::isfinite(lr), "fit: the schedule gives lr {} at step {}", lr, step);
    groups[i].lr = lr;
  }
  return groups.empty() ? 0.0 : groups[0].lr;
}

// The micro-batch window: grad_accum batches, or what is left of a DataLoader epoch; each fetched,
// run forward under autocast and backward, its gradient scaled by 1/m (and the f16 loss scale).
template <Backend B> typename Engine<B>::StepSums Engine<B>::run_window(int64_t step) {
  opt_.zero_grad();
  for (auto& p : params_) p.zero_grad();
  StepSums sums;
  const int64_t m = train_.indexed() ? k_ : std::min(k_, train_.batches_per_epoch() - train_.position());
  sums.m = m;
  for (int64_t j = 0; j < m; ++j) {
    const std::function<void()> micro = [&] {
      {
        const profile::Scope prof_fetch("fit.fetch_batch", "data");
        train_.fetch(step * k_ + j);
      }
      StepOutput<B> out;
      {
        const profile::Scope prof_fwd("fit.forward", "step");
        const auto t = std::chrono::steady_clock::now();
        autocast::Scope ac(o_.precision);  // the forward and loss; backward below runs outside it
        out = step_();
        forward_s_ += seconds_since(t);
        ++forwards_;
      }
      KILN_CHECK(out.loss.defined() && out.loss.numel() == 1, "fit: the step function must return a scalar loss, got {}",
                 out.loss.defined() ? shape_str(out.loss.shape()) : std::string("an undefined Var"));
      {
        const profile::Scope prof_bwd("fit.backward", "step");
        const double factor = (m == 1 ? 1.0 : 1.0 / static_cast<double>(m)) * (scaler_ ? scaler_->scale() : 1.0);
        if (factor == 1.0)
          out.loss.backward();
        else
          out.loss.mul(factor).backward();
      }
      sums.losses.push_back(out.loss.value());
      for (const auto& [k, v] : out.metrics) sums.metrics[k] += v;
      sums.samples += out.samples;
      sums.tokens += out.tokens;
      sums.flops += out.flops;
    };
    if (o_.hooks.around_micro_batch)
      o_.hooks.around_micro_batch(j, m, micro);
    else
      micro();
  }
  return sums;
}

// After the window: the after_backward hook (all-reduce), the f16 loss scale taken out of the
// gradients; returns their global norm.
template <Backend B> double Engine<B>::finish_gradients(double loss_scale) {
  if (o_.hooks.after_backward) o_.hooks.after_backward();
  if (scaler_)  // unscale: the gradients of the loss itself
    for (const auto& p : params_) {
      Tensor<B> g = p.grad();
      if (g.defined()) g.mul_(1.0 / loss_scale);
    }
  return optim::grad_norm(params_);
}

// The window's mean loss; with several processes the global loss, metrics and counts, the same on
// every process.
template <Backend B> void Engine<B>::reduce_losses(StepSums& sums) {
  double loss = 0;
  for (const auto& l : sums.losses) loss += item<double>(l);
  if (sums.m > 1) loss /= static_cast<double>(sums.m);
  if (o_.hooks.sum_over_processes) {
    std::vector<double> xs{loss, static_cast<double>(sums.samples), static_cast<double>(sums.tokens), sums.flops};
    for (const auto& [k, v] : sums.metrics) xs.push_back(v);
    o_.hooks.sum_over_processes(xs);
    const double p = static_cast<double>(o_.hooks.processes);
    loss = xs[0] / p;
    sums.samples = static_cast<int64_t>(xs[1]);
    sums.tokens = static_cast<int64_t>(xs[2]);
    sums.flops = xs[3];
    size_t i = 4;
    for (auto& [k, v] : sums.metrics) v = xs[i++] / p;
  }
  sums.loss = loss;
}

// The optimizer step (clipped), or none: a non-finite step fails, is skipped, or is an f16 overflow.
template <Backend B> typename Engine<B>::Update Engine<B>::update(int64_t step, double loss, double norm, double loss_scale) {
  const bool finite = std::isfinite(loss) && std::isfinite(norm);
  // f16: gradients that overflow under a finite loss are the loss scale's business (skip, back off),
  // not a diverged run, until the scale reaches its floor. A non-finite loss comes from the forward,
  // before any scaling: a divergence, as non-finite gradients at the floor; neither moves the scale.
  const bool overflow = scaler_ && !finite && std::isfinite(loss) && scaler_->can_back_off();
  if (scaler_ && (finite || overflow)) scaler_->update(overflow);
  if (finite) {
    if (o_.grad_clip > 0) {
      const double coef = std::min(1.0, o_.grad_clip / (norm + 1e-6));  // optim::clip_grad_norm's formula
      if (coef < 1.0)
        for (const auto& p : params_) {
          Tensor<B> g = p.grad();
          if (g.defined()) g.mul_(coef);
        }
    }
    opt_.step();
    if (ema_) ema_->update();
  } else if (o_.on_nonfinite == NonFinite::error && !overflow) {
    fail_nonfinite(step, loss, norm, loss_scale);
  } else if (overflow) {
    opt_.zero_grad();
    for (auto& p : params_) p.zero_grad();
  } else {
    opt_.zero_grad();
    for (auto& p : params_) p.zero_grad();
    ++skipped_;
  }
  return {finite, overflow};
}

// The step's log record (before evaluation adds eval_loss).
template <Backend B>
json Engine<B>::step_record(int64_t step, const StepSums& sums, double lr, double norm, double ms, double loss_scale, Update u) const {
  json rec = {{"step", step}, {"loss", sums.loss}, {"lr", lr}, {"grad_norm", norm}, {"ms", ms}};
  if (sums.tokens > 0) rec["tokens_per_s"] = static_cast<double>(sums.tokens) / (ms / 1e3);
  if (sums.samples > 0) rec["samples_per_s"] = static_cast<double>(sums.samples) / (ms / 1e3);
  if (sums.flops > 0) {
    rec["flops"] = sums.flops;
    rec["gflops"] = sums.flops / (ms / 1e3) / 1e9;
  }
  if (scaler_) rec["loss_scale"] = loss_scale;
  if (u.overflow) {
    rec["overflow"] = true;
  } else if (!u.finite) {
    rec["skipped"] = true;
    rec["skipped_steps"] = skipped_;
  }
  return rec;
}

// After the update: the scheduler, evaluation (of the EMA weights when there are), the callbacks,
// and the DataLoader's next epoch.
template <Backend B> void Engine<B>::after_update(int64_t step, int64_t epoch, json& rec, FitState& st) {
  if (o_.scheduler && !o_.scheduler->needs_metric()) o_.scheduler->step();
  const bool eval_now = eval_ && ((o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) || step + 1 == total_ || step == last_step_);
  evaluates_ = eval_now;
  if (eval_now && o_.hooks.main_process) {
    st.eval_loss = evaluate_weights(st.metrics);
    st.evaluated = true;
    rec["eval_loss"] = st.eval_loss;
  }
  if (eval_now && o_.scheduler && o_.scheduler->needs_metric()) {
    std::vector<double> metric{o_.hooks.main_process ? st.eval_loss : 0.0};  // rank 0 evaluates: every rank steps on its loss
    if (o_.hooks.sum_over_processes) o_.hooks.sum_over_processes(metric);
    o_.scheduler->step(metric[0]);
  }
  if (st.evaluated)
    for (const auto& cb : o_.callbacks)
      if (cb.on_eval) cb.on_eval(st);
  for (const auto& cb : o_.callbacks)
    if (cb.on_step) cb.on_step(st);
  if (!train_.indexed() && train_.position() == train_.batches_per_epoch()) {
    train_.set_epoch(epoch + 1);
    for (const auto& cb : o_.callbacks)
      if (cb.on_epoch) cb.on_epoch(st);
  }
}

template <Backend B> double Engine<B>::elapsed_s() const { return elapsed_before_ + seconds_since(t0_); }

template <Backend B> bool Engine<B>::out_of_time() {
  std::vector<double> flag{o_.hooks.main_process && elapsed_s() >= o_.time_limit_s ? 1.0 : 0.0};
  if (o_.hooks.sum_over_processes) o_.hooks.sum_over_processes(flag);
  return flag[0] > 0;
}

// Seconds that n more steps after `done` take: the steps, the evaluations among them (every
// eval_every-th and the last) and the checkpoints (every checkpoint_every-th and the final one).
template <Backend B> double Engine<B>::planned_cost(int64_t done, int64_t n, double step_s, double eval_s, double checkpoint_s) const {
  const int64_t end = done + n;
  auto every = [&](int64_t k) { return k > 0 ? end / k - done / k : 0; };  // multiples of k in (done, end]
  int64_t evals = 0, checkpoints = 0;
  if (eval_) evals = every(o_.eval_every) + (o_.eval_every > 0 && end % o_.eval_every == 0 ? 0 : 1);
  if (!o_.checkpoint_path.empty())
    checkpoints = every(o_.checkpoint_every) + (o_.checkpoint_every > 0 && end % o_.checkpoint_every == 0 ? 0 : 1);
  return static_cast<double>(n) * step_s + static_cast<double>(evals) * eval_s + static_cast<double>(checkpoints) * checkpoint_s;
}

// The plan (loop.hpp), before step `step`: the last iteration timed; once kTimePlanSteps are, the
// steps that fit the time left at their mean time (the loop's whole iteration: logging and progress
// too); then revisions, each on the mean time of the steps timed since the last: every kTimePlanSteps
// while the run is early (its warmup and the first tenth after it, where the lr hardly depends on the
// total: anywhere up to the run's steps), then every max(kTimePlanSteps, total/20) steps, by at most
// kTimePlanMove of the steps either way.
template <Backend B> typename Engine<B>::Plan Engine<B>::plan_for_time(int64_t step) {
  const auto now = std::chrono::steady_clock::now();
  if (iter_timed_) step_s_.push_back(std::chrono::duration<double>(now - iter_t0_).count());
  iter_t0_ = now;
  const int64_t warmup = o_.schedule.warmup_steps, timed = static_cast<int64_t>(step_s_.size());
  const bool early = step < warmup + (total_ - warmup) / 10;
  const int64_t window = plans_ == 0 || early ? kTimePlanSteps : std::max(kTimePlanSteps, total_ / 20);
  if ((o_.scheduler && plans_ > 0) || timed < window) return {};
  ++plans_;
  double mean = 0;
  for (double t : step_s_) mean += t / static_cast<double>(timed);
  step_s_.clear();
  // Rank 0's clock, evaluation and checkpoint times; the processes' mean step time.
  const bool main = o_.hooks.main_process;
  const double eval_estimate =
      eval_s_ >= 0
          ? eval_s_
          : (eval_ && forwards_ > 0 ? static_cast<double>(eval_->batches_per_epoch()) * forward_s_ / static_cast<double>(forwards_) : 0.0);
  std::vector<double> xs{main ? o_.time_limit_s - elapsed_s() : 0.0, mean, main ? eval_estimate : 0.0,
                         main ? std::max(0.0, checkpoint_s_) : 0.0};
  if (o_.hooks.sum_over_processes) {
    o_.hooks.sum_over_processes(xs);
    xs[1] /= static_cast<double>(o_.hooks.processes);
  }
  const double left_s = xs[0], step_s = xs[1], eval_s = xs[2], checkpoint_s = xs[3];
  auto cost = [&](int64_t n) { return planned_cost(step, n, step_s, eval_s, checkpoint_s); };
  const std::string rate = fmt::format("time limit {:g} s: at {:.1f} ms a step{}", o_.time_limit_s, step_s * 1e3,
                                       eval_ ? fmt::format(" ({:.2f} s an evaluation)", eval_s) : std::string());
  if (o_.scheduler) {
    if (total_ <= step || cost(total_ - step) <= left_s) return {};
    return {
        .changed = false,
        .line = rate + fmt::format(", the {} steps would take about {:.0f} s; the scheduler object ({}) keeps its length: the run stops "
                                   "at the limit",
                                   total_, o_.time_limit_s - left_s + cost(total_ - step), o_.scheduler->kind())};
  }
  const int64_t room = full_total_ - step;  // the most steps a plan may give
  if (room <= 0) return {};
  int64_t lo = 0, hi = room + 1;  // the most steps that fit: cost(lo) <= left_s (or lo = 0), cost(hi) > left_s
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (cost(mid) <= left_s ? lo : hi) = mid;
  }
  int64_t total = step + std::max<int64_t>(lo, 1);
  if (!early && plans_ > 1) {  // later revisions move the end a little: the lr by about a percent of its peak at most
    const auto move = std::max<int64_t>(1, static_cast<int64_t>(kTimePlanMove * static_cast<double>(full_total_)));
    total = std::clamp(total, std::max(step + 1, total_ - move), total_ + move);
  }
  if (total == total_) return {};
  planned_ = total_ = total;
  end_ = o_.stop_after >= 0 ? std::min(total_, std::max(start_, o_.stop_after)) : total_;
  // A line for the first plan and for revisions that move the end by 5% or more since the last line.
  if (shown_total_ > 0 && std::abs(total_ - shown_total_) * 20 < shown_total_) return {.changed = true, .line = {}};
  shown_total_ = total_;
  return {.changed = true, .line = rate + fmt::format(", {} of the {} steps fit; the schedule now ends there", total_, full_total_)};
}

}  // namespace

std::map<std::string, std::string> checkpoint_metadata(int64_t step, int64_t grad_accum, const std::string& optimizer_kind) {
  const Generator& g = default_generator();
  std::map<std::string, std::string> meta{{"kiln_checkpoint", "1"},
                                          {"step", std::to_string(step)},
                                          {"rng_seed", std::to_string(g.seed())},
                                          {"rng_offset", std::to_string(g.offset())},
                                          {"grad_accum", std::to_string(grad_accum)}};
  if (!optimizer_kind.empty()) {
    meta["optimizer"] = optimizer_kind;
    meta["optimizer_kinds"] = "2";  // stable names, AdamW apart from Adam (Optimizer::reads_kind)
  }
  return meta;
}

namespace fit_detail {

std::map<std::string, std::string> loader_state(const DataLoaderState& s) { return s.to_map("data."); }
DataLoaderState loader_state(const std::map<std::string, std::string>& m) { return DataLoaderState::from_map(m, "data."); }
std::map<std::string, std::string> indexed_state(const std::string& fingerprint) { return {{"data.fingerprint", fingerprint}}; }
void check_indexed_state(const std::map<std::string, std::string>& m, const std::string& fingerprint) {
  const auto it = m.find("data.fingerprint");
  if (it == m.end() || it->second.empty() || fingerprint.empty()) return;  // nothing to compare
  KILN_CHECK(it->second == fingerprint, "fit: the checkpoint's data is '{}', this run's is '{}'", printable(it->second), fingerprint);
}

template <Backend B> FitResult fit(nn::Module<B>& model, optim::Optimizer<B>& opt, Source& train,
                                   const std::function<StepOutput<B>()>& step, Source* eval,
                                   const std::function<StepOutput<B>()>* eval_step, const FitOptions& o) {
  return Engine<B>(model, opt, train, step, eval, eval_step, o).run();
}

#define KILN_INST(B)                                                                                                       \
  template FitResult fit<B>(nn::Module<B>&, optim::Optimizer<B>&, Source&, const std::function<StepOutput<B>()>&, Source*, \
                            const std::function<StepOutput<B>()>*, const FitOptions&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace fit_detail

}  // namespace kiln
