#pragma once
// Fused differential attention (Differential Transformer V1, docs/specs.md §1): the two softmax maps of
// a differential head over one V, combined in the op:
//   q [B, H, 2, T, d], k [B, Hkv, 2, S, d] (axis 2: branch 1, branch 2), v [B, Hkv, S, dv], λ a
//   one-element tensor of q's dtype;
//   O2 = FA(q[:, :, 1], k[:, :, 1], v),  O = FA(q[:, :, 0], k[:, :, 0], v) − λ·O2   [B, H, T, dv]
// where FA is core/fused.hpp's attention (causal, pos0, key padding, mask, GQA and dv ≠ d exactly as
// there; the masks apply to both maps alike). Returns {O, O2, LSE1, LSE2} (LSE [B, H, T] per branch).
// Backward, from dO (FlashAttention-2 formulas per branch, with dO1 = dO and dO2 = −λ dO):
//   dV = (P1 − λ P2)ᵀ dO, dP = dO Vᵀ (one product serves both branches),
//   dS1 = scale · P1 ⊙ (dP − rowsum(dO ⊙ O1)),  dS2 = −λ · scale · P2 ⊙ (dP − rowsum(dO ⊙ O2)),
//   dQb = dSb Kb, dKb = dSbᵀ Qb,  dλ = −Σ dO ⊙ O2,  with O1 = O + λ·O2.
// Returns {dq (q's shape), dk (k's shape), dv, dλ (λ's shape)}. A row with no visible key contributes
// nothing (as attention_backward), to dλ too.
//
// The composite default runs fused::attention_forward/backward once per branch on the branch views
// (so every backend with a flash attention runs it) and combines with tensor ops. A backend overrides
// it with B::diff_attention_forward / B::diff_attention_backward:
//   diff_attention_forward(MutView o, MutView o2, MutView lse1, MutView lse2, View q1, View q2, View k1,
//                          View k2, View v, View lam, const View* key_padding, const View* mask,
//                          double scale, bool causal, int64_t pos0)
//   diff_attention_backward(MutView dq1, MutView dq2, MutView dk1, MutView dk2, MutView dv, MutView dlam,
//                           View q1, View q2, View k1, View k2, View v, View lam, View o, View o2,
//                           View lse1, View lse2, View dout, const View* key_padding, const View* mask,
//                           double scale, bool causal, int64_t pos0)
// It receives f32 or f64 only; the branch views q1 = q[:, :, 0] ... are 4-D with unit-stride rows (as
// attention_forward's operands); o, o2 are laid out in q's memory order, dq1/dq2 are the branch views
// of one dq in q's memory order, dk1/dk2 of one dk in k's, dv in v's (Tensor::empty_like_layout), so a
// [B, T, H, 2, d] projection's gradient comes back as one [B, T, H, 2, d] block: every element arrives
// uninitialised and must be written. lse1, lse2 are contiguous [B, H, T], lam and dlam one element.
//
// With the head-wise norm in its epilogue (DifferentialAttention's subln and (1 − λ_init) scale, docs/
// specs.md §1 step 5): diff_attention_norm_forward returns Y = RMSNorm(O)·c·w per row of O (over its
// dv channels), r = 1/√(mean(O²) + eps), Y = O·r·w_c with w_c = c·w (c·1 without a weight), and
// {Y, O, O2, LSE1, LSE2, R} (R [B, H, T] the rows' r). Y is laid out as a [B, T, H, dv] block (the
// layout the output projection reads, so the head merge after it is a view). Its backward, from dY:
//   g = dY ⊙ w_c,  dO = r·g − O·r³·mean(g ⊙ O),  dw_c = Σ_rows dY ⊙ O·r  (dw = c·dw_c),
// then diff_attention_backward's formulas with that dO. A backend overrides it with
//   diff_attention_norm_forward(MutView y, MutView rstd, MutView o, MutView o2, MutView lse1, MutView lse2,
//                               View q1, View q2, View k1, View k2, View v, View lam, View wc,
//                               const View* key_padding, const View* mask, double eps, double scale,
//                               bool causal, int64_t pos0)
//   diff_attention_norm_backward(MutView dq1, MutView dq2, MutView dk1, MutView dk2, MutView dv,
//                                MutView dlam, MutView dwc, View q1, View q2, View k1, View k2, View v,
//                                View lam, View wc, View o, View o2, View lse1, View lse2, View rstd,
//                                View dy, const View* key_padding, const View* mask, double scale,
//                                bool causal, int64_t pos0)
// with the operands of diff_attention_forward/backward plus wc (contiguous [dv], c·w or c), rstd
// (contiguous [B, H, T]), y (unit-stride rows, every element written), dy (unit-stride rows) and dwc
// (contiguous [dv], written). The composite runs diff_attention_forward/backward and
// fused::rms_norm_forward/backward (core/fused_norm.hpp) with the weight c·w.
#include <cmath>
#include <tuple>

