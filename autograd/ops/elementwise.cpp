// Elementwise ops: forward and backward side by side. Shapes: unary ops map x [*] -> y [*];
// binary ops broadcast a [*a], b [*b] -> y [broadcast(*a, *b)], and each input's gradient is
// summed back to its own shape (sum_to).
#include <cmath>

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> using T = Tensor<B>;
// g summed to `shape` when `on`, else undefined.
template <Backend B> T<B> reduce_to(bool on, const T<B>& g, const Shape& shape) { return on ? g.sum_to(shape) : T<B>(); }
// bool mask -> 0/1 in dtype d
template <Backend B> T<B> as(const T<B>& mask, DType d) { return mask.to(d); }
// Binary ops on two floating dtypes compute in the wider one (PyTorch's promotion: bf16 + f32 -> f32);
// false when a and b already agree (or are not both floating: the Tensor op reports the mismatch).
template <Backend B> bool promoted(const Var<B>& a, const Var<B>& b, Var<B>& a2, Var<B>& b2) {
  if (a.dtype() == b.dtype() || !is_floating(a.dtype()) || !is_floating(b.dtype())) return false;
  const DType d = autocast::promote(a.dtype(), b.dtype());  // autocast::Op::binary
  a2 = a.to(d);
  b2 = b.to(d);
  return true;
}
}  // namespace

// ------------------------------------------------------------------------------------------ unary
// y = -x                         dx = -dy
template <Backend B> Var<B> Elementwise<B>::neg(const X& x) {
  return record<B>("neg", x.value().neg(), {&x}, [](const T<B>& g) { return Grads<B>{g.neg()}; });
}

// y = |x|                        dx = dy * sign(x)       (0 at x = 0, like PyTorch)
template <Backend B> Var<B> Elementwise<B>::abs(const X& x) {
  return record<B>("abs", x.value().abs(), {&x}, [x = x.value()](const T<B>& g) { return Grads<B>{g.mul(x.sign())}; });
}

// y = x^2                        dx = dy * 2x
template <Backend B> Var<B> Elementwise<B>::square(const X& x) {
  return record<B>("square", x.value().square(), {&x}, [x = x.value()](const T<B>& g) { return Grads<B>{g.mul(x.mul(Scalar(2.0)))}; });
}

// y = e^x                        dx = dy * y             (saves the output only)
template <Backend B> Var<B> Elementwise<B>::exp(const X& x_in) {
  const X x = autocast::cast(autocast::Op::exp, x_in);
  T<B> y = x.value().exp();
  return record<B>("exp", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(y)}; });
}

// y = ln x                       dx = dy / x
template <Backend B> Var<B> Elementwise<B>::log(const X& x_in) {
  const X x = autocast::cast(autocast::Op::log, x_in);
  return record<B>("log", x.value().log(), {&x}, [x = x.value()](const T<B>& g) { return Grads<B>{g.div(x)}; });
}

// y = ln(1 + x)                  dx = dy / (1 + x)
template <Backend B> Var<B> Elementwise<B>::log1p(const X& x_in) {
  const X x = autocast::cast(autocast::Op::log1p, x_in);
  return record<B>("log1p", x.value().log1p(), {&x}, [x = x.value()](const T<B>& g) { return Grads<B>{g.div(x.add(Scalar(1.0)))}; });
}

// y = e^x - 1                    dx = dy * (y + 1)
template <Backend B> Var<B> Elementwise<B>::expm1(const X& x_in) {
  const X x = autocast::cast(autocast::Op::expm1, x_in);
  T<B> y = x.value().expm1();
  return record<B>("expm1", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(y.add(Scalar(1.0)))}; });
}

// y = sqrt(x)                    dx = dy / (2y)
template <Backend B> Var<B> Elementwise<B>::sqrt(const X& x) {
  T<B> y = x.value().sqrt();
  return record<B>("sqrt", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.div(y.mul(Scalar(2.0)))}; });
}

