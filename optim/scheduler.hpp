#pragma once
// Learning-rate scheduler objects with torch.optim.lr_scheduler's names and semantics (torch 1.13):
//
//   optim::AdamW-like opt(...);
//   optim::CosineAnnealingLR sched(opt, /*T_max=*/100);
//   for (...) { ...; opt.step(); sched.step(); }   // step() after optimizer.step()
//
// A scheduler changes the lr of every parameter group of the optimizer it is built on; each group has
// its own base lr (PyTorch's group["initial_lr"], ParamGroup::initial_lr, set by the first scheduler
// built on the optimizer). Building one performs PyTorch's initial step: the groups' lr become the
// schedule's value at epoch 0. step() moves to the next epoch (one optimizer step or one epoch: the
// caller decides) with PyTorch's recursive ("chainable") formulas, operation for operation, so the
// learning rates equal torch's step for step. get_last_lr() returns the lr of each group.
//
// state_dict() / load_state_dict(): the scheduler's state (epoch counters, base lrs, the last lrs,
// ReduceLROnPlateau's best value...) as text values (doubles written so that they read back exactly),
// not its hyperparameters (give the same ones when resuming). kiln's optimizer state holds no lr, so
// loading also sets the groups' lr to the saved last lrs. kiln::fit saves it in its checkpoints
// (FitOptions::scheduler).
//
// Differences from PyTorch: no `last_epoch` constructor argument (resume with load_state_dict), no
// `verbose`; CosineAnnealingWarmRestarts steps by whole epochs only (no fractional step(epoch)).
// OneCycleLR's cycled momentum is not in its state (PyTorch keeps it in the optimizer's param groups):
// load_state_dict sets it again from the step, as it does the lr.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::optim {

// The learning rates of an optimizer's parameter groups, whatever its backend.
class LrGroups {
 public:
  template <Backend B> LrGroups(Optimizer<B>& opt)  // NOLINT(google-explicit-constructor): schedulers take the optimizer itself
      : id_(&opt),
        size_([&opt] { return opt.groups().size(); }),
        lr_([&opt](size_t i) -> double& { return opt.groups().at(i).lr; }),
        initial_([&opt](size_t i) -> std::optional<double>& { return opt.groups().at(i).initial_lr; }),
        momentum_([&opt](size_t i) -> std::optional<double>& { return opt.groups().at(i).momentum; }),
        momentum_kind_([&opt] { return opt.momentum_kind(); }) {}
  size_t size() const { return size_(); }
  double& lr(size_t i) const { return lr_(i); }
  std::optional<double>& initial_lr(size_t i) const { return initial_(i); }
  std::optional<double>& momentum(size_t i) const { return momentum_(i); }  // ParamGroup::momentum
  std::string momentum_kind() const { return momentum_kind_(); }            // Optimizer::momentum_kind
  const void* id() const { return id_; }                                    // the optimizer

 private:
  const void* id_;
  std::function<size_t()> size_;
  std::function<double&(size_t)> lr_;
  std::function<std::optional<double>&(size_t)> initial_;
  std::function<std::optional<double>&(size_t)> momentum_;
  std::function<std::string()> momentum_kind_;
};

using SchedulerState = std::map<std::string, std::string>;

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // The next epoch: call after optimizer.step().
  virtual void step();
  // ReduceLROnPlateau's step(metrics); the other schedulers refuse it.
  virtual void step(double metric);
  virtual bool needs_metric() const { return false; }
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  virtual std::string kind() const = 0;  // PyTorch's class name: "StepLR", ...
  const void* optimizer_id() const { return g_.id(); }

  virtual SchedulerState state_dict() const;
  // Strict: the keys state_dict() writes, no others; then the groups' lr = the saved last lrs.
  virtual void load_state_dict(const SchedulerState& state);

 protected:
  explicit LRScheduler(LrGroups g) : g_(std::move(g)) {}
  void init_base_lrs();                      // group.setdefault("initial_lr", group["lr"]); base_lrs = initial_lrs
  void initial_step();                       // PyTorch's _initial_step: step_count = 0, then step()
  virtual void step_to(int64_t epoch);       // PyTorch's step(epoch): the closed form where there is one (SequentialLR)
  virtual std::vector<double> get_lr() = 0;  // the chainable form at last_epoch
  virtual std::optional<std::vector<double>> closed_form_lr() { return std::nullopt; }
  void apply(const std::vector<double>& lrs);  // groups' lr = lrs; last_lr = lrs
  double group_lr(size_t i) const { return g_.lr(i); }
  size_t groups() const { return g_.size(); }
  // state_dict helpers for subclasses
  virtual void save_extra(SchedulerState&) const {}
  virtual void load_extra(const SchedulerState&, std::vector<std::string>&) {}
  friend class SequentialLR;

  LrGroups g_;
  std::vector<double> base_lrs_, last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
};

// lr = base_lr · λ(epoch), one λ for every group or one per group.
class LambdaLR final : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  LambdaLR(LrGroups opt, Lambda lr_lambda);
  LambdaLR(LrGroups opt, std::vector<Lambda> lr_lambdas);
  std::string kind() const override { return "LambdaLR"; }

 private:
  std::vector<double> get_lr() override;
  std::vector<Lambda> f_;
};

// lr × gamma every step_size epochs.
class StepLR final : public LRScheduler {
 public:
  StepLR(LrGroups opt, int64_t step_size, double gamma = 0.1);
  std::string kind() const override { return "StepLR"; }

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() override;
  int64_t step_size_;
  double gamma_;
};

// lr × gamma at each milestone (a milestone given k times: × gamma^k).
class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(LrGroups opt, std::vector<int64_t> milestones, double gamma = 0.1);
  std::string kind() const override { return "MultiStepLR"; }

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() override;
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr × gamma every epoch.
class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(LrGroups opt, double gamma);
  std::string kind() const override { return "ExponentialLR"; }

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() override;
  double gamma_;
};

