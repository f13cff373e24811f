// kiln::fit (train/loop.hpp): resume is bit-identical (mid-epoch, at and across epoch boundaries, after
// SIGINT), gradient accumulation equals one big batch, clipping equals optim::clip_grad_norm, the
// LR follows the schedule, non-finite steps error or skip and never reach a checkpoint, callbacks
// log and stop, evaluation runs exactly at its steps, a time limit plans, revises and stops the run
// (and resumes), and bad options or resume files are refused before any file is touched.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>
#include <thread>
#include <typeinfo>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/layers.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/scheduler.hpp>
#include <kiln/train/loop.hpp>
#include <kiln/train/trainer.hpp>

using namespace kiln;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// fc1 -> relu -> dropout -> fc2: the dropout draws from the default generator, so a resume that
// did not restore the RNG state would differ.
template <Backend B> class Net : public nn::Module<B> {
 public:
  explicit Net(int64_t hidden = 16, double p = 0.2, int64_t in = 3) : p_(p) {
    fc1_ = this->register_module("fc1", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = in, .out = hidden, .bias = true}));
    drop_ = this->register_module("drop", std::make_shared<nn::Dropout<B>>(p > 0 ? p : 0.5));
    fc2_ = this->register_module("fc2", std::make_shared<nn::Linear<B>>(nn::LinearOptions{.in = hidden, .out = 2, .bias = true}));
  }
  Var<B> forward(const Var<B>& x) const {
    Var<B> h = (*fc1_)(x).relu();
    if (p_ > 0) h = (*drop_)(h);
    return (*fc2_)(h);
  }
  std::shared_ptr<nn::Linear<B>> fc2() const { return fc2_; }

 private:
  double p_;
  std::shared_ptr<nn::Linear<B>> fc1_, fc2_;
  std::shared_ptr<nn::Dropout<B>> drop_;
};

using C = Cpu;

// Points of [-1, 1]³, class 1 when x0 + x1 > 0.
TensorDataset<C> points(int64_t n, uint64_t seed, DType dtype = DType::f32) {
  Generator g(seed);
  const Tensor<C> x = Tensor<C>::uniform({n, 3}, -1.0, 1.0, DType::f64, &g);
  const Tensor<C> y = x.select(1, 0).add(x.select(1, 1)).gt(0).to(DType::i64);
  return TensorDataset<C>(x.to(dtype), y);
}

fs::path temp_dir() {
  static int n = 0;
  const auto d = fs::temp_directory_path() / fmt::format("kiln-loop-{}-{}", ::getpid(), n++);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<json> read_log(const fs::path& p) {
  std::vector<json> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::string slurp(const fs::path& p) {
  std::stringstream ss;
  ss << std::ifstream(p, std::ios::binary).rdbuf();
  return ss.str();
}

// Every parameter's values, in f64 (exact for f32), by name.
std::map<std::string, std::vector<double>> snapshot(const nn::Module<C>& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [n, p] : m.named_parameters()) out[n] = to_vector<double>(p.value());
  return out;
}

double max_rel_diff(const std::map<std::string, std::vector<double>>& a, const std::map<std::string, std::vector<double>>& b) {
  double worst = 0;
  for (const auto& [n, v] : a) {
    const auto& w = b.at(n);
    REQUIRE(v.size() == w.size());
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - w[i]) / (1.0 + std::abs(w[i])));
  }
  return worst;
}

auto ce_step(const Net<C>& model) {
  return [&model](const std::pair<Tensor<C>, Tensor<C>>& b) { return nn::cross_entropy(model.forward(b.first), b.second); };
}

// One training run of the resume tests: a fresh model (init seed), AdamW, a shuffled loader of 50
// points in batches of 8 (7 per epoch), grad_accum 2 (windows 2, 2, 2, 1: 4 steps per epoch), 3
// epochs, evaluation every 5 steps.
struct Run {
  FitResult result;
  std::map<std::string, std::vector<double>> weights;
};

Run run_points(uint64_t init_seed, FitOptions o, const std::function<void(int64_t)>& on_batch = nullptr) {
  manual_seed(init_seed);
  Net<C> model;
  optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2, .weight_decay = 0.01, .decoupled = true});
  DataLoader train(points(50, 1), {.batch_size = 8, .shuffle = true, .drop_last = false, .seed = 3});
  DataLoader eval(points(20, 2), {.batch_size = 10, .shuffle = false});
  int64_t calls = 0;
  auto step = [&](const std::pair<Tensor<C>, Tensor<C>>& b) {
    if (on_batch && model.is_training()) on_batch(calls++);
    return nn::cross_entropy(model.forward(b.first), b.second);
  };
  o.epochs = 3;
  o.grad_accum = 2;
  o.eval_every = 5;
  o.eval_at_start = true;  // the evaluation before training is part of what must resume bit for bit
  o.progress = 0;
  o.schedule = {.name = "cosine", .warmup_steps = 2, .min_lr_ratio = 0.1};
  Run r;
  r.result = fit(model, opt, train, eval, step, o);
  r.weights = snapshot(model);
  return r;
}

}  // namespace

