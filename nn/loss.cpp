#include "kiln/nn/loss.hpp"

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"
#include "kiln/core/fused_loss.hpp"

namespace kiln::nn {

template <Backend B> Var<B> cross_entropy(const Var<B>& logits_in, const Tensor<B>& targets, CrossEntropyOptions o) {
  const Var<B> logits = autocast::to_f32(logits_in);  // autocast: the loss runs in f32
  KILN_CHECK(logits.dim() >= 1, "cross_entropy: logits must have rank >= 1, got {}", shape_str(logits.shape()));
  KILN_CHECK(is_integral(targets.dtype()), "cross_entropy: targets must be i32 or i64, got {} (shape {})", targets.dtype(),
             shape_str(targets.shape()));
  const int64_t C = logits.shape().back();
  Shape rows(logits.shape().begin(), logits.shape().end() - 1);
  KILN_CHECK(targets.shape() == rows, "cross_entropy: logits {} need targets of shape {}, got {}", shape_str(logits.shape()),
             shape_str(rows), shape_str(targets.shape()));
  KILN_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got {}",
             o.label_smoothing);
  const Tensor<B> t = targets.reshape({-1}).to(DType::i64);
  const Tensor<B> keep = t.ne(o.ignore_index);
  // The targets' check and the count of kept rows read back together: one wait for a device.
  int64_t kept = 0;
  if (t.numel()) {
    const Tensor<B> bad = keep.logical_and(t.lt(0).logical_or(t.ge(C)));
    const std::vector<int64_t> counts = Tensor<B>::stack({bad.sum().to(DType::i64), keep.sum().to(DType::i64)}).template to_vector<int64_t>();
    KILN_CHECK(counts[0] == 0, "cross_entropy: target values must be in [0, {}) or ignore_index {}; got min {} max {}", C,
               o.ignore_index, item<int64_t>(t.min()), item<int64_t>(t.max()));
    kept = counts[1];
  }
  // One recorded op on the fused kernel (core/fused_loss.hpp): backward keeps the logits and lse [N],
  // never the [N, C] log-probabilities.
  const Var<B> x = logits.reshape({-1, C});
  const Tensor<B> xv = x.value();
  auto [rows_loss, lse] = fused::cross_entropy_forward(xv, t, o.ignore_index, o.label_smoothing);
  const int64_t ignore = o.ignore_index;
  const double smoothing = o.label_smoothing;
  // lse = lse: clang 14 (fuzz/) captures no structured binding by name.
  const Var<B> loss =
      autograd::record<B>("cross_entropy", rows_loss.to(logits.dtype()), {&x}, [xv, lse = lse, t, ignore, smoothing](const Tensor<B>& g) {
        return autograd::Grads<B>{fused::cross_entropy_backward(xv, lse, t, g, ignore, smoothing)};
      });
  return loss.sum().div(static_cast<double>(kept));
}

template <Backend B> Var<B> mse_loss(const Var<B>& a, const Var<B>& b) { return (a - b).square().mean(); }

#define KILN_INST(B)                                                                          \
  template Var<B> cross_entropy<B>(const Var<B>&, const Tensor<B>&, CrossEntropyOptions);     \
  template Var<B> mse_loss<B>(const Var<B>&, const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
