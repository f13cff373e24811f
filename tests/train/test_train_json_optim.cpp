// train.json's optimizer types beyond the reference's (rmsprop, adagrad, lion, adafactor; "type" as a
// synonym of "name"), "ema" and "scheduler" objects: parsing with torch's defaults, errors naming the
// key or type, to_json round trips, a `kiln train` run (train_gpt) with each optimizer that learns, the
// lr each scheduler type sets step by step, and runs with an EMA and with OneCycleLR stopped and
// resumed that equal ones that never stopped.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/ranges.h>

#include <kiln/formats/safetensors.hpp>
#include <kiln/train/config.hpp>
#include <kiln/train/trainer.hpp>

using namespace kiln;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A temporary folder with a tiny model and a learnable token stream (a repeating pattern of 12).
struct Run {
  fs::path dir;
  Run() {
    static int n = 0;
    dir = fs::temp_directory_path() / fmt::format("kiln-train-json-optim-{}-{}", ::getpid(), n++);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<int64_t> tokens(2000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7) % 12);
    safetensors::save<Cpu>((dir / "tokens.safetensors").string(),
                           {{"tokens", Tensor<Cpu>::from_vector(tokens, {static_cast<int64_t>(tokens.size())})}});
    std::ofstream(dir / "model.json") << R"({"vocab_size": 16, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16})";
  }
  ~Run() { fs::remove_all(dir); }
  TrainResult train(const json& t, const std::string& name, int64_t stop_after = -1, bool resume = false) const {
    std::ofstream(dir / (name + ".json")) << t.dump();
    TrainOptions o;
    o.model_path = (dir / "model.json").string();
    o.train_path = (dir / (name + ".json")).string();
    o.data_path = (dir / "tokens.safetensors").string();
    o.checkpoint_path = (dir / (name + ".ck.safetensors")).string();
    o.log_path = (dir / (name + ".jsonl")).string();
    if (resume) o.resume_path = o.checkpoint_path;
    o.stop_after = stop_after;
    o.quiet = true;
    return train_gpt(o);
  }
};

// The "lr" of each record of a run's JSONL log.
std::vector<double> logged_lrs(const fs::path& p) {
  std::vector<double> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(json::parse(line).at("lr").get<double>());
  return out;
}

double mean(const std::vector<double>& v, size_t from, size_t n) {
  double s = 0;
  for (size_t i = from; i < from + n; ++i) s += v[i];
  return s / static_cast<double>(n);
}

// Runs t through once, and once stopped after `stop` of its `steps` steps and resumed: the losses are
// equal, and so are the final checkpoints' tensors whose names start with `prefix` (their count returned).
size_t check_resume(const Run& run, const json& t, const std::string& name, size_t steps, int64_t stop, const std::string& prefix) {
  const auto full = run.train(t, name + "_full");
  const auto first = run.train(t, name + "_halves", stop);
  const auto second = run.train(t, name + "_halves", -1, true);
  const auto k = static_cast<size_t>(stop);
  REQUIRE(full.losses.size() == steps);
  REQUIRE(first.losses.size() == k);
  REQUIRE(second.losses.size() == steps - k);
  for (size_t i = 0; i < steps; ++i) CHECK(full.losses[i] == (i < k ? first.losses[i] : second.losses[i - k]));
  const auto a = safetensors::load<Cpu>((run.dir / (name + "_full.ck.safetensors")).string());
  const auto b = safetensors::load<Cpu>((run.dir / (name + "_halves.ck.safetensors")).string());
  size_t n = 0;
  for (const auto& [key, v] : a)
    if (key.rfind(prefix, 0) == 0 || key.find("weight") != std::string::npos) {
      INFO(key);
      CHECK(to_vector<double>(b.at(key)) == to_vector<double>(v));
      n += key.rfind(prefix, 0) == 0 ? 1 : 0;
    }
  return n;
}

}  // namespace

