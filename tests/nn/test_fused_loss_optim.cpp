// The fused softmax cross-entropy (core/fused_loss.hpp) and multi-tensor Adam/AdamW
// (core/fused_optim.hpp): each backend's kernels against the composite built from tensor ops
// (Reference runs the composite), float64 finite differences of the loss, and the fused optimizer step
// against the per-parameter composite update.
#include <catch2/catch.hpp>

#include <kiln/autograd/autocast.hpp>
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/fused_loss.hpp>
#include <kiln/core/fused_optim.hpp>
#include <kiln/nn/loss.hpp>

using namespace kiln;

namespace {

template <Backend B> double max_rel(const Tensor<B>& a, const Tensor<Reference>& b) {
  const std::vector<double> x = a.template to<Cpu>().template to_vector<double>(), y = b.template to_vector<double>();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (1.0 + std::abs(y[i])));
  return worst;
}

}  // namespace

TEMPLATE_TEST_CASE("fused cross-entropy: forward, lse and dlogits equal the composite (ignore_index, smoothing)", "[loss][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(31);
  for (DType d : {DType::f32, DType::f64})
    for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 37}, {33, 1000}, {5, 4099}})
      for (double s : {0.0, 0.1}) {
        INFO("N " << N << " C " << C << " smoothing " << s << " dtype " << dtype_name(d));
        const Tensor<Reference> x = Tensor<Reference>::randn({N, C}, DType::f64, &gen).mul(3.0).to(d);
        std::vector<int64_t> tv;
        for (int64_t i = 0; i < N; ++i) tv.push_back(i % 3 == 2 ? -100 : (i * 7919) % C);
        const Tensor<Reference> t = Tensor<Reference>::from_vector(tv, {N});
        const Tensor<Reference> g = Tensor<Reference>::randn({N}, DType::f64, &gen).to(d);
        auto [rl, rlse] = fused::cross_entropy_forward(x, t, -100, s);
        const Tensor<Reference> rdx = fused::cross_entropy_backward(x, rlse, t, g, -100, s);
        const Tensor<B> bx = x.to<B>(), bt = t.to<B>(), bg = g.to<B>();
        auto [bl, blse] = fused::cross_entropy_forward(bx, bt, -100, s);
        const Tensor<B> bdx = fused::cross_entropy_backward(bx, blse, bt, bg, -100, s);
        const double tol = d == DType::f64 ? 1e-12 : 2e-5;
        CHECK(max_rel(bl, rl) < tol);
        CHECK(max_rel(blse, rlse) < tol);
        CHECK(max_rel(bdx, rdx) < tol);
      }
}

// bf16/f16 logits: a backend with cross_entropy_half (the Cpu) reads them as they are, the others get
// them widened by the core; either way the loss, lse and dlogits are those of the widened f32 logits,
// bit for bit (dlogits rounded once to the logits' dtype), and under autocast nn::cross_entropy gives
// the f32 loss and the gradient it gave when it cast the logits to f32 first.
TEMPLATE_TEST_CASE("fused cross-entropy: bf16/f16 logits give what their f32 widening gives, bit for bit", "[loss][fused][amp]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(37);
  const auto bits = [](const Tensor<B>& a) { return a.template to<Cpu>().to(DType::f64).template to_vector<double>(); };
  for (DType d : {DType::bf16, DType::f16})
    for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 37}, {33, 1000}, {5, 4099}})
      for (double s : {0.0, 0.1}) {
        INFO("N " << N << " C " << C << " smoothing " << s << " dtype " << dtype_name(d));
        const Tensor<B> x = Tensor<B>::randn({N, C}, DType::f32, &gen).mul(3.0).to(d), xw = x.to(DType::f32);
        std::vector<int64_t> tv;
        for (int64_t i = 0; i < N; ++i) tv.push_back(i % 3 == 2 ? -100 : (i * 7919) % C);
        const Tensor<B> t = Tensor<B>::from_vector(tv, {N});
        const Tensor<B> g = Tensor<B>::randn({N}, DType::f32, &gen);
        auto [l, lse] = fused::cross_entropy_forward(x, t, -100, s);
        auto [lw, lsew] = fused::cross_entropy_forward(xw, t, -100, s);
        CHECK((l.dtype() == DType::f32 && lse.dtype() == DType::f32));
        CHECK(bits(l) == bits(lw));
        CHECK(bits(lse) == bits(lsew));
        const Tensor<B> dx = fused::cross_entropy_backward(x, lse, t, g, -100, s);
        CHECK(dx.dtype() == d);
        CHECK(bits(dx) == bits(fused::cross_entropy_backward(xw, lsew, t, g, -100, s).to(d)));
      }

  // nn::cross_entropy under autocast: the f32 loss and the gradient of the half logits as through a cast
  const Tensor<B> x = Tensor<B>::randn({4, 9, 50}, DType::f32, &gen).mul(2.0).to(DType::bf16);
  const Tensor<B> t = Tensor<B>::from_vector(std::vector<int64_t>{3,  -100, 10, 0,  7,  49, 1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
                                                                  13, 14,   15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30},
                                             {4, 9});
  for (double s : {0.0, 0.2}) {
    Var<B> a(x, true), b(x, true);
    Var<B> la, lb;
    {
      autocast::Scope ac(DType::bf16);
      la = nn::cross_entropy(a, t, {.ignore_index = -100, .label_smoothing = s});
    }
    lb = nn::cross_entropy(b.to(DType::f32), t, {.ignore_index = -100, .label_smoothing = s});
    CHECK(la.dtype() == DType::f32);
    CHECK(bits(la.value()) == bits(lb.value()));
    la.backward();
    lb.backward();
    CHECK(a.grad().dtype() == DType::bf16);
    CHECK(bits(a.grad()) == bits(b.grad()));
  }
}

