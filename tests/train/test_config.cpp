// model.json / train.json parsing, LR schedules against the reference's lr_at, token batches.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/train/config.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/progress.hpp>
#include "common/python.hpp"

using namespace kiln;
using json = nlohmann::json;

namespace {
std::string run_python(const std::string& code) {
  const std::string script = (std::filesystem::temp_directory_path() / fmt::format("kiln-py-{}.py", ::getpid())).string();
  std::ofstream(script) << code;
  std::string out;
  FILE* p = ::popen(fmt::format("{} {}", kiln::test::python(), script).c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  REQUIRE(::pclose(p) == 0);
  return out;
}
}  // namespace

TEST_CASE("config: defaults, resolution and the reference's ffn rule", "[config]") {
  const ModelConfig c = ModelConfig{}.resolved();
  CHECK(c.n_kv_heads == 4);
  CHECK(c.ffn_hidden == 384);  // ((8·128 // 3) + 63) // 64 · 64
  ModelConfig d;
  d.d_model = 200;
  d.n_heads = 5;
  d.rope = false;
  CHECK(d.resolved().ffn_hidden == 576);  // 8·200//3 = 533 -> 576
}

TEST_CASE("config: unknown keys, wrong types and bad values name the key", "[config]") {
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"d_modle", 64}}, "m.json"),
                    Catch::Contains("m.json") && Catch::Contains("d_modle") && Catch::Contains("valid keys") && Catch::Contains("d_model"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"d_model", "big"}}, "m.json"), Catch::Contains("'d_model' must be an integer"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attention", "flash"}}), Catch::Contains("flash") && Catch::Contains("mha, diff"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"n_heads", 4}, {"n_kv_heads", 3}}), Catch::Contains("n_kv_heads (3)"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attention", "diff"}, {"d_model", 36}, {"n_heads", 4}}), Catch::Contains("2·n_heads (8)"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attention", "diff"}, {"d_model", 24}, {"n_heads", 4}}),
                    Catch::Contains("odd"));  // sub-head width 3 with RoPE
  CHECK_NOTHROW(ModelConfig::from_json(json{{"attention", "diff"}, {"d_model", 24}, {"n_heads", 4}, {"rope", false}}));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attnres_block_size", 0}}), Catch::Contains("attnres_block_size"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"optimizer", {{"name", "adamw"}, {"lr", 1e-3}, {"beta", 0.9}}}}, "t.json"),
                    Catch::Contains("t.json: optimizer") && Catch::Contains("'beta'") && Catch::Contains("betas"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"schedule", {{"name", "exp"}}}}), Catch::Contains("exp"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"batch_size", 0}}), Catch::Contains("batch_size"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"steps", 0}}), Catch::Contains("steps must be >= 1, got 0"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"grad_accum", 0}}), Catch::Contains("grad_accum must be >= 1, got 0"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"on_nonfinite", "ignore"}}), Catch::Contains("ignore") && Catch::Contains("error, skip"));
  CHECK(TrainConfig::from_json(json{{"grad_accum", 4}, {"on_nonfinite", "skip"}}).to_json().at("grad_accum") == 4);
  // found by fuzz_train_json: a negative gamma made the step schedule's learning rate negative
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"schedule", {{"name", "step"}, {"step_size", 3}, {"gamma", -0.5}}}}),
                    Catch::Contains("gamma must be >= 0") && Catch::Contains("got -0.5"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"zero_stage", 2}}),
                    Catch::Contains("zero_stage must be 0 or 1") && Catch::Contains("got 2"));
  CHECK_THROWS_WITH(TrainConfig::from_json(json{{"bucket_mb", 0}}), Catch::Contains("bucket_mb must be > 0, got 0"));
  const json dp = TrainConfig::from_json(json{{"zero_stage", 1}, {"bucket_mb", 4.5}}).to_json();
  CHECK((dp.at("zero_stage") == 1 && dp.at("bucket_mb") == 4.5));
  CHECK_THROWS_WITH(ModelConfig::load("/nonexistent/model.json"), Catch::Contains("/nonexistent/model.json"));
}

