// `kiln train --init-from MODEL_DIR` with LoRA, end to end: a tiny Llama (tests/lora/fixtures/llama_tok,
// with a byte-level BPE tokenizer) fine-tuned on a text file for a few steps; the loss goes down, the
// adapter is written in PEFT's layout at the end and with the checkpoint and loads back, and a run
// stopped and resumed gives the losses of one that never stopped.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
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
#include <kiln/nn/generate.hpp>
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

// A fresh directory under the temporary one (the tag and the process id), removed when the case ends.
struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& tag) : path(fs::temp_directory_path() / fmt::format("{}-{}", tag, ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("lora cli: kiln train --init-from MODEL_DIR --lora-r fine-tunes a text file, writes and resumes the adapter", "[lora]") {
  const Scratch scratch("kiln-lora-cli");
  const fs::path& dir = scratch.path;
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
  // A 10-step fine-tune with train.json's options plus `extra` (as `name`.json): its output; its losses
  // go to `name`.jsonl.
  const auto run10 = [&](const std::string& name, const std::string& extra) {
    std::ofstream(dir / (name + ".json")) << R"({"batch_size": 4, "seq_len": 16, "steps": 10, "grad_clip": 1.0, )" << extra << R"(,
            "optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.0},
            "lora": {"alpha": 8, "target_modules": ["q_proj", "v_proj", "*.mlp.*_proj"]}})";
    auto out = run_kiln(fmt::format(
        "train --init-from {0} --data {1}/small.txt --train {1}/{2}.json --lora-r 4 --progress off --log {1}/{2}.jsonl", kModel, d, name));
    INFO(out.out);
    REQUIRE(out.status == 0);
    return out;
  };
  // The LM head and its loss fused (train.json "loss_chunk_rows", nn::linear_cross_entropy): the banner
  // says so, and the losses are the unfused run's up to the order of sums.
  r = run10("fused", R"("loss_chunk_rows": 8)");
  CHECK_THAT(r.out, Catch::Contains("LM head and cross-entropy fused, 8 of the step's 64 token rows per chunk"));
  const auto fused = losses(dir / "fused.jsonl");
  REQUIRE(fused.size() == 10);
  for (size_t i = 0; i < fused.size(); ++i) {
    INFO("step " << i);
    CHECK(fused[i] == Approx(full[i]).epsilon(1e-4));
  }
  // bf16 autocast over f32 master weights (train.json "precision"): the losses of f32 within bf16's rounding.
  r = run10("bf16", R"("precision": "bf16")");
  CHECK_THAT(r.out, Catch::Contains("precision bf16 (autocast)"));
  const auto bf16 = losses(dir / "bf16.jsonl");
  REQUIRE(bf16.size() == 10);
  bool same = true;
  for (size_t i = 0; i < bf16.size(); ++i) {
    INFO("step " << i << ": f32 " << full[i] << ", bf16 " << bf16[i]);
    CHECK(std::abs(bf16[i] - full[i]) < 0.05 * std::abs(full[i]));
    same = same && bf16[i] == full[i];
  }
  CHECK_FALSE(same);                                    // the matmuls did run in bf16
  CHECK(std::abs(bf16[0] - full[0]) < 1e-3 * full[0]);  // one forward apart (7.2041 and 7.2043 when written); then the steps diverge
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
  const Scratch scratch("kiln-lora-cli-gpt");
  const fs::path& dir = scratch.path;
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

// kiln generate --adapter and kiln export --adapter on a Hugging Face GPT-2 directory: the adapter merged
// gives the greedy ids and the logits of the model with the adapter applied unmerged (nn::load_lora, which
// the cases of test_lora check against PEFT). kiln train's LoRA without --lora-target takes PEFT's default
// for GPT-2 (c_attn).
TEST_CASE("lora cli: generate and export --adapter merge an adapter, train takes PEFT defaults and saves a full fine-tune as a model dir",
          "[lora]") {
  const std::string gpt2 = std::string(KILN_SOURCE_DIR) + "/tests/lora/fixtures/gpt2";
  const Scratch scratch("kiln-lora-cli-merge");
  const fs::path& dir = scratch.path;
  const std::string d = dir.string();
  {  // an adapter with an effect: kiln's default targets (c_attn), B random
    auto m = hf::load_causal_lm<Cpu>(gpt2);
    nn::apply_lora(*m, {.r = 4, .alpha = 8});
    for (auto& [path, ad] : nn::lora_adapters(*m)) {
      if (ad->owner() != nullptr) continue;  // k and v share q's tensors
      Tensor<Cpu> bw = ad->lora_B().weight().value();
      bw.copy_(Tensor<Cpu>::randn(bw.shape()).mul(0.5));
    }
    nn::save_lora(*m, d + "/adapter");
  }
  const std::vector<int64_t> prompt{3, 14, 15, 9};
  const nn::GenerateOptions go{.max_new_tokens = 12};
  auto adapted = hf::load_causal_lm<Cpu>(gpt2);
  REQUIRE(nn::load_lora(*adapted, d + "/adapter").size() == 6);
  const std::vector<int64_t> want = nn::generate(*adapted, {prompt}, go).ids[0];
  auto base = hf::load_causal_lm<Cpu>(gpt2);
  REQUIRE(nn::generate(*base, {prompt}, go).ids[0] != want);  // the adapter changes the greedy ids

  auto r = run_kiln(
      fmt::format("generate {} --adapter {}/adapter --prompt-ids 3,14,15,9 --max-new-tokens 12 --ignore-eos --print-ids", gpt2, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("LoRA adapter " + d + "/adapter merged (6 Linears)"));
  std::string last = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
  last = last.substr(last.find_last_of('\n') + 1);
  CHECK(last == fmt::format("{}", fmt::join(want, ",")));

  r = run_kiln(fmt::format("export {} --adapter {}/adapter --out {}/merged", gpt2, d, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto merged = hf::load_causal_lm<Cpu>(d + "/merged");  // base tensor names only: an adapter tensor left would be refused
  const Tensor<Cpu> ids = Tensor<Cpu>::from_vector(std::vector<int64_t>{3, 14, 15, 9, 26, 5, 35, 8}, {1, 8});
  const Tensor<Cpu> lm = merged->forward(ids).value(), la = adapted->forward(ids).value(), lb = base->forward(ids).value();
  CHECK(lm.sub(la).abs().max().item<float>() < 1e-5);
  CHECK(lm.sub(lb).abs().max().item<float>() > 1e-2);
  r = run_kiln(fmt::format("generate {} --adapter {}/none --prompt-ids 3", gpt2, d));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains(d + "/none"));

  // kiln train --lora-r without --lora-target: c_attn on GPT-2, as PEFT's LoraConfig without target_modules.
  std::vector<int64_t> tokens(400);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7 + i / 5) % 64);
  safetensors::save<Cpu>(d + "/tokens.safetensors", {{"tokens", Tensor<Cpu>::from_vector(tokens, {400})}});
  std::ofstream(dir / "train.json") << R"({"batch_size": 2, "seq_len": 8, "steps": 2})";
  r =
      run_kiln(fmt::format("train --init-from {0} --data {1}/tokens.safetensors --train {1}/train.json --lora-r 2 --save {1}/trained "
                           "--progress off",
                           gpt2, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("LoRA r 2 on c_attn"));
  CHECK(json::parse(std::ifstream(dir / "trained" / "adapter_config.json"))["target_modules"] == json({"c_attn"}));
  auto back = hf::load_causal_lm<Cpu>(gpt2);
  CHECK(nn::load_lora(*back, d + "/trained").size() == 6);

  // A full fine-tune hands the model back too: --save DIR writes a Hugging Face directory holding the
  // weights that --save FILE.safetensors writes under kiln's names.
  std::ofstream(dir / "full.json") << R"({"batch_size": 2, "seq_len": 8, "steps": 2, "optimizer": {"name": "adamw", "lr": 0.01}})";
  const std::string full = fmt::format("train --init-from {0} --data {1}/tokens.safetensors --train {1}/full.json --progress off", gpt2, d);
  r = run_kiln(fmt::format("{} --save {}/full_hf", full, d));
  INFO(r.out);
  REQUIRE(r.status == 0);
  r = run_kiln(fmt::format("{} --save {}/full.safetensors", full, d));
  REQUIRE(r.status == 0);
  auto from_dir = hf::load_causal_lm<Cpu>(d + "/full_hf");
  auto from_file = hf::load_causal_lm<Cpu>(gpt2);
  from_file->load(d + "/full.safetensors");
  const Tensor<Cpu> lf = from_dir->forward(ids).value();
  CHECK(lf.sub(from_file->forward(ids).value()).abs().max().item<float>() == 0);
  CHECK(lf.sub(lb).abs().max().item<float>() > 1e-2);  // it trained
  // Saved again into its own directory: replaced. A directory holding anything else: refused before training.
  r = run_kiln(fmt::format("{} --save {}/full_hf", full, d));
  CHECK(r.status == 0);
  fs::create_directories(dir / "occupied");
  std::ofstream(dir / "occupied" / "notes.txt") << "mine";
  r = run_kiln(fmt::format("{} --save {}/occupied --log {}/occupied.jsonl", full, d, d));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains(d + "/occupied is neither absent"));
  CHECK(!fs::exists(dir / "occupied.jsonl"));
  CHECK(fs::exists(dir / "occupied" / "notes.txt"));
}
