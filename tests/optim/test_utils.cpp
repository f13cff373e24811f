// Training utilities: the EMA of weights against torch.optim.swa_utils.AveragedModel (and its swap,
// state dict and errors), clip_grad_value against torch.nn.utils.clip_grad_value_, per-group norm
// clipping against clip_grad_norm_ per group, Embedding's padding_idx against nn.Embedding (init,
// output, gradient; every backend against Reference), and kiln::fit with a scheduler object and an
// EMA: the lr it sets each step, a resumed run bit-identical to one that never stopped, and the Errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/batch_norm.hpp>
#include <kiln/nn/container.hpp>
#include <kiln/nn/embedding.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/ema.hpp>
#include <kiln/optim/scheduler.hpp>
#include <kiln/train/loop.hpp>

#include "cases.hpp"
#include "parity/ref.hpp"

using namespace kiln;
using optim_test::cases;
using optim_test::check_close;
using optim_test::tensor;

TEST_CASE("EMA: the averages equal AveragedModel with an EMA avg_fn (decay, and with warmup)", "[optim][ema]") {
  for (const char* name : {"ema", "ema_warmup"}) {
    SECTION(name) {
      const auto& c = cases()["ema"][name];
      Var<Cpu> w(tensor<Cpu>(c["w0"], {2, 3}), true), b(tensor<Cpu>(c["b0"], {2}), true);
      const bool warmup = std::string(name) == "ema_warmup";
      optim::EMA<Cpu> ema({{"weight", w}, {"bias", b}}, {.decay = warmup ? 0.99 : 0.9, .warmup = warmup});
      for (size_t s = 0; s < 12; ++s) {
        Tensor<Cpu>(w.value()).copy_(tensor<Cpu>(c["w"][s], {2, 3}));
        Tensor<Cpu>(b.value()).copy_(tensor<Cpu>(c["b"][s], {2}));
        ema.update();
        check_close(to_vector<double>(ema.average("weight")), c["aw"][s].get<std::vector<double>>(), 1e-14, 1e-15,
                    fmt::format("weight average after update {}", s + 1));
        check_close(to_vector<double>(ema.average("bias")), c["ab"][s].get<std::vector<double>>(), 1e-14, 1e-15,
                    fmt::format("bias average after update {}", s + 1));
      }
      CHECK(ema.num_updates() == 12);
      if (warmup) CHECK(ema.decay() == Approx(13.0 / 22.0).epsilon(1e-15));
    }
  }
}

TEST_CASE("EMA of buffers: BatchNorm's running statistics averaged as AveragedModel(use_buffers=True)", "[optim][ema]") {
  const auto& c = cases()["ema"]["ema_buffers"];
  auto model = std::make_shared<nn::Sequential<Cpu>>(std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 3, .out = 2}),
                                                     std::make_shared<nn::BatchNorm1d<Cpu>>(nn::BatchNormOptions{.num_features = 2}));
  model->to(DType::f64);
  auto load = [&](const nlohmann::json& state) {
    std::map<std::string, Tensor<Cpu>> sd;
    for (const auto& [n, t] : model->state_dict()) {
      const auto v = state.at(n).get<std::vector<double>>();
      sd.emplace(n, Tensor<Cpu>::from_vector(v, t.shape()).to(t.dtype()));
    }
    model->load_state_dict(sd);
  };
  load(c["initial"]);
  optim::EMA<Cpu> ema(model->named_parameters(), model->named_buffers(), {.decay = c["decay"].get<double>()});
  CHECK_THROWS_WITH(ema.average("1.num_batches_tracked"), Catch::Contains("no parameter or averaged buffer '1.num_batches_tracked'"));
  for (size_t s = 0; s < c["states"].size(); ++s) {
    load(c["states"][s]);
    ema.update();
    for (const auto& [n, want] : c["averages"][s].items())
      check_close(to_vector<double>(ema.average(n)), want.get<std::vector<double>>(), 1e-14, 1e-15,
                  fmt::format("{} average after update {}", n, s + 1));
  }
  // swapped in: the buffers read by BatchNorm are the averages; the count stays the model's
  const auto rm = to_vector<double>(ema.average("1.running_mean"));
  const auto last = c["states"].back();
  {
    auto applied = ema.apply();
    const auto buffers = model->named_buffers();
    CHECK(to_vector<double>(buffers[0].second) == rm);
    CHECK(item<int64_t>(buffers[2].second) == last["1.num_batches_tracked"][0].get<int64_t>());
  }
  CHECK(to_vector<double>(model->named_buffers()[0].second) == last["1.running_mean"].get<std::vector<double>>());
  std::map<std::string, Tensor<Cpu>> state;
  for (auto& [k, v] : ema.state_dict()) state.emplace(k, v.clone());
  CHECK(state.count("shadow.1.running_var") == 1);
  CHECK(state.size() == 7);  // 4 parameters, 2 floating buffers, num_updates
  optim::EMA<Cpu> fresh(model->named_parameters(), model->named_buffers(), {.decay = 0.5});
  fresh.load_state_dict(state);
  CHECK(to_vector<double>(fresh.average("1.running_mean")) == rm);
  optim::EMA<Cpu> params_only(model->named_parameters(), {.decay = 0.5});
  CHECK_THROWS_WITH(params_only.load_state_dict(state), Catch::Contains("7 entries, expected 5"));
}

