// gradcheck of reductions (with and without ties), matmul in every torch.matmul shape case, softmax
// and log_softmax along every axis, and a few composites.
#include "helpers.hpp"

using namespace kiln;
using namespace kiln::test;

TEMPLATE_TEST_CASE("gradcheck: sum/mean/max/min over axes", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  const std::vector<std::vector<int64_t>> axes_list = {{}, {0}, {1}, {-1}, {0, 2}, {2, 0, 1}};
  const std::vector<std::pair<std::string, Tensor<TestType>>> inputs = {
      {"[2, 3, 4]", randn<TestType>({2, 3, 4}, 1)},
      {"permuted [4, 2, 3] -> [2, 3, 4]", randn<TestType>({4, 2, 3}, 2).permute({1, 2, 0})},
      {"size-1 [2, 1, 3]", randn<TestType>({2, 1, 3}, 3)},
  };
  const std::vector<std::pair<const char*, std::function<V(const V&, const std::vector<int64_t>&, bool)>>> ops = {
      {"sum", [](const V& x, const auto& a, bool k) { return x.sum(a, k); }},
      {"mean", [](const V& x, const auto& a, bool k) { return x.mean(a, k); }},
      {"max", [](const V& x, const auto& a, bool k) { return x.max(a, k); }},
      {"min", [](const V& x, const auto& a, bool k) { return x.min(a, k); }},
  };
  for (const auto& [name, op] : ops)
    for (const auto& [layout, x] : inputs)
      for (const auto& axes : axes_list)
        for (bool keepdim : {false, true})
          check_grad<TestType>(fmt::format("{} over [{}] keepdim={} on {}", name, fmt::join(axes, ","), keepdim, layout),
                               [&](const auto& v) { return op(v[0], axes, keepdim); }, {x});
  check_grad<TestType>("sum of a 0-dim", [](const auto& v) { return v[0].sum(); }, {randn<TestType>({}, 4)});
  check_grad<TestType>("sum_to [3, 1]", [](const auto& v) { return v[0].sum_to({3, 1}); }, {randn<TestType>({2, 3, 4}, 5)});
}

TEMPLATE_TEST_CASE("gradcheck: max/min with two-way ties", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  // Rows tie in pairs: ties split the gradient equally, which a central difference confirms for two.
  const auto x = f64<TestType>({1.0, 3.0, 3.0, -2.0, 0.5, -2.0}, {2, 3});
  check_grad<TestType>("max axis 1", [](const auto& v) { return v[0].max({1}); }, {x});
  check_grad<TestType>("min axis 1 keepdim", [](const auto& v) { return v[0].min({1}, true); }, {x});
  check_grad<TestType>("max all", [](const auto& v) { return v[0].max(); }, {x});
  check_grad<TestType>("min all", [](const auto& v) { return v[0].min(); }, {x});
  check_grad<TestType>("max axis 0 (no ties)", [](const auto& v) { return v[0].max({0}); }, {x});
}

