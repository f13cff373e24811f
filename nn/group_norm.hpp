#pragma once
// Group normalisation, as torch.nn.GroupNorm and F.group_norm: the C channels are split into
// num_groups groups and each (sample, group) is normalised over its channels and spatial positions
// with the biased variance; then a per-channel affine transform. No running statistics: train and eval
// behave the same.
// # Shapes
//   x [N, C, *] -> same; weight, bias [C]; C % num_groups == 0
// Backward is one recorded op with the closed-form gradient, saving x and the per-group mean and 1/std.
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

namespace functional {
// weight and bias [C] may be undefined. Differentiable in x, weight and bias.
template <Backend B>
KILN_API Var<B> group_norm(const Var<B>& x, int64_t num_groups, const Var<B>& weight = {}, const Var<B>& bias = {}, double eps = 1e-5);
}  // namespace functional

struct GroupNormOptions {
  int64_t num_groups = 0;
  int64_t num_channels = 0;
  double eps = 1e-5;
  bool affine = true;  // parameters "weight" (ones) and "bias" (zeros), [num_channels]
  DType dtype = DType::f32;
};

template <Backend B> class GroupNorm : public Module<B> {
 public:
  explicit GroupNorm(GroupNormOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const GroupNormOptions& options() const { return o_; }
  const Var<B>& weight() const { return w_; }
  const Var<B>& bias() const { return b_; }

 private:
  GroupNormOptions o_;
  Var<B> w_, b_;
};

#define KILN_EXTERN(B) extern template class GroupNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
