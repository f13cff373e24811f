// safetensors: round trips, files written by the PyTorch reference, and every kind of corrupt file.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include "common/python.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::string tmp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-st-{}", ::getpid());
  fs::create_directories(dir);
  return (dir / name).string();
}

void write_raw(const std::string& path, const std::string& header, const std::string& data, uint64_t len_override = ~0ull) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = len_override == ~0ull ? header.size() : len_override;
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << data;
}

}  // namespace

TEMPLATE_TEST_CASE("safetensors: round trip of every dtype, views and empty tensors", "[safetensors]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator g(7);
  const T a = T::randn({3, 4}, DType::f32, &g);
  const std::vector<std::pair<std::string, T>> ts{
      {"a", a},
      {"a_t", a.t()},  // non-contiguous: written in logical order
      {"d", T::randn({5}, DType::f64, &g)},
      {"h", T::randn({2, 2}, DType::bf16, &g)},
      {"f", T::randn({2, 3}, DType::f16, &g)},
      {"i", T::arange(10, DType::i32).reshape({2, 5})},
      {"l", T::arange(4, DType::i64)},
      {"b", T::arange(4, DType::i64).gt(1)},
      {"empty", T::zeros({0, 3})},
      {"scalar", T::full({}, 2.5)},
  };
  const std::string p = tmp_path("rt.safetensors");
  safetensors::save(p, ts, {{"step", "12"}});
  const auto back = safetensors::load<TestType>(p);
  REQUIRE(back.size() == ts.size());
  for (const auto& [name, t] : ts) {
    INFO(name);
    const T& u = back.at(name);
    CHECK(u.shape() == t.shape());
    CHECK(u.dtype() == t.dtype());
    CHECK(to_vector<double>(u) == to_vector<double>(t));
  }
  CHECK(safetensors::File::open(p).metadata().at("step") == "12");
  for (const auto& e : fs::directory_iterator(fs::path(p).parent_path()))
    CHECK(e.path().string().find(".tmp-") == std::string::npos);  // no temp file left behind
}

TEST_CASE("safetensors: reads what the PyTorch reference writes", "[safetensors]") {
  const std::string ref = std::string(KILN_REFERENCE_DIR) + "/kiln_ref.py";
  if (std::system(fmt::format("{} -c 'import torch' 2>/dev/null", kiln::test::python()).c_str()) != 0)
    FAIL("torch missing for " << kiln::test::python() << ": run scripts/setup.sh --python, or set KILN_PYTHON");
  const std::string p = tmp_path("ref_tokens.safetensors");
  REQUIRE(std::system(fmt::format("{} {} tokens --vocab 64 --n 1000 --seed 3 --out {}", kiln::test::python(), ref, p).c_str()) == 0);
  const auto f = safetensors::File::open(p);
  REQUIRE(f.names() == std::vector<std::string>{"tokens"});
  const auto t = f.load<Cpu>("tokens");
  CHECK(t.dtype() == DType::i32);
  CHECK(t.shape() == Shape{1000});
  const auto v = to_vector<int64_t>(t);
  CHECK(v[0] == 0);
  int follows = 0;  // the stream mostly follows t+1 = (5t+3) mod V
  for (size_t i = 1; i < v.size(); ++i) follows += v[i] == (5 * v[i - 1] + 3) % 64;
  CHECK(follows > 700);
}

TEST_CASE("safetensors: corrupt files are rejected with the file and the problem named", "[safetensors]") {
  const std::string p = tmp_path("bad.safetensors");
  auto expect = [&](const std::string& what) {
    CHECK_THROWS_WITH(safetensors::File::open(p), Catch::Contains(p) && Catch::Contains(what));
  };
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\0');

  SECTION("missing file") { CHECK_THROWS_WITH(safetensors::File::open(p + ".nope"), Catch::Contains("cannot open")); }
  SECTION("shorter than the length field") {
    std::ofstream(p, std::ios::binary) << "abc";
    expect("truncated");
  }
  SECTION("header longer than the file") {
    write_raw(p, "{" + ok_entry + "}", data8, 4096);
    expect("truncated");
  }
  SECTION("absurd header size") {
    write_raw(p, "{}", "", 1ull << 60);
    expect("100 MiB");
  }
  SECTION("not JSON") {
    write_raw(p, "{\"x\": [", "");
    expect("not valid JSON");
  }
  SECTION("unknown dtype") {
    write_raw(p, R"({"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0'));
    expect("F8_E4M3");
  }
  SECTION("offsets out of range") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8);
    expect("outside");
  }
  SECTION("size does not match the shape") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8);
    expect("span");
  }
  SECTION("overlapping tensors") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8);
    expect("overlaps");
  }
  SECTION("hole") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8);
    expect("hole");
  }
  SECTION("negative dimension") {
    write_raw(p, R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8);
    expect("invalid dimension");
  }
  SECTION("duplicate names") {
    write_raw(p, "{" + ok_entry + "," + ok_entry + "}", data8);
    expect("twice");
  }
  SECTION("bool byte that is not 0 or 1") {
    write_raw(p, R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x07", 2));
    CHECK_THROWS_WITH(safetensors::File::open(p).load<Cpu>("b"), Catch::Contains("BOOL"));
  }
  SECTION("unknown tensor name") {
    write_raw(p, "{" + ok_entry + "}", data8);
    CHECK_THROWS_WITH(safetensors::File::open(p).load<Cpu>("nope"), Catch::Contains("no tensor 'nope'"));
  }
}

TEST_CASE("safetensors: save rejects bad names and never leaves a partial file", "[safetensors]") {
  using T = Tensor<Cpu>;
  const std::string p = tmp_path("names.safetensors");
  CHECK_THROWS_WITH(safetensors::save<Cpu>(p, {{"a", T::zeros({1})}, {"a", T::zeros({1})}}), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(safetensors::save<Cpu>(p, {{"", T::zeros({1})}}), Catch::Contains("empty tensor name"));
  // the header is JSON: names and metadata must be UTF-8 (a lone byte >= 0x80 is not)
  CHECK_THROWS_WITH(safetensors::save<Cpu>(p, {{"a", T::zeros({1})}}, {{"alphabet", "ab\xe9"}}),
                    Catch::Contains("metadata 'alphabet' is not valid UTF-8"));
  CHECK_THROWS_WITH(safetensors::save<Cpu>(p, {{"w\xc3", T::zeros({1})}}), Catch::Contains("tensor name is not valid UTF-8"));
  const std::string ok = p + ".utf8";
  safetensors::save<Cpu>(ok, {{"w\xc3\xa9", T::zeros({1})}}, {{"note", "caf\xc3\xa9 \xe2\x80\x94 ok"}});  // valid UTF-8 is fine
  CHECK(safetensors::File::open(ok).metadata().at("note") == "caf\xc3\xa9 \xe2\x80\x94 ok");
  fs::remove(ok);
  CHECK(!fs::exists(p));
  CHECK_THROWS_WITH(safetensors::save<Cpu>("/nonexistent-dir/x.safetensors", {{"a", T::zeros({1})}}),
                    Catch::Contains("/nonexistent-dir/x.safetensors"));
}
