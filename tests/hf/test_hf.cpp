// Hugging Face model import and generation against transformers 4.46.3 (Qwen3, Gemma, Phi-3: 5.24.0): the fixtures of
// tests/hf/make_fixtures.py (tiny random GPT-2, Llama (GQA, untied), Llama 3 RoPE scaling stored in
// bf16, Qwen2 sharded, Mistral with head_dim != hidden/heads, Qwen3 with q_norm/k_norm, attention
// biases and head_dim != hidden/heads, Qwen3 with YaRN RoPE scaling, Qwen3 and Mistral with sliding-window
// attention that acts, Gemma (tied, MQA), Gemma 2 (soft caps, query_pre_attn_scalar, a window) and
// Gemma 3 (q/k norms, the sliding layers' own RoPE, a window), Phi-3 (fused qkv_proj with GQA, fused
// gate_up_proj, partial RoPE, a window; longrope whose generation passes original_max_position_embeddings)).
// Logits of a whole prompt within 1e-4
// relative, greedy ids identical, the samplers' processed logits equal, and every kind of bad input
// a kiln::Error naming the file, the field or the tensor.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/config.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/generate.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/hf/export.hpp>
#include <kiln/nn/lora.hpp>
#include <kiln/text/tokenizer.hpp>
#include <kiln/train/trainer.hpp>
#include "common/kiln_test.hpp"
#include "common/run.hpp"

using namespace kiln;
using kt::error_of;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/hf/fixtures/";
const char* const kModels[] = {"gpt2",           "llama", "llama3_bf16", "qwen2",  "mistral", "qwen3",         "qwen3_yarn", "qwen3_window",
                               "mistral_window", "gemma", "gemma2",      "gemma3", "phi3",    "phi3_longrope", "gemma3_mm"};

json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return json::parse(f);
}

void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }

// A fresh copy of a fixture directory to break.
std::string copy_fixture(const std::string& name, const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-hf-{}-{}-{}", ::getpid(), name, tag);
  fs::remove_all(dir);
  fs::copy(kFixtures + name, dir);
  return dir.string();
}

template <Backend B> Tensor<B> ids_tensor(const std::vector<int64_t>& ids) {
  return Tensor<B>::from_vector(ids, {1, static_cast<int64_t>(ids.size())});
}

// max |a - b| / max |b|
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

template <Backend B> std::vector<float> logits_of(const hf::CausalLM<B>& m, const std::vector<int64_t>& ids) {
  NoGrad ng;
  return m.forward(ids_tensor<B>(ids)).value().template to_vector<float>();
}

std::string load_error(const std::string& dir) {
  return error_of([&] { hf::load_causal_lm<Cpu>(dir); });
}

// Rewrites one safetensors file of a model directory through `edit` (name -> tensor).
void rewrite(const std::string& file, const std::function<void(std::map<std::string, Tensor<Cpu>>&)>& edit) {
  auto ts = safetensors::load<Cpu>(file);
  edit(ts);
  std::vector<std::pair<std::string, Tensor<Cpu>>> v(ts.begin(), ts.end());
  safetensors::save<Cpu>(file + ".new", v);
  fs::rename(file + ".new", file);
}

// "status N\n" and what the command printed.
std::string run(const std::string& cmd) {
  const kt::CommandResult r = kt::run_command(cmd);
  return fmt::format("status {}\n{}", r.status, r.out);
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t i = t.rfind('\n');
  return i == std::string::npos ? t : t.substr(i + 1);
}

}  // namespace

TEST_CASE("import: logits of a whole prompt match transformers within 1e-4 relative, every architecture (cpu)", "[hf]") {
  for (const char* name : kModels) {
    DYNAMIC_SECTION(name) {
      const json e = read_json(kFixtures + name + "/expected.json");
      const auto model = hf::load_causal_lm<Cpu>(kFixtures + name);
      const auto prompt = e["prompt"].get<std::vector<int64_t>>();
      const double err = rel_err(logits_of(*model, prompt), e["logits"].get<std::vector<double>>());
      INFO(name << ": relative error " << err);
      CHECK(err < 1e-4);
    }
  }
}

TEST_CASE("generate: greedy generation is token for token transformers' generate(do_sample=False), EOS included", "[hf]") {
  for (const char* name : kModels) {
    DYNAMIC_SECTION(name) {
      const json e = read_json(kFixtures + name + "/expected.json");
      const auto model = hf::load_causal_lm<Cpu>(kFixtures + name);
      nn::GenerateOptions o{.max_new_tokens = e["max_new_tokens"].get<int64_t>(), .temperature = 0};
      o.stop_ids = hf::eos_token_ids(hf::ModelDir::open(kFixtures + name));
      const auto g = nn::generate(*model, {e["prompt"].get<std::vector<int64_t>>()}, o);
      CHECK(g.ids.at(0) == e["greedy"].get<std::vector<int64_t>>());
      CHECK(g.stats.prefill_tokens == static_cast<int64_t>(e["prompt"].size()));
      CHECK(g.stats.decode_tokens == static_cast<int64_t>(e["greedy"].size()) - 1);
      if (e.contains("batch")) {  // prompts of different lengths (transformers: left-padded batch)
        const auto prompts = e["batch"]["prompts"].get<std::vector<std::vector<int64_t>>>();
        const auto want = e["batch"]["greedy"].get<std::vector<std::vector<int64_t>>>();
        const auto b = nn::generate(*model, prompts, o);  // one batch
        CHECK(b.ids == want);
        nn::GenerateOptions one = o;
        one.batch_size = 1;  // one prompt after the other
        const auto s = nn::generate(*model, prompts, one);
        // (longrope switches to its long frequencies by the batch's padded length, as transformers: a short
        // prompt alone switches later and may go another way)
        if (std::string(name) != "phi3_longrope") CHECK(s.ids == want);
        // One batch: a prefill pass and one decode pass per step of the longest row; alone: one each.
        size_t longest = 0, steps = 0;
        for (const auto& w : want) {
          longest = std::max(longest, w.size());
          steps += w.size() - 1;
        }
        CHECK(b.stats.prefill_passes == 1);
        CHECK(b.stats.decode_passes == static_cast<int64_t>(longest) - 1);
        CHECK(s.stats.prefill_passes == static_cast<int64_t>(prompts.size()));
        CHECK(s.stats.decode_passes == static_cast<int64_t>(steps));
        CHECK(b.stats.decode_tokens == s.stats.decode_tokens);
        CHECK(b.stats.prefill_tokens == s.stats.prefill_tokens);
        for (size_t i = 0; i < want.size(); ++i)
          CHECK(b.finish[i] == (static_cast<int64_t>(want[i].size()) < o.max_new_tokens ? nn::Finish::stop_id : nn::Finish::length));
      }
      if (e.contains("eos_batch")) {  // a row ends at EOS while the others go on (longrope: it still decides the switch)
        nn::GenerateOptions eo = o;
        eo.stop_ids = {e["eos_batch"]["eos"].get<int64_t>()};
        CHECK(nn::generate(*model, e["eos_batch"]["prompts"].get<std::vector<std::vector<int64_t>>>(), eo).ids ==
              e["eos_batch"]["greedy"].get<std::vector<std::vector<int64_t>>>());
      }
    }
  }
}

