#include "kiln/nn/loss.hpp"

#include <algorithm>

#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/loss_ops.hpp"
#include "kiln/core/fused_loss.hpp"

namespace kiln::nn {

namespace {
// Targets of rows over C classes, flattened to i64: every value in [0, C) or ignore_index (a kiln::Error
// naming `op` otherwise); returns them and the count of rows not ignored. The check and the count read
// back together: one wait for a device.
template <Backend B>
std::pair<Tensor<B>, int64_t> checked_targets(const Tensor<B>& targets, int64_t C, int64_t ignore_index, const char* op) {
  const Tensor<B> t = targets.reshape({-1}).to(DType::i64);
  int64_t kept = 0;
  if (t.numel()) {
    const Tensor<B> keep = t.ne(ignore_index);
    const Tensor<B> bad = keep.logical_and(t.lt(0).logical_or(t.ge(C)));
    const std::vector<int64_t> counts =
        Tensor<B>::stack({bad.sum().to(DType::i64), keep.sum().to(DType::i64)}).template to_vector<int64_t>();
    KILN_CHECK(counts[0] == 0, "{}: target values must be in [0, {}) or ignore_index {}; got min {} max {}", op, C, ignore_index,
               item<int64_t>(t.min()), item<int64_t>(t.max()));
    kept = counts[1];
  }
  return {t, kept};
}
}  // namespace

template <Backend B> Var<B> cross_entropy(const Var<B>& logits_in, const Tensor<B>& targets, CrossEntropyOptions o) {
  // Autocast's f32 policy: half logits give an f32 loss. A backend whose fused op reads half logits
  // (fused::CrossEntropyHalf) takes them uncast: the same loss, and the same dlogits (f32, rounded once
  // to the logits' dtype, as the cast's backward rounds them), but no f32 copy of the logits kept from
  // the forward to the backward.
  const DType loss_dtype = autocast::cast_dtype(autocast::Op::cross_entropy, logits_in.dtype());
  const Var<B> logits = fused::CrossEntropyHalf<B> ? logits_in : autocast::cast(autocast::Op::cross_entropy, logits_in);
  KILN_CHECK(logits.dim() >= 1, "cross_entropy: logits must have rank >= 1, got {}", shape_str(logits.shape()));
  KILN_CHECK(is_integral(targets.dtype()), "cross_entropy: targets must be i32 or i64, got {} (shape {})", targets.dtype(),
             shape_str(targets.shape()));
  const int64_t C = logits.shape().back();
  Shape rows(logits.shape().begin(), logits.shape().end() - 1);
  KILN_CHECK(targets.shape() == rows, "cross_entropy: logits {} need targets of shape {}, got {}", shape_str(logits.shape()),
             shape_str(rows), shape_str(targets.shape()));
  KILN_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got {}",
             o.label_smoothing);
  const auto [t, kept] = checked_targets(targets, C, o.ignore_index, "cross_entropy");
  // One recorded op on the fused kernel (autograd/ops/loss.cpp).
  const Var<B> loss = autograd::LossOps<B>::cross_entropy(logits.reshape({-1, C}), t, o.ignore_index, o.label_smoothing, loss_dtype);
  return loss.sum().div(static_cast<double>(kept));
}

