// What the fuzzers (fuzz/, docs/fuzzing.md) found in the readers, kept as ordinary tests: each input
// once crashed a reader or was undefined behaviour, and must now be a kiln::Error naming the problem
// (or, where the input is valid, read correctly).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/idx.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/config.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/config.hpp>
#include <kiln/train/data.hpp>

using namespace kiln;
using Catch::Contains;

namespace {

std::string file(const std::string& name, const std::string& bytes) {
  const auto p = std::filesystem::temp_directory_path() / fmt::format("kiln-readers-{}-{}", ::getpid(), name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

}  // namespace

TEST_CASE("readers: a JSON number beyond a double is invalid JSON, not an escaping nlohmann exception", "[errors][fuzz]") {
  CHECK_THROWS_WITH(ModelConfig::load(file("big.json", "{\"d_model\": 1e30864}")), Contains("big.json") && Contains("not valid JSON"));
  CHECK_THROWS_WITH(TrainConfig::load(file("big2.json", "{\"steps\": 4444444441e3084}")), Contains("not valid JSON"));
}

TEST_CASE("readers: integer keys take only integers that fit, never converting out of range", "[errors][fuzz]") {
  // 9.2e20 as an int64 was undefined behaviour (found by fuzz_checkpoint through train_config)
  CHECK_THROWS_WITH(TrainConfig::from_json(nlohmann::json::parse("{\"steps\": 9.22337e+20}")),
                    Contains("'steps' must be an integer in") && Contains("9.22337e+20"));
  CHECK_THROWS_WITH(TrainConfig::from_json(nlohmann::json::parse("{\"steps\": 18446744073709551615}")),
                    Contains("'steps' = 18446744073709551615 is too large"));
  CHECK_THROWS_WITH(ModelConfig::from_json(nlohmann::json::parse("{\"n_layers\": 2.5}")), Contains("'n_layers' must be an integer"));
  CHECK_THROWS_WITH(ModelConfig::from_json(nlohmann::json::parse("{\"n_layers\": -9223372036854775808.0}")).resolved(), Contains("n_layers"));
  CHECK(TrainConfig::from_json(nlohmann::json::parse("{\"steps\": 30.0}")).steps == 30);  // an integral float is an integer
  CHECK(TrainConfig::from_json(nlohmann::json::parse("{\"steps\": 9223372036854775807}")).steps == INT64_MAX);
  CHECK_THROWS_WITH(TrainConfig::from_json(nlohmann::json::parse("{\"steps\": 9223372036854775808.0}")), Contains("must be an integer in"));
}

TEST_CASE("readers: an IDX file without data reads as empty", "[errors][fuzz]") {
  // [0] ubyte: memcpy from a null pointer was undefined behaviour (found by fuzz_idx)
  const IdxArray a = read_idx(file("empty.idx", std::string("\0\0\x08\x01\0\0\0\0", 8)));
  CHECK(a.dims == std::vector<int64_t>{0});
  CHECK(a.bytes.empty());
}

TEST_CASE("readers: checkpoint metadata must be whole non-negative integers and valid JSON", "[errors][fuzz]") {
  auto ck = [](const std::string& name, std::map<std::string, std::string> meta) {
    const std::string p = (std::filesystem::temp_directory_path() / fmt::format("kiln-readers-{}-{}", ::getpid(), name)).string();
    safetensors::save<Cpu>(p, {{"x", Tensor<Cpu>::zeros({1})}}, meta);
    return p;
  };
  const std::map<std::string, std::string> good{{"kiln_checkpoint", "1"}, {"step", "20"}, {"rng_seed", "0"}, {"rng_offset", "8"},
                                                {"model_config", "{\"d_model\": 32}"}};
  CHECK(read_checkpoint_info(ck("good.safetensors", good)).step == 20);
  auto with = [&](const char* k, const char* v) {
    auto m = good;
    m[k] = v;
    return m;
  };
  CHECK_THROWS_WITH(read_checkpoint_info(ck("a.safetensors", with("step", "12abc"))), Contains("'step' = '12abc' is not a non-negative integer"));
  CHECK_THROWS_WITH(read_checkpoint_info(ck("b.safetensors", with("step", "-3"))), Contains("'step' = '-3'"));
  CHECK_THROWS_WITH(read_checkpoint_info(ck("c.safetensors", with("rng_offset", ""))), Contains("'rng_offset'"));
  CHECK_THROWS_WITH(read_checkpoint_info(ck("d.safetensors", with("model_config", "{\"d_model\":"))),
                    Contains("'model_config' is not valid JSON"));
  auto m = good;
  m.erase("rng_seed");
  CHECK_THROWS_WITH(read_checkpoint_info(ck("e.safetensors", m)), Contains("no 'rng_seed' metadata"));
}

TEST_CASE("readers: token files read every integer dtype from the mapped bytes, nothing else", "[errors][fuzz]") {
  const std::string p = file("tok.safetensors", "");
  safetensors::save<Cpu>(p, {{"tokens", Tensor<Cpu>::from_vector(std::vector<int64_t>{3, 1, 4, 1, 5})}});
  CHECK(TokenData::load(p).tokens() == std::vector<int64_t>{3, 1, 4, 1, 5});
  safetensors::save<Cpu>(p, {{"tokens", Tensor<Cpu>::from_vector(std::vector<int32_t>{2, 7})}});
  CHECK(TokenData::load(p).tokens() == std::vector<int64_t>{2, 7});
  safetensors::save<Cpu>(p, {{"tokens", Tensor<Cpu>::from_vector(std::vector<float>{1, 2})}});
  CHECK_THROWS_WITH(TokenData::load(p), Contains("must hold integers") && Contains("F32"));
  safetensors::save<Cpu>(p, {{"tokens", Tensor<Cpu>::from_vector(std::vector<int64_t>{1, -2})}});
  CHECK_THROWS_WITH(TokenData::load(p), Contains("negative token -2 at position 1"));
}