namespace {
// Row r of a left-padded batch (pads[r] padding columns) as the per-row inputs of generate.
template <Backend B> nn::RowInputs<B> left_padded(const std::vector<int64_t>& pads, int64_t T) {
  const int64_t n = static_cast<int64_t>(pads.size());
  std::vector<int64_t> pos;
  std::vector<uint8_t> mask;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < T; ++t) {
      pos.push_back(std::max<int64_t>(t - pads[static_cast<size_t>(r)], 0));
      for (int64_t j = 0; j < T; ++j) mask.push_back(j >= pads[static_cast<size_t>(r)] || j == t);
    }
  return {Tensor<B>::from_vector(pos, {n, T}), Tensor<B>::from_vector(mask, {n, 1, T, T}).to(DType::boolean)};
}

// The logits of each prompt in one left-padded batch, prefill then two cached steps, against each
// prompt alone: the real positions' logits of every row.
template <Backend B> void check_padded_batch(const std::string& name) {
  const json e = read_json(kFixtures + name + "/expected.json");
  const auto prompts = e["batch"]["prompts"].get<std::vector<std::vector<int64_t>>>();
  const auto model = hf::load_causal_lm<B>(kFixtures + name);
  NoGrad ng;
  int64_t L = 0;
  for (const auto& p : prompts) L = std::max<int64_t>(L, static_cast<int64_t>(p.size()));
  const int64_t n = static_cast<int64_t>(prompts.size()), V = e["vocab"].get<int64_t>();
  std::vector<int64_t> ids, pads;
  for (const auto& p : prompts) {
    pads.push_back(L - static_cast<int64_t>(p.size()));
    ids.insert(ids.end(), static_cast<size_t>(pads.back()), 0);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  auto caches = model->make_caches();
  const std::vector<float> batch =
      model->forward(Tensor<B>::from_vector(ids, {n, L}), caches, L + 2, left_padded<B>(pads, L)).value().template to_vector<float>();
  std::vector<std::vector<float>> steps;
  for (int64_t k = 0; k < 2; ++k) {  // two decode steps, token 3 + k in every row
    std::vector<int64_t> pos;
    std::vector<uint8_t> mask;
    for (int64_t r = 0; r < n; ++r) {
      pos.push_back(L + k - pads[static_cast<size_t>(r)]);
      for (int64_t j = 0; j < L + k + 1; ++j) mask.push_back(j >= pads[static_cast<size_t>(r)]);
    }
    const nn::RowInputs<B> rows{Tensor<B>::from_vector(pos, {n, 1}), Tensor<B>::from_vector(mask, {n, 1, 1, L + k + 1}).to(DType::boolean)};
    steps.push_back(model->forward(Tensor<B>::from_vector(std::vector<int64_t>(static_cast<size_t>(n), 3 + k), {n, 1}), caches, L + 2, rows)
                        .value()
                        .template to_vector<float>());
  }
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> alone = prompts[static_cast<size_t>(r)];
    alone.push_back(3);
    alone.push_back(4);
    const std::vector<float> want = logits_of(*model, alone);  // [len + 2, V]
    const int64_t len = static_cast<int64_t>(prompts[static_cast<size_t>(r)].size());
    std::vector<float> got(batch.begin() + (r * L + pads[static_cast<size_t>(r)]) * V, batch.begin() + (r + 1) * L * V);
    for (const auto& st : steps) got.insert(got.end(), st.begin() + r * V, st.begin() + (r + 1) * V);
    INFO(name << " row " << r << " (" << len << " tokens, " << pads[static_cast<size_t>(r)] << " padding)");
    CHECK(rel_err(got, std::vector<double>(want.begin(), want.end())) < 1e-5);
  }
}
}  // namespace

TEST_CASE("generate: each row of a left-padded batch gets the logits it gets alone (cpu, reference)", "[hf]") {
  for (const char* name : {"gpt2", "llama", "qwen2", "qwen3_window", "mistral_window", "gemma2", "gemma3", "phi3", "gemma3_mm"}) {
    DYNAMIC_SECTION(name) {
      check_padded_batch<Cpu>(name);
      check_padded_batch<Reference>(name);
    }
  }
}

#if defined(KILN_HAVE_CUDA_BACKEND)
TEST_CASE("generate: each row of a left-padded batch gets the logits it gets alone on Cuda", "[hf][cuda]") {
  for (const char* name : {"gpt2", "llama", "qwen3_window", "gemma2", "gemma3", "phi3"})
    DYNAMIC_SECTION(name) check_padded_batch<Cuda>(name);
}
#endif

TEST_CASE("generate: the KV-cached forward gives the logits of the full forward, and Reference agrees with Cpu", "[hf]") {
  for (const char* name :
       {"gpt2", "llama", "qwen2", "qwen3_yarn", "qwen3_window", "mistral_window", "gemma", "gemma2", "gemma3", "phi3", "phi3_longrope"}) {
    DYNAMIC_SECTION(name) {
      const json e = read_json(kFixtures + name + "/expected.json");
      const auto prompt = e["prompt"].get<std::vector<int64_t>>();
      const auto model = hf::load_causal_lm<Cpu>(kFixtures + name);
      const std::vector<float> full = logits_of(*model, prompt);
      NoGrad ng;
      auto caches = model->make_caches();
      std::vector<float> cached =
          model->forward(ids_tensor<Cpu>({prompt.begin(), prompt.begin() + 4}), caches, 7).value().to_vector<float>();
      for (size_t t = 4; t < prompt.size(); ++t) {
        const auto row = model->forward(ids_tensor<Cpu>({prompt[t]}), caches, 7).value().to_vector<float>();
        cached.insert(cached.end(), row.begin(), row.end());
      }
      CHECK(rel_err(cached, std::vector<double>(full.begin(), full.end())) < 1e-5);
      const auto ref = hf::load_causal_lm<Reference>(kFixtures + name);
      CHECK(rel_err(logits_of(*ref, prompt), e["logits"].get<std::vector<double>>()) < 1e-4);
    }
  }
}

