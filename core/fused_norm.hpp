#pragma once
// Fused RMSNorm over the last axis (see core/fused.hpp for the override pattern):
//   y = x · r · w,  r = 1/√(mean(x²) + eps)   (w optional)
//   backward, with g = dy·w:  dx = r·g − x·r³·mean(g·x),  dw = Σ_rows dy·x·r
// A backend overrides with
//   rms_norm_forward(MutView y, MutView rstd, View x, const View* w, double eps)
//   rms_norm_backward(MutView dx, MutView dw /* or nullptr */, View x, const View* w, View rstd, View dy)
// receiving contiguous f32/f64 rows (x, dy, y, dx [N, D]; rstd [N]; w, dw [D]).
#include <utility>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasRmsNorm = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, const View<typename B::Storage>* w,
                              MutView<typename B::Storage>* dw, double eps) {
  B::rms_norm_forward(out, out, in, w, eps);
  B::rms_norm_backward(out, dw, in, w, in, in);
};

namespace detail {
inline void rms_check(const char* op, const Shape& x, const Shape* w, DType xd, DType wd) {
  KILN_CHECK(!x.empty() && x.back() > 0, "{}: input must have rank >= 1 and a non-empty last axis, got {}", op, shape_str(x));
  KILN_CHECK(is_floating(xd), "{}: needs a float dtype, got {}", op, xd);
  if (w) {
    KILN_CHECK(*w == Shape{x.back()}, "{}: weight {} does not match input {}", op, shape_str(*w), shape_str(x));
    KILN_CHECK(wd == xd, "{}: weight dtype {} differs from input dtype {}", op, wd, xd);
  }
}
}  // namespace detail

// (y, rstd): y like x; rstd [rows] (x's shape without the last axis), f32 for half inputs.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> rms_norm_forward(const Tensor<B>& x, const Tensor<B>& w, double eps) {
  detail::rms_check("rms_norm", x.shape(), w.defined() ? &w.shape() : nullptr, x.dtype(), w.defined() ? w.dtype() : x.dtype());
  const DType dt = x.dtype(), cd = dt == DType::f64 ? DType::f64 : DType::f32;
  Shape rows(x.shape().begin(), x.shape().end() - 1);
  if constexpr (HasRmsNorm<B>) {
    const int64_t D = x.shape().back(), N = x.numel() / D;
    const Tensor<B> xc = x.to(cd).contiguous().reshape({N, D});
    const Tensor<B> wc = w.defined() ? w.to(cd).contiguous() : Tensor<B>();
    Tensor<B> y = Tensor<B>::empty({N, D}, cd), r = Tensor<B>::empty({N}, cd);
    const View<typename B::Storage> wv = wc.defined() ? wc.cview() : xc.cview();
    if (N) KILN_PROFILED("rms_norm_forward", y, r, xc, wc)
    B::rms_norm_forward(y.mview(), r.mview(), xc.cview(), wc.defined() ? &wv : nullptr, eps);
    return {y.reshape(x.shape()).to(dt), r.reshape(rows)};
  } else {
    const Tensor<B> xf = x.to(cd);
    const Tensor<B> r = xf.square().mean({-1}, true).add(eps).rsqrt();
    Tensor<B> y = xf.mul(r);
    if (w.defined()) y = y.mul(w.to(cd));
    return {y.to(dt), r.reshape(rows)};
  }
}

// (dx, dw); dw undefined when w is.
template <Backend B>
std::pair<Tensor<B>, Tensor<B>> rms_norm_backward(const Tensor<B>& x, const Tensor<B>& w, const Tensor<B>& rstd, const Tensor<B>& dy) {
  detail::rms_check("rms_norm_backward", x.shape(), w.defined() ? &w.shape() : nullptr, x.dtype(), w.defined() ? w.dtype() : x.dtype());
  KILN_CHECK(dy.shape() == x.shape(), "rms_norm_backward: dy {} differs from x {}", shape_str(dy.shape()), shape_str(x.shape()));
  const DType dt = x.dtype(), cd = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t D = x.shape().back(), N = x.numel() / D;
  if constexpr (HasRmsNorm<B>) {
    const Tensor<B> xc = x.to(cd).contiguous().reshape({N, D}), dyc = dy.to(cd).contiguous().reshape({N, D});
    const Tensor<B> rc = rstd.to(cd).contiguous().reshape({N});
    const Tensor<B> wc = w.defined() ? w.to(cd).contiguous() : Tensor<B>();
    Tensor<B> dx = Tensor<B>::empty({N, D}, cd), dw = w.defined() ? Tensor<B>::empty({D}, cd) : Tensor<B>();
    const View<typename B::Storage> wv = wc.defined() ? wc.cview() : xc.cview();
    MutView<typename B::Storage> dwv = dw.defined() ? dw.mview() : dx.mview();
    if (N) KILN_PROFILED("rms_norm_backward", dx, dw, xc, wc, rc, dyc)
    B::rms_norm_backward(dx.mview(), dw.defined() ? &dwv : nullptr, xc.cview(), wc.defined() ? &wv : nullptr, rc.cview(), dyc.cview());
    else if (dw.defined()) dw.zero_();
    return {dx.reshape(x.shape()).to(dt), dw.defined() ? dw.to(w.dtype()) : dw};
  } else {
    const Tensor<B> xf = x.to(cd), dyf = dy.to(cd), r = rstd.to(cd).unsqueeze(-1);
    const Tensor<B> g = w.defined() ? dyf.mul(w.to(cd)) : dyf;
    const Tensor<B> dx = g.mul(r).sub(xf.mul(r.mul(r).mul(r)).mul(g.mul(xf).mean({-1}, true)));
    Tensor<B> dw;
    if (w.defined()) dw = dyf.mul(xf).mul(r).reshape({N, D}).sum({0}).to(w.dtype());
    return {dx.to(dt), dw};
  }
}

}  // namespace kiln::fused
#pragma GCC visibility pop
