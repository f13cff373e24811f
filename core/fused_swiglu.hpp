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
// swiglu_backward_reusing below writes db over dy. Without an override (Reference, Cuda) the composite
// below runs.
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

// swiglu_backward writing db over dy's memory when the override runs, dy is contiguous in the compute
// dtype and its storage has no other handle than `dy` itself (the autograd op: the engine hands a
// backward the gradient it owns and drops it afterwards): one fresh [rows, hidden] buffer instead of
// two, and db's stores land on lines of dy the kernel has just read rather than on lines the cache must
// first fetch (issue 26: the MLP's backward streams a and b from DRAM, so the fetch showed).
// Otherwise (a shared, strided or converted dy, no override) exactly swiglu_backward; the values are the
// same bits either way.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> swiglu_backward_reusing(const Tensor<B>& a, const Tensor<B>& b, const Tensor<B>& dy) {
  if constexpr (HasSwiGLU<B>) {
    const DType cd = detail::swiglu_compute(a.dtype());
    if (a.dtype() == cd && b.dtype() == cd && dy.dtype() == cd && dy.shape() == a.shape() && dy.numel() && dy.is_contiguous() &&
        dy.storage().use_count() == 1) {
      detail::swiglu_check("swiglu_backward", a.shape(), b.shape(), a.dtype(), b.dtype());
      const Tensor<B> ac = a.contiguous(), bc = b.contiguous();
      Tensor<B> da = Tensor<B>::empty(a.shape(), cd), db = dy;
      KILN_PROFILED("swiglu_backward", da, db, ac, bc, dy) B::swiglu_backward(da.mview(), db.mview(), ac.cview(), bc.cview(), dy.cview());
      return {da, db};
    }
  }
  return swiglu_backward(a, b, dy);
}

}  // namespace kiln::fused
#pragma GCC visibility pop
