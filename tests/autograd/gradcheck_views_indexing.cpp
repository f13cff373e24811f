// gradcheck of views, combinators and indexing ops (repeated indices included).
#include "helpers.hpp"

using namespace kiln;
using namespace kiln::test;

TEMPLATE_TEST_CASE("gradcheck: views", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto x = randn<TestType>({2, 3, 4}, 1);
  const auto xt = randn<TestType>({4, 3, 2}, 2).transpose(0, 2);  // non-contiguous [2, 3, 4]
  for (const auto& [layout, in] : {std::pair{"contiguous", x}, std::pair{"transposed", xt}}) {
    INFO(layout);
    check_grad<TestType>("reshape", [](const auto& v) { return v[0].reshape({6, -1}); }, {in});
    check_grad<TestType>("permute", [](const auto& v) { return v[0].permute({2, 0, 1}); }, {in});
    check_grad<TestType>("transpose", [](const auto& v) { return v[0].transpose(0, 2); }, {in});
    check_grad<TestType>("narrow", [](const auto& v) { return v[0].narrow(1, 1, 2); }, {in});
    check_grad<TestType>("slice step 2", [](const auto& v) { return v[0].slice(2, 0, 4, 2); }, {in});
    check_grad<TestType>("slice negative", [](const auto& v) { return v[0].slice(-1, -3, -1); }, {in});
    check_grad<TestType>("select", [](const auto& v) { return v[0].select(1, -1); }, {in});
    check_grad<TestType>("flatten(1, 2)", [](const auto& v) { return v[0].flatten(1, 2); }, {in});
    check_grad<TestType>("flatten()", [](const auto& v) { return v[0].flatten(); }, {in});
    check_grad<TestType>("contiguous", [](const auto& v) { return v[0].contiguous(); }, {in});
    check_grad<TestType>("clone", [](const auto& v) { return v[0].clone(); }, {in});
    check_grad<TestType>("unsqueeze", [](const auto& v) { return v[0].unsqueeze(1); }, {in});
  }
  check_grad<TestType>("view", [](const auto& v) { return v[0].view({3, 8}); }, {x});
  check_grad<TestType>("t", [](const auto& v) { return v[0].t(); }, {randn<TestType>({2, 3}, 3)});
  check_grad<TestType>("expand", [](const auto& v) { return v[0].expand({2, 3, 4}); }, {randn<TestType>({3, 1}, 4)});
  check_grad<TestType>("expand -1", [](const auto& v) { return v[0].expand({2, -1, 4}); }, {randn<TestType>({1, 3, 1}, 5)});
  check_grad<TestType>("squeeze()", [](const auto& v) { return v[0].squeeze(); }, {randn<TestType>({1, 3, 1, 2}, 6)});
  check_grad<TestType>("squeeze(2)", [](const auto& v) { return v[0].squeeze(2); }, {randn<TestType>({1, 3, 1, 2}, 7)});
  check_grad<TestType>("overlapping views", [](const auto& v) { return v[0].narrow(0, 0, 3) * v[0].narrow(0, 1, 3); },
                       {randn<TestType>({4, 2}, 8)});
}

