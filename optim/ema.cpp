#include "kiln/optim/ema.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace kiln::optim {

template <Backend B> EMA<B>::EMA(const NamedParams<B>& params, EMAOptions o) : EMA(params, {}, o) {}

template <Backend B> EMA<B>::EMA(const NamedParams<B>& params, const std::vector<std::pair<std::string, Tensor<B>>>& buffers, EMAOptions o)
    : params_(params), o_(o) {
  KILN_CHECK(o.decay >= 0 && o.decay <= 1, "EMA: decay must be in [0, 1], got {}", o.decay);
  std::set<std::string> seen;
  NoGrad ng;
  for (const auto& [name, p] : params_) {
    KILN_CHECK(seen.insert(name).second, "EMA: parameter '{}' appears twice", name);
    KILN_CHECK(p.defined() && is_floating(p.dtype()), "EMA: '{}' must be a floating-point parameter", name);
  }
  for (const auto& [name, b] : buffers) {
    KILN_CHECK(b.defined(), "EMA: buffer '{}' is undefined", name);
    if (!is_floating(b.dtype())) continue;  // num_batches_tracked: the model's own count stays
    KILN_CHECK(seen.insert(name).second, "EMA: '{}' appears twice (among the parameters and buffers)", name);
    KILN_CHECK(b.is_contiguous(), "EMA: buffer '{}' {} is not contiguous", name, shape_str(b.shape()));
    buffers_.emplace_back(name, b);
  }
  for (size_t i = 0; i < size(); ++i) shadow_.push_back(live(i).clone());
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
  for (size_t i = 0; i < size(); ++i) shadow_[i].mul_(d).add_(live(i).mul(1.0 - d));
  ++n_;
}

template <Backend B> void EMA<B>::swap() {
  NoGrad ng;
  for (size_t i = 0; i < size(); ++i) {
    Tensor<B> w = live(i);
    const Tensor<B> tmp = w.clone();
    w.copy_(shadow_[i]);
    shadow_[i].copy_(tmp);
  }
  swapped_ = !swapped_;
}

template <Backend B> const Tensor<B>& EMA<B>::average(const std::string& name) const {
  KILN_CHECK(!swapped_, "EMA: average('{}') while the averages are swapped into the parameters", name);
  for (size_t i = 0; i < size(); ++i)
    if (this->name(i) == name) return shadow_[i];
  fail("EMA: no parameter or averaged buffer '{}'", name);
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> EMA<B>::state_dict() const {
  KILN_CHECK(!swapped_, "EMA: state_dict() while the averages are swapped into the parameters: swap() back first");
  std::vector<std::pair<std::string, Tensor<B>>> out;
  for (size_t i = 0; i < size(); ++i) out.emplace_back("shadow." + name(i), shadow_[i]);
  out.emplace_back("num_updates", Tensor<B>::full({}, n_, DType::i64));
  return out;
}

template <Backend B> void EMA<B>::load_state_dict(const std::map<std::string, Tensor<B>>& state) {
  KILN_CHECK(!swapped_, "EMA: load_state_dict() while the averages are swapped into the parameters: swap() back first");
  const auto it = state.find("num_updates");
  KILN_CHECK(it != state.end() && it->second.numel() == 1, "EMA state: no 'num_updates' entry");
  std::vector<Tensor<B>> next;
  for (size_t i = 0; i < size(); ++i) {
    const std::string& name = this->name(i);
    const Tensor<B> p = live(i);
    const auto s = state.find("shadow." + name);
    KILN_CHECK(s != state.end(), "EMA state: no 'shadow.{}' entry", name);
    KILN_CHECK(s->second.shape() == p.shape() && s->second.dtype() == p.dtype(), "EMA state: 'shadow.{}' is {} {}, the tensor {} {}", name,
               s->second.dtype(), shape_str(s->second.shape()), p.dtype(), shape_str(p.shape()));
    next.push_back(s->second.clone());
  }
  KILN_CHECK(state.size() == size() + 1, "EMA state: {} entries, expected {} (a shadow per parameter and averaged buffer, and num_updates)",
             state.size(), size() + 1);
  shadow_ = std::move(next);
  n_ = item<int64_t>(it->second);
}

#define KILN_INST(B) template class EMA<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::optim
