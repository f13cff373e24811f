// Scheduler objects (optim/scheduler.hpp) against torch.optim.lr_scheduler (make_cases.py): the lr of
// both parameter groups after construction and after each of 300 steps, to 1e-12 relative; a
// state_dict saved mid-run and loaded into a fresh optimizer and scheduler continues the same run;
// bad arguments are Errors naming the scheduler.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>

#include <kiln/optim/rmsprop.hpp>
#include <kiln/optim/scheduler.hpp>

#include "cases.hpp"

using namespace kiln;
using optim_test::cases;

namespace {

using Opt = optim::SGD<Cpu>;

std::unique_ptr<Opt> make_opt() {
  Var<Cpu> p(Tensor<Cpu>::zeros({1}), true), q(Tensor<Cpu>::zeros({1}), true);
  std::vector<optim::ParamGroup<Cpu>> groups{{.params = {{"p", p}}, .lr = 0.1}, {.params = {{"q", q}}, .lr = 0.02}};
  return std::make_unique<Opt>(groups, optim::SGDOptions{.lr = 0.1});
}

// The schedulers of make_cases.py, by name.
std::shared_ptr<optim::LRScheduler> make(const std::string& name, Opt& o) {
  using namespace optim;
  if (name == "StepLR") return std::make_shared<StepLR>(o, 30, 0.5);
  if (name == "MultiStepLR") return std::make_shared<MultiStepLR>(o, std::vector<int64_t>{200, 50, 120, 120}, 0.3);
  if (name == "ExponentialLR") return std::make_shared<ExponentialLR>(o, 0.98);
  if (name == "CosineAnnealingLR") return std::make_shared<CosineAnnealingLR>(o, 100, 0.001);
  if (name == "CosineAnnealingWarmRestarts") return std::make_shared<CosineAnnealingWarmRestarts>(o, 20, 2, 1e-4);
  if (name == "CosineAnnealingWarmRestarts_mult1") return std::make_shared<CosineAnnealingWarmRestarts>(o, 37);
  if (name == "OneCycleLR")
    return std::make_shared<OneCycleLR>(o, OneCycleLROptions{.max_lr = {0.5, 0.1}, .total_steps = 300, .cycle_momentum = false});
  if (name == "OneCycleLR_linear3")
    return std::make_shared<OneCycleLR>(o, OneCycleLROptions{
                                               .max_lr = {0.3},
                                               .epochs = 3,
                                               .steps_per_epoch = 100,
                                               .pct_start = 0.25,
                                               .anneal_strategy = "linear",
                                               .div_factor = 10.0,
                                               .final_div_factor = 100.0,
                                               .three_phase = true,
                                               .cycle_momentum = false,
                                           });
  if (name == "LinearLR") return std::make_shared<LinearLR>(o, 0.1, 1.0, 40);
  if (name == "LinearLR_down") return std::make_shared<LinearLR>(o, 1.0, 0.05, 300);
  if (name == "LambdaLR") return std::make_shared<LambdaLR>(o, [](int64_t e) { return std::pow(0.95, static_cast<double>(e)); });
  if (name == "LambdaLR_groups")
    return std::make_shared<LambdaLR>(o, std::vector<LambdaLR::Lambda>{[](int64_t e) { return 1.0 / static_cast<double>(1 + e); },
                                                                       [](int64_t e) { return std::pow(0.97, static_cast<double>(e)); }});
  if (name == "SequentialLR") {
    auto warm = std::make_shared<LinearLR>(o, 0.01, 1.0, 50);
    auto cos = std::make_shared<CosineAnnealingLR>(o, 250, 1e-5);
    return std::make_shared<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{warm, cos}, std::vector<int64_t>{50});
  }
  if (name == "SequentialLR_three") {
    auto a = std::make_shared<LinearLR>(o, 0.2, 1.0, 30);
    auto b = std::make_shared<ExponentialLR>(o, 0.99);
    auto c = std::make_shared<StepLR>(o, 40, 0.5);
    return std::make_shared<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{a, b, c}, std::vector<int64_t>{30, 150});
  }
  if (name == "SequentialLR_restarts") {
    auto a = std::make_shared<ExponentialLR>(o, 0.9);
    auto b = std::make_shared<CosineAnnealingWarmRestarts>(o, 25, 2);
    return std::make_shared<SequentialLR>(o, std::vector<std::shared_ptr<LRScheduler>>{a, b}, std::vector<int64_t>{10});
  }
  if (name == "ReduceLROnPlateau")
    return std::make_shared<ReduceLROnPlateau>(
        o, ReduceLROnPlateauOptions{.factor = 0.5, .patience = 5, .cooldown = 3, .min_lr = {1e-3, 1e-4}});
  if (name == "ReduceLROnPlateau_max_abs")
    return std::make_shared<ReduceLROnPlateau>(
        o, ReduceLROnPlateauOptions{.mode = "max", .factor = 0.7, .patience = 2, .threshold = 0.01, .threshold_mode = "abs"});
  FAIL("no scheduler " << name);
  return nullptr;
}

