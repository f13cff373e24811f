#pragma once
// Fused depth attention (Attention Residuals, docs/specs.md §2) over n sources v_0..v_{n-1}, each [N, D] rows:
//   r_i = 1/√(mean(v_i²) + eps),  s_i = q·v_i  with q = w ⊙ g (g = key-norm weight, or ones)
//   logit_i = r_i s_i  (= w · RMSNorm(v_i): keys normalised, values raw, no 1/√D)
//   α = softmax_i(logit),  h = Σ_i α_i v_i
// Backward, given dh:
//   a_i = dh·v_i,  dlogit_i = α_i (a_i − Σ_j α_j a_j),  c_i = dlogit_i r_i
//   dv_i = α_i dh + c_i (q − s_i r_i² v_i / D),   dq = Σ_rows Σ_i c_i v_i
// What the backward keeps: α and r, [n, N] each, and the sources themselves (the op's inputs, alive
// anyway); never a stacked or normalised copy of the sources.
//
// A backend overrides with
//   depth_attention_forward(MutView h, MutView alpha, MutView rstd, const std::vector<View>& v, View q, double eps)
//   depth_attention_backward(const std::vector<MutView>& dv, MutView dq, const std::vector<View>& v, View q,
//                            View alpha, View rstd, View dh)
// receiving contiguous f32/f64 operands: v_i, h, dh, dv_i [N, D]; alpha, rstd [n, N]; q, dq [D].
// dq is the gradient of q = w ⊙ g (the caller turns it into dw = dq ⊙ g and dg = dq ⊙ w).
//
// Two-phase inference (docs/specs.md §2; under NoGrad, no backward) has two more:
//   Phase 1, S queries Q [S, D] against the completed blocks v_i: per query j and row
//     m_j = max_i logit_ij,  l_j = Σ_i exp(logit_ij − m_j),  acc_j = Σ_i exp(logit_ij − m_j) v_i
//   Phase 2, sublayer j merges the running partial p (if any) by one online-softmax step:
//     lp = r_p (q·p),  M = max(m, lp),  h = (acc e^{m−M} + p e^{lp−M}) / (l e^{m−M} + e^{lp−M})
//     (no partial: h = acc / l)
// overridden by
//   depth_attention_phase1(MutView m, MutView l, MutView acc, const std::vector<View>& v, View Q, double eps)
//     m, l [S, N]; acc [S, N, D]; Q [S, D]
//   depth_attention_merge(MutView h, View m, View l, View acc, const View* p, View q, double eps)
//     h, acc, p [N, D]; m, l [N]; q [D]
#include <tuple>
#include <vector>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasDepthAttention = requires(MutView<typename B::Storage> out, View<typename B::Storage> in,
                                     const std::vector<MutView<typename B::Storage>>& outs,
                                     const std::vector<View<typename B::Storage>>& ins, double eps) {
  B::depth_attention_forward(out, out, out, ins, in, eps);
  B::depth_attention_backward(outs, out, ins, in, in, in, in);
};

template <class B>
concept HasDepthTwoPhase = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, const View<typename B::Storage>* p,
                                    const std::vector<View<typename B::Storage>>& ins, double eps) {
  B::depth_attention_phase1(out, out, out, ins, in, eps);
  B::depth_attention_merge(out, in, in, in, p, in, eps);
};

namespace detail {
// Checks that the sources share one float dtype and one shape with a non-empty last axis; returns the
// compute dtype (f64 for f64 sources, f32 otherwise).
template <Backend B> DType depth_sources(const char* op, const std::vector<Tensor<B>>& v) {
  KILN_CHECK(!v.empty(), "{}: no sources", op);
  const Shape& s0 = v[0].shape();
  const DType d0 = v[0].dtype();
  KILN_CHECK(!s0.empty() && s0.back() > 0, "{}: sources need rank >= 1 and a non-empty last axis, got {}", op, shape_str(s0));
  KILN_CHECK(is_floating(d0), "{}: needs float sources, got {}", op, d0);
  for (size_t i = 1; i < v.size(); ++i)
    KILN_CHECK(v[i].shape() == s0 && v[i].dtype() == d0, "{}: source {} is {} {}, source 0 {} {}", op, i, shape_str(v[i].shape()),
               v[i].dtype(), shape_str(s0), d0);
  return d0 == DType::f64 ? DType::f64 : DType::f32;
}
}  // namespace detail

