#pragma once
// Losses, with torch.nn.functional's names, arguments and semantics (PyTorch 1.13).
// cross_entropy: logits [N, C] (or [..., C]), targets integer [N] (or [...]) in [0, C) or ignore_index.
//   loss_i = (1 − ε)·(−log p_i[t_i]) + ε·mean_c(−log p_i[c]); mean over the non-ignored rows
//   (PyTorch semantics, label_smoothing ε; all rows ignored gives nan, as in PyTorch).
// mse: mean((a − b)²) with broadcasting.
//
// The others take a Reduction (PyTorch's `reduction=`): none (the elementwise loss, the input's
// shape), mean (default), sum; kl_div also batchmean (the sum over the first dimension's size).
// Input and target must have one shape (PyTorch broadcasts with a warning; kiln refuses). Weights are
// constants (no gradient) that broadcast to the input's shape (nll_loss: one per class, [C]).
//   binary_cross_entropy(p, y)          −w·(y·log p + (1 − y)·log(1 − p)), logs clamped at −100;
//                                        p in [0, 1]
//   binary_cross_entropy_with_logits(x, y)  the same on σ(x), computed stably from x, with pos_weight
//                                        pw (broadcast over the last dim): −w·(pw·y·log σ(x) + (1 − y)·log(1 − σ(x)))
//   nll_loss(x, t)                      x [N, C] / [N, C, d1, ...] / [C] log-probabilities, t integer
//                                        [N] / [N, d1, ...] / []: −w[t]·x[t], 0 where t == ignore_index;
//                                        mean = Σ −w[t]·x[t] / Σ w[t] over the kept elements (PyTorch)
//   l1_loss                              |x − y|
//   smooth_l1_loss(beta)                 0.5·d²/β where |d| < β, else |d| − 0.5·β  (β = 0: l1_loss)
//   huber_loss(delta)                    0.5·d² where |d| < δ, else δ·(|d| − 0.5·δ)  (δ > 0)
//   kl_div(x, y)                         x log-probabilities; y·(log y − x) (0 where y = 0), or with
//                                        log_target e^y·(y − x)
//   cosine_similarity(x1, x2, dim, eps)  Σ_dim (x1 / max(‖x1‖, eps))·(x2 / max(‖x2‖, eps)), broadcasting
//                                        (where ‖x‖ < eps the gradient treats the norm as the constant eps;
//                                        PyTorch 1.13's differs there: it is not the derivative of its value)
//   cosine_embedding_loss(x1, x2, y)     x1, x2 [N, D] or [D], y [N] or [] of ±1: 1 − cos where y = 1,
//                                        max(0, cos − margin) where y = −1 (cos with ‖·‖² + 1e-12)
// Each has a Module wrapper with PyTorch's name (BCELoss, ..., CosineSimilarity); weights are buffers
// (`weight`, `pos_weight`), as in torch.nn, so they follow Module::to and appear in the state dict.
#include <algorithm>
#include <optional>
#include <string_view>

#include "kiln/autograd/var.hpp"
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

template <Backend B> KILN_API Var<B> cross_entropy(const Var<B>& logits, const Tensor<B>& targets, CrossEntropyOptions o = {});

// cross_entropy(hidden · weightᵀ, targets) with the mean reduction, without the [N, C] logits: a language
// model's LM head and loss in one op (hidden [..., D], weight [C, D] as nn::Linear keeps it, targets
// [...]). Rows go through in chunks of chunk_rows (0: as many as keep a chunk's logits at
// kLinearCrossEntropyChunkElements, 2^25, i.e. 128 MiB in f32); the gradients are made chunk by chunk
// in the forward and kept (dhidden and dweight, the size of hidden and weight; dweight in f32 for
// bf16/f16 inputs), so the step runs the same three products as the composite and holds at most one
// chunk's logits and dlogits, where the composite keeps the [N, C] logits from the forward to the
// backward and makes their gradient there (a GPT-2 vocabulary at 8 x 1024 tokens: 1.65 GB each in
// f32). The values are the composite's up to the order of the sums over chunks
// (tests/nn/test_linear_cross_entropy.cpp). Under autocast the product runs in the matmul policy's
// dtype, as the composite's; the loss is f32 (f64 for f64 inputs) whatever the inputs' dtype.
struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  int64_t chunk_rows = 0;
};
inline constexpr int64_t kLinearCrossEntropyChunkElements = int64_t{1} << 25;
// Whether `rows` rows over `classes` classes make logits larger than one chunk: where the fusion saves
// memory (kiln train's and evaluate's automatic choice).
inline bool logits_exceed_chunk(int64_t rows, int64_t classes) { return rows * classes > kLinearCrossEntropyChunkElements; }
// The rows per chunk that chunk_rows gives over `classes` classes (0: the automatic count).
inline int64_t linear_cross_entropy_chunk(int64_t classes, int64_t chunk_rows) {
  return chunk_rows > 0 ? chunk_rows : std::max<int64_t>(1, kLinearCrossEntropyChunkElements / std::max<int64_t>(classes, 1));
}
template <Backend B> KILN_API Var<B> linear_cross_entropy(const Var<B>& hidden, const Var<B>& weight, const Tensor<B>& targets,
                                                          LinearCrossEntropyOptions o = {});