void check_lrs(const Opt& o, const optim::LRScheduler& s, const nlohmann::json& want, const std::string& where) {
  for (size_t g = 0; g < 2; ++g) {
    const double w = want[g].get<double>();
    INFO(where << " group " << g << ": kiln " << o.groups()[g].lr << " torch " << w);
    CHECK(std::abs(o.groups()[g].lr - w) <= 1e-12 * std::abs(w));
    CHECK(s.get_last_lr()[g] == o.groups()[g].lr);
  }
}

void step(optim::LRScheduler& s, const nlohmann::json& c, size_t t) {
  if (s.needs_metric())
    s.step(c["metrics"][t].get<double>());
  else
    s.step();
}

}  // namespace

TEST_CASE("schedulers: the learning rates of torch.optim.lr_scheduler, step for step over 300 steps (two groups)", "[optim][scheduler]") {
  const auto& all = cases()["schedulers"];
  REQUIRE(all.size() == 17);
  for (const auto& [name, c] : all.items()) {
    SECTION(name) {
      auto o = make_opt();
      auto s = make(name, *o);
      REQUIRE(s->kind() == name.substr(0, name.find('_')));
      const auto& lrs = c["lrs"];
      check_lrs(*o, *s, lrs[0], name + " after construction");
      for (size_t t = 0; t < 300; ++t) {
        o->step();
        step(*s, c, t);
        check_lrs(*o, *s, lrs[t + 1], fmt::format("{} step {}", name, t + 1));
      }
    }
  }
}

TEST_CASE("schedulers: state_dict mid-run, loaded into a fresh optimizer and scheduler, continues torch's run", "[optim][scheduler]") {
  const auto& all = cases()["schedulers"];
  for (const auto& [name, c] : all.items()) {
    SECTION(name) {
      auto o = make_opt();
      auto s = make(name, *o);
      for (size_t t = 0; t < 137; ++t) step(*s, c, t);
      const optim::SchedulerState state = s->state_dict();
      auto o2 = make_opt();
      auto s2 = make(name, *o2);
      s2->load_state_dict(state);
      check_lrs(*o2, *s2, c["lrs"][137], name + " after load");
      CHECK(s2->last_epoch() == s->last_epoch());
      for (size_t t = 137; t < 300; ++t) {
        step(*s2, c, t);
        check_lrs(*o2, *s2, c["lrs"][t + 1], fmt::format("{} resumed, step {}", name, t + 1));
      }
    }
  }
}

