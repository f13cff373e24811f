// Tape semantics: accumulation, NoGrad, detach, freed graphs, error messages, leaf rules.
#include <cstdio>
#include <memory>
#include <thread>

#include <kiln/autograd/checkpoint.hpp>

#include "helpers.hpp"

using namespace kiln;
using namespace kiln::test;
using Catch::Matchers::Contains;

TEMPLATE_TEST_CASE("autograd: a value used twice accumulates", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(f64<TestType>({1.0, -2.0, 3.0}, {3}), true);
  (x * x).sum().backward();
  check_values(x.grad(), {2.0, -4.0, 6.0});
  x.zero_grad();
  (x + x).sum().backward();
  check_values(x.grad(), {2.0, 2.0, 2.0});
  x.zero_grad();
  const V y = x.exp();
  (y * y + y).sum().backward();  // d/dx (e^2x + e^x)
  check_values(x.grad(), {2 * std::exp(2.0) + std::exp(1.0), 2 * std::exp(-4.0) + std::exp(-2.0), 2 * std::exp(6.0) + std::exp(3.0)}, 1e-9);
}

TEMPLATE_TEST_CASE("autograd: leaves accumulate across backward calls until zero_grad", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V w(f64<TestType>({1.0, 2.0}, {2}), true);
  (w * 3.0).sum().backward();
  check_values(w.grad(), {3.0, 3.0});
  (w * w).sum().backward();
  check_values(w.grad(), {5.0, 7.0});
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
  (w * 2.0).sum().backward();
  check_values(w.grad(), {2.0, 2.0});
}

TEMPLATE_TEST_CASE("autograd: leaf grads are private, contiguous tensors", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V a(f64<TestType>({1.0, 2.0}, {2}), true), b(f64<TestType>({3.0, 4.0}, {2}), true);
  (a + b).sum().backward();  // both receive the very same upstream gradient
  Tensor<TestType> ga = a.grad();
  ga.mul_(10.0);  // e.g. gradient clipping in place
  check_values(b.grad(), {1.0, 1.0});
  V c(f64<TestType>({1.0, 2.0, 3.0}, {3, 1}), true);
  c.expand({3, 4}).sum().backward();  // expand's gradient path: sums are fine; .grad is contiguous
  CHECK(c.grad().is_contiguous());
  check_values(c.grad(), {4.0, 4.0, 4.0});
}

TEMPLATE_TEST_CASE("autograd: a weight used transposed (Linear's x · Wᵀ) gets its gradient contiguous, without a transposing copy",
                   "[autograd]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using V = Var<B>;
  auto max_abs_diff = [](const Tensor<B>& a, const Tensor<B>& b) {
    REQUIRE(a.shape() == b.shape());
    return item<double>(a.to(DType::f64).sub(b.to(DType::f64)).abs().max());
  };
  Generator gen(3);
  for (DType d : {DType::f32, DType::f64}) {
    const Tensor<B> x0 = Tensor<B>::randn({6, 5}, d, &gen), w0 = Tensor<B>::randn({4, 5}, d, &gen), g = Tensor<B>::randn({6, 4}, d, &gen);
    V x(x0, true), w(w0, true);
    (x.matmul(w.t()) * V(g)).sum().backward();
    // the same product with a contiguous copy of Wᵀ: the gradient of that copy, transposed
    V x2(x0, true), wt(w0.t().contiguous(), true);
    (x2.matmul(wt) * V(g)).sum().backward();
    CHECK(w.grad().is_contiguous());
    CHECK(max_abs_diff(w.grad(), wt.grad().t()) < 1e-5);
    CHECK(max_abs_diff(x.grad(), x2.grad()) < 1e-5);
    CHECK(max_abs_diff(w.grad(), g.t().matmul(x0)) < 1e-5);
  }
}