TEST_CASE("fit: a run stopped and resumed is bit-identical to one that never stopped (shuffled DataLoader, dropout, accumulation)",
          "[fit][checkpoint]") {
  const fs::path dir = temp_dir();
  const Run full = run_points(0, {.log_path = (dir / "full.jsonl").string()});
  REQUIRE(full.result.steps_done == 12);
  REQUIRE(full.result.losses.size() == 12);
  const auto full_log = read_log(dir / "full.jsonl");
  REQUIRE(full_log.size() == 13);  // the evaluation before training, and 12 steps
  CHECK(full_log[0]["step"] == -1);
  CHECK(full.result.eval_steps.front() == 0);

  // 6: mid-epoch (epoch 1, batch 4 of 7); 4: exactly at the first epoch boundary; 7: after the
  // short window that ends epoch 1.
  for (int64_t stop : {6, 4, 7}) {
    SECTION(fmt::format("stop after {} steps", stop)) {
      const std::string ck = (dir / fmt::format("ck{}.safetensors", stop)).string(),
                        log = (dir / fmt::format("part{}.jsonl", stop)).string();
      const Run a = run_points(0, {.checkpoint_path = ck, .log_path = log, .stop_after = stop});
      CHECK(a.result.steps_done == stop);
      CHECK(a.result.stopped);
      const auto meta = safetensors::File::open(ck).metadata();
      CHECK(meta.at("step") == std::to_string(stop));
      CHECK(meta.at("data.epoch") == std::to_string(stop / 4));
      // Another initialisation (seed 77): the checkpoint must overwrite it, and restore the RNG.
      const Run b = run_points(77, {.checkpoint_path = ck, .resume_path = ck, .log_path = log});
      CHECK(b.result.start_step == stop);
      CHECK(b.result.steps_done == 12);
      CHECK(b.result.eval_steps.front() > stop);  // a resumed run does not evaluate "before training" again
      std::vector<double> losses = a.result.losses;
      losses.insert(losses.end(), b.result.losses.begin(), b.result.losses.end());
      CHECK(losses == full.result.losses);  // bit for bit
      CHECK(b.weights == full.weights);
      const auto part = read_log(log);
      REQUIRE(part.size() == full_log.size());
      for (size_t i = 0; i < part.size(); ++i) {
        INFO("step " << i);
        CHECK(part[i]["step"] == full_log[i]["step"]);
        CHECK(part[i].value("loss", json()) == full_log[i].value("loss", json()));  // none in the evaluation before training
        CHECK(part[i].value("grad_norm", json()) == full_log[i].value("grad_norm", json()));
        CHECK(part[i].contains("eval_loss") == full_log[i].contains("eval_loss"));
        if (part[i].contains("eval_loss")) CHECK(part[i]["eval_loss"] == full_log[i]["eval_loss"]);
      }
    }
  }
  SECTION("SIGINT finishes the step, checkpoints and stops; the resume continues exactly") {
    const std::string ck = (dir / "sig.safetensors").string();
    // Windows of 2, 2, 2, 1 micro-batches: micro-batch 16 is step 9's first. The signal arrives
    // there; step 9 completes, then the run stops.
    const Run a = run_points(0, {.checkpoint_path = ck}, [](int64_t call) {
      if (call == 16) std::raise(SIGINT);
    });
    CHECK(a.result.interrupted);
    CHECK(a.result.steps_done == 10);
    CHECK(safetensors::File::open(ck).metadata().at("step") == "10");
    const Run b = run_points(5, {.checkpoint_path = ck, .resume_path = ck});
    std::vector<double> losses = a.result.losses;
    losses.insert(losses.end(), b.result.losses.begin(), b.result.losses.end());
    CHECK(losses == full.result.losses);
    CHECK(b.weights == full.weights);
  }
  SECTION("a log with records past the checkpoint (killed between checkpoints) keeps only those before it") {
    const std::string ck = (dir / "kill.safetensors").string(), log = (dir / "kill.jsonl").string();
    run_points(0, {.checkpoint_path = ck, .log_path = log, .stop_after = 5});
    std::ofstream(log, std::ios::app) << R"({"step": 5, "loss": 1.0})"
                                      << "\n"
                                      << R"({"step": 6, "lo)";  // a torn line
    run_points(0, {.checkpoint_path = ck, .resume_path = ck, .log_path = log});
    const auto part = read_log(log);
    REQUIRE(part.size() == 13);  // the evaluation before training (kept), 12 steps
    for (size_t i = 0; i < part.size(); ++i) CHECK(part[i].value("loss", json()) == full_log[i].value("loss", json()));
  }
  fs::remove_all(dir);
}