// y = x^(-1/2)                   dx = dy * -y^3 / 2
template <Backend B> Var<B> Elementwise<B>::rsqrt(const X& x_in) {
  const X x = autocast::cast(autocast::Op::rsqrt, x_in);
  T<B> y = x.value().rsqrt();
  return record<B>("rsqrt", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(y.square().mul(y)).mul(Scalar(-0.5))}; });
}

// y = 1/x                        dx = -dy * y^2
template <Backend B> Var<B> Elementwise<B>::reciprocal(const X& x_in) {
  const X x = autocast::cast(autocast::Op::reciprocal, x_in);
  T<B> y = x.value().reciprocal();
  return record<B>("reciprocal", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(y.square()).neg()}; });
}

// y = sin x                      dx = dy * cos x
template <Backend B> Var<B> Elementwise<B>::sin(const X& x) {
  return record<B>("sin", x.value().sin(), {&x}, [x = x.value()](const T<B>& g) { return Grads<B>{g.mul(x.cos())}; });
}

// y = cos x                      dx = -dy * sin x
template <Backend B> Var<B> Elementwise<B>::cos(const X& x) {
  return record<B>("cos", x.value().cos(), {&x}, [x = x.value()](const T<B>& g) { return Grads<B>{g.mul(x.sin()).neg()}; });
}

// y = tanh x                     dx = dy * (1 - y^2)
template <Backend B> Var<B> Elementwise<B>::tanh(const X& x) {
  T<B> y = x.value().tanh();
  return record<B>("tanh", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(y.square().neg().add(Scalar(1.0)))}; });
}

// y = 1 / (1 + e^-x)             dx = dy * y * (1 - y)
template <Backend B> Var<B> Elementwise<B>::sigmoid(const X& x) {
  T<B> y = x.value().sigmoid();
  return record<B>("sigmoid", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(y.mul(y.neg().add(Scalar(1.0))))}; });
}

// y = max(x, 0)                  dx = dy * [y > 0]
template <Backend B> Var<B> Elementwise<B>::relu(const X& x) {
  T<B> y = x.value().relu();
  return record<B>("relu", y, {&x}, [y](const T<B>& g) { return Grads<B>{g.mul(as<B>(y.gt(Scalar(0)), g.dtype()))}; });
}

// y = x * s, s = sigmoid(x)      dx = dy * s * (1 + x (1 - s))
template <Backend B> Var<B> Elementwise<B>::silu(const X& x) {
  return record<B>("silu", x.value().silu(), {&x}, [x = x.value()](const T<B>& g) {
    const T<B> s = x.sigmoid();
    return Grads<B>{g.mul(s.mul(x.mul(s.neg().add(Scalar(1.0))).add(Scalar(1.0))))};
  });
}

// exact:  y = x Φ(x)                           dx = dy * (Φ(x) + x φ(x)),  φ(x) = e^(-x²/2) / sqrt(2π)
//         Φ(x) is recovered as y / x (a Taylor series near 0): Tensor has no erf, and y is saved anyway.
// tanh:   y = x/2 (1 + t), t = tanh(u), u = k (x + c x³), k = sqrt(2/π), c = 0.044715
//                                              dx = dy * (0.5 (1 + t) + 0.5 x (1 - t²) k (1 + 3c x²))
template <Backend B> Var<B> Elementwise<B>::gelu(const X& x, bool tanh_approx) {
  T<B> y = x.value().gelu(tanh_approx);
  if (tanh_approx) {
    return record<B>("gelu_tanh", y, {&x}, [x = x.value()](const T<B>& g) {
      const double k = 0.79788456080286535588, c = 0.044715;
      const T<B> x2 = x.square();
      const T<B> t = x.add(x2.mul(x).mul(Scalar(c))).mul(Scalar(k)).tanh();
      const T<B> left = t.add(Scalar(1.0)).mul(Scalar(0.5));
      const T<B> right = x.mul(t.square().neg().add(Scalar(1.0))).mul(x2.mul(Scalar(3.0 * c)).add(Scalar(1.0))).mul(Scalar(0.5 * k));
      return Grads<B>{g.mul(left.add(right))};
    });
  }
  return record<B>("gelu", y, {&x}, [x = x.value(), y](const T<B>& g) {
    const double inv_sqrt_2pi = 0.39894228040143267794;  // φ(0)
    // Near 0, y / x would lose precision (and is 0/0 at 0): Φ(x) = 1/2 + φ(0) x + O(x³) is exact
    // to double precision for |x| < 1e-5.
    const T<B> small = x.abs().lt(Scalar(1e-5));
    const T<B> safe_x = T<B>::where(small, scalar_like<B>(1.0, x), x);
    const T<B> cdf = T<B>::where(small, x.mul(Scalar(inv_sqrt_2pi)).add(Scalar(0.5)), y.div(safe_x));
    const T<B> pdf = x.square().mul(Scalar(-0.5)).exp().mul(Scalar(inv_sqrt_2pi));
    return Grads<B>{g.mul(cdf.add(x.mul(pdf)))};
  });
}