TEST_CASE("generate: stop strings are found across pieces, the earliest wins, and text that may begin one is held back", "[hf]") {
  const std::vector<std::string> stops{"</s>", "STOP"};
  nn::StopText t(stops);
  std::string out = t.push("Hello <");
  CHECK(out == "Hello ");  // "<" may begin "</s>"
  out += t.push("/x");
  CHECK(out == "Hello </x");  // it did not
  out += t.push(" ST");
  CHECK(out == "Hello </x ");
  out += t.push("O");
  CHECK(out == "Hello </x ");
  CHECK(!t.stopped());
  out += t.push("P and more");
  CHECK(t.stopped());
  CHECK(out == "Hello </x ");  // neither the stop string nor what follows it
  CHECK(t.push("more").empty());
  CHECK(t.finish().empty());
  nn::StopText u(stops);  // no stop: the held-back end comes out at the end
  CHECK(u.push("abc ST") == "abc ");
  CHECK(u.finish() == "ST");
  CHECK(!u.stopped());
  const std::vector<std::string> overlap{"aab"};  // the held-back part is the longest that may begin it
  nn::StopText v(overlap);
  std::string w;
  for (const char* piece : {"a", "a", "a", "b", "c"}) w += v.push(piece);
  CHECK(v.stopped());
  CHECK(w == "a");
  const std::vector<std::string> two{"cd", "bcde"};  // the earliest match in the text
  nn::StopText x(two);
  CHECK(x.push("abcdef") == "a");
}

namespace {
// Byte tokens: id -> one letter.
class LetterDetokenizer : public nn::Detokenizer {
 public:
  std::string push(int64_t id) override { return std::string(1, static_cast<char>('a' + id % 26)); }
};
}  // namespace

TEST_CASE("generate: a stop string ends its row (ids up to the token completing it, text before it), batched or alone", "[hf]") {
  const auto model = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  const json e = read_json(kFixtures + "llama/expected.json");
  const auto prompts = e["batch"]["prompts"].get<std::vector<std::vector<int64_t>>>();
  nn::GenerateOptions o{.max_new_tokens = 12, .detokenizer = [] { return std::make_unique<LetterDetokenizer>(); }};
  const nn::Generation full = nn::generate(*model, prompts, o);
  REQUIRE(full.text.size() == prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    CHECK(full.text[r].size() == full.ids[r].size());  // one letter per token
    CHECK(full.finish[r] == nn::Finish::length);
  }
  // A stop string spanning tokens 4..6 of row 1; each row stops at its first occurrence, if any.
  o.stop_strings = {full.text[1].substr(4, 3)};
  const std::string& stop = o.stop_strings[0];
  std::vector<std::string> streamed(prompts.size());
  std::vector<std::vector<int64_t>> tokens(prompts.size());
  o.on_token = [&](size_t r, int64_t id) { tokens[r].push_back(id); };
  o.on_text = [&](size_t r, const std::string& piece) {
    streamed[r] += piece;
    CHECK(full.text[r].rfind(streamed[r], 0) == 0);
    CHECK(streamed[r].size() <= tokens[r].size());
  };
  for (const int64_t bs : {int64_t{0}, int64_t{1}}) {
    o.batch_size = bs;
    for (auto& x : streamed) x.clear();
    for (auto& x : tokens) x.clear();
    const nn::Generation g = nn::generate(*model, prompts, o);
    for (size_t r = 0; r < prompts.size(); ++r) {
      INFO("batch_size " << bs << ", row " << r << ": '" << full.text[r] << "', stop '" << stop << "'");
      const size_t at = full.text[r].find(stop);
      if (at == std::string::npos) {
        CHECK(g.ids[r] == full.ids[r]);
        CHECK(g.text[r] == full.text[r]);
        CHECK(g.finish[r] == nn::Finish::length);
      } else {
        CHECK(g.ids[r] == std::vector<int64_t>(full.ids[r].begin(), full.ids[r].begin() + static_cast<int64_t>(at + stop.size())));
        CHECK(g.text[r] == full.text[r].substr(0, at));
        CHECK(g.finish[r] == nn::Finish::stop_string);
      }
      CHECK(streamed[r] == g.text[r]);  // what was streamed: nothing of the stop string
    }
  }
  o.detokenizer = nullptr;
  CHECK(error_of([&] { nn::generate(*model, prompts, o); }).find("detokenizer") != std::string::npos);
}

// The last new token is never read back, so GPT-2's n_positions bounds prompt + new tokens - 1, as in
// transformers' generate (which runs a 64-position model to prompt 4 + 61 new tokens).
TEST_CASE("generate: learned positions bound the tokens read, not the last new one", "[hf]") {
  const auto model = hf::load_causal_lm<Cpu>(kFixtures + "gpt2");
  REQUIRE(model->max_positions() == 64);
  const std::vector<std::vector<int64_t>> prompt = {{5, 17, 3, 9}};
  const nn::Generation full = nn::generate(*model, prompt, {.max_new_tokens = 61});
  REQUIRE(full.ids[0].size() == 61);
  const nn::Generation part = nn::generate(*model, prompt, {.max_new_tokens = 20});
  CHECK(std::equal(part.ids[0].begin(), part.ids[0].end(), full.ids[0].begin()));  // greedy: the same first 20
  const std::string e = error_of([&] { nn::generate(*model, prompt, {.max_new_tokens = 62}); });
  CHECK(e.find("65 positions") != std::string::npos);
  CHECK(e.find("n_positions") != std::string::npos);
}

TEST_CASE("generate: stop strings on a byte-level BPE's text, inside a character split over tokens", "[hf]") {
  const text::Tokenizer tok = text::Tokenizer::load(std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/gpt2");
  const std::string text = "Hello w\xc3\xb6rld \xf0\x9f\x8e\x89, stop here: the end";  // "Hello wörld 🎉, stop here: the end"
  const std::vector<int32_t> ids = tok.encode(text, false);
  REQUIRE(tok.decode(ids) == text);
  for (const std::string& stop : {std::string("\xf0\x9f\x8e\x89, st"), std::string("re: the"), std::string("Hello")}) {
    const std::vector<std::string> stops{stop};
    nn::StopText st(stops);
    const auto detok = nn::detokenizer(tok)();
    std::string out;
    size_t last = ids.size();
    for (size_t i = 0; i < ids.size() && !st.stopped(); ++i) {
      out += st.push(detok->push(ids[i]));
      last = i;
    }
    size_t first = 0;  // the first token after which the decoded text holds the stop string
    while (tok.decode(std::span<const int32_t>(ids.data(), first + 1)).find(stop) == std::string::npos) ++first;
    INFO("stop '" << stop << "'");
    CHECK(st.stopped());
    CHECK(last == first);
    CHECK(out == text.substr(0, text.find(stop)));
  }
}

TEST_CASE("import: transformers 5's rope_parameters reads as transformers 4's rope_theta + rope_scaling", "[hf]") {
  const std::string dir = copy_fixture("llama3_bf16", "rope5");
  json c = read_json(dir + "/config.json");
  json p = c["rope_scaling"];
  p["rope_theta"] = c["rope_theta"];
  c.erase("rope_scaling");
  c.erase("rope_theta");
  c["rope_parameters"] = p;
  write_json(dir + "/config.json", c);
  const json e = read_json(kFixtures + "llama3_bf16/expected.json");
  const auto prompt = e["prompt"].get<std::vector<int64_t>>();
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(dir), prompt), e["logits"].get<std::vector<double>>()) < 1e-4);
  // Without the llama3 scaling the logits are different: the test can tell.
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", p["rope_theta"]}};
  write_json(dir + "/config.json", c);
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(dir), prompt), e["logits"].get<std::vector<double>>()) > 1e-3);
  fs::remove_all(dir);
}