TEST_CASE("schedulers: bad arguments and states are Errors naming the scheduler", "[optim][scheduler][errors]") {
  auto o = make_opt();
  using namespace optim;
  CHECK_THROWS_WITH(StepLR(*o, 0), Catch::Contains("StepLR") && Catch::Contains("step_size"));
  CHECK_THROWS_WITH(CosineAnnealingLR(*o, 0), Catch::Contains("CosineAnnealingLR") && Catch::Contains("T_max"));
  CHECK_THROWS_WITH(CosineAnnealingWarmRestarts(*o, 10, 0), Catch::Contains("T_mult"));
  CHECK_THROWS_WITH(LinearLR(*o, 1.5), Catch::Contains("LinearLR") && Catch::Contains("start_factor"));
  CHECK_THROWS_WITH(LambdaLR(*o, std::vector<LambdaLR::Lambda>{[](int64_t) { return 1.0; }}),
                    Catch::Contains("LambdaLR") && Catch::Contains("expected 2 lr_lambdas"));
  CHECK_THROWS_WITH(OneCycleLR(*o, {.max_lr = {0.1}}), Catch::Contains("OneCycleLR") && Catch::Contains("total_steps"));
  CHECK_THROWS_WITH(OneCycleLR(*o, {.max_lr = {0.1, 0.2, 0.3}, .total_steps = 10}), Catch::Contains("max_lr") && Catch::Contains("1 or 2"));
  CHECK_THROWS_WITH(OneCycleLR(*o, {.max_lr = {0.1}, .total_steps = 10, .anneal_strategy = "exp"}), Catch::Contains("anneal_strategy"));
  CHECK_THROWS_WITH(ReduceLROnPlateau(*o, {.mode = "lowest"}), Catch::Contains("ReduceLROnPlateau") && Catch::Contains("lowest"));
  CHECK_THROWS_WITH(ReduceLROnPlateau(*o, {.factor = 1.0}), Catch::Contains("factor"));
  {
    ReduceLROnPlateau p(*o);
    CHECK_THROWS_WITH(p.step(), Catch::Contains("ReduceLROnPlateau") && Catch::Contains("metric"));
    StepLR st(*o, 3);
    CHECK_THROWS_WITH(st.step(1.0), Catch::Contains("StepLR") && Catch::Contains("ReduceLROnPlateau"));
  }
  {  // OneCycleLR refuses to step past total_steps, as PyTorch
    auto o2 = make_opt();
    OneCycleLR one(*o2, {.max_lr = {0.1}, .total_steps = 3});
    for (int i = 0; i < 3; ++i) one.step();
    CHECK_THROWS_WITH(one.step(), Catch::Contains("OneCycleLR") && Catch::Contains("total_steps is 3"));
  }
  {
    auto o2 = make_opt();
    auto a = std::make_shared<StepLR>(*o2, 3);
    auto b = std::make_shared<ExponentialLR>(*o, 0.9);
    CHECK_THROWS_WITH(SequentialLR(*o2, {a, b}, {5}), Catch::Contains("SequentialLR") && Catch::Contains("another optimizer"));
    auto c = std::make_shared<ExponentialLR>(*o2, 0.9);
    CHECK_THROWS_WITH(SequentialLR(*o2, {a, c}, {}), Catch::Contains("need 1 milestones"));
    CHECK_THROWS_WITH(SequentialLR(*o2, {a, c, a}, {9, 5}), Catch::Contains("increasing"));
  }
  {  // strict state dicts: another kind, a missing entry, a bad number
    auto o2 = make_opt();
    StepLR st(*o2, 3);
    ExponentialLR ex(*o2, 0.5);
    auto s = CosineAnnealingWarmRestarts(*o2, 5).state_dict();
    CHECK_THROWS_WITH(st.load_state_dict(s), Catch::Contains("StepLR") && Catch::Contains("unexpected entry 'T_"));
    auto e = ex.state_dict();
    e.erase("last_lr.1");
    CHECK_THROWS_WITH(st.load_state_dict(e), Catch::Contains("no 'last_lr.1'"));
    e = ex.state_dict();
    e["base_lrs.0"] = "0.1x";
    CHECK_THROWS_WITH(st.load_state_dict(e), Catch::Contains("'base_lrs.0' = '0.1x' is not a number"));
  }
}