// ------------------------------------------------------------------------------------------ binary
// y = a + b                      da = dy, db = dy         (summed to each shape)
template <Backend B> Var<B> Elementwise<B>::add(const X& a, const X& b) {
  if (X a2, b2; promoted<B>(a, b, a2, b2)) return add(a2, b2);
  const bool na = needs_grad(a), nb = needs_grad(b);
  return record<B>("add", a.value().add(b.value()), {&a, &b}, [na, nb, sa = a.shape(), sb = b.shape()](const T<B>& g) {
    return Grads<B>{reduce_to<B>(na, g, sa), reduce_to<B>(nb, g, sb)};
  });
}

// y = a - b                      da = dy, db = -dy
template <Backend B> Var<B> Elementwise<B>::sub(const X& a, const X& b) {
  if (X a2, b2; promoted<B>(a, b, a2, b2)) return sub(a2, b2);
  const bool na = needs_grad(a), nb = needs_grad(b);
  return record<B>("sub", a.value().sub(b.value()), {&a, &b}, [na, nb, sa = a.shape(), sb = b.shape()](const T<B>& g) {
    return Grads<B>{reduce_to<B>(na, g, sa), nb ? g.sum_to(sb).neg() : T<B>()};
  });
}

// y = a * b                      da = dy * b, db = dy * a  (each operand saved only if the other needs it)
template <Backend B> Var<B> Elementwise<B>::mul(const X& a, const X& b) {
  if (X a2, b2; promoted<B>(a, b, a2, b2)) return mul(a2, b2);
  const bool na = needs_grad(a), nb = needs_grad(b);
  return record<B>("mul", a.value().mul(b.value()), {&a, &b},
                   [na, nb, sa = a.shape(), sb = b.shape(), av = keep_if(nb, a.value()), bv = keep_if(na, b.value())](const T<B>& g) {
                     return Grads<B>{na ? g.mul(bv).sum_to(sa) : T<B>(), nb ? g.mul(av).sum_to(sb) : T<B>()};
                   });
}

// y = a / b                      da = dy / b, db = -dy * y / b
template <Backend B> Var<B> Elementwise<B>::div(const X& a, const X& b) {
  if (X a2, b2; promoted<B>(a, b, a2, b2)) return div(a2, b2);
  const bool na = needs_grad(a), nb = needs_grad(b);
  T<B> y = a.value().div(b.value());
  return record<B>("div", y, {&a, &b}, [na, nb, sa = a.shape(), sb = b.shape(), bv = b.value(), y = keep_if(nb, y)](const T<B>& g) {
    const T<B> ga = g.div(bv);
    return Grads<B>{na ? ga.sum_to(sa) : T<B>(), nb ? ga.mul(y).neg().sum_to(sb) : T<B>()};
  });
}