// fixtures/yarn.json (make_fixtures.py): transformers 5.24's YaRN for rope_parameters whose correction range
// falls inside the head, so that truncate, beta_fast/beta_slow, mscale/mscale_all_dim and an explicit
// attention_factor each change the result. qwen3_yarn (in kModels) checks the logits of one.
TEST_CASE("import: YaRN's frequencies and attention factor are transformers' for each of its options", "[hf]") {
  const std::string dir = copy_fixture("qwen3_yarn", "yarn");
  json c = read_json(dir + "/config.json");
  c["max_position_embeddings"] = 8192;
  std::set<std::vector<float>> seen;
  for (const json& k : read_json(kFixtures + "yarn.json")) {
    INFO(k["rope_parameters"].dump());
    c["rope_parameters"] = k["rope_parameters"];
    write_json(dir + "/config.json", c);
    const auto model = hf::load_causal_lm<Cpu>(dir);
    const std::vector<double>& got = model->spec().inv_freq;
    const auto want = k["inv_freq"].get<std::vector<double>>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
    CHECK(model->spec().rope.attention_factor == Approx(k["attention_factor"].get<double>()).epsilon(1e-12));
    seen.insert(std::vector<float>(got.begin(), got.end()));
  }
  CHECK(seen.size() == 5);  // every option changed the frequencies; the last case (factor null: 8192 / 2048) is the first's
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 0.0}};
  write_json(dir + "/config.json", c);
  CHECK_THAT(load_error(dir), Catch::Contains("positive factor"));
  c["rope_parameters"] = {{"rope_type", "llama3"},  {"rope_theta", 10000.0},   {"factor", 4.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16},
                          {"truncate", true}};
  write_json(dir + "/config.json", c);
  CHECK_THAT(load_error(dir), Catch::Contains("'truncate' does not apply"));
  fs::remove_all(dir);
}

// The config classes' defaults where a field is absent: MistralConfig's sliding_window 4096, Qwen2Config's
// 4096 and max_window_layers 28 (with use_sliding_window); null: no window.
TEST_CASE("import: sliding windows take transformers' defaults for absent fields", "[hf]") {
  const std::string mistral = copy_fixture("mistral", "window-default"), qwen = copy_fixture("qwen2", "window-default");
  json m = read_json(mistral + "/config.json");
  m.erase("sliding_window");
  write_json(mistral + "/config.json", m);
  CHECK(hf::load_causal_lm<Cpu>(mistral)->spec().sliding_window == 4096);
  m["sliding_window"] = nullptr;
  write_json(mistral + "/config.json", m);
  CHECK(hf::load_causal_lm<Cpu>(mistral)->spec().sliding_window == 0);
  json q = read_json(qwen + "/config.json");
  q["use_sliding_window"] = true;
  q.erase("sliding_window");
  q.erase("max_window_layers");
  write_json(qwen + "/config.json", q);
  auto s = hf::load_causal_lm<Cpu>(qwen)->spec();
  CHECK(s.sliding_window == 4096);
  CHECK(s.sliding_layers == std::vector<bool>{false, false});  // from layer 28 on
  q["max_window_layers"] = 1;
  write_json(qwen + "/config.json", q);
  s = hf::load_causal_lm<Cpu>(qwen)->spec();
  CHECK(s.sliding_layers == std::vector<bool>{false, true});
  q["sliding_window"] = nullptr;
  write_json(qwen + "/config.json", q);
  CHECK(hf::load_causal_lm<Cpu>(qwen)->spec().sliding_window == 0);
  fs::remove_all(mistral);
  fs::remove_all(qwen);
}

TEST_CASE("import: bf16 parameters and bf16 autocast stay close to the f32 logits", "[hf]") {
  const json e = read_json(kFixtures + "llama/expected.json");
  const auto prompt = e["prompt"].get<std::vector<int64_t>>();
  const auto ref = e["logits"].get<std::vector<double>>();
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(kFixtures + "llama", {.dtype = DType::bf16}), prompt), ref) < 5e-2);
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(kFixtures + "llama", {.autocast = DType::bf16}), prompt), ref) < 5e-2);
}

TEST_CASE("generate: samplers are transformers' logits processors (repetition penalty, temperature, top-k, top-p)", "[hf]") {
  const json s = read_json(kFixtures + "samplers.json");
  const auto scores = s["scores"].get<std::vector<float>>();
  const auto history = s["history"].get<std::vector<int64_t>>();
  for (const json& c : s["cases"]) {
    nn::GenerateOptions o{.temperature = c["temperature"].get<double>(),
                          .top_k = c["top_k"].get<int64_t>(),
                          .top_p = c["top_p"].get<double>(),
                          .repetition_penalty = c["repetition_penalty"].get<double>()};
    std::vector<float> x = scores;
    nn::process_logits(x, history, o);
    INFO(c.dump());
    int kept = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const json& want = c["out"][i];
      if (want.is_null()) {
        CHECK(std::isinf(x[i]));
      } else {
        ++kept;
        CHECK(x[i] == Approx(want.get<double>()).epsilon(1e-6));
      }
    }
    CHECK(kept > 0);
  }
  // Sampling: the same seed gives the same ids; temperature -> 0 approaches greedy.
  const auto model = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  const std::vector<int64_t> prompt{5, 6, 7};
  nn::GenerateOptions o{.max_new_tokens = 10, .temperature = 1.0, .top_k = 20, .top_p = 0.9, .seed = 3};
  const auto a = nn::generate(*model, {prompt}, o), b = nn::generate(*model, {prompt}, o);
  CHECK(a.ids == b.ids);
  o.seed = 4;
  o.max_new_tokens = 30;
  const auto c = nn::generate(*model, {prompt}, o);
  o.seed = 3;
  CHECK(nn::generate(*model, {prompt}, o).ids != c.ids);
  o.temperature = 1e-4;
  const auto cold = nn::generate(*model, {prompt}, o);
  CHECK(cold.ids == nn::generate(*model, {prompt}, {.max_new_tokens = 30}).ids);
}

