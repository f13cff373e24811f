#pragma once
// An exponential moving average of weights (PyTorch: torch.optim.swa_utils.AveragedModel with an EMA
// avg_fn; timm's ModelEmaV2):
//
//   optim::EMA<Cpu> ema(model.named_parameters(), {.decay = 0.999});
//   for (...) { ...; opt.step(); ema.update(); }
//   { auto applied = ema.apply(); evaluate(model); }   // the averages swapped in, the weights back after
//
// The averages start as a copy of the parameters; update() does a ← d·a + (1 − d)·w for every
// parameter (in its dtype), d = decay, or with warmup min(decay, (1 + n)/(10 + n)) after n earlier
// updates (TensorFlow's num_updates). swap() exchanges the parameters' values with the averages in
// place (twice: back); apply() swaps and swaps back when its guard goes.
//
// Buffers (BatchNorm's running_mean/running_var): not averaged by default, as AveragedModel's default
// (use_buffers=False; evaluation then reads the model's own running statistics). Given to the
// constructor (EMA(model.named_parameters(), model.named_buffers(), o)), the floating-point ones are
// averaged like the weights, with the same decay, and swapped in with them: PyTorch's
// AveragedModel(use_buffers=True) with the same avg_fn, and timm's ModelEmaV3. Integer buffers
// (num_batches_tracked) are not averaged: the model's own count stays in place, as ModelEmaV3 copies
// them (AveragedModel would truncate a float average into the integer).
//
// state_dict(): "shadow.<name>" tensors (parameters, then averaged buffers) and "num_updates"; kiln::fit
// saves it in checkpoints (FitOptions::ema).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/optim/optimizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::optim {

struct EMAOptions {
  double decay = 0.999;
  bool warmup = false;  // decay = min(decay, (1 + n)/(10 + n)) at the (n+1)-th update
};

// What kiln::fit needs of an EMA, whatever its backend (the fit of backend B takes an EMA<B>).
class EmaBase {
 public:
  virtual ~EmaBase() = default;
  virtual void update() = 0;
  virtual void swap() = 0;
  virtual bool swapped() const = 0;
  virtual int64_t num_updates() const = 0;
};

template <Backend B> class EMA final : public EmaBase {
 public:
  explicit EMA(const NamedParams<B>& params, EMAOptions o = {});
  // The parameters and the module's buffers (their tensors, updated in place by the layers: pass
  // model.named_buffers() after any Module::to()).
  EMA(const NamedParams<B>& params, const std::vector<std::pair<std::string, Tensor<B>>>& buffers, EMAOptions o);
  void update() override;
  void swap() override;
  bool swapped() const override { return swapped_; }
  int64_t num_updates() const override { return n_; }
  double decay() const;                                     // the decay the next update() uses
  const Tensor<B>& average(const std::string& name) const;  // a parameter's or buffer's; an Error while swapped in

  struct Applied {
    explicit Applied(EMA* e) : ema(e) {}
    EMA* ema;
    ~Applied() {
      if (ema) ema->swap();
    }
    Applied(const Applied&) = delete;
    Applied& operator=(const Applied&) = delete;
  };
  [[nodiscard]] Applied apply() {
    swap();
    return Applied{this};
  }

  std::vector<std::pair<std::string, Tensor<B>>> state_dict() const;
  // Strict: one "shadow.<name>" per parameter and averaged buffer, of its shape and dtype, and "num_updates".
  void load_state_dict(const std::map<std::string, Tensor<B>>& state);

 private:
  // What is averaged: the parameters (read through their Vars), then the floating buffers (shared
  // storage with the module's); shadow_ holds one average for each, in that order.
  size_t size() const { return params_.size() + buffers_.size(); }
  const std::string& name(size_t i) const { return i < params_.size() ? params_[i].first : buffers_[i - params_.size()].first; }
  Tensor<B> live(size_t i) const { return i < params_.size() ? params_[i].second.value() : buffers_[i - params_.size()].second; }
  NamedParams<B> params_;
  std::vector<std::pair<std::string, Tensor<B>>> buffers_;
  std::vector<Tensor<B>> shadow_;
  EMAOptions o_;
  int64_t n_ = 0;
  bool swapped_ = false;
};

#define KILN_EXTERN(B) extern template class EMA<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::optim
#pragma GCC visibility pop
