// The way back to Hugging Face (nn/hf/export.hpp): every fixture of tests/hf/fixtures imported and
// saved again gives the checkpoint's tensors bit for bit and an equivalent config.json; a kiln-native
// Llama-shaped GPT exported gives transformers' logits (fixtures/export_llama.json, made by
// check_export.py from the directory this test writes; run live when a Python with transformers is
// found) and re-imports with the same logits; what has no Hugging Face architecture, an occupied
// output directory and a failure half-way are errors that leave nothing behind.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/hf/export.hpp>
#include "common/kiln_test.hpp"
#include "common/run.hpp"

using namespace kiln;
using kt::error_of;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/hf/fixtures/";
const std::vector<int64_t> kPrompt = {5, 17, 3, 88, 41, 60, 9, 23};

// A scratch directory under /tmp, removed with everything in it when the test case ends.
struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& tag) : path(fs::temp_directory_path() / fmt::format("kiln-hfx-{}-{}", ::getpid(), tag)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // What the directory holds (names), sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return json::parse(f);
}

// The Llama shape of kiln's GPT: GQA (4 heads, 2 kv heads), SwiGLU, RMSNorm, RoPE.
ModelConfig llama_shaped(bool tie) {
  ModelConfig c;
  c.vocab_size = 96;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 48;
  c.max_seq_len = 64;
  c.rope_theta = 10000.0;
  c.tie_embeddings = tie;
  return c;
}

// Weights large enough that the logits are far from uniform: matrices N(0, 0.25²), norms 1 + N(0, 0.1²).
std::shared_ptr<nn::GPT<Cpu>> random_gpt(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_shared<nn::GPT<Cpu>>(c);
  Generator g(seed);
  NoGrad ng;
  for (auto& [name, p] : m->named_parameters()) {
    Tensor<Cpu> v = p.value();
    const Tensor<Cpu> r = Tensor<Cpu>::randn(v.shape(), DType::f32, &g);
    v.copy_(v.dim() >= 2 ? r.mul(0.25) : r.mul(0.1).add(1.0));
  }
  m->eval();
  return m;
}

template <class M> std::vector<float> logits_of(const M& m, const std::vector<int64_t>& ids) {
  NoGrad ng;
  return m.forward(Tensor<Cpu>::from_vector(ids, {1, static_cast<int64_t>(ids.size())})).value().template to_vector<float>();
}

// max |a - b| / max |b|
template <class T> double rel_err(const std::vector<float>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Two model directories hold the same tensors: names, dtypes, shapes and bytes.
void require_identical_tensors(const std::string& want_dir, const std::string& got_dir) {
  const hf::ModelDir want = hf::ModelDir::open(want_dir), got = hf::ModelDir::open(got_dir);
  REQUIRE(got.tensor_names() == want.tensor_names());
  for (const std::string& n : want.tensor_names()) {
    INFO(n);
    const auto &a = want.file_of(n).info(n), &b = got.file_of(n).info(n);
    CHECK(b.st_dtype == a.st_dtype);
    CHECK(b.shape == a.shape);
    REQUIRE(b.end - b.begin == a.end - a.begin);
    CHECK(std::memcmp(got.file_of(n).data(n), want.file_of(n).data(n), a.end - a.begin) == 0);
  }
  for (const auto& f : got.files()) CHECK(f.metadata().at("format") == "pt");
}

// A Python with transformers: KILN_HF_PYTHON, else scripts/hf_venv.sh's .venv-hf; "" when none.
std::string hf_python() {
  if (const char* p = std::getenv("KILN_HF_PYTHON"); p && *p) return p;
  const std::string venv = std::string(KILN_SOURCE_DIR) + "/.venv-hf/bin/python";
  return ::access(venv.c_str(), X_OK) == 0 ? venv : "";
}

std::string run(const std::string& cmd) {
  const kt::CommandResult r = kt::run_command(cmd);
  return fmt::format("status {}\n{}", r.status, r.out);
}

}  // namespace