TEMPLATE_TEST_CASE("fused cross-entropy: nn::cross_entropy passes float64 finite differences", "[loss][fused][gradcheck]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(5);
  const Tensor<B> x = Tensor<B>::randn({2, 3, 11}, DType::f64, &gen);
  const Tensor<B> t = Tensor<B>::from_vector(std::vector<int64_t>{3, -100, 10, 0, 7, 7}, {2, 3});
  for (double s : {0.0, 0.2}) {
    const auto r = gradcheck<B>(
        [&](const std::vector<Var<B>>& in) { return nn::cross_entropy(in[0], t, {.ignore_index = -100, .label_smoothing = s}); }, {x});
    INFO(r.message);
    CHECK(r.ok);
  }
}

TEMPLATE_TEST_CASE("fused Adam/AdamW: the multi-tensor step equals the per-parameter composite", "[optim][fused]", KILN_BACKEND_TYPES) {
  using B = TestType;
  for (DType d : {DType::f32, DType::f64})
    for (bool decoupled : {true, false}) {
      INFO("dtype " << dtype_name(d) << " decoupled " << decoupled);
      Generator gen(11);
      const std::vector<Shape> shapes{{0}, {1}, {3, 5}, {4097}, {64, 129}};
      std::vector<Tensor<B>> w1, m1, v1, w2, m2, v2;
      for (const Shape& s : shapes) {
        w1.push_back(Tensor<B>::randn(s, d, &gen));
        w2.push_back(w1.back().clone());
        m1.push_back(Tensor<B>::zeros(s, d));
        m2.push_back(Tensor<B>::zeros(s, d));
        v1.push_back(Tensor<B>::zeros(s, d));
        v2.push_back(Tensor<B>::zeros(s, d));
      }
      for (int step = 1; step <= 3; ++step) {
        fused::AdamHyper h{.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1, .decoupled = decoupled};
        h.bc1 = 1 - std::pow(h.beta1, step);
        h.bc2_sqrt = std::sqrt(1 - std::pow(h.beta2, step));
        std::vector<Tensor<B>> grads;
        std::vector<Tensor<B>*> pw, pm, pv;
        for (size_t i = 0; i < shapes.size(); ++i) {
          grads.push_back(Tensor<B>::randn(shapes[i], d, &gen));
          pw.push_back(&w1[i]);
          pm.push_back(&m1[i]);
          pv.push_back(&v1[i]);
          fused::adam_step_composite(w2[i], m2[i], v2[i], grads[i], h);
        }
        fused::adam_step(pw, pm, pv, grads, h);
      }
      const double tol = d == DType::f64 ? 1e-13 : 1e-5;
      for (size_t i = 0; i < shapes.size(); ++i) {
        CHECK(max_rel(w1[i], w2[i].template to<Reference>()) < tol);
        CHECK(max_rel(m1[i], m2[i].template to<Reference>()) < tol);
        CHECK(max_rel(v1[i], v2[i].template to<Reference>()) < tol);
      }
    }
}

TEMPLATE_TEST_CASE("fused sum of squares: equals the f64 composite, whatever the views, dtypes and thread count", "[optim][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(17);
  // Sizes that straddle the Cpu kernel's chunks (65536 elements), f32 and f64, a half type, a transposed
  // view and a slice (both take the composite), an empty tensor and an undefined one.
  std::vector<Tensor<B>> xs{Tensor<B>::randn({70000}, DType::f32, &gen),
                            Tensor<B>::randn({3, 5}, DType::f64, &gen),
                            Tensor<B>::randn({65536}, DType::f32, &gen).mul(1e3),
                            Tensor<B>::randn({0}, DType::f32, &gen),
                            Tensor<B>(),
                            Tensor<B>::randn({40, 31}, DType::f32, &gen).transpose(0, 1),
                            Tensor<B>::randn({9, 8}, DType::f64, &gen).narrow(1, 2, 3),
                            Tensor<B>::randn({33}, DType::bf16, &gen),
                            Tensor<B>::randn({131073}, DType::f64, &gen)};
  double want = 0;
  for (const auto& x : xs)
    if (x.defined())
      for (double v : x.template to<Reference>().template to_vector<double>()) want += v * v;
  const Tensor<B> got = fused::sum_squares(xs);
  CHECK(got.dtype() == DType::f64);
  CHECK(got.dim() == 0);
  const double s = item<double>(got);
  CHECK(std::abs(s - want) <= 1e-12 * want);
  if constexpr (std::is_same_v<B, Cpu>) {  // the chunk sums do not depend on the threads
    const int n0 = num_threads();
    set_num_threads(1);
    const double one = item<double>(fused::sum_squares(xs));
    set_num_threads(n0);
    CHECK(one == s);
  }
  CHECK(item<double>(fused::sum_squares(std::vector<Tensor<B>>{})) == 0.0);
  CHECK_THROWS_WITH(fused::sum_squares(std::vector<Tensor<B>>{Tensor<B>::zeros({2}, DType::i64)}),
                    Catch::Matchers::Contains("sum_squares") && Catch::Matchers::Contains("i64"));
}