TEST_CASE("fit: accumulating k micro-batches of n equals one batch of k·n (f64)", "[fit]") {
  // In f64 the two differ only in the order of the sums over samples (64 terms per gradient
  // element): |Δ| ≲ 64·2⁻⁵³·Σ|terms| ≈ 1e-14 relative; 1e-12 leaves room, and a batch of n alone
  // (the wrong answer) is off by > 1e-3.
  const TensorDataset<C> data = points(64, 4, DType::f64);
  auto run = [&](int64_t batch, int64_t accum, bool indexed, std::vector<std::pair<int64_t, int64_t>>* micro = nullptr) {
    manual_seed(1);
    Net<C> model(8, 0.0);
    model.to(DType::f64);
    optim::SGD<C> opt(model.named_parameters(), {.lr = 0.5});
    FitOptions o{.steps = 3, .grad_accum = accum, .progress = 0};
    int64_t after_backward = 0;
    o.hooks.after_backward = [&] { ++after_backward; };
    if (micro)
      o.hooks.around_micro_batch = [&](int64_t j, int64_t m, const std::function<void()>& f) {
        micro->emplace_back(j, m);
        f();
      };
    FitResult r;
    if (indexed) {
      // batch i = rows [i·batch, (i+1)·batch) mod 64: micro-batch j of step s is batch s·k + j
      const IndexedBatches src{.batch = [&](int64_t i) {
        std::vector<int64_t> idx;
        for (int64_t t = 0; t < batch; ++t) idx.push_back((i * batch + t) % 64);
        return data.get(idx);
      }};
      r = fit(model, opt, src, ce_step(model), o);
    } else {
      DataLoader loader(data, {.batch_size = batch, .shuffle = true, .seed = 9});
      r = fit(model, opt, loader, ce_step(model), o);
    }
    CHECK(after_backward == 3);
    return std::make_pair(r.losses, snapshot(model));
  };
  for (bool indexed : {false, true}) {
    INFO((indexed ? "IndexedBatches" : "DataLoader"));
    std::vector<std::pair<int64_t, int64_t>> micro;
    const auto [la, wa] = run(4, 4, indexed, &micro);
    const auto [lb, wb] = run(16, 1, indexed);
    const auto [lc, wc] = run(4, 1, indexed);
    REQUIRE(la.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(std::abs(la[i] - lb[i]) < 1e-12 * std::abs(lb[i]));
    CHECK(max_rel_diff(wa, wb) < 1e-12);
    CHECK(max_rel_diff(wc, wb) > 1e-3);
    CHECK(micro == std::vector<std::pair<int64_t, int64_t>>{
                       {0, 4}, {1, 4}, {2, 4}, {3, 4}, {0, 4}, {1, 4}, {2, 4}, {3, 4}, {0, 4}, {1, 4}, {2, 4}, {3, 4}});
  }
  SECTION("an epoch's last window holds the batches left") {
    // 7 batches per epoch, grad_accum 3: windows 3, 3, 1 — 3 steps per epoch
    manual_seed(1);
    Net<C> model(8, 0.0);
    optim::SGD<C> opt(model.named_parameters(), {.lr = 0.1});
    DataLoader loader(points(50, 1), {.batch_size = 8, .shuffle = true, .seed = 3});
    std::vector<std::pair<int64_t, int64_t>> micro;
    FitOptions o{.epochs = 2, .grad_accum = 3, .progress = 0};
    o.hooks.around_micro_batch = [&](int64_t j, int64_t m, const std::function<void()>& f) {
      micro.emplace_back(j, m);
      f();
    };
    const FitResult r = fit(model, opt, loader, ce_step(model), o);
    CHECK(r.steps_done == 6);
    CHECK(micro == std::vector<std::pair<int64_t, int64_t>>{
                       {0, 3}, {1, 3}, {2, 3}, {0, 3}, {1, 3}, {2, 3}, {0, 1}, {0, 3}, {1, 3}, {2, 3}, {0, 3}, {1, 3}, {2, 3}, {0, 1}});
    CHECK(loader.epoch() == 2);
  }
}

TEST_CASE("fit: clipping equals optim::clip_grad_norm, and the LR of each step follows the schedule", "[fit]") {
  const TensorDataset<C> data = points(32, 5);
  SECTION("clipping") {
    const auto batch = data.get({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
    // by hand: one SGD step on the first 16 points with clip_grad_norm
    manual_seed(2);
    Net<C> manual(16, 0.0);
    optim::SGD<C> opt_m(manual.named_parameters(), {.lr = 0.5, .momentum = 0.9});
    opt_m.zero_grad();
    nn::cross_entropy(manual.forward(batch.first), batch.second).backward();
    const double norm = optim::clip_grad_norm(manual.parameters(), 0.05);
    opt_m.step();
    REQUIRE(norm > 0.05);  // the clip is active
    for (double clip : {0.05, 0.0}) {
      manual_seed(2);
      Net<C> model(16, 0.0);
      optim::SGD<C> opt(model.named_parameters(), {.lr = 0.5, .momentum = 0.9});
      DataLoader loader(data, {.batch_size = 16, .shuffle = false});
      const fs::path dir = temp_dir();
      fit(model, opt, loader, ce_step(model), {.steps = 1, .grad_clip = clip, .log_path = (dir / "log.jsonl").string(), .progress = 0});
      const auto log = read_log(dir / "log.jsonl");
      REQUIRE(log.size() == 1);
      CHECK(log[0]["grad_norm"].get<double>() == norm);  // the norm before clipping, either way
      if (clip > 0)
        CHECK(snapshot(model) == snapshot(manual));
      else
        CHECK(max_rel_diff(snapshot(model), snapshot(manual)) > 1e-4);
      fs::remove_all(dir);
    }
  }
  SECTION("LR per step and per group") {
    manual_seed(3);
    Net<C> model(16, 0.0);
    const auto named = model.named_parameters();
    // two groups with different peaks: fc1 at 0.1, fc2 at 0.01
    std::vector<optim::ParamGroup<C>> groups(2);
    for (const auto& [n, p] : named) groups[n.starts_with("fc1") ? 0 : 1].params.emplace_back(n, p);
    groups[0].lr = 0.1;
    groups[1].lr = 0.01;
    optim::Adam<C> opt(groups, {.lr = 0.1});
    DataLoader loader(data, {.batch_size = 8, .shuffle = true, .seed = 1});
    std::vector<std::pair<double, double>> seen;  // what the optimizer holds while the step runs
    auto step = [&](const std::pair<Tensor<C>, Tensor<C>>& b) {
      seen.emplace_back(opt.groups()[0].lr, opt.groups()[1].lr);
      return nn::cross_entropy(model.forward(b.first), b.second);
    };
    const fs::path dir = temp_dir();
    const LrSchedule sched{.name = "cosine", .warmup_steps = 3, .min_lr_ratio = 0.1};
    fit(model, opt, loader, step, {.steps = 10, .log_path = (dir / "log.jsonl").string(), .progress = 0, .schedule = sched});
    const auto log = read_log(dir / "log.jsonl");
    REQUIRE(seen.size() == 10);
    REQUIRE(log.size() == 10);
    for (int s = 0; s < 10; ++s) {
      INFO("step " << s);
      // docs/specs.md §4 by hand: warmup lr·(s+1)/W, then cosine from lr to 0.1·lr over steps − W
      auto expect = [&](double peak) {
        if (s < 3) return peak * (s + 1) / 3.0;
        const double p = (s - 3) / 7.0;
        return 0.1 * peak + 0.5 * (peak - 0.1 * peak) * (1 + std::cos(std::numbers::pi * p));
      };
      CHECK(seen[s].first == Approx(expect(0.1)).epsilon(1e-14));
      CHECK(seen[s].second == Approx(expect(0.01)).epsilon(1e-14));
      CHECK(seen[s].first == sched.at(0.1, s, 10));
      CHECK(log[s]["lr"].get<double>() == seen[s].first);
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("fit: non-finite steps stop with the step and parameter named, or are skipped, and no checkpoint holds them", "[fit]") {
  const TensorDataset<C> data = points(64, 6);
  const fs::path dir = temp_dir();
  const std::string ck = (dir / "ck.safetensors").string(), log = (dir / "log.jsonl").string();
  // inject: 0 none, 1 a NaN gradient in fc2.bias only (loss finite: d√(0·b)/db = 0·∞), 2 a NaN loss
  auto run = [&](NonFinite mode, int inject, std::vector<std::map<std::string, std::vector<double>>>& after) {
    manual_seed(4);
    Net<C> model(8, 0.0);
    optim::SGD<C> opt(model.named_parameters(), {.lr = 0.1});
    DataLoader loader(data, {.batch_size = 8, .shuffle = false});
    auto step = [&](const std::pair<Tensor<C>, Tensor<C>>& b) {
      Var<C> loss = nn::cross_entropy(model.forward(b.first), b.second);
      if (after.size() == 3 && inject == 1) loss = loss + (model.fc2()->bias() * 0.0).sqrt().sum();
      if (after.size() == 3 && inject == 2) loss = loss * std::numeric_limits<double>::quiet_NaN();
      return loss;
    };
    FitOptions o{.steps = 8, .on_nonfinite = mode, .checkpoint_path = ck, .checkpoint_every = 1, .log_path = log, .progress = 0};
    o.callbacks.push_back({.on_step = [&](FitState&) { after.push_back(snapshot(model)); }});
    const FitResult r = fit(model, opt, loader, step, o);
    return std::make_pair(r, opt.step_count());
  };
  SECTION("error: names the step and the first bad parameter; the last good checkpoint stays") {
    for (int inject : {1, 2}) {
      std::vector<std::map<std::string, std::vector<double>>> after;
      const std::string bad = inject == 1 ? "'fc2.bias'" : "'fc1.weight'";
      CHECK_THROWS_WITH(run(NonFinite::error, inject, after), Catch::Contains("step 3") && Catch::Contains(bad));
      REQUIRE(after.size() == 3);
      CHECK(read_log(log).size() == 3);
      const auto f = safetensors::File::open(ck);
      CHECK(f.metadata().at("step") == "3");
      CHECK(to_vector<double>(f.load<C>("model.fc2.bias")) == after[2].at("fc2.bias"));
    }
  }
  SECTION("skip: exactly the bad step is skipped, counted and logged; the run goes on") {
    std::vector<std::map<std::string, std::vector<double>>> after, clean;
    run(NonFinite::skip, 0, clean);
    const auto [r, updates] = run(NonFinite::skip, 1, after);
    CHECK(r.steps_done == 8);
    CHECK(r.skipped == 1);
    CHECK(updates == 7);
    REQUIRE(after.size() == 8);
    CHECK(after[3] == after[2]);  // no update at step 3
    CHECK(after[2] == clean[2]);
    CHECK(after[4] != after[3]);  // and updates after it
    const auto lines = read_log(log);
    REQUIRE(lines.size() == 8);
    for (size_t s = 0; s < 8; ++s) CHECK(lines[s].contains("skipped") == (s == 3));
    CHECK(lines[3]["skipped_steps"] == 1);
    CHECK(std::isfinite(lines[3]["loss"].get<double>()));
    CHECK(lines[3]["grad_norm"].is_null());  // NaN
    const auto f = safetensors::File::open(ck);
    CHECK(f.metadata().at("skipped_steps") == "1");
    CHECK(to_vector<double>(f.load<C>("model.fc2.bias")) == after[7].at("fc2.bias"));
  }
  SECTION("weights that became non-finite are never written over the last checkpoint") {
    manual_seed(4);
    Net<C> model(8, 0.0);
    optim::SGD<C> opt(model.named_parameters(), {.lr = 0.1});
    DataLoader loader(data, {.batch_size = 8, .shuffle = false});
    FitOptions o{.steps = 8, .on_nonfinite = NonFinite::skip, .checkpoint_path = ck, .checkpoint_every = 1, .progress = 0};
    std::vector<double> good;
    o.callbacks.push_back({.on_step = [&](FitState& s) {
      if (s.step == 3) good = to_vector<double>(model.fc2()->weight().value());
      if (s.step == 4) {  // as if the update had overflowed
        NoGrad ng;
        Tensor<C> w = model.fc2()->weight().value();
        w.mul_(std::numeric_limits<double>::infinity());
      }
    }});
    CHECK_THROWS_WITH(fit(model, opt, loader, ce_step(model), o),
                      Catch::Contains("'fc2.weight'") && Catch::Contains("not finite after step 4") && Catch::Contains("not written"));
    const auto f = safetensors::File::open(ck);
    CHECK(f.metadata().at("step") == "4");
    CHECK(to_vector<double>(f.load<C>("model.fc2.weight")) == good);
  }
  fs::remove_all(dir);
}

TEST_CASE("fit: callbacks record metrics in the log and can stop the run", "[fit]") {
  const fs::path dir = temp_dir();
  manual_seed(5);
  Net<C> model(8, 0.0);
  optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2});
  DataLoader loader(points(40, 7), {.batch_size = 10, .shuffle = true, .seed = 2});  // 4 batches per epoch
  auto step = [&](const std::pair<Tensor<C>, Tensor<C>>& b) {
    const Var<C> logits = model.forward(b.first);
    const double acc = item<double>(logits.value().argmax(1).eq(b.second).to(DType::f64).mean());
    return StepOutput<C>{.loss = nn::cross_entropy(logits, b.second), .metrics = {{"acc", acc}}};
  };
  FitOptions o{.epochs = 5, .checkpoint_path = (dir / "ck.safetensors").string(), .log_path = (dir / "log.jsonl").string(), .progress = 0};
  std::vector<double> accs;
  o.callbacks.push_back({.on_step =
                             [&](FitState& s) {
                               s.record("twice_loss", 2 * s.loss);
                               accs.push_back(s.metrics.at("acc"));
                               if (s.step == 6) s.stop = true;
                             },
                         .on_eval = nullptr,
                         .on_epoch = [&](FitState& s) { s.record("epoch_done", static_cast<double>(s.epoch)); }});
  const FitResult r = fit(model, opt, loader, step, o);
  CHECK(r.stopped);
  CHECK(r.steps_done == 7);
  CHECK(safetensors::File::open((dir / "ck.safetensors").string()).metadata().at("step") == "7");
  const auto log = read_log(dir / "log.jsonl");
  REQUIRE(log.size() == 7);
  for (size_t s = 0; s < log.size(); ++s) {
    INFO("step " << s);
    CHECK(log[s]["twice_loss"].get<double>() == 2 * log[s]["loss"].get<double>());
    CHECK(log[s]["acc"].get<double>() == accs[s]);
    CHECK(log[s]["samples_per_s"].get<double>() > 0);  // batches are (x, y) pairs: 10 samples each
    CHECK(log[s].contains("epoch_done") == (s == 3));  // the last step of epoch 0 (steps 0..3)
  }
  CHECK(log[3]["epoch_done"] == 0.0);
  CHECK(loader.epoch() == 1);
  CHECK(loader.position() == 3);
  fs::remove_all(dir);
}

TEST_CASE("fit: evaluation runs before the first step, exactly every eval_every steps and after the last, with the model in eval mode",
          "[fit]") {
  const fs::path dir = temp_dir();
  const TensorDataset<C> eval_set = points(40, 9);
  const IndexedBatches eval{.batch =
                                [&](int64_t i) {
                                  return eval_set.get({i * 10, i * 10 + 1, i * 10 + 2, i * 10 + 3, i * 10 + 4, i * 10 + 5, i * 10 + 6,
                                                       i * 10 + 7, i * 10 + 8, i * 10 + 9});
                                },
                            .count = 4};
  // The mean loss of the 4 evaluation batches, by hand.
  auto eval_by_hand = [&](Net<C>& model) {
    NoGrad ng;
    const bool was = model.is_training();
    model.eval();
    double sum = 0;
    for (int64_t i = 0; i < 4; ++i) {
      const auto b = eval.batch(i);
      sum += item<double>(nn::cross_entropy(model.forward(b.first), b.second).value());
    }
    model.train(was);
    return sum / 4;
  };
  for (const bool at_start : {true, false}) {
    INFO("eval_at_start " << at_start);
    manual_seed(6);
    Net<C> model(8, 0.5);
    const double before = eval_by_hand(model);
    optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2});
    DataLoader train(points(48, 8), {.batch_size = 8, .shuffle = true, .seed = 2});
    std::vector<int64_t> eval_calls_at;  // training steps at which evaluation batches ran (-1: before the first)
    int64_t steps_seen = 0;
    auto step = [&](const std::pair<Tensor<C>, Tensor<C>>& b) {
      if (!model.is_training()) {
        CHECK_FALSE(grad_enabled());
        eval_calls_at.push_back(steps_seen - 1);
      } else {
        ++steps_seen;
      }
      return nn::cross_entropy(model.forward(b.first), b.second);
    };
    std::vector<double> eval_losses;
    std::vector<int64_t> eval_at;
    FitOptions o{.steps = 10, .eval_every = 3, .eval_at_start = at_start, .log_path = (dir / "log.jsonl").string(), .progress = 0};
    o.callbacks.push_back({.on_step = nullptr,
                           .on_eval =
                               [&](FitState& s) {
                                 eval_losses.push_back(s.eval_loss);
                                 eval_at.push_back(s.step);
                               },
                           .on_epoch = nullptr});
    const FitResult r = fit(model, opt, train, eval, step, o);
    std::vector<int64_t> at{2, 5, 8, 9};
    if (at_start) at.insert(at.begin(), -1);
    std::vector<int64_t> expect_calls;
    for (int64_t s : at)
      for (int i = 0; i < 4; ++i) expect_calls.push_back(s);
    CHECK(eval_calls_at == expect_calls);
    CHECK(eval_at == at);
    auto log = read_log(dir / "log.jsonl");
    REQUIRE(log.size() == (at_start ? 11 : 10));
    if (at_start) {
      // the first record: the evaluation of the initial weights, and nothing of a training step
      CHECK(log[0] == json{{"step", -1}, {"eval_loss", before}});
      log.erase(log.begin());
    }
    for (int64_t s = 0; s < 10; ++s) {
      CHECK(log[s]["step"] == s);
      CHECK(log[s].contains("eval_loss") == (std::find(at.begin(), at.end(), s) != at.end()));
    }
    CHECK(r.eval_losses == eval_losses);
    CHECK(r.eval_steps == (at_start ? std::vector<int64_t>{0, 3, 6, 9, 10} : std::vector<int64_t>{3, 6, 9, 10}));
    if (at_start) CHECK(r.eval_losses.front() == before);
    // the last evaluation, by hand on the final model
    CHECK(r.eval_losses.back() == eval_by_hand(model));
    CHECK(log[9]["eval_loss"].get<double>() == r.eval_losses.back());
  }
  fs::remove_all(dir);
}

TEST_CASE("fit: bad options and mismatched resume checkpoints are kiln::Errors naming the value, and nothing is written", "[fit]") {
  const fs::path dir = temp_dir();
  const std::string log = (dir / "log.jsonl").string(), ck = (dir / "ck.safetensors").string();
  const TensorDataset<C> data = points(40, 10);
  // A checkpoint to resume from: Net(16), Adam (kind "adam"), batches of 8 with seed 1, grad_accum 1, 3 steps.
  {
    manual_seed(0);
    Net<C> model;
    optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2});
    DataLoader loader(data, {.batch_size = 8, .shuffle = true, .seed = 1});
    fit(model, opt, loader, ce_step(model), {.steps = 3, .checkpoint_path = ck, .progress = 0});
  }
  std::ofstream(log) << "{\"step\": 0}\n";
  const std::string ck_bytes = slurp(ck), log_bytes = slurp(log);

  struct Case {
    std::string what;
    std::function<void()> run;
    std::vector<std::string> says;
  };
  auto plain = [&](const FitOptions& base, int64_t hidden = 16, bool sgd = false,
                   DataLoaderOptions d = {.batch_size = 8, .shuffle = true, .seed = 1}) {
    manual_seed(0);
    Net<C> model(hidden);
    std::unique_ptr<optim::Optimizer<C>> opt;
    if (sgd)
      opt = std::make_unique<optim::SGD<C>>(model.named_parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    else
      opt = std::make_unique<optim::Adam<C>>(model.named_parameters(), optim::AdamOptions{.lr = 1e-2});
    DataLoader loader(data, d);
    FitOptions o = base;
    o.log_path = log;
    o.progress = 0;
    fit(model, *opt, loader, ce_step(model), o);
  };
  auto indexed = [&](const FitOptions& base, int64_t count) {
    manual_seed(0);
    Net<C> model;
    optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2});
    const IndexedBatches src{.batch = [&](int64_t) { return data.get({0, 1, 2, 3}); }, .count = count};
    FitOptions o = base;
    o.log_path = log;
    o.progress = 0;
    fit(model, opt, src, src, ce_step(model), o);
  };
  const std::vector<Case> cases{
      {"no length", [&] { plain({}); }, {"exactly one of epochs and steps", "epochs=0 steps=0"}},
      {"both lengths", [&] { plain({.epochs = 1, .steps = 4}); }, {"exactly one of epochs and steps", "epochs=1 steps=4"}},
      {"negative steps", [&] { plain({.steps = -3}); }, {"steps must be >= 0, got -3"}},
      {"negative epochs", [&] { plain({.epochs = -1}); }, {"epochs must be >= 0, got -1"}},
      {"grad_accum 0", [&] { plain({.steps = 2, .grad_accum = 0}); }, {"grad_accum must be >= 1, got 0"}},
      {"negative clip", [&] { plain({.steps = 2, .grad_clip = -1}); }, {"grad_clip must be >= 0", "-1"}},
      {"negative eval_every", [&] { plain({.steps = 2, .eval_every = -2}); }, {"eval_every must be >= 0, got -2"}},
      {"checkpoint_every without a path",
       [&] { plain({.steps = 2, .checkpoint_every = 5}); },
       {"checkpoint_every = 5 needs a checkpoint_path"}},
      {"a checkpoint in a missing directory",
       [&] { plain({.steps = 2, .checkpoint_path = (dir / "no/ck.safetensors").string()}); },
       {"no directory", "no/ck.safetensors"}},
      {"unknown schedule", [&] { plain({.steps = 2, .schedule = {.name = "cosin"}}); }, {"unknown name 'cosin'"}},
      {"a negative time limit", [&] { plain({.steps = 2, .time_limit_s = -1}); }, {"time_limit_s must be >= 0", "-1"}},
      {"a time limit of nan",
       [&] { plain({.steps = 2, .time_limit_s = std::numeric_limits<double>::quiet_NaN()}); },
       {"time_limit_s must be >= 0", "nan"}},
      {"a loop metadata key",
       [&] {
         plain({.steps = 2, .metadata = {{"step", "7"}}});
       },
       {"metadata key 'step'"}},
      {"epochs on IndexedBatches", [&] { indexed({.epochs = 2}, 1); }, {"epochs = 2 needs a DataLoader"}},
      {"eval IndexedBatches without a count", [&] { indexed({.steps = 2}, 0); }, {"evaluation data has no batches", "count"}},
      {"a missing resume file", [&] { plain({.steps = 4, .resume_path = (dir / "nope.safetensors").string()}); }, {"nope.safetensors"}},
      {"resume: another model", [&] { plain({.steps = 4, .resume_path = ck}, 12); }, {"fc1.weight", "ck.safetensors"}},
      {"resume: another optimizer",
       [&] { plain({.steps = 4, .resume_path = ck}, 16, true); },
       {"holds the state of optimizer 'adam'", "'sgd'"}},
      {"resume: another batch size",
       [&] { plain({.steps = 4, .resume_path = ck}, 16, false, {.batch_size = 4, .shuffle = true, .seed = 1}); },
       {"batch_size 8", "4"}},
      {"resume: another data seed",
       [&] { plain({.steps = 4, .resume_path = ck}, 16, false, {.batch_size = 8, .shuffle = true, .seed = 2}); },
       {"seed 1", "seed 2"}},
      {"one DataLoader for training and evaluation",
       [&] {
         manual_seed(0);
         Net<C> model;
         optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2});
         DataLoader loader(data, {.batch_size = 8});
         fit(model, opt, loader, loader, ce_step(model), {.steps = 2, .log_path = log, .progress = 0});
       },
       {"the same DataLoader trains and evaluates"}},
      {"resume: another grad_accum", [&] { plain({.steps = 4, .grad_accum = 2, .resume_path = ck}); }, {"grad_accum 1", "grad_accum 2"}},
      {"resume: beyond the run", [&] { plain({.steps = 2, .resume_path = ck}); }, {"at step 3, beyond this run's 2 steps"}},
      {"resume: a checkpoint of DataLoader data into IndexedBatches",
       [&] { indexed({.steps = 4, .resume_path = ck}, 1); },
       {"DataLoader data", "IndexedBatches"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    try {
      c.run();
      FAIL("no error");
    } catch (const Error& e) {
      INFO(e.what());
      for (const std::string& s : c.says) CHECK_THAT(e.what(), Catch::Contains(s));
    }
    CHECK(slurp(log) == log_bytes);
    CHECK(slurp(ck) == ck_bytes);
    CHECK(!fs::exists(dir / "no"));
  }
  fs::remove_all(dir);
}

