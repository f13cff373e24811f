// RMSprop, Adagrad (torch.optim) and Lion (its reference formula) against PyTorch over 20 steps on random
// parameters and gradients, two groups (weight decay 0.1 and 0): 1e-12 in float64, 1e-6 in float32;
// every backend against Reference; a state dict saved after 9 steps and loaded into a fresh optimizer
// continues the same trajectory; bad options are Errors.
#include <catch2/catch.hpp>

#include <fstream>
#include <memory>
#include <typeinfo>

#include <kiln/optim/adafactor.hpp>
#include <kiln/optim/lion.hpp>
#include <kiln/optim/rmsprop.hpp>

#include "cases.hpp"

using namespace kiln;
using optim_test::cases;
using optim_test::check_close;
using optim_test::tensor;

namespace {

template <Backend B> struct Params {
  Var<B> p, q;
  std::vector<optim::ParamGroup<B>> groups(double lr) const {
    return {{.params = {{"p", p}}, .lr = lr, .weight_decay = 0.1}, {.params = {{"q", q}}, .lr = lr, .weight_decay = 0.0}};
  }
};

// The optimizers of make_cases.py, by name.
template <Backend B> std::unique_ptr<optim::Optimizer<B>> make(const std::string& name, const Params<B>& ps) {
  using namespace optim;
  if (name == "rmsprop") return std::make_unique<RMSprop<B>>(ps.groups(1e-2), RMSpropOptions{});
  if (name == "rmsprop_centered_momentum")
    return std::make_unique<RMSprop<B>>(ps.groups(1e-2), RMSpropOptions{.alpha = 0.9, .eps = 1e-6, .momentum = 0.9, .centered = true});
  if (name == "rmsprop_momentum") return std::make_unique<RMSprop<B>>(ps.groups(3e-3), RMSpropOptions{.momentum = 0.5});
  if (name == "rmsprop_centered") return std::make_unique<RMSprop<B>>(ps.groups(2e-3), RMSpropOptions{.centered = true});
  if (name == "adagrad") return std::make_unique<Adagrad<B>>(ps.groups(1e-2), AdagradOptions{});
  if (name == "adagrad_decay")
    return std::make_unique<Adagrad<B>>(ps.groups(0.1), AdagradOptions{.lr_decay = 0.01, .initial_accumulator_value = 0.1, .eps = 1e-8});
  if (name == "lion") return std::make_unique<Lion<B>>(ps.groups(1e-3), LionOptions{});
  if (name == "lion_betas") return std::make_unique<Lion<B>>(ps.groups(3e-3), LionOptions{.beta1 = 0.95, .beta2 = 0.98});
  if (name == "adafactor") return std::make_unique<Adafactor<B>>(ps.groups(1e-2), AdafactorOptions{});
  if (name == "adafactor_options")
    return std::make_unique<Adafactor<B>>(ps.groups(0.05), AdafactorOptions{.beta2_decay = -0.5, .eps1 = 1e-12, .eps2 = 1e-2, .d = 1.5});
  FAIL("no optimizer " << name);
  return nullptr;
}

template <Backend B> Params<B> params(const nlohmann::json& c, DType d) {
  return {Var<B>(tensor<B>(c["p0"], {4, 3}, d), true), Var<B>(tensor<B>(c["q0"], {5}, d), true)};
}

template <Backend B> void set_grads(Params<B> ps, const nlohmann::json& c, size_t s, DType d) {
  ps.p.set_grad(tensor<B>(c["gp"][s], {4, 3}, d));
  ps.q.set_grad(tensor<B>(c["gq"][s], {5}, d));
}

std::vector<double> values(const Var<Cpu>& v) { return to_vector<double>(v.value()); }

}  // namespace

TEST_CASE("optimizers: RMSprop, Adagrad, Lion and Adafactor follow PyTorch step for step (f64 1e-12, f32 1e-6, two groups)",
          "[optim][parity]") {
  const auto& all = cases()["optimizers"];
  REQUIRE(all.size() == 20);
  for (const auto& [key, c] : all.items()) {
    SECTION(key) {
      const bool f64 = key.ends_with("_f64");
      const DType d = f64 ? DType::f64 : DType::f32;
      const double rel = f64 ? 1e-12 : 1e-6, abs = f64 ? 1e-14 : 1e-7;
      const std::string name = key.substr(0, key.size() - 4);
      const auto ps = params<Cpu>(c, d);
      auto opt = make<Cpu>(name, ps);
      for (size_t s = 0; s < 20; ++s) {
        set_grads(ps, c, s, d);
        opt->step();
        check_close(values(ps.p), c["p"][s].get<std::vector<double>>(), rel, abs, fmt::format("{} p after step {}", key, s + 1));
        check_close(values(ps.q), c["q"][s].get<std::vector<double>>(), rel, abs, fmt::format("{} q after step {}", key, s + 1));
      }
    }
  }
}

