#include "kiln/optim/adafactor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/core/fused_optim.hpp"

namespace kiln::optim {

namespace {

// torch.lerp's formula: start + w·(end − start) for |w| < 0.5, else end − (end − start)·(1 − w).
template <Backend B> void lerp_(Tensor<B>& start, const Tensor<B>& end, double w) {
  if (std::abs(w) < 0.5)
    start.add_(end.sub(start).mul(w));
  else
    start.copy_(end.sub(end.sub(start).mul(1.0 - w)));
}

double machine_eps(DType d) {
  switch (d) {
    case DType::f64:
      return std::numeric_limits<double>::epsilon();
    case DType::bf16:
      return 0x1p-7;
    case DType::f16:
      return 0x1p-10;
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

// ‖x‖₂ / √numel, accumulated in f64 (PyTorch: x.norm(2).item() / numel ** 0.5)
template <Backend B> double rms(const Tensor<B>& x) {
  return std::sqrt(item<double>(fused::sum_squares(std::vector<Tensor<B>>{x}))) / std::sqrt(static_cast<double>(x.numel()));
}

}  // namespace

template <Backend B> Adafactor<B>::Adafactor(std::vector<ParamGroup<B>> groups, AdafactorOptions o)
    : Optimizer<B>(std::move(groups)), o_(o) {
  KILN_CHECK(o.beta2_decay <= 0, "Adafactor: beta2_decay must be <= 0, got {}", o.beta2_decay);
  KILN_CHECK(!o.eps1 || *o.eps1 >= 0, "Adafactor: eps1 must be >= 0, got {}", o.eps1.value_or(0));
  KILN_CHECK(o.eps2 >= 0, "Adafactor: eps2 must be >= 0, got {}", o.eps2);
  KILN_CHECK(o.d >= 1, "Adafactor: the clipping threshold d must be >= 1, got {}", o.d);
}

template <Backend B> Shape Adafactor<B>::buffer_shape(const std::string& buf, const Shape& param) const {
  Shape s = param;
  if (buf == "row_var" && s.size() >= 2) s.back() = 1;
  if (buf == "col_var" && s.size() >= 2) s[s.size() - 2] = 1;
  return s;
}

template <Backend B> void Adafactor<B>::step() {
  const profile::Scope prof("optimizer.step(Adafactor)", "optim");
  NoGrad ng;
  const double t = static_cast<double>(++this->steps_);
  const double one_minus_beta2 = std::pow(t, o_.beta2_decay);
  this->each_param([&](const ParamGroup<B>& g, const std::string& name, Tensor<B>& w, const Tensor<B>& grad) {
    const double rho = std::min(g.lr, 1 / std::pow(t, 0.5));
    const double eps1 = o_.eps1 ? *o_.eps1 : machine_eps(w.dtype());
    const double alpha = std::max(o_.eps2, rms(w)) * rho;
    if (g.weight_decay != 0) w.mul_(1 - g.lr * g.weight_decay);
    bool created = false;
    Tensor<B> var;
    if (grad.dim() > 1) {
      const int64_t r = grad.dim();
      const Tensor<B> row_mean = grad.square().sum({r - 1}, true).sqrt().square().div(static_cast<double>(grad.size(r - 1)));
      const Tensor<B> col_mean = grad.square().sum({r - 2}, true).sqrt().square().div(static_cast<double>(grad.size(r - 2)));
      Tensor<B>& row = this->buffer("row_var", name, row_mean, created);
      Tensor<B>& col = this->buffer("col_var", name, col_mean, created);
      lerp_(row, row_mean, one_minus_beta2);
      lerp_(col, col_mean, one_minus_beta2);
      var = row.mul(col).div(row.mean({r - 2}, true).maximum(eps1));
    } else {
      Tensor<B>& v = this->buffer("variance", name, w, created);
      lerp_(v, grad.mul(grad), one_minus_beta2);
      var = v;
    }
    const Tensor<B> update = var.maximum(eps1 * eps1).rsqrt().mul(grad);
    const double denom = std::max(1.0, rms(update) / o_.d);
    w.sub_(update.mul(alpha / denom));
  });
}

#define KILN_INST(B) template class Adafactor<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::optim