namespace {

// A run for the time-limit tests: Net(8) without dropout, SGD at 0.1, one fixed batch of 8 points per step,
// evaluation on 2 batches, a step function that sleeps sleep_ms(step) milliseconds (so the steps' time
// is the sleep's, whatever the machine), 1,000 steps and `sched` unless `scheduler` (a CosineAnnealingLR
// object over the 1,000 steps).
struct TimedRun {
  FitResult result;
  std::vector<json> log;
  std::map<std::string, std::string> meta;  // the checkpoint's
};
const LrSchedule kTimedSchedule{.name = "cosine", .warmup_steps = 5, .min_lr_ratio = 0.1};
TimedRun timed_run(const fs::path& dir, FitOptions o, const std::function<int(int64_t)>& sleep_ms, bool scheduler = false,
                   const LrSchedule& sched = kTimedSchedule) {
  const TensorDataset<C> data = points(24, 12);
  manual_seed(1);
  Net<C> model(8, 0.0);
  optim::SGD<C> opt(model.named_parameters(), {.lr = 0.1});
  int64_t calls = 0;
  auto step = [&](const std::pair<Tensor<C>, Tensor<C>>& b) {
    if (model.is_training()) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms(calls++)));
    return nn::cross_entropy(model.forward(b.first), b.second);
  };
  const IndexedBatches train{.batch = [&](int64_t) { return data.get({0, 1, 2, 3, 4, 5, 6, 7}); }};
  const IndexedBatches eval{.batch = [&](int64_t i) { return data.get({8 + 8 * i, 9 + 8 * i, 10 + 8 * i, 11 + 8 * i}); }, .count = 2};
  o.steps = 1000;
  o.checkpoint_path = (dir / "ck.safetensors").string();
  o.log_path = (dir / "log.jsonl").string();
  o.progress = 0;
  if (scheduler)
    o.scheduler = std::make_shared<optim::CosineAnnealingLR>(opt, 1000, 0.01);
  else
    o.schedule = sched;
  TimedRun r;
  r.result = fit(model, opt, train, eval, step, o);
  r.log = read_log(dir / "log.jsonl");
  r.meta = safetensors::File::open(o.checkpoint_path).metadata();
  return r;
}