TEST_CASE("EMA: swap and apply exchange weights and averages in place, state_dict round-trips, misuse is an Error", "[optim][ema]") {
  manual_seed(4);
  nn::Linear<Cpu> lin({.in = 3, .out = 2, .bias = true});
  optim::EMA<Cpu> ema(lin.named_parameters(), {.decay = 0.5});
  const std::vector<double> w0 = to_vector<double>(lin.weight().value());
  Tensor<Cpu>(lin.weight().value()).add_(1.0);
  ema.update();  // average = w0 + 0.5
  const std::vector<double> live = to_vector<double>(lin.weight().value());
  {
    auto applied = ema.apply();
    const auto in = to_vector<double>(lin.weight().value());
    for (size_t i = 0; i < in.size(); ++i) CHECK(in[i] == Approx(w0[i] + 0.5).epsilon(1e-6));
    CHECK_THROWS_WITH(ema.update(), Catch::Contains("EMA") && Catch::Contains("swapped"));
    CHECK_THROWS_WITH(ema.state_dict(), Catch::Contains("swapped"));
  }
  CHECK(to_vector<double>(lin.weight().value()) == live);  // swapped back exactly

  std::map<std::string, Tensor<Cpu>> state;
  for (auto& [k, v] : ema.state_dict()) state.emplace(k, v.clone());
  CHECK(state.count("shadow.weight") == 1);
  CHECK(item<int64_t>(state.at("num_updates")) == 1);
  optim::EMA<Cpu> other(lin.named_parameters(), {.decay = 0.5});
  other.load_state_dict(state);
  CHECK(to_vector<double>(other.average("weight")) == to_vector<double>(ema.average("weight")));
  CHECK(other.num_updates() == 1);
  state.erase("shadow.bias");
  CHECK_THROWS_WITH(other.load_state_dict(state), Catch::Contains("no 'shadow.bias'"));
  state.emplace("shadow.bias", Tensor<Cpu>::zeros({3}));
  CHECK_THROWS_WITH(other.load_state_dict(state), Catch::Contains("shadow.bias") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(optim::EMA<Cpu>(lin.named_parameters(), {.decay = 1.5}), Catch::Contains("EMA") && Catch::Contains("decay"));
  CHECK_THROWS_WITH(ema.average("nope"), Catch::Contains("no parameter or averaged buffer 'nope'"));
}

TEST_CASE("clip_grad_value and clip_grad_norm_per_group equal torch.nn.utils's clip_grad_value_ and clip_grad_norm_", "[optim][clip]") {
  const auto& c = cases()["clip"];
  const std::vector<Shape> shapes{{3, 4}, {7}, {2, 2}};
  auto fresh = [&] {
    std::vector<Var<Cpu>> ps;
    for (size_t i = 0; i < 3; ++i) {
      ps.emplace_back(Tensor<Cpu>::zeros(shapes[i], DType::f64), true);
      ps.back().set_grad(tensor<Cpu>(c["grads"][i], shapes[i]));
    }
    return ps;
  };
  {
    auto ps = fresh();
    optim::clip_grad_value(ps, 0.7);
    for (size_t i = 0; i < 3; ++i) check_close(to_vector<double>(ps[i].grad()), c["value"][i].get<std::vector<double>>(), 0, 0, "value");
    CHECK_THROWS_WITH(optim::clip_grad_value(ps, -1.0), Catch::Contains("clip_grad_value") && Catch::Contains("-1"));
  }
  {
    auto ps = fresh();
    optim::SGD<Cpu> opt(std::vector<optim::ParamGroup<Cpu>>{{.params = {{"a", ps[0]}, {"b", ps[1]}}}, {.params = {{"c", ps[2]}}}}, {});
    const auto norms = optim::clip_grad_norm_per_group(opt, {1.5, 10.0});
    REQUIRE(norms.size() == 2);
    CHECK(norms[0] == Approx(c["group_norms"][0].get<double>()).epsilon(1e-12));
    CHECK(norms[1] == Approx(c["group_norms"][1].get<double>()).epsilon(1e-12));
    for (size_t i = 0; i < 3; ++i)
      check_close(to_vector<double>(ps[i].grad()), c["per_group"][i].get<std::vector<double>>(), 1e-12, 0, "per group");
    CHECK_THROWS_WITH(optim::clip_grad_norm_per_group(opt, {1.0, 2.0, 3.0}), Catch::Contains("expected 1 or 2 max_norms"));
    CHECK_THROWS_WITH(optim::clip_grad_norm_per_group(opt, {1.0, 0.0}), Catch::Contains("group 1 must be > 0"));
  }
}

TEMPLATE_TEST_CASE("Embedding padding_idx: zero init, torch's output and gradient (no gradient to the row), every backend",
                   "[nn][embedding]", KILN_BACKEND_TYPES) {
  using B = TestType;
  const auto& c = cases()["embedding"];
  nn::Embedding<B> emb({.num = 10, .dim = 4, .dtype = DType::f64, .padding_idx = -3});
  REQUIRE(emb.padding_idx() == 7);
  CHECK(to_vector<double>(emb.weight().value().select(0, 7).template to<Cpu>()) == std::vector<double>(4, 0.0));
  CHECK(to_vector<double>(emb.weight().value().select(0, 6).abs().sum().template to<Cpu>())[0] > 0);
  Tensor<B>(emb.weight().value()).copy_(tensor<B>(c["weight"], {10, 4}));
  const Tensor<B> ids = Tensor<Cpu>::from_vector(c["ids"].get<std::vector<int64_t>>(), {2, 3}).template to<B>();
  const Var<B> y = emb(ids);
  REQUIRE(y.shape() == Shape({2, 3, 4}));
  check_close(to_vector<double>(y.value().template to<Cpu>()), c["y"].get<std::vector<double>>(), 0, 0, "output");
  y.backward(tensor<B>(c["dy"], {2, 3, 4}));
  check_close(to_vector<double>(emb.weight().grad().template to<Cpu>()), c["grad"].get<std::vector<double>>(), 1e-15, 0, "weight grad");
  CHECK_THROWS_WITH(nn::Embedding<B>({.num = 5, .dim = 2, .padding_idx = 5}),
                    Catch::Contains("Embedding") && Catch::Contains("padding_idx") && Catch::Contains("5"));
  CHECK_THROWS_WITH(nn::Embedding<B>({.num = 5, .dim = 2, .padding_idx = -6}), Catch::Contains("[-5, 5)"));
}

namespace {

// y = x·w + b on fixed data: batch i is a pure function of i.
struct FitSetup {
  nn::Linear<Cpu> model{{.in = 3, .out = 1, .bias = true}};
  Tensor<Cpu> x, y;
  FitSetup() {
    Generator g(8);
    x = Tensor<Cpu>::randn({64, 3}, DType::f32, &g);
    y = x.sum({1}, true).mul(0.5);
  }
  auto batches() {
    return IndexedBatches{.batch =
                              [this](int64_t i) {
                                const int64_t s = (i % 8) * 8;
                                return std::pair{x.narrow(0, s, 8), y.narrow(0, s, 8)};
                              },
                          .count = 2};
  }
  auto step() {
    return
        [this](const std::pair<Tensor<Cpu>, Tensor<Cpu>>& b) { return nn::mse_loss(model.forward(Var<Cpu>(b.first)), Var<Cpu>(b.second)); };
  }
};

std::vector<double> logged_lrs(const std::filesystem::path& log) {
  std::ifstream in(log);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto rec = nlohmann::json::parse(line);
    if (rec["step"].get<int64_t>() >= 0) out.push_back(rec["lr"].get<double>());  // step -1: the evaluation before training
  }
  return out;
}

}  // namespace

