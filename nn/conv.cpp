#include "kiln/nn/conv.hpp"

#include <cmath>

#include "kiln/autograd/autocast.hpp"
#include "kiln/nn/init.hpp"

namespace kiln::nn {

namespace functional {
template <Backend B> Var<B> conv1d(const Var<B>& x, const Var<B>& weight, const Var<B>& bias, int64_t stride, int64_t padding,
                                   int64_t dilation, int64_t groups) {
  KILN_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3), "conv1d: input must be [N, C, L] or [C, L], got {}",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  KILN_CHECK(weight.defined() && weight.dim() == 3, "conv1d: weight must be [O, C/groups, k], got {}",
             weight.defined() ? shape_str(weight.shape()) : std::string("undefined"));
  const int64_t ax = x.dim() - 1;  // the length axis; H = 1 is inserted before it
  const Conv2dParams p{Size2{1, stride}, Size2{0, padding}, Size2{1, dilation}, groups};
  // The weight is cast before the unsqueeze, so that autocast's cast cache sees the parameter itself.
  return autograd::ConvOps<B>::conv2d(x.unsqueeze(ax), autocast::cast(autocast::Op::conv2d, weight).unsqueeze(2), bias, p).squeeze(ax);
}
}  // namespace functional

namespace {
// PyTorch's _ConvNd.reset_parameters: kaiming_uniform_(w, a=√5), bias U(±1/√fan_in).
template <Backend B> void reset(Var<B>& w, Var<B>& b) {
  init::kaiming_uniform_(w, std::sqrt(5.0));
  if (b.defined()) {
    const int64_t fan_in = init::fans(w.shape(), "conv").first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(b, -bound, bound);
  }
}
void check_channels(const char* op, int64_t in, int64_t out, int64_t groups) {
  KILN_CHECK(in >= 1 && out >= 1, "{}: in_channels and out_channels must be >= 1, got {} and {}", op, in, out);
  KILN_CHECK(groups >= 1, "{}: groups must be >= 1, got {}", op, groups);
  KILN_CHECK(in % groups == 0, "{}: in_channels {} must be divisible by groups {}", op, in, groups);
  KILN_CHECK(out % groups == 0, "{}: out_channels {} must be divisible by groups {}", op, out, groups);
}
void check_geometry(const char* op, Size2 k, Size2 s, Size2 p, Size2 d) {
  KILN_CHECK(k.h >= 1 && k.w >= 1, "{}: kernel_size must be >= 1, got ({}, {})", op, k.h, k.w);
  KILN_CHECK(s.h >= 1 && s.w >= 1, "{}: stride must be >= 1, got ({}, {})", op, s.h, s.w);
  KILN_CHECK(p.h >= 0 && p.w >= 0, "{}: padding must be >= 0, got ({}, {})", op, p.h, p.w);
  KILN_CHECK(d.h >= 1 && d.w >= 1, "{}: dilation must be >= 1, got ({}, {})", op, d.h, d.w);
}
}  // namespace

template <Backend B> Conv1d<B>::Conv1d(Conv1dOptions o) : o_(o) {
  check_channels("Conv1d", o.in_channels, o.out_channels, o.groups);
  check_geometry("Conv1d", o.kernel_size, o.stride, o.padding, o.dilation);
  w_ = this->register_parameter("weight", Tensor<B>::empty({o.out_channels, o.in_channels / o.groups, o.kernel_size}, o.dtype));
  if (o.bias) b_ = this->register_parameter("bias", Tensor<B>::empty({o.out_channels}, o.dtype));
  reset(w_, b_);
}

template <Backend B> Var<B> Conv1d<B>::forward(const Var<B>& x) const {
  return functional::conv1d(x, w_, b_, o_.stride, o_.padding, o_.dilation, o_.groups);
}

template <Backend B> Conv2d<B>::Conv2d(Conv2dOptions o) : o_(o) {
  check_channels("Conv2d", o.in_channels, o.out_channels, o.groups);
  check_geometry("Conv2d", o.kernel_size, o.stride, o.padding, o.dilation);
  w_ = this->register_parameter("weight",
                                Tensor<B>::empty({o.out_channels, o.in_channels / o.groups, o.kernel_size.h, o.kernel_size.w}, o.dtype));
  if (o.bias) b_ = this->register_parameter("bias", Tensor<B>::empty({o.out_channels}, o.dtype));
  reset(w_, b_);
}

template <Backend B> Var<B> Conv2d<B>::forward(const Var<B>& x) const {
  return autograd::ConvOps<B>::conv2d(x, w_, b_, Conv2dParams{o_.stride, o_.padding, o_.dilation, o_.groups});
}

template <Backend B> ConvTranspose2d<B>::ConvTranspose2d(ConvTranspose2dOptions o) : o_(o) {
  check_channels("ConvTranspose2d", o.in_channels, o.out_channels, o.groups);
  check_geometry("ConvTranspose2d", o.kernel_size, o.stride, o.padding, o.dilation);
  const Size2 op = o.output_padding;
  KILN_CHECK(op.h >= 0 && op.w >= 0 && (op.h < o.stride.h || op.h < o.dilation.h) && (op.w < o.stride.w || op.w < o.dilation.w),
             "ConvTranspose2d: output_padding ({}, {}) must be >= 0 and smaller than either stride ({}, {}) or dilation ({}, {})", op.h,
             op.w, o.stride.h, o.stride.w, o.dilation.h, o.dilation.w);
  w_ = this->register_parameter("weight",
                                Tensor<B>::empty({o.in_channels, o.out_channels / o.groups, o.kernel_size.h, o.kernel_size.w}, o.dtype));
  if (o.bias) b_ = this->register_parameter("bias", Tensor<B>::empty({o.out_channels}, o.dtype));
  reset(w_, b_);
}

template <Backend B> Var<B> ConvTranspose2d<B>::forward(const Var<B>& x) const {
  return autograd::ConvOps<B>::conv_transpose2d(x, w_, b_, Conv2dParams{o_.stride, o_.padding, o_.dilation, o_.groups}, o_.output_padding);
}

#define KILN_INST(B)                                                                                                      \
  template Var<B> functional::conv1d<B>(const Var<B>&, const Var<B>&, const Var<B>&, int64_t, int64_t, int64_t, int64_t); \
  template class Conv1d<B>;                                                                                               \
  template class Conv2d<B>;                                                                                               \
  template class ConvTranspose2d<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
