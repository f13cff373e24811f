#include "kiln/nn/batch_norm.hpp"

#include "kiln/autograd/layer_ops.hpp"

namespace kiln::nn {

namespace functional {

template <Backend B> Var<B> batch_norm(const Var<B>& x, const Tensor<B>& running_mean, const Tensor<B>& running_var, const Var<B>& weight,
                                       const Var<B>& bias, bool training, double momentum, double eps) {
  return autograd::NormOps<B>::batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps);
}

}  // namespace functional

template <Backend B> BatchNorm<B>::BatchNorm(BatchNormOptions o, const char* name, int64_t min_rank, int64_t max_rank)
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
  KILN_CHECK(x.size(1) == o_.num_features, "{}: input {} has {} channels, the layer has num_features={}", name_, shape_str(x.shape()),
             x.size(1), o_.num_features);
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

#define KILN_INST(B)                                                                                                                       \
  template Var<B> functional::batch_norm<B>(const Var<B>&, const Tensor<B>&, const Tensor<B>&, const Var<B>&, const Var<B>&, bool, double, \
                                            double);                                                                                       \
  template class BatchNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