template <Backend B>
Var<B> linear_cross_entropy(const Var<B>& hidden_in, const Var<B>& weight_in, const Tensor<B>& targets, LinearCrossEntropyOptions o) {
  static constexpr const char* op = "linear_cross_entropy";
  KILN_CHECK(hidden_in.defined() && weight_in.defined(), "{}: undefined hidden states or weight", op);
  KILN_CHECK(hidden_in.dim() >= 1 && weight_in.dim() == 2 && hidden_in.shape().back() == weight_in.size(1),
             "{}: hidden states [..., D] and a weight [C, D] needed, got {} and {}", op, shape_str(hidden_in.shape()),
             shape_str(weight_in.shape()));
  KILN_CHECK(is_integral(targets.dtype()), "{}: targets must be i32 or i64, got {} (shape {})", op, targets.dtype(),
             shape_str(targets.shape()));
  const Shape rows(hidden_in.shape().begin(), hidden_in.shape().end() - 1);
  KILN_CHECK(targets.shape() == rows, "{}: hidden states {} need targets of shape {}, got {}", op, shape_str(hidden_in.shape()),
             shape_str(rows), shape_str(targets.shape()));
  KILN_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, "{}: label_smoothing must be in [0, 1], got {}", op, o.label_smoothing);
  KILN_CHECK(o.chunk_rows >= 0, "{}: chunk_rows must be >= 0 (0: automatic), got {}", op, o.chunk_rows);
  // Autocast as the composite: the product in the matmul policy's dtype. The loss in f32 (f64 for f64
  // inputs) whatever the inputs' dtype: autocast's cross_entropy policy, and a sum over rows that a
  // bf16/f16 result would round away.
  const Var<B> h = autocast::cast(autocast::Op::matmul, hidden_in), w = autocast::cast(autocast::Op::matmul, weight_in);
  const DType loss_dtype = h.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const int64_t C = w.size(0), D = w.size(1);
  const auto [t, kept] = checked_targets(targets, C, o.ignore_index, op);
  // Every row ignored: nan, as cross_entropy (and PyTorch) give.
  if (kept == 0) return cross_entropy(h.matmul(w.t()), targets, {.ignore_index = o.ignore_index, .label_smoothing = o.label_smoothing});
  return autograd::LossOps<B>::linear_cross_entropy(h.reshape({-1, D}), w, t, kept, o.ignore_index, o.label_smoothing,
                                                    linear_cross_entropy_chunk(C, o.chunk_rows), loss_dtype);
}

template <Backend B> Var<B> mse_loss(const Var<B>& a, const Var<B>& b) { return (a - b).square().mean(); }

Reduction reduction_from_string(std::string_view name) {
  if (name == "none") return Reduction::none;
  if (name == "mean") return Reduction::mean;
  if (name == "sum") return Reduction::sum;
  if (name == "batchmean") return Reduction::batchmean;
  fail("reduction: '{}' is not a valid value (none, mean, sum, batchmean)", name);
}

std::string_view reduction_name(Reduction r) {
  switch (r) {
    case Reduction::none:
      return "none";
    case Reduction::mean:
      return "mean";
    case Reduction::sum:
      return "sum";
    case Reduction::batchmean:
      return "batchmean";
  }
  fail("reduction: invalid value {}", static_cast<int>(r));
}

namespace {

// none / mean / sum of an elementwise loss; batchmean is kl_div's alone (handled there).
template <Backend B> Var<B> reduce(const Var<B>& loss, Reduction r, const char* op) {
  switch (r) {
    case Reduction::none:
      return loss;
    case Reduction::mean:
      return loss.mean();
    case Reduction::sum:
      return loss.sum();
    case Reduction::batchmean:
      break;
  }
  fail("{}: reduction '{}' is not valid here (none, mean, sum; batchmean is kl_div's)", op,
       r == Reduction::batchmean ? std::string("batchmean") : fmt::format("<invalid {}>", static_cast<int>(r)));
}

// Input and target of a pointwise regression loss: defined, floating, one shape; under autocast in f32.
template <Backend B> std::pair<Var<B>, Var<B>> pointwise(const Var<B>& input, const Var<B>& target, const char* op) {
  KILN_CHECK(input.defined() && target.defined(), "{}: undefined input or target", op);
  KILN_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), "{}: input and target must be floating, got {} and {}", op,
             input.dtype(), target.dtype());
  KILN_CHECK(input.shape() == target.shape(), "{}: target {} must have the input's shape {}", op, shape_str(target.shape()),
             shape_str(input.shape()));
  const Var<B> x = autocast::cast(autocast::Op::pointwise_loss, input), y = autocast::cast(autocast::Op::pointwise_loss, target);
  KILN_CHECK(x.dtype() == y.dtype(), "{}: input {} and target {} must have one dtype", op, x.dtype(), y.dtype());
  return {x, y};
}

}  // namespace

