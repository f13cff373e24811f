// Recurrent ops (autograd/rnn_ops.hpp): the pointwise part of one LSTM / GRU step as one record each, and
// a whole layer-direction (lstm_scan, gru_scan) as one record. Forward and backward are Tensor ops, so
// every backend runs them.
//
// LSTM  gates [N, 4H] (i, f, g, o pre-activations), c [N, H] -> Y = [h' | c'] [N, 2H]
//   i, f, o = σ(·), g = tanh(·); c' = f·c + i·g; h' = o·tanh(c')
//   backward, from dY = [dh | dc'ext]: dc' = dc'ext + dh·o·(1 − tanh²c'); do = dh·tanh c'·o(1 − o);
//   di = dc'·g·i(1 − i); df = dc'·c·f(1 − f); dg = dc'·i·(1 − g²); dc = dc'·f. Saves σ/tanh of the
//   gates [N, 4H], c and tanh c'.
// GRU   gi = x W_ihᵀ + b_ih [N, 3H], gh = h W_hhᵀ + b_hh [N, 3H], h [N, H] -> h' [N, H]
//   r = σ(gi_r + gh_r), z = σ(gi_z + gh_z), n = tanh(gi_n + r·gh_n), h' = n + z·(h − n)
//   backward: dh = dh'·z; dz = dh'·(h − n)·z(1 − z); dn = dh'·(1 − z)·(1 − n²); dr = dn·gh_n·r(1 − r);
//   dgi = [dr | dz | dn], dgh = [dr | dz | dn·r]. Saves r, z, n, gh_n and h.
#include "kiln/autograd/rnn_ops.hpp"

#include "kiln/autograd/record.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> Tensor<B> one_minus(const Tensor<B>& t) { return t.neg().add(Scalar(1.0)); }

// The inputs that are defined, as record() takes them, and a gradient list in the same order.
template <Backend B> struct Inputs {
  std::vector<const Var<B>*> vars;
  void add(const Var<B>& v) {
    if (v.defined()) vars.push_back(&v);
  }
};

template <Backend B> void check_scan(const char* op, const Var<B>& gi, int64_t G, const Var<B>& w_hh, const Var<B>& h0, int64_t P) {
  KILN_CHECK(gi.defined() && gi.dim() == 3 && gi.size(2) % G == 0, "{}: gi {} is not [T, N, {}·H]", op, shape_str(gi.shape()), G);
  const int64_t N = gi.size(1), GH = gi.size(2);
  KILN_CHECK(w_hh.defined() && w_hh.shape() == Shape({GH, P}), "{}: w_hh {} is not [{}, {}] (gi {})", op, shape_str(w_hh.shape()), GH, P,
             shape_str(gi.shape()));
  KILN_CHECK(h0.defined() && h0.shape() == Shape({N, P}), "{}: h0 {} is not [{}, {}] (gi {})", op, shape_str(h0.shape()), N, P,
             shape_str(gi.shape()));
  KILN_CHECK(w_hh.dtype() == gi.dtype() && h0.dtype() == gi.dtype(), "{}: gi {}, w_hh {} and h0 {} differ in dtype", op, gi.dtype(),
             w_hh.dtype(), h0.dtype());
}

// Splits the scan's flat result [T·N·P + N·P (+ N·H)] into its views.
template <Backend B> typename RnnOps<B>::Scan split_scan(const Var<B>& y, int64_t T, int64_t N, int64_t P, int64_t H) {
  typename RnnOps<B>::Scan r;
  r.out = y.narrow(0, 0, T * N * P).reshape({T, N, P});
  r.h_n = y.narrow(0, T * N * P, N * P).reshape({N, P});
  if (H > 0) r.c_n = y.narrow(0, T * N * P + N * P, N * H).reshape({N, H});
  return r;
}
}  // namespace

