#pragma once
// Fused ops: a composite default built from the Backend primitives, which a backend overrides by
// providing the static member named below. Every caller (Tensor, autograd, nn) goes through these
// functions, so an override speeds up all of them at once.
//
//   softmax_lastdim(MutView out, View x, bool log)            rows of the last axis, x contiguous
//   softmax_lastdim_backward(MutView dx, View y, View dy, bool log)   y = forward output
//   attention_forward(MutView o, MutView lse, View q, View k, View v, const View* key_padding,
//                     const View* mask, double scale, bool causal, int64_t pos0, double softcap)
//   attention_backward(MutView dq, MutView dk, MutView dv, View q, View k, View v, View o, View lse,
//                      View dout, const View* key_padding, const View* mask, double scale, bool causal,
//                      int64_t pos0, double softcap)
//     see attention_forward below for what the override receives.
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/core/profile.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
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
      KILN_PROFILED(name, out, xc) B::softmax_lastdim(out.mview(), xc.cview(), log);
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
  KILN_CHECK(y.shape() == dy.shape() && y.dtype() == dy.dtype(), "{}: y {} {} and dy {} {} differ", name, shape_str(y.shape()), y.dtype(),
             shape_str(dy.shape()), dy.dtype());
  const int a = normalize_axis(axis, y.dim(), name, y.shape());
  if constexpr (HasSoftmaxBackward<B>) {
    if (y.dim() > 0 && y.numel() > 0) {
      const bool last = a == y.dim() - 1;
      const Tensor<B> yc = (last ? y : y.transpose(a, -1)).contiguous();
      const Tensor<B> dyc = (last ? dy : dy.transpose(a, -1)).contiguous();
      Tensor<B> dx = Tensor<B>::empty(yc.shape(), y.dtype());
      KILN_PROFILED(name, dx, yc, dyc) B::softmax_lastdim_backward(dx.mview(), yc.cview(), dyc.cview(), log);
      return last ? dx : dx.transpose(a, -1).contiguous();
    }
  }
  if (y.dtype() == DType::bf16 || y.dtype() == DType::f16)
    return softmax_backward(y.to(DType::f32), dy.to(DType::f32), a, log).to(y.dtype());
  const std::vector<int64_t> ax{a};
  if (log) return dy.sub(y.exp().mul(dy.sum(ax, true)));
  return y.mul(dy.sub(dy.mul(y).sum(ax, true)));
}

