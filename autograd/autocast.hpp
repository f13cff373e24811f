#pragma once
// Autocast: mixed precision for the forward pass, torch.autocast's contract (docs/mixed_precision.md).
//
//   {
//     kiln::autocast::Scope ac(DType::bf16);   // this thread, until the scope ends (nestable)
//     loss = nn::cross_entropy(model.forward(x), y);
//   }
//   loss.backward();                            // outside the scope, as PyTorch recommends
//
// While a scope with a low dtype (bf16 or f16) is active on the calling thread, each differentiable op
// applies to its floating inputs (f64 is never touched) the policy the table KILN_AUTOCAST_OPS below
// gives it, through one function, autocast::cast(Op::name, x):
//   * low:     cast to the low dtype; the op returns it and its kernels accumulate in f32.
//   * f32:     bf16/f16 cast up; the op returns f32.
//   * promote: (always, scope or not) two floating dtypes compute in the wider one (promote() below).
// Ops not in the table run in their input's dtype.
// Every cast is the differentiable Var::to, whose backward casts the gradient back: gradients reach
// f32 master parameters in f32. Scope(DType::f32) or Scope(..., false) turns autocast off inside
// (results bit-identical to no scope). A parameter (a leaf that requires grad) is cast once per
// outermost scope and the cast reused (PyTorch's cast cache): do not change parameters in place inside
// a scope.
#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::autocast {

// True when a scope with a low dtype (bf16/f16) is active on this thread.
bool enabled();
// The innermost scope's low dtype (f32 when none is active).
DType dtype();

class Scope {
 public:
  // dtype: bf16, f16, or f32 (= off); anything else is a kiln::Error. enabled = false turns autocast off
  // for the scope whatever the dtype.
  explicit Scope(DType dtype = DType::bf16, bool enabled = true);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  DType prev_;
};

namespace detail {
// While alive, this thread's parameter cast cache is a fresh, empty one; the previous one is restored
// at the end. A checkpointed segment (autograd/checkpoint.hpp) runs its forward, and again its
// recomputation, under one: the casts it makes are its own and never handed to code outside it.
class CastCacheScope {
 public:
  CastCacheScope();
  ~CastCacheScope();
  CastCacheScope(const CastCacheScope&) = delete;
  CastCacheScope& operator=(const CastCacheScope&) = delete;

 private:
  std::shared_ptr<void> saved_;
};
}  // namespace detail

// The policy table, like PyTorch's autocast op lists (docs/mixed_precision.md): X(op, policy). An op
// that applies a policy reads it from here through cast(Op::op, x); a new op adds one line.
// The op tables below keep one row per op (clang-format would reflow them).
// clang-format off
#define KILN_AUTOCAST_OPS(X)                                                                        \
  /* low: the products (Linear and the LM head through linear, conv1d through conv2d) */            \
  X(matmul, low) X(linear, low) X(conv2d, low) X(conv_transpose2d, low) X(attention, low)          \
  /* f32: normalisations, losses, reductions, exponentials */                                       \
  X(softmax, f32) X(log_softmax, f32) X(rms_norm, f32) X(layer_norm, f32) X(cross_entropy, f32)      \
  X(nll_loss, f32) X(binary_cross_entropy, f32) X(binary_cross_entropy_with_logits, f32)            \
  X(pointwise_loss, f32) X(cosine_similarity, f32) X(cosine_embedding_loss, f32) X(sum, f32)        \
  X(mean, f32) X(exp, f32) X(log, f32) X(log1p, f32) X(expm1, f32) X(rsqrt, f32) X(reciprocal, f32) \
  X(pow, f32) X(residual_stream, f32) /* the Attention-Residuals blocks (nn/attnres.cpp) */         \
  /* promote: binary elementwise ops on two floating dtypes (autograd/ops/elementwise.cpp) */        \
  X(binary, promote)
// clang-format on

enum class Policy { low, f32, promote };
#define KILN_AUTOCAST_ENUM(op, policy) op,
enum class Op { KILN_AUTOCAST_OPS(KILN_AUTOCAST_ENUM) };
#undef KILN_AUTOCAST_ENUM

// The table's entry for an op.
constexpr Policy policy(Op op) {
  switch (op) {
#define KILN_AUTOCAST_CASE(o, p) \
  case Op::o:                    \
    return Policy::p;
    KILN_AUTOCAST_OPS(KILN_AUTOCAST_CASE)
#undef KILN_AUTOCAST_CASE
  }
  return Policy::promote;
}
// The op's name in the table ("matmul").
const char* name(Op op);

// The one function the ops call: x as op computes with it under the active scope (the table's low or
// f32 policy; identity when autocast is off, for promote ops, and for f64 or integer inputs).
template <Backend B> KILN_API Var<B> cast(Op op, const Var<B>& x);
// The dtype cast(op, x) gives an x of dtype d, without casting: for an op that computes as the cast
// would without it (nn::cross_entropy on a backend that reads half logits).
KILN_API DType cast_dtype(Op op, DType d);
// The two casts the policies apply (identity when autocast is off or nothing needs casting).
template <Backend B> KILN_API Var<B> to_low(const Var<B>& x);  // f32/bf16/f16 -> the low dtype
template <Backend B> KILN_API Var<B> to_f32(const Var<B>& x);  // bf16/f16 -> f32
#define KILN_AUTOCAST_EXTERN(B)                      \
  extern template Var<B> cast<B>(Op, const Var<B>&); \
  extern template Var<B> to_low<B>(const Var<B>&);   \
  extern template Var<B> to_f32<B>(const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_AUTOCAST_EXTERN)
#undef KILN_AUTOCAST_EXTERN

// The dtype two floating operands compute in (PyTorch's promote_types on floats): the wider one; the
// two 16-bit types meet in f32.
constexpr DType promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;
}

// Dynamic loss scaling for f16 (torch.cuda.amp.GradScaler's rule and defaults): multiply the loss by
// scale() before backward, divide the gradients by it afterwards; a step whose gradients hold an inf or
// NaN is skipped and the scale multiplied by backoff; after `interval` good steps in a row the scale is
// multiplied by growth. kiln::fit applies it for precision f16 (train/loop.hpp), and tells an overflow
// from a divergence (docs/mixed_precision.md): a non-finite loss is never an overflow (the loss is
// computed before the scaling), nor are non-finite gradients once the scale is at or below min_scale
// (they are not finite at any scale); both go to FitOptions::on_nonfinite and leave the scale alone.
struct LossScaleOptions {
  double init = 65536.0;  // 2^16
  double growth = 2.0;
  double backoff = 0.5;
  int64_t interval = 2000;
  // The floor: from 2^16, 16 overflows in a row reach 1, where the gradients are not scaled at all;
  // if they still overflow, scaling cannot help (GradScaler has no floor and backs off forever).
  double min_scale = 1.0;
};
class GradScaler {
 public:
  explicit GradScaler(LossScaleOptions o = {});
  double scale() const { return scale_; }
  int64_t good_steps() const { return good_; }  // finite steps since the last growth or backoff
  // After each step: found_inf = the unscaled gradients were not all finite (the step was skipped).
  void update(bool found_inf);
  // Whether non-finite gradients at the current scale are an overflow to back off from (the scale is
  // above min_scale), rather than a divergence.
  bool can_back_off() const { return scale_ > o_.min_scale; }
  // The state a checkpoint keeps, and its restore.
  void set_state(double scale, int64_t good_steps);

 private:
  LossScaleOptions o_;
  double scale_;
  int64_t good_ = 0;
};

}  // namespace kiln::autocast
#pragma GCC visibility pop
