#pragma once
// Fused softmax cross-entropy over the rows of [N, C] logits (see core/fused.hpp for the override
// pattern). With s = label smoothing, t_i the target of row i and lse_i = log Σ_c exp(x_ic):
//   loss_i  = lse_i − (1 − s)·x_{i,t_i} − s·mean_c(x_ic)       (0 where t_i == ignore_index)
//   dx_ic   = g_i · (softmax(x_i)_c − (1 − s)·[c == t_i] − s/C)   (g_i = dloss_i; 0 where ignored)
// Backward needs only the logits and lse [N]: the [N, C] log-probabilities are never kept, which for
// a language model's vocabulary is the largest activation of the step.
//
// A backend overrides with
//   cross_entropy_forward(MutView loss, MutView lse, View logits, View targets, int64_t ignore_index, double smoothing)
//   cross_entropy_backward(MutView dlogits, View logits, View lse, View targets, View g, int64_t ignore_index, double smoothing)
// receiving contiguous f32/f64 logits [N, C] (half types are converted here), i64 targets [N] whose
// values are already checked (in [0, C) or ignore_index), loss/lse/g [N] in the logits' dtype.
// A backend that also declares `static constexpr bool cross_entropy_half = true` receives bf16/f16
// logits as they are (not converted here) with loss/lse/g in f32, and writes dlogits in the logits'
// dtype. It must compute as the conversion would: in f32 on the widened values, each dlogit rounded
// once (tests/nn checks it bit for bit). No f32 copy of the [N, C] logits is made then, in either
// pass: under autocast, whose f32 policy would keep one alive from the forward to the backward, the
// largest activation of a language model's step is kept at half the size (nn/loss.cpp).
#include <utility>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasCrossEntropy = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, int64_t ignore, double s) {
  B::cross_entropy_forward(out, out, in, in, ignore, s);
  B::cross_entropy_backward(out, in, in, in, in, ignore, s);
};

template <class B>
concept CrossEntropyHalf = requires {
  requires B::cross_entropy_half;
};

namespace detail {
inline void ce_check(const char* op, const Shape& x, const Shape& t, DType xd, DType td) {
  KILN_CHECK(x.size() == 2 && x[1] > 0, "{}: logits must be [N, C] with C > 0, got {}", op, shape_str(x));
  KILN_CHECK(is_floating(xd), "{}: logits need a float dtype, got {}", op, xd);
  KILN_CHECK(td == DType::i64 && t == Shape{x[0]}, "{}: targets must be i64 [{}], got {} {}", op, x[0], td, shape_str(t));
}
inline DType ce_compute(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }
// The dtype the backend's kernels receive the logits in: the compute dtype, or a half dtype as it is.
template <class B> DType ce_input(DType d) { return CrossEntropyHalf<B> && is_half(d) ? d : ce_compute(d); }
}  // namespace detail

// (loss [N], lse [N]) in f64 for f64 logits, f32 otherwise.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> cross_entropy_forward(const Tensor<B>& logits, const Tensor<B>& targets,
                                                                           int64_t ignore_index, double smoothing) {
  detail::ce_check("cross_entropy", logits.shape(), targets.shape(), logits.dtype(), targets.dtype());
  const DType cd = detail::ce_compute(logits.dtype());
  const int64_t N = logits.size(0);
  if constexpr (HasCrossEntropy<B>) {
    const Tensor<B> x = logits.to(detail::ce_input<B>(logits.dtype())).contiguous(), t = targets.contiguous();
    Tensor<B> loss = Tensor<B>::empty({N}, cd), lse = Tensor<B>::empty({N}, cd);
    if (N) KILN_PROFILED("cross_entropy_forward", loss, lse, x, t)
    B::cross_entropy_forward(loss.mview(), lse.mview(), x.cview(), t.cview(), ignore_index, smoothing);
    return {loss, lse};
  } else {
    const Tensor<B> x = logits.to(cd);
    const Tensor<B> keep = targets.ne(ignore_index);
    const Tensor<B> safe = Tensor<B>::where(keep, targets, Tensor<B>::zeros({}, DType::i64));
    const Tensor<B> m = x.max({1}, true);
    const Tensor<B> lse = x.sub(m).exp().sum({1}, true).log().add(m);               // [N, 1]
    Tensor<B> loss = lse.sub(x.gather(1, safe.unsqueeze(1)).mul(1.0 - smoothing));  // [N, 1]
    if (smoothing > 0) loss = loss.sub(x.mean({1}, true).mul(smoothing));
    loss = Tensor<B>::where(keep.unsqueeze(1), loss, Tensor<B>::zeros({}, cd));
    return {loss.squeeze(1), lse.squeeze(1)};
  }
}

// dlogits [N, C] in the logits' dtype; g [N] is the gradient of each row's loss.
template <Backend B> Tensor<B> cross_entropy_backward(const Tensor<B>& logits, const Tensor<B>& lse, const Tensor<B>& targets,
                                                      const Tensor<B>& g, int64_t ignore_index, double smoothing) {
  detail::ce_check("cross_entropy_backward", logits.shape(), targets.shape(), logits.dtype(), targets.dtype());
  const int64_t N = logits.size(0), C = logits.size(1);
  KILN_CHECK(lse.shape() == Shape{N} && g.shape() == Shape{N}, "cross_entropy_backward: lse {} and g {} must be [{}]",
             shape_str(lse.shape()), shape_str(g.shape()), N);
  const DType cd = detail::ce_compute(logits.dtype());
  if constexpr (HasCrossEntropy<B>) {
    const Tensor<B> x = logits.to(detail::ce_input<B>(logits.dtype())).contiguous(), t = targets.contiguous();
    const Tensor<B> l = lse.to(cd).contiguous(), gc = g.to(cd).contiguous();
    Tensor<B> dx = Tensor<B>::empty({N, C}, x.dtype());
    if (N) KILN_PROFILED("cross_entropy_backward", dx, x, l, t)
    B::cross_entropy_backward(dx.mview(), x.cview(), l.cview(), t.cview(), gc.cview(), ignore_index, smoothing);
    return dx.to(logits.dtype());
  } else {
    const Tensor<B> x = logits.to(cd);
    const Tensor<B> keep = targets.ne(ignore_index);
    const Tensor<B> gk = Tensor<B>::where(keep, g.to(cd), Tensor<B>::zeros({}, cd)).unsqueeze(1);  // [N, 1]
    const Tensor<B> onehot = Tensor<B>::arange(C).unsqueeze(0).eq(targets.unsqueeze(1)).to(cd);    // [N, C]
    Tensor<B> d = x.sub(lse.to(cd).unsqueeze(1)).exp().sub(onehot.mul(1.0 - smoothing));
    if (smoothing > 0) d = d.sub(smoothing / static_cast<double>(C));
    return d.mul(gk).to(logits.dtype());
  }
}

}  // namespace kiln::fused
#pragma GCC visibility pop