TEST_CASE("OneCycleLR cycle_momentum: lr, momentum or beta1 and the weights step for step as PyTorch", "[optim][scheduler]") {
  using namespace optim;
  for (const char* name : {"sgd", "adamw"}) {
    SECTION(name) {
      const auto& c = cases()["onecycle_momentum"][name];
      const bool sgd = std::string(name) == "sgd";
      Var<Cpu> p(Tensor<Cpu>::from_vector(c["p0"].get<std::vector<double>>(), {4}), true);
      Var<Cpu> q(Tensor<Cpu>::from_vector(c["q0"].get<std::vector<double>>(), {3}), true);
      std::unique_ptr<Optimizer<Cpu>> opt;
      std::unique_ptr<OneCycleLR> sched;
      auto make = [&] {
        if (sgd) {
          opt = std::make_unique<SGD<Cpu>>(
              std::vector<ParamGroup<Cpu>>{{.params = {{"p", p}}, .lr = 0.1}, {.params = {{"q", q}}, .lr = 0.05}},
              SGDOptions{.lr = 0.1, .momentum = 0.9});
          sched = std::make_unique<OneCycleLR>(
              *opt, OneCycleLROptions{.max_lr = {0.5, 0.2}, .total_steps = 40, .base_momentum = {0.8, 0.7}, .max_momentum = {0.9}});
        } else {
          opt = std::make_unique<Adam<Cpu>>(std::vector<ParamGroup<Cpu>>{{.params = {{"p", p}}, .lr = 0.01, .weight_decay = 0.1},
                                                                         {.params = {{"q", q}}, .lr = 0.01, .weight_decay = 0.1}},
                                            AdamOptions{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1, .decoupled = true});
          sched = std::make_unique<OneCycleLR>(
              *opt,
              OneCycleLROptions{.max_lr = {0.05}, .total_steps = 40, .pct_start = 0.3, .anneal_strategy = "linear", .three_phase = true});
        }
      };
      make();
      for (size_t t = 0; t < 40; ++t) {
        INFO("step " << t);
        for (size_t i = 0; i < 2; ++i) {
          CHECK(opt->groups()[i].lr == Approx(c["lr"][t][i].get<double>()).epsilon(1e-13));
          REQUIRE(opt->groups()[i].momentum.has_value());
          CHECK(*opt->groups()[i].momentum == Approx(c["momentum"][t][i].get<double>()).epsilon(1e-13));
        }
        p.set_grad(Tensor<Cpu>::from_vector(c["grads"][t][0].get<std::vector<double>>(), {4}));
        q.set_grad(Tensor<Cpu>::from_vector(c["grads"][t][1].get<std::vector<double>>(), {3}));
        opt->step();
        if (t < 39) sched->step();
        optim_test::check_close(to_vector<double>(p.value()), c["p"][t].get<std::vector<double>>(), 1e-12, 1e-14, "p");
        optim_test::check_close(to_vector<double>(q.value()), c["q"][t].get<std::vector<double>>(), 1e-12, 1e-14, "q");
        if (t == 15) {  // a scheduler restored from a state dict sets the same momentum as the one that ran
          const SchedulerState st = sched->state_dict();
          const std::vector<double> m{*opt->groups()[0].momentum, *opt->groups()[1].momentum};
          auto keep_opt = std::move(opt);
          auto keep_sched = std::move(sched);
          make();
          sched->load_state_dict(st);
          CHECK(*opt->groups()[0].momentum == m[0]);
          CHECK(*opt->groups()[1].momentum == m[1]);
          opt = std::move(keep_opt);
          sched = std::move(keep_sched);
        }
      }
    }
  }
  Var<Cpu> w(Tensor<Cpu>::zeros({2}), true);
  Adagrad<Cpu> ada(std::vector<ParamGroup<Cpu>>{{.params = {{"w", w}}, .lr = 0.1}}, AdagradOptions{});
  CHECK_THROWS_WITH(OneCycleLR(ada, {.max_lr = {0.1}, .total_steps = 10}),
                    Catch::Contains("OneCycleLR: cycle_momentum needs an optimizer"));
  CHECK_NOTHROW(OneCycleLR(ada, {.max_lr = {0.1}, .total_steps = 10, .cycle_momentum = false}));
  SGD<Cpu> sgd(std::vector<ParamGroup<Cpu>>{{.params = {{"w", w}}, .lr = 0.1}}, SGDOptions{});
  CHECK_THROWS_WITH(OneCycleLR(sgd, {.max_lr = {0.1}, .total_steps = 10, .base_momentum = {1.5}}), Catch::Contains("base_momentum (1.5)"));
}