TEST_CASE("train.json: optimizer types with torch's defaults, \"type\" as \"name\", errors, round trip", "[config]") {
  const TrainConfig r = TrainConfig::from_json(json{{"optimizer", {{"type", "rmsprop"}, {"momentum", 0.5}, {"centered", true}}}});
  CHECK(r.optimizer.name == "rmsprop");
  CHECK(r.optimizer.lr == 1e-2);
  CHECK(r.optimizer.alpha == 0.99);
  CHECK(r.optimizer.momentum == 0.5);
  CHECK(r.optimizer.centered);
  const TrainConfig l = TrainConfig::from_json(json{{"optimizer", {{"name", "lion"}, {"betas", {0.95, 0.98}}}}});
  CHECK(l.optimizer.lr == 1e-4);
  CHECK(l.optimizer.beta2 == 0.98);
  const TrainConfig a =
      TrainConfig::from_json(json{{"optimizer", {{"name", "adafactor"}, {"eps1", 1e-30}, {"d", 2.0}}}, {"ema", {{"decay", 0.9}}}});
  CHECK(a.optimizer.eps1 == std::optional<double>(1e-30));
  CHECK(a.optimizer.d == 2.0);
  REQUIRE(a.ema.has_value());
  CHECK(a.ema->decay == 0.9);
  CHECK_FALSE(l.ema.has_value());
  for (const TrainConfig& c : {r, l, a, TrainConfig::from_json(json{{"optimizer", {{"name", "adagrad"}, {"lr_decay", 0.1}}}})})
    CHECK(TrainConfig::from_json(c.to_json()).to_json() == c.to_json());
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"optimizer", {{"type", "adamax"}}}}, "t.json"),
                    Catch::Contains("t.json: optimizer") && Catch::Contains("adamax") && Catch::Contains("lion"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"optimizer", {{"type", "lion"}, {"eps", 1e-8}}}}, "t.json"), Catch::Contains("'eps'"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"optimizer", {{"type", "sgd"}, {"name", "sgd"}}}}, "t.json"),
                    Catch::Contains("'name' or 'type', not both"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"ema", {{"decay", 0.9}, {"beta", 1}}}}, "t.json"),
                    Catch::Contains("t.json: ema") && Catch::Contains("'beta'"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"ema", {{"decay", 1.5}}}}, "t.json"), Catch::Contains("ema decay must be in [0, 1]"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"optimizer", {{"name", "lion"}}}, {"zero_stage", 1}}, "t.json"),
                    Catch::Contains("zero_stage 1 shards adamw, adam or sgd, not optimizer 'lion'"));
}

TEST_CASE("kiln train learns with each optimizer of train.json, and resumes an EMA run bit for bit", "[fit][gpt]") {
  const Run run;
  // each with the state only that optimizer keeps (so the type really chose the optimizer)
  const std::vector<std::pair<json, std::string>> opts{{{{"type", "rmsprop"}, {"lr", 3e-3}}, "optim.square_avg."},
                                                       {{{"type", "adagrad"}, {"lr", 5e-2}}, "optim.sum."},
                                                       {{{"type", "lion"}, {"lr", 3e-3}}, "optim.exp_avg."},
                                                       {{{"type", "adafactor"}, {"lr", 3e-2}}, "optim.row_var."},
                                                       {{{"type", "sgd"}, {"lr", 0.5}, {"momentum", 0.9}}, "optim.momentum_buffer."},
                                                       {{{"type", "adamw"}, {"lr", 1e-2}}, "optim.exp_avg_sq."}};
  for (const auto& [o, state] : opts) {
    INFO(o.dump());
    const std::string name = o["type"].get<std::string>();
    const auto r = run.train(json{{"batch_size", 4}, {"seq_len", 8}, {"steps", 30}, {"optimizer", o}}, name);
    REQUIRE(r.losses.size() == 30);
    CHECK(mean(r.losses, 25, 5) < 0.7 * mean(r.losses, 0, 5));  // from ~ln 16 towards the pattern
    std::set<std::string> kinds;
    for (const auto& [key, v] : safetensors::load<Cpu>((run.dir / (name + ".ck.safetensors")).string()))
      if (key.rfind("optim.", 0) == 0 && key.find('.', 6) != std::string::npos) kinds.insert(key.substr(0, key.find('.', 6) + 1));
    INFO(fmt::format("{}", fmt::join(kinds, " ")));
    CHECK(kinds.count(state) == 1);
    if (name != "adafactor" && name != "adamw") CHECK(kinds.size() == 1);  // Adam: exp_avg too; Adafactor: row, col, variance
  }
  const json t{{"batch_size", 4}, {"seq_len", 8}, {"steps", 8}, {"optimizer", {{"type", "lion"}, {"lr", 3e-3}}}, {"ema", {{"decay", 0.8}}}};
  CHECK(check_resume(run, t, "ema", 8, 4, "ema.") > 2);
}

