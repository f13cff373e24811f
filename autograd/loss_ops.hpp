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
//
//   linear_cross_entropy(h [N, D], w [C, D], t i64 [N])   the mean over kept rows of cross_entropy(h·wᵀ, t),
//       without the [N, C] logits: rows in chunks of `chunk_rows`, each chunk's logits made, reduced to
//       its rows' losses and, when a gradient is wanted, turned at once into dlogits (each row's, for a
//       gradient of 1 on its loss) and into dh and a running dw (dlogits·w, dlogitsᵀ·h), then dropped.
//       The node keeps dh [N, D] and dw [C, D] (f32 for half inputs) and scales them by the upstream
//       gradient over kept. `kept` (the count of rows whose target is not ignore_index, > 0) comes
//       from the caller, which has checked the targets.
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
  // The scalar mean loss in loss_dtype (none: h's dtype); h and w of one float dtype, chunk_rows > 0.
  static X linear_cross_entropy(const X& h, const X& w, const Tensor<B>& targets, int64_t kept, int64_t ignore_index,
                                double label_smoothing, int64_t chunk_rows, std::optional<DType> loss_dtype = std::nullopt);
  // p in [0, 1] (a kiln::Error names the offending range otherwise), y the same shape as p.
  static X binary_cross_entropy(const X& p, const X& y, const Tensor<B>& weight);
  static X binary_cross_entropy_with_logits(const X& x, const X& y, const Tensor<B>& weight, const Tensor<B>& pos_weight);
};

// The rows per chunk linear_cross_entropy takes for N rows and chunk_rows > 0: chunks of equal size,
// each at most chunk_rows (no small last one, whose products would run slower).
inline int64_t balanced_chunk_rows(int64_t N, int64_t chunk_rows) {
  const int64_t chunks = (N + chunk_rows - 1) / chunk_rows;
  return chunks > 0 ? (N + chunks - 1) / chunks : chunk_rows;
}

#define KILN_LOSS_OPS_EXTERN(B) extern template struct LossOps<B>;
KILN_FOR_EACH_BACKEND(KILN_LOSS_OPS_EXTERN)
#undef KILN_LOSS_OPS_EXTERN

}  // namespace kiln::autograd
#pragma GCC visibility pop