TEMPLATE_TEST_CASE("gradcheck: cat, stack, split, chunk", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto a = randn<TestType>({2, 1, 3}, 10), b = randn<TestType>({2, 3, 3}, 11), c = randn<TestType>({3, 2}, 12).t().unsqueeze(1);
  check_grad<TestType>("cat axis 1", [](const auto& v) { return cat<TestType>({v[0], v[1], v[2]}, 1); }, {a, b, c});
  check_grad<TestType>("cat with a repeated input", [](const auto& v) { return cat<TestType>({v[0], v[0].exp()}, -1); }, {a});
  const auto s0 = randn<TestType>({2, 3}, 13), s1 = randn<TestType>({3, 2}, 14).t();
  for (int64_t axis : {0, 1, 2})
    check_grad<TestType>(fmt::format("stack axis {}", axis),
                         [axis](const auto& v) {
                           return stack<TestType>({v[0], v[1].square()}, axis);
                         },
                         {s0, s1});
  const auto x = randn<TestType>({2, 7}, 15);
  // each piece goes through a different function so a misplaced piece gradient is caught
  check_grad<TestType>("split(3, 1)",
                       [](const auto& v) {
                         auto p = v[0].split(3, 1);
                         return cat<TestType>({p[0].exp(), p[1] * 2.0, p[2].square()}, 1);
                       },
                       {x});
  check_grad<TestType>("split({1, 4, 2}, 1)",
                       [](const auto& v) {
                         auto p = v[0].split(std::vector<int64_t>{1, 4, 2}, 1);
                         return p[0].sum() * p[1].sum() + p[2].sin().sum();
                       },
                       {x});
  check_grad<TestType>("chunk(2, 0)",
                       [](const auto& v) {
                         auto p = v[0].chunk(2, 0);
                         return p[0] * p[1].tanh();
                       },
                       {x});
}

TEMPLATE_TEST_CASE("gradcheck: gather, index_select, scatter_add, index_add", "[autograd][gradcheck]", KILN_BACKEND_TYPES) {
  const auto x = randn<TestType>({3, 4}, 20);
  // repeated indices (0 twice in row 0, 3 twice in row 2), index narrower than x along the other axis
  const auto gi = i64<TestType>({0, 0, 2, 1, 3, 1, 3, 3, 0}, {3, 3});
  check_grad<TestType>("gather axis 1", [&](const auto& v) { return v[0].gather(1, gi); }, {x});
  const auto gi0 = i64<TestType>({2, 2, 0, 1}, {1, 4});
  check_grad<TestType>("gather, the index passed as a (non-differentiable) gradcheck input",
                       [](const auto& v) { return v[0].gather(1, v[1].value()); }, {x, gi});
  check_grad<TestType>("gather axis 0", [&](const auto& v) { return v[0].gather(0, gi0); }, {x});
  check_grad<TestType>("gather from transposed",
                       [&](const auto& v) {
                         return v[0].t().gather(1, i64<TestType>({0, 2, 2, 1, 1, 1}, {3, 2}));
                       },
                       {randn<TestType>({3, 4}, 21)});
  const auto si = i64<TestType>({2, 0, 2, 2, 1}, {5});
  check_grad<TestType>("index_select axis 0", [&](const auto& v) { return v[0].index_select(0, si); }, {x});
  check_grad<TestType>("index_select axis 1", [&](const auto& v) { return v[0].index_select(1, si.narrow(0, 0, 3)); }, {x});
  // scatter_add: index [2, 3] smaller than src [3, 3]; repeated targets accumulate
  const auto ti = i64<TestType>({1, 1, 3, 0, 1, 1}, {2, 3});
  check_grad<TestType>("scatter_add axis 1", [&](const auto& v) { return v[0].scatter_add(1, ti, v[1]); },
                       {x, randn<TestType>({3, 3}, 22)});
  check_grad<TestType>("scatter_add axis 0",
                       [&](const auto& v) {
                         return v[0].scatter_add(0, i64<TestType>({2, 2, 0, 2}, {2, 2}), v[1]);
                       },
                       {x, randn<TestType>({2, 2}, 23)});
  check_grad<TestType>("index_add axis 0", [&](const auto& v) { return v[0].index_add(0, si, v[1]); }, {x, randn<TestType>({5, 4}, 24)});
  check_grad<TestType>("index_add axis 1",
                       [&](const auto& v) {
                         return v[0].index_add(1, i64<TestType>({3, 3}, {2}), v[1]);
                       },
                       {x, randn<TestType>({3, 2}, 25)});
  // embedding-style lookup: index_select rows of a table, then a reduction
  check_grad<TestType>("embedding", [&](const auto& v) { return v[0].index_select(0, si).mul(v[1]).sum({1}); },
                       {x, randn<TestType>({4}, 26)});
}