// Half a cosine from base_lr down to eta_min over T_max epochs (and back up after, as PyTorch).
class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(LrGroups opt, int64_t T_max, double eta_min = 0.0);
  std::string kind() const override { return "CosineAnnealingLR"; }

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() override;
  int64_t T_max_;
  double eta_min_;
};

// SGDR: cosine annealing restarted after T_0 epochs, each period T_mult times the last.
class CosineAnnealingWarmRestarts final : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(LrGroups opt, int64_t T_0, int64_t T_mult = 1, double eta_min = 0.0);
  void step() override;
  std::string kind() const override { return "CosineAnnealingWarmRestarts"; }
  int64_t T_i() const { return T_i_; }
  int64_t T_cur() const { return T_cur_; }

 private:
  std::vector<double> get_lr() override;
  void step_to(int64_t epoch) override;  // PyTorch's step(epoch), for a whole epoch
  void save_extra(SchedulerState& s) const override;
  void load_extra(const SchedulerState& s, std::vector<std::string>& used) override;
  int64_t T_0_, T_i_, T_mult_;
  double eta_min_;
  int64_t T_cur_ = -1;
};

// lr × a factor going linearly from start_factor to end_factor over total_iters epochs.
class LinearLR final : public LRScheduler {
 public:
  LinearLR(LrGroups opt, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  std::string kind() const override { return "LinearLR"; }

 private:
  std::vector<double> get_lr() override;
  std::optional<std::vector<double>> closed_form_lr() override;
  double start_, end_;
  int64_t total_;
};

struct OneCycleLROptions {
  std::vector<double> max_lr{};  // one value for every group, or one per group
  int64_t total_steps = 0;       // or epochs × steps_per_epoch
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // cos | linear
  double div_factor = 25.0;             // initial_lr = max_lr / div_factor
  double final_div_factor = 1e4;        // min_lr = initial_lr / final_div_factor
  bool three_phase = false;
  // PyTorch's cycle_momentum (default true, as torch): the group's momentum (SGD, RMSprop) or beta1
  // (Adam, AdamW, Lion) goes inversely to the lr, from max_momentum down to base_momentum while the lr
  // rises and back while it falls (three_phase: then stays at max_momentum); one value for every
  // group or one per group. An optimizer without either (Adagrad, Adafactor) is an Error unless false.
  bool cycle_momentum = true;
  std::vector<double> base_momentum{0.85};
  std::vector<double> max_momentum{0.95};
};

// The 1cycle policy: up from max_lr/div_factor to max_lr over pct_start of the steps, then down to
// min_lr (three_phase: back to the initial lr, then down). Stepping past total_steps is an Error.
class OneCycleLR final : public LRScheduler {
 public:
  OneCycleLR(LrGroups opt, OneCycleLROptions o);
  std::string kind() const override { return "OneCycleLR"; }
  int64_t total_steps() const { return total_; }

 private:
  std::vector<double> get_lr() override;
  void load_extra(const SchedulerState& state, std::vector<std::string>& keys) override;
  // The lrs at step `step_num` and, with cycle_momentum, the groups' momentum set to its value there.
  std::vector<double> at(int64_t step_num);
  struct Phase {
    double end_step;
    int start, end;      // 0 initial_lr, 1 max_lr, 2 min_lr
    int m_start, m_end;  // 0 max_momentum, 1 base_momentum
  };
  OneCycleLROptions o_;
  int64_t total_ = 0;
  std::vector<Phase> phases_;
  std::vector<double> initial_, max_, min_, max_m_, base_m_;
};

// Runs schedulers[i] from milestones[i-1] on (warm-up, then decay): at a milestone the next scheduler
// restarts at its epoch 0.
class SequentialLR final : public LRScheduler {
 public:
  SequentialLR(LrGroups opt, std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<int64_t> milestones);
  void step() override;
  std::string kind() const override { return "SequentialLR"; }
  SchedulerState state_dict() const override;
  void load_state_dict(const SchedulerState& state) override;

 private:
  std::vector<double> get_lr() override { return last_lr_; }
  std::vector<std::shared_ptr<LRScheduler>> s_;
  std::vector<int64_t> milestones_;
};

struct ReduceLROnPlateauOptions {
  std::string mode = "min";  // min | max: whether a lower or a higher metric is better
  double factor = 0.1;       // new lr = max(lr × factor, min_lr)
  int64_t patience = 10;     // epochs without improvement before a reduction
  double threshold = 1e-4;
  std::string threshold_mode = "rel";  // rel | abs
  int64_t cooldown = 0;                // epochs to wait after a reduction
  std::vector<double> min_lr{0.0};     // one value for every group, or one per group
  double eps = 1e-8;                   // reductions smaller than this are skipped
};

// Reduces the lr when a metric stopped improving: step(metric), e.g. after each evaluation.
class ReduceLROnPlateau final : public LRScheduler {
 public:
  ReduceLROnPlateau(LrGroups opt, ReduceLROnPlateauOptions o = {});
  void step() override;  // an Error: the metric is needed
  void step(double metric) override;
  bool needs_metric() const override { return true; }
  std::string kind() const override { return "ReduceLROnPlateau"; }
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return bad_; }

 private:
  std::vector<double> get_lr() override { return last_lr_; }
  bool is_better(double a, double best) const;
  void save_extra(SchedulerState& s) const override;
  void load_extra(const SchedulerState& s, std::vector<std::string>& used) override;
  ReduceLROnPlateauOptions o_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t bad_ = 0, cooldown_counter_ = 0;
};

}  // namespace kiln::optim
#pragma GCC visibility pop