// (h like the sources, alpha [n, rows...], rstd [n, rows...]), alpha/rstd f32 for half sources.
template <Backend B>
std::tuple<Tensor<B>, Tensor<B>, Tensor<B>> depth_attention_forward(const std::vector<Tensor<B>>& v, const Tensor<B>& q, double eps) {
  const DType cd = detail::depth_sources("depth_attention", v);
  const Shape& shape = v[0].shape();
  const int64_t D = shape.back(), N = v[0].numel() / D, n = static_cast<int64_t>(v.size());
  KILN_CHECK(q.shape() == Shape{D}, "depth_attention: query {} does not match the sources' width {}", shape_str(q.shape()), D);
  Shape stat{n};
  stat.insert(stat.end(), shape.begin(), shape.end() - 1);
  const Tensor<B> qc = q.to(cd).contiguous();
  if constexpr (HasDepthAttention<B>) {
    std::vector<Tensor<B>> vc;
    std::vector<View<typename B::Storage>> vv;
    vc.reserve(v.size());
    for (const Tensor<B>& t : v) vc.push_back(t.to(cd).contiguous().reshape({N, D}));
    for (const Tensor<B>& t : vc) vv.push_back(t.cview());
    Tensor<B> h = Tensor<B>::empty({N, D}, cd), alpha = Tensor<B>::empty({n, N}, cd), r = Tensor<B>::empty({n, N}, cd);
    if (N) KILN_PROFILED("depth_attention_forward", h, alpha, r, vv, qc)
    B::depth_attention_forward(h.mview(), alpha.mview(), r.mview(), vv, qc.cview(), eps);
    return {h.reshape(shape).to(v[0].dtype()), alpha.reshape(stat), r.reshape(stat)};
  } else {
    std::vector<Tensor<B>> vc;
    for (const Tensor<B>& t : v) vc.push_back(t.to(cd).reshape({N, D}));
    const Tensor<B> V = Tensor<B>::stack(vc, 0);                 // [n, N, D]
    const Tensor<B> r = V.square().mean({-1}).add(eps).rsqrt();  // [n, N]
    const Tensor<B> alpha = V.matmul(qc).mul(r).softmax(0);      // [n, N]
    const Tensor<B> h = alpha.unsqueeze(-1).mul(V).sum({0});     // [N, D]
    return {h.reshape(shape).to(v[0].dtype()), alpha.reshape(stat), r.reshape(stat)};
  }
}

