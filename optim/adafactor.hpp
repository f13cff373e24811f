#pragma once
// Adafactor (Shazeer & Stern 2018) with factored second moments, as torch.optim.Adafactor (PyTorch
// 2.5+; its single-tensor code path, operation for operation). For a parameter of rank >= 2 the
// second moment of the gradient is kept as a row factor R (shape [..., m, 1]) and a column factor C
// ([..., 1, n]) over the last two axes, m + n numbers instead of m·n (an embedding table [V, D] keeps
// V + D); vectors keep a full second moment v. At step t (the optimizer's step count):
//   β̂ = t^beta2_decay (the weight of the new value);  ρ = min(lr, 1/√t);  α = max(eps2, RMS(w))·ρ
//   w ← w·(1 − lr·wd)                                  (decoupled weight decay)
//   rank >= 2: R ← lerp(R, mean(g², last axis), β̂);  C ← lerp(C, mean(g², second-last axis), β̂);
//              V = R·C / max(mean(R over rows), eps1)
//   vector:    v ← lerp(v, g², β̂);  V = v
//   U = g / √max(V, eps1²);  w ← w − α / max(1, RMS(U)/d) · U
// eps1 defaults to the parameter dtype's machine epsilon. State: row_var, col_var (rank >= 2),
// variance (vectors). No first moment (β1 = 0), as PyTorch's.
#include <optional>

#include "kiln/optim/optimizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::optim {

struct AdafactorOptions {
  double lr = 1e-2;  // the upper bound of the relative step size ρ, and the weight decay's factor
  double beta2_decay = -0.8;
  std::optional<double> eps1{};  // default: the dtype's machine epsilon
  double eps2 = 1e-3;
  double d = 1.0;             // update clipping threshold
  double weight_decay = 0.0;  // decoupled
};

template <Backend B> class Adafactor : public Optimizer<B> {
 public:
  Adafactor(std::vector<ParamGroup<B>> groups, AdafactorOptions o);
  Adafactor(const NamedParams<B>& params, AdafactorOptions o) : Adafactor(decay_groups(params, o.lr, o.weight_decay), o) {}
  void step() override;
  std::string kind() const override { return "adafactor"; }

 private:
  std::vector<std::string> buffer_names() const override { return {"row_var", "col_var", "variance"}; }
  Shape buffer_shape(const std::string& buf, const Shape& param) const override;
  AdafactorOptions o_;
};

#define KILN_EXTERN(B) extern template class Adafactor<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::optim
#pragma GCC visibility pop
