// gradcheck of every elementwise op: unary on contiguous, transposed, sliced, size-1 and 0-dim inputs;
// binary ops on broadcasting pairs; scalar forms; maximum/minimum with ties; where; clamp.
#include "helpers.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {
// Shapes and layouts every unary op is checked on. lo/hi: the domain (uniform), or normal when lo == hi.
template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> unary_inputs(double lo, double hi, uint64_t seed) {
  auto make = [&](const Shape& s, uint64_t k) { return lo == hi ? randn<B>(s, seed + k) : uniform<B>(s, lo, hi, seed + k); };
  return {
      {"[3, 4]", make({3, 4}, 0)},
      {"transposed [4, 3]^T", make({4, 3}, 1).t()},
      {"sliced [2, 6][:, ::2]", make({2, 6}, 2).slice(1, 0, 6, 2)},
      {"size-1 dims [1, 3, 1]", make({1, 3, 1}, 3)},
      {"0-dim", make({}, 4)},
  };
}
}  // namespace

TEMPLATE_TEST_CASE("gradcheck: unary elementwise ops", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  struct U {
    const char* name;
    std::function<V(const V&)> f;
    double lo, hi;
  };
  const std::vector<U> ops = {
      {"neg", [](const V& x) { return x.neg(); }, 0, 0},         {"abs", [](const V& x) { return x.abs(); }, 0, 0},
      {"square", [](const V& x) { return x.square(); }, 0, 0},   {"exp", [](const V& x) { return x.exp(); }, 0, 0},
      {"log", [](const V& x) { return x.log(); }, 0.5, 2.0},     {"log1p", [](const V& x) { return x.log1p(); }, -0.5, 2.0},
      {"expm1", [](const V& x) { return x.expm1(); }, 0, 0},     {"sqrt", [](const V& x) { return x.sqrt(); }, 0.5, 2.0},
      {"rsqrt", [](const V& x) { return x.rsqrt(); }, 0.5, 2.0}, {"reciprocal", [](const V& x) { return x.reciprocal(); }, 0.5, 2.0},
      {"sin", [](const V& x) { return x.sin(); }, 0, 0},         {"cos", [](const V& x) { return x.cos(); }, 0, 0},
      {"tanh", [](const V& x) { return x.tanh(); }, 0, 0},       {"sigmoid", [](const V& x) { return x.sigmoid(); }, 0, 0},
      {"relu", [](const V& x) { return x.relu(); }, 0, 0},       {"silu", [](const V& x) { return x.silu(); }, 0, 0},
      {"gelu", [](const V& x) { return x.gelu(); }, 0, 0},       {"gelu(tanh)", [](const V& x) { return x.gelu(true); }, 0, 0},
      {"-x (operator)", [](const V& x) { return -x; }, 0, 0},
  };
  uint64_t seed = 100;
  for (const U& op : ops) {
    for (const auto& [layout, x] : unary_inputs<TestType>(op.lo, op.hi, seed += 10))
      check_grad<TestType>(std::string(op.name) + " on " + layout, [&](const auto& v) { return op.f(v[0]); }, {x});
  }
}

TEMPLATE_TEST_CASE("gradcheck: gelu at exactly 0 and far in the tails", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto x = f64<TestType>({0.0, -6.0, 6.0, 1e-3, -1e-3, 2e-5, -9e-6, 1e-300}, {8});
  check_grad<TestType>("gelu", [](const auto& v) { return v[0].gelu(); }, {x});
  check_grad<TestType>("gelu(tanh)", [](const auto& v) { return v[0].gelu(true); }, {x});
  // torch: x = tensor([0., 1e-30, -1e-7, 0.5], dtype=float64, requires_grad=True); F.gelu(x).sum().backward()
  //        x.grad.tolist() -> [0.5, 0.5, 0.49999992021154394, 0.8674951246561629]
  Var<TestType> v(f64<TestType>({0.0, 1e-30, -1e-7, 0.5}, {4}), true);
  v.gelu().sum().backward();
  check_values(v.grad(), {0.5, 0.5, 0.49999992021154394, 0.8674951246561629}, 1e-13);
}

TEMPLATE_TEST_CASE("gradcheck: binary ops with broadcasting", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  struct Bin {
    const char* name;
    std::function<V(const V&, const V&)> f;
    bool positive_b;  // b in [0.5, 2] (div) ; a in [0.5, 2] too for pow
  };
  const std::vector<Bin> ops = {
      {"add", [](const V& a, const V& b) { return a + b; }, false},
      {"sub", [](const V& a, const V& b) { return a - b; }, false},
      {"mul", [](const V& a, const V& b) { return a * b; }, false},
      {"div", [](const V& a, const V& b) { return a / b; }, true},
      {"pow", [](const V& a, const V& b) { return a.pow(b); }, true},
      {"maximum", [](const V& a, const V& b) { return a.maximum(b); }, false},
      {"minimum", [](const V& a, const V& b) { return a.minimum(b); }, false},
  };
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3, 4}, {3, 4}}, {{3, 1}, {1, 4}}, {{4}, {2, 3, 4}}, {{}, {2, 3}}, {{2, 1, 3}, {4, 1}}, {{2, 3}, {1}},
  };
  uint64_t seed = 500;
  for (const Bin& op : ops) {
    for (const auto& [sa, sb] : pairs) {
      seed += 2;
      const bool pow = std::string(op.name) == "pow";
      const auto a = pow ? uniform<TestType>(sa, 0.5, 2.0, seed) : randn<TestType>(sa, seed);
      const auto b = op.positive_b ? uniform<TestType>(sb, 0.5, 2.0, seed + 1) : randn<TestType>(sb, seed + 1);
      check_grad<TestType>(fmt::format("{} {} with {}", op.name, shape_str(sa), shape_str(sb)),
                           [&](const auto& v) { return op.f(v[0], v[1]); }, {a, b});
    }
    // non-contiguous operands
    const auto at = (op.name == std::string("pow") ? uniform<TestType>({4, 3}, 0.5, 2.0, seed + 7) : randn<TestType>({4, 3}, seed + 7)).t();
    const auto bs = op.positive_b ? uniform<TestType>({3, 8}, 0.5, 2.0, seed + 8).slice(1, 1, 8, 2)
                                  : randn<TestType>({3, 8}, seed + 8).slice(1, 1, 8, 2);
    check_grad<TestType>(fmt::format("{} transposed with sliced", op.name), [&](const auto& v) { return op.f(v[0], v[1]); }, {at, bs});
  }
}