template <Backend B> KILN_API Var<B> mse_loss(const Var<B>& a, const Var<B>& b);

enum class Reduction { none, mean, sum, batchmean };
// "none", "mean", "sum", "batchmean" (PyTorch's strings); anything else is a kiln::Error listing them.
Reduction reduction_from_string(std::string_view name);
std::string_view reduction_name(Reduction r);

template <Backend B> struct BCELossOptions {
  Tensor<B> weight{};  // broadcasts to the input's shape; undefined: 1
  Reduction reduction = Reduction::mean;
};
template <Backend B> struct BCEWithLogitsLossOptions {
  Tensor<B> weight{};
  Reduction reduction = Reduction::mean;
  Tensor<B> pos_weight{};  // [C] for input [..., C] (any shape broadcasting to the input's); undefined: 1
};
template <Backend B> struct NLLLossOptions {
  Tensor<B> weight{};  // [C]; undefined: 1
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
};
struct SmoothL1LossOptions {
  Reduction reduction = Reduction::mean;
  double beta = 1.0;  // >= 0
};
struct HuberLossOptions {
  Reduction reduction = Reduction::mean;
  double delta = 1.0;  // > 0
};
struct KLDivLossOptions {
  Reduction reduction = Reduction::mean;  // PyTorch's default; batchmean is the KL divergence
  bool log_target = false;
};
struct CosineEmbeddingLossOptions {
  double margin = 0.0;  // in [-1, 1] as PyTorch advises; not enforced (PyTorch does not)
  Reduction reduction = Reduction::mean;
};

template <Backend B> KILN_API Var<B> binary_cross_entropy(const Var<B>& input, const Var<B>& target, BCELossOptions<B> o = {});
template <Backend B>
KILN_API Var<B> binary_cross_entropy_with_logits(const Var<B>& input, const Var<B>& target, BCEWithLogitsLossOptions<B> o = {});
template <Backend B> KILN_API Var<B> nll_loss(const Var<B>& input, const Tensor<B>& target, NLLLossOptions<B> o = {});
template <Backend B> KILN_API Var<B> l1_loss(const Var<B>& input, const Var<B>& target, Reduction reduction = Reduction::mean);
template <Backend B> KILN_API Var<B> smooth_l1_loss(const Var<B>& input, const Var<B>& target, SmoothL1LossOptions o = {});
template <Backend B> KILN_API Var<B> huber_loss(const Var<B>& input, const Var<B>& target, HuberLossOptions o = {});
template <Backend B> KILN_API Var<B> kl_div(const Var<B>& input, const Var<B>& target, KLDivLossOptions o = {});
template <Backend B> KILN_API Var<B> cosine_similarity(const Var<B>& x1, const Var<B>& x2, int64_t dim = 1, double eps = 1e-8);
template <Backend B>
KILN_API Var<B> cosine_embedding_loss(const Var<B>& x1, const Var<B>& x2, const Tensor<B>& target, CosineEmbeddingLossOptions o = {});

// ------------------------------------------------------------------------------ modules (torch.nn names)
template <Backend B> class BCELoss : public Module<B> {
 public:
  explicit BCELoss(BCELossOptions<B> o = {}) : reduction_(o.reduction), has_w_(o.weight.defined()) {
    if (has_w_) this->register_buffer("weight", o.weight);
  }
  Var<B> forward(const Var<B>& input, const Var<B>& target) const {
    return binary_cross_entropy(input, target,
                                BCELossOptions<B>{.weight = has_w_ ? this->buffer("weight") : Tensor<B>(), .reduction = reduction_});
  }
  Var<B> operator()(const Var<B>& input, const Var<B>& target) const { return forward(input, target); }

 private:
  Reduction reduction_;
  bool has_w_;
};