TEST_CASE("config: a given optimizer object takes torch's defaults for missing keys, like the reference", "[config]") {
  const TrainConfig t = TrainConfig::from_json(json{{"optimizer", {{"name", "adamw"}, {"lr", 3e-4}}}});
  CHECK(t.optimizer.beta2 == 0.999);
  CHECK(t.optimizer.weight_decay == 0.0);
  const TrainConfig d = TrainConfig::from_json(json::object());
  CHECK(d.optimizer.beta2 == 0.95);
  CHECK(d.optimizer.weight_decay == 0.1);
  CHECK(TrainConfig::from_json(t.to_json()).to_json() == t.to_json());
}

TEST_CASE("schedule: equals the reference's lr_at for every schedule", "[config]") {
  if (std::system(fmt::format("{} -c 'import torch' 2>/dev/null", kiln::test::python()).c_str()) != 0)
    FAIL("torch missing for " << kiln::test::python() << ": run scripts/setup.sh --python, or set KILN_PYTHON");
  const std::vector<json> schedules{
      {{"name", "constant"}},
      {{"name", "cosine"}, {"warmup_steps", 5}, {"min_lr_ratio", 0.1}},
      {{"name", "cosine"}, {"warmup_steps", 0}, {"min_lr_ratio", 0.0}},
      {{"name", "linear"}, {"warmup_steps", 3}, {"min_lr_ratio", 0.25}},
      {{"name", "linear"}, {"warmup_steps", 40}},  // warmup longer than the run
  };
  const std::string code = fmt::format(R"(
import json, sys
sys.path.insert(0, "{}")
import kiln_ref
out = []
for s in json.loads('{}'):
    t = {{"optimizer": {{"lr": 0.003}}, "schedule": s, "steps": 30}}
    out.append([kiln_ref.lr_at(i, t) for i in range(30)])
print(json.dumps(out))
)",
                                       KILN_REFERENCE_DIR, json(schedules).dump());
  const json ref = json::parse(run_python(code));
  for (size_t k = 0; k < schedules.size(); ++k) {
    const TrainConfig t = TrainConfig::from_json(json{{"schedule", schedules[k]}, {"steps", 30}});
    for (int64_t i = 0; i < 30; ++i) {
      INFO(schedules[k].dump() << " step " << i);
      CHECK(t.schedule.at(0.003, i, 30) == Approx(ref[k][static_cast<size_t>(i)].get<double>()).epsilon(1e-14));
    }
  }
  LrSchedule st{.name = "step", .warmup_steps = 2, .step_size = 3, .gamma = 0.5};
  CHECK(st.at(1.0, 1, 10) == Approx(1.0));  // warmup (2/2)
  CHECK(st.at(1.0, 4, 10) == Approx(1.0));  // (4-2)/3 = 0
  CHECK(st.at(1.0, 5, 10) == Approx(0.5));  // (5-2)/3 = 1
  CHECK(st.at(1.0, 8, 10) == Approx(0.25));
}

TEST_CASE("token data: batches follow docs/specs.md §4 exactly", "[data]") {
  std::vector<int64_t> toks(50);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int64_t>(i);
  const TokenData d(toks);
  const auto [x, y] = d.batch<Cpu>(3, 2, 7);
  CHECK(x.shape() == Shape{2, 7});
  const auto xv = to_vector<int64_t>(x), yv = to_vector<int64_t>(y);
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t start = ((3 * 2 + r) * 7) % (50 - 7);
    for (int64_t t = 0; t < 7; ++t) {
      CHECK(xv[static_cast<size_t>(r * 7 + t)] == start + t);
      CHECK(yv[static_cast<size_t>(r * 7 + t)] == start + t + 1);
    }
  }
  CHECK_THROWS_WITH(d.batch<Cpu>(0, 1, 50), Catch::Contains("50 tokens") && Catch::Contains("seq_len=50"));
  CHECK_THROWS_WITH(d.check_vocab(40), Catch::Contains("token 40 at position 40"));
}

