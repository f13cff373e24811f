// `kiln eval` on a Hugging Face model directory, alone and with a PEFT LoRA adapter (--adapter), against
// the losses transformers and peft compute (fixtures/eval_hf.json, make_eval_fixture.py), and its errors.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>

#include "common/run.hpp"

namespace {

kt::CommandResult run_kiln(const std::string& args) { return kt::run_command(fmt::format("{} {} 2>&1", KILN_CLI, args)); }

}  // namespace

TEST_CASE("cli: kiln eval on a Hugging Face model directory, and with a PEFT LoRA adapter, gives transformers' and peft's loss", "[cli]") {
  // fixtures/eval_hf.json (make_eval_fixture.py): the losses transformers and peft compute on its tokens
  // with tests/lora/fixtures' tiny random models and adapters, batched as kiln eval batches.
  namespace fs = std::filesystem;
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/train/fixtures/eval_hf.json");
  REQUIRE(f.good());
  const nlohmann::json e = nlohmann::json::parse(f);
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-cli-eval-{}", ::getpid());
  fs::create_directories(dir);
  const auto tokens = e["tokens"].get<std::vector<int64_t>>();
  const std::string data = (dir / "tokens.safetensors").string();
  kiln::safetensors::save<kiln::Cpu>(data,
                                     {{"tokens", kiln::Tensor<kiln::Cpu>::from_vector(tokens, {static_cast<int64_t>(tokens.size())})}});
  const std::string lora = std::string(KILN_SOURCE_DIR) + "/tests/lora/fixtures/";
  const std::string sizes = fmt::format("--batches {} --batch-size {} --seq-len {}", e["batches"].get<int>(), e["batch_size"].get<int>(),
                                        e["seq_len"].get<int>());
  for (const char* base : {"llama", "gpt2"}) {
    const auto& c = e["cases"][base];
    for (const bool adapter : {false, true}) {
      INFO(base << (adapter ? " + " + c["adapter"].get<std::string>() : std::string()));
      const kt::CommandResult r = run_kiln(fmt::format("eval --checkpoint {}{} --data {} {}{}", lora, base, data, sizes,
                                                       adapter ? " --adapter " + lora + c["adapter"].get<std::string>() : std::string()));
      INFO(r.out);
      REQUIRE(r.status == 0);
      const auto got = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
      const double want = c[adapter ? "loss_adapter" : "loss"].get<double>();
      CHECK(std::abs(got["loss"].get<double>() - want) < 1e-5);
      CHECK(got["perplexity"].get<double>() == Approx(std::exp(want)).epsilon(1e-5));
    }
  }
  // errors name the problem: --model with a model directory, a missing adapter, too long rows for GPT-2's positions
  CHECK_THAT(run_kiln(fmt::format("eval --checkpoint {}llama --model m.json --data {}", lora, data)).out,
             Catch::Contains("--model is for a plain kiln weights file"));
  const kt::CommandResult missing =
      run_kiln(fmt::format("eval --checkpoint {}llama --data {} --adapter {}/none", lora, data, dir.string()));
  CHECK(missing.status != 0);
  CHECK_THAT(missing.out, Catch::Contains((dir / "none").string()));
  CHECK_THAT(run_kiln(fmt::format("eval --checkpoint {}gpt2 --data {} --seq-len 250 --batches 1", lora, data)).out,
             Catch::Contains("--seq-len 250 exceeds the"));
  fs::remove_all(dir);
}