// Each record's lr against the schedule over the run's total as the plans set it: 1,000 steps until a
// record carries planned_steps (the first step under a plan), that total from there on. Returns the
// totals the plans set, in order.
std::vector<int64_t> check_planned_lrs(const std::vector<json>& log, const LrSchedule& sched) {
  std::vector<int64_t> totals;
  int64_t total = 1000;
  for (const json& rec : log) {
    const auto s = rec["step"].get<int64_t>();
    if (rec.contains("planned_steps")) {
      total = rec["planned_steps"].get<int64_t>();
      totals.push_back(total);
    }
    INFO("step " << s << ", total " << total);
    CHECK(rec["lr"].get<double>() == sched.at(0.1, s, total));
  }
  return totals;
}

}  // namespace

// The clock is real (steps that sleep), so what each section checks holds at any speed: a slow moment
// may make a plan's revision end the run sooner, or the limit stop it before its planned end; the
// checks allow for both.
TEST_CASE("fit: a time limit plans the steps that fit and ends the schedule with them, stops at the limit whatever the plan, and resumes",
          "[fit]") {
  const fs::path dir = temp_dir();
  const LrSchedule& sched = kTimedSchedule;
  const int64_t plan_step = kTimePlanSkip + kTimePlanSteps;  // the first step under the first plan
  // What every run with a plan shows: the last step evaluated, the checkpoint says where the run ended
  // and what it planned; when the limit did not stop it, it ran its planned steps and ended annealed.
  auto check_run = [&](const TimedRun& t, const std::vector<int64_t>& totals, const LrSchedule& sch = kTimedSchedule) {
    const FitResult& r = t.result;
    REQUIRE(!totals.empty());
    CHECK(r.planned_steps == totals.back());
    CHECK(t.meta.at("time_limit.planned_steps") == std::to_string(r.planned_steps));
    CHECK(t.meta.at("step") == std::to_string(r.steps_done));
    CHECK(r.eval_steps.back() == r.steps_done);
    CHECK(t.log.back().contains("eval_loss"));
    CHECK(r.stopped == r.out_of_time);
    if (!r.out_of_time) {
      CHECK(r.steps_done == r.planned_steps);
      CHECK(t.log.back()["lr"].get<double>() == sch.at(0.1, r.planned_steps - 1, r.planned_steps));
    } else {
      CHECK(r.steps_done < r.planned_steps);
    }
  };
  SECTION("the plan") {
    const TimedRun t = timed_run(dir, {.time_limit_s = 1.5}, [](int64_t) { return 10; });
    const FitResult& r = t.result;
    INFO("planned " << r.planned_steps << ", done " << r.steps_done << ", out of time " << r.out_of_time);
    REQUIRE(t.log.size() == static_cast<size_t>(r.steps_done));
    const std::vector<int64_t> totals = check_planned_lrs(t.log, sched);
    REQUIRE(!totals.empty());
    CHECK(t.log[plan_step].contains("planned_steps"));  // the first plan, after the 20 steps timed
    for (int64_t s = 0; s < plan_step; ++s) CHECK(!t.log[s].contains("planned_steps"));
    CHECK(totals.front() > plan_step);
    CHECK(totals.front() < 1000);                               // 1,000 steps of 10 ms do not fit 1.5 s
    CHECK(std::stod(t.meta.at("time_limit.elapsed_s")) > 0.2);  // at least the plan's 23 steps of 10 ms
    check_run(t, totals);
  }
  SECTION("a run that falls behind its plan: each revision brings the end closer by at most 2% of the steps") {
    // 5 ms steps while the first plan times them (~380 steps in 2 s), then 15 ms: past the run's first
    // tenth, every revision (each 20 steps) moves the end by 20 of the 1,000 steps, and the limit stops
    // the run where they have not caught up.
    const TimedRun t = timed_run(dir, {.time_limit_s = 2.0}, [&](int64_t i) { return i < plan_step ? 5 : 15; });
    const FitResult& r = t.result;
    INFO("planned " << r.planned_steps << ", done " << r.steps_done << ", out of time " << r.out_of_time);
    const std::vector<int64_t> totals = check_planned_lrs(t.log, sched);
    REQUIRE(totals.size() >= 2);
    CHECK(totals.front() > 200);
    for (size_t i = 1; i < totals.size(); ++i) {
      CHECK(totals[i] < totals[i - 1]);
      CHECK(totals[i - 1] - totals[i] <= static_cast<int64_t>(kTimePlanMove * 1000));
    }
    check_run(t, totals);
  }
  SECTION("early in the run (the warmup), a revision lengthens it again") {
    // 15 ms steps while the first plan times them (~130 steps in 2 s), then 5 ms: the revisions within
    // the warmup of 100 steps give the run more steps, each on the mean time of the steps since the last.
    const LrSchedule long_warmup{.name = "cosine", .warmup_steps = 100, .min_lr_ratio = 0.1};
    const TimedRun t = timed_run(
        dir, {.time_limit_s = 2.0}, [&](int64_t i) { return i < plan_step ? 15 : 5; }, false, long_warmup);
    const FitResult& r = t.result;
    INFO("planned " << r.planned_steps << ", done " << r.steps_done << ", out of time " << r.out_of_time);
    const std::vector<int64_t> totals = check_planned_lrs(t.log, long_warmup);
    REQUIRE(totals.size() >= 2);
    CHECK(totals[1] > totals[0]);
    CHECK(totals.back() <= 1000);
    check_run(t, totals, long_warmup);
  }
  SECTION("the stop, when the steps slow down faster than the plan is revised") {
    // 5 ms steps while the plan times them, then 100 ms: the limit stops the run some 9 steps after the plan.
    const TimedRun t = timed_run(dir, {.time_limit_s = 1.0}, [&](int64_t i) { return i < plan_step ? 5 : 100; });
    const FitResult& r = t.result;
    INFO("planned " << r.planned_steps << ", done " << r.steps_done);
    const std::vector<int64_t> totals = check_planned_lrs(t.log, sched);
    CHECK(r.out_of_time);
    CHECK(!r.interrupted);
    check_run(t, totals);
    CHECK(t.log.back()["lr"].get<double>() > sched.at(0.1, r.planned_steps - 1, r.planned_steps));  // not annealed
    CHECK(std::stod(t.meta.at("time_limit.elapsed_s")) >= 1.0);
  }
  SECTION("a scheduler object keeps its length: only the stop") {
    const TimedRun t = timed_run(
        dir, {.time_limit_s = 0.5}, [](int64_t) { return 10; }, true);
    const FitResult& r = t.result;
    INFO("done " << r.steps_done);
    CHECK(r.planned_steps == 0);
    CHECK(r.out_of_time);
    CHECK(r.stopped);
    CHECK(r.steps_done < 1000);
    CHECK(r.eval_steps.back() == r.steps_done);
    for (const json& rec : t.log) CHECK(!rec.contains("planned_steps"));
    CHECK(!t.meta.count("time_limit.planned_steps"));
  }
  SECTION("resume: the time spent counts and the plan is kept; without a limit the run goes back to its steps") {
    const TimedRun a = timed_run(dir, {.stop_after = 30, .time_limit_s = 1.5}, [](int64_t) { return 10; });
    const int64_t planned = a.result.planned_steps;
    INFO("planned " << planned);
    REQUIRE(planned > 30);
    REQUIRE(a.result.steps_done == 30);
    const double spent = std::stod(a.meta.at("time_limit.elapsed_s"));
    const std::string ck = (dir / "ck.safetensors").string(), a_ck = (dir / "a.safetensors").string();
    fs::copy_file(ck, a_ck);
    const TimedRun b = timed_run(dir, {.resume_path = a_ck, .time_limit_s = 1.5}, [](int64_t) { return 10; });
    CHECK(b.result.start_step == 30);
    CHECK(std::stod(b.meta.at("time_limit.elapsed_s")) > spent + 0.01 * static_cast<double>(b.result.steps_done - 30));
    // The log keeps the first call's records (its plan at step 23); the resumed call starts from its total.
    const std::vector<int64_t> totals = check_planned_lrs(b.log, sched);
    REQUIRE(!totals.empty());
    CHECK(totals.front() == planned);
    // The resumed call kept the plan and only revises it, past the run's first tenth: 2% of the steps at most.
    for (size_t i = 1; i < totals.size(); ++i) CHECK(std::abs(totals[i] - totals[i - 1]) <= static_cast<int64_t>(kTimePlanMove * 1000));
    check_run(b, totals);
    // Resumed without a limit: 1,000 steps again (five of them here).
    const TimedRun c = timed_run(dir, {.resume_path = a_ck, .stop_after = 35}, [](int64_t) { return 0; });
    CHECK(c.result.planned_steps == 0);
    CHECK(c.result.steps_done == 35);
    CHECK(c.log.back()["lr"].get<double>() == sched.at(0.1, 34, 1000));
    CHECK(!c.meta.count("time_limit.elapsed_s"));
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "fit: a checkpoint whose optimizer an older kiln recorded by GCC's typeid name, or as adam for an AdamW, resumes exactly, "
    "another kind's is refused",
    "[fit][checkpoint]") {
  const fs::path dir = temp_dir();
  const std::string ck = (dir / "ck.safetensors").string(), old = (dir / "old.safetensors").string();
  const TensorDataset<C> data = points(40, 10);
  auto run = [&](int64_t steps, const std::string& save, const std::string& resume, bool decoupled = true) {
    manual_seed(0);
    Net<C> model;
    optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2, .decoupled = decoupled});
    DataLoader loader(data, {.batch_size = 8, .shuffle = true, .seed = 1});
    const FitResult r =
        fit(model, opt, loader, ce_step(model), {.steps = steps, .checkpoint_path = save, .resume_path = resume, .progress = 0});
    return std::make_pair(r.losses, snapshot(model));
  };
  run(2, ck, "");
  // The same checkpoint with another optimizer name; `legacy`: as a kiln of before 2026-11-26 wrote it
  // (no optimizer_kinds; Optimizer::kind() defaulted to typeid(*this).name(), the Itanium mangling of
  // GCC and Clang, and AdamW recorded "adam").
  auto rewrite = [&](const std::string& kind, bool legacy = true) {
    auto meta = safetensors::File::open(ck).metadata();
    REQUIRE(meta.at("optimizer") == "adamw");
    REQUIRE(meta.at("optimizer_kinds") == "2");
    meta["optimizer"] = kind;
    if (legacy) meta.erase("optimizer_kinds");
    const auto tensors = safetensors::load<C>(ck);
    safetensors::save<C>(old, std::vector<std::pair<std::string, Tensor<C>>>(tensors.begin(), tensors.end()), meta);
  };
  const std::string adam_old = "N4kiln5optim4AdamINS_3CpuEEE";