// y = a^b                        da = dy * b a^(b-1)   (0 where b = 0)
//                                db = dy * y ln a      (0 where a = 0 and b >= 0), as PyTorch
template <Backend B> Var<B> Elementwise<B>::pow(const X& a, const X& b) {
  if (X a2, b2; promoted<B>(a, b, a2, b2)) return pow(a2, b2);
  const bool na = needs_grad(a), nb = needs_grad(b);
  T<B> y = a.value().pow(b.value());
  return record<B>("pow", y, {&a, &b}, [na, nb, av = a.value(), bv = b.value(), y = keep_if(nb, y)](const T<B>& g) {
    const T<B> zero = scalar_like<B>(0.0, g);
    T<B> ga, gb;
    if (na) {
      const T<B> d = bv.mul(av.pow(bv.sub(Scalar(1.0))));
      ga = T<B>::where(bv.eq(Scalar(0)), zero, g.mul(d)).sum_to(av.shape());
    }
    if (nb) {
      const T<B> mask = av.eq(Scalar(0)).logical_and(bv.ge(Scalar(0)));
      gb = T<B>::where(mask, zero, g.mul(y.mul(av.log()))).sum_to(bv.shape());
    }
    return Grads<B>{ga, gb};
  });
}

namespace {
// Share of the gradient that goes to `a` in maximum(a, b) (first = gt) or minimum (first = lt):
// 1 where a wins, 1/2 on ties, 0 where b wins.
template <Backend B> T<B> win_share(const T<B>& a, const T<B>& b, bool is_max) {
  const T<B> wins = is_max ? a.gt(b) : a.lt(b);
  return as<B>(wins, a.dtype()).add(as<B>(a.eq(b), a.dtype()).mul(Scalar(0.5)));
}

template <Backend B> Var<B> extremum(const Var<B>& a, const Var<B>& b, bool is_max) {
  if (Var<B> a2, b2; promoted<B>(a, b, a2, b2)) return extremum<B>(a2, b2, is_max);
  const bool na = needs_grad(a), nb = needs_grad(b);
  T<B> y = is_max ? a.value().maximum(b.value()) : a.value().minimum(b.value());
  return record<B>(is_max ? "maximum" : "minimum", y, {&a, &b}, [na, nb, is_max, av = a.value(), bv = b.value()](const T<B>& g) {
    const T<B> share = win_share<B>(av, bv, is_max);
    return Grads<B>{na ? g.mul(share).sum_to(av.shape()) : T<B>(), nb ? g.mul(share.neg().add(Scalar(1.0))).sum_to(bv.shape()) : T<B>()};
  });
}
}  // namespace

// y = max(a, b)                  da = dy * [a > b] + dy/2 * [a = b], db = the rest
template <Backend B> Var<B> Elementwise<B>::maximum(const X& a, const X& b) { return extremum<B>(a, b, true); }
// y = min(a, b)                  da = dy * [a < b] + dy/2 * [a = b], db = the rest
template <Backend B> Var<B> Elementwise<B>::minimum(const X& a, const X& b) { return extremum<B>(a, b, false); }

// ------------------------------------------------------------------------------------------ with a scalar
// y = x + s                      dx = dy
template <Backend B> Var<B> Elementwise<B>::add_scalar(const X& x, Scalar s) {
  return record<B>("add", x.value().add(s), {&x}, [](const T<B>& g) { return Grads<B>{g}; });
}

// y = x * s                      dx = dy * s
template <Backend B> Var<B> Elementwise<B>::mul_scalar(const X& x, Scalar s) {
  return record<B>("mul", x.value().mul(s), {&x}, [s](const T<B>& g) { return Grads<B>{g.mul(s)}; });
}

// y = x / s                      dx = dy / s
template <Backend B> Var<B> Elementwise<B>::div_scalar(const X& x, Scalar s) {
  return record<B>("div", x.value().div(s), {&x}, [s](const T<B>& g) { return Grads<B>{g.div(s)}; });
}

