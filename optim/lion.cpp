#include "kiln/optim/lion.hpp"

namespace kiln::optim {

template <Backend B> Lion<B>::Lion(std::vector<ParamGroup<B>> groups, LionOptions o) : Optimizer<B>(std::move(groups)), o_(o) {
  KILN_CHECK(o.beta1 >= 0 && o.beta1 <= 1 && o.beta2 >= 0 && o.beta2 <= 1, "Lion: betas must be in [0, 1], got [{}, {}]", o.beta1, o.beta2);
}

template <Backend B> void Lion<B>::step() {
  const profile::Scope prof("optimizer.step(Lion)", "optim");
  NoGrad ng;
  ++this->steps_;
  this->each_param([&](const ParamGroup<B>& g, const std::string& name, Tensor<B>& w, const Tensor<B>& grad) {
    bool created = false;
    Tensor<B>& m = this->buffer("exp_avg", name, w, created);
    if (g.weight_decay != 0) w.mul_(1.0 - g.lr * g.weight_decay);
    const double beta1 = g.momentum.value_or(o_.beta1);
    w.sub_(m.mul(beta1).add(grad.mul(1.0 - beta1)).sign().mul(g.lr));
    m.mul_(o_.beta2).add_(grad.mul(1.0 - o_.beta2));
  });
}

#define KILN_INST(B) template class Lion<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::optim