// (dv_0..dv_{n-1} like the sources, dq like q).
template <Backend B> std::pair<std::vector<Tensor<B>>, Tensor<B>> depth_attention_backward(const std::vector<Tensor<B>>& v,
                                                                                           const Tensor<B>& q, const Tensor<B>& alpha,
                                                                                           const Tensor<B>& rstd, const Tensor<B>& dh) {
  const DType cd = detail::depth_sources("depth_attention_backward", v);
  KILN_CHECK(dh.shape() == v[0].shape(), "depth_attention_backward: dh {} differs from the sources' {}", shape_str(dh.shape()),
             shape_str(v[0].shape()));
  const int64_t D = v[0].shape().back(), N = v[0].numel() / D, n = static_cast<int64_t>(v.size());
  KILN_CHECK(alpha.numel() == n * N && rstd.numel() == n * N, "depth_attention_backward: alpha {} / rstd {} do not hold {} x {} values",
             shape_str(alpha.shape()), shape_str(rstd.shape()), n, N);
  const Tensor<B> qc = q.to(cd).contiguous(), dhc = dh.to(cd).contiguous().reshape({N, D});
  const Tensor<B> ac = alpha.to(cd).contiguous().reshape({n, N}), rc = rstd.to(cd).contiguous().reshape({n, N});
  std::vector<Tensor<B>> dv;
  Tensor<B> dq;
  if constexpr (HasDepthAttention<B>) {
    std::vector<Tensor<B>> vc;
    std::vector<View<typename B::Storage>> vv;
    std::vector<MutView<typename B::Storage>> dvv;
    for (const Tensor<B>& t : v) vc.push_back(t.to(cd).contiguous().reshape({N, D}));
    for (const Tensor<B>& t : vc) vv.push_back(t.cview());
    for (int64_t i = 0; i < n; ++i) dv.push_back(Tensor<B>::empty({N, D}, cd));
    for (Tensor<B>& t : dv) dvv.push_back(t.mview());
    dq = Tensor<B>::empty({D}, cd);
    if (N) KILN_PROFILED("depth_attention_backward", dvv, dq, vv, qc)
    B::depth_attention_backward(dvv, dq.mview(), vv, qc.cview(), ac.cview(), rc.cview(), dhc.cview());
    else dq.zero_();
  } else {
    std::vector<Tensor<B>> vc;
    for (const Tensor<B>& t : v) vc.push_back(t.to(cd).reshape({N, D}));
    const Tensor<B> V = Tensor<B>::stack(vc, 0);  // [n, N, D]
    const Tensor<B> a = V.mul(dhc).sum({-1});     // [n, N]
    const Tensor<B> s = V.matmul(qc);             // [n, N]
    const Tensor<B> dlogit = ac.mul(a.sub(ac.mul(a).sum({0}, true)));
    const Tensor<B> c = dlogit.mul(rc);
    const Tensor<B> e = c.mul(s).mul(rc).mul(rc).div(static_cast<double>(D));
    const Tensor<B> dV = ac.unsqueeze(-1).mul(dhc).add(c.unsqueeze(-1).mul(qc)).sub(e.unsqueeze(-1).mul(V));
    dq = c.unsqueeze(-1).mul(V).sum({0, 1});
    for (int64_t i = 0; i < n; ++i) dv.push_back(dV.select(0, i));
  }
  for (int64_t i = 0; i < n; ++i) dv[static_cast<size_t>(i)] = dv[static_cast<size_t>(i)].reshape(v[0].shape()).to(v[0].dtype());
  return {dv, dq.to(q.dtype())};
}

// Phase 1: (m [S, rows...], l [S, rows...], acc [S, rows..., D]) in the compute dtype (f32 for half
// sources, f64 for f64).
template <Backend B>
std::tuple<Tensor<B>, Tensor<B>, Tensor<B>> depth_attention_phase1(const std::vector<Tensor<B>>& v, const Tensor<B>& Q, double eps) {
  const DType cd = detail::depth_sources("depth_attention_phase1", v);
  const Shape& shape = v[0].shape();
  const int64_t D = shape.back(), N = v[0].numel() / D;
  KILN_CHECK(Q.dim() == 2 && Q.shape()[1] == D, "depth_attention_phase1: queries {} do not match the sources' width {}",
             shape_str(Q.shape()), D);
  const int64_t S = Q.shape()[0];
  Shape stat{S};
  stat.insert(stat.end(), shape.begin(), shape.end() - 1);
  Shape full = stat;
  full.push_back(D);
  const Tensor<B> Qc = Q.to(cd).contiguous();
  if constexpr (HasDepthTwoPhase<B>) {
    std::vector<Tensor<B>> vc;
    std::vector<View<typename B::Storage>> vv;
    for (const Tensor<B>& t : v) vc.push_back(t.to(cd).contiguous().reshape({N, D}));
    for (const Tensor<B>& t : vc) vv.push_back(t.cview());
    Tensor<B> m = Tensor<B>::empty({S, N}, cd), l = Tensor<B>::empty({S, N}, cd), acc = Tensor<B>::empty({S, N, D}, cd);
    if (N && S) KILN_PROFILED("depth_attention_phase1", m, l, acc, vv)
    B::depth_attention_phase1(m.mview(), l.mview(), acc.mview(), vv, Qc.cview(), eps);
    return {m.reshape(stat), l.reshape(stat), acc.reshape(full)};
  } else {
    std::vector<Tensor<B>> vc;
    for (const Tensor<B>& t : v) vc.push_back(t.to(cd).reshape({N, D}));
    const Tensor<B> V = Tensor<B>::stack(vc, 1);                              // [N, n, D]
    const Tensor<B> U = V.mul(V.square().mean({-1}, true).add(eps).rsqrt());  // v / rms(v)
    const Tensor<B> L = U.matmul(Qc.t());                                     // [N, n, S]
    const Tensor<B> m = L.max({1}, true);                                     // [N, 1, S]
    const Tensor<B> E = L.sub(m).exp();                                       // [N, n, S]
    const Tensor<B> l = E.sum({1});                                           // [N, S]
    const Tensor<B> acc = E.transpose(1, 2).matmul(V);                        // [N, S, D]
    return {m.squeeze(1).t().contiguous().reshape(stat), l.t().contiguous().reshape(stat), acc.transpose(0, 1).contiguous().reshape(full)};
  }
}