TEST_CASE("optimizers: a state dict saved after 9 steps and loaded into a fresh optimizer continues the run", "[optim]") {
  const auto& all = cases()["optimizers"];
  for (const char* name : {"rmsprop_centered_momentum", "adagrad_decay", "lion", "adafactor"}) {
    SECTION(name) {
      const auto& c = all[std::string(name) + "_f64"];
      const auto ps = params<Cpu>(c, DType::f64);
      auto opt = make<Cpu>(name, ps);
      for (size_t s = 0; s < 9; ++s) {
        set_grads(ps, c, s, DType::f64);
        opt->step();
      }
      std::map<std::string, Tensor<Cpu>> state;
      for (auto& [k, v] : opt->state_dict()) state.emplace(k, v.clone());
      auto fresh = make<Cpu>(name, ps);  // the same parameters, a new optimizer
      fresh->load_state_dict(state);
      CHECK(fresh->step_count() == 9);
      for (size_t s = 9; s < 20; ++s) {
        set_grads(ps, c, s, DType::f64);
        fresh->step();
        check_close(values(ps.p), c["p"][s].get<std::vector<double>>(), 1e-12, 1e-14, fmt::format("{} p after step {}", name, s + 1));
      }
      // another kind's state is refused, naming the entry
      auto other = make<Cpu>("rmsprop", ps);
      if (std::string(name) != "rmsprop_centered_momentum")
        CHECK_THROWS_WITH(other->load_state_dict(state), Catch::Contains("unexpected entry"));
    }
  }
}

TEMPLATE_TEST_CASE("optimizers: RMSprop, Adagrad, Lion and Adafactor give Reference's values on every backend", "[optim]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  const auto& all = cases()["optimizers"];
  for (const char* name : {"rmsprop_centered_momentum", "rmsprop", "adagrad_decay", "lion_betas", "adafactor_options"})
    for (DType d : {DType::f32, DType::f64}) {
      INFO(name << " " << dtype_name(d));
      const auto& c = all[std::string(name) + (d == DType::f64 ? "_f64" : "_f32")];
      const auto pb = params<B>(c, d);
      const auto pr = params<Reference>(c, d);
      auto ob = make<B>(name, pb);
      auto orf = make<Reference>(name, pr);
      for (size_t s = 0; s < 20; ++s) {
        set_grads(pb, c, s, d);
        set_grads(pr, c, s, d);
        ob->step();
        orf->step();
      }
      const double rel = d == DType::f64 ? 1e-12 : 1e-6, abs = d == DType::f64 ? 1e-14 : 1e-7;
      check_close(to_vector<double>(pb.p.value().template to<Cpu>()), to_vector<double>(pr.p.value()), rel, abs, "p");
      check_close(to_vector<double>(pb.q.value().template to<Cpu>()), to_vector<double>(pr.q.value()), rel, abs, "q");
    }
}

TEST_CASE("optimizers: Lion's update is ±lr per element (sign), decoupled decay, parameters without a gradient untouched", "[optim]") {
  Var<Cpu> w(Tensor<Cpu>::from_vector(std::vector<double>{1.0, -2.0, 3.0}), true), u(Tensor<Cpu>::ones({2}, DType::f64), true);
  optim::Lion<Cpu> opt(std::vector<optim::ParamGroup<Cpu>>{{.params = {{"w", w}, {"u", u}}, .lr = 0.1, .weight_decay = 0.5}}, {});
  w.set_grad(Tensor<Cpu>::from_vector(std::vector<double>{0.3, -1e-9, 0.0}));
  opt.step();
  // c = 0.1 g: sign (1, -1, 0); w·(1 − 0.05) − 0.1·sign
  check_close(to_vector<double>(w.value()), {0.95 - 0.1, -1.9 + 0.1, 2.85}, 1e-15, 0, "w");
  check_close(to_vector<double>(u.value()), {1.0, 1.0}, 0, 0, "u (no gradient)");
}

