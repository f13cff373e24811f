// `kiln train --init-from MODEL_DIR` with LoRA, end to end: a tiny Llama (tests/lora/fixtures/llama_tok,
// with a byte-level BPE tokenizer) fine-tuned on a text file for a few steps; the loss goes down, the
// adapter is written in PEFT's layout at the end and with the checkpoint and loads back, and a run
// stopped and resumed gives the losses of one that never stopped.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/lora.hpp>
#include "common/run.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kModel = std::string(KILN_SOURCE_DIR) + "/tests/lora/fixtures/llama_tok";
const std::string kText = std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/corpus.txt";

kt::CommandResult run_kiln(const std::string& args) { return kt::run_command(fmt::format("{} {} 2>&1", KILN_CLI, args)); }

std::vector<double> losses(const fs::path& log) {
  std::ifstream f(log);
  std::vector<double> out;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(json::parse(line)["loss"].get<double>());
  return out;
}

}  // namespace

TEST_CASE("lora cli: kiln train --init-from MODEL_DIR --lora-r fine-tunes a text file, writes and resumes the adapter", "[lora]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-lora-cli-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() { fs::remove_all(p); }
  } cleanup{dir};
  const std::string d = dir.string();
  // 300 bytes (185 tokens) of the text fixture: the 30 steps go over it several times.
  std::ifstream corpus(kText);
  std::string text(300, '\0');
  corpus.read(text.data(), 300);
  std::ofstream(dir / "small.txt") << text;
  std::ofstream(dir / "train.json") << R"({"batch_size": 4, "seq_len": 16, "steps": 30, "checkpoint_every": 15, "grad_clip": 1.0,
            "optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.0},
            "lora": {"alpha": 8, "target_modules": ["q_proj", "v_proj", "*.mlp.*_proj"]}})";
  const std::string common =
      fmt::format("train --init-from {} --data {}/small.txt --train {}/train.json --lora-r 4 --progress off", kModel, d, d);
  auto r = run_kiln(fmt::format("{} --save {}/adapter --log {}/full.jsonl --checkpoint {}/full.ckpt", common, d, d, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("LoRA r 4"));
  const auto full = losses(dir / "full.jsonl");
  REQUIRE(full.size() == 30);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += full[i] / 5;
    last += full[25 + i] / 5;
  }
  INFO("mean loss of steps 0-4: " << first << ", of steps 25-29: " << last);
  CHECK(last < first - 0.3);  // it learns (7.0 -> 6.4 when written)
  // The adapter, in PEFT's layout, at the end and beside the checkpoint; it loads back.
  for (const char* sub : {"adapter", "full.ckpt.adapter"}) {
    INFO(sub);
    const json c = json::parse(std::ifstream(dir / sub / "adapter_config.json"));
    CHECK(c["r"] == 4);
    CHECK(c["lora_alpha"] == 8.0);
    auto model = hf::load_causal_lm<Cpu>(kModel);
    CHECK(nn::load_lora(*model, (dir / sub).string()).size() == 2 * 2 + 2 * 3);
  }
  // Stopped after 15 steps and resumed: the same losses as the run that never stopped.
  r = run_kiln(fmt::format("{} --log {}/a.jsonl --checkpoint {}/part.ckpt --stop-after 15", common, d, d));
  REQUIRE(r.status == 0);
  r = run_kiln(fmt::format("{} --log {}/b.jsonl --checkpoint {}/part.ckpt --resume {}/part.ckpt", common, d, d, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto resumed = losses(dir / "a.jsonl");
  const auto b = losses(dir / "b.jsonl");
  resumed.insert(resumed.end(), b.begin(), b.end());
  CHECK(resumed == full);
  // Activation checkpointing (docs/memory.md) recomputes each decoder layer in backward: the same losses.
  r = run_kiln(fmt::format("{} --log {}/ac.jsonl --checkpoint {}/ac.ckpt --activation-checkpointing --stop-after 10", common, d, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("activation checkpointing on"));
  CHECK(losses(dir / "ac.jsonl") == std::vector<double>(full.begin(), full.begin() + 10));
  // train.json's optimizer, scheduler object and EMA are what the fine-tune runs.
  // So is its held-out evaluation (--eval-data, a text file as --data).
  std::ofstream(dir / "lion.json") << R"({"batch_size": 4, "seq_len": 16, "steps": 4, "optimizer": {"type": "lion", "lr": 1e-3},
            "scheduler": {"type": "step", "step_size": 2, "gamma": 0.5}, "ema": {"decay": 0.9}, "eval_every": 2, "eval_batches": 1})";
  r =
      run_kiln(fmt::format("train --init-from {0} --data {1}/small.txt --eval-data {1}/small.txt --train {1}/lion.json --lora-r 4 "
                           "--progress off --checkpoint {1}/lion.ckpt --log {1}/lion.jsonl",
                           kModel, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::set<std::string> state;  // "optim.exp_avg." and the like: the optimizer's state kinds, and "ema."
  for (const auto& [key, v] : safetensors::load<Cpu>(d + "/lion.ckpt")) {
    const size_t dot = key.find('.');
    if (key.rfind("optim.", 0) == 0 && key.find('.', dot + 1) != std::string::npos)
      state.insert(key.substr(0, key.find('.', dot + 1) + 1));
    else if (key.rfind("ema.", 0) == 0)
      state.insert("ema.");
  }
  INFO(fmt::format("{}", fmt::join(state, " ")));
  CHECK(state == std::set<std::string>{"optim.exp_avg.", "ema."});  // Lion's one moment; Adam would add exp_avg_sq
  std::vector<double> lr;
  int evals = 0;
  std::ifstream lion_log(dir / "lion.jsonl");
  for (std::string line; std::getline(lion_log, line);) {
    if (line.empty()) continue;
    const json rec = json::parse(line);
    if (rec["step"].get<int64_t>() < 0) continue;  // the evaluation before training (kiln::fit's eval_at_start)
    lr.push_back(rec["lr"].get<double>());
    evals += rec.contains("eval_loss") && rec["eval_loss"].get<double>() > 0;
  }
  CHECK(lr == std::vector<double>{1e-3, 1e-3, 5e-4, 5e-4});
  CHECK(evals == 2);  // after steps 1 and 3
  // LoRA flags without a model directory are an error naming what is needed.
  r = run_kiln(fmt::format("train --data {} --lora-r 4", kText));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("--lora-* needs --init-from"));
}

TEST_CASE("lora cli: kiln train --init-from kiln weights --lora-r adapts a GPT and writes its adapter", "[lora]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-lora-cli-gpt-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() { fs::remove_all(p); }
  } cleanup{dir};
  const std::string d = dir.string();
  std::ofstream(dir / "model.json") << R"({"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 32})";
  std::ofstream(dir / "train.json") << R"({"batch_size": 4, "seq_len": 16, "steps": 20, "checkpoint_every": 10})";
  auto r = run_kiln(fmt::format("tokenize --text {} --out {}/tokens.safetensors", kText, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::string base =
      fmt::format("train --model {0}/model.json --train {0}/train.json --data {0}/tokens.safetensors --progress off", d);
  r = run_kiln(fmt::format("{0} --save {1}/base.safetensors --checkpoint {1}/base.ckpt", base, d));
  REQUIRE(r.status == 0);
  r =
      run_kiln(fmt::format("{0} --init-from {1}/base.safetensors --lora-r 4 --lora-target q_proj,v_proj,out_proj --save {1}/adapter "
                           "--checkpoint {1}/ck.safetensors --log {1}/log.jsonl",
                           base, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(losses(dir / "log.jsonl").size() == 20);
  for (const char* sub : {"adapter", "ck.safetensors.adapter"}) {
    INFO(sub);
    const json c = json::parse(std::ifstream(dir / sub / "adapter_config.json"));
    CHECK(c["target_modules"] == json({"q_proj", "v_proj", "out_proj"}));
    const auto t = safetensors::load<Cpu>((dir / sub / "adapter_model.safetensors").string());
    CHECK(t.size() == 2 * 3 * 2);
    CHECK(t.count("base_model.model.layers.1.attn.out_proj.lora_B.weight") == 1);
  }
  // Without weights to adapt, LoRA is refused rather than ignored.
  r = run_kiln(fmt::format("{} --lora-r 4", base));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("--lora-* needs --init-from"));
}