#include "kiln/core/fused.hpp"
#include "kiln/core/fused_norm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasDiffAttention = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, const View<typename B::Storage>* kp,
                                    double scale, bool causal, int64_t pos0) {
  B::diff_attention_forward(out, out, out, out, in, in, in, in, in, in, kp, kp, scale, causal, pos0);
  B::diff_attention_backward(out, out, out, out, out, out, in, in, in, in, in, in, in, in, in, in, in, kp, kp, scale, causal, pos0);
};

template <class B>
concept HasDiffAttentionNorm = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, const View<typename B::Storage>* kp,
                                        double eps, double scale, bool causal, int64_t pos0) {
  B::diff_attention_norm_forward(out, out, out, out, out, out, in, in, in, in, in, in, in, kp, kp, eps, scale, causal, pos0);
  B::diff_attention_norm_backward(out, out, out, out, out, out, out, in, in, in, in, in, in, in, in, in, in, in, in, in, kp, kp, scale,
                                  causal, pos0);
};

namespace detail {

// The checks of the 5-D operands; returns the dims of one branch (as attention_check).
template <Backend B> AttnDims diff_attention_check(const char* op, const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v,
                                                   const Tensor<B>& lam, const Tensor<B>& key_padding, int64_t pos0,
                                                   const Tensor<B>& mask) {
  KILN_CHECK(q.defined() && k.defined() && v.defined() && lam.defined(), "{}: undefined q, k, v or lambda", op);
  KILN_CHECK(q.dim() == 5 && k.dim() == 5 && q.size(2) == 2 && k.size(2) == 2,
             "{}: q {} and k {} must be [B, H, 2, T, d] and [B, Hkv, 2, S, d] (axis 2: the two branches)", op, shape_str(q.shape()),
             shape_str(k.shape()));
  KILN_CHECK(lam.numel() == 1 && lam.dtype() == q.dtype(), "{}: lambda must be one element of q's dtype {}, got {} {}", op, q.dtype(),
             lam.dtype(), shape_str(lam.shape()));
  return attention_check(op, q.select(2, 0), k.select(2, 0), v, key_padding, pos0, mask);
}

}  // namespace detail

// Composite forward (the oracle of the fused kernels): {O, O2, LSE1, LSE2}.
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>> diff_attention_forward_composite(
    const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v, const Tensor<B>& lam, double scale, bool causal, int64_t pos0,
    const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}) {
  detail::diff_attention_check("diff_attention_forward", q, k, v, lam, key_padding, pos0, mask);
  auto [o1, lse1] = attention_forward(q.select(2, 0), k.select(2, 0), v, scale, causal, pos0, key_padding, mask);
  auto [o2, lse2] = attention_forward(q.select(2, 1), k.select(2, 1), v, scale, causal, pos0, key_padding, mask);
  return {o1.sub(o2.mul(lam.reshape({}))), o2, lse1, lse2};
}

