#pragma once
// Fused ops: a composite default built from the Backend primitives, which a backend overrides by
// providing the static member named below. Every caller (Tensor, autograd, nn) goes through these
// functions, so an override speeds up all of them at once.
//
//   softmax_lastdim(MutView out, View x, bool log)            rows of the last axis, x contiguous
//   softmax_lastdim_backward(MutView dx, View y, View dy, bool log)   y = forward output
#include "core/tensor.hpp"

namespace kiln::fused {

template <class B>
concept HasSoftmax = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, bool log) {
  B::softmax_lastdim(out, in, log);
};
template <class B>
concept HasSoftmaxBackward = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, bool log) {
  B::softmax_lastdim_backward(out, in, in, log);
};

// softmax (log = false) or log_softmax (log = true) along `axis`.
template <Backend B> Tensor<B> softmax(const Tensor<B>& x, int64_t axis, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  KILN_CHECK(x.defined(), "{}: undefined tensor", name);
  KILN_CHECK(is_floating(x.dtype()), "{}: needs a float dtype, got {} (shape {})", name, x.dtype(), shape_str(x.shape()));
  const int a = normalize_axis(axis, x.dim(), name, x.shape());
  if constexpr (HasSoftmax<B>) {
    if (x.dim() > 0 && x.numel() > 0) {
      const bool last = a == x.dim() - 1;
      const Tensor<B> xc = (last ? x : x.transpose(a, -1)).contiguous();
      Tensor<B> out = Tensor<B>::empty(xc.shape(), x.dtype());
      B::softmax_lastdim(out.mview(), xc.cview(), log);
      return last ? out : out.transpose(a, -1).contiguous();
    }
  }
  if (x.dtype() == DType::bf16 || x.dtype() == DType::f16)  // compute in f32, round once (as PyTorch does)
    return softmax(x.to(DType::f32), a, log).to(x.dtype());
  const std::vector<int64_t> ax{a};
  const Tensor<B> shifted = x.sub(x.numel() ? x.max(ax, true) : x);
  const Tensor<B> e = shifted.exp();
  const Tensor<B> s = e.sum(ax, true);
  return log ? shifted.sub(s.log()) : e.div(s);
}

// Gradient of softmax/log_softmax along `axis` given its output y and the output's gradient dy.
template <Backend B> Tensor<B> softmax_backward(const Tensor<B>& y, const Tensor<B>& dy, int64_t axis, bool log) {
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  KILN_CHECK(y.shape() == dy.shape() && y.dtype() == dy.dtype(), "{}: y {} {} and dy {} {} differ", name, shape_str(y.shape()),
             y.dtype(), shape_str(dy.shape()), dy.dtype());
  const int a = normalize_axis(axis, y.dim(), name, y.shape());
  if constexpr (HasSoftmaxBackward<B>) {
    if (y.dim() > 0 && y.numel() > 0) {
      const bool last = a == y.dim() - 1;
      const Tensor<B> yc = (last ? y : y.transpose(a, -1)).contiguous();
      const Tensor<B> dyc = (last ? dy : dy.transpose(a, -1)).contiguous();
      Tensor<B> dx = Tensor<B>::empty(yc.shape(), y.dtype());
      B::softmax_lastdim_backward(dx.mview(), yc.cview(), dyc.cview(), log);
      return last ? dx : dx.transpose(a, -1).contiguous();
    }
  }
  if (y.dtype() == DType::bf16 || y.dtype() == DType::f16)
    return softmax_backward(y.to(DType::f32), dy.to(DType::f32), a, log).to(y.dtype());
  const std::vector<int64_t> ax{a};
  if (log) return dy.sub(y.exp().mul(dy.sum(ax, true)));
  return y.mul(dy.sub(dy.mul(y).sum(ax, true)));
}

}  // namespace kiln::fused