// ------------------------------------------------------------------------------------------ attention
// Softmax attention without the [T, S] matrix in memory (the flash-attention contract):
//   q [B, H, T, d], k [B, Hkv, S, d], v [B, Hkv, S, dv]; H a multiple of Hkv, query head i uses kv
//   head i / (H/Hkv) (GQA); dv may differ from d.
//   scores s_ij = scale · q_i·k_j, or with softcap > 0 softcap · tanh(scale · q_i·k_j / softcap) (Gemma 2's
//   attn_logit_softcapping; softcap 0: none), (+ mask_ij when the mask is additive), masked to −inf where
//   causal && j > pos0 + i (query i sits at position pos0 + i, keys at 0..S−1: KV-cache decoding has
//   T ≠ S; pos0 = 0 is the top-left alignment of torch's scaled_dot_product_attention(is_causal)),
//   where key_padding [B, S] (bool, optional) is false, and where a bool mask is false.
//   mask (optional): bool (true = may attend, as torch's scaled_dot_product_attention) or additive
//   float of q's dtype (added to the scaled scores; −inf hides a key like false), any shape that
//   broadcasts to [B, H, T, S] ([T, S], [B, 1, T, S], [1, H, 1, S], ...). It is never materialised:
//   the kernels read it through an expanded (zero-stride) view, and autograd saves the user's tensor.
//   It is not differentiable (no gradient flows into an additive mask).
//   O = softmax(s) v  [B, H, T, dv] in q's dtype;  LSE = log Σ_j exp(s_ij)  [B, H, T], in f64 for f64
//   inputs and f32 otherwise (bf16/f16 are computed in f32 and O rounded once).
// A row with no visible key gives O = NaN (as PyTorch) and LSE = −inf; attention_backward treats such
// a row as contributing nothing (zero dq row, nothing added to dk, dv).
//
// Backend override (B::attention_forward / B::attention_backward): receives f32 or f64 tensors only
// (half types are converted here); q, k, v, o, dout have a unit-stride last dim and a row stride >= the
// row width (else they are made contiguous here), any strides elsewhere (zero included); the outputs
// and lse are contiguous; key_padding is nullptr or a contiguous bool [B, S]; mask is nullptr or a
// [B, H, T, S] view with any strides (zero on broadcast dims, so no size-T·S buffer), bool or of the
// compute dtype (f32/f64, additive). dq, dk, dv arrive zero-filled. softcap is 0 unless the backend
// declares `static constexpr bool attention_softcap = true`: without it a soft-capped call takes the
// composite path (the [T, S] scores materialised).
// A backend that also declares `static constexpr bool attention_any_layout = true` receives instead
// outputs laid out in their inputs' memory order (Tensor::empty_like_layout: O and dq like q, dk like k,
// dv like v; for the transposed [B, H, T, hd] views of a [B, T, H, hd] projection that MultiHeadAttention
// passes, [B, T, H, hd] blocks, so the head merge after attention and the head split's backward stay
// views), each with unit-stride rows, and dq, dk, dv uninitialised: it writes every element.
// A backend that declares `static constexpr bool attention_half = true` receives bf16/f16 q, k, v, o,
// dout as they are (not converted here) and writes O, dq, dk, dv in that dtype; LSE and an additive
// mask are f32. It must compute as the conversion would (in f32 on the widened values, each output
// rounded once; tests/attention checks it bit for bit), except that it may round P (forward and
// backward) and dS (backward) to the operands' dtype for their products, as FlashAttention-2 does
// (Cuda's half products, switched off by cuda::set_attention_half_products(false); tests/attention
// bounds both passes against the f64 oracle): S, dP, the softmax, LSE, D and the accumulations stay f32.
template <class B>
concept AttentionAnyLayout = requires {
  requires B::attention_any_layout;
};
template <class B>
concept AttentionHalf = requires {
  requires B::attention_half;
};
template <class B>
concept AttentionSoftcap = requires {
  requires B::attention_softcap;
};
template <class B>
concept HasAttention = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, const View<typename B::Storage>* kp,
                                double scale, bool causal, int64_t pos0, double softcap) {
  B::attention_forward(out, out, in, in, in, kp, kp, scale, causal, pos0, softcap);
};
template <class B>
concept HasAttentionBackward = requires(MutView<typename B::Storage> out, View<typename B::Storage> in, const View<typename B::Storage>* kp,
                                        double scale, bool causal, int64_t pos0, double softcap) {
  B::attention_backward(out, out, out, in, in, in, in, in, in, kp, kp, scale, causal, pos0, softcap);
};

namespace detail {

struct AttnDims {
  int64_t B, H, Hkv, T, S, d, dv;
  bool empty() const { return B * H * T * S * d * dv == 0; }
};

template <Backend B> AttnDims attention_check(const char* op, const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v,
                                              const Tensor<B>& key_padding, int64_t pos0, const Tensor<B>& mask = {}) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(), "{}: undefined q, k or v", op);
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "{}: q {}, k {}, v {} must be [B, H, T, d]", op, shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()));
  KILN_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(),
             "{}: q, k, v need one float dtype, got {}, {}, {} (q {})", op, q.dtype(), k.dtype(), v.dtype(), shape_str(q.shape()));
  const AttnDims a{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  KILN_CHECK(
      k.size(0) == a.B && v.size(0) == a.B && k.size(3) == a.d && v.size(1) == a.Hkv && v.size(2) == a.S && a.Hkv >= 1 && a.H % a.Hkv == 0,
      "{}: q {}, k {}, v {} do not fit (H must be a multiple of Hkv, widths and lengths must agree)", op, shape_str(q.shape()),
      shape_str(k.shape()), shape_str(v.shape()));
  KILN_CHECK(pos0 >= 0, "{}: pos0 must be >= 0, got {} (q {})", op, pos0, shape_str(q.shape()));
  if (key_padding.defined())
    KILN_CHECK(key_padding.dtype() == DType::boolean && key_padding.shape() == Shape({a.B, a.S}),
               "{}: key_padding must be bool [{}, {}], got {} {}", op, a.B, a.S, key_padding.dtype(), shape_str(key_padding.shape()));
  if (mask.defined()) {
    KILN_CHECK(mask.dtype() == DType::boolean || mask.dtype() == q.dtype(),
               "{}: mask must be bool or additive of q's dtype {}, got {} (mask {}, q {})", op, q.dtype(), mask.dtype(),
               shape_str(mask.shape()), shape_str(q.shape()));
    const Shape want{a.B, a.H, a.T, a.S};
    bool fits = mask.dim() <= 4;
    for (int i = 1; fits && i <= mask.dim(); ++i) {
      const int64_t m = mask.size(mask.dim() - i), w = want[static_cast<size_t>(4 - i)];
      fits = m == w || m == 1;
    }
    KILN_CHECK(fits, "{}: mask {} does not broadcast to [B, H, T, S] = {} (q {}, k {})", op, shape_str(mask.shape()), shape_str(want),
               shape_str(q.shape()), shape_str(k.shape()));
  }
  return a;
}