// Composite backward: {dq, dk, dv, dλ}.
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>> diff_attention_backward_composite(
    const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v, const Tensor<B>& lam, const Tensor<B>& o, const Tensor<B>& o2,
    const Tensor<B>& lse1, const Tensor<B>& lse2, const Tensor<B>& dout, double scale, bool causal, int64_t pos0,
    const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}) {
  detail::diff_attention_check("diff_attention_backward", q, k, v, lam, key_padding, pos0, mask);
  const Tensor<B> l = lam.reshape({});
  auto [dq1, dk1, dv1] =
      attention_backward(q.select(2, 0), k.select(2, 0), v, o.add(o2.mul(l)), lse1, dout, scale, causal, pos0, key_padding, mask);
  auto [dq2, dk2, dv2] =
      attention_backward(q.select(2, 1), k.select(2, 1), v, o2, lse2, dout.mul(l).neg(), scale, causal, pos0, key_padding, mask);
  const Tensor<B> live = lse2.ne(-INFINITY).unsqueeze(-1);  // rows with a visible key (the others add nothing)
  const Tensor<B> dlam = Tensor<B>::where(live, dout.mul(o2), Tensor<B>::zeros({}, q.dtype())).sum().neg().reshape(lam.shape());
  return {Tensor<B>::stack({dq1, dq2}, 2), Tensor<B>::stack({dk1, dk2}, 2), dv1.add(dv2), dlam};
}

namespace detail {

// The kernels' operands: the branch views with unit-stride rows, λ, the key padding and the mask view.
template <Backend B> struct DiffOperands {
  using V = View<typename B::Storage>;
  Tensor<B> q1, q2, k1, k2, v, lam, kp, mask;
  V kpv, maskv;
  DiffOperands(const AttnDims& a, const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v_, const Tensor<B>& l,
               const Tensor<B>& key_padding, const Tensor<B>& m)
      : q1(attn_rows(q.select(2, 0))),
        q2(attn_rows(q.select(2, 1))),
        k1(attn_rows(k.select(2, 0))),
        k2(attn_rows(k.select(2, 1))),
        v(attn_rows(v_)),
        lam(l.contiguous()),
        kp(key_padding.defined() ? key_padding.contiguous() : Tensor<B>()),
        mask(m.defined() ? mask_view(a, m, q.dtype()) : Tensor<B>()),
        kpv(kp.defined() ? kp.cview() : q1.cview()),
        maskv(mask.defined() ? mask.cview() : q1.cview()) {}
  const V* kp_ptr() const { return kp.defined() ? &kpv : nullptr; }
  const V* mask_ptr() const { return mask.defined() ? &maskv : nullptr; }
};

// The gradients the backward kernels write: dq, dk in q's, k's memory order when their rows are
// unit-stride (the branch views then are too), dv in v's, dλ of λ's shape.
template <Backend B> struct DiffGrads {
  Tensor<B> dq, dk, dv, dlam;
  DiffGrads(const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& vc, const Tensor<B>& v, const Tensor<B>& lam) {
    const DType dt = q.dtype();
    auto like = [dt](const Tensor<B>& x) {
      return x.size(-1) <= 1 || x.strides().back() == 1 ? x.empty_like_layout(x.shape(), dt) : Tensor<B>::empty(x.shape(), dt);
    };
    dq = like(q), dk = like(k), dv = vc.empty_like_layout(v.shape(), dt), dlam = Tensor<B>::empty(lam.shape(), dt);
  }
};

// The products the shared backward runs per score: S1, S2, dV, dP, dQ1, dK1, dQ2, dK2 (4d + 2dv MACs).
inline double diff_backward_flops(const AttnDims& a, bool causal) {
  return 2.0 * static_cast<double>(a.B * a.H * a.T * a.S) * static_cast<double>(4 * a.d + 2 * a.dv) * (causal ? 0.5 : 1.0);
}

// The checks of the saved O, O2, LSE1, LSE2 and of dO against q, v.
template <Backend B> void diff_saved_check(const char* op, const AttnDims& a, const Tensor<B>& q, const Tensor<B>& v, const Tensor<B>& o,
                                           const Tensor<B>& o2, const Tensor<B>& lse1, const Tensor<B>& lse2, const Tensor<B>& dout) {
  const Shape os{a.B, a.H, a.T, a.dv}, ls{a.B, a.H, a.T};
  KILN_CHECK(o.defined() && o2.defined() && dout.defined() && lse1.defined() && lse2.defined() && o.shape() == os && o2.shape() == os &&
                 dout.shape() == os && lse1.shape() == ls && lse2.shape() == ls && o.dtype() == q.dtype() && o2.dtype() == q.dtype() &&
                 dout.dtype() == q.dtype() && lse1.dtype() == lse_dtype(q.dtype()) && lse2.dtype() == lse1.dtype(),
             "{}: o {} {}, o2 {}, dout {} {}, lse {} / {} {} do not fit q {} {}, v {}", op, shape_str(o.shape()), o.dtype(),
             shape_str(o2.shape()), shape_str(dout.shape()), dout.dtype(), shape_str(lse1.shape()), shape_str(lse2.shape()), lse1.dtype(),
             shape_str(q.shape()), q.dtype(), shape_str(v.shape()));
}

// The norm's weight with the output scale folded in: c·w, or c in every channel without a weight ([dv]).
template <Backend B> Tensor<B> diff_norm_weight(const char* op, const Tensor<B>& w, double c, int64_t dv, DType dt) {
  KILN_CHECK(std::isfinite(c), "{}: the output scale must be finite, got {}", op, c);
  if (!w.defined()) return Tensor<B>::full({dv}, c, dt);
  KILN_CHECK(w.shape() == Shape{dv} && w.dtype() == dt, "{}: the norm weight {} {} must be [{}] (the value width) of q's dtype {}", op,
             shape_str(w.shape()), w.dtype(), dv, dt);
  return w.mul(c);
}

}  // namespace detail

