#include "kiln/optim/scheduler.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numbers>

#include "kiln/core/error.hpp"

namespace kiln::optim {

namespace {

constexpr double kPi = std::numbers::pi;  // Python's math.pi

std::string num(double v) { return fmt::format("{}", v); }  // shortest text that reads back exactly
std::string num(int64_t v) { return std::to_string(v); }

const std::string& need(const SchedulerState& s, const std::string& kind, const std::string& key, std::vector<std::string>& used) {
  const auto it = s.find(key);
  KILN_CHECK(it != s.end(), "{}: load_state_dict: no '{}' entry", kind, key);
  used.push_back(key);
  return it->second;
}
double get_f64(const SchedulerState& s, const std::string& kind, const std::string& key, std::vector<std::string>& used) {
  const std::string& v = need(s, kind, key, used);
  double x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  KILN_CHECK(ec == std::errc() && p == v.data() + v.size(), "{}: load_state_dict: '{}' = '{}' is not a number", kind, key, v);
  return x;
}
int64_t get_i64(const SchedulerState& s, const std::string& kind, const std::string& key, std::vector<std::string>& used) {
  const std::string& v = need(s, kind, key, used);
  int64_t x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  KILN_CHECK(ec == std::errc() && p == v.data() + v.size(), "{}: load_state_dict: '{}' = '{}' is not an integer", kind, key, v);
  return x;
}

// One value for every group, or one per group.
std::vector<double> per_group(const std::vector<double>& v, size_t groups, const std::string& what) {
  KILN_CHECK(v.size() == 1 || v.size() == groups, "{}: expected 1 or {} values (one per parameter group), got {}", what, groups, v.size());
  return v.size() == 1 ? std::vector<double>(groups, v[0]) : v;
}

}  // namespace

// ------------------------------------------------------------------------------------------ base
void LRScheduler::init_base_lrs() {
  base_lrs_.clear();
  for (size_t i = 0; i < groups(); ++i) {
    auto& init = g_.initial_lr(i);
    if (!init) init = g_.lr(i);
    base_lrs_.push_back(*init);
  }
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LRScheduler::apply(const std::vector<double>& lrs) {
  KILN_CHECK(lrs.size() == groups(), "{}: {} learning rates for {} parameter groups (the optimizer's groups changed?)", kind(), lrs.size(),
             groups());
  for (size_t i = 0; i < lrs.size(); ++i) {
    KILN_CHECK(std::isfinite(lrs[i]) && lrs[i] >= 0, "{}: lr {} for group {} at epoch {} (must be finite and >= 0)", kind(), lrs[i], i,
               last_epoch_);
    g_.lr(i) = lrs[i];
  }
  last_lr_ = lrs;
}

void LRScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  apply(get_lr());
}

void LRScheduler::step(double metric) {
  fail("{}: step(metric {}) is ReduceLROnPlateau's; this scheduler steps with step()", kind(), metric);
}

void LRScheduler::step_to(int64_t epoch) {
  ++step_count_;
  last_epoch_ = epoch;
  auto closed = closed_form_lr();
  apply(closed ? *closed : get_lr());
}

SchedulerState LRScheduler::state_dict() const {
  SchedulerState s{{"last_epoch", num(last_epoch_)}, {"step_count", num(step_count_)}};
  for (size_t i = 0; i < base_lrs_.size(); ++i) s["base_lrs." + std::to_string(i)] = num(base_lrs_[i]);
  for (size_t i = 0; i < last_lr_.size(); ++i) s["last_lr." + std::to_string(i)] = num(last_lr_[i]);
  save_extra(s);
  return s;
}

void LRScheduler::load_state_dict(const SchedulerState& s) {
  const std::string k = kind();
  std::vector<std::string> used;
  const int64_t last_epoch = get_i64(s, k, "last_epoch", used), step_count = get_i64(s, k, "step_count", used);
  std::vector<double> base(base_lrs_.size()), last(groups());
  for (size_t i = 0; i < base.size(); ++i) base[i] = get_f64(s, k, "base_lrs." + std::to_string(i), used);
  for (size_t i = 0; i < last.size(); ++i) last[i] = get_f64(s, k, "last_lr." + std::to_string(i), used);
  load_extra(s, used);
  for (const auto& [key, v] : s)
    KILN_CHECK(std::find(used.begin(), used.end(), key) != used.end(),
               "{}: load_state_dict: unexpected entry '{}' (a scheduler of another kind, or another number of parameter groups?)", k, key);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = base;
  for (size_t i = 0; i < base.size(); ++i) g_.initial_lr(i) = base[i];
  apply(last);
}

// ------------------------------------------------------------------------------------------ LambdaLR
LambdaLR::LambdaLR(LrGroups opt, Lambda f) : LRScheduler(std::move(opt)) {
  KILN_CHECK(static_cast<bool>(f), "LambdaLR: lr_lambda is empty");
  f_.assign(groups(), f);
  init_base_lrs();
  initial_step();
}

LambdaLR::LambdaLR(LrGroups opt, std::vector<Lambda> fs) : LRScheduler(std::move(opt)), f_(std::move(fs)) {
  KILN_CHECK(f_.size() == groups(), "LambdaLR: expected {} lr_lambdas (one per parameter group), got {}", groups(), f_.size());
  for (size_t i = 0; i < f_.size(); ++i) KILN_CHECK(static_cast<bool>(f_[i]), "LambdaLR: lr_lambda {} is empty", i);
  init_base_lrs();
  initial_step();
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> out;
  for (size_t i = 0; i < groups(); ++i) out.push_back(base_lrs_[i] * f_[i](last_epoch_));
  return out;
}

// ------------------------------------------------------------------------------------------ StepLR
StepLR::StepLR(LrGroups opt, int64_t step_size, double gamma) : LRScheduler(std::move(opt)), step_size_(step_size), gamma_(gamma) {
  KILN_CHECK(step_size >= 1, "StepLR: step_size must be >= 1, got {}", step_size);
  KILN_CHECK(std::isfinite(gamma) && gamma >= 0, "StepLR: gamma must be finite and >= 0, got {}", gamma);
  init_base_lrs();
  initial_step();
}

std::vector<double> StepLR::get_lr() {
  std::vector<double> out;
  const bool keep = last_epoch_ == 0 || last_epoch_ % step_size_ != 0;
  for (size_t i = 0; i < groups(); ++i) out.push_back(keep ? group_lr(i) : group_lr(i) * gamma_);
  return out;
}

std::optional<std::vector<double>> StepLR::closed_form_lr() {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
  return out;
}

// ------------------------------------------------------------------------------------------ MultiStepLR
MultiStepLR::MultiStepLR(LrGroups opt, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(std::move(opt)), milestones_(std::move(milestones)), gamma_(gamma) {
  KILN_CHECK(std::isfinite(gamma) && gamma >= 0, "MultiStepLR: gamma must be finite and >= 0, got {}", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  init_base_lrs();
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() {
  const auto k = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  std::vector<double> out;
  for (size_t i = 0; i < groups(); ++i) out.push_back(k == 0 ? group_lr(i) : group_lr(i) * std::pow(gamma_, static_cast<double>(k)));
  return out;
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() {
  const auto n = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(n)));
  return out;
}

// ------------------------------------------------------------------------------------------ ExponentialLR
ExponentialLR::ExponentialLR(LrGroups opt, double gamma) : LRScheduler(std::move(opt)), gamma_(gamma) {
  KILN_CHECK(std::isfinite(gamma) && gamma >= 0, "ExponentialLR: gamma must be finite and >= 0, got {}", gamma);
  init_base_lrs();
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() {
  std::vector<double> out;
  for (size_t i = 0; i < groups(); ++i) out.push_back(last_epoch_ == 0 ? group_lr(i) : group_lr(i) * gamma_);
  return out;
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return out;
}

// ------------------------------------------------------------------------------------------ CosineAnnealingLR
CosineAnnealingLR::CosineAnnealingLR(LrGroups opt, int64_t T_max, double eta_min)
    : LRScheduler(std::move(opt)), T_max_(T_max), eta_min_(eta_min) {
  KILN_CHECK(T_max >= 1, "CosineAnnealingLR: T_max must be >= 1, got {}", T_max);
  KILN_CHECK(std::isfinite(eta_min) && eta_min >= 0, "CosineAnnealingLR: eta_min must be finite and >= 0, got {}", eta_min);
  init_base_lrs();
  initial_step();
}

std::vector<double> CosineAnnealingLR::get_lr() {
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  std::vector<double> out;
  for (size_t i = 0; i < groups(); ++i) {
    const double lr = group_lr(i), b = base_lrs_[i];
    if (last_epoch_ == 0)
      out.push_back(lr);
    else if (step_count_ == 1 && last_epoch_ > 0)
      out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(e * kPi / T)) / 2);
    else if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0)
      out.push_back(lr + (b - eta_min_) * (1 - std::cos(kPi / T)) / 2);
    else
      out.push_back((1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * (e - 1) / T)) * (lr - eta_min_) + eta_min_);
  }
  return out;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() {
  const double e = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * e / T)) / 2);
  return out;
}

