// The gradient clip folded into the optimizer step (kiln::fit's path: Optimizer::step_scaled, and
// fused::AdamHyper::grad_scale inside the multi-tensor Adam/AdamW kernels): bit for bit what the
// explicit g.mul_(scale) followed by step() gives, the weights, the optimizer state and the gradients
// left in .grad(), for every optimizer, dtype and backend; and the global norm's multi-tensor pass
// reproducible for a given thread count.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>

#include <kiln/backends/backends.hpp>
#include <kiln/core/fused_optim.hpp>
#include <kiln/optim/adafactor.hpp>
#include <kiln/optim/lion.hpp>
#include <kiln/optim/rmsprop.hpp>

#include "common/kiln_test.hpp"

using namespace kiln;

namespace {

// Not a power of two, and its f32 rounding is inexact: a product formed in f64 and then rounded to
// f32 differs from the f32 product in some elements (the mutant the checks below must catch).
constexpr double kScale = 0.3719;

// Shapes across the Cpu kernel's vector widths (8 and 16 lanes) and tails, and the Cuda tile (4096).
const std::vector<Shape> kShapes{{1}, {7}, {17}, {3, 5}, {4097}, {64, 129}};

}  // namespace

TEMPLATE_TEST_CASE("fused Adam/AdamW: a gradient scale in the step equals g.mul_ then the step bit for bit", "[optim][fused][clip]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  // f32 and f64 take the fused kernel (Cpu, Cuda); bf16 the composite, which scales g in place too
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    for (bool decoupled : {true, false}) {
      INFO("dtype " << dtype_name(d) << (decoupled ? " AdamW" : " Adam with L2"));
      Generator gen(31);
      std::vector<Tensor<B>> w1, m1, v1, w2, m2, v2;
      for (const Shape& s : kShapes) {
        w1.push_back(Tensor<B>::randn(s, DType::f32, &gen).to(d));
        w2.push_back(w1.back().clone());
        for (auto* st : {&m1, &m2, &v1, &v2}) st->push_back(Tensor<B>::zeros(s, d));
      }
      for (int step = 1; step <= 3; ++step) {
        fused::AdamHyper h{.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1, .decoupled = decoupled};
        h.bc1 = 1 - std::pow(h.beta1, step);
        h.bc2_sqrt = std::sqrt(1 - std::pow(h.beta2, step));
        std::vector<Tensor<B>> g1, g2;
        std::vector<Tensor<B>*> pw1, pm1, pv1, pw2, pm2, pv2;
        for (size_t i = 0; i < kShapes.size(); ++i) {
          g1.push_back(Tensor<B>::randn(kShapes[i], DType::f32, &gen).mul(3.0).to(d));
          g2.push_back(g1.back().clone());
          g1.back().mul_(kScale);  // today's clip: a mul_ per gradient, then the step
          pw1.push_back(&w1[i]);
          pm1.push_back(&m1[i]);
          pv1.push_back(&v1[i]);
          pw2.push_back(&w2[i]);
          pm2.push_back(&m2[i]);
          pv2.push_back(&v2[i]);
        }
        fused::adam_step(pw1, pm1, pv1, g1, h);
        h.grad_scale = kScale;  // the clip in the step
        fused::adam_step(pw2, pm2, pv2, g2, h);
        for (size_t i = 0; i < kShapes.size(); ++i) {
          INFO("step " << step << ", shape " << shape_str(kShapes[i]));
          kt::check_bits(g2[i], g1[i], "the gradient, scaled in place");
          kt::check_bits(w2[i], w1[i], "w");
          kt::check_bits(m2[i], m1[i], "m");
          kt::check_bits(v2[i], v1[i], "v");
        }
      }
    }
}