// Fused forward: {O [B, H, T, dv], O2 [B, H, T, dv], LSE1 [B, H, T], LSE2 [B, H, T]}.
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>> diff_attention_forward(const Tensor<B>& q, const Tensor<B>& k,
                                                                                                   const Tensor<B>& v, const Tensor<B>& lam,
                                                                                                   double scale, bool causal, int64_t pos0,
                                                                                                   const Tensor<B>& key_padding = {},
                                                                                                   const Tensor<B>& mask = {}) {
  const detail::AttnDims a = detail::diff_attention_check("diff_attention_forward", q, k, v, lam, key_padding, pos0, mask);
  if constexpr (HasDiffAttention<B>) {
    const DType dt = q.dtype();
    if ((dt == DType::f32 || dt == DType::f64) && !a.empty()) {
      const detail::DiffOperands<B> x(a, q, k, v, lam, key_padding, mask);
      const Shape os{a.B, a.H, a.T, a.dv};
      Tensor<B> o = x.q1.empty_like_layout(os, dt), o2 = x.q1.empty_like_layout(os, dt);
      Tensor<B> lse1 = Tensor<B>::empty({a.B, a.H, a.T}, dt), lse2 = Tensor<B>::empty({a.B, a.H, a.T}, dt);
      KILN_PROFILED_FLOPS("diff_attention_forward", 2 * detail::attention_flops(a, causal, false), o, o2, x.q1, x.q2, x.k1, x.k2, x.v)
      B::diff_attention_forward(o.mview(), o2.mview(), lse1.mview(), lse2.mview(), x.q1.cview(), x.q2.cview(), x.k1.cview(), x.k2.cview(),
                                x.v.cview(), x.lam.cview(), x.kp_ptr(), x.mask_ptr(), scale, causal, pos0);
      return {o, o2, lse1, lse2};
    }
  }
  return diff_attention_forward_composite(q, k, v, lam, scale, causal, pos0, key_padding, mask);
}