#if defined(__GNUC__)
  CHECK(std::string(typeid(optim::Adam<C>).name()) == adam_old);
#endif
  const auto fresh = run(4, "", ck);
  rewrite(adam_old);
  CHECK(run(4, "", old) == fresh);                // losses and weights, bit for bit
  rewrite("N4kiln5optim4AdamINS_9ReferenceEEE");  // written by another backend's run
  CHECK(run(4, "", old) == fresh);
  rewrite("adam");  // AdamW's name until 2026-11-26
  CHECK(run(4, "", old) == fresh);
  rewrite("N4kiln5optim3SGDINS_3CpuEEE");
  CHECK_THROWS_WITH(run(4, "", old), Catch::Contains("holds the state of optimizer 'sgd', this run uses 'adamw'"));
  rewrite("N2me9MyAdamLikeE");
  CHECK_THROWS_WITH(run(4, "", old), Catch::Contains("'N2me9MyAdamLikeE'") && Catch::Contains("this run uses 'adamw'"));
  // Stable names: an Adam's checkpoint does not load into an AdamW, nor an AdamW's into an Adam.
  rewrite("adam", false);
  CHECK_THROWS_WITH(run(4, "", old), Catch::Contains("holds the state of optimizer 'adam', this run uses 'adamw'"));
  CHECK_THROWS_WITH(run(4, "", ck, false), Catch::Contains("holds the state of optimizer 'adamw', this run uses 'adam'"));
  rewrite(adam_old, false);  // a typeid name only in an older kiln's checkpoint
  CHECK_THROWS_WITH(run(4, "", old), Catch::Contains("holds the state of optimizer 'adam', this run uses 'adamw'"));
  fs::remove_all(dir);
}