// ------------------------------------------------------------------------------------------ CosineAnnealingWarmRestarts
CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(LrGroups opt, int64_t T_0, int64_t T_mult, double eta_min)
    : LRScheduler(std::move(opt)), T_0_(T_0), T_i_(T_0), T_mult_(T_mult), eta_min_(eta_min) {
  KILN_CHECK(T_0 >= 1, "CosineAnnealingWarmRestarts: T_0 must be >= 1, got {}", T_0);
  KILN_CHECK(T_mult >= 1, "CosineAnnealingWarmRestarts: T_mult must be >= 1, got {}", T_mult);
  KILN_CHECK(std::isfinite(eta_min) && eta_min >= 0, "CosineAnnealingWarmRestarts: eta_min must be finite and >= 0, got {}", eta_min);
  init_base_lrs();
  initial_step();
}

std::vector<double> CosineAnnealingWarmRestarts::get_lr() {
  std::vector<double> out;
  const double c = static_cast<double>(T_cur_), t = static_cast<double>(T_i_);
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * c / t)) / 2);
  return out;
}

void CosineAnnealingWarmRestarts::step() {
  if (last_epoch_ < 0) {
    step_to(0);
    return;
  }
  ++last_epoch_;
  if (++T_cur_ >= T_i_) {
    T_cur_ -= T_i_;
    T_i_ *= T_mult_;
  }
  apply(get_lr());
}