TEST_CASE("train.json: scheduler objects, parsed, checked and round-tripped", "[config]") {
  const TrainConfig c = TrainConfig::from_json(json{{"scheduler", {{"type", "multistep"}, {"milestones", {3, 7}}, {"gamma", 0.5}}}});
  REQUIRE(c.scheduler.has_value());
  CHECK(c.scheduler->milestones == std::vector<int64_t>{3, 7});
  for (const json& s :
       {json{{"type", "step"}, {"step_size", 4}}, json{{"type", "exponential"}, {"gamma", 0.9}},
        json{{"type", "cosine"}, {"T_max", 10}, {"eta_min", 1e-4}}, json{{"type", "cosine_warm_restarts"}, {"T_0", 5}, {"T_mult", 2}},
        json{{"type", "linear"}, {"start_factor", 0.1}}, json{{"type", "onecycle"}, {"max_lr", 0.1}, {"three_phase", true}}}) {
    INFO(s.dump());
    const TrainConfig t = TrainConfig::from_json(json{{"scheduler", s}});
    CHECK(TrainConfig::from_json(t.to_json()).to_json() == t.to_json());
  }
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"scheduler", {{"type", "plateau"}}}}, "t.json"),
                    Catch::Contains("t.json: scheduler") && Catch::Contains("plateau") && Catch::Contains("onecycle"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"scheduler", {{"type", "step"}, {"step_size", 2}, {"T_max", 3}}}}, "t.json"),
                    Catch::Contains("'T_max'"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"scheduler", {{"type", "step"}}}}, "t.json"), Catch::Contains("step needs 'step_size'"));
  CHECK_THROWS_WITH(
      TrainConfig::from_json(json{{"scheduler", {{"type", "step"}, {"step_size", 2}}}, {"schedule", {{"name", "cosine"}}}}, "t.json"),
      Catch::Contains("'schedule' or 'scheduler', not both"));
}

TEST_CASE("kiln train steps a train.json scheduler object, and resumes a OneCycleLR run bit for bit", "[fit][gpt]") {
  const Run run;
  auto lrs = [&](const json& sched, const json& opt) {
    run.train(json{{"batch_size", 2}, {"seq_len", 8}, {"steps", 12}, {"optimizer", opt}, {"scheduler", sched}}, "lr");
    return logged_lrs(run.dir / "lr.jsonl");
  };
  const json sgd{{"type", "sgd"}, {"lr", 0.2}};
  const auto step = lrs(json{{"type", "step"}, {"step_size", 5}, {"gamma", 0.5}}, sgd);
  REQUIRE(step.size() == 12);
  for (size_t s = 0; s < 12; ++s) CHECK(step[s] == Approx(0.2 * std::pow(0.5, static_cast<double>(s / 5))).epsilon(1e-12));
  const auto lin = lrs(json{{"type", "linear"}, {"start_factor", 0.25}, {"total_iters", 4}}, sgd);
  for (size_t s = 0; s < 12; ++s)
    CHECK(lin[s] == Approx(0.2 * (0.25 + 0.75 * static_cast<double>(std::min<size_t>(s, 4)) / 4)).epsilon(1e-12));
  const auto cos = lrs(json{{"type", "cosine"}}, sgd);  // T_max = steps
  for (size_t s = 0; s < 12; ++s) CHECK(cos[s] == Approx(0.1 * (1 + std::cos(M_PI * static_cast<double>(s) / 12))).epsilon(1e-12));
  const auto one = lrs(json{{"type", "onecycle"}}, json{{"type", "adamw"}, {"lr", 0.01}});  // max_lr = lr, total_steps = steps
  CHECK(one[0] == Approx(0.01 / 25).epsilon(1e-12));
  CHECK(*std::max_element(one.begin(), one.end()) <= 0.01 * (1 + 1e-12));
  CHECK(one[11] < 0.01 / 25);

  const json t{{"batch_size", 4},
               {"seq_len", 8},
               {"steps", 10},
               {"optimizer", {{"type", "adamw"}, {"lr", 1e-2}}},
               {"scheduler", {{"type", "onecycle"}, {"pct_start", 0.4}}}};
  CHECK(check_resume(run, t, "oc", 10, 5, "optim.") > 2);
}

