// float64 central-difference gradients of every loss (nn/loss.hpp) on every backend, every reduction,
// with respect to the input and, where PyTorch differentiates it, the target; a non-contiguous input.
#include <catch2/catch.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/nn/loss.hpp>

#include "autograd/helpers.hpp"

using namespace kiln;
using nn::Reduction;

namespace {

// f64 random tensors of tests/autograd/helpers.hpp; ru keeps this file's (shape, seed, lo, hi) order.
template <Backend B> Tensor<B> rn(const Shape& s, uint64_t seed) { return kiln::test::randn<B>(s, seed); }
template <Backend B> Tensor<B> ru(const Shape& s, uint64_t seed, double lo, double hi) { return kiln::test::uniform<B>(s, lo, hi, seed); }

template <Backend B>
void check(const std::string& what, const std::function<Var<B>(const std::vector<Var<B>>&)>& f, const std::vector<Tensor<B>>& in) {
  const GradcheckResult<B> r = gradcheck<B>(f, in);
  INFO(what << ": " << r.message);
  CHECK(r.ok);
}

const std::vector<Reduction> kReductions{Reduction::none, Reduction::mean, Reduction::sum};

}  // namespace

TEMPLATE_TEST_CASE("gradcheck: binary cross-entropy, with and without logits", "[loss][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  const Tensor<B> p = ru<B>({4, 3}, 1, 0.05, 0.95), y = ru<B>({4, 3}, 2, 0, 1), w = ru<B>({3}, 3, 0.5, 1.5);
  const Tensor<B> x = rn<B>({3, 4}, 4).mul(3.0).t(), pw = ru<B>({3}, 5, 0.2, 3);  // x non-contiguous [4, 3]
  for (Reduction r : kReductions) {
    const std::string rn_ = std::string(nn::reduction_name(r));
    check<B>("binary_cross_entropy " + rn_,
             [&](const VV& v) { return nn::binary_cross_entropy(v[0], v[1], {.weight = w, .reduction = r}); }, {p, y});
    check<B>("binary_cross_entropy_with_logits " + rn_,
             [&](const VV& v) { return nn::binary_cross_entropy_with_logits(v[0], v[1], {.weight = w, .reduction = r}); }, {x, y});
    check<B>("binary_cross_entropy_with_logits pos_weight " + rn_,
             [&](const VV& v) { return nn::binary_cross_entropy_with_logits(v[0], v[1], {.reduction = r, .pos_weight = pw}); }, {x, y});
  }
}

TEMPLATE_TEST_CASE("gradcheck: nll_loss", "[loss][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  const Tensor<B> t = Tensor<B>::from_vector(std::vector<int64_t>{2, 0, -100, 1, 2}, {5});
  const Tensor<B> t4 = Tensor<B>::from_vector(std::vector<int64_t>{0, 3, 1, 1, 2, 3}, {2, 3});
  const Tensor<B> w = ru<B>({4}, 6, 0.5, 2);
  for (Reduction r : kReductions) {
    const std::string rn_ = std::string(nn::reduction_name(r));
    check<B>("nll_loss [N, C] weight ignore " + rn_,
             [&](const VV& v) { return nn::nll_loss(v[0], t, {.weight = w.narrow(0, 0, 3), .reduction = r}); }, {rn<B>({5, 3}, 7)});
    check<B>("nll_loss [N, C, d] ignore_index 1 " + rn_,
             [&](const VV& v) { return nn::nll_loss(v[0], t4, {.weight = w, .ignore_index = 1, .reduction = r}); }, {rn<B>({2, 4, 3}, 8)});
  }
}

TEMPLATE_TEST_CASE("gradcheck: l1, smooth_l1, huber, kl_div", "[loss][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  // |x − y| away from 0 and from β, δ (the kinks, where central differences straddle two branches)
  const Tensor<B> x = rn<B>({3, 5}, 9),
                  y = x.add(Tensor<B>::from_vector(
                      std::vector<double>{0.3, -0.8, 1.7, -2.2, 0.45, -0.15, 0.9, -1.3, 2.6, -0.6, 1.1, -0.35, 0.7, -1.9, 3.1}, {3, 5}));
  for (Reduction r : kReductions) {
    const std::string rn_ = std::string(nn::reduction_name(r));
    check<B>("l1_loss " + rn_, [&](const VV& v) { return nn::l1_loss(v[0], v[1], r); }, {x, y});
    check<B>("smooth_l1_loss beta 1 " + rn_, [&](const VV& v) { return nn::smooth_l1_loss(v[0], v[1], {.reduction = r}); }, {x, y});
    check<B>("smooth_l1_loss beta 0.5 " + rn_, [&](const VV& v) { return nn::smooth_l1_loss(v[0], v[1], {.reduction = r, .beta = 0.5}); },
             {x, y});
    check<B>("huber_loss delta 2 " + rn_, [&](const VV& v) { return nn::huber_loss(v[0], v[1], {.reduction = r, .delta = 2.0}); }, {x, y});
  }
  const Tensor<B> lp = rn<B>({4, 5}, 10).log_softmax(1), q = rn<B>({4, 5}, 11).softmax(1), lq = rn<B>({4, 5}, 12).log_softmax(1);
  for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum, Reduction::batchmean}) {
    const std::string rn_ = std::string(nn::reduction_name(r));
    check<B>("kl_div " + rn_, [&](const VV& v) { return nn::kl_div(v[0], v[1], {.reduction = r}); }, {lp, q});
    check<B>("kl_div log_target " + rn_, [&](const VV& v) { return nn::kl_div(v[0], v[1], {.reduction = r, .log_target = true}); },
             {lp, lq});
  }
}

TEMPLATE_TEST_CASE("gradcheck: cosine_similarity, cosine_embedding_loss", "[loss][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  check<B>("cosine_similarity dim 1", [](const VV& v) { return nn::cosine_similarity(v[0], v[1]); },
           {rn<B>({4, 6}, 13), rn<B>({4, 6}, 14)});
  check<B>("cosine_similarity broadcast dim -1", [](const VV& v) { return nn::cosine_similarity(v[0], v[1], -1); },
           {rn<B>({3, 1, 5}, 15), rn<B>({2, 5}, 16)});
  check<B>("cosine_similarity dim 0 eps 0.5", [](const VV& v) { return nn::cosine_similarity(v[0], v[1], 0, 0.5); },
           {rn<B>({3, 4}, 17).mul(0.2), rn<B>({3, 4}, 18)});
  const Tensor<B> t = Tensor<B>::from_vector(std::vector<int64_t>{1, -1, -1, 1, -1}, {5});
  for (Reduction r : kReductions)
    for (double margin : {0.0, -0.3}) {
      check<B>(fmt::format("cosine_embedding_loss margin {} {}", margin, nn::reduction_name(r)),
               [&](const VV& v) { return nn::cosine_embedding_loss(v[0], v[1], t, {.margin = margin, .reduction = r}); },
               {rn<B>({5, 4}, 19), rn<B>({5, 4}, 20)});
    }
}