void CosineAnnealingWarmRestarts::step_to(int64_t epoch) {
  // PyTorch's step(epoch) with a whole epoch (its own step() at epoch -1, and SequentialLR's step(0)); as
  // there, it counts no step
  KILN_CHECK(epoch >= 0, "CosineAnnealingWarmRestarts: epoch must be >= 0, got {}", epoch);
  if (epoch >= T_0_) {
    if (T_mult_ == 1) {
      T_cur_ = epoch % T_0_;
    } else {
      const auto n =
          static_cast<int64_t>(std::log(static_cast<double>(epoch) / static_cast<double>(T_0_) * static_cast<double>(T_mult_ - 1) + 1) /
                               std::log(static_cast<double>(T_mult_)));
      int64_t p = 1;
      for (int64_t i = 0; i < n; ++i) p *= T_mult_;
      T_cur_ = epoch - T_0_ * (p - 1) / (T_mult_ - 1);
      T_i_ = T_0_ * p;
    }
  } else {
    T_i_ = T_0_;
    T_cur_ = epoch;
  }
  last_epoch_ = epoch;
  apply(get_lr());
}

void CosineAnnealingWarmRestarts::save_extra(SchedulerState& s) const {
  s["T_i"] = num(T_i_);
  s["T_cur"] = num(T_cur_);
}

void CosineAnnealingWarmRestarts::load_extra(const SchedulerState& s, std::vector<std::string>& used) {
  T_i_ = get_i64(s, kind(), "T_i", used);
  T_cur_ = get_i64(s, kind(), "T_cur", used);
}

