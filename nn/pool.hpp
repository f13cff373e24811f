#pragma once
// Pooling layers and Flatten.
// # Shapes
//   MaxPool2d, AvgPool2d:  x [N, C, H, W] or [C, H, W] -> [N, C, Ho, Wo]
//       Ho = ⌊ or ⌈(H + 2p − d(k−1) − 1)/s⌉ + 1 (ceil_mode), the last window starting inside the
//       input or the left padding; stride defaults to kernel_size; padding at most half of kernel_size (undilated, as
//       PyTorch), checked when the layer is made and by the functional ops.
//   AdaptiveAvgPool2d:     x [N, C, H, W] or [C, H, W] -> [N, C, Ho, Wo] (output_size), cell (i, j)
//       averaging rows [⌊iH/Ho⌋, ⌈(i+1)H/Ho⌉) and the same for columns
//   Flatten:               x [d0, ..., dn] -> dims start_dim..end_dim merged into one (default 1..-1)
// No parameters. Max pooling keeps the argmax indices for backward, never the input.
#include <optional>
#include <utility>

#include "kiln/core/conv_params.hpp"
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

namespace functional {
// stride: kernel_size when not given (PyTorch's stride=None).
template <Backend B> Var<B> max_pool2d(const Var<B>& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                                       Size2 dilation = 1, bool ceil_mode = false) {
  return autograd::PoolOps<B>::max_pool2d(x, Pool2dParams{kernel_size, stride.value_or(kernel_size), padding, dilation, ceil_mode});
}
// {y, indices}: PyTorch's return_indices=True (i64 indices into each H·W plane).
template <Backend B> std::pair<Var<B>, Tensor<B>> max_pool2d_with_indices(const Var<B>& x, Size2 kernel_size,
                                                                          std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                                                                          Size2 dilation = 1, bool ceil_mode = false) {
  return autograd::PoolOps<B>::max_pool2d_with_indices(
      x, Pool2dParams{kernel_size, stride.value_or(kernel_size), padding, dilation, ceil_mode});
}
template <Backend B> Var<B> avg_pool2d(const Var<B>& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                                       bool ceil_mode = false, bool count_include_pad = true) {
  return autograd::PoolOps<B>::avg_pool2d(
      x, Pool2dParams{kernel_size, stride.value_or(kernel_size), padding, 1, ceil_mode, count_include_pad});
}
template <Backend B> Var<B> adaptive_avg_pool2d(const Var<B>& x, Size2 output_size) {
  return autograd::PoolOps<B>::adaptive_avg_pool2d(x, output_size);
}
}  // namespace functional

struct MaxPool2dOptions {
  Size2 kernel_size = 1;
  std::optional<Size2> stride{};  // kernel_size when unset
  Size2 padding = 0, dilation = 1;
  bool ceil_mode = false;
};

struct AvgPool2dOptions {
  Size2 kernel_size = 1;
  std::optional<Size2> stride{};  // kernel_size when unset
  Size2 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
};

template <Backend B> class MaxPool2d : public Module<B> {
 public:
  explicit MaxPool2d(MaxPool2dOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const MaxPool2dOptions& options() const { return o_; }

 private:
  MaxPool2dOptions o_;
};

template <Backend B> class AvgPool2d : public Module<B> {
 public:
  explicit AvgPool2d(AvgPool2dOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const AvgPool2dOptions& options() const { return o_; }

 private:
  AvgPool2dOptions o_;
};

template <Backend B> class AdaptiveAvgPool2d : public Module<B> {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  Size2 output_size() const { return out_; }

 private:
  Size2 out_;
};

struct FlattenOptions {
  int64_t start_dim = 1, end_dim = -1;
};

template <Backend B> class Flatten : public Module<B> {
 public:
  explicit Flatten(FlattenOptions o = {});
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const FlattenOptions& options() const { return o_; }

 private:
  FlattenOptions o_;
};

#define KILN_EXTERN(B)                        \
  extern template class MaxPool2d<B>;         \
  extern template class AvgPool2d<B>;         \
  extern template class AdaptiveAvgPool2d<B>; \
  extern template class Flatten<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