TEMPLATE_TEST_CASE("autograd: NoGrad records nothing", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(f64<TestType>({1.0, 2.0}, {2}), true);
  CHECK(grad_enabled());
  V y;
  {
    NoGrad outer;
    CHECK_FALSE(grad_enabled());
    {
      NoGrad inner;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // nesting restores the outer state, not "on"
    y = (x * 2.0).exp().sum();
  }
  CHECK(grad_enabled());
  CHECK_FALSE(y.requires_grad());
  CHECK(y.grad_fn() == nullptr);
  CHECK(y.is_leaf());
  CHECK(y.node()->inputs.empty());
  CHECK_FALSE(static_cast<bool>(y.node()->backward));
  CHECK_THROWS_WITH(y.backward(), Contains("does not require grad"));
  // Inference on inputs that need no grad records nothing either, with grad mode on.
  V c(f64<TestType>({1.0, 2.0}, {2}));
  const V z = c.exp() * c;
  CHECK_FALSE(z.requires_grad());
  CHECK(z.grad_fn() == nullptr);
}

TEMPLATE_TEST_CASE("autograd: grad mode is per thread", "[autograd]", KILN_BACKEND_TYPES) {
  NoGrad ng;
  bool other = false;
  std::thread([&] { other = grad_enabled(); }).join();
  CHECK(other);
  CHECK_FALSE(grad_enabled());
}

TEMPLATE_TEST_CASE("autograd: recorded ops name themselves", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(randn<TestType>({2, 3}, 1), true);
  CHECK(x.is_leaf());
  CHECK(x.grad_fn() == nullptr);
  const V xt = x.t();
  const V y = x.matmul(xt);
  CHECK_FALSE(y.is_leaf());
  CHECK(std::string(y.grad_fn()) == "matmul");
  CHECK(std::string(y.softmax(0).grad_fn()) == "softmax");
  CHECK(y.node()->seq > xt.node()->seq);  // tape order = creation order
  CHECK(y.node()->inputs.size() == 2);
  CHECK_THAT(fmt::format("{}", y), Contains("grad_fn=matmul"));
  CHECK_THAT(fmt::format("{}", x), Contains("requires_grad=True"));
  CHECK(fmt::format("{}", Var<TestType>()) == "Var(undefined)");
}

TEMPLATE_TEST_CASE("autograd: detach stops gradients", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(f64<TestType>({1.0, 2.0, 3.0}, {3}), true);
  const V d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.value().storage() == x.value().storage());
  (d * x + x.detach().exp()).sum().backward();
  check_values(x.grad(), {1.0, 2.0, 3.0});
}

TEMPLATE_TEST_CASE("autograd: backward twice through a freed graph throws", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(f64<TestType>({1.0, 2.0}, {2}), true);
  const V h = x.exp();
  const V loss = (h * x).sum();
  loss.backward();
  CHECK(loss.node()->inputs.empty());  // links and closures are freed
  CHECK_FALSE(static_cast<bool>(h.node()->backward));
  CHECK_THROWS_AS(loss.backward(), Error);
  CHECK_THROWS_WITH(loss.backward(), Contains("already freed"));
  // building on a freed intermediate also throws when backward reaches it
  CHECK_THROWS_WITH((h * 2.0).sum().backward(), Contains("already freed"));
  // a fresh forward works again, and leaves kept their accumulated grads
  (x.exp() * x).sum().backward();
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  check_values(x.grad(), {2 * (e1 + e1), 2 * (e2 + 2 * e2)}, 1e-9);
}

TEMPLATE_TEST_CASE("autograd: backward frees each node, and what its closure saved, as soon as it has run", "[autograd]",
                   KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(randn<TestType>({64, 64}, 3), true), w(randn<TestType>({64, 64}, 4), true);
  std::weak_ptr<autograd::Node<TestType>> late;     // made after x's only use, replayed before it
  std::weak_ptr<typename TestType::Storage> saved;  // b's value: saved by exp (its output) and by mul (an operand)
  V loss;
  {
    const V a = x * 2.0;  // x's only use: replayed last
    const V b = a.exp();
    const V c = b * w;
    late = c.node();
    saved = b.value().storage();
    loss = c.sum();
  }
  bool checked = false;
  x.register_post_accumulate_hook([&](const Tensor<TestType>&) {
    // The pass has run every node but x*2's: c and b are gone, and so is b's value, which their
    // closures saved; the nodes that still need it would have kept it.
    CHECK(late.expired());
    CHECK(saved.expired());
    checked = true;
  });
  loss.backward();
  CHECK(checked);
  CHECK(loss.node()->inputs.empty());
}

