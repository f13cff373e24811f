// Loss ops with a closed-form backward (autograd/loss_ops.hpp): forward and backward side by side.
// cross_entropy returns the per-row loss, the others the elementwise loss; each closure saves only
// what its formulas read, and only for the inputs that need a gradient.
#include <algorithm>

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/loss_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_loss.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> using T = Tensor<B>;

// PyTorch's EPSILON in binary_cross_entropy's backward is a float: 1e-12f, 9.9999999600e-13 as a double
constexpr double kBceEps = static_cast<double>(1e-12f);

template <Backend B> void check_pair(const Var<B>& x, const Var<B>& y, const char* op, const char* xname) {
  KILN_CHECK(x.defined() && y.defined(), "{}: undefined {} or target", op, xname);
  KILN_CHECK(is_floating(x.dtype()) && is_floating(y.dtype()), "{}: {} and target must be floating, got {} and {}", op, xname, x.dtype(),
             y.dtype());
  KILN_CHECK(x.shape() == y.shape(), "{}: target {} must have the {}'s shape {}", op, shape_str(y.shape()), xname, shape_str(x.shape()));
}

// A constant factor (weight, pos_weight) in x's dtype, expanded to x's shape; undefined stays undefined.
template <Backend B> T<B> factor(const T<B>& w, const Shape& shape, DType d, const char* op, const char* name) {
  if (!w.defined()) return w;
  KILN_CHECK(is_floating(w.dtype()), "{}: {} must be floating, got {} (shape {})", op, name, w.dtype(), shape_str(w.shape()));
  bool ok = w.dim() <= static_cast<int64_t>(shape.size());
  for (int64_t i = 1; ok && i <= w.dim(); ++i) {
    const int64_t a = w.shape()[static_cast<size_t>(w.dim() - i)], b = shape[shape.size() - static_cast<size_t>(i)];
    ok = a == b || a == 1;
  }
  KILN_CHECK(ok, "{}: {} {} does not broadcast to the input's shape {}", op, name, shape_str(w.shape()), shape_str(shape));
  return w.to(d).expand(shape);
}
template <Backend B> T<B> scaled(const T<B>& t, const T<B>& w) { return w.defined() ? t.mul(w) : t; }
}  // namespace

template <Backend B> Var<B> LossOps<B>::binary_cross_entropy(const X& p_in, const X& y_in, const T<B>& weight) {
  static constexpr const char* op = "binary_cross_entropy";
  check_pair(p_in, y_in, op, "input");
  constexpr auto ac = autocast::Op::binary_cross_entropy;
  const X p = autocast::cast(ac, p_in), y = autocast::cast(ac, y_in);
  KILN_CHECK(p.dtype() == y.dtype(), "{}: input {} and target {} must have one dtype", op, p.dtype(), y.dtype());
  const T<B> pv = p.value(), yv = y.value();
  if (pv.numel()) {  // NaN is out of range too, as in PyTorch
    const int64_t bad = item<int64_t>(pv.ge(0.0).logical_and(pv.le(1.0)).logical_not().sum().to(DType::i64));
    KILN_CHECK(bad == 0, "{}: all elements of input must be in [0, 1]; {} of {} are not (min {}, max {})", op, bad, pv.numel(),
               item<double>(pv.min()), item<double>(pv.max()));
  }
  const T<B> w = factor(weight, pv.shape(), pv.dtype(), op, "weight");
  const T<B> log_p = pv.log().maximum(-100.0), log_q = pv.neg().add(1.0).log().maximum(-100.0);  // PyTorch clamps at -100
  T<B> loss = scaled(yv.sub(1.0).mul(log_q).sub(yv.mul(log_p)), w);
  const bool np = needs_grad(p), ny = needs_grad(y);
  return record<B>(op, std::move(loss), {&p, &y}, [np, ny, w, pv = keep_if(np || ny, pv), yv = keep_if(np, yv)](const T<B>& g) {
    const T<B> gw = scaled(g, w);
    T<B> dp, dy;
    if (np) dp = gw.mul(pv.sub(yv)).div(pv.neg().add(1.0).mul(pv).maximum(kBceEps));
    if (ny) dy = gw.mul(pv.neg().log1p().sub(pv.log()));  // unclamped, as PyTorch: ±inf at p = 0, 1
    return Grads<B>{dp, dy};
  });
}

