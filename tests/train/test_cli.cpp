// The `kiln` command line: help, bad flags, bad files and bad configs give one clear line naming the problem.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/run.hpp"

namespace {

using Result = kt::CommandResult;

Result kiln(const std::string& args) { return kt::run_command(fmt::format("{} {} 2>&1", KILN_CLI, args)); }

std::string temp(const std::string& name, const std::string& content) {
  const auto p = std::filesystem::temp_directory_path() / fmt::format("kiln-cli-{}-{}", ::getpid(), name);
  std::ofstream(p) << content;
  return p.string();
}

// A tiny character corpus (kiln tokenize) and model.json for quick `kiln train` runs: {tokens, model}.
std::pair<std::string, std::string> tiny_run(const std::string& name) {
  const std::string text = temp(name + ".txt", std::string(400, 'a') + "the quick brown fox jumps over the lazy dog\n");
  const std::string tok = temp(name + ".safetensors", "");
  REQUIRE(kiln(fmt::format("tokenize --text {} --chars --out {}", text, tok)).status == 0);
  return {tok, temp(name + "_model.json", R"({"vocab_size": 32, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16})")};
}

}  // namespace

TEST_CASE("cli: help for every command, unknown commands and flags list the valid ones", "[cli]") {
  // Every command `kiln --help` lists (a line "  NAME   description" after "commands:") answers --help.
  const std::string usage = kiln("--help").out;
  const size_t list = usage.find("commands:\n");
  REQUIRE(list != std::string::npos);
  std::istringstream lines(usage.substr(list + 10));
  std::vector<std::string> commands;
  for (std::string line; std::getline(lines, line);)
    if (line.size() > 2 && line.rfind("  ", 0) == 0 && line[2] != ' ') commands.push_back(line.substr(2, line.find(' ', 2) - 2));
  CHECK(commands.size() >= 8);
  for (const std::string& c : commands) {
    INFO("kiln " << c << " --help");
    const Result r = kiln(fmt::format("{} --help", c));
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("flags:"));
  }
  const Result u = kiln("trian");
  CHECK(u.status != 0);
  CHECK_THAT(u.out, Catch::Contains("unknown command 'trian'") && Catch::Contains("train"));
  const Result f = kiln("train --data x --lr 3");
  CHECK(f.status == 1);
  CHECK_THAT(f.out, Catch::Contains("unknown flag '--lr'") && Catch::Contains("--model") && Catch::Contains("--resume"));
  CHECK_THAT(kiln("train").out, Catch::Contains("--data is required"));
  CHECK_THAT(kiln("sample --checkpoint x --tokens many").out, Catch::Contains("--tokens must be an integer"));
}

TEST_CASE("cli: missing and malformed files name the file and the problem", "[cli]") {
  CHECK_THAT(kiln("train --data /nonexistent/tokens.safetensors").out,
             Catch::Contains("/nonexistent/tokens.safetensors") && Catch::Contains("cannot open"));
  const std::string bad_json = temp("bad.json", "{\"d_model\": 64,");
  CHECK_THAT(kiln(fmt::format("train --model {} --data x", bad_json)).out, Catch::Contains(bad_json) && Catch::Contains("not valid JSON"));
  const std::string unknown = temp("unknown.json", "{\"d_modle\": 64}");
  CHECK_THAT(kiln(fmt::format("train --model {} --data x", unknown)).out,
             Catch::Contains("unknown key 'd_modle'") && Catch::Contains("valid keys"));
  const std::string diff = temp("diff.json", "{\"attention\": \"diff\", \"d_model\": 36, \"n_heads\": 4}");
  CHECK_THAT(kiln(fmt::format("train --model {} --data x", diff)).out, Catch::Contains("divisible by 2·n_heads (8)"));
  const std::string garbage = temp("garbage.safetensors", "this is not a safetensors file at all");
  CHECK_THAT(kiln(fmt::format("inspect --file {}", garbage)).out, Catch::Contains(garbage));
}

TEST_CASE("cli: a malformed kiln environment variable is an error naming it and its value", "[cli]") {
  const std::string text = temp("env.txt", std::string(200, 'a') + "the quick brown fox jumps over the lazy dog\n");
  const std::string tok = temp("env.safetensors", "");
  REQUIRE(kiln(fmt::format("tokenize --text {} --chars --out {}", text, tok)).status == 0);
  const std::string model = temp("env_model.json", R"({"vocab_size": 32, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16})");
  const std::string train = temp("env_train.json", R"({"batch_size": 2, "seq_len": 8, "steps": 1})");
  const auto train_with = [&](const std::string& env) {
    return kt::run_command(fmt::format("env {} {} train --model {} --train {} --data {} --quiet 2>&1", env, KILN_CLI, model, train, tok));
  };
  for (const auto& [env, says] : std::vector<std::pair<std::string, std::string>>{
           {"KILN_NUM_THREADS=two", "KILN_NUM_THREADS='two': expected a whole number of threads from 1 to 4095"},
           {"KILN_NUM_THREADS=0", "KILN_NUM_THREADS='0'"},
           {"KILN_NUM_THREADS=2x", "KILN_NUM_THREADS='2x'"},
           {"KILN_HOST_CACHE_MB=lots", "KILN_HOST_CACHE_MB='lots': expected a whole number of MiB >= 0"},
           {"KILN_HOST_CACHE_MB=-5", "KILN_HOST_CACHE_MB='-5'"},
           {"KILN_HOST_CACHE_MB=99999999999999999999", "KILN_HOST_CACHE_MB='99999999999999999999'"},  // past long long
           {"KILN_HOST_POISON=yes", "KILN_HOST_POISON='yes': use 0 or 1"},
           {"KILN_CPU_MATMUL=mkl", "KILN_CPU_MATMUL: unknown matmul library 'mkl' (valid: auto, blas, onednn)"},
       }) {
    INFO(env);
    const Result r = train_with(env);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("kiln train: error: " + says));
  }
  // OpenMP's own variable keeps OpenMP's forms: a list's first entry counts
  CHECK(train_with("OMP_NUM_THREADS=1,1 KILN_NUM_THREADS=").status == 0);
  CHECK(train_with("KILN_NUM_THREADS=1 KILN_HOST_CACHE_MB=0 KILN_CPU_MATMUL=blas KILN_HOST_POISON=0").status == 0);
}