TEMPLATE_TEST_CASE("gradcheck: operators with constant tensors", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto c = uniform<TestType>({3, 1}, 0.5, 2.0, 7);
  const auto x = randn<TestType>({3, 4}, 8);
  check_grad<TestType>("var + tensor", [&](const auto& v) { return v[0] + c; }, {x});
  check_grad<TestType>("tensor - var", [&](const auto& v) { return c - v[0]; }, {x});
  check_grad<TestType>("var * tensor", [&](const auto& v) { return v[0] * c; }, {x});
  check_grad<TestType>("tensor / var", [&](const auto& v) { return c / (v[0].square() + 1.0); }, {x});
}

TEMPLATE_TEST_CASE("gradcheck: maximum/minimum with ties", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  // ties at positions 0 and 2; the tie gets half the gradient on each side, which is also what the
  // central difference sees.
  const auto a = f64<TestType>({1.0, 2.0, -0.5, 0.25}, {4});
  const auto b = f64<TestType>({1.0, 0.5, -0.5, 3.0}, {4});
  check_grad<TestType>("maximum", [](const auto& v) { return v[0].maximum(v[1]); }, {a, b});
  check_grad<TestType>("minimum", [](const auto& v) { return v[0].minimum(v[1]); }, {a, b});
  check_grad<TestType>("maximum(scalar) tie", [](const auto& v) { return v[0].maximum(1.0); }, {a});
  check_grad<TestType>("minimum(scalar) tie", [](const auto& v) { return v[0].minimum(-0.5); }, {a});
}

TEMPLATE_TEST_CASE("gradcheck: scalar forms and clamp", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto x = randn<TestType>({2, 3}, 31);
  const auto xp = uniform<TestType>({2, 3}, 0.5, 2.0, 32);
  check_grad<TestType>("x + s", [](const auto& v) { return v[0] + 2.5; }, {x});
  check_grad<TestType>("s + x", [](const auto& v) { return 2.5 + v[0]; }, {x});
  check_grad<TestType>("x - s", [](const auto& v) { return v[0] - 1.5; }, {x});
  check_grad<TestType>("s - x", [](const auto& v) { return 1.5 - v[0]; }, {x});
  check_grad<TestType>("x * s", [](const auto& v) { return v[0] * -3.0; }, {x});
  check_grad<TestType>("s * x", [](const auto& v) { return 3 * v[0]; }, {x});
  check_grad<TestType>("x / s", [](const auto& v) { return v[0] / 4.0; }, {x});
  check_grad<TestType>("s / x", [](const auto& v) { return 2.0 / v[0]; }, {xp});
  check_grad<TestType>("x^3", [](const auto& v) { return v[0].pow(3); }, {x});
  check_grad<TestType>("x^0.5", [](const auto& v) { return v[0].pow(0.5); }, {xp});
  check_grad<TestType>("x^-1.5", [](const auto& v) { return v[0].pow(-1.5); }, {xp});
  check_grad<TestType>("x^0", [](const auto& v) { return v[0].pow(0); }, {x});
  check_grad<TestType>("maximum(x, 0.1)", [](const auto& v) { return v[0].maximum(0.1); }, {x});
  check_grad<TestType>("minimum(x, 0.1)", [](const auto& v) { return v[0].minimum(0.1); }, {x});
  check_grad<TestType>("clamp(-0.5, 0.5)", [](const auto& v) { return v[0].clamp(-0.5, 0.5); }, {x});
}

TEMPLATE_TEST_CASE("gradcheck: where with broadcasting", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto cond = randn<TestType>({3, 4}, 41).gt(0.0);
  const auto a = randn<TestType>({3, 4}, 42);
  const auto b = randn<TestType>({4}, 43);
  check_grad<TestType>("where(cond, a, b)", [&](const auto& v) { return where(cond, v[0], v[1]); }, {a, b});
  check_grad<TestType>("where(cond, a, s)", [&](const auto& v) { return where(cond, v[0], -1.0); }, {a});
  check_grad<TestType>("where(cond, s, b)", [&](const auto& v) { return where(cond, 2.0, v[0]); }, {b});
  check_grad<TestType>("where(cond[4], a^T, b)", [&](const auto& v) { return where(cond.select(0, 1), v[0].t(), v[1]); },
                       {randn<TestType>({4, 3}, 44), randn<TestType>({4}, 45)});
}