// Gemma3ForConditionalGeneration loads as its text model (the kModels cases check it against transformers);
// kiln cannot write it back or adapt it, and says why.
TEST_CASE("import: Gemma 3's multimodal checkpoints give their text model, and refuse export and LoRA", "[hf]") {
  auto model = hf::load_causal_lm<Cpu>(kFixtures + "gemma3_mm");
  CHECK(model->spec().architecture == "Gemma3ForConditionalGeneration");
  CHECK_THAT(error_of([&] { hf::save_pretrained(*model, (fs::temp_directory_path() / "kiln-never-written").string()); }),
             Catch::Contains("Gemma3ForConditionalGeneration cannot be written") && Catch::Contains("text model only"));
  CHECK_FALSE(fs::exists(fs::temp_directory_path() / "kiln-never-written"));
  CHECK_THAT(error_of([&] { nn::apply_lora(*model, {.r = 2}); }), Catch::Contains("LoRA on Gemma3ForConditionalGeneration"));
  const std::string dir = copy_fixture("gemma3_mm", "mm-tie");
  json c = read_json(dir + "/config.json");
  c["tie_word_embeddings"] = true;  // text_config says false
  write_json(dir + "/config.json", c);
  CHECK_THAT(load_error(dir), Catch::Contains("tie_word_embeddings is true but text_config's is false"));
  c["tie_word_embeddings"] = false;
  c["text_config"]["use_bidirectional_attention"] = true;
  write_json(dir + "/config.json", c);
  CHECK_THAT(load_error(dir), Catch::Contains("(text_config): field 'use_bidirectional_attention'"));
  fs::remove_all(dir);
}

// transformers builds the Llama family's embedding with padding_idx = pad_token_id: in a full fine-tune
// the pad token's row gets no gradient from its lookups (a tied head still sends it one).
TEST_CASE("import: the pad token's embedding row gets no gradient from lookups, as transformers' padding_idx", "[hf]") {
  for (const char* name : {"gemma2", "phi3", "llama"}) {  // pad_token_id 0, 0 and none
    DYNAMIC_SECTION(name) {
      auto model = hf::load_causal_lm<Cpu>(kFixtures + name);
      model->train();
      model->forward(Tensor<Cpu>::from_vector(std::vector<int64_t>{0, 5, 0, 9, 11}, {1, 5})).sum().backward();
      const auto params = model->named_parameters();
      const auto it = std::find_if(params.begin(), params.end(), [](const auto& p) { return p.first == "embed.weight"; });
      REQUIRE(it != params.end());
      const Tensor<Cpu> g = it->second.grad();
      const double pad_row = g.select(0, 0).abs().max().item<float>(), used_row = g.select(0, 5).abs().max().item<float>();
      CHECK(used_row > 0);
      if (std::string(name) == "llama")
        CHECK(pad_row > 0);  // no pad_token_id: an ordinary row
      else
        CHECK(pad_row == 0);
    }
  }
}

TEST_CASE("import: Gemma and Phi-3 configs in transformers 4's spelling give the same model", "[hf]") {
  // Each edit spells a fixture's config as older releases wrote it; the logits must not move.
  struct Case {
    const char* model;
    const char* what;
    std::function<void(json&)> edit;
  };
  const std::vector<Case> cases = {
      {"gemma", "hidden_act \"gelu\" (the first releases': the tanh GELU) and hidden_activation",
       [](json& c) {
         c["hidden_act"] = "gelu";
         c["hidden_activation"] = "gelu_pytorch_tanh";
       }},
      {"gemma3", "rope_theta, rope_scaling and rope_local_base_freq; sliding_window_pattern for layer_types",
       [](json& c) {
         c.erase("rope_parameters");
         c["rope_theta"] = 1000000.0;
         c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
         c["rope_local_base_freq"] = 10000.0;
         c.erase("layer_types");
         c["sliding_window_pattern"] = 2;  // layers 0 and 2 slide
       }},
      {"gemma2", "layer_types left to the default (every other layer)", [](json& c) { c.erase("layer_types"); }},
      {"phi3_longrope", "rope_scaling {\"type\": \"su\"} (the first Phi-3 releases') with rope_theta at the top level",
       [](json& c) {
         c["rope_scaling"] = c["rope_parameters"];
         c["rope_scaling"].erase("rope_type");
         c["rope_scaling"].erase("rope_theta");
         c["rope_scaling"].erase("partial_rotary_factor");
         c["rope_scaling"].erase("original_max_position_embeddings");  // the top-level field holds
         c["rope_scaling"]["type"] = "su";
         c.erase("rope_parameters");
         c["rope_theta"] = 10000.0;
       }},
      {"phi3", "partial_rotary_factor at the top level (transformers 4)",
       [](json& c) {
         c.erase("rope_parameters");
         c["rope_theta"] = 10000.0;
         c["partial_rotary_factor"] = 0.5;
       }},
  };
  int i = 0;
  for (const Case& k : cases) {
    DYNAMIC_SECTION(k.model << ": " << k.what) {
      const json e = read_json(kFixtures + k.model + "/expected.json");
      const std::string dir = copy_fixture(k.model, fmt::format("spell{}", i));
      json c = read_json(dir + "/config.json");
      k.edit(c);
      write_json(dir + "/config.json", c);
      const auto model = hf::load_causal_lm<Cpu>(dir);
      CHECK(rel_err(logits_of(*model, e["prompt"].get<std::vector<int64_t>>()), e["logits"].get<std::vector<double>>()) < 1e-4);
      fs::remove_all(dir);
    }
    ++i;
  }
  {  // An export keeps the source's spelling of an activation that means the same (Gemma 1's legacy "gelu")
    const std::string dir = copy_fixture("gemma", "spell-export");
    json c = read_json(dir + "/config.json");
    c["hidden_act"] = "gelu";
    write_json(dir + "/config.json", c);
    const std::string out = dir + "-out";
    hf::save_pretrained(*hf::load_causal_lm<Cpu>(dir), out);
    CHECK(read_json(out + "/config.json")["hidden_act"] == "gelu");
    fs::remove_all(dir);
    fs::remove_all(out);
  }
  // The same edits that change the model do move the logits (the checks above can fail).
  const json e = read_json(kFixtures + std::string("gemma3/expected.json"));
  const std::string dir = copy_fixture("gemma3", "spell-wrong");
  json c = read_json(dir + "/config.json");
  c["rope_parameters"]["sliding_attention"]["rope_theta"] = 1000000.0;  // the local RoPE as the global one's base
  write_json(dir + "/config.json", c);
  CHECK(rel_err(logits_of(*hf::load_causal_lm<Cpu>(dir), e["prompt"].get<std::vector<int64_t>>()), e["logits"].get<std::vector<double>>()) >
        1e-3);
  fs::remove_all(dir);
}