TEST_CASE("cli: a character-level corpus with non-ASCII UTF-8 trains and samples", "[cli]") {
  // The alphabet then holds bytes >= 0x80: it travels as hex (alphabet_hex), not as a JSON string.
  const std::string text = temp("utf8.txt", std::string(40, ' ') + "héllo wörld — naïve café\nthe quick brown fox\n");
  const std::string tok = temp("utf8.safetensors", "");
  Result r = kiln(fmt::format("tokenize --text {} --chars --out {}", text, tok));
  REQUIRE(r.status == 0);
  r = kiln(fmt::format("inspect --file {}", tok));
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("alphabet_hex"));
  const std::string model = temp("utf8_model.json", R"({"vocab_size": 64, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16})");
  const std::string train = temp("utf8_train.json", R"({"batch_size": 2, "seq_len": 8, "steps": 2})");
  const std::string ck = temp("utf8_ck.safetensors", "");
  r = kiln(fmt::format("train --model {} --train {} --data {} --checkpoint {} --quiet", model, train, tok, ck));
  REQUIRE(r.status == 0);
  // the model's vocabulary (64) is larger than the alphabet: sampling stays inside the alphabet
  r = kiln(fmt::format("sample --checkpoint {} --prompt 'caf' --tokens 40 --temperature 2 --top-k 0", ck));
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::StartsWith("caf"));
}

TEST_CASE("cli: --progress on into a file or pipe prints plain lines, not a bar redrawn with carriage returns", "[cli]") {
  const auto [tok, model] = tiny_run("progress");
  const std::string train = temp("progress_train.json", R"({"batch_size": 2, "seq_len": 8, "steps": 40})");
  for (const char* mode : {"on", "auto"}) {
    INFO("--progress " << mode);
    const Result r = kiln(fmt::format("train --model {} --train {} --data {} --progress {}", model, train, tok, mode));
    REQUIRE(r.status == 0);
    CHECK(r.out.find('\r') == std::string::npos);
    CHECK(r.out.find("\x1b[K") == std::string::npos);
    CHECK_THAT(r.out, Catch::Contains("\n1/40 loss") && Catch::Contains("\n2/40 loss") && Catch::Contains("\n40/40 loss"));
    CHECK_THAT(r.out, !Catch::Contains("\n3/40 loss"));  // every 5% of the steps: 2, 4, ..., not each step
  }
  const Result off = kiln(fmt::format("train --model {} --train {} --data {} --progress off", model, train, tok));
  CHECK(off.status == 0);
  CHECK_THAT(off.out, !Catch::Contains("/40 loss"));
}

TEST_CASE("cli: --time-limit (train.json time_limit_s) plans the steps that fit and ends there, and refuses bad values", "[cli]") {
  const auto [tok, model] = tiny_run("limit");
  // A million steps, a limit in train.json that the flag replaces.
  const std::string train =
      temp("limit_train.json", R"({"batch_size": 2, "seq_len": 8, "steps": 1000000, "time_limit_s": 1000, "eval_every": 5000,
      "schedule": {"name": "cosine", "warmup_steps": 10}})");
  const std::string log = temp("limit_log.jsonl", "");
  const Result r = kiln(fmt::format("train --model {} --train {} --data {} --eval-data {} --log {} --time-limit 1.5 --progress on", model,
                                    train, tok, tok, log));
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("kiln train: time limit 1.5 s: after 23 steps the run plans the steps that fit"));
  CHECK_THAT(r.out, Catch::Contains("time limit 1.5 s: at ") && Catch::Contains("of the 1000000 steps fit; the schedule now ends there"));
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() > 23);
  REQUIRE(lines.size() < 1000000);
  CHECK_THAT(lines[23], Catch::Contains("\"planned_steps\":"));  // the first step under the plan
  CHECK_THAT(lines.back(), Catch::Contains("\"eval_loss\":"));   // the last step evaluates
  // The run ended at its last plan's total, or the limit stopped it before (and said so).
  std::string planned;
  for (const std::string& line : lines)
    if (const auto at = line.find("\"planned_steps\":"); at != std::string::npos)
      planned = line.substr(at + 16, line.find_first_of(",}", at) - at - 16);
  const bool planned_end = planned == std::to_string(lines.size());
  const bool stopped = r.out.find("reached after step " + std::to_string(lines.size()) + " of") != std::string::npos;
  CHECK((planned_end || stopped));
  // Bad values: the flag's and train.json's, named.
  Result bad = kiln(fmt::format("train --model {} --data {} --time-limit -3", model, tok));
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("time_limit_s must be >= 0 seconds (0 = none), got -3"));
  bad = kiln(fmt::format("train --model {} --data {} --time-limit soon", model, tok));
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("--time-limit") && Catch::Contains("soon"));
  const std::string bad_train = temp("limit_bad.json", R"({"time_limit_s": "soon"})");
  bad = kiln(fmt::format("train --model {} --train {} --data {}", model, bad_train, tok));
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("time_limit_s"));
}
