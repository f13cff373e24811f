// The losses' errors (each a kiln::Error naming the op and the offending shape, dtype or value), their
// Module wrappers (torch.nn names; weights as buffers), reductions by name, and the Cpu backend in f32
// against Reference.
#include <catch2/catch.hpp>

#include <kiln/nn/loss.hpp>

#include "common/kiln_test.hpp"

using namespace kiln;
using Catch::Contains;
using nn::Reduction;

TEMPLATE_TEST_CASE("loss errors name the op and the offending values", "[loss][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  const T p = T::full({2, 3}, 0.5), y = T::full({2, 3}, 1.0), y4 = T::zeros({2, 4});
  // shapes and dtypes
  CHECK_THROWS_WITH(nn::binary_cross_entropy<B>(p, y4), Contains("binary_cross_entropy") && Contains("[2, 4]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy_with_logits<B>(p, y4),
                    Contains("binary_cross_entropy_with_logits") && Contains("[2, 4]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(nn::l1_loss<B>(p, y4), Contains("l1_loss") && Contains("[2, 4]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(nn::smooth_l1_loss<B>(p, T::zeros({3})), Contains("smooth_l1_loss") && Contains("[3]"));
  CHECK_THROWS_WITH(nn::huber_loss<B>(p, y.to(DType::f64)), Contains("huber_loss") && Contains("f32") && Contains("f64"));
  CHECK_THROWS_WITH(nn::kl_div<B>(p, T::zeros({2, 3}, DType::i64)), Contains("kl_div") && Contains("i64"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy<B>(p, y, {.weight = T::ones({4})}),
                    Contains("binary_cross_entropy") && Contains("weight [4]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy_with_logits<B>(p, y, {.pos_weight = T::ones({2})}),
                    Contains("binary_cross_entropy_with_logits") && Contains("pos_weight [2]"));
  // values out of range
  CHECK_THROWS_WITH(nn::binary_cross_entropy<B>(T::full({2, 3}, 1.5), y),
                    Contains("binary_cross_entropy") && Contains("[0, 1]") && Contains("1.5"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy<B>(T::full({1}, std::nan("")), T::ones({1})),
                    Contains("binary_cross_entropy") && Contains("[0, 1]"));
  CHECK_THROWS_WITH(nn::smooth_l1_loss<B>(p, y, {.beta = -1}), Contains("smooth_l1_loss") && Contains("beta") && Contains("-1"));
  CHECK_THROWS_WITH(nn::huber_loss<B>(p, y, {.delta = 0}), Contains("huber_loss") && Contains("delta") && Contains("0"));
  CHECK_THROWS_WITH(nn::cosine_similarity<B>(p, y, 1, 0.0), Contains("cosine_similarity") && Contains("eps"));
  CHECK_THROWS_WITH(nn::cosine_similarity<B>(p, y, 2), Contains("2"));
  CHECK_THROWS_WITH(nn::cosine_similarity<B>(p, y4), Contains("cosine_similarity") && Contains("[2, 4]"));
  // nll_loss
  const T lp = T::zeros({3, 4});
  const T tgt = T::from_vector(std::vector<int64_t>{0, 4, 1}, {3});
  CHECK_THROWS_WITH(nn::nll_loss<B>(lp, tgt), Contains("nll_loss") && Contains("[0, 4)") && Contains("max 4"));
  CHECK_THROWS_WITH(nn::nll_loss<B>(lp, T::from_vector(std::vector<int64_t>{0, -1, 1}, {3})), Contains("nll_loss") && Contains("min -1"));
  CHECK_THROWS_WITH(nn::nll_loss<B>(lp, T::zeros({4}, DType::i64)), Contains("nll_loss") && Contains("[3]") && Contains("[4]"));
  CHECK_THROWS_WITH(nn::nll_loss<B>(lp, T::zeros({3})), Contains("nll_loss") && Contains("f32"));
  CHECK_THROWS_WITH(nn::nll_loss<B>(lp, T::zeros({3}, DType::i64), {.weight = T::ones({3})}),
                    Contains("nll_loss") && Contains("weight") && Contains("[4]") && Contains("[3]"));
  // cosine_embedding_loss
  const T e = T::ones({3, 2});
  CHECK_THROWS_WITH(nn::cosine_embedding_loss<B>(e, e, T::from_vector(std::vector<int64_t>{1, 0, -1}, {3})),
                    Contains("cosine_embedding_loss") && Contains("1 or -1") && Contains("target[1] = 0"));
  CHECK_THROWS_WITH(nn::cosine_embedding_loss<B>(e, e, T::ones({2})),
                    Contains("cosine_embedding_loss") && Contains("[3, 2]") && Contains("[2]"));
  CHECK_THROWS_WITH(nn::cosine_embedding_loss<B>(e, T::ones({3, 3}), T::ones({3})),
                    Contains("cosine_embedding_loss") && Contains("[3, 3]"));
  // reductions
  CHECK_THROWS_WITH(nn::reduction_from_string("avg"), Contains("reduction") && Contains("'avg'") && Contains("batchmean"));
  CHECK_THROWS_WITH(nn::l1_loss<B>(p, y, Reduction::batchmean), Contains("l1_loss") && Contains("batchmean"));
  CHECK_THROWS_WITH(nn::binary_cross_entropy<B>(p, y, {.reduction = Reduction::batchmean}),
                    Contains("binary_cross_entropy") && Contains("batchmean"));
  CHECK_THROWS_WITH(nn::nll_loss<B>(lp, T::zeros({3}, DType::i64), {.reduction = static_cast<Reduction>(7)}),
                    Contains("nll_loss") && Contains("invalid 7"));
  CHECK(nn::reduction_from_string("batchmean") == Reduction::batchmean);
  CHECK(nn::reduction_from_string("none") == Reduction::none);
}

TEMPLATE_TEST_CASE("loss modules: torch.nn names, weights as buffers, the functional values", "[loss]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  Generator g(5);
  const T x = T::randn({4, 3}, DType::f32, &g), y = T::uniform({4, 3}, 0, 1, DType::f32, &g), w = T::uniform({3}, 0.5, 1.5, DType::f32, &g);
  nn::BCEWithLogitsLoss<B> bce({.weight = w, .reduction = Reduction::sum, .pos_weight = w.mul(2.0)});
  const auto state = bce.state_dict();
  REQUIRE(state.size() == 2);
  CHECK(state[0].first == "weight");
  CHECK(state[1].first == "pos_weight");
  CHECK(item<double>(bce(x, y).value()) ==
        item<double>(
            nn::binary_cross_entropy_with_logits<B>(x, y, {.weight = w, .reduction = Reduction::sum, .pos_weight = w.mul(2.0)}).value()));
  bce.to(DType::f64);  // the buffers follow, so f64 inputs work
  CHECK(bce(x.to(DType::f64), y.to(DType::f64)).dtype() == DType::f64);
  CHECK(nn::BCELoss<B>().state_dict().empty());
  CHECK(item<double>(nn::BCELoss<B>({.weight = w})(x.sigmoid(), y).value()) ==
        item<double>(nn::binary_cross_entropy<B>(x.sigmoid(), y, {.weight = w}).value()));
  const T t = T::from_vector(std::vector<int64_t>{0, 2, 1, 2}, {4});
  nn::NLLLoss<B> nll({.weight = w, .ignore_index = 1});
  CHECK(nll.state_dict().size() == 1);
  CHECK(item<double>(nll(x.log_softmax(1), t).value()) ==
        item<double>(nn::nll_loss<B>(x.log_softmax(1), t, {.weight = w, .ignore_index = 1}).value()));
  CHECK(nn::L1Loss<B>(Reduction::none)(x, y).shape() == Shape{4, 3});
  CHECK(item<double>(nn::SmoothL1Loss<B>({.beta = 0.5})(x, y).value()) == item<double>(nn::smooth_l1_loss<B>(x, y, {.beta = 0.5}).value()));
  CHECK(item<double>(nn::HuberLoss<B>({.delta = 0.5})(x, y).value()) == item<double>(nn::huber_loss<B>(x, y, {.delta = 0.5}).value()));
  CHECK(item<double>(nn::KLDivLoss<B>({.reduction = Reduction::batchmean})(x.log_softmax(1), y).value()) ==
        item<double>(nn::kl_div<B>(x.log_softmax(1), y, {.reduction = Reduction::batchmean}).value()));
  CHECK(nn::CosineSimilarity<B>(0)(x, y).shape() == Shape{3});
  const T s = T::from_vector(std::vector<int64_t>{1, -1, 1, -1}, {4});
  CHECK(item<double>(nn::CosineEmbeddingLoss<B>({.margin = 0.1})(x, y, s).value()) ==
        item<double>(nn::cosine_embedding_loss<B>(x, y, s, {.margin = 0.1}).value()));
  // known values: smooth_l1 with beta = 0 is l1; huber = delta * smooth_l1(beta = delta); kl_div(p, p) = 0
  CHECK(item<double>(nn::smooth_l1_loss<B>(x, y, {.beta = 0}).value()) == item<double>(nn::l1_loss<B>(x, y).value()));
  CHECK(item<double>(nn::huber_loss<B>(x, y, {.delta = 2.0}).value()) ==
        Approx(2.0 * item<double>(nn::smooth_l1_loss<B>(x, y, {.beta = 2.0}).value())).epsilon(1e-6));
  CHECK(item<double>(nn::kl_div<B>(x.log_softmax(1), x.log_softmax(1), {.reduction = Reduction::sum, .log_target = true}).value()) == 0.0);
}

TEMPLATE_TEST_CASE("losses in f32 agree with Reference", "[loss]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Generator g(9);
  const kt::RT x = kt::RT::randn({6, 5}, DType::f32, &g).mul(2.0), y = kt::RT::uniform({6, 5}, 0, 1, DType::f32, &g);
  const kt::RT t = kt::RT::from_vector(std::vector<int64_t>{0, 4, -100, 2, 3, 1}, {6});
  auto run = [&]<Backend C>(const Tensor<C>& xv, const Tensor<C>& yv, const Tensor<C>& tv) {
    std::vector<Tensor<C>> out;
    auto add = [&](const Var<C>& l, const Var<C>& leaf) {
      l.backward();
      out.push_back(l.value());
      out.push_back(leaf.grad());
    };
    {
      Var<C> a(xv, true);
      add(nn::binary_cross_entropy_with_logits<C>(a, yv, {.pos_weight = Tensor<C>::full({5}, 2.0)}), a);
    }
    {
      Var<C> a(xv.sigmoid(), true);
      add(nn::binary_cross_entropy<C>(a, yv), a);
    }
    {
      Var<C> a(xv.log_softmax(1), true);
      add(nn::nll_loss<C>(a, tv), a);
    }
    {
      Var<C> a(xv, true);
      add(nn::smooth_l1_loss<C>(a, yv, {.beta = 0.7}), a);
    }
    {
      Var<C> a(xv.log_softmax(1), true);
      add(nn::kl_div<C>(a, yv.softmax(1), {.reduction = Reduction::batchmean}), a);
    }
    {
      Var<C> a(xv, true);
      add(nn::cosine_embedding_loss<C>(a, yv, Tensor<C>::from_vector(std::vector<int64_t>{1, -1, 1, -1, 1, -1}, {6}), {.margin = 0.1}), a);
    }
    return out;
  };
  const auto want = run(x, y, t);
  const auto got = run(x.template to<B>(), y.template to<B>(), t.template to<B>());
  REQUIRE(got.size() == want.size());
  // each value is a sum of 30 f32 terms: Higham's 30·u·Σ|terms| with Σ|terms| < 100 is under 2e-4
  for (size_t i = 0; i < got.size(); ++i) kt::check_close(got[i], want[i], {1e-5, 2e-4}, fmt::format("result {}", i));
}