TEST_CASE("optimizers: bad options are Errors naming the optimizer", "[optim][errors]") {
  Var<Cpu> w(Tensor<Cpu>::zeros({2}), true);
  const optim::NamedParams<Cpu> ps{{"w", w}};
  CHECK_THROWS_WITH(optim::RMSprop<Cpu>(ps, {.alpha = 1.5}), Catch::Contains("RMSprop") && Catch::Contains("alpha"));
  CHECK_THROWS_WITH(optim::RMSprop<Cpu>(ps, {.momentum = -1}), Catch::Contains("RMSprop") && Catch::Contains("momentum"));
  CHECK_THROWS_WITH(optim::Adagrad<Cpu>(ps, {.lr_decay = -0.1}), Catch::Contains("Adagrad") && Catch::Contains("lr_decay"));
  CHECK_THROWS_WITH(optim::Adagrad<Cpu>(ps, {.initial_accumulator_value = -1}), Catch::Contains("initial_accumulator_value"));
  CHECK_THROWS_WITH(optim::Lion<Cpu>(ps, {.beta1 = 1.1}), Catch::Contains("Lion") && Catch::Contains("betas"));
  CHECK_THROWS_WITH(optim::Lion<Cpu>(ps, {.lr = -1}), Catch::Contains("lr and weight_decay must be >= 0"));
  CHECK_THROWS_WITH(optim::Adafactor<Cpu>(ps, {.beta2_decay = 0.5}), Catch::Contains("Adafactor") && Catch::Contains("beta2_decay"));
  CHECK_THROWS_WITH(optim::Adafactor<Cpu>(ps, {.d = 0.5}), Catch::Contains("Adafactor") && Catch::Contains("d must be >= 1"));
}

TEST_CASE("optimizers: Adafactor keeps factored second moments (m + n numbers for an m x n matrix), checked on load", "[optim]") {
  Var<Cpu> e(Tensor<Cpu>::randn({50, 8}), true), b(Tensor<Cpu>::randn({8}), true), t(Tensor<Cpu>::randn({3, 5, 4}), true);
  optim::Adafactor<Cpu> opt(optim::NamedParams<Cpu>{{"emb", e}, {"bias", b}, {"t", t}}, {});
  for (auto* v : {&e, &b, &t}) v->set_grad(Tensor<Cpu>::randn(v->shape()));
  opt.step();
  std::map<std::string, Tensor<Cpu>> state;
  for (auto& [k, v] : opt.state_dict()) state.emplace(k, v);
  CHECK(state.at("row_var.emb").shape() == Shape({50, 1}));
  CHECK(state.at("col_var.emb").shape() == Shape({1, 8}));
  CHECK(state.at("variance.bias").shape() == Shape({8}));
  CHECK(state.at("row_var.t").shape() == Shape({3, 5, 1}));
  CHECK(state.at("col_var.t").shape() == Shape({3, 1, 4}));
  CHECK(state.count("variance.emb") == 0);
  opt.load_state_dict(state);
  state["row_var.emb"] = Tensor<Cpu>::zeros({50, 8});
  CHECK_THROWS_WITH(opt.load_state_dict(state), Catch::Contains("'row_var.emb' has shape [50, 8], expected [50, 1]"));
}