// Fused backward: {dq, dk, dv, dλ} from the saved q, k, v, λ, O, O2, LSE1, LSE2 and dO.
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>> diff_attention_backward(
    const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v, const Tensor<B>& lam, const Tensor<B>& o, const Tensor<B>& o2,
    const Tensor<B>& lse1, const Tensor<B>& lse2, const Tensor<B>& dout, double scale, bool causal, int64_t pos0,
    const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}) {
  const char* op = "diff_attention_backward";
  const detail::AttnDims a = detail::diff_attention_check(op, q, k, v, lam, key_padding, pos0, mask);
  detail::diff_saved_check(op, a, q, v, o, o2, lse1, lse2, dout);
  if constexpr (HasDiffAttention<B>) {
    const DType dt = q.dtype();
    if ((dt == DType::f32 || dt == DType::f64) && !a.empty()) {
      const detail::DiffOperands<B> x(a, q, k, v, lam, key_padding, mask);
      const Tensor<B> oc = detail::attn_rows(o), o2c = detail::attn_rows(o2), gc = detail::attn_rows(dout);
      const Tensor<B> l1 = lse1.contiguous(), l2 = lse2.contiguous();
      detail::DiffGrads<B> g(q, k, x.v, v, lam);
      Tensor<B> dq1 = g.dq.select(2, 0), dq2 = g.dq.select(2, 1), dk1 = g.dk.select(2, 0), dk2 = g.dk.select(2, 1);
      KILN_PROFILED_FLOPS("diff_attention_backward", detail::diff_backward_flops(a, causal), g.dq, g.dk, g.dv, x.q1, x.q2, x.k1, x.k2, x.v,
                          oc, o2c, gc)
      B::diff_attention_backward(dq1.mview(), dq2.mview(), dk1.mview(), dk2.mview(), g.dv.mview(), g.dlam.mview(), x.q1.cview(),
                                 x.q2.cview(), x.k1.cview(), x.k2.cview(), x.v.cview(), x.lam.cview(), oc.cview(), o2c.cview(), l1.cview(),
                                 l2.cview(), gc.cview(), x.kp_ptr(), x.mask_ptr(), scale, causal, pos0);
      return {g.dq, g.dk, g.dv, g.dlam};
    }
  }
  return diff_attention_backward_composite(q, k, v, lam, o, o2, lse1, lse2, dout, scale, causal, pos0, key_padding, mask);
}

// With the head-wise norm (see the top of this file): {Y [B, H, T, dv] (a [B, T, H, dv] block where the
// backend overrides it), O, O2, LSE1, LSE2, R [B, H, T]}. w: the norm's weight [dv] or undefined; c: the
// output scale (1 − λ_init).
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>> diff_attention_norm_forward(
    const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v, const Tensor<B>& lam, const Tensor<B>& w, double eps, double c,
    double scale, bool causal, int64_t pos0, const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}) {
  const char* op = "diff_attention_norm_forward";
  const detail::AttnDims a = detail::diff_attention_check(op, q, k, v, lam, key_padding, pos0, mask);
  KILN_CHECK(eps >= 0 && std::isfinite(eps), "{}: eps must be finite and >= 0, got {}", op, eps);
  const DType dt = q.dtype();
  const Tensor<B> wc = detail::diff_norm_weight(op, w, c, a.dv, dt);
  if constexpr (HasDiffAttentionNorm<B>) {
    if ((dt == DType::f32 || dt == DType::f64) && !a.empty()) {
      const detail::DiffOperands<B> x(a, q, k, v, lam, key_padding, mask);
      const Shape os{a.B, a.H, a.T, a.dv};
      Tensor<B> o = x.q1.empty_like_layout(os, dt), o2 = x.q1.empty_like_layout(os, dt);
      Tensor<B> y = Tensor<B>::empty({a.B, a.T, a.H, a.dv}, dt).transpose(1, 2);
      Tensor<B> lse1 = Tensor<B>::empty({a.B, a.H, a.T}, dt), lse2 = Tensor<B>::empty({a.B, a.H, a.T}, dt);
      Tensor<B> rstd = Tensor<B>::empty({a.B, a.H, a.T}, dt);
      const Tensor<B> wcc = wc.contiguous();
      KILN_PROFILED_FLOPS(op, 2 * detail::attention_flops(a, causal, false), y, o, o2, x.q1, x.q2, x.k1, x.k2, x.v)
      B::diff_attention_norm_forward(y.mview(), rstd.mview(), o.mview(), o2.mview(), lse1.mview(), lse2.mview(), x.q1.cview(), x.q2.cview(),
                                     x.k1.cview(), x.k2.cview(), x.v.cview(), x.lam.cview(), wcc.cview(), x.kp_ptr(), x.mask_ptr(), eps,
                                     scale, causal, pos0);
      return {y, o, o2, lse1, lse2, rstd};
    }
  }
  auto [o, o2, lse1, lse2] = diff_attention_forward(q, k, v, lam, scale, causal, pos0, key_padding, mask);
  auto [y, rstd] = rms_norm_forward(o, wc, eps);
  return {y, o, o2, lse1, lse2, rstd};
}