// ------------------------------------------------------------------------------------------ LinearLR
LinearLR::LinearLR(LrGroups opt, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(std::move(opt)), start_(start_factor), end_(end_factor), total_(total_iters) {
  KILN_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor must be in (0, 1], got {}", start_factor);
  KILN_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], got {}", end_factor);
  KILN_CHECK(total_iters >= 1, "LinearLR: total_iters must be >= 1, got {}", total_iters);
  init_base_lrs();
  initial_step();
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> out;
  for (size_t i = 0; i < groups(); ++i) {
    const double lr = group_lr(i);
    if (last_epoch_ == 0)
      out.push_back(lr * start_);
    else if (last_epoch_ > total_)
      out.push_back(lr);
    else
      out.push_back(
          lr * (1. + (end_ - start_) / (static_cast<double>(total_) * start_ + static_cast<double>(last_epoch_ - 1) * (end_ - start_))));
  }
  return out;
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() {
  std::vector<double> out;
  for (double b : base_lrs_)
    out.push_back(b * (start_ + (end_ - start_) * static_cast<double>(std::min(total_, last_epoch_)) / static_cast<double>(total_)));
  return out;
}

// ------------------------------------------------------------------------------------------ OneCycleLR
OneCycleLR::OneCycleLR(LrGroups opt, OneCycleLROptions o) : LRScheduler(std::move(opt)), o_(std::move(o)) {
  if (o_.total_steps > 0) {
    total_ = o_.total_steps;
  } else {
    KILN_CHECK(o_.total_steps == 0 && o_.epochs > 0 && o_.steps_per_epoch > 0,
               "OneCycleLR: set total_steps > 0, or epochs > 0 and steps_per_epoch > 0; got total_steps={} epochs={} steps_per_epoch={}",
               o_.total_steps, o_.epochs, o_.steps_per_epoch);
    total_ = o_.epochs * o_.steps_per_epoch;
  }
  KILN_CHECK(o_.pct_start >= 0 && o_.pct_start <= 1, "OneCycleLR: pct_start must be in [0, 1], got {}", o_.pct_start);
  KILN_CHECK(o_.anneal_strategy == "cos" || o_.anneal_strategy == "linear",
             "OneCycleLR: anneal_strategy must be 'cos' or 'linear', got '{}'", o_.anneal_strategy);
  KILN_CHECK(o_.div_factor > 0 && o_.final_div_factor > 0, "OneCycleLR: div_factor and final_div_factor must be > 0, got {} and {}",
             o_.div_factor, o_.final_div_factor);
  const double T = static_cast<double>(total_);
  if (o_.three_phase)
    phases_ = {{o_.pct_start * T - 1, 0, 1, 0, 1}, {2 * o_.pct_start * T - 2, 1, 0, 1, 0}, {T - 1, 0, 2, 0, 0}};
  else
    phases_ = {{o_.pct_start * T - 1, 0, 1, 0, 1}, {T - 1, 1, 2, 1, 0}};
  max_ = per_group(o_.max_lr, groups(), "OneCycleLR: max_lr");
  for (size_t i = 0; i < groups(); ++i) {
    KILN_CHECK(std::isfinite(max_[i]) && max_[i] >= 0, "OneCycleLR: max_lr must be finite and >= 0, got {} (group {})", max_[i], i);
    initial_.push_back(max_[i] / o_.div_factor);
    min_.push_back(initial_.back() / o_.final_div_factor);
    g_.initial_lr(i) = initial_.back();
  }
  if (o_.cycle_momentum) {
    KILN_CHECK(!g_.momentum_kind().empty(),
               "OneCycleLR: cycle_momentum needs an optimizer with momentum or beta1 (SGD, RMSprop, Adam, AdamW, Lion); set "
               "cycle_momentum = false");
    max_m_ = per_group(o_.max_momentum, groups(), "OneCycleLR: max_momentum");
    base_m_ = per_group(o_.base_momentum, groups(), "OneCycleLR: base_momentum");
    for (size_t i = 0; i < groups(); ++i) {
      KILN_CHECK(base_m_[i] >= 0 && max_m_[i] >= 0 && base_m_[i] <= 1 && max_m_[i] <= 1,
                 "OneCycleLR: base_momentum ({}) and max_momentum ({}) must be in [0, 1] (group {})", base_m_[i], max_m_[i], i);
      g_.momentum(i) = max_m_[i];
    }
  }
  init_base_lrs();
  initial_step();
}

// Called before the base class sets last_epoch_: the groups' momentum at the saved step.
void OneCycleLR::load_extra(const SchedulerState& s, std::vector<std::string>&) {
  if (o_.cycle_momentum) (void)at(std::stoll(s.at("last_epoch")));
}

std::vector<double> OneCycleLR::get_lr() { return at(last_epoch_); }

std::vector<double> OneCycleLR::at(int64_t step_num) {
  KILN_CHECK(step_num <= total_, "OneCycleLR: stepped {} times; total_steps is {}", step_num + 1, total_);
  const bool cosine = o_.anneal_strategy == "cos";
  std::vector<double> out;
  for (size_t g = 0; g < groups(); ++g) {
    const double v[3] = {initial_[g], max_[g], min_[g]};
    double start_step = 0, lr = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const double end_step = phases_[i].end_step;
      if (static_cast<double>(step_num) <= end_step || i + 1 == phases_.size()) {
        KILN_CHECK(end_step != start_step, "OneCycleLR: phase {} has no steps (total_steps {}, pct_start {}): division by zero", i, total_,
                   o_.pct_start);
        const double pct = (static_cast<double>(step_num) - start_step) / (end_step - start_step);
        auto anneal = [&](double start, double end) {
          return cosine ? end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1) : (end - start) * pct + start;
        };
        lr = anneal(v[phases_[i].start], v[phases_[i].end]);
        if (o_.cycle_momentum) {
          const double m[2] = {max_m_[g], base_m_[g]};
          g_.momentum(g) = anneal(m[phases_[i].m_start], m[phases_[i].m_end]);
        }
        break;
      }
      start_step = end_step;
    }
    out.push_back(lr);
  }
  return out;
}