TEST_CASE("optimizers: stable kinds, the same from every compiler, and the names an older kiln recorded read as them",
          "[optim][checkpoint]") {
  using namespace optim;
  const Params<Cpu> ps{Var<Cpu>(Tensor<Cpu>::ones({4, 3}, DType::f32), true), Var<Cpu>(Tensor<Cpu>::ones({5}, DType::f32), true)};
  const std::vector<std::pair<std::unique_ptr<Optimizer<Cpu>>, std::string>> all = [&] {
    std::vector<std::pair<std::unique_ptr<Optimizer<Cpu>>, std::string>> v;
    v.emplace_back(std::make_unique<SGD<Cpu>>(ps.groups(0.1), SGDOptions{}), "sgd");
    v.emplace_back(std::make_unique<Adam<Cpu>>(ps.groups(0.1), AdamOptions{.decoupled = false}), "adam");
    v.emplace_back(std::make_unique<Adam<Cpu>>(ps.groups(0.1), AdamOptions{.decoupled = true}), "adamw");
    v.emplace_back(make<Cpu>("rmsprop", ps), "rmsprop");
    v.emplace_back(make<Cpu>("adagrad_decay", ps), "adagrad");
    v.emplace_back(make<Cpu>("lion", ps), "lion");
    v.emplace_back(make<Cpu>("adafactor", ps), "adafactor");
    return v;
  }();
  for (const auto& [opt, kind] : all) {
    INFO(kind);
    CHECK(opt->kind() == kind);
    for (const bool legacy : {false, true}) {
      CHECK(opt->reads_kind(kind, legacy));
      CHECK(!opt->reads_kind(kind == "sgd" ? "adam" : "sgd", legacy));
      CHECK(!opt->reads_kind("adamw", legacy) == (kind != "adamw"));
    }
    // What kind() returned by default before 2026-11-26, read only as an older kiln's name; "adam" was
    // AdamW's name too.
    const std::string old = kind == "adamw" ? "adam" : kind;
    CHECK(opt->reads_kind(typeid(*opt).name(), true));
    CHECK(!opt->reads_kind(typeid(*opt).name(), false));
    CHECK(legacy_optimizer_kind(typeid(*opt).name()) == old);
    CHECK(opt->reads_kind("adam", true) == (old == "adam"));
    CHECK(opt->reads_kind("adam", false) == (kind == "adam"));
  }
  // AdamW (its own class): "adamw"; an older kiln's AdamW recorded "adam" or optim::Adam's typeid name.
  AdamW<Cpu> aw(ps.groups(0.1), AdamWOptions{});
  CHECK(aw.kind() == "adamw");
  CHECK(aw.reads_kind("adam", true));
  CHECK(aw.reads_kind("N4kiln5optim4AdamINS_3CpuEEE", true));
  CHECK(!aw.reads_kind("adam", false));
  // GCC's manglings, written out: any backend, any optimizer of kiln's; the rest is left as it is.
  CHECK(legacy_optimizer_kind("N4kiln5optim4LionINS_3CpuEEE") == "lion");
  CHECK(legacy_optimizer_kind("N4kiln5optim7RMSpropINS_4CudaEEE") == "rmsprop");
  CHECK(legacy_optimizer_kind("N4kiln5optim9AdafactorINS_9ReferenceEEE") == "adafactor");
  CHECK(legacy_optimizer_kind("N4kiln5optim3SGDINS_3CpuEEE") == "sgd");
  for (const std::string same :
       {"adam", "N4kiln5optim6MyAdamINS_3CpuEEE", "N4kiln5optim4Adam", "N4kiln5optim99999", "N4kiln5optim", "N2me6MyOptimE", ""})
    CHECK(legacy_optimizer_kind(same) == same);
}

TEST_CASE("optimizers: Adam is torch.optim.Adam and AdamW is torch.optim.AdamW by default, weight decay in the gradient or on the weights",
          "[optim]") {
  // adam_torch.json (make_adam_fixture.py, PyTorch 1.13): 5 float64 steps of each; the named-parameter
  // constructors decay p (rank 2) and not q, as the fixture's two groups.
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/optim/adam_torch.json");
  REQUIRE(f.good());
  const nlohmann::json c = nlohmann::json::parse(f);
  using namespace optim;
  for (const std::string name : {"adam_wd", "adamw_wd", "adam_defaults", "adamw_defaults"}) {
    INFO(name);
    Params<Cpu> ps = params<Cpu>(c, DType::f64);
    const NamedParams<Cpu> named{{"p", ps.p}, {"q", ps.q}};
    std::unique_ptr<Optimizer<Cpu>> opt;
    if (name == "adam_wd") opt = std::make_unique<Adam<Cpu>>(named, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
    if (name == "adamw_wd") opt = std::make_unique<AdamW<Cpu>>(named, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    if (name == "adam_defaults") opt = std::make_unique<Adam<Cpu>>(named, AdamOptions{});
    if (name == "adamw_defaults") opt = std::make_unique<AdamW<Cpu>>(named, AdamWOptions{});
    CHECK(opt->kind() == (name.starts_with("adamw") ? "adamw" : "adam"));
    const auto& want = c["cases"][name];
    for (size_t s = 0; s < c["steps"].get<size_t>(); ++s) {
      INFO("step " << s);
      set_grads(ps, c, s, DType::f64);
      opt->step();
      check_close(values(ps.p), want["p"][s].get<std::vector<double>>(), 1e-12, 1e-14, "p");
      check_close(values(ps.q), want["q"][s].get<std::vector<double>>(), 1e-12, 1e-14, "q");
    }
  }
  // AdamW is Adam with decoupled = true, bit for bit.
  Params<Cpu> a = params<Cpu>(c, DType::f64), b = params<Cpu>(c, DType::f64);
  AdamW<Cpu> w({{"p", a.p}, {"q", a.q}}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  Adam<Cpu> d({{"p", b.p}, {"q", b.q}}, AdamOptions{.lr = 0.01, .weight_decay = 0.1, .decoupled = true});
  for (size_t s = 0; s < 3; ++s) {
    set_grads(a, c, s, DType::f64);
    set_grads(b, c, s, DType::f64);
    w.step();
    d.step();
  }
  CHECK(values(a.p) == values(b.p));
  CHECK(d.kind() == "adamw");
}