inline void softcap_check(const char* op, double softcap) {
  KILN_CHECK(softcap >= 0 && std::isfinite(softcap), "{}: softcap must be finite and >= 0 (0: none), got {}", op, softcap);
}

// The scaled scores through the soft cap: softcap · tanh(s / softcap) (softcap 0: s).
template <Backend B> Tensor<B> soft_capped(const Tensor<B>& s, double softcap) {
  return softcap > 0 ? s.div(softcap).tanh().mul(softcap) : s;
}

// The mask as a [B, H, T, S] view of the user's tensor (zero strides on broadcast dims), in dtype dt
// when additive (a conversion keeps the user's size).
template <Backend B> Tensor<B> mask_view(const AttnDims& a, const Tensor<B>& mask, DType dt) {
  Tensor<B> m = mask.dtype() == DType::boolean || mask.dtype() == dt ? mask : mask.to(dt);
  while (m.dim() < 4) m = m.unsqueeze(0);
  return m.expand({a.B, a.H, a.T, a.S});
}

// The mask as an additive tensor of the user's rank and size (0 / −inf for a bool mask), for the
// composite path.
template <Backend B> Tensor<B> mask_additive(const Tensor<B>& mask, DType dt) {
  if (mask.dtype() != DType::boolean) return mask.to(dt);
  return Tensor<B>::where(mask, Tensor<B>::zeros({}, dt), Tensor<B>::full({}, -INFINITY, dt));
}

// FLOPs of the two (forward) or five (backward: S recomputed, dV, dP, dQ, dK) matrix products over
// the T x S scores, halved when causal (about half the scores are computed): what the profiler reports.
inline double attention_flops(const AttnDims& a, bool causal, bool backward) {
  const double per_score =
      backward ? 3.0 * static_cast<double>(a.d) + 2.0 * static_cast<double>(a.dv) : static_cast<double>(a.d) + static_cast<double>(a.dv);
  return 2.0 * static_cast<double>(a.B * a.H * a.T * a.S) * per_score * (causal ? 0.5 : 1.0);
}

inline DType lse_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

// What an override may read directly: unit-stride rows no shorter than their stride says.
template <Backend B> Tensor<B> attn_rows(const Tensor<B>& x) {
  const bool unit = x.size(3) <= 1 || x.strides()[3] == 1;
  const bool rows = x.size(2) <= 1 || x.strides()[2] >= x.size(3);
  return unit && rows ? x : x.contiguous();
}

// The additive mask [1|B, 1|Hkv, 1|rep, 1|T, S] (0 or −inf from causal and key_padding, plus the
// user's mask) in dtype dt, undefined when nothing is masked. (The composite path only.)
template <Backend B>
Tensor<B> attention_mask(const AttnDims& a, bool causal, int64_t pos0, const Tensor<B>& key_padding, DType dt, const Tensor<B>& mask = {}) {
  Tensor<B> m;
  if (causal && pos0 < a.S - 1) {  // (with pos0 >= S − 1 every query sees every key)
    std::vector<double> c(static_cast<size_t>(a.T * a.S), 0.0);
    for (int64_t i = 0; i < a.T; ++i)
      for (int64_t j = std::max<int64_t>(0, pos0 + i + 1); j < a.S; ++j)
        c[static_cast<size_t>(i * a.S + j)] = -std::numeric_limits<double>::infinity();
    m = Tensor<B>::from_vector(c, {1, 1, 1, a.T, a.S}).to(dt);
  }
  if (key_padding.defined()) {
    const Tensor<B> p =
        Tensor<B>::where(key_padding, Tensor<B>::zeros({}, dt), Tensor<B>::full({}, -INFINITY, dt)).reshape({a.B, 1, 1, 1, a.S});
    m = m.defined() ? m.add(p) : p;
  }
  if (mask.defined()) {
    Tensor<B> u = mask_additive(mask, dt);
    while (u.dim() < 4) u = u.unsqueeze(0);
    const int64_t h = u.size(1);  // 1 or H: split into (Hkv, rep) to match the scores' layout
    u = u.reshape({u.size(0), h == 1 ? 1 : a.Hkv, h == 1 ? 1 : a.H / a.Hkv, u.size(2), u.size(3)});
    m = m.defined() ? m.add(u) : u;
  }
  return m;
}

}  // namespace detail