TEST_CASE("import: bad configs are errors naming config.json and the field", "[hf]") {
  struct Case {
    const char* model;
    std::function<void(json&)> edit;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"llama", [](json& c) { c["architectures"] = {"FalconForCausalLM"}; }, {"config.json", "FalconForCausalLM", "LlamaForCausalLM"}},
      {"llama", [](json& c) { c["attn_logit_softcapping"] = 30.0; }, {"config.json", "attn_logit_softcapping"}},
      {"llama",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
       },
       {"config.json", "rope_scaling", "dynamic"}},
      {"llama",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 4.0}};
       },
       {"rope_scaling", "low_freq_factor"}},
      {"llama", [](json& c) { c["hidden_act"] = "gelu_fast"; }, {"config.json", "hidden_act", "gelu_fast"}},
      {"llama", [](json& c) { c["num_key_value_heads"] = 3; }, {"config.json", "num_key_value_heads"}},
      {"llama", [](json& c) { c.erase("hidden_size"); }, {"config.json", "hidden_size", "required"}},
      {"llama",
       [](json& c) {
         c["layer_types"] = {"full_attention", "sliding_attention"};
       },
       {"layer_types", "no sliding-window layers"}},
      {"llama",
       [](json& c) {
         c["layer_types"] = {"full_attention", "chunked_attention"};
       },
       {"layer_types", "chunked_attention"}},
      {"llama", [](json& c) { c["layer_types"] = {"full_attention"}; }, {"layer_types", "2 layer types"}},
      {"mistral", [](json& c) { c["sliding_window"] = 0; }, {"config.json", "sliding_window", "positive"}},
      {"qwen2",
       [](json& c) {
         c["use_sliding_window"] = true;
         c["sliding_window"] = 0;
       },
       {"config.json", "use_sliding_window", "positive sliding_window"}},
      {"qwen3", [](json& c) { c["mlp_bias"] = true; }, {"config.json", "mlp_bias"}},
      {"gpt2", [](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; }, {"config.json", "scale_attn_by_inverse_layer_idx"}},
      {"gpt2", [](json& c) { c["activation_function"] = "gelu_fast"; }, {"activation_function", "gelu_fast"}},
      {"gpt2", [](json& c) { c["add_cross_attention"] = true; }, {"add_cross_attention"}},
      {"gemma", [](json& c) { c["hidden_activation"] = "relu"; }, {"config.json", "hidden_activation", "disagrees with hidden_act"}},
      {"gemma",
       [](json& c) {
         c["layer_types"] = {"full_attention", "sliding_attention"};
       },
       {"layer_types", "no sliding-window layers"}},
      {"gemma", [](json& c) { c["use_bidirectional_attention"] = true; }, {"use_bidirectional_attention", "causal LM"}},
      {"gemma2", [](json& c) { c["query_pre_attn_scalar"] = 0; }, {"query_pre_attn_scalar", "positive"}},
      {"gemma2", [](json& c) { c["attn_logit_softcapping"] = -1.0; }, {"attn_logit_softcapping", "positive"}},
      {"gemma3", [](json& c) { c["attn_logit_softcapping"] = 50.0; }, {"config.json", "attn_logit_softcapping", "does not apply"}},
      {"gemma3",
       [](json& c) {
         c["rope_parameters"] = {{"rope_type", "default"}};
       },
       {"rope_parameters", "full_attention"}},
      {"gemma3",
       [](json& c) {
         c["rope_parameters"]["chunked_attention"] = {{"rope_type", "default"}};
       },
       {"rope_parameters", "'chunked_attention' is no layer type"}},
      {"gemma3",
       [](json& c) {
         c["rope_parameters"]["sliding_attention"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
       },
       {"rope_parameters", "dynamic"}},
      {"gemma3", [](json& c) { c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 0.5; }, {"rope_parameters", "Phi-3"}},
      {"llama", [](json& c) { c["partial_rotary_factor"] = 0.5; }, {"partial_rotary_factor", "only Phi-3 has partial RoPE"}},
      {"phi3",
       [](json& c) {
         c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
       },
       {"rope_parameters", "\"longrope\" needs short_factor and long_factor"}},
      {"phi3",
       [](json& c) {
         c.erase("rope_parameters");
         c["rope_scaling"] = {{"type", "su"}, {"short_factor", {1.0, 1.0}}, {"long_factor", {2.0, 2.0}}};
       },
       {"config.json", "rope_scaling.short_factor", "has 2 factors", "8 of head_dim 8"}},
      {"phi3",
       [](json& c) {
         c["rope_parameters"] = {{"rope_type", "longrope"}, {"short_factor", {1.0, 1.0}}, {"long_factor", "x"}};
       },
       {"rope_parameters.long_factor", "list of numbers"}},
      {"llama",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"short_factor", {1.0}}};
       },
       {"rope_scaling", "'short_factor' does not apply"}},
      {"phi3",
       [](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.1; },
       {"config.json", "partial_rotary_factor 0.1", "even number"}},
      {"phi3", [](json& c) { c["partial_rotary_factor"] = 0.25; }, {"'partial_rotary_factor' (0.25)", "disagree"}},
      {"phi3_longrope",
       [](json& c) { c["original_max_position_embeddings"] = 0; },
       {"config.json", "original_max_position_embeddings", "positive"}},
      {"phi3_longrope",
       [](json& c) {
         c["rope_parameters"]["short_factor"] = {1.0, 0.0, 1.0, 1.0};
       },
       {"rope_parameters.short_factor", "positive factors"}},
  };
  int i = 0;
  for (const Case& k : cases) {
    const std::string dir = copy_fixture(k.model, fmt::format("cfg{}", i++));
    json c = read_json(dir + "/config.json");
    k.edit(c);
    write_json(dir + "/config.json", c);
    const std::string msg = load_error(dir);
    INFO(msg);
    for (const std::string& s : k.says) CHECK(msg.find(s) != std::string::npos);
    fs::remove_all(dir);
  }
}