TEMPLATE_TEST_CASE("autograd: backward(retain_graph) keeps the graph for another backward, with the same gradients", "[autograd]",
                   KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(randn<TestType>({3, 4}, 5), true), w(randn<TestType>({4, 4}, 6), true);
  // A checkpointed segment inside: a retained graph recomputes it in every pass.
  auto segment = [&](const V& h) { return kiln::checkpoint<TestType>([w](const V& v) { return v.matmul(w).tanh(); }, h); };
  const V loss = (segment(x.exp()) * x).sum();
  auto grads = [&] {
    std::vector<std::vector<double>> g{to_vector<double>(x.grad()), to_vector<double>(w.grad())};
    x.zero_grad();
    w.zero_grad();
    return g;
  };
  loss.backward(true);
  const auto first = grads();
  CHECK(loss.node()->backward != nullptr);
  loss.backward(loss.value().ones_like(), true);
  CHECK(grads() == first);  // bit for bit
  loss.backward();          // the last one frees it
  CHECK(grads() == first);
  CHECK_THROWS_WITH(loss.backward(), Contains("already freed") && Contains("recompute the forward pass"));
  CHECK_THROWS_WITH(loss.backward(true), Contains("already freed"));
}

TEMPLATE_TEST_CASE("autograd: non-scalar backward needs a gradient", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(randn<TestType>({2, 3}, 2), true);
  const V y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(), Contains("backward: loss has shape [2, 3]; pass a gradient of that shape"));
  CHECK_THROWS_WITH(y.backward(Tensor<TestType>::ones({3, 2}, DType::f64)), Contains("gradient of shape [3, 2]"));
  y.backward(f64<TestType>({1, 2, 3, 4, 5, 6}, {2, 3}));
  check_values(x.grad(), {2, 4, 6, 8, 10, 12});
  V s(f64<TestType>({3.0}, {}), true);  // a 0-dim leaf as its own loss
  s.backward();
  check_values(s.grad(), {1.0});
}

TEMPLATE_TEST_CASE("autograd: inputs that need no grad get none", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(randn<TestType>({2, 3}, 3));
  V w(randn<TestType>({3, 2}, 4), true);
  V unused(randn<TestType>({2}, 5), true);
  x.matmul(w).sum().backward();
  CHECK_FALSE(x.grad().defined());
  CHECK(w.grad().defined());
  CHECK_FALSE(unused.grad().defined());
  // the unused input is consistent with gradcheck too: no grad == zero grad numerically
  const auto r = gradcheck<TestType>([](const auto& v) { return v[0] * 2.0; }, {randn<TestType>({2}, 6), randn<TestType>({3}, 7)});
  INFO(r.message);
  CHECK(r.ok);
}

TEMPLATE_TEST_CASE("autograd: leaf rules", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(randn<TestType>({2}, 8), true);
  V y = x * 2.0;
  CHECK_THROWS_WITH(y.requires_grad_(false), Contains("only leaves"));
  V i(Tensor<TestType>::arange(3));
  CHECK_THROWS_WITH(i.requires_grad_(), Contains("only float tensors"));
  CHECK_THROWS_WITH(x.set_grad(Tensor<TestType>::ones({3}, DType::f64)), Contains("set_grad"));
  x.set_grad(f64<TestType>({1.0, 1.0}, {2}));
  (x * 3.0).sum().backward();
  check_values(x.grad(), {4.0, 4.0});
  V u;
  CHECK_FALSE(u.defined());
  CHECK_FALSE(u.requires_grad());
  CHECK_THROWS_AS(u.backward(), Error);
}