TEST_CASE("kiln train resumes bit for bit from a checkpoint of save_checkpoint, which records the optimizer's kind",
          "[fit][gpt][checkpoint]") {
  const Run run;
  const json t{{"batch_size", 2}, {"seq_len", 8}, {"steps", 6}, {"optimizer", {{"name", "adamw"}, {"lr", 1e-2}, {"weight_decay", 0.1}}}};
  const auto full = run.train(t, "full");
  const auto first = run.train(t, "first", 3);  // fit's checkpoint of step 3: first.ck.safetensors
  REQUIRE(first.losses.size() == 3);
  // The model and optimizer of step 3 (read from fit's checkpoint), written again by save_checkpoint.
  const std::string ck = (run.dir / "first.ck.safetensors").string(), own = (run.dir / "own.safetensors").string();
  const std::string data = (run.dir / "tokens.safetensors").string();
  const TrainConfig tc = TrainConfig::load((run.dir / "first.json").string());
  const auto model = load_gpt<Cpu>(ck);
  const auto opt = make_optimizer<Cpu>(*model, tc.optimizer, false);
  const auto f = safetensors::File::open(ck);
  std::map<std::string, Tensor<Cpu>> osd;
  for (const std::string& n : f.names())
    if (n.rfind("optim.", 0) == 0) osd.emplace(n.substr(6), f.load<Cpu>(n));
  opt->load_state_dict(osd);
  default_generator().set_state(std::stoull(f.metadata().at("rng_seed")), std::stoull(f.metadata().at("rng_offset")));
  save_checkpoint<Cpu>(own, *model, opt.get(), 3, tc, data);
  const auto meta = safetensors::File::open(own).metadata();
  CHECK(meta.at("optimizer") == "adamw");
  CHECK(meta.at("optimizer_kinds") == "2");
  CHECK(meta.at("step") == "3");
  auto resume = [&](const std::string& train_json) {
    TrainOptions o;
    o.model_path = (run.dir / "model.json").string();
    o.train_path = (run.dir / train_json).string();
    o.data_path = data;
    o.resume_path = own;
    o.checkpoint_path = (run.dir / "rest.ck.safetensors").string();
    o.quiet = true;
    return train_gpt(o);
  };
  const auto rest = resume("first.json");
  REQUIRE(rest.losses.size() == 3);
  for (size_t i = 0; i < 6; ++i) CHECK(full.losses[i] == (i < 3 ? first.losses[i] : rest.losses[i - 3]));
  // The final weights and optimizer state, bit for bit.
  const auto a = safetensors::load<Cpu>((run.dir / "full.ck.safetensors").string());
  const auto b = safetensors::load<Cpu>((run.dir / "rest.ck.safetensors").string());
  REQUIRE(a.size() == b.size());
  for (const auto& [key, v] : a) {
    INFO(key);
    CHECK(to_vector<double>(b.at(key)) == to_vector<double>(v));
  }
  // Adam's update on AdamW's state is refused, as for fit's checkpoints.
  json adam = t;
  adam["optimizer"]["name"] = "adam";
  std::ofstream(run.dir / "adam.json") << adam.dump();
  CHECK_THROWS_WITH(resume("adam.json"), Catch::Contains("holds the state of optimizer 'adamw', this run uses 'adam'"));
}
