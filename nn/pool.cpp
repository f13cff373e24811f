#include "kiln/nn/pool.hpp"

namespace kiln::nn {

namespace {
// The options' own checks, at construction (the ops check them again with the input's shape).
void check_options(const char* op, Size2 k, const std::optional<Size2>& s, Size2 pad) {
  KILN_CHECK(k.h >= 1 && k.w >= 1, "{}: kernel_size must be >= 1, got ({}, {})", op, k.h, k.w);
  if (s) KILN_CHECK(s->h >= 1 && s->w >= 1, "{}: stride must be >= 1, got ({}, {})", op, s->h, s->w);
  KILN_CHECK(pad.h >= 0 && pad.w >= 0 && pad.h <= k.h / 2 && pad.w <= k.w / 2,
             "{}: padding ({}, {}) must be >= 0 and at most half of kernel_size ({}, {}), whatever the dilation (as PyTorch)", op, pad.h,
             pad.w, k.h, k.w);
}
}  // namespace

template <Backend B> MaxPool2d<B>::MaxPool2d(MaxPool2dOptions o) : o_(o) {
  check_options("MaxPool2d", o.kernel_size, o.stride, o.padding);
  KILN_CHECK(o.dilation.h >= 1 && o.dilation.w >= 1, "MaxPool2d: dilation must be >= 1, got ({}, {})", o.dilation.h, o.dilation.w);
}

template <Backend B> Var<B> MaxPool2d<B>::forward(const Var<B>& x) const {
  return functional::max_pool2d(x, o_.kernel_size, o_.stride, o_.padding, o_.dilation, o_.ceil_mode);
}

template <Backend B> AvgPool2d<B>::AvgPool2d(AvgPool2dOptions o) : o_(o) { check_options("AvgPool2d", o.kernel_size, o.stride, o.padding); }

template <Backend B> Var<B> AvgPool2d<B>::forward(const Var<B>& x) const {
  return functional::avg_pool2d(x, o_.kernel_size, o_.stride, o_.padding, o_.ceil_mode, o_.count_include_pad);
}

template <Backend B> AdaptiveAvgPool2d<B>::AdaptiveAvgPool2d(Size2 output_size) : out_(output_size) {
  KILN_CHECK(out_.h >= 1 && out_.w >= 1, "AdaptiveAvgPool2d: output_size must be >= 1, got ({}, {})", out_.h, out_.w);
}

template <Backend B> Var<B> AdaptiveAvgPool2d<B>::forward(const Var<B>& x) const { return functional::adaptive_avg_pool2d(x, out_); }

template <Backend B> Flatten<B>::Flatten(FlattenOptions o) : o_(o) {}

template <Backend B> Var<B> Flatten<B>::forward(const Var<B>& x) const { return x.flatten(o_.start_dim, o_.end_dim); }

#define KILN_INST(B)                   \
  template class MaxPool2d<B>;         \
  template class AvgPool2d<B>;         \
  template class AdaptiveAvgPool2d<B>; \
  template class Flatten<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
