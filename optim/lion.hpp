#pragma once
// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), the reference formula:
//   c = β1·m + (1 − β1)·g;   w ← w·(1 − lr·wd) − lr·sign(c);   m ← β2·m + (1 − β2)·g
// with decoupled weight decay (each group's weight_decay), as the authors' and lion-pytorch's code
// (torch.optim has no Lion). State: exp_avg. Use an lr 3-10× smaller than AdamW's, and a larger wd.
#include "kiln/optim/optimizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::optim {

struct LionOptions {
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.99;
  double weight_decay = 0.0;  // decoupled
};

template <Backend B> class Lion : public Optimizer<B> {
 public:
  Lion(std::vector<ParamGroup<B>> groups, LionOptions o);
  Lion(const NamedParams<B>& params, LionOptions o) : Lion(decay_groups(params, o.lr, o.weight_decay), o) {}
  void step() override;
  std::string kind() const override { return "lion"; }
  std::string momentum_kind() const override { return "beta1"; }

 private:
  std::vector<std::string> buffer_names() const override { return {"exp_avg"}; }
  LionOptions o_;
};

#define KILN_EXTERN(B) extern template class Lion<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::optim
#pragma GCC visibility pop
