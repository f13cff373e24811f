#include "kiln/nn/norm.hpp"

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/layer_ops.hpp"

namespace kiln::nn {

namespace functional {

// One recorded op on the fused kernel (autograd/ops/norm.cpp).
template <Backend B> Var<B> rms_norm(const Var<B>& x, const Var<B>& weight, double eps) {
  return autograd::NormOps<B>::rms_norm(x, weight, eps);
}

template <Backend B> Var<B> layer_norm(const Var<B>& x_in, const Var<B>& weight, const Var<B>& bias, double eps) {
  const Var<B> x = autocast::cast(autocast::Op::layer_norm, x_in);
  KILN_CHECK(x.dim() >= 1, "layer_norm: input must have rank >= 1, got {}", shape_str(x.shape()));
  const Shape d{x.shape().back()};
  KILN_CHECK(!weight.defined() || weight.shape() == d, "layer_norm: weight {} does not match input {}", shape_str(weight.shape()),
             shape_str(x.shape()));
  KILN_CHECK(!bias.defined() || bias.shape() == d, "layer_norm: bias {} does not match input {}", shape_str(bias.shape()),
             shape_str(x.shape()));
  const Var<B> c = x - x.mean({-1}, true);
  Var<B> y = c * c.square().mean({-1}, true).add(eps).rsqrt();
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

}  // namespace functional

template <Backend B> RMSNorm<B>::RMSNorm(RMSNormOptions o) : o_(o) {
  KILN_CHECK(o.dim >= 1 && o.eps > 0, "RMSNorm: dim must be >= 1 and eps > 0, got dim={} eps={}", o.dim, o.eps);
  KILN_CHECK(o.offset == 0 || o.affine, "RMSNorm: offset {} needs affine (a weight to offset)", o.offset);
  if (o.affine) w_ = this->register_parameter("weight", Tensor<B>::full({o.dim}, 1.0 - o.offset, o.dtype));
}
template <Backend B> Var<B> RMSNorm<B>::forward(const Var<B>& x) const {
  return functional::rms_norm(x, o_.offset == 0 ? w_ : w_.add(o_.offset), o_.eps);
}

template <Backend B> LayerNorm<B>::LayerNorm(LayerNormOptions o) : o_(o) {
  KILN_CHECK(o.dim >= 1 && o.eps > 0, "LayerNorm: dim must be >= 1 and eps > 0, got dim={} eps={}", o.dim, o.eps);
  if (o.affine) {
    w_ = this->register_parameter("weight", Tensor<B>::ones({o.dim}, o.dtype));
    if (o.bias) b_ = this->register_parameter("bias", Tensor<B>::zeros({o.dim}, o.dtype));
  }
}
template <Backend B> Var<B> LayerNorm<B>::forward(const Var<B>& x) const { return functional::layer_norm(x, w_, b_, o_.eps); }

#define KILN_INST(B)                                                                              \
  template Var<B> functional::rms_norm<B>(const Var<B>&, const Var<B>&, double);                  \
  template Var<B> functional::layer_norm<B>(const Var<B>&, const Var<B>&, const Var<B>&, double); \
  template class RMSNorm<B>;                                                                      \
  template class LayerNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