template <Backend B> Var<B> RnnOps<B>::lstm_cell(const X& gates, const X& c) {
  KILN_CHECK(
      gates.defined() && c.defined() && gates.dim() == 2 && c.dim() == 2 && gates.size(1) == 4 * c.size(1) && gates.size(0) == c.size(0),
      "lstm_cell: gates {} and c {} are not [N, 4H] and [N, H]", shape_str(gates.shape()), shape_str(c.shape()));
  KILN_CHECK(gates.dtype() == c.dtype(), "lstm_cell: gates {} and c {} differ in dtype", gates.dtype(), c.dtype());
  const int64_t H = c.size(1);
  const Tensor<B> gv = gates.value(), cv = c.value();
  const Tensor<B> sg = gv.sigmoid(), tg = gv.narrow(1, 2 * H, H).tanh();
  const Tensor<B> i = sg.narrow(1, 0, H), f = sg.narrow(1, H, H), o = sg.narrow(1, 3 * H, H);
  const Tensor<B> c2 = f.mul(cv).add(i.mul(tg));
  const Tensor<B> tc = c2.tanh();
  Tensor<B> y = Tensor<B>::cat({o.mul(tc), c2}, 1);
  return record<B>("lstm_cell", std::move(y), {&gates, &c}, [i, f, o, tg, cv, tc, H](const Tensor<B>& g) {
    const Tensor<B> dh = g.narrow(1, 0, H), dc2 = g.narrow(1, H, H).add(dh.mul(o).mul(one_minus(tc.square())));
    const Tensor<B> di = dc2.mul(tg).mul(i.mul(one_minus(i)));
    const Tensor<B> df = dc2.mul(cv).mul(f.mul(one_minus(f)));
    const Tensor<B> dg = dc2.mul(i).mul(one_minus(tg.square()));
    const Tensor<B> d_o = dh.mul(tc).mul(o.mul(one_minus(o)));
    return Grads<B>{Tensor<B>::cat({di, df, dg, d_o}, 1), dc2.mul(f)};
  });
}

template <Backend B> Var<B> RnnOps<B>::gru_cell(const X& gi, const X& gh, const X& h) {
  KILN_CHECK(gi.defined() && gh.defined() && h.defined() && gi.dim() == 2 && gh.shape() == gi.shape() && h.dim() == 2 &&
                 gi.size(1) == 3 * h.size(1) && gi.size(0) == h.size(0),
             "gru_cell: gi {}, gh {} and h {} are not [N, 3H], [N, 3H] and [N, H]", shape_str(gi.shape()), shape_str(gh.shape()),
             shape_str(h.shape()));
  KILN_CHECK(gi.dtype() == gh.dtype() && gi.dtype() == h.dtype(), "gru_cell: gi {}, gh {} and h {} differ in dtype", gi.dtype(), gh.dtype(),
             h.dtype());
  const int64_t H = h.size(1);
  const Tensor<B> giv = gi.value(), ghv = gh.value(), hv = h.value();
  const Tensor<B> rz = giv.narrow(1, 0, 2 * H).add(ghv.narrow(1, 0, 2 * H)).sigmoid();
  const Tensor<B> r = rz.narrow(1, 0, H), z = rz.narrow(1, H, H), ghn = ghv.narrow(1, 2 * H, H);
  const Tensor<B> n = giv.narrow(1, 2 * H, H).add(r.mul(ghn)).tanh();
  Tensor<B> y = n.add(z.mul(hv.sub(n)));
  return record<B>("gru_cell", std::move(y), {&gi, &gh, &h}, [r, z, n, ghn, hv](const Tensor<B>& g) {
    const Tensor<B> dz = g.mul(hv.sub(n)).mul(z.mul(one_minus(z)));
    const Tensor<B> dn = g.mul(one_minus(z)).mul(one_minus(n.square()));
    const Tensor<B> dr = dn.mul(ghn).mul(r.mul(one_minus(r)));
    return Grads<B>{Tensor<B>::cat({dr, dz, dn}, 1), Tensor<B>::cat({dr, dz, dn.mul(r)}, 1), g.mul(z)};
  });
}

