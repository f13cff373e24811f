// Post-accumulate hooks and end-of-pass callbacks (autograd/var.hpp): what DistributedDataParallel
// builds on.
#include <algorithm>
#include <string>
#include <vector>

#include "helpers.hpp"

using namespace kiln;
using namespace kiln::test;
using Catch::Matchers::Contains;

TEMPLATE_TEST_CASE("autograd: a post-accumulate hook runs once per pass, after the leaf's last accumulation", "[autograd]",
                   KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V w(f64<TestType>({1.0, 2.0}, {2}), true), u(f64<TestType>({3.0, 4.0}, {2}), true), unused(f64<TestType>({1.0}, {1}), true);
  std::vector<std::string> order;
  std::vector<std::vector<double>> seen;
  w.register_post_accumulate_hook([&](const Tensor<TestType>& g) {
    order.push_back("w");
    seen.push_back(to_vector<double>(g));
  });
  u.register_post_accumulate_hook([&](const Tensor<TestType>&) { order.push_back("u"); });
  const int64_t h = unused.register_post_accumulate_hook([&](const Tensor<TestType>&) { order.push_back("unused"); });
  // w is used three times: early (w*u), late (the final w*3 is recorded last, so replayed first)
  const V a = (w * u).sum();
  const V b = (w * w).sum();
  const V loss = a + b + (w * 3.0).sum();
  loss.backward();
  // d/dw = u + 2w + 3
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<double>{8.0, 11.0});
  CHECK(std::count(order.begin(), order.end(), "w") == 1);
  CHECK(std::count(order.begin(), order.end(), "u") == 1);
  CHECK(std::count(order.begin(), order.end(), "unused") == 0);  // no gradient in this pass: no hook
  // the hook saw the final value, which .grad keeps
  check_values(w.grad(), {8.0, 11.0});
  // a second pass: the hook sees the accumulated .grad
  (w * 2.0).sum().backward();
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<double>{10.0, 13.0});
  // removing a hook
  unused.remove_post_accumulate_hook(h);
  unused.remove_post_accumulate_hook(12345);  // unknown: ignored
  (unused * 2.0).sum().backward();
  CHECK(std::count(order.begin(), order.end(), "unused") == 0);
  CHECK_THROWS_WITH((w * 2.0).register_post_accumulate_hook([](const Tensor<TestType>&) {}), Contains("only leaves accumulate"));
}

TEMPLATE_TEST_CASE("autograd: hooks fire as soon as a leaf is final, before the rest of the backward pass", "[autograd]",
                   KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  // a chain x -> l1 -> l2: the later layer's weight is final before the earlier one's gradient exists
  V x(f64<TestType>({1.0, 2.0}, {2}), false);
  V w1(f64<TestType>({0.5, -1.0}, {2}), true), w2(f64<TestType>({2.0, 3.0}, {2}), true);
  std::vector<std::string> order;
  bool w1_had_grad_when_w2_fired = true;
  w1.register_post_accumulate_hook([&](const Tensor<TestType>&) { order.push_back("w1"); });
  w2.register_post_accumulate_hook([&](const Tensor<TestType>&) {
    order.push_back("w2");
    w1_had_grad_when_w2_fired = w1.grad().defined();
  });
  ((x * w1).tanh() * w2).sum().backward();
  CHECK(order == std::vector<std::string>{"w2", "w1"});
  CHECK_FALSE(w1_had_grad_when_w2_fired);
  // a leaf that is the loss itself
  V s(f64<TestType>({1.5}, {}), true);
  int fired = 0;
  s.register_post_accumulate_hook([&](const Tensor<TestType>&) { ++fired; });
  s.backward();
  CHECK(fired == 1);
}

TEMPLATE_TEST_CASE("autograd: queue_backward_callback runs once at the end of the pass", "[autograd]", KILN_BACKEND_TYPES) {
  using V = Var<TestType>;
  V w(f64<TestType>({1.0, 2.0}, {2}), true), v(f64<TestType>({3.0}, {1}), true);
  std::vector<std::string> log;
  bool queued = false;
  w.register_post_accumulate_hook([&](const Tensor<TestType>&) {
    log.push_back("hook w");
    CHECK(autograd::in_backward());
    if (!queued) {
      queued = true;
      autograd::queue_backward_callback([&] {
        log.push_back("end");
        CHECK(v.grad().defined());                                           // every gradient is in
        autograd::queue_backward_callback([&] { log.push_back("end 2"); });  // a callback may queue another
      });
    }
  });
  v.register_post_accumulate_hook([&](const Tensor<TestType>&) { log.push_back("hook v"); });
  ((w * 2.0).sum() * v.sum()).backward();
  CHECK(log.back() == "end 2");
  CHECK(log[log.size() - 2] == "end");
  CHECK(log.size() == 4);
  CHECK_FALSE(autograd::in_backward());
  CHECK_THROWS_WITH(autograd::queue_backward_callback([] {}), Contains("no backward pass is running"));
  // a pass that throws drops its callbacks and leaves no pass behind
  queued = false;
  log.clear();
  const V bad = (w * 2.0).sum();
  w.register_post_accumulate_hook([&](const Tensor<TestType>&) { throw Error("hook failed"); });
  CHECK_THROWS_WITH(bad.backward(), Contains("hook failed"));
  CHECK_FALSE(autograd::in_backward());
  CHECK(std::find(log.begin(), log.end(), "end") == log.end());
}
