// `kiln tokenize --tokenizer`: the ids of the whole standard input as one comma-separated line (the
// Python libraries' ids), token files that record their tokenizer, and `kiln train` / `kiln sample` on them;
// `kiln train --tokenizer` on a text file.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/text/tokenizer.hpp>

#include "common/run.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/";

kt::CommandResult run_kiln(const std::string& args) { return kt::run_command(fmt::format("{} {} 2>&1", KILN_CLI, args)); }

std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("text cli: kiln tokenize --tokenizer DIR --print-ids < file prints the library's ids", "[text]") {
  for (const char* name : {"gpt2", "llama3", "qwen2", "sp_llama2_json", "sp_metaspace_json", "sp_bpe", "sp_unigram", "bert_uncased",
                           "unigram_t5", "unigram_bytes"}) {
    INFO(name);
    const auto r = run_kiln(fmt::format("tokenize --tokenizer {}{} --print-ids < {}corpus.txt", kFixtures, name, kFixtures));
    REQUIRE(r.status == 0);
    const auto ex = json::parse(slurp(kFixtures + name + "/expected.json"))["whole"].get<std::vector<int>>();
    CHECK(last_line(r.out) == fmt::format("{}", fmt::join(ex, ",")));
  }
  // a bad tokenizer: one line naming the problem
  const auto r = run_kiln(fmt::format("tokenize --tokenizer {}nowhere --print-ids < {}corpus.txt", kFixtures, kFixtures));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("nowhere") && Catch::Contains("does not exist"));
}

TEST_CASE("text cli: a token file made with a tokenizer trains, and sampling decodes with it", "[text]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-text-cli-{}", ::getpid());
  fs::create_directories(dir);
  const std::string tokens = (dir / "tokens.safetensors").string();
  auto r = run_kiln(fmt::format("tokenize --tokenizer {}qwen2 --text {}corpus.txt --out {}", kFixtures, kFixtures, tokens));
  REQUIRE(r.status == 0);
  const auto f = kiln::safetensors::File::open(tokens);
  CHECK(f.metadata().at("tokenizer") == "pretrained");
  CHECK(f.metadata().at("vocab_size") == "803");
  CHECK(kiln::text::Tokenizer::load(f.metadata().at("tokenizer_path")).vocab_size() == 803);
  const auto ex = json::parse(slurp(kFixtures + "qwen2/expected.json"))["whole"].get<std::vector<int32_t>>();
  CHECK(f.load<kiln::Cpu>("tokens").to_vector<int32_t>() == ex);

  // a model too small for the tokenizer's ids: kiln train says so
  std::ofstream(dir / "small.json") << R"({"vocab_size": 256, "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32})";
  std::ofstream(dir / "model.json") << R"({"vocab_size": 803, "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32})";
  std::ofstream(dir / "train.json") << R"({"batch_size": 2, "seq_len": 16, "steps": 3})";
  r = run_kiln(
      fmt::format("train --model {} --train {} --data {} --quiet", (dir / "small.json").string(), (dir / "train.json").string(), tokens));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("vocab"));
  const std::string ck = (dir / "ck.safetensors").string();
  r = run_kiln(fmt::format("train --model {} --train {} --data {} --checkpoint {} --quiet", (dir / "model.json").string(),
                           (dir / "train.json").string(), tokens, ck));
  REQUIRE(r.status == 0);
  // kiln sample finds the tokenizer through the token file the checkpoint names: the prompt is encoded
  // with it, the output decoded with it
  r = run_kiln(fmt::format("sample --checkpoint {} --prompt 我们在 --tokens 8 --temperature 0", ck));
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("我们在", 0) == 0);
  fs::remove_all(dir);
}

// kiln train --tokenizer: the text file is encoded with the tokenizer in the run (the same ids as kiln
// tokenize: the losses of both runs agree), the model's vocabulary is checked against the tokenizer's,
// and the checkpoint names the tokenizer for kiln sample.
TEST_CASE("text cli: kiln train --tokenizer trains on a text file", "[text]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-text-train-{}", ::getpid());
  fs::create_directories(dir);
  const std::string corpus = kFixtures + "corpus.txt", tok = kFixtures + "unigram_t5";
  std::ofstream(dir / "small.json") << R"({"vocab_size": 256, "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32})";
  std::ofstream(dir / "model.json") << R"({"vocab_size": 484, "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32})";
  std::ofstream(dir / "train.json") << R"({"batch_size": 2, "seq_len": 16, "steps": 3})";
  const std::string model = (dir / "model.json").string(), train = (dir / "train.json").string();
  // a text file without a tokenizer, and a model too small for the tokenizer
  auto r = run_kiln(fmt::format("train --model {} --train {} --data {} --quiet", model, train, corpus));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("corpus.txt") && Catch::Contains("--tokenizer"));
  r = run_kiln(
      fmt::format("train --model {} --train {} --data {} --tokenizer {} --quiet", (dir / "small.json").string(), train, corpus, tok));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("unigram_t5") && Catch::Contains("256") && Catch::Contains("484"));
  // the same run from kiln tokenize's token file and from the text: the same losses
  const std::string tokens = (dir / "tokens.safetensors").string(), ck = (dir / "ck.safetensors").string();
  REQUIRE(run_kiln(fmt::format("tokenize --tokenizer {} --text {} --out {}", tok, corpus, tokens)).status == 0);
  const std::string log_a = (dir / "a.jsonl").string(), log_b = (dir / "b.jsonl").string();
  r = run_kiln(fmt::format("train --model {} --train {} --data {} --log {} --quiet", model, train, tokens, log_a));
  REQUIRE(r.status == 0);
  r = run_kiln(fmt::format("train --model {} --train {} --data {} --eval-data {} --tokenizer {} --log {} --checkpoint {} --quiet", model,
                           train, corpus, corpus, tok, log_b, ck));
  INFO(r.out);
  REQUIRE(r.status == 0);
  auto losses = [&](const std::string& log) {
    std::vector<double> v;
    std::istringstream in(slurp(log));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("loss") && j.contains("step")) v.push_back(j["loss"].get<double>());
    }
    return v;
  };
  const auto la = losses(log_a);
  CHECK(la.size() == 3);
  CHECK(la == losses(log_b));
  CHECK(kiln::safetensors::File::open(ck).metadata().at("tokenizer_path") == fs::canonical(tok + "/tokenizer.json").string());
  r = run_kiln(fmt::format("sample --checkpoint {} --prompt hello --tokens 4 --temperature 0", ck));
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind("hello", 0) == 0);
  // fine-tuning a model directory: --tokenizer replaces the directory's, and must fit its 802 rows
  const std::string llama = std::string(KILN_SOURCE_DIR) + "/tests/lora/fixtures/llama_tok";
  r = run_kiln(fmt::format("train --init-from {} --train {} --data {} --tokenizer {}qwen2 --quiet", llama, train, corpus, kFixtures));
  CHECK(r.status != 0);
  CHECK_THAT(r.out, Catch::Contains("qwen2") && Catch::Contains("802 entries"));
  fs::remove_all(dir);
}