template <Backend B> class BCEWithLogitsLoss : public Module<B> {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsLossOptions<B> o = {})
      : reduction_(o.reduction), has_w_(o.weight.defined()), has_pw_(o.pos_weight.defined()) {
    if (has_w_) this->register_buffer("weight", o.weight);
    if (has_pw_) this->register_buffer("pos_weight", o.pos_weight);
  }
  Var<B> forward(const Var<B>& input, const Var<B>& target) const {
    return binary_cross_entropy_with_logits(input, target,
                                            BCEWithLogitsLossOptions<B>{
                                                .weight = has_w_ ? this->buffer("weight") : Tensor<B>(),
                                                .reduction = reduction_,
                                                .pos_weight = has_pw_ ? this->buffer("pos_weight") : Tensor<B>(),
                                            });
  }
  Var<B> operator()(const Var<B>& input, const Var<B>& target) const { return forward(input, target); }

 private:
  Reduction reduction_;
  bool has_w_, has_pw_;
};

template <Backend B> class NLLLoss : public Module<B> {
 public:
  explicit NLLLoss(NLLLossOptions<B> o = {}) : ignore_index_(o.ignore_index), reduction_(o.reduction), has_w_(o.weight.defined()) {
    if (has_w_) this->register_buffer("weight", o.weight);
  }
  Var<B> forward(const Var<B>& input, const Tensor<B>& target) const {
    return nll_loss(
        input, target,
        NLLLossOptions<B>{.weight = has_w_ ? this->buffer("weight") : Tensor<B>(), .ignore_index = ignore_index_, .reduction = reduction_});
  }
  Var<B> operator()(const Var<B>& input, const Tensor<B>& target) const { return forward(input, target); }

 private:
  int64_t ignore_index_;
  Reduction reduction_;
  bool has_w_;
};

template <Backend B> class L1Loss : public Module<B> {
 public:
  explicit L1Loss(Reduction reduction = Reduction::mean) : reduction_(reduction) {}
  Var<B> forward(const Var<B>& input, const Var<B>& target) const { return l1_loss(input, target, reduction_); }
  Var<B> operator()(const Var<B>& input, const Var<B>& target) const { return forward(input, target); }

 private:
  Reduction reduction_;
};

template <Backend B> class SmoothL1Loss : public Module<B> {
 public:
  explicit SmoothL1Loss(SmoothL1LossOptions o = {}) : o_(o) {}
  Var<B> forward(const Var<B>& input, const Var<B>& target) const { return smooth_l1_loss(input, target, o_); }
  Var<B> operator()(const Var<B>& input, const Var<B>& target) const { return forward(input, target); }

 private:
  SmoothL1LossOptions o_;
};

template <Backend B> class HuberLoss : public Module<B> {
 public:
  explicit HuberLoss(HuberLossOptions o = {}) : o_(o) {}
  Var<B> forward(const Var<B>& input, const Var<B>& target) const { return huber_loss(input, target, o_); }
  Var<B> operator()(const Var<B>& input, const Var<B>& target) const { return forward(input, target); }

 private:
  HuberLossOptions o_;
};

template <Backend B> class KLDivLoss : public Module<B> {
 public:
  explicit KLDivLoss(KLDivLossOptions o = {}) : o_(o) {}
  Var<B> forward(const Var<B>& input, const Var<B>& target) const { return kl_div(input, target, o_); }
  Var<B> operator()(const Var<B>& input, const Var<B>& target) const { return forward(input, target); }

 private:
  KLDivLossOptions o_;
};

template <Backend B> class CosineEmbeddingLoss : public Module<B> {
 public:
  explicit CosineEmbeddingLoss(CosineEmbeddingLossOptions o = {}) : o_(o) {}
  Var<B> forward(const Var<B>& x1, const Var<B>& x2, const Tensor<B>& target) const { return cosine_embedding_loss(x1, x2, target, o_); }
  Var<B> operator()(const Var<B>& x1, const Var<B>& x2, const Tensor<B>& target) const { return forward(x1, x2, target); }

 private:
  CosineEmbeddingLossOptions o_;
};

template <Backend B> class CosineSimilarity : public Module<B> {
 public:
  explicit CosineSimilarity(int64_t dim = 1, double eps = 1e-8) : dim_(dim), eps_(eps) {}
  Var<B> forward(const Var<B>& x1, const Var<B>& x2) const { return cosine_similarity(x1, x2, dim_, eps_); }
  Var<B> operator()(const Var<B>& x1, const Var<B>& x2) const { return forward(x1, x2); }

 private:
  int64_t dim_;
  double eps_;
};

}  // namespace kiln::nn
#pragma GCC visibility pop