// Composite attention forward (also the oracle of the fused kernels): the [B, Hkv, rep, T, S] scores
// are materialised. Returns {O, LSE}.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> attention_forward_composite(const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v,
                                                                                 double scale, bool causal, int64_t pos0,
                                                                                 const Tensor<B>& key_padding = {},
                                                                                 const Tensor<B>& mask = {}, double softcap = 0) {
  const detail::AttnDims a = detail::attention_check("attention_forward", q, k, v, key_padding, pos0, mask);
  detail::softcap_check("attention_forward", softcap);
  if (q.dtype() == DType::bf16 || q.dtype() == DType::f16) {
    const Tensor<B> m32 = mask.defined() && mask.dtype() != DType::boolean ? mask.to(DType::f32) : mask;
    auto [o, lse] =
        attention_forward_composite(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), scale, causal, pos0, key_padding, m32, softcap);
    return {o.to(q.dtype()), lse};
  }
  const int64_t rep = a.H / a.Hkv;
  const Tensor<B> q5 = q.reshape({a.B, a.Hkv, rep, a.T, a.d});
  const Tensor<B> k5 = k.unsqueeze(2), v5 = v.unsqueeze(2);
  Tensor<B> s = detail::soft_capped(q5.matmul(k5.transpose(-1, -2)).mul(scale), softcap);  // [B, Hkv, rep, T, S]
  const Tensor<B> madd = detail::attention_mask(a, causal, pos0, key_padding, q.dtype(), mask);
  if (madd.defined()) s = s.add(madd);
  Tensor<B> m = a.S > 0 ? s.max({-1}, true) : Tensor<B>::full({a.B, a.Hkv, rep, a.T, 1}, -INFINITY, q.dtype());
  m = Tensor<B>::where(m.eq(-INFINITY), Tensor<B>::zeros({}, q.dtype()), m);  // rows with no key: shift by 0
  const Tensor<B> e = s.sub(m).exp();
  const Tensor<B> l = e.sum({-1}, true);
  const Tensor<B> lse = m.add(l.log());     // −inf for a row with no key
  const Tensor<B> o = e.matmul(v5).div(l);  // 0/0 = NaN for a row with no key
  return {o.reshape({a.B, a.H, a.T, a.dv}), lse.reshape({a.B, a.H, a.T})};
}

