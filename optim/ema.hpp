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
// place (twice: back); apply() swaps and swaps back when its guard goes. Parameters only: buffers
// (BatchNorm's running statistics) are not averaged, as AveragedModel's default.
//
// state_dict(): "shadow.<param name>" tensors and "num_updates"; kiln::fit saves it in checkpoints
// (FitOptions::ema).
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
  void update() override;
  void swap() override;
  bool swapped() const override { return swapped_; }
  int64_t num_updates() const override { return n_; }
  double decay() const;                                     // the decay the next update() uses
  const Tensor<B>& average(const std::string& name) const;  // an Error while swapped in

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
  // Strict: one "shadow.<name>" per parameter, of its shape and dtype, and "num_updates".
  void load_state_dict(const std::map<std::string, Tensor<B>>& state);

 private:
  NamedParams<B> params_;
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
