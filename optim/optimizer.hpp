#pragma once
// Optimizers with PyTorch semantics (torch 1.13's single-tensor code paths, operation for operation,
// so a kiln run tracks the reference step by step), parameter groups, gradient clipping, and state
// dicts keyed by parameter name ("exp_avg.layers.0.attn.q_proj.weight"), so checkpoints survive a
// change in parameter order.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::optim {

template <Backend B> using NamedParams = std::vector<std::pair<std::string, Var<B>>>;

template <Backend B> struct ParamGroup {
  NamedParams<B> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // The lr a scheduler started from (PyTorch's group["initial_lr"]): set by the first scheduler built on
  // the optimizer (optim/scheduler.hpp), which later ones and SequentialLR start from.
  std::optional<double> initial_lr{};
  // The group's momentum (SGD, RMSprop) or beta1 (Adam, AdamW, Lion), when a scheduler cycles it
  // (OneCycleLR's cycle_momentum, as PyTorch's group["momentum"] / group["betas"][0]); unset: the
  // optimizer's option.
  std::optional<double> momentum{};
};

// The default grouping (docs/specs.md §4): weight decay on tensors of rank >= 2 only — never on norms, biases,
// λ vectors or AttnRes queries. `decays(name, var)` overrides the rule.
template <Backend B>
KILN_API std::vector<ParamGroup<B>> decay_groups(const NamedParams<B>& params, double lr, double weight_decay,
                                                 const std::function<bool(const std::string&, const Var<B>&)>& decays = nullptr);

template <Backend B> class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup<B>> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (parameters without one are skipped, as in PyTorch).
  virtual void step() = 0;
  void zero_grad();
  void set_lr(double lr);  // every group
  std::vector<ParamGroup<B>>& groups() { return groups_; }
  const std::vector<ParamGroup<B>>& groups() const { return groups_; }
  int64_t step_count() const { return steps_; }

  // Optimizer state by name: "<buffer>.<param name>" tensors plus "step". Virtual: a sharded optimizer
  // (dist::ZeroOptimizer) gathers its full state here, collectively.
  virtual std::vector<std::pair<std::string, Tensor<B>>> state_dict() const;
  // Strict: every buffer the optimizer would need must be there with the right shape, and nothing else.
  virtual void load_state_dict(const std::map<std::string, Tensor<B>>& state);
  // The kind of update, as checkpoints record it ("sgd", "adam", "adamw", "rmsprop", "adagrad", "lion",
  // "adafactor"): a resumed run must use the kind that wrote the state. A stable name, the same from
  // every compiler: an optimizer of your own names itself.
  virtual std::string kind() const = 0;
  // Whether a checkpoint that recorded the optimizer kind `recorded` holds state of this optimizer's
  // kind. Stable names are compared as they are. `legacy`: the checkpoint was written by an older kiln
  // (kiln::fit's metadata has no `optimizer_kinds`), which also recorded, as kinds, the C++ type's
  // typeid().name() (the default kind() until 2026-11-26; kiln's own optimizers read through
  // legacy_optimizer_kind, on any backend and from any compiler) and "adam" for AdamW as well
  // (legacy_kind()).
  virtual bool reads_kind(const std::string& recorded, bool legacy) const;
  // What ParamGroup::momentum sets in this optimizer: "momentum", "beta1", or "" (it has neither:
  // Adagrad, Adafactor).
  virtual std::string momentum_kind() const { return ""; }

 protected:
  // What an older kiln recorded for this optimizer's kind: kind(), except "adam" for AdamW.
  virtual std::string legacy_kind() const { return kind(); }
  // Per-parameter state buffers, by buffer name then parameter name.
  Tensor<B>& buffer(const std::string& buf, const std::string& param, const Tensor<B>& like, bool& created);
  // f(group, name, weight, grad) for every parameter that has a gradient, in group order (the weight
  // shares the parameter's storage: update it in place). Call under NoGrad.
  template <class F> void each_param(F&& f) {
    for (auto& g : groups_)
      for (auto& [name, p] : g.params) {
        Tensor<B> grad = p.grad();
        if (!grad.defined()) continue;
        Tensor<B> w = p.value();
        f(g, name, w, grad);
      }
  }
  virtual std::vector<std::string> buffer_names() const = 0;
  // The shape of buffer `buf` for a parameter of shape `param`, as load_state_dict checks it: the
  // parameter's, unless the optimizer keeps factored state (Adafactor).
  virtual Shape buffer_shape(const std::string& buf, const Shape& param) const {
    (void)buf;
    return param;
  }
  std::vector<ParamGroup<B>> groups_;
  std::map<std::string, std::map<std::string, Tensor<B>>> state_;
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2, added to the gradient
  bool nesterov = false;
};