// Composite attention backward from the saved {q, k, v, O, LSE} and dO (FlashAttention-2 formulas):
//   P = exp(s − LSE), dV = Pᵀ dO, dP = dO Vᵀ, D = rowsum(dO ⊙ O), dS = P ⊙ (dP − D),
//   dQ = scale dS K, dK = scale dSᵀ Q (dK, dV summed over the query heads of each kv head); with a soft
//   cap, dS is also multiplied by the cap's derivative 1 − tanh²(scale · q·k / softcap).
template <Backend B> std::tuple<Tensor<B>, Tensor<B>, Tensor<B>> attention_backward_composite(
    const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v, const Tensor<B>& o, const Tensor<B>& lse, const Tensor<B>& dout,
    double scale, bool causal, int64_t pos0, const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}, double softcap = 0) {
  const detail::AttnDims a = detail::attention_check("attention_backward", q, k, v, key_padding, pos0, mask);
  detail::softcap_check("attention_backward", softcap);
  if (q.dtype() == DType::bf16 || q.dtype() == DType::f16) {
    const DType f = DType::f32;
    const Tensor<B> m32 = mask.defined() && mask.dtype() != DType::boolean ? mask.to(f) : mask;
    auto [dq, dk, dv] = attention_backward_composite(q.to(f), k.to(f), v.to(f), o.to(f), lse.to(f), dout.to(f), scale, causal, pos0,
                                                     key_padding, m32, softcap);
    return {dq.to(q.dtype()), dk.to(q.dtype()), dv.to(q.dtype())};
  }
  const int64_t rep = a.H / a.Hkv;
  const DType dt = q.dtype();
  const Tensor<B> q5 = q.reshape({a.B, a.Hkv, rep, a.T, a.d});
  const Tensor<B> k5 = k.unsqueeze(2), v5 = v.unsqueeze(2);
  const Tensor<B> o5 = o.reshape({a.B, a.Hkv, rep, a.T, a.dv}), g5 = dout.reshape({a.B, a.Hkv, rep, a.T, a.dv});
  const Tensor<B> l5 = lse.to(dt).reshape({a.B, a.Hkv, rep, a.T, 1});
  const Tensor<B> dead = l5.eq(-INFINITY);  // rows with no visible key
  const Tensor<B> zero = Tensor<B>::zeros({}, dt);
  const Tensor<B> raw = q5.matmul(k5.transpose(-1, -2)).mul(scale);
  Tensor<B> s = detail::soft_capped(raw, softcap);
  const Tensor<B> madd = detail::attention_mask(a, causal, pos0, key_padding, dt, mask);
  if (madd.defined()) s = s.add(madd);
  const Tensor<B> p = Tensor<B>::where(dead, zero, s.sub(l5).exp());  // [B, Hkv, rep, T, S]
  const Tensor<B> dvv = p.transpose(-1, -2).matmul(g5).sum({2});      // [B, Hkv, S, dv]
  const Tensor<B> dp = g5.matmul(v5.transpose(-1, -2));               // [B, Hkv, rep, T, S]
  const Tensor<B> D = Tensor<B>::where(dead, zero, g5.mul(o5).sum({-1}, true));
  Tensor<B> ds = p.mul(dp.sub(D)).mul(scale);
  if (softcap > 0) {  // d(c · tanh(x / c))/dx = 1 − tanh²(x / c)
    const Tensor<B> t = raw.div(softcap).tanh();
    ds = ds.mul(t.mul(t).neg().add(1.0));
  }
  const Tensor<B> dq = ds.matmul(k5).reshape({a.B, a.H, a.T, a.d});
  const Tensor<B> dk = ds.transpose(-1, -2).matmul(q5).sum({2});
  return {dq, dk, dvv};
}

// Fused attention forward: {O [B, H, T, dv], LSE [B, H, T]} (see the contract above).
template <Backend B> std::pair<Tensor<B>, Tensor<B>> attention_forward(const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v,
                                                                       double scale, bool causal, int64_t pos0,
                                                                       const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {},
                                                                       double softcap = 0) {
  const detail::AttnDims a = detail::attention_check("attention_forward", q, k, v, key_padding, pos0, mask);
  detail::softcap_check("attention_forward", softcap);
  if constexpr (HasAttention<B>) {
    const DType dt = q.dtype(), ct = detail::lse_dtype(dt);  // ct: the compute dtype, f32 for half types
    if (a.empty() || (softcap > 0 && !AttentionSoftcap<B>))
      return attention_forward_composite(q, k, v, scale, causal, pos0, key_padding, mask, softcap);
    if (is_half(dt) && !AttentionHalf<B>) {
      const Tensor<B> m32 = mask.defined() && mask.dtype() != DType::boolean ? mask.to(DType::f32) : mask;
      auto [o, lse] =
          attention_forward(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), scale, causal, pos0, key_padding, m32, softcap);
      return {o.to(dt), lse};
    }
    const Tensor<B> qc = detail::attn_rows(q), kc = detail::attn_rows(k), vc = detail::attn_rows(v);
    const Shape os{a.B, a.H, a.T, a.dv};
    Tensor<B> o = AttentionAnyLayout<B> ? qc.empty_like_layout(os, dt) : Tensor<B>::empty(os, dt);
    Tensor<B> lse = Tensor<B>::empty({a.B, a.H, a.T}, ct);
    const Tensor<B> kp = key_padding.defined() ? key_padding.contiguous() : Tensor<B>();
    const View<typename B::Storage> kpv = kp.defined() ? kp.cview() : qc.cview();
    const Tensor<B> mv = mask.defined() ? detail::mask_view(a, mask, ct) : Tensor<B>();
    const View<typename B::Storage> mvv = mv.defined() ? mv.cview() : qc.cview();
    KILN_PROFILED_FLOPS("attention_forward", detail::attention_flops(a, causal, false), o, lse, qc, kc, vc)
    B::attention_forward(o.mview(), lse.mview(), qc.cview(), kc.cview(), vc.cview(), kp.defined() ? &kpv : nullptr,
                         mv.defined() ? &mvv : nullptr, scale, causal, pos0, softcap);
    return {o, lse};
  } else {
    (void)a;
    return attention_forward_composite(q, k, v, scale, causal, pos0, key_padding, mask, softcap);
  }
}

