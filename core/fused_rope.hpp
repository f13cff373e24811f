#pragma once
// Fused rotary position embedding (RoPE, interleaved GPT-J layout; see core/fused.hpp for the override
// pattern). x [..., T, d]: pair k = (x[2k], x[2k+1]) at position t turns by the angle whose cos and sin
// are c = cos[t, k], s = sin[t, k] (tables [T, d/2]):
//   y0 = x0·c − x1·s,  y1 = x0·s + x1·c
//   backward: the same rotation by −angle,  dx0 = g0·c + g1·s,  dx1 = −g0·s + g1·c
// The composite spells this with 2 slices, 4 muls, a sub, an add, a stack and a flatten forward and as
// many again backward; the override does one pass each way and needs only the tables for the backward.
// A backend overrides with
//   rope(MutView y, View x, View cos, View sin, bool inverse)
// receiving f32/f64 tensors of one dtype: x of rank >= 2 whose last axis has stride 1 (the leading axes
// may be strided, e.g. a transposed [B, H, T, hd] view of [B, T, H, hd]), y of x's shape laid out in
// x's memory order (Tensor::empty_like_layout: for that view, a [B, T, H, hd] block seen as
// [B, H, T, hd], so the head split and merge around attention stay views; contiguous when x has an
// expanded, stride-0 axis, which that order would put innermost), or y = x itself (the same
// storage and layout: rope_backward_, in place; the kernel reads each pair before it writes it), cos and
// sin contiguous [T, d/2]; `inverse` turns by −angle (the backward). Half types are converted here.
// Without an override (Reference, Cuda) the composite below runs.
#include <algorithm>
#include <utility>
#include <vector>

#include "kiln/core/profile.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasRope = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, bool inverse) {
  B::rope(out, in, in, in, inverse);
};

namespace detail {
// Whether no two elements of a layout share memory (no stride-0 or interleaved axes): what a kernel
// writing a tensor in place needs.
inline bool non_overlapping(const Shape& shape, const Strides& strides) {
  std::vector<std::pair<int64_t, int64_t>> axes;  // (stride, size) of the axes of size > 1
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1) axes.emplace_back(strides[i], shape[i]);
  std::sort(axes.begin(), axes.end());
  int64_t span = 1;  // elements covered by the axes so far, from the innermost
  for (const auto& [stride, size] : axes) {
    if (stride < span) return false;
    span += stride * (size - 1);
  }
  return true;
}

// rope_apply writes into `into` (x itself, or nullptr for a new tensor); the checks are the caller's.
template <Backend B> Tensor<B> rope_apply(const char* op, const Tensor<B>& x, const Tensor<B>& cos, const Tensor<B>& sin, bool inverse,
                                          Tensor<B>* into = nullptr) {
  KILN_CHECK(x.defined() && cos.defined() && sin.defined(), "{}: undefined tensor", op);
  KILN_CHECK(x.dim() >= 2, "{}: input {} must be [..., T, d]", op, shape_str(x.shape()));
  const int64_t T = x.size(-2), d = x.shape().back();
  KILN_CHECK(d % 2 == 0, "{}: width {} must be even (input {})", op, d, shape_str(x.shape()));
  KILN_CHECK(cos.shape() == Shape({T, d / 2}) && sin.shape() == Shape({T, d / 2}),
             "{}: cos {} and sin {} must be [T, d/2] = [{}, {}] for input {}", op, shape_str(cos.shape()), shape_str(sin.shape()), T, d / 2,
             shape_str(x.shape()));
  KILN_CHECK(is_floating(x.dtype()) && is_floating(cos.dtype()) && is_floating(sin.dtype()),
             "{}: needs float dtypes, got input {}, cos {}, sin {}", op, x.dtype(), cos.dtype(), sin.dtype());
  const DType dt = x.dtype(), cd = dt == DType::f64 ? DType::f64 : DType::f32;
  const Tensor<B> c = cos.to(cd), s = sin.to(cd);
  if constexpr (HasRope<B>) {
    if (into && x.dtype() == cd && x.strides().back() == 1) {  // the kernel reads each pair before it writes it
      const Tensor<B> cc = c.contiguous(), sc = s.contiguous();
      if (x.numel()) KILN_PROFILED("rope", x, x, cc, sc) B::rope(into->mview(), x.cview(), cc.cview(), sc.cview(), inverse);
      return *into;
    }
    Tensor<B> xc = x.to(cd);
    if (xc.strides().back() != 1) xc = xc.contiguous();
    const Tensor<B> cc = c.contiguous(), sc = s.contiguous();
    Tensor<B> y = xc.empty_like_layout(xc.shape(), cd);
    if (y.strides().back() != 1) y = Tensor<B>::empty(xc.shape(), cd);  // x had a stride-0 (expanded) axis
    if (y.numel()) KILN_PROFILED("rope", y, xc, cc, sc) B::rope(y.mview(), xc.cview(), cc.cview(), sc.cview(), inverse);
    return y.to(dt);
  } else {
    const Tensor<B> xf = x.to(cd), sn = inverse ? s.neg() : s;
    const Tensor<B> x0 = xf.slice(-1, 0, d, 2), x1 = xf.slice(-1, 1, d, 2);  // [..., T, d/2]
    const Tensor<B> y0 = x0.mul(c).sub(x1.mul(sn)), y1 = x0.mul(sn).add(x1.mul(c));
    return Tensor<B>::stack({y0, y1}, -1).flatten(-2).to(dt);
  }
}
}  // namespace detail

// y = x turned by the angles of cos/sin [T, d/2], in x's dtype.
template <Backend B> Tensor<B> rope_forward(const Tensor<B>& x, const Tensor<B>& cos, const Tensor<B>& sin) {
  return detail::rope_apply("rope", x, cos, sin, false);
}

// dx from dy: dy turned back by the same angles.
template <Backend B> Tensor<B> rope_backward(const Tensor<B>& dy, const Tensor<B>& cos, const Tensor<B>& sin) {
  return detail::rope_apply("rope_backward", dy, cos, sin, true);
}

// The same, in place: dy's elements become dx's (the autograd op's backward, when it holds the only
// handle on its incoming gradient, spares a fresh buffer that way: autograd/ops/rope.cpp). A backend with
// the kernel (f32/f64 dy, unit-stride last axis) writes dy directly; otherwise dx is computed and copied
// in. dy's elements must not share memory (an expanded view): that is an error naming the shapes.
template <Backend B> Tensor<B>& rope_backward_(Tensor<B>& dy, const Tensor<B>& cos, const Tensor<B>& sin) {
  KILN_CHECK(!dy.defined() || detail::non_overlapping(dy.shape(), dy.strides()),
             "rope_backward_: the gradient {} (strides {}) has elements sharing memory and cannot be written in place",
             shape_str(dy.shape()), shape_str(dy.strides()));
  const Tensor<B> dx = detail::rope_apply("rope_backward_", dy, cos, sin, true, &dy);
  if (dx.storage() != dy.storage()) dy.copy_(dx);
  return dy;
}

}  // namespace kiln::fused
#pragma GCC visibility pop