// Forward, per step t (in processing order): g = gi[t] + h W_hhᵀ; the cell (lstm_cell above); with a
// projection h' = (o·tanh c') W_hrᵀ; with lengths, where step t is past sequence n's end, the state
// keeps its old value and out[t] is 0. Backward walks the steps in reverse processing order carrying
// (dh, dc), the gradients of the state after the step: dh' = dh + dout[t] (inside the sequence; outside,
// dh and dc pass to the previous state unchanged), the cell's backward gives dgates[t], and the previous
// state's gradient is dgates W_hh (+ dc'·f). dW_hh = Σ_t dgatesᵀ h_prev and dW_hr = Σ_t dh'ᵀ (o·tanh c')
// are one GEMM each over all steps.
template <Backend B> typename RnnOps<B>::Scan RnnOps<B>::lstm_scan(const X& gi, const X& w_hh, const X& w_hr, const X& h0, const X& c0,
                                                                   const Tensor<B>& lengths, bool reverse) {
  static constexpr const char* op = "lstm_scan";
  const bool proj = w_hr.defined();
  const int64_t P = h0.defined() && h0.dim() == 2 ? h0.size(1) : 0;
  check_scan(op, gi, 4, w_hh, h0, P);
  const int64_t T = gi.size(0), N = gi.size(1), H = gi.size(2) / 4;
  KILN_CHECK(c0.defined() && c0.shape() == Shape({N, H}) && c0.dtype() == gi.dtype(), "{}: c0 {} is not [{}, {}] {} (gi {})", op,
             shape_str(c0.shape()), N, H, gi.dtype(), shape_str(gi.shape()));
  KILN_CHECK(proj ? w_hr.shape() == Shape({P, H}) && w_hr.dtype() == gi.dtype() : P == H, "{}: w_hr {} does not project [N, {}] to h0's {}",
             op, proj ? shape_str(w_hr.shape()) : "(none)", H, shape_str(h0.shape()));
  const bool masked = lengths.defined();
  const Tensor<B> giv = gi.value(), whh_t = w_hh.value().t(), whr_t = proj ? w_hr.value().t() : Tensor<B>();
  const size_t nT = static_cast<size_t>(T);
  std::vector<Tensor<B>> sg(nT), tg(nT), tc(nT), c_prev(nT), h_prev(nT), hp(nT), masks(nT), out(nT);
  Tensor<B> h = h0.value(), c = c0.value();
  for (int64_t k = 0; k < T; ++k) {
    const int64_t t = reverse ? T - 1 - k : k;
    const auto s = static_cast<size_t>(t);
    const Tensor<B> g = giv.select(0, t).add(h.matmul(whh_t));
    sg[s] = g.sigmoid();
    tg[s] = g.narrow(1, 2 * H, H).tanh();
    const Tensor<B> c2 = sg[s].narrow(1, H, H).mul(c).add(sg[s].narrow(1, 0, H).mul(tg[s]));
    tc[s] = c2.tanh();
    hp[s] = sg[s].narrow(1, 3 * H, H).mul(tc[s]);
    const Tensor<B> h2 = proj ? hp[s].matmul(whr_t) : hp[s];
    c_prev[s] = c;
    h_prev[s] = h;
    if (masked) {
      masks[s] = lengths.gt(Scalar(t));
      out[s] = Tensor<B>::where(masks[s], h2, Tensor<B>::scalar(Scalar(0.0), h2.dtype()));
      h = Tensor<B>::where(masks[s], h2, h);
      c = Tensor<B>::where(masks[s], c2, c);
    } else {
      out[s] = h2;
      h = h2;
      c = c2;
    }
  }
  Tensor<B> y = Tensor<B>::cat({Tensor<B>::stack(out, 0).reshape({-1}), h.reshape({-1}), c.reshape({-1})}, 0);
  Inputs<B> in;
  for (const X* v : {&gi, &w_hh, &w_hr, &h0, &c0}) in.add(*v);
  const Tensor<B> whh = w_hh.value(), whr = proj ? w_hr.value() : Tensor<B>();
  const Var<B> yv = record<B>(op, std::move(y), in.vars, [=](const Tensor<B>& gy) {
    const Tensor<B> dout = gy.narrow(0, 0, T * N * P).reshape({T, N, P});
    Tensor<B> dh = gy.narrow(0, T * N * P, N * P).reshape({N, P}), dc = gy.narrow(0, T * N * P + N * P, N * H).reshape({N, H});
    std::vector<Tensor<B>> dgates(nT), dhs(nT);
    const Tensor<B> zero = Tensor<B>::scalar(Scalar(0.0), gy.dtype());
    for (int64_t k = T - 1; k >= 0; --k) {
      const int64_t t = reverse ? T - 1 - k : k;
      const auto s = static_cast<size_t>(t);
      Tensor<B> dh2 = dh.add(dout.select(0, t)), dc2 = dc, dh_pass, dc_pass;
      if (masked) {
        dh2 = Tensor<B>::where(masks[s], dh2, zero);
        dc2 = Tensor<B>::where(masks[s], dc, zero);
        dh_pass = Tensor<B>::where(masks[s], zero, dh);
        dc_pass = Tensor<B>::where(masks[s], zero, dc);
      }
      dhs[s] = dh2;
      const Tensor<B> dhp = proj ? dh2.matmul(whr) : dh2;
      const Tensor<B> i = sg[s].narrow(1, 0, H), f = sg[s].narrow(1, H, H), o = sg[s].narrow(1, 3 * H, H);
      dc2 = dc2.add(dhp.mul(o).mul(one_minus(tc[s].square())));
      const Tensor<B> di = dc2.mul(tg[s]).mul(i.mul(one_minus(i)));
      const Tensor<B> df = dc2.mul(c_prev[s]).mul(f.mul(one_minus(f)));
      const Tensor<B> dg = dc2.mul(i).mul(one_minus(tg[s].square()));
      const Tensor<B> d_o = dhp.mul(tc[s]).mul(o.mul(one_minus(o)));
      dgates[s] = Tensor<B>::cat({di, df, dg, d_o}, 1);
      dh = dgates[s].matmul(whh);
      dc = dc2.mul(f);
      if (masked) {
        dh = dh.add(dh_pass);
        dc = dc.add(dc_pass);
      }
    }
    const Tensor<B> dG = Tensor<B>::stack(dgates, 0);  // [T, N, 4H]
    const Tensor<B> dG2 = dG.reshape({T * N, 4 * H});
    Grads<B> grads{dG, dG2.t().matmul(Tensor<B>::stack(h_prev, 0).reshape({T * N, P}))};
    if (proj) grads.push_back(Tensor<B>::stack(dhs, 0).reshape({T * N, P}).t().matmul(Tensor<B>::stack(hp, 0).reshape({T * N, H})));
    grads.push_back(dh);
    grads.push_back(dc);
    return grads;
  });
  return split_scan<B>(yv, T, N, P, H);
}

