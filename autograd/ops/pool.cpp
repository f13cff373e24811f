// Differentiable pooling (core/fused_conv.hpp). Max pooling saves the argmax indices and scatters
// dy back to them; average pooling saves nothing but shapes; adaptive average pooling likewise.
// An unbatched input [C, H, W] runs as [1, C, H, W] and the output drops the batch axis again.
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_conv.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> void check_input(const Var<B>& x, const char* op) {
  KILN_CHECK(x.defined(), "{}: undefined input", op);
  KILN_CHECK(x.dim() == 3 || x.dim() == 4, "{}: input must be [N, C, H, W] or [C, H, W], got {}", op, shape_str(x.shape()));
}
}  // namespace

template <Backend B> Grads<B> MaxPool2dBackward<B>::operator()(const Tensor<B>& grad_out) const {
  return Grads<B>{fused::max_pool2d_backward(grad_out, indices, input_shape, p)};
}

template <Backend B> std::pair<Var<B>, Tensor<B>> PoolOps<B>::max_pool2d_with_indices(const X& x, const Pool2dParams& p) {
  check_input(x, "max_pool2d");
  if (x.dim() == 3) {
    auto [y, idx] = max_pool2d_with_indices(x.unsqueeze(0), p);
    return {y.squeeze(0), idx.squeeze(0)};
  }
  auto [y, idx] = fused::max_pool2d(x.value(), p);
  if (!needs_grad(x)) return {X(y), idx};
  return {record<B>("max_pool2d", std::move(y), {&x}, MaxPool2dBackward<B>{idx, x.shape(), p}), idx};
}

template <Backend B> Var<B> PoolOps<B>::max_pool2d(const X& x, const Pool2dParams& p) { return max_pool2d_with_indices(x, p).first; }

template <Backend B> Var<B> PoolOps<B>::avg_pool2d(const X& x, const Pool2dParams& p) {
  check_input(x, "avg_pool2d");
  if (x.dim() == 3) return avg_pool2d(x.unsqueeze(0), p).squeeze(0);
  return record<B>("avg_pool2d", fused::avg_pool2d(x.value(), p), {&x},
                   [xs = x.shape(), p](const Tensor<B>& g) { return Grads<B>{fused::avg_pool2d_backward(g, xs, p)}; });
}

template <Backend B> Var<B> PoolOps<B>::adaptive_avg_pool2d(const X& x, Size2 output_size) {
  check_input(x, "adaptive_avg_pool2d");
  if (x.dim() == 3) return adaptive_avg_pool2d(x.unsqueeze(0), output_size).squeeze(0);
  return record<B>("adaptive_avg_pool2d", fused::adaptive_avg_pool2d(x.value(), output_size), {&x},
                   [xs = x.shape()](const Tensor<B>& g) { return Grads<B>{fused::adaptive_avg_pool2d_backward(g, xs)}; });
}

#define KILN_INST(B)                    \
  template struct MaxPool2dBackward<B>; \
  template struct PoolOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