TEMPLATE_TEST_CASE("autograd: max/min split ties equally, clamp is inclusive", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  // torch: x = tensor([1., 3., 3., 3.], requires_grad=True); x.max().backward() -> [0, 1/3, 1/3, 1/3]
  V x(f64<TestType>({1.0, 3.0, 3.0, 3.0}, {4}), true);
  x.max().backward();
  check_values(x.grad(), {0.0, 1.0 / 3, 1.0 / 3, 1.0 / 3});
  x.zero_grad();
  x.maximum(x).sum().backward();  // both sides of every tie: 1/2 + 1/2
  check_values(x.grad(), {1.0, 1.0, 1.0, 1.0});
  // torch: x = tensor([-1., 0.5, 1., 2.], requires_grad=True); x.clamp(-1, 1).sum().backward() -> [1, 1, 1, 0]
  V c(f64<TestType>({-1.0, 0.5, 1.0, 2.0}, {4}), true);
  c.clamp(-1.0, 1.0).sum().backward();
  check_values(c.grad(), {1.0, 1.0, 1.0, 0.0});
  // relu at 0 has gradient 0 (torch convention)
  V r(f64<TestType>({-1.0, 0.0, 2.0}, {3}), true);
  r.relu().sum().backward();
  check_values(r.grad(), {0.0, 0.0, 1.0});
}

TEMPLATE_TEST_CASE("autograd: to(dtype) casts the gradient back", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(Tensor<TestType>::from_vector(std::vector<float>{1.f, 2.f}, {2}), true);
  const V y = x.to(DType::f64);
  CHECK(y.dtype() == DType::f64);
  (y * y).sum().backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::f32);
  check_values(x.grad(), {2.0, 4.0});
  const V n = x.to(DType::i64);  // integers carry no gradient
  CHECK_FALSE(n.requires_grad());
  CHECK(x.to(DType::f32).node() == x.node());
}

TEMPLATE_TEST_CASE("autograd: pow edge cases match torch", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  // torch: a = tensor([0., 2.], requires_grad=True); b = tensor([2., 0.], requires_grad=True)
  //        (a ** b).sum().backward() -> a.grad = [0, 0], b.grad = [0, log 2]
  V a(f64<TestType>({0.0, 2.0}, {2}), true), b(f64<TestType>({2.0, 0.0}, {2}), true);
  a.pow(b).sum().backward();
  check_values(a.grad(), {0.0, 0.0});
  check_values(b.grad(), {0.0, std::log(2.0)});
}

TEMPLATE_TEST_CASE("autograd: long chains neither overflow the stack nor leak", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V x(f64<TestType>({1.0}, {1}), true);
  V y = x;
  for (int i = 0; i < 20000; ++i) y = y * 1.0;
  y.sum().backward();
  check_values(x.grad(), {1.0});
  std::weak_ptr<autograd::Node<TestType>> first;
  {
    V z = x;
    for (int i = 0; i < 100000; ++i) {
      z = z + 0.0;
      if (i == 0) first = z.node();
    }
  }  // the whole unused graph dies here, iteratively
  CHECK(first.expired());
}

TEMPLATE_TEST_CASE("gradcheck: catches a wrong gradient and names it", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  // x.detach() * x has numeric derivative 2x but analytic x: gradcheck must fail. (Both sides are
  // scaled by gradcheck's random projection, so only the factor 2 between them is predictable.)
  const auto r = gradcheck<TestType>([](const auto& v) { return v[1] + v[0].detach() * v[0]; },
                                     {f64<TestType>({1.0, 2.0}, {2}), f64<TestType>({0.5, 0.5}, {2})});
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.message, Contains("input 0 (shape [2]) element [0]: analytic") && Contains("vs numeric") && Contains("1 more mismatches"));
  CHECK(r.max_abs_err > 0.1);
  double analytic = 0, numeric = 0;
  REQUIRE(std::sscanf(r.message.c_str(), "gradcheck: input 0 (shape [2]) element [0]: analytic %lf vs numeric %lf", &analytic, &numeric) ==
          2);
  CHECK(numeric == Approx(2 * analytic).epsilon(1e-6));
  // float32 inputs are refused
  CHECK_THROWS_WITH(gradcheck<TestType>([](const auto& v) { return v[0]; }, {Tensor<TestType>::ones({2})}), Contains("f64"));
}
