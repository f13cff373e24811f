#include "kiln/nn/batch_norm.hpp"

#include "kiln/autograd/record.hpp"

namespace kiln::nn {

namespace {
// bf16/f16 inputs are normalised in f32 (DESIGN §2: f32 accumulation), the rest in their own dtype.
DType compute_dtype(DType d) { return d == DType::bf16 || d == DType::f16 ? DType::f32 : d; }
}  // namespace

namespace functional {

template <Backend B>
Var<B> batch_norm(const Var<B>& x, const Tensor<B>& running_mean, const Tensor<B>& running_var, const Var<B>& weight,
                  const Var<B>& bias, bool training, double momentum, double eps) {
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
               "batch_norm: running_mean and running_var must be floating point, got {} and {}", running_mean.dtype(),
               running_var.dtype());
  }
  if (weight.defined()) check_c(weight.shape(), "weight");
  if (bias.defined()) check_c(bias.shape(), "bias");
  KILN_CHECK(training || running_mean.defined(), "batch_norm: running_mean and running_var must be given when not training");
  const int64_t n = xs[1] ? x.numel() / C : 0;  // values per channel
  KILN_CHECK(!training || n != 1, "batch_norm: Expected more than 1 value per channel when training, got input size {}",
             shape_str(xs));

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
  const Tensor<B> scale = w.defined() ? invstd.mul(w) : invstd;                 // y = x · scale + shift
  Tensor<B> shift = mean.mul(scale).neg();
  if (bias.defined()) shift = shift.add(bias.value().to(cd).reshape(stat));
  const Tensor<B> y = xv.mul(scale).add(shift).to(x.dtype());

  std::vector<const Var<B>*> ins{&x};
  if (weight.defined()) ins.push_back(&weight);
  if (bias.defined()) ins.push_back(&bias);
  const bool gx = autograd::needs_grad(x), gw = weight.defined() && autograd::needs_grad(weight),
             gb = bias.defined() && autograd::needs_grad(bias);
  const DType xd = x.dtype(), wd = weight.defined() ? weight.dtype() : cd, bd = bias.defined() ? bias.dtype() : cd;
  const bool has_w = weight.defined(), has_b = bias.defined();
  // dŵ = Σ g·x̂, db = Σ g (per channel); dx = scale · (g − db/n − x̂ · dŵ/n) in training (the batch
  // statistics depend on x), dx = scale · g in eval.
  auto backward = [xv, mean, invstd, scale, axes, C, n, training, gx, gw, gb, xd, wd, bd, has_w, has_b](const Tensor<B>& gout) {
    const Tensor<B> g = gout.to(xv.dtype());
    const Tensor<B> xhat = (gw || (gx && training)) ? xv.sub(mean).mul(invstd) : Tensor<B>();
    const Tensor<B> dw = xhat.defined() ? g.mul(xhat).sum(axes, true) : Tensor<B>();
    const Tensor<B> db = (gb || (gx && training)) ? g.sum(axes, true) : Tensor<B>();
    autograd::Grads<B> out;
    if (!gx) out.emplace_back();
    else if (!training) out.push_back(g.mul(scale).to(xd));
    else {
      const double inv_n = 1.0 / static_cast<double>(n);
      out.push_back(g.sub(db.mul(inv_n)).sub(xhat.mul(dw.mul(inv_n))).mul(scale).to(xd));
    }
    if (has_w) out.push_back(gw ? dw.reshape({C}).to(wd) : Tensor<B>());
    if (has_b) out.push_back(gb ? db.reshape({C}).to(bd) : Tensor<B>());
    return out;
  };
  return autograd::record<B>("batch_norm", y, ins, std::move(backward));
}

}  // namespace functional

template <Backend B>
BatchNorm<B>::BatchNorm(BatchNormOptions o, const char* name, int64_t min_rank, int64_t max_rank)
    : o_(o), name_(name), min_rank_(min_rank), max_rank_(max_rank) {
  KILN_CHECK(o.num_features >= 1, "{}: num_features must be >= 1, got {}", name, o.num_features);
  KILN_CHECK(o.eps >= 0, "{}: eps must be >= 0, got {}", name, o.eps);
  KILN_CHECK(is_floating(o.dtype), "{}: dtype must be floating point, got {}", name, o.dtype);
  if (o.affine) {
    w_ = this->register_parameter("weight", Tensor<B>::ones({o.num_features}, o.dtype));
    b_ = this->register_parameter("bias", Tensor<B>::zeros({o.num_features}, o.dtype));
  }
  if (o.track_running_stats) {
    this->register_buffer("running_mean", Tensor<B>::zeros({o.num_features}, o.dtype));
    this->register_buffer("running_var", Tensor<B>::ones({o.num_features}, o.dtype));
    this->register_buffer("num_batches_tracked", Tensor<B>::zeros({}, DType::i64));
  }
}

template <Backend B> const Tensor<B>& BatchNorm<B>::stat(const char* name) const {
  static const Tensor<B> none;
  return o_.track_running_stats ? this->buffer(name) : none;
}

template <Backend B> void BatchNorm<B>::reset_running_stats() {
  if (!o_.track_running_stats) return;
  NoGrad ng;
  Tensor<B> m = running_mean(), v = running_var(), c = num_batches_tracked();
  m.fill_(0);
  v.fill_(1);
  c.fill_(0);
}

template <Backend B> void BatchNorm<B>::reset_parameters() {
  reset_running_stats();
  if (!o_.affine) return;
  NoGrad ng;
  Tensor<B> w = w_.value(), b = b_.value();
  w.fill_(1);
  b.fill_(0);
}

template <Backend B> Var<B> BatchNorm<B>::forward(const Var<B>& x) const {
  KILN_CHECK(x.dim() >= min_rank_ && x.dim() <= max_rank_, "{}: expected {} input (got {}D input {})", name_,
             min_rank_ == max_rank_ ? fmt::format("{}D", min_rank_) : fmt::format("{}D or {}D", min_rank_, max_rank_), x.dim(),
             shape_str(x.shape()));
  KILN_CHECK(x.size(1) == o_.num_features, "{}: input {} has {} channels, the layer has num_features={}", name_,
             shape_str(x.shape()), x.size(1), o_.num_features);
  const bool training = this->is_training();
  double factor = o_.momentum.value_or(0.0);
  if (training && o_.track_running_stats) {
    // Counted before the update, so the cumulative average's first factor is 1 (as PyTorch).
    Tensor<B> c = num_batches_tracked();
    c.add_(Scalar(int64_t{1}));
    if (!o_.momentum) factor = 1.0 / static_cast<double>(c.template item<int64_t>());
  }
  // Eval without running stats normalises with the batch's statistics (PyTorch's bn_training).
  const bool use_batch = training || !o_.track_running_stats;
  const bool pass_running = !training || o_.track_running_stats;
  return functional::batch_norm<B>(x, pass_running ? running_mean() : Tensor<B>(), pass_running ? running_var() : Tensor<B>(), w_, b_,
                                   use_batch, factor, o_.eps);
}

#define KILN_INST(B)                                                                                                   \
  template Var<B> functional::batch_norm<B>(const Var<B>&, const Tensor<B>&, const Tensor<B>&, const Var<B>&, const Var<B>&, \
                                            bool, double, double);                                                     \
  template class BatchNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