template <Backend B> class SGD : public Optimizer<B> {
 public:
  SGD(std::vector<ParamGroup<B>> groups, SGDOptions o);
  SGD(const NamedParams<B>& params, SGDOptions o) : SGD(decay_groups(params, o.lr, o.weight_decay), o) {}
  void step() override;
  std::string kind() const override { return "sgd"; }
  std::string momentum_kind() const override { return "momentum"; }

 private:
  std::vector<std::string> buffer_names() const override;
  SGDOptions o_;
};

// torch.optim.Adam's defaults and update: weight decay is L2, added to the gradient before the moments
// (decoupled = false). decoupled = true makes it AdamW (the weights decay by lr·weight_decay, apart from
// the moments); optim::AdamW says so by its name, with torch.optim.AdamW's defaults.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;  // false: Adam (L2 added to the gradient), true: AdamW (decay the weights)
};

// Adam (torch.optim.Adam) and, with decoupled = true, AdamW.
template <Backend B> class Adam : public Optimizer<B> {
 public:
  Adam(std::vector<ParamGroup<B>> groups, AdamOptions o);
  Adam(const NamedParams<B>& params, AdamOptions o) : Adam(decay_groups(params, o.lr, o.weight_decay), o) {}
  void step() override;
  // AdamW records "adamw", Adam "adam": their state is the same, their updates are not.
  std::string kind() const override { return o_.decoupled ? "adamw" : "adam"; }
  std::string momentum_kind() const override { return "beta1"; }

 private:
  std::string legacy_kind() const override { return "adam"; }  // both, until 2026-11-26
  std::vector<std::string> buffer_names() const override;
  AdamOptions o_;
};

// torch.optim.AdamW's defaults (weight_decay 0.01, unlike Adam's 0).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: w ← w·(1 − lr·weight_decay)
};

// AdamW (torch.optim.AdamW): Adam with decoupled weight decay; its checkpoints record "adamw".
template <Backend B> class AdamW : public Adam<B> {
 public:
  AdamW(std::vector<ParamGroup<B>> groups, AdamWOptions o) : Adam<B>(std::move(groups), adam_options(o)) {}
  AdamW(const NamedParams<B>& params, AdamWOptions o) : AdamW(decay_groups(params, o.lr, o.weight_decay), o) {}

 private:
  static AdamOptions adam_options(const AdamWOptions& o) {
    return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay, .decoupled = true};
  }
};

// The stable kind (Optimizer::kind) of a kiln optimizer recorded by its Itanium-mangled typeid name
// (GCC's and Clang's), as "N4kiln5optim4LionINS_3CpuEEE" -> "lion"; any other name is returned as is.
KILN_API std::string legacy_optimizer_kind(const std::string& recorded);

// The global L2 norm of the gradients (computed in double), and the clip of PyTorch's clip_grad_norm_:
// gradients are scaled by min(1, max_norm / (norm + 1e-6)). Returns the norm before clipping.
template <Backend B> KILN_API double grad_norm(const std::vector<Var<B>>& params);
template <Backend B> KILN_API double clip_grad_norm(const std::vector<Var<B>>& params, double max_norm);
// clip_grad_norm for each parameter group of `opt` on its own: group g's gradients are scaled by
// min(1, max_norms[g] / (norm_g + 1e-6)), norm_g the L2 norm of that group's gradients alone. One
// max_norm for every group, or one per group. Returns the norms before clipping, one per group.
template <Backend B> KILN_API std::vector<double> clip_grad_norm_per_group(Optimizer<B>& opt, const std::vector<double>& max_norms);
// PyTorch's clip_grad_value_: every gradient element clamped to [-clip_value, clip_value].
template <Backend B> KILN_API void clip_grad_value(const std::vector<Var<B>>& params, double clip_value);

#define KILN_EXTERN(B)                \
  extern template class Optimizer<B>; \
  extern template class SGD<B>;       \
  extern template class Adam<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::optim
#pragma GCC visibility pop