TEST_CASE("export: every imported fixture saves back to identical tensors, an equivalent config.json and its generation_config.json",
          "[hf][export]") {
  for (const char* name : {"gpt2", "llama", "llama3_bf16", "qwen2", "mistral", "qwen3", "qwen3_yarn", "qwen3_window", "mistral_window",
                           "gemma", "gemma2", "gemma3", "phi3", "phi3_longrope"}) {
    INFO(name);
    Scratch tmp(std::string("rt-") + name);
    const std::string src = kFixtures + name, out = tmp / "out";
    const auto model = hf::load_causal_lm<Cpu>(src);
    const json cfg = read_json(src + "/config.json");
    const DType stored = cfg.value("torch_dtype", cfg.value("dtype", "float32")) == "bfloat16" ? DType::bf16 : DType::f32;
    hf::save_pretrained(*model, out, {.dtype = stored});
    require_identical_tensors(src, out);
    // config.json: every field of the source with its value.
    const json got = read_json(out + "/config.json");
    for (auto it = cfg.begin(); it != cfg.end(); ++it) {
      INFO(it.key());
      REQUIRE(got.contains(it.key()));
      CHECK(got[it.key()] == it.value());
    }
    CHECK(read_json(out + "/generation_config.json") == read_json(src + "/generation_config.json"));
    // And the model reads back with the same logits; with a venv, transformers reads it too and gives
    // the fixture's logits (its config.json, Mistral's null window included, is one transformers takes).
    const auto back = hf::load_causal_lm<Cpu>(out);
    CHECK(logits_of(*back, kPrompt) == logits_of(*model, kPrompt));
    // (Not those made with transformers 5: the venv's 4.46.3 predates Qwen3, Gemma 3, transformers 5's
    // config spellings and today's sliding-window masks.)
    const std::string n = name;
    if (const std::string py = hf_python();
        !py.empty() && !n.starts_with("qwen3") && !n.starts_with("gemma") && n != "mistral_window" && !n.starts_with("phi3")) {
      const json e = read_json(src + "/expected.json");
      std::ofstream(tmp / "want.json") << e["logits"].dump();
      const std::string r = run(fmt::format("{} {}/tests/hf/check_export.py {} --prompt {} --compare {} 2>&1", py, KILN_SOURCE_DIR, out,
                                            fmt::join(e["prompt"].get<std::vector<int64_t>>(), ","), tmp / "want.json"));
      INFO(r);
      CHECK(r.rfind("status 0", 0) == 0);
      fs::remove(tmp.path / "want.json");
    }
    CHECK(tmp.entries() == std::vector<std::string>{"out"});  // no temporary left beside it
  }
}

TEST_CASE("export: a GPT-2 round trip re-fuses c_attn and stores Conv1D weights [in, out], a Llama's q/k rows go back to rotate-half",
          "[hf][export]") {
  // The import re-orders q_proj rows for kiln's interleaved RoPE, so the parameter differs from the
  // stored tensor while the exported one equals it (a mutant that skips the inverse fails here).
  Scratch tmp("ops");
  const auto llama = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  hf::save_pretrained(*llama, tmp / "llama");
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  const Tensor<Cpu> stored = safetensors::File::open(kFixtures + "llama/model.safetensors").load<Cpu>(q);
  const Tensor<Cpu> param = llama->named_parameters()[2].second.value();
  REQUIRE(llama->named_parameters()[2].first == "layers.0.attn.q_proj.weight");
  CHECK(param.sub(stored).abs().max().item<float>() > 0);
  CHECK(safetensors::File::open(tmp / "llama/model.safetensors").load<Cpu>(q).sub(stored).abs().max().item<float>() == 0);
  const auto gpt2 = hf::load_causal_lm<Cpu>(kFixtures + "gpt2");
  hf::save_pretrained(*gpt2, tmp / "gpt2");
  const auto f = safetensors::File::open(tmp / "gpt2/model.safetensors");
  CHECK(f.info("transformer.h.0.attn.c_attn.weight").shape == Shape{32, 96});
  CHECK(f.info("transformer.h.0.mlp.c_fc.weight").shape == Shape{32, 64});
  CHECK_FALSE(f.contains("lm_head.weight"));  // tied: saved once, as transformers does
}

