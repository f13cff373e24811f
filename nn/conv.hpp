#pragma once
// Convolution layers (zero padding only: PyTorch's padding_mode="zeros"; no "same"/"valid" strings).
// # Shapes
//   Conv1d:          x [N, C, L] or [C, L] -> [N, O, Lo];  weight [O, C/groups, k], bias [O]
//                    Lo = ⌊(L + 2p − d(k−1) − 1)/s⌋ + 1
//   Conv2d:          x [N, C, H, W] or [C, H, W] -> [N, O, Ho, Wo];  weight [O, C/groups, kh, kw], bias [O]
//                    Ho = ⌊(H + 2p − d(kh−1) − 1)/s⌋ + 1 (and the same for W)
//   ConvTranspose2d: x [N, C, H, W] -> [N, O, Ho, Wo];  weight [C, O/groups, kh, kw], bias [O]
//                    Ho = (H − 1)s − 2p + d(kh−1) + output_padding + 1
// Init: PyTorch's default, kaiming_uniform(a=√5) for the weight, i.e. U(−1/√fan_in, 1/√fan_in) with
// fan_in = weight.size(1)·kh·kw, and the same bound for the bias.
#include "kiln/core/conv_params.hpp"
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

namespace functional {
// bias may be an undefined Var. Differentiable in x, weight and bias.
template <Backend B> Var<B> conv2d(const Var<B>& x, const Var<B>& weight, const Var<B>& bias = {}, Size2 stride = 1, Size2 padding = 0,
                                   Size2 dilation = 1, int64_t groups = 1) {
  return autograd::ConvOps<B>::conv2d(x, weight, bias, Conv2dParams{stride, padding, dilation, groups});
}
// x [N, C, L] or [C, L], weight [O, C/groups, k]: conv2d over [N, C, 1, L].
template <Backend B> KILN_API Var<B> conv1d(const Var<B>& x, const Var<B>& weight, const Var<B>& bias = {}, int64_t stride = 1,
                                            int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// PyTorch's argument order (output_padding before groups, dilation last).
template <Backend B> Var<B> conv_transpose2d(const Var<B>& x, const Var<B>& weight, const Var<B>& bias = {}, Size2 stride = 1,
                                             Size2 padding = 0, Size2 output_padding = 0, int64_t groups = 1, Size2 dilation = 1) {
  return autograd::ConvOps<B>::conv_transpose2d(x, weight, bias, Conv2dParams{stride, padding, dilation, groups}, output_padding);
}
}  // namespace functional

struct Conv1dOptions {
  int64_t in_channels = 0, out_channels = 0;
  int64_t kernel_size = 1, stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::f32;
};

struct Conv2dOptions {
  int64_t in_channels = 0, out_channels = 0;
  Size2 kernel_size = 1, stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::f32;
};

// The fields shared with Conv2dOptions come in the same order (C++ designated initialisers must follow
// the declaration order, so an initialiser written for one compiles for the other), output_padding
// after padding as in PyTorch's keyword order. Unlike torch.nn.ConvTranspose2d's positional
// arguments, dilation precedes groups and bias here (docs/layers.md, "Porting from PyTorch").
struct ConvTranspose2dOptions {
  int64_t in_channels = 0, out_channels = 0;
  Size2 kernel_size = 1, stride = 1, padding = 0, output_padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::f32;
};

template <Backend B> class Conv1d : public Module<B> {
 public:
  explicit Conv1d(Conv1dOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const Conv1dOptions& options() const { return o_; }
  Var<B>& weight() { return w_; }
  Var<B>& bias() { return b_; }

 private:
  Conv1dOptions o_;
  Var<B> w_, b_;
};

template <Backend B> class Conv2d : public Module<B> {
 public:
  explicit Conv2d(Conv2dOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const Conv2dOptions& options() const { return o_; }
  Var<B>& weight() { return w_; }
  Var<B>& bias() { return b_; }

 private:
  Conv2dOptions o_;
  Var<B> w_, b_;
};

template <Backend B> class ConvTranspose2d : public Module<B> {
 public:
  explicit ConvTranspose2d(ConvTranspose2dOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const ConvTranspose2dOptions& options() const { return o_; }
  Var<B>& weight() { return w_; }
  Var<B>& bias() { return b_; }

 private:
  ConvTranspose2dOptions o_;
  Var<B> w_, b_;
};

#define KILN_EXTERN(B)             \
  extern template class Conv1d<B>; \
  extern template class Conv2d<B>; \
  extern template class ConvTranspose2d<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