// Fused attention backward: {dq, dk, dv} in q's dtype, from the saved q, k, v, O, LSE and dO.
template <Backend B>
std::tuple<Tensor<B>, Tensor<B>, Tensor<B>> attention_backward(const Tensor<B>& q, const Tensor<B>& k, const Tensor<B>& v,
                                                               const Tensor<B>& o, const Tensor<B>& lse, const Tensor<B>& dout,
                                                               double scale, bool causal, int64_t pos0, const Tensor<B>& key_padding = {},
                                                               const Tensor<B>& mask = {}, double softcap = 0) {
  const detail::AttnDims a = detail::attention_check("attention_backward", q, k, v, key_padding, pos0, mask);
  detail::softcap_check("attention_backward", softcap);
  KILN_CHECK(o.defined() && dout.defined() && lse.defined() && o.shape() == Shape({a.B, a.H, a.T, a.dv}) && dout.shape() == o.shape() &&
                 lse.shape() == Shape({a.B, a.H, a.T}) && o.dtype() == q.dtype() && dout.dtype() == q.dtype() &&
                 lse.dtype() == detail::lse_dtype(q.dtype()),
             "attention_backward: o {} {}, dout {} {}, lse {} {} do not fit q {} {}, v {}", shape_str(o.shape()), o.dtype(),
             shape_str(dout.shape()), dout.dtype(), shape_str(lse.shape()), lse.dtype(), shape_str(q.shape()), q.dtype(),
             shape_str(v.shape()));
  if constexpr (HasAttentionBackward<B>) {
    const DType dt = q.dtype(), ct = detail::lse_dtype(dt);
    if (a.empty() || (softcap > 0 && !AttentionSoftcap<B>))
      return attention_backward_composite(q, k, v, o, lse, dout, scale, causal, pos0, key_padding, mask, softcap);
    if (is_half(dt) && !AttentionHalf<B>) {
      const DType f = DType::f32;
      const Tensor<B> m32 = mask.defined() && mask.dtype() != DType::boolean ? mask.to(f) : mask;
      auto [dq, dk, dv] =
          attention_backward(q.to(f), k.to(f), v.to(f), o.to(f), lse, dout.to(f), scale, causal, pos0, key_padding, m32, softcap);
      return {dq.to(dt), dk.to(dt), dv.to(dt)};
    }
    const Tensor<B> qc = detail::attn_rows(q), kc = detail::attn_rows(k), vc = detail::attn_rows(v);
    Tensor<B> dq, dk, dv;
    if constexpr (AttentionAnyLayout<B>) {
      dq = qc.empty_like_layout(q.shape(), dt), dk = kc.empty_like_layout(k.shape(), dt), dv = vc.empty_like_layout(v.shape(), dt);
    } else {
      dq = Tensor<B>::zeros(q.shape(), dt), dk = Tensor<B>::zeros(k.shape(), dt), dv = Tensor<B>::zeros(v.shape(), dt);
    }
    const Tensor<B> oc = detail::attn_rows(o), gc = detail::attn_rows(dout), lc = lse.contiguous();
    const Tensor<B> kp = key_padding.defined() ? key_padding.contiguous() : Tensor<B>();
    const View<typename B::Storage> kpv = kp.defined() ? kp.cview() : qc.cview();
    const Tensor<B> mv = mask.defined() ? detail::mask_view(a, mask, ct) : Tensor<B>();
    const View<typename B::Storage> mvv = mv.defined() ? mv.cview() : qc.cview();
    KILN_PROFILED_FLOPS("attention_backward", detail::attention_flops(a, causal, true), dq, qc, kc, vc, dk, dv, oc, lc, gc)
    B::attention_backward(dq.mview(), dk.mview(), dv.mview(), qc.cview(), kc.cview(), vc.cview(), oc.cview(), lc.cview(), gc.cview(),
                          kp.defined() ? &kpv : nullptr, mv.defined() ? &mvv : nullptr, scale, causal, pos0, softcap);
    return {dq, dk, dv};
  } else {
    (void)a;
    return attention_backward_composite(q, k, v, o, lse, dout, scale, causal, pos0, key_padding, mask, softcap);
  }
}

}  // namespace kiln::fused
#pragma GCC visibility pop