TEMPLATE_TEST_CASE("gradcheck: matmul, all torch.matmul cases", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3}, {3}},                 // dot
      {{3}, {3, 4}},              // vector @ matrix
      {{2, 3}, {3}},              // matrix @ vector
      {{2, 3}, {3, 4}},           // matrix @ matrix
      {{2, 2, 3}, {2, 3, 4}},     // batched
      {{2, 1, 2, 3}, {3, 3, 2}},  // broadcast batch [2, 1] x [3]
      {{2, 3}, {2, 3, 2}},        // matrix @ batch
      {{2, 2, 3}, {3, 2}},        // batch @ matrix
      {{3}, {2, 3, 4}},           // vector @ batch
      {{2, 2, 3}, {3}},           // batch @ vector
      {{1, 3}, {3, 1}},           // size-1 dims
  };
  uint64_t seed = 10;
  for (const auto& [sa, sb] : cases) {
    seed += 2;
    check_grad<TestType>(fmt::format("matmul {} @ {}", shape_str(sa), shape_str(sb)), [](const auto& v) { return matmul(v[0], v[1]); },
                         {randn<TestType>(sa, seed), randn<TestType>(sb, seed + 1)});
  }
  check_grad<TestType>("matmul transposed operands", [](const auto& v) { return v[0].t().matmul(v[1].t()); },
                       {randn<TestType>({3, 2}, 50), randn<TestType>({4, 3}, 51)});
  check_grad<TestType>("matmul sliced operand", [](const auto& v) { return v[0].slice(1, 0, 6, 2).matmul(v[1]); },
                       {randn<TestType>({2, 6}, 52), randn<TestType>({3, 2}, 53)});
  // sum's gradient reaches matmul's backward as a stride-0 (expanded) tensor
  check_grad<TestType>("matmul then sum", [](const auto& v) { return v[0].matmul(v[1]).sum(); },
                       {randn<TestType>({2, 2, 3}, 57), randn<TestType>({3, 4}, 58)});
  // only one side needs grad
  const auto w = randn<TestType>({3, 2}, 54);
  check_grad<TestType>("matmul, constant right", [&](const auto& v) { return v[0].matmul(Var<TestType>(w)); },
                       {randn<TestType>({2, 3}, 55)});
  check_grad<TestType>("matmul, constant left", [&](const auto& v) { return Var<TestType>(w).t().matmul(v[0]); },
                       {randn<TestType>({3, 2}, 56)});
}

TEMPLATE_TEST_CASE("gradcheck: softmax and log_softmax on every axis", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto x = randn<TestType>({2, 3, 4}, 60);
  const auto xt = randn<TestType>({4, 3, 2}, 61).transpose(0, 2);
  for (int64_t axis : {0, 1, 2, -1}) {
    for (const auto& [layout, in] : {std::pair{"contiguous", x}, std::pair{"transposed", xt}}) {
      check_grad<TestType>(fmt::format("softmax axis {} {}", axis, layout), [axis](const auto& v) { return v[0].softmax(axis); }, {in});
      check_grad<TestType>(fmt::format("log_softmax axis {} {}", axis, layout), [axis](const auto& v) { return v[0].log_softmax(axis); },
                           {in});
    }
  }
  check_grad<TestType>("softmax over a size-1 axis", [](const auto& v) { return v[0].softmax(1); }, {randn<TestType>({3, 1}, 62)});
}

TEMPLATE_TEST_CASE("gradcheck: composites", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  // cross-entropy: -mean(log_softmax(logits)[target])
  const auto target = i64<TestType>({2, 0, 2, 1}, {4, 1});
  check_grad<TestType>("cross-entropy", [&](const auto& v) { return v[0].log_softmax(1).gather(1, target).mean().neg(); },
                       {randn<TestType>({4, 3}, 70)});
  // a two-layer MLP with a bias broadcast and every input needing grad
  check_grad<TestType>("mlp", [](const auto& v) { return (v[0].matmul(v[1]) + v[2]).tanh().matmul(v[3]).gelu().softmax(-1); },
                       {randn<TestType>({3, 4}, 71), randn<TestType>({4, 5}, 72), randn<TestType>({5}, 73), randn<TestType>({5, 2}, 74)});
  // a value used several times through different paths
  check_grad<TestType>("reuse", [](const auto& v) { return v[0] * v[0].exp() + v[0].sum({0}, true) * v[1] - v[1] / (v[0].square() + 1.0); },
                       {randn<TestType>({2, 3}, 75), randn<TestType>({3}, 76)});
  // rms-norm built from primitives
  check_grad<TestType>("rmsnorm", [](const auto& v) { return v[0] * (v[0].square().mean({-1}, true) + 1e-5).rsqrt() * v[1]; },
                       {randn<TestType>({2, 4}, 77), randn<TestType>({4}, 78)});
}
