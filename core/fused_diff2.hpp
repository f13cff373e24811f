#pragma once
// The combine of Differential Transformer V2 (docs/specs.md §1b; see core/fused.hpp for the override
// pattern). The attention op runs once on the 2h query heads; this op pairs them:
//   a [B, 2h, T, hd]  the attention output of the 2h query heads (head 2j: branch 1, head 2j+1: branch 2)
//   l [B, T, h]       the λ logits W_λ x (one per token and output head)
//   y [B, T, h, hd]   y[b, t, j] = a[b, 2j, t] − σ(l[b, t, j]) · a[b, 2j+1, t]
//   backward: da[b, 2j, t] = dy[b, t, j],  da[b, 2j+1, t] = −σ · dy[b, t, j],
//             dl[b, t, j] = −σ (1 − σ) Σ_c dy[b, t, j, c] · a[b, 2j+1, t, c]
// y comes out [B, T, h, hd] contiguous, so the head merge before o_proj is a view. The composite spells
// this with two strided slices, a sigmoid, a multiply, a subtract and a transposing copy forward (and
// twice as many passes backward, plus a stack); the override does one pass each way.
// A backend overrides with
//   diff2_combine_forward(MutView y, View a, View l)
//   diff2_combine_backward(MutView da, MutView dl, View a, View l, View dy)
// receiving f32/f64 tensors of one dtype (half types are converted here): a [B, 2h, T, hd] with a
// unit-stride last axis and any strides elsewhere (e.g. the transposed [B, 2h, T, hd] view of a
// [B, T, 2h, hd] block that the Cpu attention kernel writes), l, dy, y, dl contiguous, and da of a's
// shape laid out in a's memory order (Tensor::empty_like_layout), unit-stride rows; every element of
// y, da and dl is written. Cpu and Cuda override it (backends/cpu/diff2.cpp, backends/cuda/diff2.cu);
// without an override (Reference) the composite below runs.
#include <utility>

#include "kiln/core/profile.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasDiff2Combine = requires(MutView<typename B::Storage> out, View<typename B::Storage> in) {
  B::diff2_combine_forward(out, in, in);
  B::diff2_combine_backward(out, out, in, in, in);
};

namespace detail {
// Checks a [B, 2h, T, hd] and l [B, T, h] (and dy [B, T, h, hd] when given); returns h.
template <Backend B> int64_t diff2_check(const char* op, const Tensor<B>& a, const Tensor<B>& l, const Tensor<B>* dy = nullptr) {
  KILN_CHECK(a.defined() && l.defined() && (!dy || dy->defined()), "{}: undefined tensor", op);
  KILN_CHECK(a.dim() == 4 && a.size(1) % 2 == 0, "{}: attention output {} must be [B, 2h, T, hd]", op, shape_str(a.shape()));
  const int64_t Bn = a.size(0), h = a.size(1) / 2, T = a.size(2), hd = a.size(3);
  KILN_CHECK(l.shape() == Shape({Bn, T, h}), "{}: lambda logits {} must be [B, T, h] = [{}, {}, {}] for attention output {}", op,
             shape_str(l.shape()), Bn, T, h, shape_str(a.shape()));
  KILN_CHECK(is_floating(a.dtype()) && a.dtype() == l.dtype(), "{}: needs one float dtype, got attention output {} and lambda logits {}",
             op, a.dtype(), l.dtype());
  if (dy)
    KILN_CHECK(dy->shape() == Shape({Bn, T, h, hd}) && dy->dtype() == a.dtype(), "{}: dy {} {} must be [B, T, h, hd] = {} {}", op,
               shape_str(dy->shape()), dy->dtype(), shape_str(Shape({Bn, T, h, hd})), a.dtype());
  return h;
}
inline DType diff2_compute(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }
}  // namespace detail

// y [B, T, h, hd] = a[:, 0::2] − σ(l) · a[:, 1::2] (heads moved behind the tokens), in a's dtype.
template <Backend B> Tensor<B> diff2_combine_forward(const Tensor<B>& a, const Tensor<B>& l) {
  const int64_t h = detail::diff2_check("diff2_combine", a, l);
  const int64_t Bn = a.size(0), T = a.size(2), hd = a.size(3);
  const DType dt = a.dtype(), cd = detail::diff2_compute(dt);
  if constexpr (HasDiff2Combine<B>) {
    Tensor<B> ac = a.to(cd);
    if (ac.size(3) > 1 && ac.strides()[3] != 1) ac = ac.contiguous();
    const Tensor<B> lc = l.to(cd).contiguous();
    Tensor<B> y = Tensor<B>::empty({Bn, T, h, hd}, cd);
    if (y.numel()) KILN_PROFILED("diff2_combine", y, ac, lc) B::diff2_combine_forward(y.mview(), ac.cview(), lc.cview());
    return y.to(dt);
  } else {
    const Tensor<B> af = a.to(cd), s = l.to(cd).sigmoid().transpose(1, 2).unsqueeze(-1);  // [B, h, T, 1]
    const Tensor<B> y = af.slice(1, 0, 2 * h, 2).sub(s.mul(af.slice(1, 1, 2 * h, 2)));    // [B, h, T, hd]
    return y.transpose(1, 2).contiguous().to(dt);
  }
}

// {da [B, 2h, T, hd] (laid out like a where the backend writes any layout), dl [B, T, h]} in a's dtype.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> diff2_combine_backward(const Tensor<B>& a, const Tensor<B>& l, const Tensor<B>& dy) {
  const int64_t h = detail::diff2_check("diff2_combine_backward", a, l, &dy);
  const DType dt = a.dtype(), cd = detail::diff2_compute(dt);
  if constexpr (HasDiff2Combine<B>) {
    Tensor<B> ac = a.to(cd);
    if (ac.size(3) > 1 && ac.strides()[3] != 1) ac = ac.contiguous();
    const Tensor<B> lc = l.to(cd).contiguous(), gc = dy.to(cd).contiguous();
    Tensor<B> da = ac.empty_like_layout(ac.shape(), cd), dl = Tensor<B>::empty(l.shape(), cd);
    if (da.numel() || dl.numel()) KILN_PROFILED("diff2_combine_backward", da, dl, ac, lc, gc)
    B::diff2_combine_backward(da.mview(), dl.mview(), ac.cview(), lc.cview(), gc.cview());
    return {da.to(dt), dl.to(dt)};
  } else {
    const Tensor<B> af = a.to(cd), g = dy.to(cd).transpose(1, 2);  // [B, h, T, hd]
    const Tensor<B> sig = l.to(cd).sigmoid(), s = sig.transpose(1, 2).unsqueeze(-1);
    const Tensor<B> da = Tensor<B>::stack({g, g.mul(s).neg()}, 2).reshape(a.shape());  // heads (2j, 2j+1) interleaved
    const Tensor<B> dot = g.mul(af.slice(1, 1, 2 * h, 2)).sum({-1}).transpose(1, 2);   // [B, T, h]
    const Tensor<B> dl = dot.mul(sig.mul(sig.neg().add(Scalar(1.0)))).neg();
    return {da.to(dt), dl.to(dt)};
  }
}

}  // namespace kiln::fused
#pragma GCC visibility pop