template <Backend B> Var<B> binary_cross_entropy(const Var<B>& input, const Var<B>& target, BCELossOptions<B> o) {
  return reduce(autograd::LossOps<B>::binary_cross_entropy(input, target, o.weight), o.reduction, "binary_cross_entropy");
}

template <Backend B> Var<B> binary_cross_entropy_with_logits(const Var<B>& input, const Var<B>& target, BCEWithLogitsLossOptions<B> o) {
  return reduce(autograd::LossOps<B>::binary_cross_entropy_with_logits(input, target, o.weight, o.pos_weight), o.reduction,
                "binary_cross_entropy_with_logits");
}

template <Backend B> Var<B> nll_loss(const Var<B>& input, const Tensor<B>& target, NLLLossOptions<B> o) {
  static constexpr const char* op = "nll_loss";
  KILN_CHECK(input.defined() && target.defined(), "{}: undefined input or target", op);
  KILN_CHECK(is_floating(input.dtype()), "{}: input must be floating, got {} (shape {})", op, input.dtype(), shape_str(input.shape()));
  KILN_CHECK(input.dim() >= 1, "{}: input must be [C], [N, C] or [N, C, d1, ...], got {}", op, shape_str(input.shape()));
  KILN_CHECK(is_integral(target.dtype()), "{}: target must be i32 or i64, got {} (shape {})", op, target.dtype(),
             shape_str(target.shape()));
  const Var<B> x = autocast::cast(autocast::Op::nll_loss, input);
  const int64_t C = x.dim() == 1 ? x.size(0) : x.size(1);
  Shape tshape = x.shape();
  tshape.erase(tshape.begin() + (x.dim() == 1 ? 0 : 1));
  KILN_CHECK(target.shape() == tshape, "{}: input {} (classes along dim {}) needs target of shape {}, got {}", op, shape_str(x.shape()),
             x.dim() == 1 ? 0 : 1, shape_str(tshape), shape_str(target.shape()));
  KILN_CHECK(!o.weight.defined() || o.weight.shape() == Shape{C}, "{}: weight must be [C] = [{}] (one per class), got {}", op, C,
             o.weight.defined() ? shape_str(o.weight.shape()) : "");
  KILN_CHECK(!o.weight.defined() || is_floating(o.weight.dtype()), "{}: weight must be floating, got {}", op, o.weight.dtype());
  // [..., C] rows: the class axis last, flattened
  Var<B> rows;
  if (x.dim() <= 2) {
    rows = x.reshape({-1, C});
  } else {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < x.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    rows = x.permute(perm).reshape({-1, C});
  }
  const Tensor<B> t = target.reshape({-1}).to(DType::i64);
  const Tensor<B> keep = t.ne(o.ignore_index);
  if (t.numel()) {
    const int64_t bad = item<int64_t>(keep.logical_and(t.lt(0).logical_or(t.ge(C))).sum().to(DType::i64));
    KILN_CHECK(bad == 0, "{}: target values must be in [0, {}) or ignore_index {}; got min {} max {}", op, C, o.ignore_index,
               item<int64_t>(t.min()), item<int64_t>(t.max()));
  }
  const Tensor<B> safe = t.mul(keep.to(DType::i64));  // ignored rows read class 0, weighted 0
  const Tensor<B> kept = keep.to(x.dtype());
  const Tensor<B> w = o.weight.defined() ? o.weight.to(x.dtype()).index_select(0, safe).mul(kept) : kept;
  const Var<B> loss = rows.gather(1, safe.unsqueeze(1)).squeeze(1).mul(w).neg();
  switch (o.reduction) {
    case Reduction::none:
      return loss.reshape(tshape);
    case Reduction::sum:
      return loss.sum();
    case Reduction::mean:
      return loss.sum().div(w.sum());  // PyTorch: Σ w[t]·ℓ / Σ w[t] (nan when nothing is kept)
    default:
      return reduce(loss, o.reduction, op);
  }
}

template <Backend B> Var<B> l1_loss(const Var<B>& input, const Var<B>& target, Reduction reduction) {
  const auto [x, y] = pointwise(input, target, "l1_loss");
  return reduce(x.sub(y).abs(), reduction, "l1_loss");
}