TEST_CASE("export: bf16 and f16 storage, sharding above max_shard_bytes with transformers' index", "[hf][export]") {
  Scratch tmp("shard");
  const auto model = hf::load_causal_lm<Cpu>(kFixtures + "qwen2");
  hf::save_pretrained(*model, tmp / "sharded", {.max_shard_bytes = 20'000});
  const json index = read_json(tmp / "sharded/model.safetensors.index.json");
  CHECK(index["metadata"]["total_size"] == 74880);
  std::set<std::string> files;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) files.insert(it.value().get<std::string>());
  CHECK(files == std::set<std::string>{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                       "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"});
  for (const std::string& f : files) CHECK(fs::file_size(tmp.path / "sharded" / f) < 20'000 + 4'000);  // weights + header
  CHECK_FALSE(fs::exists(tmp.path / "sharded/model.safetensors"));
  require_identical_tensors(kFixtures + "qwen2", tmp / "sharded");
  hf::save_pretrained(*model, tmp / "one", {.max_shard_bytes = 0});
  CHECK(fs::exists(tmp.path / "one/model.safetensors"));
  CHECK_FALSE(fs::exists(tmp.path / "one/model.safetensors.index.json"));

  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(fmt::format("{}", dt));
    const std::string out = tmp / fmt::format("{}", dt);
    hf::save_pretrained(*model, out, {.dtype = dt});
    CHECK(read_json(out + "/config.json")["torch_dtype"] == (dt == DType::bf16 ? "bfloat16" : "float16"));
    const hf::ModelDir d = hf::ModelDir::open(out);
    for (const std::string& n : d.tensor_names()) CHECK(d.file_of(n).info(n).dtype == dt);
    // Each stored value is the f32 parameter rounded once: re-imported, the logits stay close.
    const auto back = hf::load_causal_lm<Cpu>(out);
    const std::vector<float> want = logits_of(*model, kPrompt);
    CHECK(rel_err(logits_of(*back, kPrompt), want) < (dt == DType::bf16 ? 3e-2 : 4e-3));
    CHECK(rel_err(logits_of(*back, kPrompt), want) > 0);
  }
}

TEST_CASE("export: a kiln-native Llama-shaped GPT gives transformers' logits within 1e-5 relative (f32)", "[hf][export]") {
  Scratch tmp("native");
  const auto gpt = random_gpt(llama_shaped(false), 11);
  const std::string out = tmp / "llama";
  hf::save_pretrained(*gpt, out, {.bos_token_id = 1, .eos_token_id = 2});
  const json cfg = read_json(out + "/config.json");
  CHECK(cfg["architectures"] == json::array({"LlamaForCausalLM"}));
  CHECK(cfg["num_key_value_heads"] == 2);
  CHECK(cfg["eos_token_id"] == 2);
  CHECK(read_json(out + "/generation_config.json")["eos_token_id"] == 2);
  const std::vector<float> kiln_logits = logits_of(*gpt, kPrompt);

  // The committed reference: transformers' logits of this very export (check_export.py --write).
  const std::string fixture = kFixtures + "export_llama.json";
  const std::string py = hf_python();
  if (!py.empty()) {
    const std::string mine = tmp / "kiln_logits.json";
    std::ofstream(mine) << json(kiln_logits).dump();
    const bool regen = std::getenv("KILN_HF_REGENERATE") != nullptr;
    const std::string r = run(fmt::format("{} {}/tests/hf/check_export.py {} --prompt {} --compare {}{} 2>&1", py, KILN_SOURCE_DIR, out,
                                          fmt::join(kPrompt, ","), mine, regen ? " --write " + fixture : ""));
    INFO(r);
    CHECK(r.rfind("status 0", 0) == 0);
  } else {
    WARN("no Python with transformers (KILN_HF_PYTHON or .venv-hf): the committed reference only");
  }
  const json e = read_json(fixture);
  REQUIRE(e["prompt"].get<std::vector<int64_t>>() == kPrompt);
  const std::vector<double> ref = e["logits"].get<std::vector<double>>();
  CHECK(rel_err(kiln_logits, ref) < 1e-5);
  // The exported files, read by kiln's import, give transformers' numbers too.
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(out), kPrompt), ref) < 1e-5);
}

