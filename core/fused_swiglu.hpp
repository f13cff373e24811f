#pragma once
// Fused SwiGLU gating (see core/fused.hpp for the override pattern), the elementwise middle of the
// GPT's MLP down_proj(silu(gate) ⊙ up):
//   y = silu(a) · b = a · s · b,  s = sigmoid(a)
//   backward:  da = dy · b · s · (1 + a · (1 − s)),  db = dy · a · s
// The composite spells this with 2 ops forward and 9 backward, each a pass over [rows, hidden]; the
// override does one pass each way and keeps only a and b for the backward.
// A backend overrides with
//   swiglu_forward(MutView y, View a, View b)
//   swiglu_backward(MutView da, MutView db, View a, View b, View dy)
// receiving contiguous f32/f64 tensors of one shape (half types are converted here). The outputs may
// be the very memory of an input (same offset and layout: every element is read before it is written);
// swiglu_backward_reusing below writes da and db over a, b or dy. Without an override (Reference,
// Cuda) the composite below runs.
#include <utility>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasSwiGLU = requires(MutView<typename B::Storage> out, View<typename B::Storage> in) {
  B::swiglu_forward(out, in, in);
  B::swiglu_backward(out, out, in, in, in);
};

namespace detail {
inline void swiglu_check(const char* op, const Shape& a, const Shape& b, DType ad, DType bd) {
  KILN_CHECK(a == b, "{}: gate {} and up {} must have one shape", op, shape_str(a), shape_str(b));
  KILN_CHECK(is_floating(ad) && ad == bd, "{}: needs one float dtype, got gate {} and up {}", op, ad, bd);
}
inline DType swiglu_compute(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }
}  // namespace detail

template <Backend B> Tensor<B> swiglu_forward(const Tensor<B>& a, const Tensor<B>& b) {
  detail::swiglu_check("swiglu", a.shape(), b.shape(), a.dtype(), b.dtype());
  const DType dt = a.dtype(), cd = detail::swiglu_compute(dt);
  if constexpr (HasSwiGLU<B>) {
    const Tensor<B> ac = a.to(cd).contiguous(), bc = b.to(cd).contiguous();
    Tensor<B> y = Tensor<B>::empty(a.shape(), cd);
    if (y.numel()) KILN_PROFILED("swiglu_forward", y, ac, bc) B::swiglu_forward(y.mview(), ac.cview(), bc.cview());
    return y.to(dt);
  } else {
    return a.to(cd).silu().mul(b.to(cd)).to(dt);
  }
}

// (da, db) in the inputs' dtype.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> swiglu_backward(const Tensor<B>& a, const Tensor<B>& b, const Tensor<B>& dy) {
  detail::swiglu_check("swiglu_backward", a.shape(), b.shape(), a.dtype(), b.dtype());
  KILN_CHECK(dy.shape() == a.shape(), "swiglu_backward: dy {} differs from the inputs {}", shape_str(dy.shape()), shape_str(a.shape()));
  const DType dt = a.dtype(), cd = detail::swiglu_compute(dt);
  if constexpr (HasSwiGLU<B>) {
    const Tensor<B> ac = a.to(cd).contiguous(), bc = b.to(cd).contiguous(), gc = dy.to(cd).contiguous();
    Tensor<B> da = Tensor<B>::empty(a.shape(), cd), db = Tensor<B>::empty(a.shape(), cd);
    if (da.numel()) KILN_PROFILED("swiglu_backward", da, db, ac, bc, gc)
    B::swiglu_backward(da.mview(), db.mview(), ac.cview(), bc.cview(), gc.cview());
    return {da.to(dt), db.to(dt)};
  } else {
    const Tensor<B> af = a.to(cd), bf = b.to(cd), g = dy.to(cd);
    const Tensor<B> s = af.sigmoid();
    const Tensor<B> da = g.mul(bf).mul(s.mul(af.mul(s.neg().add(Scalar(1.0))).add(Scalar(1.0))));
    return {da.to(dt), g.mul(af.mul(s)).to(dt)};
  }
}

// swiglu_backward writing its results over memory the caller gives up, when the override runs: da over
// a if `a_free`, db over b if `b_free` (the caller vouches that nothing reads a or b afterwards: the
// autograd op asks autograd::saved_input_is_dead), and a result without its own over dy when dy is
// contiguous and its storage has no handle but `dy` itself (the engine hands a backward the gradient it
// owns and drops it afterwards). Each place needs the compute dtype and a contiguous layout; the rest
// are fresh. The MLP's backward streams a and b back from DRAM (issue 26): a result stored over lines
// the kernel has just read saves the fetch of a fresh buffer's lines. The values are swiglu_backward's,
// bit for bit, whatever the places.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> swiglu_backward_reusing(const Tensor<B>& a, const Tensor<B>& b, const Tensor<B>& dy,
                                                                             bool a_free = false, bool b_free = false) {
  detail::swiglu_check("swiglu_backward", a.shape(), b.shape(), a.dtype(), b.dtype());
  KILN_CHECK(dy.shape() == a.shape(), "swiglu_backward: dy {} differs from the inputs {}", shape_str(dy.shape()), shape_str(a.shape()));
  if constexpr (HasSwiGLU<B>) {
    const DType cd = detail::swiglu_compute(a.dtype());
    if (a.dtype() == cd && dy.dtype() == cd && a.numel()) {
      bool dy_free = dy.is_contiguous() && dy.sole_owner();
      const auto place = [&](const Tensor<B>& own, bool own_free) {
        if (own_free && own.is_contiguous()) return own;
        if (dy_free) {
          dy_free = false;
          return dy;
        }
        return Tensor<B>::empty(a.shape(), cd);
      };
      Tensor<B> da = place(a, a_free), db = place(b, b_free);
      const Tensor<B> ac = a.contiguous(), bc = b.contiguous(), gc = dy.contiguous();
      KILN_PROFILED("swiglu_backward", da, db, ac, bc, gc) B::swiglu_backward(da.mview(), db.mview(), ac.cview(), bc.cview(), gc.cview());
      return {da, db};
    }
  }
  return swiglu_backward(a, b, dy);
}

}  // namespace kiln::fused
#pragma GCC visibility pop