template <Backend B>
Var<B> LossOps<B>::binary_cross_entropy_with_logits(const X& x_in, const X& y_in, const T<B>& weight, const T<B>& pos_weight) {
  static constexpr const char* op = "binary_cross_entropy_with_logits";
  check_pair(x_in, y_in, op, "input");
  constexpr auto ac = autocast::Op::binary_cross_entropy_with_logits;
  const X x = autocast::cast(ac, x_in), y = autocast::cast(ac, y_in);
  KILN_CHECK(x.dtype() == y.dtype(), "{}: input {} and target {} must have one dtype", op, x.dtype(), y.dtype());
  const T<B> xv = x.value(), yv = y.value();
  const T<B> w = factor(weight, xv.shape(), xv.dtype(), op, "weight");
  const T<B> pw = factor(pos_weight, xv.shape(), xv.dtype(), op, "pos_weight");
  // softplus(−x) = log(e^−m + e^(−x−m)) + m with m = max(−x, 0): no exp overflows
  const T<B> m = xv.neg().maximum(0.0);
  const T<B> softplus_neg = m.neg().exp().add(xv.neg().sub(m).exp()).log().add(m);
  const T<B> lw = pw.defined() ? pw.sub(1.0).mul(yv).add(1.0) : T<B>();
  T<B> loss = yv.neg().add(1.0).mul(xv).add(lw.defined() ? lw.mul(softplus_neg) : softplus_neg);
  loss = scaled(loss, w);
  const bool nx = needs_grad(x), ny = needs_grad(y);
  return record<B>(op, std::move(loss), {&x, &y}, [nx, ny, w, pw, xv, yv = keep_if(nx, yv)](const T<B>& g) {
    const T<B> gw = scaled(g, w);
    T<B> dx, dy;
    if (nx) {
      if (pw.defined()) {
        const T<B> t = pw.mul(yv);
        dx = t.add(1.0).sub(yv).mul(xv.sigmoid()).sub(t);
      } else {
        dx = xv.sigmoid().sub(yv);
      }
      dx = gw.mul(dx);
    }
    if (ny) {
      // log σ(−x) − pw·log σ(x) = −softplus(x) + pw·softplus(−x); without pos_weight, −x
      if (pw.defined()) {
        const T<B> mn = xv.neg().maximum(0.0), mp = xv.maximum(0.0);
        const T<B> sp_neg = mn.neg().exp().add(xv.neg().sub(mn).exp()).log().add(mn);
        const T<B> sp_pos = mp.neg().exp().add(xv.sub(mp).exp()).log().add(mp);
        dy = gw.mul(pw.mul(sp_neg).sub(sp_pos));
      } else {
        dy = gw.mul(xv.neg());
      }
    }
    return Grads<B>{dx, dy};
  });
}

// One recorded op on the fused kernel (core/fused_loss.hpp): backward keeps the logits and lse [N],
// never the [N, C] log-probabilities.
template <Backend B> Var<B> LossOps<B>::cross_entropy(const X& x, const Tensor<B>& t, int64_t ignore_index, double label_smoothing,
                                                      std::optional<DType> loss_dtype) {
  const Tensor<B> xv = x.value();
  auto [rows_loss, lse] = fused::cross_entropy_forward(xv, t, ignore_index, label_smoothing);
  // lse = lse: clang 14 (fuzz/) captures no structured binding by name.
  return record<B>("cross_entropy", rows_loss.to(loss_dtype.value_or(x.dtype())), {&x},
                   [xv, lse = lse, t, ignore_index, label_smoothing](const Tensor<B>& g) {
                     return Grads<B>{fused::cross_entropy_backward(xv, lse, t, g, ignore_index, label_smoothing)};
                   });
}

