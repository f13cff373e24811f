#include "kiln/optim/ema.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace kiln::optim {

template <Backend B> EMA<B>::EMA(const NamedParams<B>& params, EMAOptions o) : params_(params), o_(o) {
  KILN_CHECK(o.decay >= 0 && o.decay <= 1, "EMA: decay must be in [0, 1], got {}", o.decay);
  std::set<std::string> seen;
  NoGrad ng;
  for (const auto& [name, p] : params_) {
    KILN_CHECK(seen.insert(name).second, "EMA: parameter '{}' appears twice", name);
    KILN_CHECK(p.defined() && is_floating(p.dtype()), "EMA: '{}' must be a floating-point parameter", name);
    shadow_.push_back(p.value().clone());
  }
}

template <Backend B> double EMA<B>::decay() const {
  if (!o_.warmup) return o_.decay;
  const double n = static_cast<double>(n_);
  return std::min(o_.decay, (1.0 + n) / (10.0 + n));
}

template <Backend B> void EMA<B>::update() {
  KILN_CHECK(!swapped_, "EMA: update() while the averages are swapped into the parameters: swap() back first");
  const profile::Scope prof("ema.update", "optim");
  NoGrad ng;
  const double d = decay();
  for (size_t i = 0; i < params_.size(); ++i) shadow_[i].mul_(d).add_(params_[i].second.value().mul(1.0 - d));
  ++n_;
}

template <Backend B> void EMA<B>::swap() {
  NoGrad ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor<B> w = params_[i].second.value();
    const Tensor<B> tmp = w.clone();
    w.copy_(shadow_[i]);
    shadow_[i].copy_(tmp);
  }
  swapped_ = !swapped_;
}

template <Backend B> const Tensor<B>& EMA<B>::average(const std::string& name) const {
  KILN_CHECK(!swapped_, "EMA: average('{}') while the averages are swapped into the parameters", name);
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].first == name) return shadow_[i];
  fail("EMA: no parameter '{}'", name);
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> EMA<B>::state_dict() const {
  KILN_CHECK(!swapped_, "EMA: state_dict() while the averages are swapped into the parameters: swap() back first");
  std::vector<std::pair<std::string, Tensor<B>>> out;
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back("shadow." + params_[i].first, shadow_[i]);
  out.emplace_back("num_updates", Tensor<B>::full({}, n_, DType::i64));
  return out;
}

template <Backend B> void EMA<B>::load_state_dict(const std::map<std::string, Tensor<B>>& state) {
  KILN_CHECK(!swapped_, "EMA: load_state_dict() while the averages are swapped into the parameters: swap() back first");
  const auto it = state.find("num_updates");
  KILN_CHECK(it != state.end() && it->second.numel() == 1, "EMA state: no 'num_updates' entry");
  std::vector<Tensor<B>> next;
  for (const auto& [name, p] : params_) {
    const auto s = state.find("shadow." + name);
    KILN_CHECK(s != state.end(), "EMA state: no 'shadow.{}' entry", name);
    KILN_CHECK(s->second.shape() == p.shape() && s->second.dtype() == p.dtype(), "EMA state: 'shadow.{}' is {} {}, the parameter {} {}",
               name, s->second.dtype(), shape_str(s->second.shape()), p.dtype(), shape_str(p.shape()));
    next.push_back(s->second.clone());
  }
  KILN_CHECK(state.size() == params_.size() + 1, "EMA state: {} entries, expected {} (a shadow per parameter and num_updates)",
             state.size(), params_.size() + 1);
  shadow_ = std::move(next);
  n_ = item<int64_t>(it->second);
}

#define KILN_INST(B) template class EMA<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::optim
