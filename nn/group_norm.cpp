#include "kiln/nn/group_norm.hpp"

#include "kiln/autograd/layer_ops.hpp"

namespace kiln::nn {

namespace functional {

template <Backend B> Var<B> group_norm(const Var<B>& x, int64_t num_groups, const Var<B>& weight, const Var<B>& bias, double eps) {
  return autograd::NormOps<B>::group_norm(x, num_groups, weight, bias, eps);
}

}  // namespace functional

template <Backend B> GroupNorm<B>::GroupNorm(GroupNormOptions o) : o_(o) {
  KILN_CHECK(o.num_groups >= 1 && o.num_channels >= 1, "GroupNorm: num_groups and num_channels must be >= 1, got {} and {}", o.num_groups,
             o.num_channels);
  KILN_CHECK(o.num_channels % o.num_groups == 0, "GroupNorm: num_channels must be divisible by num_groups, got {} and {}", o.num_channels,
             o.num_groups);
  KILN_CHECK(o.eps >= 0, "GroupNorm: eps must be >= 0, got {}", o.eps);
  KILN_CHECK(is_floating(o.dtype), "GroupNorm: dtype must be floating point, got {}", o.dtype);
  if (o.affine) {
    w_ = this->register_parameter("weight", Tensor<B>::ones({o.num_channels}, o.dtype));
    b_ = this->register_parameter("bias", Tensor<B>::zeros({o.num_channels}, o.dtype));
  }
}

template <Backend B> Var<B> GroupNorm<B>::forward(const Var<B>& x) const {
  KILN_CHECK(x.dim() >= 2 && x.size(1) == o_.num_channels, "GroupNorm: input {} should have shape [N, {}, *] (num_channels={})",
             shape_str(x.shape()), o_.num_channels, o_.num_channels);
  return functional::group_norm<B>(x, o_.num_groups, w_, b_, o_.eps);
}

#define KILN_INST(B)                                                                                       \
  template Var<B> functional::group_norm<B>(const Var<B>&, int64_t, const Var<B>&, const Var<B>&, double); \
  template class GroupNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
