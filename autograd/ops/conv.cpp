// Differentiable convolutions (core/fused_conv.hpp):
//   conv2d:            y = conv(x, w) + b          dx = conv2d_backward_input(dy, w)
//                                                  dw, db = conv2d_backward_weight(dy, x)
//   conv_transpose2d:  y = conv2d_backward_input(x, w) + b, i.e. the adjoint of conv2d(·, w), so
//                      dx = conv2d(dy, w), dw = conv2d_backward_weight(x as the conv's output
//                      gradient, dy as its input), db = Σ dy over (N, H, W).
// An unbatched input [C, H, W] runs as [1, C, H, W] and the output drops the batch axis again.
// Under autocast (autograd/autocast.hpp) input, weight and bias are cast to the low dtype first, as
// matmul's operands (PyTorch's policy for conv and conv_transpose): the convolution computes in f32 on
// the 16-bit operands and rounds its output once (core/fused_conv.hpp), its gradients likewise, and
// the casts' backward brings them back to each operand's own dtype (f32 for f32 parameters).
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_conv.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> Var<B> batched(const Var<B>& x, const char* op) {
  KILN_CHECK(x.defined(), "{}: undefined input", op);
  KILN_CHECK(x.dim() == 3 || x.dim() == 4, "{}: input must be [N, C, H, W] or [C, H, W], got {}", op, shape_str(x.shape()));
  return x.dim() == 3 ? x.unsqueeze(0) : x;
}
// The bias's gradient Σ dy over (N, H, W), rounded once: a bf16/f16 dy is summed in f32 (Tensor::sum
// over several axes rounds to the dtype after each axis).
template <Backend B> Tensor<B> bias_grad(const Tensor<B>& g) {
  if (g.dtype() != DType::bf16 && g.dtype() != DType::f16) return g.sum({0, 2, 3});
  return g.to(DType::f32).sum({0, 2, 3}).to(g.dtype());
}
}  // namespace

template <Backend B> Var<B> ConvOps<B>::conv2d(const X& x_in, const X& w_in, const X& bias_in, const Conv2dParams& p) {
  KILN_CHECK(w_in.defined(), "conv2d: undefined weight");
  constexpr auto op = autocast::Op::conv2d;
  const X x = x_in.defined() ? autocast::cast(op, x_in) : x_in, w = autocast::cast(op, w_in),
          bias = bias_in.defined() ? autocast::cast(op, bias_in) : bias_in;
  if (x.defined() && x.dim() == 3) return conv2d(x.unsqueeze(0), w, bias, p).squeeze(0);
  const X xb = batched(x, "conv2d");
  const Tensor<B> bv = bias.defined() ? bias.value() : Tensor<B>();
  Tensor<B> y = fused::conv2d(xb.value(), w.value(), bv, p);
  const bool nx = needs_grad(xb), nw = needs_grad(w), nb = bias.defined() && needs_grad(bias);
  return record<B>(
      "conv2d", std::move(y), {&xb, &w, &bias},
      [nx, nw, nb, p, xs = xb.shape(), ws = w.shape(), xv = keep_if(nw, xb.value()), wv = keep_if(nx, w.value())](const Tensor<B>& g) {
        Tensor<B> dx, dw, db;
        if (nx) dx = fused::conv2d_backward_input(g, wv, xs, p);
        if (nw)
          std::tie(dw, db) = fused::conv2d_backward_weight(g, xv, ws, p, nb);
        else if (nb)
          db = bias_grad(g);
        return Grads<B>{dx, dw, db};
      });
}

template <Backend B>
Var<B> ConvOps<B>::conv_transpose2d(const X& x_in, const X& w_in, const X& bias_in, const Conv2dParams& p, Size2 output_padding) {
  KILN_CHECK(w_in.defined(), "conv_transpose2d: undefined weight");
  constexpr auto op = autocast::Op::conv_transpose2d;
  const X x = x_in.defined() ? autocast::cast(op, x_in) : x_in, w = autocast::cast(op, w_in),
          bias = bias_in.defined() ? autocast::cast(op, bias_in) : bias_in;
  if (x.defined() && x.dim() == 3) return conv_transpose2d(x.unsqueeze(0), w, bias, p, output_padding).squeeze(0);
  const X xb = batched(x, "conv_transpose2d");
  const Tensor<B> bv = bias.defined() ? bias.value() : Tensor<B>();
  Tensor<B> y = fused::conv_transpose2d(xb.value(), w.value(), bv, p, output_padding);
  const bool nx = needs_grad(xb), nw = needs_grad(w), nb = bias.defined() && needs_grad(bias);
  return record<B>(
      "conv_transpose2d", std::move(y), {&xb, &w, &bias},
      [nx, nw, nb, p, xs = xb.shape(), ws = w.shape(), xv = keep_if(nw, xb.value()), wv = keep_if(nx, w.value())](const Tensor<B>& g) {
        Tensor<B> dx, dw, db;
        // conv2d(dy, w) has the input's size, or more where output_padding >= stride (allowed when it
        // is < dilation): the extra rows/columns of y receive nothing from x.
        const Shape cs = fused::detail::conv2d_shape("conv_transpose2d_backward", g.shape(), ws, nullptr, p);
        if (nx) {
          dx = fused::conv2d(g, wv, Tensor<B>(), p);
          if (dx.shape() != xs) dx = dx.narrow(2, 0, xs[2]).narrow(3, 0, xs[3]).contiguous();
        }
        if (nw) {
          Tensor<B> xg = xv;
          if (cs != xs) {
            xg = Tensor<B>::zeros(cs, xv.dtype());
            xg.narrow(2, 0, xs[2]).narrow(3, 0, xs[3]).copy_(xv);
          }
          dw = fused::conv2d_backward_weight(xg, g, ws, p, false).first;
        }
        if (nb) db = bias_grad(g);
        return Grads<B>{dx, dw, db};
      });
}

#define KILN_INST(B) template struct ConvOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