template <Backend B> Var<B> smooth_l1_loss(const Var<B>& input, const Var<B>& target, SmoothL1LossOptions o) {
  static constexpr const char* op = "smooth_l1_loss";
  KILN_CHECK(o.beta >= 0, "{}: beta must be >= 0, got {}", op, o.beta);
  const auto [x, y] = pointwise(input, target, op);
  // β = 0 is l1_loss, as PyTorch 2 computes it (gradient 0 at a tie x = y; PyTorch 1.13's own backward gave -1)
  if (o.beta == 0) return l1_loss(x, y, o.reduction);
  const Var<B> d = x.sub(y), ad = d.abs();
  return reduce(where(ad.lt(o.beta), d.square().mul(0.5 / o.beta), ad.sub(0.5 * o.beta)), o.reduction, op);
}

template <Backend B> Var<B> huber_loss(const Var<B>& input, const Var<B>& target, HuberLossOptions o) {
  static constexpr const char* op = "huber_loss";
  KILN_CHECK(o.delta > 0, "{}: delta must be > 0, got {}", op, o.delta);
  const auto [x, y] = pointwise(input, target, op);
  const Var<B> d = x.sub(y), ad = d.abs();
  return reduce(where(ad.lt(o.delta), d.square().mul(0.5), ad.sub(0.5 * o.delta).mul(o.delta)), o.reduction, op);
}

template <Backend B> Var<B> kl_div(const Var<B>& input, const Var<B>& target, KLDivLossOptions o) {
  static constexpr const char* op = "kl_div";
  const auto [x, y] = pointwise(input, target, op);
  Var<B> loss;
  if (o.log_target) {
    loss = y.exp().mul(y.sub(x));
  } else {
    // xlogy(y, y) − y·x: y·log y is 0 where y = 0 (log reads 1 there); a negative y gives nan, as in PyTorch
    loss = y.mul(where(y.ne(0.0), y, 1.0).log()).sub(y.mul(x));
  }
  if (o.reduction != Reduction::batchmean) return reduce(loss, o.reduction, op);
  KILN_CHECK(x.dim() >= 1, "{}: reduction batchmean needs a batch dimension, input is 0-dim", op);
  return loss.sum().div(static_cast<double>(x.size(0)));
}

template <Backend B> Var<B> cosine_similarity(const Var<B>& x1_in, const Var<B>& x2_in, int64_t dim, double eps) {
  static constexpr const char* op = "cosine_similarity";
  KILN_CHECK(x1_in.defined() && x2_in.defined(), "{}: undefined input", op);
  KILN_CHECK(is_floating(x1_in.dtype()) && is_floating(x2_in.dtype()), "{}: inputs must be floating, got {} and {}", op, x1_in.dtype(),
             x2_in.dtype());
  KILN_CHECK(eps > 0, "{}: eps must be > 0, got {}", op, eps);
  constexpr auto ac = autocast::Op::cosine_similarity;
  const Var<B> a = autocast::cast(ac, x1_in), b = autocast::cast(ac, x2_in);
  const Shape s = broadcast_shapes(a.shape(), b.shape(), op);
  KILN_CHECK(!s.empty(), "{}: inputs {} and {} are 0-dim; dim {} does not exist", op, shape_str(a.shape()), shape_str(b.shape()), dim);
  const int64_t d = normalize_axis(dim, static_cast<int64_t>(s.size()), op, s);
  const Var<B> x1 = a.shape() == s ? a : a.expand(s), x2 = b.shape() == s ? b : b.expand(s);
  // ‖x‖ clamped at eps, as max(‖x‖², eps²) under the root: finite gradients for a zero vector
  const Var<B> n1 = x1.square().sum({d}, true).maximum(eps * eps).sqrt(), n2 = x2.square().sum({d}, true).maximum(eps * eps).sqrt();
  return x1.div(n1).mul(x2.div(n2)).sum({d});
}