// ------------------------------------------------------------------------------------------ SequentialLR
SequentialLR::SequentialLR(LrGroups opt, std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<int64_t> milestones)
    : LRScheduler(std::move(opt)), s_(std::move(schedulers)), milestones_(std::move(milestones)) {
  KILN_CHECK(!s_.empty(), "SequentialLR: no schedulers");
  for (size_t i = 0; i < s_.size(); ++i) {
    KILN_CHECK(s_[i] != nullptr, "SequentialLR: scheduler {} is null", i);
    KILN_CHECK(s_[i]->optimizer_id() == optimizer_id(), "SequentialLR: scheduler {} ({}) belongs to another optimizer", i, s_[i]->kind());
    KILN_CHECK(!s_[i]->needs_metric(), "SequentialLR: scheduler {} is {}, which steps on a metric", i, s_[i]->kind());
  }
  KILN_CHECK(milestones_.size() + 1 == s_.size(), "SequentialLR: {} schedulers need {} milestones, got {}", s_.size(), s_.size() - 1,
             milestones_.size());
  KILN_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()), "SequentialLR: milestones must be in increasing order, got [{}]",
             fmt::join(milestones_, ", "));
  last_epoch_ = 0;
  for (size_t i = 0; i < groups(); ++i) {
    const auto& init = g_.initial_lr(i);
    KILN_CHECK(init.has_value(), "SequentialLR: parameter group {} has no initial_lr", i);
    g_.lr(i) = *init;
  }
  for (auto& s : s_) --s->last_epoch_;  // "undo" the step each scheduler made when it was built
  s_[0]->initial_step();
  last_lr_ = s_[0]->get_last_lr();
  for (size_t i = 0; i < groups(); ++i) base_lrs_.push_back(*g_.initial_lr(i));
}

void SequentialLR::step() {
  ++step_count_;
  ++last_epoch_;
  const size_t idx = static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& s = *s_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    s.step_to(0);
  else
    s.step();
  last_lr_ = s.get_last_lr();
}

SchedulerState SequentialLR::state_dict() const {
  SchedulerState out = LRScheduler::state_dict();
  for (size_t i = 0; i < s_.size(); ++i)
    for (auto& [k, v] : s_[i]->state_dict()) out[fmt::format("schedulers.{}.{}", i, k)] = v;
  return out;
}

