#include "kiln/optim/optimizer.hpp"

#include "kiln/core/fused_optim.hpp"

#include <cctype>
#include <cmath>
#include <set>
#include <typeinfo>

namespace kiln::optim {

template <Backend B> std::vector<ParamGroup<B>> decay_groups(const NamedParams<B>& params, double lr, double weight_decay,
                                                             const std::function<bool(const std::string&, const Var<B>&)>& decays) {
  ParamGroup<B> d{.params = {}, .lr = lr, .weight_decay = weight_decay}, n{.params = {}, .lr = lr, .weight_decay = 0.0};
  for (const auto& [name, p] : params) {
    const bool yes = decays ? decays(name, p) : p.dim() >= 2;
    (yes ? d : n).params.emplace_back(name, p);
  }
  return {d, n};
}

std::string legacy_optimizer_kind(const std::string& recorded) {
  // kiln::optim::<Class><backend...>: "N4kiln5optim" <length><Class> "I" <template arguments> "EE"
  static const std::map<std::string, std::string> kinds{{"SGD", "sgd"},         {"Adam", "adam"}, {"RMSprop", "rmsprop"},
                                                        {"Adagrad", "adagrad"}, {"Lion", "lion"}, {"Adafactor", "adafactor"}};
  const std::string prefix = "N4kiln5optim";
  if (!recorded.starts_with(prefix)) return recorded;
  size_t i = prefix.size(), len = 0;
  while (i < recorded.size() && i < prefix.size() + 3 && std::isdigit(static_cast<unsigned char>(recorded[i])))
    len = len * 10 + static_cast<size_t>(recorded[i++] - '0');
  if (len == 0 || i + len >= recorded.size() || recorded[i + len] != 'I' || !recorded.ends_with("EE")) return recorded;
  const auto it = kinds.find(recorded.substr(i, len));
  return it == kinds.end() ? recorded : it->second;
}

template <Backend B> bool Optimizer<B>::reads_kind(const std::string& recorded, bool legacy) const {
  if (recorded == kind()) return true;
  if (!legacy) return false;
  const std::string old = legacy_kind();
  return recorded == old || legacy_optimizer_kind(recorded) == old || recorded == typeid(*this).name();
}

template <Backend B> Optimizer<B>::Optimizer(std::vector<ParamGroup<B>> groups) : groups_(std::move(groups)) {
  std::set<std::string> seen;
  for (const auto& g : groups_) {
    KILN_CHECK(g.lr >= 0 && g.weight_decay >= 0, "optimizer: lr and weight_decay must be >= 0, got lr={} weight_decay={}", g.lr,
               g.weight_decay);
    for (const auto& [name, p] : g.params) {
      KILN_CHECK(seen.insert(name).second, "optimizer: parameter '{}' appears twice", name);
      KILN_CHECK(p.defined() && p.is_leaf(), "optimizer: '{}' must be a leaf parameter", name);
      KILN_CHECK(is_floating(p.dtype()), "optimizer: '{}' must be floating point, got {}", name, p.dtype());
    }
  }
}

template <Backend B> void Optimizer<B>::zero_grad() {
  for (auto& g : groups_)
    for (auto& [n, p] : g.params) p.zero_grad();
}

template <Backend B> void Optimizer<B>::set_lr(double lr) {
  KILN_CHECK(lr >= 0, "optimizer: lr must be >= 0, got {}", lr);
  for (auto& g : groups_) g.lr = lr;
}

template <Backend B>
Tensor<B>& Optimizer<B>::buffer(const std::string& buf, const std::string& param, const Tensor<B>& like, bool& created) {
  auto& m = state_[buf];
  auto it = m.find(param);
  created = it == m.end();
  if (created) it = m.emplace(param, Tensor<B>::zeros(like.shape(), like.dtype())).first;
  return it->second;
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> Optimizer<B>::state_dict() const {
  std::vector<std::pair<std::string, Tensor<B>>> out;
  for (const auto& [buf, m] : state_)
    for (const auto& [name, t] : m) out.emplace_back(buf + "." + name, t);
  out.emplace_back("step", Tensor<B>::full({}, steps_, DType::i64));
  return out;
}

template <Backend B> void Optimizer<B>::load_state_dict(const std::map<std::string, Tensor<B>>& state) {
  std::map<std::string, Shape> params;
  for (const auto& g : groups_)
    for (const auto& [name, p] : g.params) params.emplace(name, p.shape());
  const auto it = state.find("step");
  KILN_CHECK(it != state.end(), "optimizer state: no 'step' entry");
  decltype(state_) next;
  for (const auto& [key, t] : state) {
    if (key == "step") continue;
    const auto dot = key.find('.');
    const std::string buf = dot == std::string::npos ? key : key.substr(0, dot);
    const auto names = buffer_names();
    KILN_CHECK(dot != std::string::npos && std::find(names.begin(), names.end(), buf) != names.end(),
               "optimizer state: unexpected entry '{}' (this optimizer keeps: {})", key, fmt::join(names, ", "));
    const std::string name = key.substr(dot + 1);
    const auto p = params.find(name);
    KILN_CHECK(p != params.end(), "optimizer state: '{}' names no parameter of this optimizer", key);
    const Shape want = buffer_shape(buf, p->second);
    KILN_CHECK(want == t.shape(), "optimizer state: '{}' has shape {}, expected {} (the parameter has {})", key, shape_str(t.shape()),
               shape_str(want), shape_str(p->second));
    next[buf][name] = t.clone();
  }
  // One integer >= 0: a float converted to int64 could be out of range (undefined behaviour; NaN or
  // 1e300 from a corrupt checkpoint, found by fuzz/fuzz_resume), and a negative count skews Adam's
  // bias correction.
  const Tensor<B>& st = it->second;
  KILN_CHECK(st.numel() == 1 && !is_floating(st.dtype()) && st.dtype() != DType::boolean,
             "optimizer state: 'step' must be one integer, got {} of shape {}", st.dtype(), shape_str(st.shape()));
  const auto steps = item<int64_t>(st);
  KILN_CHECK(steps >= 0, "optimizer state: 'step' = {} is negative", steps);
  state_ = std::move(next);
  steps_ = steps;
}

// ------------------------------------------------------------------------------------------ SGD
template <Backend B> SGD<B>::SGD(std::vector<ParamGroup<B>> groups, SGDOptions o) : Optimizer<B>(std::move(groups)), o_(o) {
  KILN_CHECK(o.momentum >= 0 && o.dampening >= 0, "SGD: momentum and dampening must be >= 0, got {} and {}", o.momentum, o.dampening);
  KILN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD: nesterov needs momentum > 0 and dampening 0");
}

template <Backend B> std::vector<std::string> SGD<B>::buffer_names() const { return {"momentum_buffer"}; }

template <Backend B> void SGD<B>::step() {
  const profile::Scope prof("optimizer.step(SGD)", "optim");
  NoGrad ng;
  ++this->steps_;
  this->each_param([&](const ParamGroup<B>& g, const std::string& name, Tensor<B>& w, const Tensor<B>& grad) {
    Tensor<B> d = grad;
    if (g.weight_decay != 0) d = d.add(w.mul(g.weight_decay));
    const double mu = g.momentum.value_or(o_.momentum);
    if (mu != 0) {
      bool created = false;
      Tensor<B>& buf = this->buffer("momentum_buffer", name, w, created);
      if (created)
        buf.copy_(d);
      else
        buf.mul_(mu).add_(d.mul(1.0 - o_.dampening));
      d = o_.nesterov ? d.add(buf.mul(mu)) : buf;
    }
    w.sub_(d.mul(g.lr));
  });
}

// ------------------------------------------------------------------------------------------ Adam(W)
template <Backend B> Adam<B>::Adam(std::vector<ParamGroup<B>> groups, AdamOptions o) : Optimizer<B>(std::move(groups)), o_(o) {
  KILN_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "Adam: betas must be in [0, 1), got [{}, {}]", o.beta1, o.beta2);
  KILN_CHECK(o.eps >= 0, "Adam: eps must be >= 0, got {}", o.eps);
}

template <Backend B> std::vector<std::string> Adam<B>::buffer_names() const { return {"exp_avg", "exp_avg_sq"}; }

template <Backend B> void Adam<B>::step() {
  const profile::Scope prof(o_.decoupled ? "optimizer.step(AdamW)" : "optimizer.step(Adam)", "optim");
  NoGrad ng;
  const int64_t t = ++this->steps_;
  fused::AdamHyper h{.beta1 = o_.beta1, .beta2 = o_.beta2, .eps = o_.eps, .decoupled = o_.decoupled};
  h.bc2_sqrt = std::sqrt(1.0 - std::pow(o_.beta2, static_cast<double>(t)));
  for (auto& g : this->groups_) {
    // the group's beta1 when a scheduler cycles it, in the bias correction too (as PyTorch)
    h.beta1 = g.momentum.value_or(o_.beta1);
    h.bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
    // one multi-tensor update per group (core/fused_optim.hpp)
    std::vector<Tensor<B>> ws, grads;
    std::vector<Tensor<B>*> ms, vs;
    ws.reserve(g.params.size());
    for (auto& [name, p] : g.params) {
      Tensor<B> grad = p.grad();
      if (!grad.defined()) continue;
      ws.push_back(p.value());
      grads.push_back(std::move(grad));
      bool c1 = false, c2 = false;
      ms.push_back(&this->buffer("exp_avg", name, ws.back(), c1));
      vs.push_back(&this->buffer("exp_avg_sq", name, ws.back(), c2));
    }
    std::vector<Tensor<B>*> wp;
    for (auto& w : ws) wp.push_back(&w);
    h.lr = g.lr;
    h.weight_decay = g.weight_decay;
    fused::adam_step(wp, ms, vs, grads, h);
  }
}

// ------------------------------------------------------------------------------------------ clipping
template <Backend B> double grad_norm(const std::vector<Var<B>>& params) {
  // One multi-tensor pass on the device (core/fused_optim.hpp), f64 accumulation; one read at the end,
  // so a GPU is waited for once per call, not once per parameter.
  std::vector<Tensor<B>> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  return std::sqrt(item<double>(fused::sum_squares(grads)));
}

template <Backend B> double clip_grad_norm(const std::vector<Var<B>>& params, double max_norm) {
  KILN_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got {}", max_norm);
  const double norm = grad_norm(params);
  const double coef = std::min(1.0, max_norm / (norm + 1e-6));
  if (coef < 1.0)
    for (const auto& p : params) {
      Tensor<B> g = p.grad();
      if (g.defined()) g.mul_(coef);
    }
  return norm;
}

template <Backend B> std::vector<double> clip_grad_norm_per_group(Optimizer<B>& opt, const std::vector<double>& max_norms) {
  auto& groups = opt.groups();
  KILN_CHECK(max_norms.size() == 1 || max_norms.size() == groups.size(),
             "clip_grad_norm_per_group: expected 1 or {} max_norms (one per parameter group), got {}", groups.size(), max_norms.size());
  std::vector<double> norms;
  for (size_t i = 0; i < groups.size(); ++i) {
    const double max_norm = max_norms.size() == 1 ? max_norms[0] : max_norms[i];
    KILN_CHECK(max_norm > 0, "clip_grad_norm_per_group: max_norm of group {} must be > 0, got {}", i, max_norm);
    std::vector<Var<B>> ps;
    for (const auto& [name, p] : groups[i].params) ps.push_back(p);
    norms.push_back(clip_grad_norm(ps, max_norm));
  }
  return norms;
}

template <Backend B> void clip_grad_value(const std::vector<Var<B>>& params, double clip_value) {
  KILN_CHECK(clip_value >= 0 && !std::isnan(clip_value), "clip_grad_value: clip_value must be >= 0, got {}", clip_value);
  NoGrad ng;
  for (const auto& p : params) {
    Tensor<B> g = p.grad();
    if (g.defined()) g.copy_(g.clamp(-clip_value, clip_value));
  }
}

#define KILN_INST(B)                                                                                                  \
  template std::vector<ParamGroup<B>> decay_groups<B>(const NamedParams<B>&, double, double,                          \
                                                      const std::function<bool(const std::string&, const Var<B>&)>&); \
  template class Optimizer<B>;                                                                                        \
  template class SGD<B>;                                                                                              \
  template class Adam<B>;                                                                                             \
  template double grad_norm<B>(const std::vector<Var<B>>&);                                                           \
  template double clip_grad_norm<B>(const std::vector<Var<B>>&, double);                                              \
  template std::vector<double> clip_grad_norm_per_group<B>(Optimizer<B>&, const std::vector<double>&);                \
  template void clip_grad_value<B>(const std::vector<Var<B>>&, double);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::optim