template <Backend B>
Var<B> cosine_embedding_loss(const Var<B>& x1_in, const Var<B>& x2_in, const Tensor<B>& target, CosineEmbeddingLossOptions o) {
  static constexpr const char* op = "cosine_embedding_loss";
  KILN_CHECK(x1_in.defined() && x2_in.defined() && target.defined(), "{}: undefined input or target", op);
  KILN_CHECK(is_floating(x1_in.dtype()) && is_floating(x2_in.dtype()), "{}: inputs must be floating, got {} and {}", op, x1_in.dtype(),
             x2_in.dtype());
  KILN_CHECK(x1_in.shape() == x2_in.shape(), "{}: inputs {} and {} must have one shape", op, shape_str(x1_in.shape()),
             shape_str(x2_in.shape()));
  KILN_CHECK((target.dim() == 1 && x1_in.dim() == 2 && target.size(0) == x1_in.size(0)) || (target.dim() == 0 && x1_in.dim() == 1),
             "{}: inputs [N, D] need target [N], inputs [D] a 0-dim target; got inputs {} and target {}", op, shape_str(x1_in.shape()),
             shape_str(target.shape()));
  constexpr auto ac = autocast::Op::cosine_embedding_loss;
  const Var<B> x1 = autocast::cast(ac, x1_in), x2 = autocast::cast(ac, x2_in);
  const Tensor<B> pos = target.eq(1), neg = target.eq(-1);
  if (target.numel()) {
    const int64_t bad = item<int64_t>(pos.logical_or(neg).logical_not().sum().to(DType::i64));
    if (bad) {
      const std::vector<double> tv = target.reshape({-1}).template to_vector<double>();
      const auto it = std::find_if(tv.begin(), tv.end(), [](double v) { return v != 1 && v != -1; });
      fail("{}: target values must be 1 or -1; {} of {} are not (target[{}] = {})", op, bad, target.numel(), it - tv.begin(), *it);
    }
  }
  const int64_t d = x1.dim() - 1;
  constexpr double kEps = 1e-12;  // PyTorch's EPSILON in the squared magnitudes
  const Var<B> prod = x1.mul(x2).sum({d});
  const Var<B> denom = x1.square().sum({d}).add(kEps).mul(x2.square().sum({d}).add(kEps)).sqrt();
  const Var<B> cos = prod.div(denom);
  const Var<B> loss = where(pos, cos.neg().add(1.0), 0.0).add(where(neg, cos.sub(o.margin).maximum(0.0), 0.0));
  return reduce(loss, o.reduction, op);
}

#define KILN_INST(B)                                                                                                  \
  template Var<B> cross_entropy<B>(const Var<B>&, const Tensor<B>&, CrossEntropyOptions);                             \
  template Var<B> linear_cross_entropy<B>(const Var<B>&, const Var<B>&, const Tensor<B>&, LinearCrossEntropyOptions); \
  template Var<B> mse_loss<B>(const Var<B>&, const Var<B>&);                                                          \
  template Var<B> binary_cross_entropy<B>(const Var<B>&, const Var<B>&, BCELossOptions<B>);                           \
  template Var<B> binary_cross_entropy_with_logits<B>(const Var<B>&, const Var<B>&, BCEWithLogitsLossOptions<B>);     \
  template Var<B> nll_loss<B>(const Var<B>&, const Tensor<B>&, NLLLossOptions<B>);                                    \
  template Var<B> l1_loss<B>(const Var<B>&, const Var<B>&, Reduction);                                                \
  template Var<B> smooth_l1_loss<B>(const Var<B>&, const Var<B>&, SmoothL1LossOptions);                               \
  template Var<B> huber_loss<B>(const Var<B>&, const Var<B>&, HuberLossOptions);                                      \
  template Var<B> kl_div<B>(const Var<B>&, const Var<B>&, KLDivLossOptions);                                          \
  template Var<B> cosine_similarity<B>(const Var<B>&, const Var<B>&, int64_t, double);                                \
  template Var<B> cosine_embedding_loss<B>(const Var<B>&, const Var<B>&, const Tensor<B>&, CosineEmbeddingLossOptions);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
