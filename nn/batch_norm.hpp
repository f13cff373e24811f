#pragma once
// Batch normalisation over the channel axis (axis 1), as torch.nn.BatchNorm1d/2d and F.batch_norm.
// # Shapes
//   BatchNorm1d: x [N, C] or [N, C, L] -> same;  BatchNorm2d: x [N, C, H, W] -> same
//   weight, bias, running_mean, running_var [C]; num_batches_tracked [] (i64)
// Training: y = (x − mean) / sqrt(var + eps) · w + b with the batch's mean and *biased* variance over
// every axis but 1; the running statistics move towards the batch's mean and *unbiased* variance:
//   running = (1 − momentum) · running + momentum · batch
// (momentum = nullopt: the cumulative average, momentum = 1 / num_batches_tracked, PyTorch's None).
// Eval: the running statistics replace the batch's (when track_running_stats; else the batch's again).
// Backward is one recorded op with the closed-form gradient (per channel sums over the reduced axes),
// saving x, the per-channel mean and 1/std, never an x-sized intermediate.
#include <optional>

#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

namespace functional {
// F.batch_norm: x [N, C, *]; running_mean/running_var [C] or both undefined; weight/bias [C] or
// undefined. training: normalise with the batch statistics and, when the running tensors are given,
// update them in place (running_var with the unbiased variance). Not training: normalise with the
// running statistics (which must then be given). Differentiable in x, weight and bias.
template <Backend B> KILN_API Var<B> batch_norm(const Var<B>& x, const Tensor<B>& running_mean, const Tensor<B>& running_var,
                                                const Var<B>& weight, const Var<B>& bias, bool training, double momentum = 0.1,
                                                double eps = 1e-5);
}  // namespace functional

struct BatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative moving average (PyTorch's momentum=None)
  bool affine = true;                    // parameters "weight" (ones) and "bias" (zeros)
  bool track_running_stats = true;       // buffers "running_mean", "running_var", "num_batches_tracked"
  DType dtype = DType::f32;
};

// The shared body of BatchNorm1d and BatchNorm2d (PyTorch's _BatchNorm); they differ in the ranks accepted.
template <Backend B> class BatchNorm : public Module<B> {
 public:
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const BatchNormOptions& options() const { return o_; }
  // Undefined when affine (weight, bias) or track_running_stats (the buffers) is off.
  const Var<B>& weight() const { return w_; }
  const Var<B>& bias() const { return b_; }
  // The buffers as they are now (after any Module::to, which converts running_mean/var).
  const Tensor<B>& running_mean() const { return stat("running_mean"); }
  const Tensor<B>& running_var() const { return stat("running_var"); }
  const Tensor<B>& num_batches_tracked() const { return stat("num_batches_tracked"); }
  void reset_running_stats();  // mean 0, var 1, count 0
  void reset_parameters();     // the running stats, and weight 1, bias 0

 protected:
  BatchNorm(BatchNormOptions o, const char* name, int64_t min_rank, int64_t max_rank);

 private:
  BatchNormOptions o_;
  const char* name_;
  int64_t min_rank_, max_rank_;
  Var<B> w_, b_;
  const Tensor<B>& stat(const char* name) const;  // the buffer, or an undefined tensor without running stats
};

template <Backend B> class BatchNorm1d : public BatchNorm<B> {
 public:
  explicit BatchNorm1d(BatchNormOptions o) : BatchNorm<B>(o, "BatchNorm1d", 2, 3) {}
};

template <Backend B> class BatchNorm2d : public BatchNorm<B> {
 public:
  explicit BatchNorm2d(BatchNormOptions o) : BatchNorm<B>(o, "BatchNorm2d", 4, 4) {}
};

#define KILN_EXTERN(B) extern template class BatchNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