// GRU, per step t: gh = h W_hhᵀ + b_hh, h' = gru_cell(gi[t], gh, h) (above); lengths as the LSTM's.
// Backward: the cell's backward gives dgi[t] and dgh[t]; the previous state's gradient is
// dh'·z + dgh W_hh; dW_hh = Σ_t dghᵀ h_prev (one GEMM), db_hh = Σ_t,n dgh.
template <Backend B> typename RnnOps<B>::Scan RnnOps<B>::gru_scan(const X& gi, const X& w_hh, const X& b_hh, const X& h0,
                                                                  const Tensor<B>& lengths, bool reverse) {
  static constexpr const char* op = "gru_scan";
  const int64_t P = h0.defined() && h0.dim() == 2 ? h0.size(1) : 0;
  check_scan(op, gi, 3, w_hh, h0, P);
  const int64_t T = gi.size(0), N = gi.size(1), H = gi.size(2) / 3;
  KILN_CHECK(P == H, "{}: h0 {} is not [N, H = {}]", op, shape_str(h0.shape()), H);
  KILN_CHECK(!b_hh.defined() || (b_hh.shape() == Shape({3 * H}) && b_hh.dtype() == gi.dtype()), "{}: b_hh {} is not [{}] {}", op,
             shape_str(b_hh.shape()), 3 * H, gi.dtype());
  const bool masked = lengths.defined();
  const Tensor<B> giv = gi.value(), whh_t = w_hh.value().t();
  const size_t nT = static_cast<size_t>(T);
  std::vector<Tensor<B>> rz(nT), ns(nT), ghn(nT), h_prev(nT), masks(nT), out(nT);
  Tensor<B> h = h0.value();
  for (int64_t k = 0; k < T; ++k) {
    const int64_t t = reverse ? T - 1 - k : k;
    const auto s = static_cast<size_t>(t);
    Tensor<B> gh = h.matmul(whh_t);
    if (b_hh.defined()) gh = gh.add(b_hh.value());
    const Tensor<B> git = giv.select(0, t);
    rz[s] = git.narrow(1, 0, 2 * H).add(gh.narrow(1, 0, 2 * H)).sigmoid();
    ghn[s] = gh.narrow(1, 2 * H, H);
    ns[s] = git.narrow(1, 2 * H, H).add(rz[s].narrow(1, 0, H).mul(ghn[s])).tanh();
    const Tensor<B> h2 = ns[s].add(rz[s].narrow(1, H, H).mul(h.sub(ns[s])));
    h_prev[s] = h;
    if (masked) {
      masks[s] = lengths.gt(Scalar(t));
      out[s] = Tensor<B>::where(masks[s], h2, Tensor<B>::scalar(Scalar(0.0), h2.dtype()));
      h = Tensor<B>::where(masks[s], h2, h);
    } else {
      out[s] = h2;
      h = h2;
    }
  }
  Tensor<B> y = Tensor<B>::cat({Tensor<B>::stack(out, 0).reshape({-1}), h.reshape({-1})}, 0);
  Inputs<B> in;
  for (const X* v : {&gi, &w_hh, &b_hh, &h0}) in.add(*v);
  const Tensor<B> whh = w_hh.value();
  const bool has_b = b_hh.defined();
  const Var<B> yv = record<B>(op, std::move(y), in.vars, [=](const Tensor<B>& gy) {
    const Tensor<B> dout = gy.narrow(0, 0, T * N * H).reshape({T, N, H});
    Tensor<B> dh = gy.narrow(0, T * N * H, N * H).reshape({N, H});
    std::vector<Tensor<B>> dgi(nT), dgh(nT);
    const Tensor<B> zero = Tensor<B>::scalar(Scalar(0.0), gy.dtype());
    for (int64_t k = T - 1; k >= 0; --k) {
      const int64_t t = reverse ? T - 1 - k : k;
      const auto s = static_cast<size_t>(t);
      Tensor<B> dh2 = dh.add(dout.select(0, t)), dh_pass;
      if (masked) {
        dh2 = Tensor<B>::where(masks[s], dh2, zero);
        dh_pass = Tensor<B>::where(masks[s], zero, dh);
      }
      const Tensor<B> r = rz[s].narrow(1, 0, H), z = rz[s].narrow(1, H, H);
      const Tensor<B> dz = dh2.mul(h_prev[s].sub(ns[s])).mul(z.mul(one_minus(z)));
      const Tensor<B> dn = dh2.mul(one_minus(z)).mul(one_minus(ns[s].square()));
      const Tensor<B> dr = dn.mul(ghn[s]).mul(r.mul(one_minus(r)));
      dgi[s] = Tensor<B>::cat({dr, dz, dn}, 1);
      dgh[s] = Tensor<B>::cat({dr, dz, dn.mul(r)}, 1);
      dh = dh2.mul(z).add(dgh[s].matmul(whh));
      if (masked) dh = dh.add(dh_pass);
    }
    const Tensor<B> dGH = Tensor<B>::stack(dgh, 0).reshape({T * N, 3 * H});
    Grads<B> grads{Tensor<B>::stack(dgi, 0), dGH.t().matmul(Tensor<B>::stack(h_prev, 0).reshape({T * N, H}))};
    if (has_b) grads.push_back(dGH.sum({0}));
    grads.push_back(dh);
    return grads;
  });
  return split_scan<B>(yv, T, N, H, 0);
}

#define KILN_INST(B) template struct RnnOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
