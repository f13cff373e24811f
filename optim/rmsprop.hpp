#pragma once
// RMSprop and Adagrad with torch.optim's semantics (torch 1.13's single-tensor code paths, operation for
// operation; optim/optimizer.hpp for the common pattern: parameter groups, state dicts by name). Each
// group's weight_decay is L2, added to the gradient, as in PyTorch.
//
// RMSprop:  g ← g + wd·w;  v ← α·v + (1 − α)·g²;  centered: ḡ ← α·ḡ + (1 − α)·g, d = √(v − ḡ²) + eps,
//           else d = √v + eps;  momentum > 0: b ← μ·b + g/d, w ← w − lr·b;  else w ← w − lr·g/d.
//           State: square_avg, grad_avg (centered), momentum_buffer (momentum > 0).
// Adagrad:  g ← g + wd·w;  clr = lr / (1 + (t − 1)·lr_decay);  s ← s + g² (s starts at
//           initial_accumulator_value);  w ← w − clr·g/(√s + eps).  State: sum.
// t is the optimizer's step count (step_count()); PyTorch counts per parameter, which differs only for
// parameters that go without a gradient at some steps.
#include "kiln/optim/optimizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::optim {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2, added to the gradient
  double momentum = 0.0;
  bool centered = false;
};

template <Backend B> class RMSprop : public Optimizer<B> {
 public:
  RMSprop(std::vector<ParamGroup<B>> groups, RMSpropOptions o);
  RMSprop(const NamedParams<B>& params, RMSpropOptions o) : RMSprop(decay_groups(params, o.lr, o.weight_decay), o) {}
  void step() override;
  std::string kind() const override { return "rmsprop"; }
  std::string momentum_kind() const override { return "momentum"; }

 private:
  std::vector<std::string> buffer_names() const override;
  RMSpropOptions o_;
};

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;  // L2, added to the gradient
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

template <Backend B> class Adagrad : public Optimizer<B> {
 public:
  Adagrad(std::vector<ParamGroup<B>> groups, AdagradOptions o);
  Adagrad(const NamedParams<B>& params, AdagradOptions o) : Adagrad(decay_groups(params, o.lr, o.weight_decay), o) {}
  void step() override;
  std::string kind() const override { return "adagrad"; }

 private:
  std::vector<std::string> buffer_names() const override { return {"sum"}; }
  AdagradOptions o_;
};

#define KILN_EXTERN(B)              \
  extern template class RMSprop<B>; \
  extern template class Adagrad<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::optim
#pragma GCC visibility pop