TEST_CASE("token data: shuffled windows, every one once per epoch, a pure function of the row", "[data]") {
  // 1000 tokens, rows of T = 7: W = (1000 - 7) / 7 = 141 windows per epoch.
  std::vector<int64_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int64_t>(i);
  TokenData d(toks);
  d.shuffle(5);
  const int64_t T = 7, W = 141;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> starts;
    std::set<int64_t> offsets;
    for (int64_t k = 0; k < W; ++k) {
      const int64_t s = d.row_start(epoch * W + k, T);
      CHECK(s >= 0);
      CHECK(s + T < 1000);  // the targets' last token exists
      starts.insert(s);
      offsets.insert(s % T);
    }
    CHECK(static_cast<int64_t>(starts.size()) == W);  // every window once
    CHECK(offsets.size() == 1);                       // one offset per epoch
  }
  // The order is shuffled (not the identity), depends on the seed and differs between epochs.
  std::vector<int64_t> e0, e1;
  for (int64_t k = 0; k < W; ++k) {
    e0.push_back(d.row_start(k, T) / T);
    e1.push_back(d.row_start(W + k, T) / T);
  }
  int64_t in_place = 0;
  for (int64_t k = 0; k < W; ++k) in_place += e0[static_cast<size_t>(k)] == k;
  CHECK(in_place < 10);
  CHECK(e0 != e1);
  TokenData other(toks);
  other.shuffle(6);
  CHECK(other.row_start(3, T) != d.row_start(3, T));
  // Batches read the shuffled starts; the same seed reads the same batches (resume).
  TokenData again(toks);
  again.shuffle(5);
  const auto [x, y] = d.batch<Cpu>(4, 3, T);
  CHECK(to_vector<int64_t>(x) == to_vector<int64_t>(again.batch<Cpu>(4, 3, T).first));
  const auto xv = to_vector<int64_t>(x), yv = to_vector<int64_t>(y);
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t start = d.row_start(4 * 3 + r, T);
    CHECK(xv[static_cast<size_t>(r * T)] == start);
    CHECK(yv[static_cast<size_t>(r * T + T - 1)] == start + T);
  }
  // train.json's key, kiln's own: off by default (the reference's order), round-tripped.
  CHECK_FALSE(TrainConfig{}.shuffle);
  const TrainConfig c = TrainConfig::from_json(json{{"shuffle", true}});
  CHECK(c.shuffle);
  CHECK(TrainConfig::from_json(c.to_json()).shuffle);
}

TEST_CASE("progress bar: plain lines off a terminal", "[progress]") {
  std::FILE* f = std::tmpfile();
  ProgressBar bar(10, f, 0, 5);
  for (int i = 0; i < 10; ++i) bar.update(i, 2.0 - 0.1 * i, 1e-3, 128);
  bar.finish();
  std::rewind(f);
  std::string s(4096, '\0');
  s.resize(std::fread(s.data(), 1, s.size(), f));
  CHECK(ProgressBar(4, f, 1)
            .line(1, 1.5, 1e-3, 2500, 65, "")
            .rfind("[############............] 2/4 loss 1.5000 lr 1.00e-03 2.5k tok/s ETA 01:05", 0) == 0);
  CHECK(ProgressBar(4, f, 0).line(1, 1.5, 1e-3, 2500, 65, "", 97.04) == "2/4 loss 1.5000 lr 1.00e-03 2.5k tok/s 97.0 GFLOP/s ETA 01:05");
  std::fclose(f);
  CHECK(s.find('\r') == std::string::npos);
  CHECK(s.find("1/10 loss 2.0000") != std::string::npos);
  CHECK(s.find("5/10 loss 1.6000") != std::string::npos);
  CHECK(s.find("10/10 loss 1.1000") != std::string::npos);
  CHECK(s.find("3/10") == std::string::npos);
}