TEST_CASE("fit: a scheduler object sets each step's lr, an EMA evaluates, and a resumed run equals one that never stopped",
          "[fit][optim]") {
  const auto dir = test::temp_dir("fit_sched");
  auto run = [&](int64_t stop_after, const std::string& resume, const std::string& tag) {
    manual_seed(1);
    FitSetup f;
    optim::SGD<Cpu> opt(f.model.named_parameters(), {.lr = 0.05, .momentum = 0.9});
    auto warm = std::make_shared<optim::LinearLR>(opt, 0.1, 1.0, 4);
    auto cos = std::make_shared<optim::CosineAnnealingLR>(opt, 8, 1e-3);
    auto sched =
        std::make_shared<optim::SequentialLR>(opt, std::vector<std::shared_ptr<optim::LRScheduler>>{warm, cos}, std::vector<int64_t>{4});
    auto ema = std::make_shared<optim::EMA<Cpu>>(f.model.named_parameters(), optim::EMAOptions{.decay = 0.8});
    FitOptions o{.steps = 12,
                 .eval_every = 5,
                 .checkpoint_path = (dir / (tag + ".safetensors")).string(),
                 .resume_path = resume,
                 .log_path = (dir / (tag + ".jsonl")).string(),
                 .progress = 0,
                 .stop_after = stop_after};
    o.scheduler = sched;
    o.ema = ema;
    const FitResult r = fit(f.model, opt, f.batches(), f.batches(), f.step(), o);
    struct Out {
      std::vector<double> w, avg, lrs;
      FitResult r;
      int64_t updates;
    };
    return Out{to_vector<double>(f.model.weight().value()), to_vector<double>(ema->average("weight")), logged_lrs(dir / (tag + ".jsonl")),
               r, ema->num_updates()};
  };
  const auto full = run(-1, "", "full");
  // the lr of each step: the same scheduler driven by hand, stepped after each optimizer step
  {
    FitSetup f;
    optim::SGD<Cpu> opt(f.model.named_parameters(), {.lr = 0.05});
    auto warm = std::make_shared<optim::LinearLR>(opt, 0.1, 1.0, 4);
    auto cos = std::make_shared<optim::CosineAnnealingLR>(opt, 8, 1e-3);
    optim::SequentialLR sched(opt, {warm, cos}, {4});
    REQUIRE(full.lrs.size() == 12);
    for (size_t s = 0; s < 12; ++s) {
      CHECK(full.lrs[s] == opt.groups()[0].lr);
      sched.step();
    }
  }
  CHECK(full.w != full.avg);
  CHECK(full.updates == 12);  // one update after every optimizer step
  const auto first = run(7, "", "part");
  CHECK(first.r.steps_done == 7);
  const auto resumed = run(-1, (dir / "part.safetensors").string(), "part");
  CHECK(resumed.r.start_step == 7);
  CHECK(resumed.w == full.w);
  CHECK(resumed.avg == full.avg);
  CHECK(resumed.updates == 12);
  CHECK(resumed.lrs == full.lrs);
  CHECK(resumed.r.eval_losses.back() == full.r.eval_losses.back());

  // the checkpoint holds the scheduler's kind and state and the EMA's tensors
  const auto file = safetensors::File::open((dir / "part.safetensors").string());
  CHECK(file.metadata().at("scheduler") == "SequentialLR");
  CHECK(file.metadata().count("scheduler.schedulers.1.base_lrs.0") == 1);
  const auto names = file.names();
  CHECK(std::find(names.begin(), names.end(), "ema.shadow.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "ema.num_updates") != names.end());
}

TEST_CASE("fit: evaluation runs on the EMA weights, and ReduceLROnPlateau steps on the evaluation loss", "[fit][optim]") {
  FitSetup f;
  optim::SGD<Cpu> opt(f.model.named_parameters(), {.lr = 0.05});
  auto ema = std::make_shared<optim::EMA<Cpu>>(f.model.named_parameters(), optim::EMAOptions{.decay = 0.9});
  auto plateau = std::make_shared<optim::ReduceLROnPlateau>(opt, optim::ReduceLROnPlateauOptions{.mode = "max", .patience = 0});
  std::vector<double> seen_eval, averaged_eval, lrs_after;
  Callback cb{.on_eval = [&](FitState& st) {
    seen_eval.push_back(st.eval_loss);
    // the loss of the averages, computed by hand
    auto applied = ema->apply();
    NoGrad ng;
    double sum = 0;
    for (int64_t i = 0; i < 2; ++i) {
      const auto b = f.batches().batch(i);
      sum += item<double>(nn::mse_loss(f.model.forward(Var<Cpu>(b.first)), Var<Cpu>(b.second)).value());
    }
    averaged_eval.push_back(sum / 2);
    lrs_after.push_back(opt.groups()[0].lr);
  }};
  FitOptions o{.steps = 6, .eval_every = 2, .eval_at_start = true, .progress = 0, .callbacks = {cb}};
  o.scheduler = plateau;
  o.ema = ema;
  fit(f.model, opt, f.batches(), f.batches(), f.step(), o);
  REQUIRE(seen_eval.size() == 4);  // before training (the plateau does not step on it), after steps 1, 3 and 5
  for (size_t i = 0; i < 4; ++i) CHECK(seen_eval[i] == Approx(averaged_eval[i]).epsilon(1e-12));
  // mode max on a falling loss: the first evaluation after a step sets the best, each later one is worse: lr × 0.1 each time
  CHECK(lrs_after[0] == 0.05);
  CHECK(lrs_after[1] == 0.05);
  CHECK(lrs_after[2] == Approx(0.005).epsilon(1e-15));
  CHECK(lrs_after[3] == Approx(0.0005).epsilon(1e-15));
  CHECK(plateau->num_bad_epochs() == 0);
}

TEST_CASE("fit: a scheduler with schedule or lr, on another optimizer, a plateau without evaluation, a mismatched resume: Errors",
          "[fit][optim][errors]") {
  const auto dir = test::temp_dir("fit_sched_err");
  FitSetup f;
  optim::SGD<Cpu> opt(f.model.named_parameters(), {.lr = 0.05}), other(f.model.named_parameters(), {.lr = 0.05});
  auto attempt = [&](std::shared_ptr<optim::LRScheduler> s, FitOptions o, bool with_eval = false) {
    o.scheduler = std::move(s);
    o.progress = 0;
    if (with_eval)
      fit(f.model, opt, f.batches(), f.batches(), f.step(), o);
    else
      fit(f.model, opt, f.batches(), f.step(), o);
  };
  auto step_lr = std::make_shared<optim::StepLR>(opt, 2);
  CHECK_THROWS_WITH(attempt(step_lr, {.steps = 2, .schedule = {.name = "cosine"}}), Catch::Contains("StepLR") && Catch::Contains("cosine"));
  CHECK_THROWS_WITH(attempt(step_lr, {.steps = 2, .lr = 0.1}), Catch::Contains("lr (now 0.1)"));
  CHECK_THROWS_WITH(attempt(std::make_shared<optim::StepLR>(other, 2), {.steps = 2}), Catch::Contains("another optimizer"));
  CHECK_THROWS_WITH(attempt(std::make_shared<optim::ReduceLROnPlateau>(opt), {.steps = 2}),
                    Catch::Contains("ReduceLROnPlateau") && Catch::Contains("evaluation data"));
  const std::string ck = (dir / "ck.safetensors").string();
  attempt(step_lr, {.steps = 2, .checkpoint_path = ck});
  CHECK_THROWS_WITH(attempt(std::make_shared<optim::ExponentialLR>(opt, 0.9), {.steps = 4, .resume_path = ck}),
                    Catch::Contains("with scheduler StepLR") && Catch::Contains("ExponentialLR"));
  CHECK_THROWS_WITH(attempt(nullptr, {.steps = 4, .resume_path = ck}), Catch::Contains("with scheduler StepLR"));
  FitOptions with_ema{.steps = 4, .resume_path = ck};
  with_ema.ema = std::make_shared<optim::EMA<Cpu>>(f.model.named_parameters());
  CHECK_THROWS_WITH(attempt(std::make_shared<optim::StepLR>(opt, 2), with_ema), Catch::Contains("without an EMA"));
  FitOptions wrong_backend{.steps = 2};
  Var<Reference> r(Tensor<Reference>::zeros({2}), true);
  wrong_backend.ema = std::make_shared<optim::EMA<Reference>>(optim::NamedParams<Reference>{{"r", r}});
  CHECK_THROWS_WITH(attempt(nullptr, wrong_backend), Catch::Contains("optim::EMA of this backend"));
  CHECK_THROWS_WITH(attempt(nullptr, {.steps = 2, .metadata = {{"scheduler", "x"}}}), Catch::Contains("metadata key 'scheduler'"));
}
