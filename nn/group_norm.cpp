#include "kiln/nn/group_norm.hpp"

#include "kiln/autograd/record.hpp"

namespace kiln::nn {

namespace functional {

template <Backend B>
Var<B> group_norm(const Var<B>& x, int64_t num_groups, const Var<B>& weight, const Var<B>& bias, double eps) {
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
    KILN_CHECK(weight.shape() == Shape{C}, "group_norm: weight should have shape [{}] (the channels of input {}), got {}", C,
               shape_str(xs), shape_str(weight.shape()));
  if (bias.defined())
    KILN_CHECK(bias.shape() == Shape{C}, "group_norm: bias should have shape [{}] (the channels of input {}), got {}", C,
               shape_str(xs), shape_str(bias.shape()));

  const DType cd = x.dtype() == DType::bf16 || x.dtype() == DType::f16 ? DType::f32 : x.dtype();
  int64_t S = 1;  // spatial positions
  for (size_t a = 2; a < xs.size(); ++a) S *= xs[a];
  const int64_t M = (C / G) * S;                                      // values per group
  const Shape grouped{N, G, M}, chan{N, C, S}, cstat{1, C, 1};
  const Tensor<B> xv = x.value().to(cd).reshape(grouped);
  const Tensor<B> mean = xv.mean({2}, true);                  // [N, G, 1]
  const Tensor<B> invstd = xv.sub(mean).square().mean({2}, true).add(eps).rsqrt();
  Tensor<B> y = xv.sub(mean).mul(invstd).reshape(chan);
  const Tensor<B> w = weight.defined() ? weight.value().to(cd).reshape(cstat) : Tensor<B>();
  if (w.defined()) y = y.mul(w);
  if (bias.defined()) y = y.add(bias.value().to(cd).reshape(cstat));
  y = y.reshape(xs).to(x.dtype());

  std::vector<const Var<B>*> ins{&x};
  if (weight.defined()) ins.push_back(&weight);
  if (bias.defined()) ins.push_back(&bias);
  const bool gx = autograd::needs_grad(x), gw = weight.defined() && autograd::needs_grad(weight),
             gb = bias.defined() && autograd::needs_grad(bias);
  const DType xd = x.dtype(), wd = weight.defined() ? weight.dtype() : cd, bd = bias.defined() ? bias.dtype() : cd;
  const bool has_w = weight.defined(), has_b = bias.defined();
  // x̂ = (x − μ)·r per group; with ĝ = g·w: dx = r · (ĝ − mean(ĝ) − x̂ · mean(ĝ·x̂)) over each group,
  // dw = Σ_{n, s} g·x̂, db = Σ_{n, s} g.
  auto backward = [xv, mean, invstd, w, xs, grouped, chan, C, gx, gw, gb, xd, wd, bd, has_w, has_b](const Tensor<B>& gout) {
    const Tensor<B> g = gout.to(xv.dtype()).reshape(chan);
    const Tensor<B> xhat = xv.sub(mean).mul(invstd);  // [N, G, M]
    autograd::Grads<B> out;
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
  return autograd::record<B>("group_norm", y, ins, std::move(backward));
}

}  // namespace functional

template <Backend B> GroupNorm<B>::GroupNorm(GroupNormOptions o) : o_(o) {
  KILN_CHECK(o.num_groups >= 1 && o.num_channels >= 1, "GroupNorm: num_groups and num_channels must be >= 1, got {} and {}",
             o.num_groups, o.num_channels);
  KILN_CHECK(o.num_channels % o.num_groups == 0, "GroupNorm: num_channels must be divisible by num_groups, got {} and {}",
             o.num_channels, o.num_groups);
  KILN_CHECK(o.eps >= 0, "GroupNorm: eps must be >= 0, got {}", o.eps);
  KILN_CHECK(is_floating(o.dtype), "GroupNorm: dtype must be floating point, got {}", o.dtype);
  if (o.affine) {
    w_ = this->register_parameter("weight", Tensor<B>::ones({o.num_channels}, o.dtype));
    b_ = this->register_parameter("bias", Tensor<B>::zeros({o.num_channels}, o.dtype));
  }
}

template <Backend B> Var<B> GroupNorm<B>::forward(const Var<B>& x) const {
  KILN_CHECK(x.dim() >= 2 && x.size(1) == o_.num_channels, "GroupNorm: input {} should have shape [N, {}, *] (num_channels={})",
             shape_str(x.shape()), o_.num_channels, o_.num_channels);
  return functional::group_norm<B>(x, o_.num_groups, w_, b_, o_.eps);
}

#define KILN_INST(B)                                                                                          \
  template Var<B> functional::group_norm<B>(const Var<B>&, int64_t, const Var<B>&, const Var<B>&, double); \
  template class GroupNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