TEST_CASE("import: missing, extra, mis-shaped, mis-tied tensors and broken files are errors naming the file and the tensor", "[hf]") {
  SECTION("missing") {
    const std::string dir = copy_fixture("llama", "missing");
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts.erase("model.layers.1.mlp.up_proj.weight"); });
    const std::string msg = load_error(dir);
    CHECK(msg.find("missing tensor 'model.layers.1.mlp.up_proj.weight'") != std::string::npos);
    fs::remove_all(dir);
  }
  SECTION("missing Qwen3 k_norm") {
    const std::string dir = copy_fixture("qwen3", "missing");
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts.erase("model.layers.0.self_attn.k_norm.weight"); });
    CHECK(load_error(dir).find("missing tensor 'model.layers.0.self_attn.k_norm.weight'") != std::string::npos);
    fs::remove_all(dir);
  }
  SECTION("extra") {
    const std::string dir = copy_fixture("gpt2", "extra");
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts["transformer.h.0.attn.q_norm.weight"] = Tensor<Cpu>::ones({8}); });
    const std::string msg = load_error(dir);
    CHECK(msg.find("transformer.h.0.attn.q_norm.weight") != std::string::npos);
    CHECK(msg.find("model.safetensors") != std::string::npos);
    fs::remove_all(dir);
  }
  SECTION("ignored buffers of old exports are no extra tensors") {
    const std::string dir = copy_fixture("gpt2", "buffers");
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts["transformer.h.0.attn.bias"] = Tensor<Cpu>::ones({1, 1, 4, 4}); });
    CHECK(load_error(dir) == "(no error)");
    fs::remove_all(dir);
  }
  SECTION("mis-shaped") {
    const std::string dir = copy_fixture("qwen2", "shape");
    const json idx = read_json(dir + "/model.safetensors.index.json");
    const std::string shard = dir + "/" + idx["weight_map"]["model.layers.0.self_attn.k_proj.bias"].get<std::string>();
    rewrite(shard, [](auto& ts) { ts["model.layers.0.self_attn.k_proj.bias"] = Tensor<Cpu>::zeros({12}); });
    const std::string msg = load_error(dir);
    CHECK(msg.find("model.layers.0.self_attn.k_proj.bias") != std::string::npos);
    CHECK(msg.find("[12]") != std::string::npos);
    CHECK(msg.find("[16]") != std::string::npos);
    fs::remove_all(dir);
  }
  SECTION("untied head without lm_head, tied head with a different lm_head") {
    std::string dir = copy_fixture("llama", "untied");
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts.erase("lm_head.weight"); });
    CHECK(load_error(dir).find("missing tensor 'lm_head.weight'") != std::string::npos);
    fs::remove_all(dir);
    dir = copy_fixture("llama3_bf16", "tied");
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts["lm_head.weight"] = ts.at("model.embed_tokens.weight").mul(2.0); });
    std::string msg = load_error(dir);
    CHECK(msg.find("tie_word_embeddings") != std::string::npos);
    CHECK(msg.find("lm_head.weight") != std::string::npos);
    rewrite(dir + "/model.safetensors", [](auto& ts) { ts["lm_head.weight"] = ts.at("model.embed_tokens.weight"); });
    CHECK(load_error(dir) == "(no error)");  // an equal copy is fine
    fs::remove_all(dir);
  }
  SECTION("truncated weights") {
    const std::string dir = copy_fixture("llama", "trunc");
    fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 100);
    CHECK(load_error(dir).find("model.safetensors") != std::string::npos);
    fs::remove_all(dir);
  }
  SECTION("sharded: a missing shard, a tensor the index misplaces") {
    std::string dir = copy_fixture("qwen2", "shard");
    fs::remove(dir + "/model-00002-of-00004.safetensors");
    std::string msg = load_error(dir);
    CHECK(msg.find("model-00002-of-00004.safetensors") != std::string::npos);
    CHECK(msg.find("missing") != std::string::npos);
    fs::remove_all(dir);
    dir = copy_fixture("qwen2", "index");
    json idx = read_json(dir + "/model.safetensors.index.json");
    const std::string old = idx["weight_map"]["model.norm.weight"];
    idx["weight_map"]["model.norm.weight"] =
        old == "model-00001-of-00004.safetensors" ? "model-00002-of-00004.safetensors" : "model-00001-of-00004.safetensors";
    write_json(dir + "/model.safetensors.index.json", idx);
    msg = load_error(dir);
    CHECK(msg.find("model.norm.weight") != std::string::npos);
    fs::remove_all(dir);
  }
  SECTION("bad JSON, no weights") {
    std::string dir = copy_fixture("llama", "json");
    std::ofstream(dir + "/config.json") << "{\"architectures\": [\"LlamaForCausalLM\"";
    CHECK(load_error(dir).find("config.json") != std::string::npos);
    fs::remove_all(dir);
    dir = copy_fixture("llama", "noweights");
    fs::remove(dir + "/model.safetensors");
    CHECK(load_error(dir).find("neither model.safetensors nor") != std::string::npos);
    fs::remove_all(dir);
  }
}

TEST_CASE("cli: kiln generate MODEL_DIR --print-ids prints transformers' greedy ids as its last line", "[hf]") {
  for (const char* name : {"gpt2", "qwen2"}) {
    const json e = read_json(kFixtures + name + "/expected.json");
    const std::string out =
        run(fmt::format("{} generate {}{} --prompt-ids {} --max-new-tokens {} --temperature 0 --print-ids 2>&1", KILN_CLI, kFixtures, name,
                        fmt::join(e["prompt"].get<std::vector<int64_t>>(), ","), e["max_new_tokens"].get<int64_t>()));
    INFO(out);
    CHECK(out.rfind("status 0", 0) == 0);
    CHECK(out.find("Hugging Face") != std::string::npos);
    CHECK(out.find("tokens/s") != std::string::npos);
    CHECK(last_line(out) == fmt::format("{}", fmt::join(e["greedy"].get<std::vector<int64_t>>(), ",")));
  }
  // A batch: one line per prompt.
  const json e = read_json(kFixtures + "llama/expected.json");
  std::string flags;
  for (const auto& p : e["batch"]["prompts"]) flags += fmt::format(" --prompt-ids {}", fmt::join(p.get<std::vector<int64_t>>(), ","));
  const std::string out = run(fmt::format("{} generate {}llama{} --max-new-tokens 12 --print-ids 2>/dev/null", KILN_CLI, kFixtures, flags));
  std::string want = "status 0\n";
  for (const auto& g : e["batch"]["greedy"]) want += fmt::format("{}\n", fmt::join(g.get<std::vector<int64_t>>(), ","));
  CHECK(out == want);
  const std::string bad = run(fmt::format("{} generate {}llama --prompt-ids 1,x 2>&1", KILN_CLI, kFixtures));
  CHECK(bad.rfind("status 1", 0) == 0);
  CHECK(bad.find("--prompt-ids") != std::string::npos);
}

