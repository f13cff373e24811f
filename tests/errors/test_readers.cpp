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
#include <kiln/formats/printable.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/config.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/config.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/loop.hpp>
#include <kiln/train/plot.hpp>

using namespace kiln;
using Catch::Contains;

namespace {

// The scratch files of this file's tests, removed when the test program ends.
struct Scratch {
  std::vector<std::filesystem::path> paths;
  ~Scratch() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove(p, ec);
  }
};

std::string scratch(const std::string& name) {
  static Scratch s;
  const auto p = std::filesystem::temp_directory_path() / fmt::format("kiln-readers-{}-{}", ::getpid(), name);
  s.paths.push_back(p);
  return p.string();
}

std::string file(const std::string& name, const std::string& bytes) {
  const std::string p = scratch(name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// The message of the kiln::Error that f throws ("" when it throws none).
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
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
  CHECK_THROWS_WITH(ModelConfig::from_json(nlohmann::json::parse("{\"n_layers\": -9223372036854775808.0}")).resolved(),
                    Contains("n_layers"));
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
    const std::string p = scratch(name);
    safetensors::save<Cpu>(p, {{"x", Tensor<Cpu>::zeros({1})}}, meta);
    return p;
  };
  const std::map<std::string, std::string> good{
      {"kiln_checkpoint", "1"}, {"step", "20"}, {"rng_seed", "0"}, {"rng_offset", "8"}, {"model_config", "{\"d_model\": 32}"}};
  CHECK(read_checkpoint_info(ck("good.safetensors", good)).step == 20);
  auto with = [&](const char* k, const char* v) {
    auto m = good;
    m[k] = v;
    return m;
  };
  CHECK_THROWS_WITH(read_checkpoint_info(ck("a.safetensors", with("step", "12abc"))),
                    Contains("'step' = '12abc' is not a non-negative integer"));
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

TEST_CASE("printable: valid UTF-8 stays and every other byte or control character becomes a hex escape", "[errors]") {
  CHECK(printable("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80 a\\b") == "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80 a\\b");
  CHECK(printable("a\xff"
                  "b\xfe") == "a\\xFFb\\xFE");
  CHECK(printable("\x1b[31mred\t\n\x7f") == "\\x1B[31mred\\x09\\x0A\\x7F");
  CHECK(printable("\xc2\x9b"
                  "1m") == "\\xC2\\x9B1m");                        // U+009B, the C1 control sequence introducer
  CHECK(printable("\xc0\x80") == "\\xC0\\x80");                    // overlong NUL
  CHECK(printable("\xed\xa0\x80") == "\\xED\\xA0\\x80");           // a surrogate
  CHECK(printable("\xf4\x90\x80\x80") == "\\xF4\\x90\\x80\\x80");  // beyond U+10FFFF
  CHECK(printable("\xe6\x97") == "\\xE6\\x97");                    // a character cut short
  CHECK(printable(std::string("a\0b", 3)) == "a\\x00b");
  // A cut never splits a character, and says so.
  CHECK(printable("\xc3\xa9\xc3\xa9\xc3\xa9", 3) == "\xc3\xa9...");
  CHECK(printable("abc", 3) == "abc");
  CHECK(printable("abcd", 3) == "abc...");
  for (const std::string s : {"a\xff\x1b\xc3\xa9\xed\xa0\x80z", "\\xZZ \\x41", "\x80\x80\xc2"})
    CHECK(printable(printable(s)) == printable(s));
  CHECK(valid_utf8("caf\xc3\xa9"));
  CHECK_FALSE(valid_utf8("\xc0\x80"));
  CHECK_FALSE(valid_utf8("\xed\xbf\xbf"));
}

TEST_CASE("readers: a corrupt file's bytes are quoted escaped, as valid UTF-8", "[errors][fuzz]") {
  // A safetensors header, a JSON config and a JSONL log holding bytes that are not UTF-8 (and an
  // escape sequence): the messages quoted them raw.
  const std::string header = "{\"w\xff\xfe\x1b[2J";
  std::string st(8, '\0');
  st[0] = static_cast<char>(header.size());
  const std::string e1 = error_of([&] { (void)safetensors::File::open(file("bad.safetensors", st + header)); });
  CHECK_THAT(e1, Contains("not valid JSON") && Contains("last read: '\"w\\xFF'"));  // nlohmann stops at the first bad byte
  const std::string e2 = error_of([&] { (void)ModelConfig::load(file("bad.json", "{\"d_model\": \xfe\xff}")); });
  CHECK_THAT(e2, Contains("not valid JSON") && Contains("\\xFE"));
  const std::string e3 = error_of([&] { (void)read_log(file("bad.jsonl", "{\"step\": 0}\n\xff\xfe\x1b[2J garbage\n")); });
  CHECK_THAT(e3, Contains("line 2") && Contains("\\xFF\\xFE\\x1B[2J garbage"));
  // The first 80 bytes of a long line, not cut inside a character.
  const std::string e4 = error_of([&] { (void)read_log(file("long.jsonl", std::string(79, 'x') + "\xc3\xa9\xc3\xa9")); });
  CHECK_THAT(e4, Contains(std::string(79, 'x') + "..."));
  for (const std::string& e : {e1, e2, e3, e4}) {
    INFO(e);
    CHECK(valid_utf8(e));
    CHECK(e.find('\x1b') == std::string::npos);
  }
  // Metadata strings are UTF-8 (JSON), but may hold controls: a checkpoint's step, a DataLoader state.
  safetensors::save<Cpu>(scratch("esc.safetensors"), {{"x", Tensor<Cpu>::zeros({1})}},
                         {{"kiln_checkpoint", "1"}, {"step", "7\x1b[31m"}, {"rng_seed", "0"}, {"rng_offset", "0"}, {"model_config", "{}"}});
  CHECK_THROWS_WITH(read_checkpoint_info(scratch("esc.safetensors")), Contains("'step' = '7\\x1B[31m'"));
  auto state = DataLoaderState{}.to_map("data.");
  state["data.epoch"] = "1\x07";
  CHECK_THROWS_WITH(DataLoaderState::from_map(state, "data."), Contains("= '1\\x07' is not an integer"));
}

TEST_CASE("readers: safetensors::save refuses strings a JSON writer refuses, with a kiln::Error", "[errors]") {
  // An overlong NUL passed the old lead-byte check and reached nlohmann's dump (type_error 316).
  const std::string p = scratch("overlong.safetensors");
  CHECK_THROWS_WITH(safetensors::save<Cpu>(p, {{"x", Tensor<Cpu>::zeros({1})}}, {{"note", "a\xc0\x80"}}),
                    Contains("metadata 'note' is not valid UTF-8"));
  CHECK_THROWS_WITH(safetensors::save<Cpu>(p, {{"w\xed\xa0\x80", Tensor<Cpu>::zeros({1})}}),
                    Contains("tensor name is not valid UTF-8: 'w\\xED\\xA0\\x80'"));
  CHECK_FALSE(std::filesystem::exists(p));
}

TEST_CASE("readers: a resume checkpoint's loss_scale that is not a number is a kiln::Error", "[errors][fuzz]") {
  // fit read it with std::stod: "x" escaped as std::invalid_argument, "1e999" as std::out_of_range,
  // and "2abc" passed as 2.
  nn::Linear<Reference> model(nn::LinearOptions{.in = 2, .out = 1});
  optim::SGD<Reference> opt(model.named_parameters(), {.lr = 0.1});
  const auto x = Tensor<Reference>::ones({4, 2});
  auto step = [&](int64_t) { return model.forward(Var<Reference>(x)).mean(); };
  const std::string ck = scratch("f16.safetensors");
  fit(model, opt, IndexedBatches{.batch = [](int64_t i) { return i; }}, step,
      FitOptions{.steps = 1, .precision = DType::f16, .checkpoint_path = ck, .progress = 0});
  const auto f = safetensors::File::open(ck);
  REQUIRE(f.metadata().count("loss_scale"));
  std::vector<std::pair<std::string, Tensor<Reference>>> ts;
  for (const std::string& n : f.names()) ts.emplace_back(n, f.load<Reference>(n));
  for (const char* bad : {"x", "1e999", "2abc"}) {
    auto meta = f.metadata();
    meta["loss_scale"] = bad;
    const std::string p = scratch("f16_bad.safetensors");
    safetensors::save<Reference>(p, ts, meta);
    CHECK_THROWS_WITH(fit(model, opt, IndexedBatches{.batch = [](int64_t i) { return i; }}, step,
                          FitOptions{.steps = 2, .precision = DType::f16, .resume_path = p, .progress = 0}),
                      Contains("'loss_scale' = '" + std::string(bad) + "' is not a number"));
  }
}

TEST_CASE("readers: an optimizer state's step must be one integer >= 0", "[errors][fuzz]") {
  // A float step (NaN, 1e300) was converted to int64: undefined behaviour (found by fuzz_resume).
  nn::Linear<Reference> model(nn::LinearOptions{.in = 2, .out = 1});
  optim::Adam<Reference> opt(model.named_parameters(), {.lr = 0.1});
  std::map<std::string, Tensor<Reference>> sd;
  for (auto& [k, v] : opt.state_dict()) sd.emplace(k, v);
  using T = Tensor<Reference>;
  auto with_step = [&](const T& s) {
    auto m = sd;
    m["step"] = s;
    return m;
  };
  CHECK_THROWS_WITH(opt.load_state_dict(with_step(T::full({}, std::nan(""), DType::f64))), Contains("'step' must be one integer, got f64"));
  CHECK_THROWS_WITH(opt.load_state_dict(with_step(T::full({}, 1e300, DType::f32))), Contains("'step' must be one integer"));
  CHECK_THROWS_WITH(opt.load_state_dict(with_step(T::from_vector(std::vector<int64_t>{1, 2}))),
                    Contains("'step' must be one integer") && Contains("[2]"));
  CHECK_THROWS_WITH(opt.load_state_dict(with_step(T::full({}, -3, DType::i64))), Contains("'step' = -3 is negative"));
  opt.load_state_dict(with_step(T::full({}, 7, DType::i32)));
  CHECK(item<int64_t>(opt.state_dict().back().second) == 7);
}
