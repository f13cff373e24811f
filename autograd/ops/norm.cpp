// Normalisation ops (autograd/layer_ops.hpp): forward and backward side by side. rms_norm runs on the
// fused kernel (core/fused_norm.hpp); batch_norm and group_norm compute their statistics with Tensor
// ops and record one node each with the closed-form backward.
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/layer_ops.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_norm.hpp"

namespace kiln::autograd {

namespace {
// bf16/f16 inputs are normalised in f32 (DESIGN §2: f32 accumulation), the rest in their own dtype.
DType compute_dtype(DType d) { return d == DType::bf16 || d == DType::f16 ? DType::f32 : d; }

// What batch_norm's and group_norm's backward needs of their inputs x, weight, bias (either may be
// undefined): which need a gradient, and the dtypes their gradients go back in (cd, the compute
// dtype, for an absent parameter).
struct Affine {
  bool gx, gw, gb, has_w, has_b;
  DType xd, wd, bd;
};
template <Backend B> Affine affine(const Var<B>& x, const Var<B>& weight, const Var<B>& bias, DType cd) {
  const bool has_w = weight.defined(), has_b = bias.defined();
  return {needs_grad(x), has_w && needs_grad(weight), has_b && needs_grad(bias), has_w, has_b,
          x.dtype(),     has_w ? weight.dtype() : cd, has_b ? bias.dtype() : cd};
}
// The node's inputs: x, then weight and bias where defined.
template <Backend B> std::vector<const Var<B>*> affine_inputs(const Var<B>& x, const Var<B>& weight, const Var<B>& bias) {
  std::vector<const Var<B>*> ins{&x};
  if (weight.defined()) ins.push_back(&weight);
  if (bias.defined()) ins.push_back(&bias);
  return ins;
}
}  // namespace

// One recorded op on the fused kernel (core/fused_norm.hpp); backward saves x, w and rstd [rows].
template <Backend B> Var<B> NormOps<B>::rms_norm(const X& x_in, const X& weight, double eps) {
  const Var<B> x = autocast::cast(autocast::Op::rms_norm, x_in);
  KILN_CHECK(x.dim() >= 1, "rms_norm: input must have rank >= 1, got {}", shape_str(x.shape()));
  KILN_CHECK(!weight.defined() || weight.shape() == Shape{x.shape().back()}, "rms_norm: weight {} does not match input {}",
             shape_str(weight.defined() ? weight.shape() : Shape{}), shape_str(x.shape()));
  const Tensor<B> w = weight.defined() ? weight.value() : Tensor<B>();
  auto [y, rstd] = fused::rms_norm_forward(x.value(), w, eps);
  const Tensor<B> xv = x.value();
  auto backward = [xv, w, rstd = rstd](const Tensor<B>& g) {  // clang 14 (fuzz/) captures no structured binding
    auto [dx, dw] = fused::rms_norm_backward(xv, w, rstd, g);
    return Grads<B>{dx, dw};
  };
  if (weight.defined()) return record<B>("rms_norm", y, {&x, &weight}, backward);
  return record<B>("rms_norm", y, {&x},
                   [xv, rstd = rstd](const Tensor<B>& g) { return Grads<B>{fused::rms_norm_backward(xv, Tensor<B>(), rstd, g).first}; });
}

template <Backend B> Var<B> NormOps<B>::batch_norm(const X& x, const Tensor<B>& running_mean, const Tensor<B>& running_var, const X& weight,
                                                   const X& bias, bool training, double momentum, double eps) {
  KILN_CHECK(x.defined() && x.dim() >= 2, "batch_norm: input must have shape [N, C, *], got {}",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  KILN_CHECK(is_floating(x.dtype()), "batch_norm: input must be floating point, got {}", x.dtype());
  KILN_CHECK(eps >= 0, "batch_norm: eps must be >= 0, got {}", eps);
  const Shape& xs = x.shape();
  const int64_t C = xs[1];
  auto check_c = [&](const Shape& s, const char* what) {
    KILN_CHECK(s == Shape{C}, "batch_norm: {} should have shape [{}] (the channels of input {}), got {}", what, C, shape_str(xs),
               shape_str(s));
  };
  KILN_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must both be given or both be undefined");
  if (running_mean.defined()) {
    check_c(running_mean.shape(), "running_mean");
    check_c(running_var.shape(), "running_var");
    KILN_CHECK(is_floating(running_mean.dtype()) && is_floating(running_var.dtype()),
               "batch_norm: running_mean and running_var must be floating point, got {} and {}", running_mean.dtype(), running_var.dtype());
  }
  if (weight.defined()) check_c(weight.shape(), "weight");
  if (bias.defined()) check_c(bias.shape(), "bias");
  KILN_CHECK(training || running_mean.defined(), "batch_norm: running_mean and running_var must be given when not training");
  const int64_t n = xs[1] ? x.numel() / C : 0;  // values per channel
  KILN_CHECK(!training || n != 1, "batch_norm: Expected more than 1 value per channel when training, got input size {}", shape_str(xs));

  // Per-channel statistics have shape [1, C, 1, ...]; the reduced axes are all but 1.
  const DType cd = compute_dtype(x.dtype());
  Shape stat(xs.size(), 1);
  stat[1] = C;
  std::vector<int64_t> axes{0};
  for (int64_t a = 2; a < x.dim(); ++a) axes.push_back(a);
  const Tensor<B> xv = x.value().to(cd);
  Tensor<B> mean, invstd;
  if (training) {
    mean = xv.mean(axes, true);
    const Tensor<B> var = xv.sub(mean).square().mean(axes, true);  // biased: the normalisation's
    invstd = var.add(eps).rsqrt();
    if (running_mean.defined() && n > 0) {
      NoGrad ng;
      Tensor<B> rm = running_mean, rv = running_var;  // handles: the caller's storage is updated
      const double m = momentum;
      rm.copy_(rm.to(cd).mul(1 - m).add(mean.reshape({C}).mul(m)));
      rv.copy_(rv.to(cd).mul(1 - m).add(var.reshape({C}).mul(m * static_cast<double>(n) / static_cast<double>(n - 1))));
    }
  } else {
    mean = running_mean.to(cd).reshape(stat);
    invstd = running_var.to(cd).reshape(stat).add(eps).rsqrt();
  }
  const Tensor<B> w = weight.defined() ? weight.value().to(cd).reshape(stat) : Tensor<B>();
  const Tensor<B> scale = w.defined() ? invstd.mul(w) : invstd;  // y = x · scale + shift
  Tensor<B> shift = mean.mul(scale).neg();
  if (bias.defined()) shift = shift.add(bias.value().to(cd).reshape(stat));
  const Tensor<B> y = xv.mul(scale).add(shift).to(x.dtype());

  const std::vector<const Var<B>*> ins = affine_inputs(x, weight, bias);
  const Affine a = affine(x, weight, bias, cd);
  // dŵ = Σ g·x̂, db = Σ g (per channel); dx = scale · (g − db/n − x̂ · dŵ/n) in training (the batch
  // statistics depend on x), dx = scale · g in eval.
  auto backward = [xv, mean, invstd, scale, axes, C, n, training, a](const Tensor<B>& gout) {
    const auto [gx, gw, gb, has_w, has_b, xd, wd, bd] = a;
    const Tensor<B> g = gout.to(xv.dtype());
    const Tensor<B> xhat = (gw || (gx && training)) ? xv.sub(mean).mul(invstd) : Tensor<B>();
    const Tensor<B> dw = xhat.defined() ? g.mul(xhat).sum(axes, true) : Tensor<B>();
    const Tensor<B> db = (gb || (gx && training)) ? g.sum(axes, true) : Tensor<B>();
    Grads<B> out;
    if (!gx)
      out.emplace_back();
    else if (!training)
      out.push_back(g.mul(scale).to(xd));
    else {
      const double inv_n = 1.0 / static_cast<double>(n);
      out.push_back(g.sub(db.mul(inv_n)).sub(xhat.mul(dw.mul(inv_n))).mul(scale).to(xd));
    }
    if (has_w) out.push_back(gw ? dw.reshape({C}).to(wd) : Tensor<B>());
    if (has_b) out.push_back(gb ? db.reshape({C}).to(bd) : Tensor<B>());
    return out;
  };
  return record<B>("batch_norm", y, ins, std::move(backward));
}

template <Backend B> Var<B> NormOps<B>::group_norm(const X& x, int64_t num_groups, const X& weight, const X& bias, double eps) {
  KILN_CHECK(x.defined() && x.dim() >= 2, "group_norm: input must have shape [N, C, *], got {}",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  KILN_CHECK(is_floating(x.dtype()), "group_norm: input must be floating point, got {}", x.dtype());
  const Shape& xs = x.shape();
  const int64_t N = xs[0], C = xs[1], G = num_groups;
  KILN_CHECK(G >= 1 && C % G == 0,
             "group_norm: Expected number of channels in input to be divisible by num_groups, but got input of shape {} and "
             "num_groups={}",
             shape_str(xs), G);
  KILN_CHECK(eps >= 0, "group_norm: eps must be >= 0, got {}", eps);
  if (weight.defined())
    KILN_CHECK(weight.shape() == Shape{C}, "group_norm: weight should have shape [{}] (the channels of input {}), got {}", C, shape_str(xs),
               shape_str(weight.shape()));
  if (bias.defined())
    KILN_CHECK(bias.shape() == Shape{C}, "group_norm: bias should have shape [{}] (the channels of input {}), got {}", C, shape_str(xs),
               shape_str(bias.shape()));

  const DType cd = x.dtype() == DType::bf16 || x.dtype() == DType::f16 ? DType::f32 : x.dtype();
  int64_t S = 1;  // spatial positions
  for (size_t a = 2; a < xs.size(); ++a) S *= xs[a];
  const int64_t M = (C / G) * S;  // values per group
  const Shape grouped{N, G, M}, chan{N, C, S}, cstat{1, C, 1};
  const Tensor<B> xv = x.value().to(cd).reshape(grouped);
  const Tensor<B> mean = xv.mean({2}, true);  // [N, G, 1]
  const Tensor<B> invstd = xv.sub(mean).square().mean({2}, true).add(eps).rsqrt();
  Tensor<B> y = xv.sub(mean).mul(invstd).reshape(chan);
  const Tensor<B> w = weight.defined() ? weight.value().to(cd).reshape(cstat) : Tensor<B>();
  if (w.defined()) y = y.mul(w);
  if (bias.defined()) y = y.add(bias.value().to(cd).reshape(cstat));
  y = y.reshape(xs).to(x.dtype());

  const std::vector<const Var<B>*> ins = affine_inputs(x, weight, bias);
  const Affine a = affine(x, weight, bias, cd);
  // x̂ = (x − μ)·r per group; with ĝ = g·w: dx = r · (ĝ − mean(ĝ) − x̂ · mean(ĝ·x̂)) over each group,
  // dw = Σ_{n, s} g·x̂, db = Σ_{n, s} g.
  auto backward = [xv, mean, invstd, w, xs, grouped, chan, a](const Tensor<B>& gout) {
    const auto [gx, gw, gb, has_w, has_b, xd, wd, bd] = a;
    const Tensor<B> g = gout.to(xv.dtype()).reshape(chan);
    const Tensor<B> xhat = xv.sub(mean).mul(invstd);  // [N, G, M]
    Grads<B> out;
    if (gx) {
      const Tensor<B> gh = (w.defined() ? g.mul(w) : g).reshape(grouped);
      const Tensor<B> dx = gh.sub(gh.mean({2}, true)).sub(xhat.mul(gh.mul(xhat).mean({2}, true))).mul(invstd);
      out.push_back(dx.reshape(xs).to(xd));
    } else {
      out.emplace_back();
    }
    if (has_w) out.push_back(gw ? g.mul(xhat.reshape(chan)).sum({0, 2}).to(wd) : Tensor<B>());
    if (has_b) out.push_back(gb ? g.sum({0, 2}).to(bd) : Tensor<B>());
    return out;
  };
  return record<B>("group_norm", y, ins, std::move(backward));
}

#define KILN_INST(B) template struct NormOps<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