void SequentialLR::load_state_dict(const SchedulerState& state) {
  SchedulerState mine;
  std::vector<SchedulerState> subs(s_.size());
  for (const auto& [k, v] : state) {
    if (k.rfind("schedulers.", 0) == 0) {
      const auto dot = k.find('.', 11);
      size_t i = 0;
      const auto [p, ec] = std::from_chars(k.data() + 11, k.data() + (dot == std::string::npos ? k.size() : dot), i);
      KILN_CHECK(ec == std::errc() && dot != std::string::npos && i < s_.size(),
                 "SequentialLR: load_state_dict: unexpected entry '{}' (this one holds {} schedulers)", k, s_.size());
      subs[i][k.substr(dot + 1)] = v;
    } else {
      mine[k] = v;
    }
  }
  for (size_t i = 0; i < s_.size(); ++i) s_[i]->load_state_dict(subs[i]);
  LRScheduler::load_state_dict(mine);  // last: the groups' lr are SequentialLR's last lrs
}

// ------------------------------------------------------------------------------------------ ReduceLROnPlateau
ReduceLROnPlateau::ReduceLROnPlateau(LrGroups opt, ReduceLROnPlateauOptions o) : LRScheduler(std::move(opt)), o_(std::move(o)) {
  KILN_CHECK(o_.factor < 1.0 && o_.factor >= 0, "ReduceLROnPlateau: factor must be in [0, 1), got {}", o_.factor);
  KILN_CHECK(o_.mode == "min" || o_.mode == "max", "ReduceLROnPlateau: mode must be 'min' or 'max', got '{}'", o_.mode);
  KILN_CHECK(o_.threshold_mode == "rel" || o_.threshold_mode == "abs", "ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got '{}'",
             o_.threshold_mode);
  KILN_CHECK(o_.patience >= 0 && o_.cooldown >= 0, "ReduceLROnPlateau: patience and cooldown must be >= 0, got {} and {}", o_.patience,
             o_.cooldown);
  min_lrs_ = per_group(o_.min_lr, groups(), "ReduceLROnPlateau: min_lr");
  best_ = o_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  last_epoch_ = 0;
  for (size_t i = 0; i < groups(); ++i) last_lr_.push_back(group_lr(i));
}

void ReduceLROnPlateau::step() { fail("ReduceLROnPlateau: step() needs the metric: call step(metric), e.g. with the validation loss"); }

bool ReduceLROnPlateau::is_better(double a, double best) const {
  if (o_.mode == "min" && o_.threshold_mode == "rel") return a < best * (1. - o_.threshold);
  if (o_.mode == "min") return a < best - o_.threshold;
  if (o_.threshold_mode == "rel") return a > best * (o_.threshold + 1.);
  return a > best + o_.threshold;
}

void ReduceLROnPlateau::step(double current) {
  ++step_count_;
  ++last_epoch_;
  if (is_better(current, best_)) {
    best_ = current;
    bad_ = 0;
  } else {
    ++bad_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    bad_ = 0;
  }
  if (bad_ > o_.patience) {
    for (size_t i = 0; i < groups(); ++i) {
      const double old_lr = group_lr(i), new_lr = std::max(old_lr * o_.factor, min_lrs_[i]);
      if (old_lr - new_lr > o_.eps) g_.lr(i) = new_lr;
    }
    cooldown_counter_ = o_.cooldown;
    bad_ = 0;
  }
  last_lr_.clear();
  for (size_t i = 0; i < groups(); ++i) last_lr_.push_back(group_lr(i));
}

void ReduceLROnPlateau::save_extra(SchedulerState& s) const {
  s["best"] = num(best_);
  s["num_bad_epochs"] = num(bad_);
  s["cooldown_counter"] = num(cooldown_counter_);
}

void ReduceLROnPlateau::load_extra(const SchedulerState& s, std::vector<std::string>& used) {
  best_ = get_f64(s, kind(), "best", used);
  bad_ = get_i64(s, kind(), "num_bad_epochs", used);
  cooldown_counter_ = get_i64(s, kind(), "cooldown_counter", used);
}

}  // namespace kiln::optim