namespace {

template <Backend B> std::unique_ptr<optim::Optimizer<B>> make_opt(const std::string& name, const optim::NamedParams<B>& ps) {
  using namespace optim;
  if (name == "sgd") return std::make_unique<SGD<B>>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  if (name == "adam") return std::make_unique<Adam<B>>(ps, AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
  if (name == "adamw") return std::make_unique<AdamW<B>>(ps, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  if (name == "rmsprop") return std::make_unique<RMSprop<B>>(ps, RMSpropOptions{.lr = 1e-2, .momentum = 0.5});
  if (name == "adagrad") return std::make_unique<Adagrad<B>>(ps, AdagradOptions{.lr = 1e-2});
  if (name == "lion") return std::make_unique<Lion<B>>(ps, LionOptions{.lr = 1e-3});
  if (name == "adafactor") return std::make_unique<Adafactor<B>>(ps, AdafactorOptions{});
  FAIL("no optimizer " << name);
  return nullptr;
}

}  // namespace

TEMPLATE_TEST_CASE("optimizers: step_scaled equals a mul_ per gradient then step bit for bit for every optimizer", "[optim][clip]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  for (const char* name : {"sgd", "adam", "adamw", "rmsprop", "adagrad", "lion", "adafactor"})
    for (DType d : {DType::f32, DType::f64}) {
      INFO(name << " " << dtype_name(d));
      Generator gen(5);
      optim::NamedParams<B> p1, p2;
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const Tensor<B> w = Tensor<B>::randn(kShapes[i], d, &gen);
        p1.emplace_back("p" + std::to_string(i), Var<B>(w.clone(), true));
        p2.emplace_back("p" + std::to_string(i), Var<B>(w.clone(), true));
      }
      // a parameter without a gradient is skipped by both
      p1.emplace_back("idle", Var<B>(Tensor<B>::ones({4}, d), true));
      p2.emplace_back("idle", Var<B>(Tensor<B>::ones({4}, d), true));
      auto o1 = make_opt<B>(name, p1), o2 = make_opt<B>(name, p2);
      for (int step = 0; step < 3; ++step) {
        for (size_t i = 0; i < kShapes.size(); ++i) {
          const Tensor<B> g = Tensor<B>::randn(kShapes[i], d, &gen);
          p1[i].second.set_grad(g.clone());
          p2[i].second.set_grad(g.clone());
        }
        for (auto& [n, p] : p1)
          if (Tensor<B> g = p.grad(); g.defined()) g.mul_(kScale);
        o1->step();
        o2->step_scaled(kScale);
        for (size_t i = 0; i < p1.size(); ++i) {
          INFO("step " << step << ", parameter " << p1[i].first);
          kt::check_bits(p2[i].second.value(), p1[i].second.value(), "weight");
          REQUIRE(p2[i].second.grad().defined() == p1[i].second.grad().defined());
          if (p1[i].second.grad().defined()) kt::check_bits(p2[i].second.grad(), p1[i].second.grad(), "gradient left in .grad()");
        }
      }
      const auto s1 = o1->state_dict(), s2 = o2->state_dict();
      REQUIRE(s1.size() == s2.size());
      for (size_t i = 0; i < s1.size(); ++i) kt::check_bits(s2[i].second, s1[i].second, s1[i].first);
      CHECK_THROWS_WITH(o2->step_scaled(std::numeric_limits<double>::quiet_NaN()),
                        Catch::Contains("step_scaled") && Catch::Contains("nan"));
    }
}

TEMPLATE_TEST_CASE("sum_squares: a list's sum is the in-order sum of each tensor's own bit for bit", "[optim][fused][clip]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(9);
  // sizes across the Cpu kernel's 65536-element chunks, f32 and f64, an empty tensor
  std::vector<Tensor<B>> xs;
  // (several multi-chunk tensors after the first: a sum that adds chunk sums straight into the running
  // total, not each tensor's own sum, rounds differently)
  for (int64_t n : {70000, 3, 65536, 0, 131073, 65535, 200000, 140001, 262144, 196608, 300001})
    xs.push_back(Tensor<B>::randn({n}, n % 2 ? DType::f64 : DType::f32, &gen));
  double want = 0;
  for (const auto& x : xs) want += item<double>(fused::sum_squares(std::vector<Tensor<B>>{x}));
  CHECK(item<double>(fused::sum_squares(xs)) == want);
}

namespace {

// Two Linear-like layers on a leaf each, the loss a function of both, or of the second only.
template <Backend B> struct TwoLayers {
  Var<B> w1, w2, b2;
  explicit TwoLayers(Generator& g)
      : w1(Tensor<B>::randn({300, 260}, DType::f32, &g).mul(0.05), true),
        w2(Tensor<B>::randn({260, 70}, DType::f32, &g).mul(0.05), true),
        b2(Tensor<B>::randn({70}, DType::f32, &g), true) {}
  std::vector<Var<B>> params() const { return {w1, w2, b2}; }
  Var<B> loss(const Tensor<B>& x, bool first_layer) const {
    const Var<B> h = first_layer ? Var<B>(x).matmul(w1).tanh() : Var<B>(x.narrow(1, 0, 260));
    return h.matmul(w2).add(b2).square().mean();
  }
};

}  // namespace

TEMPLATE_TEST_CASE("GradNormHooks: the norm taken in the backward equals grad_norm bit for bit", "[optim][clip]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(4);
  TwoLayers<B> net(gen);
  const Tensor<B> x = Tensor<B>::randn({16, 300}, DType::f32, &gen);
  optim::GradNormHooks<B> hooks(net.params());
  SECTION("one backward") {
    hooks.arm();
    net.loss(x, true).backward();
    const double want = optim::grad_norm(net.params());
    CHECK(hooks.norm() == want);
    // read in the backward: a gradient changed afterwards is not seen (fit takes grad_norm then)
    hooks.arm();
    for (auto& p : net.params()) p.zero_grad();
    net.loss(x, true).backward();
    Tensor<B>(net.w1.grad()).mul_(2.0);
    CHECK(hooks.norm() == want);
    CHECK(optim::grad_norm(net.params()) != want);
  }
  SECTION("micro-batches: the last backward reaches only some parameters") {
    net.loss(x, true).backward();  // w1's gradient comes from this one only
    hooks.arm();
    net.loss(x, false).backward();
    CHECK(hooks.norm() == optim::grad_norm(net.params()));
  }
  SECTION("not armed, two backward passes since arm(), another hook: grad_norm itself") {
    net.loss(x, true).backward();
    CHECK(hooks.norm() == optim::grad_norm(net.params()));
    hooks.arm();
    net.loss(x, true).backward();
    net.loss(x, false).backward();
    CHECK(hooks.norm() == optim::grad_norm(net.params()));
    const int64_t h = net.w2.register_post_accumulate_hook([](const Tensor<B>&) {});
    for (auto& p : net.params()) p.zero_grad();
    hooks.arm();
    net.loss(x, true).backward();
    const double want = optim::grad_norm(net.params());
    Tensor<B>(net.w1.grad()).mul_(2.0);
    CHECK(hooks.norm() == optim::grad_norm(net.params()));  // read now, not in the backward
    CHECK(hooks.norm() != want);
    net.w2.remove_post_accumulate_hook(h);
  }
}