TEST_CASE("export: a kiln GPT re-imports with the same logits (tied and untied heads, MHA and GQA)", "[hf][export]") {
  Scratch tmp("reimport");
  for (const bool tie : {false, true})
    for (const int64_t kv : {4, 1}) {
      INFO("tie " << tie << ", kv heads " << kv);
      ModelConfig c = llama_shaped(tie);
      c.n_kv_heads = kv;
      c.rope_theta = 500000.0;
      const auto gpt = random_gpt(c, 20 + kv);
      const std::string out = tmp / fmt::format("m-{}-{}", tie, kv);
      hf::save_pretrained(*gpt, out);
      const auto back = hf::load_causal_lm<Cpu>(out);
      CHECK(back->spec().tie_embeddings == tie);
      CHECK(back->spec().kv_heads == kv);
      CHECK(rel_err(logits_of(*back, kPrompt), logits_of(*gpt, kPrompt)) < 1e-5);
      CHECK(hf::ModelDir::open(out).contains("lm_head.weight") == !tie);
    }
}

TEST_CASE("export: no Hugging Face architecture, an occupied directory, a bad option are errors and nothing is left half-written",
          "[hf][export]") {
  Scratch tmp("errors");
  auto refuses = [&](ModelConfig c, const char* option) {
    INFO(option);
    const auto gpt = std::make_shared<nn::GPT<Cpu>>(c);
    const std::string err = error_of([&] { hf::save_pretrained(*gpt, tmp / "x"); });
    CHECK(err.find("no Hugging Face architecture") != std::string::npos);
    CHECK(err.find(option) != std::string::npos);
    CHECK_FALSE(fs::exists(tmp.path / "x"));
  };
  ModelConfig c = llama_shaped(false);
  c.attention = "diff";
  refuses(c, "differential attention");
  c = llama_shaped(false);
  c.residual = "attnres_full";
  refuses(c, "attention residuals");
  c.residual = "attnres_block";
  refuses(c, "attnres_block");
  c = llama_shaped(false);
  c.rope = false;
  refuses(c, "rope = false");

  const auto gpt = random_gpt(llama_shaped(false), 3);
  const std::string out = tmp / "out";
  fs::create_directories(out);
  std::ofstream(out + "/keep.txt") << "mine";
  const std::string err = error_of([&] { hf::save_pretrained(*gpt, out); });
  CHECK(err.find("not empty") != std::string::npos);
  CHECK(err.find(out) != std::string::npos);
  CHECK(fs::exists(out + "/keep.txt"));
  // A failure after the weights are written (a tokenizer directory with no tokenizer): the old
  // directory stays as it was and no temporary is left.
  const std::string empty = tmp / "no_tokenizer";
  fs::create_directories(empty);
  const std::string err2 = error_of([&] { hf::save_pretrained(*gpt, out, {.tokenizer_from = empty, .overwrite = true}); });
  CHECK(err2.find("no tokenizer file") != std::string::npos);
  CHECK(fs::exists(out + "/keep.txt"));
  CHECK(tmp.entries() == std::vector<std::string>{"no_tokenizer", "out"});
  // With overwrite it replaces the directory.
  hf::save_pretrained(*gpt, out, {.overwrite = true});
  CHECK_FALSE(fs::exists(out + "/keep.txt"));
  CHECK(fs::exists(out + "/model.safetensors"));
  CHECK(tmp.entries() == std::vector<std::string>{"no_tokenizer", "out"});

  CHECK(error_of([&] { hf::save_pretrained(*gpt, tmp / "y", {.dtype = DType::i32}); }).find("f32, bf16 or f16") != std::string::npos);
  CHECK(error_of([&] { hf::save_pretrained(*gpt, out + "/model.safetensors"); }).find("not a directory") != std::string::npos);
  CHECK(hf::parse_byte_size("2GB") == 2'000'000'000);
  CHECK(hf::parse_byte_size("20KB") == 20'000);
  CHECK(hf::parse_byte_size("1GiB") == int64_t{1} << 30);
  CHECK(hf::parse_byte_size("500mb") == 500'000'000);
  CHECK(hf::parse_byte_size("1234") == 1234);
  for (const char* bad : {"", "GB", "2 GB", "2TB", "-1", "1.5GB"})
    CHECK(error_of([&] { hf::parse_byte_size(bad); }).find("max shard size") != std::string::npos);
  CHECK(tmp.entries() == std::vector<std::string>{"no_tokenizer", "out"});
}

TEST_CASE("export: tokenizer files are copied from tokenizer_from", "[hf][export]") {
  Scratch tmp("tok");
  const auto model = hf::load_causal_lm<Cpu>(kFixtures + "gpt2");
  const std::string tok = std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/gpt2";
  hf::save_pretrained(*model, tmp / "out", {.tokenizer_from = tok});
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    INFO(f);
    std::ifstream a(tok + "/" + f), b(tmp / "out/" + f);
    REQUIRE(b.good());
    CHECK(std::string(std::istreambuf_iterator<char>(a), {}) == std::string(std::istreambuf_iterator<char>(b), {}));
  }
}

TEST_CASE("cli: kiln export writes a Hugging Face directory from a kiln weights file or a model directory", "[hf][export]") {
  Scratch tmp("cli");
  const auto gpt = random_gpt(llama_shaped(false), 11);
  std::vector<std::pair<std::string, Tensor<Cpu>>> w;
  for (const auto& [n, p] : gpt->named_parameters()) w.push_back({n, p.value()});
  safetensors::save<Cpu>(tmp / "w.safetensors", w);
  std::ofstream(tmp / "m.json") << gpt->config().to_json().dump();
  const std::string out = run(fmt::format("{} export {} --model {} --format hf --out {} --eos-id 2 2>&1", KILN_CLI, tmp / "w.safetensors",
                                          tmp / "m.json", tmp / "hf"));
  INFO(out);
  CHECK(out.rfind("status 0", 0) == 0);
  CHECK(out.find("LlamaForCausalLM") != std::string::npos);
  CHECK(read_json(tmp / "hf/config.json")["eos_token_id"] == 2);
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(tmp / "hf"), kPrompt), logits_of(*gpt, kPrompt)) < 1e-5);
  // The same again: the directory exists now.
  const std::string again =
      run(fmt::format("{} export {} --model {} --out {} 2>&1", KILN_CLI, tmp / "w.safetensors", tmp / "m.json", tmp / "hf"));
  CHECK(again.rfind("status 1", 0) == 0);
  CHECK(again.find("--force") != std::string::npos);
  // A Hugging Face directory, bf16 and sharded; --force replaces.
  const std::string hf_out =
      run(fmt::format("{} export {}llama3_bf16 --out {} --dtype bf16 --max-shard-size 20KB --force 2>&1", KILN_CLI, kFixtures, tmp / "hf"));
  INFO(hf_out);
  CHECK(hf_out.rfind("status 0", 0) == 0);
  CHECK(hf_out.find("shards") != std::string::npos);
  CHECK(fs::exists(tmp.path / "hf/model.safetensors.index.json"));
  require_identical_tensors(kFixtures + "llama3_bf16", tmp / "hf");
  // A directory holding checkpoint.safetensors is read as kiln generate reads it.
  fs::create_directories(tmp.path / "ckpt");
  fs::copy_file(tmp / "w.safetensors", tmp / "ckpt/checkpoint.safetensors");
  const std::string from_dir =
      run(fmt::format("{} export {} --model {} --out {} 2>&1", KILN_CLI, tmp / "ckpt", tmp / "m.json", tmp / "hf2"));
  INFO(from_dir);
  CHECK(from_dir.rfind("status 0", 0) == 0);
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(tmp / "hf2"), kPrompt), logits_of(*gpt, kPrompt)) < 1e-5);
  fs::remove_all(tmp.path / "ckpt");
  fs::remove_all(tmp.path / "hf2");
  // A Hugging Face directory with a tokenizer: its files come along unless --tokenizer says otherwise.
  fs::copy(kFixtures + "gpt2", tmp.path / "gpt2_tok");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/gpt2/" + f, tmp.path / "gpt2_tok" / f);
  const std::string tok = run(fmt::format("{} export {} --out {} 2>&1", KILN_CLI, tmp / "gpt2_tok", tmp / "gpt2_out"));
  INFO(tok);
  CHECK(tok.find("tokenizer from") != std::string::npos);
  CHECK(fs::exists(tmp.path / "gpt2_out/tokenizer.json"));
  CHECK(fs::exists(tmp.path / "gpt2_out/tokenizer_config.json"));
  require_identical_tensors(kFixtures + "gpt2", tmp / "gpt2_out");
  fs::remove_all(tmp.path / "gpt2_tok");
  fs::remove_all(tmp.path / "gpt2_out");
  // Errors: a model with no Hugging Face architecture, an unknown format, a bad size.
  std::ofstream(tmp / "diff.json") << R"({"vocab_size": 96, "d_model": 32, "n_layers": 1, "n_heads": 2, "attention": "diff"})";
  const auto diff = std::make_shared<nn::GPT<Cpu>>(ModelConfig::load(tmp / "diff.json"));
  std::vector<std::pair<std::string, Tensor<Cpu>>> dw;
  for (const auto& [n, p] : diff->named_parameters()) dw.push_back({n, p.value()});
  safetensors::save<Cpu>(tmp / "diff.safetensors", dw);
  const std::string d =
      run(fmt::format("{} export {} --model {} --out {} 2>&1", KILN_CLI, tmp / "diff.safetensors", tmp / "diff.json", tmp / "d"));
  CHECK(d.rfind("status 1", 0) == 0);
  CHECK(d.find("differential attention") != std::string::npos);
  CHECK(run(fmt::format("{} export {}llama --format gguf --out {} 2>&1", KILN_CLI, kFixtures, tmp / "g")).find("'gguf'") !=
        std::string::npos);
  CHECK(run(fmt::format("{} export {}llama --out {} --max-shard-size lots 2>&1", KILN_CLI, kFixtures, tmp / "g")).find("max shard size") !=
        std::string::npos);
  CHECK(tmp.entries() == std::vector<std::string>{"diff.json", "diff.safetensors", "hf", "m.json", "w.safetensors"});
}

#if defined(KILN_HAVE_CUDA_BACKEND)
TEST_CASE("export: on Cuda, imported models save back to identical tensors", "[hf][export][cuda]") {
  for (const char* name : {"gpt2", "llama3_bf16", "qwen2", "qwen3_window", "gemma3", "phi3"}) {
    INFO(name);
    Scratch tmp(std::string("cuda-") + name);
    const std::string src = kFixtures + name;
    const auto model = hf::load_causal_lm<Cuda>(src);
    hf::save_pretrained(*model, tmp / "out", {.dtype = std::string(name) == "llama3_bf16" ? DType::bf16 : DType::f32});
    require_identical_tensors(src, tmp / "out");
  }
}
#endif