// Its backward: {dq, dk, dv, dλ, dw (undefined without a weight)} from the saved q, k, v, λ, w, O, O2,
// LSE1, LSE2, R and dY.
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>, Tensor<B>> diff_attention_norm_backward(
    const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v, const Tensor<B>& lam, const Tensor<B>& w, const Tensor<B>& o,
    const Tensor<B>& o2, const Tensor<B>& lse1, const Tensor<B>& lse2, const Tensor<B>& rstd, const Tensor<B>& dy, double c, double scale,
    bool causal, int64_t pos0, const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}) {
  const char* op = "diff_attention_norm_backward";
  const detail::AttnDims a = detail::diff_attention_check(op, q, k, v, lam, key_padding, pos0, mask);
  detail::diff_saved_check(op, a, q, v, o, o2, lse1, lse2, dy);
  KILN_CHECK(rstd.defined() && rstd.shape() == lse1.shape(), "{}: rstd {} must be [B, H, T] = {}", op,
             rstd.defined() ? shape_str(rstd.shape()) : std::string("undefined"), shape_str(lse1.shape()));
  const DType dt = q.dtype();
  const Tensor<B> wc = detail::diff_norm_weight(op, w, c, a.dv, dt);
  if constexpr (HasDiffAttentionNorm<B>) {
    if ((dt == DType::f32 || dt == DType::f64) && !a.empty() && rstd.dtype() == dt) {
      const detail::DiffOperands<B> x(a, q, k, v, lam, key_padding, mask);
      const Tensor<B> oc = detail::attn_rows(o), o2c = detail::attn_rows(o2), gc = detail::attn_rows(dy);
      const Tensor<B> l1 = lse1.contiguous(), l2 = lse2.contiguous(), rc = rstd.contiguous(), wcc = wc.contiguous();
      detail::DiffGrads<B> g(q, k, x.v, v, lam);
      Tensor<B> dwc = Tensor<B>::empty({a.dv}, dt);
      Tensor<B> dq1 = g.dq.select(2, 0), dq2 = g.dq.select(2, 1), dk1 = g.dk.select(2, 0), dk2 = g.dk.select(2, 1);
      KILN_PROFILED_FLOPS(op, detail::diff_backward_flops(a, causal), g.dq, g.dk, g.dv, x.q1, x.q2, x.k1, x.k2, x.v, oc, o2c, gc)
      B::diff_attention_norm_backward(dq1.mview(), dq2.mview(), dk1.mview(), dk2.mview(), g.dv.mview(), g.dlam.mview(), dwc.mview(),
                                      x.q1.cview(), x.q2.cview(), x.k1.cview(), x.k2.cview(), x.v.cview(), x.lam.cview(), wcc.cview(),
                                      oc.cview(), o2c.cview(), l1.cview(), l2.cview(), rc.cview(), gc.cview(), x.kp_ptr(), x.mask_ptr(),
                                      scale, causal, pos0);
      return {g.dq, g.dk, g.dv, g.dlam, w.defined() ? dwc.mul(c) : Tensor<B>()};
    }
  }
  auto [dout, dwc] = rms_norm_backward(o, wc, rstd, dy);
  auto [dq, dk, dv, dlam] = diff_attention_backward(q, k, v, lam, o, o2, lse1, lse2, dout, scale, causal, pos0, key_padding, mask);
  return {dq, dk, dv, dlam, w.defined() ? dwc.mul(c) : Tensor<B>()};
}

}  // namespace kiln::fused
#pragma GCC visibility pop