// Phase 2: h (like p, or in the compute dtype without a partial) from one query's Phase-1 statistics
// (m, l [rows...], acc [rows..., D]) and the running partial p (undefined: none).
template <Backend B> Tensor<B> depth_attention_merge(const Tensor<B>& m, const Tensor<B>& l, const Tensor<B>& acc, const Tensor<B>& p,
                                                     const Tensor<B>& q, double eps) {
  const Shape& shape = acc.shape();
  KILN_CHECK(!shape.empty() && shape.back() > 0, "depth_attention_merge: acc must have rank >= 1, got {}", shape_str(shape));
  const int64_t D = shape.back(), N = acc.numel() / D;
  const Shape rows(shape.begin(), shape.end() - 1);
  KILN_CHECK(m.shape() == rows && l.shape() == rows, "depth_attention_merge: m {} / l {} do not match acc {}", shape_str(m.shape()),
             shape_str(l.shape()), shape_str(shape));
  KILN_CHECK(!p.defined() || p.shape() == shape, "depth_attention_merge: partial {} differs from acc {}", shape_str(p.shape()),
             shape_str(shape));
  KILN_CHECK(q.shape() == Shape{D}, "depth_attention_merge: query {} does not match width {}", shape_str(q.shape()), D);
  const DType cd = acc.dtype(), out = p.defined() ? p.dtype() : cd;
  if constexpr (HasDepthTwoPhase<B>) {
    const Tensor<B> mc = m.to(cd).contiguous(), lc = l.to(cd).contiguous(), ac = acc.contiguous(), qc = q.to(cd).contiguous();
    const Tensor<B> pc = p.defined() ? p.to(cd).contiguous() : Tensor<B>();
    Tensor<B> h = Tensor<B>::empty({N, D}, cd);
    const View<typename B::Storage> pv = pc.defined() ? pc.cview() : ac.cview();
    if (N) KILN_PROFILED("depth_attention_merge", h, mc, lc, ac)
    B::depth_attention_merge(h.mview(), mc.cview(), lc.cview(), ac.cview(), pc.defined() ? &pv : nullptr, qc.cview(), eps);
    return h.reshape(shape).to(out);
  } else {
    const Tensor<B> mu = m.to(cd).unsqueeze(-1), lu = l.to(cd).unsqueeze(-1);  // [rows..., 1]
    if (!p.defined()) return acc.div(lu);
    const Tensor<B> pf = p.to(cd);
    const Tensor<B> lp = pf.mul(pf.square().mean({-1}, true).add(eps).rsqrt()).matmul(q.to(cd)).unsqueeze(-1);
    const Tensor<B> mx = mu.maximum(lp);
    const Tensor<B> a = mu.sub(mx).exp(), b = lp.sub(mx).exp();
    return acc.mul(a).add(pf.mul(b)).div(lu.mul(a).add(b)).to(out);
  }
}

}  // namespace kiln::fused
#pragma GCC visibility pop
