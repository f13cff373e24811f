#pragma once
// Differentiable loss ops whose gradient has a closed form that a composition of Var ops would get
// wrong or waste memory on; bodies (forward and backward side by side) in autograd/ops/loss.cpp.
// Each returns the unreduced loss (per row for cross_entropy, elementwise for the others); nn/loss.hpp
// checks the targets, reduces it and composes the other losses from Var ops. weight and pos_weight are
// constants (no gradient) that must broadcast to the input's shape.
//
//   cross_entropy(x [N, C], t i64 [N])       ℓ_n = lse(x_n) − (1 − s)·x_n[t_n] − s·mean(x_n), 0 where t_n = ignore
//       dx_n = softmax(x_n) − (1 − s)·onehot(t_n) − s/C (0 in ignored rows), on the fused kernel
//       (core/fused_loss.hpp); the node keeps the logits and lse [N], never the [N, C] log-probabilities.
//   binary_cross_entropy(p, y, w)            ℓ = −w·(y·max(log p, −100) + (1 − y)·max(log(1 − p), −100))
//       dp = w·(p − y) / max(p·(1 − p), 1e−12f)      dy = w·(log(1 − p) − log p)  (unclamped: ±inf at p = 0, 1)
//   binary_cross_entropy_with_logits(x, y, w, pw)   with l = 1 + (pw − 1)·y, the stable softplus
//       ℓ = w·((1 − y)·x + l·(log(e^−m + e^(−x−m)) + m)),  m = max(−x, 0)
//       dx = w·(l·σ(x) − pw·y)                           dy = w·(log σ(−x) − pw·log σ(x))
// (PyTorch 1.13's formulas, pw = 1 when pos_weight is undefined.) Under autocast both run in f32.
#include <optional>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::autograd {

template <Backend B> struct LossOps {
  using X = Var<B>;
  // logits [N, C], targets i64 [N] in [0, C) or ignore_index (the caller checks the values); the
  // per-row loss [N] in loss_dtype (none: the logits' dtype), the logits' gradient in theirs.
  static X cross_entropy(const X& logits, const Tensor<B>& targets, int64_t ignore_index, double label_smoothing,
                         std::optional<DType> loss_dtype = std::nullopt);
  // p in [0, 1] (a kiln::Error names the offending range otherwise), y the same shape as p.
  static X binary_cross_entropy(const X& p, const X& y, const Tensor<B>& weight);
  static X binary_cross_entropy_with_logits(const X& x, const X& y, const Tensor<B>& weight, const Tensor<B>& pos_weight);
};

#define KILN_LOSS_OPS_EXTERN(B) extern template struct LossOps<B>;
KILN_FOR_EACH_BACKEND(KILN_LOSS_OPS_EXTERN)
#undef KILN_LOSS_OPS_EXTERN

}  // namespace kiln::autograd
#pragma GCC visibility pop