TEST_CASE("fit: hooks.main_process = false writes no log and no checkpoint, and the run is the same", "[fit]") {
  const fs::path dir = temp_dir();
  auto run = [&](bool main) {
    manual_seed(8);
    Net<C> model(8, 0.0);
    optim::Adam<C> opt(model.named_parameters(), {.lr = 1e-2});
    DataLoader loader(points(32, 11), {.batch_size = 8, .shuffle = true, .seed = 4});
    FitOptions o{.steps = 5, .checkpoint_path = (dir / "ck.safetensors").string(), .log_path = (dir / "log.jsonl").string(), .progress = 0};
    o.hooks.main_process = main;
    return fit(model, opt, loader, ce_step(model), o).losses;
  };
  const auto worker = run(false);
  CHECK(!fs::exists(dir / "ck.safetensors"));
  CHECK(!fs::exists(dir / "log.jsonl"));
  CHECK(worker == run(true));
  CHECK(read_log(dir / "log.jsonl").size() == 5);
  fs::remove_all(dir);
}

TEST_CASE("kiln train (train_gpt on fit): grad_accum k of batch n equals batch k·n (f64, SGD)", "[fit][gpt]") {
  // Batch i of the token data holds rows i·n .. i·n+n-1, so micro-batches s·k .. s·k+k-1 of n rows
  // are exactly the rows of batch s of k·n: only the order of the sums differs (tolerance as above).
  const fs::path dir = temp_dir();
  std::vector<int64_t> tokens(3000);
  uint64_t x = 12345;
  for (auto& t : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int64_t>((x >> 33) % 32);
  }
  safetensors::save<C>((dir / "tokens.safetensors").string(),
                       {{"tokens", Tensor<C>::from_vector(tokens, {static_cast<int64_t>(tokens.size())})}});
  std::ofstream(dir / "model.json") << R"({"vocab_size": 32, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16})";
  auto train = [&](int64_t batch, int64_t accum) {
    const std::string name = fmt::format("train_{}_{}.json", batch, accum);
    std::ofstream(dir / name) << json{{"batch_size", batch}, {"seq_len", 8},        {"steps", 3},
                                      {"grad_clip", 0.0},    {"grad_accum", accum}, {"optimizer", {{"name", "sgd"}, {"lr", 0.5}}}}
                                     .dump();
    TrainOptions o;
    o.model_path = (dir / "model.json").string();
    o.train_path = (dir / name).string();
    o.data_path = (dir / "tokens.safetensors").string();
    o.dtype = DType::f64;
    o.quiet = true;
    o.log_path = (dir / fmt::format("log_{}_{}.jsonl", batch, accum)).string();
    return train_gpt(o).losses;
  };
  const auto a = train(2, 2), b = train(4, 1), c = train(2, 1);
  REQUIRE(a.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(std::abs(a[i] - b[i]) < 1e-12 * b[i]);
  CHECK(std::abs(c[2] - b[2]) > 1e-6 * b[2]);
  // The model FLOPs of a step: 4 rows of 8 tokens either way, summed over the micro-batches.
  ModelConfig cfg = ModelConfig::load((dir / "model.json").string());
  const double step_flops = 4 * nn::gpt_flops(cfg, 8).total();
  for (const char* log : {"log_2_2.jsonl", "log_4_1.jsonl"})
    for (const json& r : read_log(dir / log)) {
      CHECK(r["flops"].get<double>() == step_flops);
      CHECK(r["gflops"].get<double>() == Approx(step_flops / (r["ms"].get<double>() / 1e3) / 1e9));
    }
  CHECK(read_log(dir / "log_2_1.jsonl")[0]["flops"].get<double>() == step_flops / 2);
  fs::remove_all(dir);
}