// y = x^s                        dx = dy * s x^(s-1)    (0 when s = 0)
template <Backend B> Var<B> Elementwise<B>::pow_scalar(const X& x_in, Scalar s) {
  const X x = autocast::cast(autocast::Op::pow, x_in);
  return record<B>("pow", x.value().pow(s), {&x}, [s, x = x.value()](const T<B>& g) {
    if (s.to_double() == 0.0) return Grads<B>{g.zeros_like()};
    return Grads<B>{g.mul(x.pow(Scalar(s.to_double() - 1.0)).mul(s))};
  });
}

// y = s - x                      dx = -dy
template <Backend B> Var<B> Elementwise<B>::rsub_scalar(Scalar s, const X& x) {
  return record<B>("rsub", x.value().neg().add(s), {&x}, [](const T<B>& g) { return Grads<B>{g.neg()}; });
}

// y = s / x                      dx = -dy * y / x
template <Backend B> Var<B> Elementwise<B>::rdiv_scalar(Scalar s, const X& x) {
  T<B> y = scalar_like<B>(s, x.value()).div(x.value());
  return record<B>("rdiv", y, {&x}, [y, x = x.value()](const T<B>& g) { return Grads<B>{g.mul(y).div(x).neg()}; });
}

// y = max(x, s)                  dx = dy * ([x > s] + [x = s] / 2)
template <Backend B> Var<B> Elementwise<B>::maximum_scalar(const X& x, Scalar s) {
  return record<B>("maximum", x.value().maximum(s), {&x},
                   [s, x = x.value()](const T<B>& g) { return Grads<B>{g.mul(win_share<B>(x, scalar_like<B>(s, x), true))}; });
}

// y = min(x, s)                  dx = dy * ([x < s] + [x = s] / 2)
template <Backend B> Var<B> Elementwise<B>::minimum_scalar(const X& x, Scalar s) {
  return record<B>("minimum", x.value().minimum(s), {&x},
                   [s, x = x.value()](const T<B>& g) { return Grads<B>{g.mul(win_share<B>(x, scalar_like<B>(s, x), false))}; });
}

// y = min(max(x, lo), hi)        dx = dy * [lo <= x <= hi]   (inclusive, as PyTorch)
template <Backend B> Var<B> Elementwise<B>::clamp(const X& x, Scalar lo, Scalar hi) {
  return record<B>("clamp", x.value().clamp(lo, hi), {&x},
                   [lo, hi, x = x.value()](const T<B>& g) { return Grads<B>{g.mul(as<B>(x.ge(lo).logical_and(x.le(hi)), g.dtype()))}; });
}

// y = cond ? a : b               da = cond ? dy : 0, db = cond ? 0 : dy   (cond: bool, broadcasts)
template <Backend B> Var<B> Elementwise<B>::where(const Tensor<B>& cond, const X& a, const X& b) {
  if (X a2, b2; promoted<B>(a, b, a2, b2)) return where(cond, a2, b2);
  const bool na = needs_grad(a), nb = needs_grad(b);
  return record<B>(
      "where", T<B>::where(cond, a.value(), b.value()), {&a, &b}, [na, nb, cond, sa = a.shape(), sb = b.shape()](const T<B>& g) {
        const T<B> zero = scalar_like<B>(0.0, g);
        return Grads<B>{na ? T<B>::where(cond, g, zero).sum_to(sa) : T<B>(), nb ? T<B>::where(cond, zero, g).sum_to(sb) : T<B>()};
      });
}

// y = x.to(dtype)                dx = dy.to(x.dtype)     (no gradient to or from integer dtypes)
template <Backend B> Var<B> Elementwise<B>::to(const X& x, DType dtype) {
  if (dtype == x.dtype()) return x;
  const bool differentiable = is_floating(dtype) && is_floating(x.dtype());
  const X none;
  return record<B>("to", x.value().to(dtype), {differentiable ? &x : &none},
                   [from = x.dtype()](const T<B>& g) { return Grads<B>{g.to(from)}; });
}

#define KILN_INST(B) template struct Elementwise<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