// The LM head and its cross-entropy in row chunks (autograd/loss_ops.hpp): no [N, C] tensor outlives a
// chunk. The gradients are made in the forward, each row's for a gradient of 1 on its loss, and scaled
// in the backward by the upstream gradient over `kept`: the products are those the composite's
// backward would run, chunk by chunk, so the step does no more work than without the fusion. Per row
// rather than for the mean: dlogits stay within [-1, 1], so bf16/f16 ones neither underflow before
// f16's loss scale reaches them nor lose what the mean's 1/kept would shift out; dweight sums its
// chunks in f32 for half inputs and is rounded to their dtype only once scaled.
template <Backend B> Var<B> LossOps<B>::linear_cross_entropy(const X& h, const X& w, const Tensor<B>& t, int64_t kept, int64_t ignore_index,
                                                             double label_smoothing, int64_t chunk_rows, std::optional<DType> loss_dtype) {
  static constexpr const char* op = "linear_cross_entropy";
  KILN_CHECK(h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1), "{}: hidden states [N, D] and weight [C, D] needed, got {} and {}", op,
             shape_str(h.shape()), shape_str(w.shape()));
  KILN_CHECK(is_floating(h.dtype()) && h.dtype() == w.dtype(), "{}: hidden states and weight need one float dtype, got {} and {}", op,
             h.dtype(), w.dtype());
  KILN_CHECK(t.shape() == Shape{h.size(0)}, "{}: targets [{}] needed, got {}", op, h.size(0), shape_str(t.shape()));
  KILN_CHECK(chunk_rows > 0 && kept > 0, "{}: chunk_rows and the count of kept rows must be > 0, got {} and {}", op, chunk_rows, kept);
  const T<B> hv = h.value(), wv = w.value(), wt = wv.t();
  const DType dt = hv.dtype(), acc = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t N = hv.size(0);
  const bool dh_wanted = needs_grad(h), dw_wanted = needs_grad(w);
  T<B> total, dh, dw;
  if (dh_wanted) dh = T<B>::empty(hv.shape(), dt);
  const int64_t rows = balanced_chunk_rows(N, chunk_rows);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    const T<B> hc = hv.narrow(0, r0, n), tc = t.narrow(0, r0, n);
    const T<B> logits = hc.matmul(wt);
    auto [rows_loss, lse] = fused::cross_entropy_forward(logits, tc, ignore_index, label_smoothing);
    const T<B> part = rows_loss.sum();
    total = total.defined() ? total.add(part) : part;
    if (!dh_wanted && !dw_wanted) continue;
    const T<B> dlogits = fused::cross_entropy_backward(logits, lse, tc, T<B>::ones({n}, acc), ignore_index, label_smoothing);
    if (dh_wanted) dh.narrow(0, r0, n).copy_(dlogits.matmul(wv));
    if (dw_wanted) {
      const T<B> part_dw = dlogits.t().matmul(hc).to(acc);
      if (dw.defined())
        dw.add_(part_dw);
      else
        dw = part_dw;
    }
  }
  const T<B> loss = total.div(static_cast<double>(kept)).to(loss_dtype.value_or(dt));
  return record<B>(op, loss, {&h, &w}, [dh, dw, kept, acc, dt](const T<B>& g) {
    // the upstream gradient over kept, in f32 (f64 for f64): not rounded to bf16/f16 first
    const T<B> f = g.to(acc).div(static_cast<double>(kept));
    const auto scaled = [&f, dt](const T<B>& d) { return d.defined() ? d.to(f.dtype()).mul(f).to(dt) : d; };
    return Grads<B>{scaled(dh), scaled(dw)};
  });
}

#define KILN_INST(B) template struct LossOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