TEST_CASE("cli: kiln generate takes a kiln checkpoint too, and says which it found", "[hf]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-hf-{}-ckpt", ::getpid());
  fs::create_directories(dir);
  {
    std::ofstream t(dir / "c.txt");
    for (int i = 0; i < 100; ++i) t << "hello world, the quick brown fox " << i << "\n";
  }
  std::ofstream(dir / "m.json") << R"({"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32})";
  std::ofstream(dir / "t.json") << R"({"steps": 2, "batch_size": 2, "seq_len": 16})";
  const std::string d = dir.string();
  REQUIRE(run(fmt::format("{} tokenize --text {}/c.txt --out {}/t.safetensors 2>&1", KILN_CLI, d, d)).rfind("status 0", 0) == 0);
  REQUIRE(
      run(fmt::format("{} train --model {}/m.json --train {}/t.json --data {}/t.safetensors --checkpoint {}/checkpoint.safetensors 2>&1",
                      KILN_CLI, d, d, d, d))
          .rfind("status 0", 0) == 0);
  const std::string out = run(fmt::format("{} generate {} --prompt-ids 104,101 --max-new-tokens 5 --print-ids 2>&1", KILN_CLI, d));
  INFO(out);
  CHECK(out.rfind("status 0", 0) == 0);
  CHECK(out.find("kiln checkpoint") != std::string::npos);
  // The same ids as the library's greedy generation on the same checkpoint.
  const auto model = load_gpt<Cpu>(d + "/checkpoint.safetensors");
  const auto g = nn::generate(*model, {{104, 101}}, {.max_new_tokens = 5});
  CHECK(last_line(out) == fmt::format("{}", fmt::join(g.ids[0], ",")));
  // Past max_seq_len: an error naming it.
  CHECK(error_of([&] { nn::generate(*model, {{104, 101}}, {.max_new_tokens = 32}); }).find("max_seq_len") != std::string::npos);
  CHECK(nn::generate(*model, {{104, 101}}, {.max_new_tokens = 31}).ids[0].size() == 31);  // 32 positions read
  const std::string text = run(fmt::format("{} generate {} --prompt hello --max-new-tokens 8 2>/dev/null", KILN_CLI, d));
  CHECK(text.rfind("status 0\nhello", 0) == 0);
  fs::remove_all(dir);
}

TEST_CASE("cli: kiln generate --prompt tokenizes with the model's own tokenizer and prints the decoded continuation", "[hf]") {
  // The gpt2 fixture with the byte-level BPE of tests/text (vocabulary 802 with its two special tokens):
  // the embedding (tied head) regrown to that vocabulary with random rows.
  const std::string dir = copy_fixture("gpt2", "prompt");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(std::string(KILN_SOURCE_DIR) + "/tests/text/fixtures/gpt2/" + f, fs::path(dir) / f);
  const text::Tokenizer tok = text::Tokenizer::load(dir);
  const int64_t V = tok.vocab_size();
  json cfg = read_json(dir + "/config.json");
  cfg["vocab_size"] = V;
  cfg.erase("eos_token_id");
  cfg.erase("bos_token_id");
  write_json(dir + "/config.json", cfg);
  fs::remove(fs::path(dir) / "generation_config.json");
  rewrite(dir + "/model.safetensors", [&](std::map<std::string, Tensor<Cpu>>& ts) {
    for (auto& [name, t] : ts)
      if (name.find("wte") != std::string::npos) {
        Generator g(3);
        t = Tensor<Cpu>::randn({V, t.size(1)}, DType::f32, &g).mul(0.5);
      }
  });
  const std::string prompt = "Hello wörld, 你好";
  const std::vector<int32_t> ids32 = tok.encode(prompt);
  const std::vector<int64_t> ids(ids32.begin(), ids32.end());
  const std::string by_ids = run(fmt::format("{} generate {} --prompt-ids {} --max-new-tokens 12 --temperature 0 --print-ids 2>/dev/null",
                                             KILN_CLI, dir, fmt::join(ids, ",")));
  REQUIRE(by_ids.rfind("status 0", 0) == 0);
  std::vector<int32_t> gen;
  std::stringstream ss(last_line(by_ids));
  for (std::string x; std::getline(ss, x, ',');) gen.push_back(std::stoi(x));
  REQUIRE(gen.size() == 12);
  // --prompt: the same ids (the tokenizer's encode), the prompt then the decoded continuation.
  const std::string by_text =
      run(fmt::format("{} generate {} --prompt '{}' --max-new-tokens 12 --temperature 0 2>/dev/null", KILN_CLI, dir, prompt));
  CHECK(by_text == fmt::format("status 0\n{}{}\n", prompt, tok.decode(gen)));
  const std::string both =
      run(fmt::format("{} generate {} --prompt '{}' --max-new-tokens 12 --temperature 0 --print-ids 2>/dev/null", KILN_CLI, dir, prompt));
  CHECK(last_line(both) == last_line(by_ids));
  // --stop: the continuation before the stop string (neither it nor the rest printed); with --print-ids
  // the ids up to the token that completes it. A stop string of two characters from the middle of it.
  const std::string cont = tok.decode(gen);
  std::string stop;
  for (size_t p = cont.size() / 2; p < cont.size() && stop.empty(); ++p) {
    auto next = [&](size_t i) {  // one past the UTF-8 character at i
      ++i;
      while (i < cont.size() && (static_cast<unsigned char>(cont[i]) & 0xC0) == 0x80) ++i;
      return i;
    };
    if ((static_cast<unsigned char>(cont[p]) & 0xC0) == 0x80) continue;
    const std::string c = cont.substr(p, next(next(p)) - p);
    if (c.find_first_of("'\\\n\r\t") == std::string::npos && c.size() >= 2) stop = c;
  }
  REQUIRE(!stop.empty());
  size_t k = 0;
  while (tok.decode(std::span<const int32_t>(gen.data(), k + 1)).find(stop) == std::string::npos) ++k;
  INFO("continuation '" << cont << "', stop '" << stop << "'");
  const std::string stopped = run(
      fmt::format("{} generate {} --prompt '{}' --max-new-tokens 12 --temperature 0 --stop '{}' 2>/dev/null", KILN_CLI, dir, prompt, stop));
  CHECK(stopped == fmt::format("status 0\n{}{}\n", prompt, cont.substr(0, cont.find(stop))));
  const std::string stopped_ids =
      run(fmt::format("{} generate {} --prompt-ids {} --max-new-tokens 12 --temperature 0 --stop '{}' --stop "
                      "zzzz --print-ids 2>/dev/null",
                      KILN_CLI, dir, fmt::join(ids, ","), stop));
  CHECK(last_line(stopped_ids) ==
        fmt::format("{}", fmt::join(std::vector<int32_t>(gen.begin(), gen.begin() + static_cast<int64_t>(k) + 1), ",")));
  // --stop on a directory without a tokenizer: an error that says so.
  const std::string no_tok = run(fmt::format("{} generate {}llama --prompt-ids 1,2 --stop x 2>&1", KILN_CLI, kFixtures));
  CHECK(no_tok.rfind("status 1", 0) == 0);
  CHECK(no_tok.find("--stop") != std::string::npos);
  fs::remove_all(dir);
}
