#include "kiln/optim/rmsprop.hpp"

#include <cmath>

namespace kiln::optim {

// ------------------------------------------------------------------------------------------ RMSprop
template <Backend B> RMSprop<B>::RMSprop(std::vector<ParamGroup<B>> groups, RMSpropOptions o) : Optimizer<B>(std::move(groups)), o_(o) {
  KILN_CHECK(o.alpha >= 0 && o.alpha <= 1, "RMSprop: alpha must be in [0, 1], got {}", o.alpha);
  KILN_CHECK(o.eps >= 0, "RMSprop: eps must be >= 0, got {}", o.eps);
  KILN_CHECK(o.momentum >= 0, "RMSprop: momentum must be >= 0, got {}", o.momentum);
}

template <Backend B> std::vector<std::string> RMSprop<B>::buffer_names() const {
  std::vector<std::string> names{"square_avg"};
  if (o_.centered) names.push_back("grad_avg");
  bool momentum = o_.momentum > 0;
  for (const auto& g : this->groups_) momentum = momentum || g.momentum.value_or(0.0) > 0;
  if (momentum) names.push_back("momentum_buffer");
  return names;
}

template <Backend B> void RMSprop<B>::step() {
  const profile::Scope prof("optimizer.step(RMSprop)", "optim");
  NoGrad ng;
  ++this->steps_;
  this->each_param([&](const ParamGroup<B>& g, const std::string& name, Tensor<B>& w, Tensor<B> grad) {
    if (g.weight_decay != 0) grad = grad.add(w.mul(g.weight_decay));
    bool created = false;
    Tensor<B>& sq = this->buffer("square_avg", name, w, created);
    sq.mul_(o_.alpha).add_(grad.mul(1.0 - o_.alpha).mul(grad));
    Tensor<B> avg;
    if (o_.centered) {
      Tensor<B>& ga = this->buffer("grad_avg", name, w, created);
      ga.mul_(o_.alpha).add_(grad.mul(1.0 - o_.alpha));
      avg = sq.sub(ga.mul(ga)).sqrt();
    } else {
      avg = sq.sqrt();
    }
    avg.add_(o_.eps);
    const double mu = g.momentum.value_or(o_.momentum);
    if (mu > 0) {
      Tensor<B>& buf = this->buffer("momentum_buffer", name, w, created);
      buf.mul_(mu).add_(grad.div(avg));
      w.sub_(buf.mul(g.lr));
    } else {
      w.sub_(grad.div(avg).mul(g.lr));
    }
  });
}

// ------------------------------------------------------------------------------------------ Adagrad
template <Backend B> Adagrad<B>::Adagrad(std::vector<ParamGroup<B>> groups, AdagradOptions o) : Optimizer<B>(std::move(groups)), o_(o) {
  KILN_CHECK(o.lr_decay >= 0, "Adagrad: lr_decay must be >= 0, got {}", o.lr_decay);
  KILN_CHECK(o.initial_accumulator_value >= 0, "Adagrad: initial_accumulator_value must be >= 0, got {}", o.initial_accumulator_value);
  KILN_CHECK(o.eps >= 0, "Adagrad: eps must be >= 0, got {}", o.eps);
}

template <Backend B> void Adagrad<B>::step() {
  const profile::Scope prof("optimizer.step(Adagrad)", "optim");
  NoGrad ng;
  const int64_t t = ++this->steps_;
  this->each_param([&](const ParamGroup<B>& g, const std::string& name, Tensor<B>& w, Tensor<B> grad) {
    const double clr = g.lr / (1 + static_cast<double>(t - 1) * o_.lr_decay);
    if (g.weight_decay != 0) grad = grad.add(w.mul(g.weight_decay));
    bool created = false;
    Tensor<B>& sum = this->buffer("sum", name, w, created);
    if (created && o_.initial_accumulator_value != 0) sum.fill_(o_.initial_accumulator_value);
    sum.add_(grad.mul(grad));
    w.sub_(grad.div(sum.sqrt().add(o_.eps)).mul(clr));
  });
}

#define KILN_INST(B)         \
  template class RMSprop<B>; \
  template class Adagrad<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::optim
