// LoRA (nn/lora.hpp) against PEFT 0.13.2 on PyTorch: the fixtures of tests/lora/make_fixtures.py (a tiny
// random Llama with GQA, a tiny GPT-2 with its fused c_attn and its Conv1D modules; adapters with random non-zero A and B).
// From the same base and initial adapter, three AdamW steps give PEFT's losses within 1e-5 and its
// adapter weights within 1e-4 (f32); logits with the adapter and after merge equal PEFT's; frozen
// weights get no gradient and no optimizer state; bad input is a kiln::Error naming what is wrong.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/container.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/lora.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include "common/kiln_test.hpp"
#include "common/run.hpp"

using namespace kiln;
using kt::error_of;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kFixtures = std::string(KILN_SOURCE_DIR) + "/tests/lora/fixtures/";

json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return json::parse(f);
}

// A temporary directory removed when the test case ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) : path(fs::temp_directory_path() / fmt::format("kiln-lora-{}-{}", ::getpid(), tag)) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

Tensor<Cpu> ids_tensor(const json& e) {
  std::vector<int64_t> ids;
  for (const auto& row : e["ids"])
    for (const auto& v : row) ids.push_back(v.get<int64_t>());
  return Tensor<Cpu>::from_vector(ids, {static_cast<int64_t>(e["ids"].size()), static_cast<int64_t>(e["ids"][0].size())});
}

// Hugging Face's causal LM loss: logits[:, :-1] against ids[:, 1:], mean over every position.
Var<Cpu> lm_loss(const hf::CausalLM<Cpu>& m, const Tensor<Cpu>& ids) {
  const int64_t Bn = ids.size(0), T = ids.size(1);
  const Var<Cpu> logits = m.forward(ids);
  const Var<Cpu> l = logits.narrow(1, 0, T - 1).reshape({Bn * (T - 1), -1});
  return nn::cross_entropy(l, ids.narrow(1, 1, T - 1).contiguous().reshape({Bn * (T - 1)}));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

std::vector<float> first_row_logits(const hf::CausalLM<Cpu>& m, const Tensor<Cpu>& ids) {
  NoGrad ng;
  return to_vector<float>(m.forward(ids.narrow(0, 0, 1).contiguous()).value());
}

const char* const kCases[] = {"llama_qv", "llama_mlp_regex", "gpt2_conv1d", "gpt2_c_attn", "phi3_qkv_gate_up"};

}  // namespace

TEST_CASE("lora: three AdamW steps match PEFT (losses 1e-5, adapter weights 1e-4) cpu", "[lora]") {
  for (const char* c : kCases) {
    DYNAMIC_SECTION(c) {
      const std::string dir = kFixtures + c;
      const json e = read_json(dir + "/expected.json");
      auto model = hf::load_causal_lm<Cpu>(kFixtures + e["base"].get<std::string>());
      nn::load_lora(*model, dir + "/adapter_init");
      const Tensor<Cpu> ids = ids_tensor(e);
      model->eval();
      CHECK(max_abs_diff(first_row_logits(*model, ids), doubles(e["logits_init"])) < 1e-5);
      model->train();
      optim::AdamW<Cpu> opt(model->named_parameters(), {.lr = e["lr"].get<double>(), .weight_decay = e["weight_decay"].get<double>()});
      const auto want = doubles(e["losses"]);
      for (size_t s = 0; s < want.size(); ++s) {
        opt.zero_grad();
        Var<Cpu> loss = lm_loss(*model, ids);
        loss.backward();
        opt.step();
        const double got = to_vector<float>(loss.value())[0];
        INFO("step " << s << ": kiln " << got << " PEFT " << want[s]);
        CHECK(std::abs(got - want[s]) < 1e-5);
      }
      // Frozen weights: no gradient, no optimizer state; every adapter tensor has both.
      int64_t adapters = 0;
      for (const auto& [name, p] : model->named_parameters()) {
        const bool lora = name.find(".lora_") != std::string::npos;
        INFO(name);
        CHECK(p.requires_grad() == lora);
        CHECK(p.grad().defined() == lora);
        adapters += lora;
      }
      for (const auto& [name, t] : opt.state_dict()) {
        INFO(name);
        CHECK((name == "step" || name.find(".lora_") != std::string::npos));
      }
      CHECK(adapters > 0);
      const auto final_ = safetensors::load<Cpu>(dir + "/adapter_final/adapter_model.safetensors");
      const auto got = nn::lora_state_dict(*model);
      REQUIRE(got.size() == final_.size());
      for (const auto& [name, t] : got) {
        INFO(name);
        REQUIRE(final_.count(name) == 1);
        const auto a = to_vector<float>(t);
        const auto b = to_vector<double>(final_.at(name));
        CHECK(max_abs_diff(a, b) < 1e-4);
      }
    }
  }
}

TEST_CASE("lora: merge gives PEFT's merged logits and the base parameter names cpu", "[lora]") {
  for (const char* c : kCases) {
    DYNAMIC_SECTION(c) {
      const std::string dir = kFixtures + c;
      const json e = read_json(dir + "/expected.json");
      auto base = hf::load_causal_lm<Cpu>(kFixtures + e["base"].get<std::string>());
      auto model = hf::load_causal_lm<Cpu>(kFixtures + e["base"].get<std::string>());
      nn::load_lora(*model, dir + "/adapter_init");
      model->eval();
      const Tensor<Cpu> ids = ids_tensor(e);
      const auto unmerged = first_row_logits(*model, ids);
      nn::merge_lora(*model);
      const auto merged = first_row_logits(*model, ids);
      CHECK(max_abs_diff(merged, doubles(e["logits_merged"])) < 1e-5);
      std::vector<double> u(unmerged.begin(), unmerged.end());
      CHECK(max_abs_diff(merged, u) < 1e-5);
      std::vector<std::string> names, base_names;
      for (const auto& [n, t] : model->state_dict()) names.push_back(n);
      for (const auto& [n, t] : base->state_dict()) base_names.push_back(n);
      CHECK(names == base_names);
      CHECK(nn::lora_adapters(*model).empty());
    }
  }
}

TEST_CASE("lora: save_lora writes PEFT's layout and loads back to identical tensors cpu", "[lora]") {
  TempDir tmp("save");
  auto model = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  const auto paths = nn::load_lora(*model, kFixtures + "llama_qv/adapter_init");
  CHECK(paths == std::vector<std::string>{"layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.q_proj", "layers.1.attn.v_proj"});
  nn::save_lora(*model, tmp.str());
  // The same tensors under the same names as PEFT's own file (q_proj's lora_B rows back in the
  // checkpoint's head layout).
  const auto peft = safetensors::load<Cpu>(kFixtures + "llama_qv/adapter_init/adapter_model.safetensors");
  const auto ours = safetensors::load<Cpu>(tmp.str() + "/adapter_model.safetensors");
  REQUIRE(ours.size() == peft.size());
  for (const auto& [name, t] : peft) {
    INFO(name);
    REQUIRE(ours.count(name) == 1);
    CHECK(to_vector<float>(ours.at(name)) == to_vector<float>(t));
  }
  const json c = read_json(tmp.str() + "/adapter_config.json");
  CHECK(c["peft_type"] == "LORA");
  CHECK(c["task_type"] == "CAUSAL_LM");
  CHECK(c["r"] == 4);
  CHECK(c["lora_alpha"] == 8.0);
  CHECK(c["target_modules"] == json({"q_proj", "v_proj"}));
  CHECK(c["fan_in_fan_out"] == false);
  // Loads back into a fresh model: the same adapter tensors.
  auto again = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  nn::load_lora(*again, tmp.str());
  const auto a = nn::lora_state_dict(*model), b = nn::lora_state_dict(*again);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(to_vector<float>(a[i].second) == to_vector<float>(b[i].second));
  // GPT-2's Conv1D modules are fan_in_fan_out in PEFT.
  auto gpt2 = hf::load_causal_lm<Cpu>(kFixtures + "gpt2");
  nn::load_lora(*gpt2, kFixtures + "gpt2_conv1d/adapter_init");
  TempDir tmp2("save-gpt2");
  nn::save_lora(*gpt2, tmp2.str());
  CHECK(read_json(tmp2.str() + "/adapter_config.json")["fan_in_fan_out"] == true);
}

TEST_CASE("lora: globs match whole paths, names match last components, as PEFT cpu", "[lora]") {
  auto a = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  auto b = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  const auto from_regex = nn::load_lora(*a, kFixtures + "llama_mlp_regex/adapter_init");
  const auto from_glob = nn::apply_lora(*b, {.r = 4, .alpha = 8, .target_modules = {"*.mlp.*_proj"}});
  CHECK(from_regex == from_glob);
  CHECK(from_glob.size() == 6);
  // A glob is saved as the equivalent regex (PEFT reads a list as names): it selects the same modules.
  TempDir tmp("glob");
  nn::save_lora(*b, tmp.str());
  const json c = read_json(tmp.str() + "/adapter_config.json");
  REQUIRE(c["target_modules"].is_string());
  auto d = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  CHECK(nn::load_lora(*d, tmp.str()) == from_glob);
  // Bracket sets (a range, '!' negating) and a quoted character: the saved regex selects what fnmatch did.
  for (const char* glob : {"*.[1].self_attn.[!k]_proj", "model.layers.[0-9].mlp.[dg]*_proj", R"(*.[\!]q_proj)", "*\\.q_proj"}) {
    auto f = hf::load_causal_lm<Cpu>(kFixtures + "llama");
    std::vector<std::string> picked;
    try {
      picked = nn::apply_lora(*f, {.r = 2, .target_modules = {glob}});
    } catch (const Error&) {  // matches no module: the regex must not either
    }
    CAPTURE(glob, picked);
    if (picked.empty()) continue;
    TempDir dir("bracket");
    nn::save_lora(*f, dir.str());
    auto g = hf::load_causal_lm<Cpu>(kFixtures + "llama");
    CHECK(nn::load_lora(*g, dir.str()) == picked);
  }
  auto sets = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  CHECK(nn::apply_lora(*sets, {.r = 2, .target_modules = {"*.[1].self_attn.[!k]_proj"}}) ==
        std::vector<std::string>{"layers.1.attn.q_proj", "layers.1.attn.v_proj", "layers.1.attn.o_proj"});
  // A dotted suffix: only layer 1's q_proj.
  auto e = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  CHECK(nn::apply_lora(*e, {.r = 2, .target_modules = {"1.self_attn.q_proj"}}) == std::vector<std::string>{"layers.1.attn.q_proj"});
}

// target_regex is Python's re.fullmatch (PEFT's check_target_module_exists): PCRE2 reads the Perl-style
// syntax Python has and ECMAScript (std::regex) lacks: lookbehind, (?P<name>...) groups, \Z. A partial
// match selects nothing; a pattern that does not compile is an error naming it.
TEST_CASE("lora: target_regex is a full match in Python's regex syntax cpu", "[lora]") {
  const std::vector<std::string> qv = {"layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.q_proj", "layers.1.attn.v_proj"};
  for (const char* re :
       {R"(model\.layers\.\d+\.self_attn\.[qv]_proj)", R"(.*(?<=self_attn\.)(?P<which>q|v)_proj\Z)", R"((?i).*SELF_ATTN\.(Q|V)_PROJ)"}) {
    auto m = hf::load_causal_lm<Cpu>(kFixtures + "llama");
    CHECK(nn::apply_lora(*m, {.r = 2, .target_regex = re}) == qv);
  }
  // re.fullmatch("q_proj", "model.layers.0.self_attn.q_proj") is None: a regex is no name, and a match
  // of the path's beginning is none either.
  for (const char* re : {"q_proj", R"(.*self_attn\.q)"})
    CHECK_THAT(error_of([&] { nn::apply_lora(*hf::load_causal_lm<Cpu>(kFixtures + "llama"), {.r = 2, .target_regex = re}); }),
               Catch::Contains(fmt::format("regex '{}' matches no module", re)));
  // The first alternative matches a beginning of the path; the match goes on to the one that ends it.
  auto m = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  CHECK(nn::apply_lora(*m, {.r = 2, .target_regex = R"(.*\.q|.*\.q_proj)"}) ==
        std::vector<std::string>{"layers.0.attn.q_proj", "layers.1.attn.q_proj"});
  CHECK_THAT(error_of([&] { nn::apply_lora(*hf::load_causal_lm<Cpu>(kFixtures + "llama"), {.r = 2, .target_regex = "(q|v_proj"}); }),
             Catch::Contains(
                 "apply_lora: target_regex: the regex '(q|v_proj' does not compile (PCRE2, at offset 9): missing closing parenthesis"));
}

// No targets given: PEFT's default for the model type (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING,
// read in PEFT 0.21.2): GPT-2's fused c_attn, Llama's q_proj and v_proj; kiln's own GPT: q_proj, v_proj.
TEST_CASE("lora: without targets, apply_lora takes PEFT's defaults for the model type cpu", "[lora]") {
  auto gpt2 = hf::load_causal_lm<Cpu>(kFixtures + "gpt2");
  CHECK(nn::default_lora_targets(*gpt2) == std::vector<std::string>{"c_attn"});
  CHECK(nn::apply_lora(*gpt2, {.r = 2}) == std::vector<std::string>{"layers.0.attn.q_proj", "layers.0.attn.k_proj", "layers.0.attn.v_proj",
                                                                    "layers.1.attn.q_proj", "layers.1.attn.k_proj",
                                                                    "layers.1.attn.v_proj"});
  TempDir tmp("defaults");
  nn::save_lora(*gpt2, tmp.str());
  CHECK(read_json(tmp.str() + "/adapter_config.json")["target_modules"] == json({"c_attn"}));
  auto llama = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  CHECK(nn::apply_lora(*llama, {.r = 2}) ==
        std::vector<std::string>{"layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.q_proj", "layers.1.attn.v_proj"});
  nn::GPT<Cpu> own(ModelConfig{.vocab_size = 16, .d_model = 16, .n_layers = 1, .n_heads = 2, .max_seq_len = 8});
  CHECK(nn::apply_lora(own, {.r = 2}) == std::vector<std::string>{"layers.0.attn.q_proj", "layers.0.attn.v_proj"});
  // A model without those names says that the defaults were taken.
  nn::Sequential<Cpu> mlp;
  mlp.push_back("fc", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 4, .out = 4}));
  CHECK_THAT(error_of([&] { nn::apply_lora(mlp, {.r = 2}); }),
             Catch::Contains("[q_proj, v_proj] matches no module") && Catch::Contains("default targets"));
  CHECK_THAT(error_of([&] {
               nn::apply_lora(*hf::load_causal_lm<Cpu>(kFixtures + "llama"), {.target_modules = {"q_proj"}, .target_regex = ".*"});
             }),
             Catch::Contains("not both"));
}

// Phi-3 (PEFT has no default targets for it: neither has kiln). Its fused modules against PEFT: the
// phi3_qkv_gate_up case of kCases. Here: gate_up_proj's adapter merges to the adapted model's logits.
TEST_CASE("lora: Phi-3's fused gate_up_proj is adapted and merged, default targets are refused", "[lora]") {
  const std::string phi3 = std::string(KILN_SOURCE_DIR) + "/tests/hf/fixtures/phi3";
  auto model = hf::load_causal_lm<Cpu>(phi3);
  CHECK_THAT(error_of([&] { nn::apply_lora(*model, {.r = 2}); }), Catch::Contains("no default target modules for Phi3ForCausalLM"));
  CHECK(nn::apply_lora(*model, {.r = 2, .target_modules = {"gate_up_proj"}}) ==
        std::vector<std::string>{"layers.0.mlp.gate_proj", "layers.0.mlp.up_proj", "layers.1.mlp.gate_proj", "layers.1.mlp.up_proj"});
  Generator g(3);
  for (auto& [name, p] : model->named_parameters())
    if (name.find("lora_B") != std::string::npos) {
      Tensor<Cpu> w = p.value();
      w.copy_(Tensor<Cpu>::randn(p.shape(), DType::f32, &g).mul(0.3));
    }
  const Tensor<Cpu> ids = Tensor<Cpu>::from_vector(std::vector<int64_t>{5, 9, 11, 40, 41}, {1, 5});
  NoGrad ng;
  const auto adapted = model->forward(ids).value().to_vector<float>(),
             base = hf::load_causal_lm<Cpu>(phi3)->forward(ids).value().to_vector<float>();
  nn::merge_lora(*model);
  const auto merged = model->forward(ids).value().to_vector<float>();
  double moved = 0, diff = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    moved = std::max(moved, static_cast<double>(std::abs(adapted[i] - base[i])));
    diff = std::max(diff, static_cast<double>(std::abs(adapted[i] - merged[i])));
  }
  CHECK(moved > 0.1);
  CHECK(diff < 1e-4);
}

// PEFT saves lm_head's base weight beside an adapter on it (save_embedding_layers) and loads it into the
// model: so does load_lora. A head tied to the embedding has no lm_head Linear in kiln: naming it is an error.
TEST_CASE("lora: lm_head base weight in an adapter file (PEFT save_embedding_layers) is loaded, a tied head is refused cpu", "[lora]") {
  const auto head = [](const nn::Module<Cpu>& m) {
    for (const auto& [n, p] : m.named_parameters())
      if (n == "lm_head.weight") return p.value();
    FAIL("no lm_head.weight");
    return Tensor<Cpu>();
  };
  auto model = hf::load_causal_lm<Cpu>(kFixtures + "llama");  // untied
  nn::apply_lora(*model, {.r = 2, .target_modules = {"lm_head", "q_proj"}});
  TempDir tmp("base-layer");
  nn::save_lora(*model, tmp.str());
  const std::string file = tmp.str() + "/adapter_model.safetensors";
  const auto saved = safetensors::load<Cpu>(file);
  const Tensor<Cpu> changed = head(*model).add(0.5);
  const auto write = [&](const Tensor<Cpu>& base_layer) {
    std::vector<std::pair<std::string, Tensor<Cpu>>> ts(saved.begin(), saved.end());
    ts.emplace_back("base_model.model.lm_head.base_layer.weight", base_layer);
    safetensors::save<Cpu>(file, ts, {{"format", "pt"}});
  };
  write(changed);
  auto loaded = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  REQUIRE(nn::load_lora(*loaded, tmp.str()).size() == 3);
  CHECK(max_abs_diff(to_vector<float>(head(*loaded)), to_vector<double>(changed.to(DType::f64))) == 0);
  write(Tensor<Cpu>::zeros({3, 3}));
  auto other = hf::load_causal_lm<Cpu>(kFixtures + "llama");
  const Tensor<Cpu> before = head(*other).clone();
  CHECK_THAT(error_of([&] { nn::load_lora(*other, tmp.str()); }),
             Catch::Contains("lm_head.base_layer.weight' is [3, 3]") && Catch::Contains("[64, 32]"));
  CHECK(max_abs_diff(to_vector<float>(head(*other)), to_vector<double>(before.to(DType::f64))) == 0);  // left as it was
  auto tied = hf::load_causal_lm<Cpu>(kFixtures + "gpt2");
  CHECK_THAT(error_of([&] {
               nn::apply_lora(*tied, {.r = 2, .target_modules = {"lm_head", "c_attn"}});
             }),
             Catch::Contains("'lm_head' matches no module") && Catch::Contains("tie_word_embeddings"));
}

TEST_CASE("lora: a user model: y = x W^T + b + scaling * B A x, gradients by finite differences, frozen base cpu", "[lora]") {
  nn::Sequential<Cpu> net;
  net.push_back("fc1", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 5, .out = 4}));
  net.push_back("fc2", std::make_shared<nn::Linear<Cpu>>(nn::LinearOptions{.in = 4, .out = 3}));
  net.to(DType::f64);
  const auto paths = nn::apply_lora(net, {.r = 2, .alpha = 3, .target_modules = {"fc1"}, .use_rslora = true});
  REQUIRE(paths == std::vector<std::string>{"fc1"});
  auto [name, ad] = nn::lora_adapters(net)[0];
  CHECK(ad->scaling() == Approx(3 / std::sqrt(2.0)));
  CHECK(to_vector<double>(ad->lora_B().weight().value()) == std::vector<double>(8, 0.0));  // B starts at zero
  // Non-zero B, then the formula, computed here from the parts.
  Tensor<Cpu> bw = ad->lora_B().weight().value();
  bw.copy_(Tensor<Cpu>::randn({4, 2}, DType::f64));
  const Tensor<Cpu> x = Tensor<Cpu>::randn({3, 5}, DType::f64);
  auto* fc1 = dynamic_cast<nn::Linear<Cpu>*>(const_cast<nn::Module<Cpu>*>(net.named_modules()[1].second));
  REQUIRE(fc1 != nullptr);
  const Tensor<Cpu> W = fc1->weight().value(), b = fc1->bias().value(), A = ad->lora_A().weight().value();
  const Tensor<Cpu> want = x.matmul(W.t()).add(b).add(x.matmul(A.t()).matmul(bw.t()).mul(ad->scaling()));
  const Tensor<Cpu> got = fc1->forward(Var<Cpu>(x)).value();
  const auto g = to_vector<double>(got), w = to_vector<double>(want);
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(w[i]).epsilon(1e-12));
  // d/dx through the adapter, by central differences.
  const auto r = gradcheck<Cpu>([&](const std::vector<Var<Cpu>>& v) { return net.forward(v[0]).sum(); }, {x});
  CHECK(r.ok);
  INFO(r.message);
  // The base weights are frozen: backward leaves them without a gradient (no dW computed).
  Var<Cpu> xv(x);
  net.forward(xv).sum().backward();
  for (const auto& [n, p] : net.named_parameters()) {
    INFO(n);
    CHECK(p.grad().defined() == (n == "fc1.lora_A.weight" || n == "fc1.lora_B.weight"));
  }
  std::vector<std::string> names;
  for (const auto& [n, p] : net.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc1.lora_A.weight", "fc1.lora_B.weight", "fc2.weight", "fc2.bias"});
}

TEST_CASE("lora: bad targets, options and adapter files are errors naming them cpu", "[lora]") {
  auto model = [] { return hf::load_causal_lm<Cpu>(kFixtures + "llama"); };
  CHECK_THAT(error_of([&] { nn::apply_lora(*model(), {.target_modules = {"qq_proj"}}); }),
             Catch::Contains("matches no module") && Catch::Contains("qq_proj"));
  CHECK_THAT(error_of([&] { nn::apply_lora(*model(), {.target_modules = {"*.mlp"}}); }),
             Catch::Contains("not a Linear") && Catch::Contains("layers.0.mlp"));
  CHECK_THAT(error_of([&] { nn::apply_lora(*model(), {.r = 0, .target_modules = {"q_proj"}}); }), Catch::Contains("r must be >= 1"));
  CHECK_THAT(error_of([&] { nn::apply_lora(*model(), {.target_modules = {"q_proj"}, .bias = "all"}); }), Catch::Contains("bias 'all'"));
  {
    auto m = model();
    nn::apply_lora(*m, {.target_modules = {"q_proj"}});
    CHECK_THAT(error_of([&] { nn::apply_lora(*m, {.target_modules = {"q_proj"}}); }),
               Catch::Contains("model.layers.0.self_attn.q_proj") && Catch::Contains("adapter already"));
  }
  CHECK_THAT(error_of([&] { nn::save_lora(*model(), "/nonexistent/never"); }), Catch::Contains("no LoRA adapter"));
  {
    auto m = model();
    nn::apply_lora(*m, {.r = 4, .target_modules = {"q_proj"}});
    nn::apply_lora(*m, {.r = 2, .target_modules = {"v_proj"}});
    CHECK_THAT(error_of([&] { nn::save_lora(*m, "/nonexistent/never"); }), Catch::Contains("different apply_lora options"));
  }
  CHECK_THAT(error_of([&] { nn::merge_lora(*model()); }), Catch::Contains("no LoRA adapter"));

  // Adapter directories that do not fit: r changed, a tensor missing, an extra one, a field kiln lacks.
  TempDir tmp("bad");
  auto write_adapter = [&](const json& config, const std::vector<std::pair<std::string, Tensor<Cpu>>>& tensors) {
    fs::create_directories(tmp.path);
    std::ofstream(tmp.path / "adapter_config.json") << config.dump();
    safetensors::save<Cpu>(tmp.str() + "/adapter_model.safetensors", tensors);
  };
  const json good = read_json(kFixtures + "llama_qv/adapter_init/adapter_config.json");
  auto good_tensors = [&] {
    std::vector<std::pair<std::string, Tensor<Cpu>>> v;
    for (auto& [n, t] : safetensors::load<Cpu>(kFixtures + "llama_qv/adapter_init/adapter_model.safetensors")) v.emplace_back(n, t);
    return v;
  };
  {
    json c = good;
    c["r"] = 3;
    write_adapter(c, good_tensors());
    auto m = model();
    const auto before = m->named_parameters().size();
    CHECK_THAT(error_of([&] { nn::load_lora(*m, tmp.str()); }),
               Catch::Contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is [4, 32], the model's is [3, 32]"));
    // Nothing half-applied: no adapter, every parameter trainable again.
    CHECK(nn::lora_adapters(*m).empty());
    CHECK(m->named_parameters().size() == before);
    for (const auto& [n, p] : m->named_parameters()) CHECK(p.requires_grad());
    // A model with adapters from before keeps them (and their trainable state).
    nn::apply_lora(*m, {.r = 2, .target_modules = {"o_proj"}});
    CHECK_THAT(error_of([&] { nn::load_lora(*m, tmp.str()); }), Catch::Contains("does not fit the model"));
    const auto kept = nn::lora_adapters(*m);
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].first == "layers.0.attn.o_proj");
    CHECK(m->parameter("layers.0.attn.o_proj.lora_A.weight").requires_grad());
    CHECK(!m->parameter("layers.0.attn.q_proj.weight").requires_grad());
  }
  {
    auto t = good_tensors();
    t.pop_back();
    write_adapter(good, t);
    CHECK_THAT(error_of([&] { nn::load_lora(*model(), tmp.str()); }), Catch::Contains("missing 'base_model.model.model.layers."));
  }
  {
    auto t = good_tensors();
    t.emplace_back("base_model.model.lm_head.lora_A.weight", Tensor<Cpu>::zeros({4, 32}));
    write_adapter(good, t);
    CHECK_THAT(error_of([&] { nn::load_lora(*model(), tmp.str()); }),
               Catch::Contains("unexpected 'base_model.model.lm_head.lora_A.weight'"));
  }
  {
    json c = good;
    c["use_dora"] = true;
    write_adapter(c, good_tensors());
    CHECK_THAT(error_of([&] { nn::load_lora(*model(), tmp.str()); }), Catch::Contains("'use_dora' = true is not implemented"));
    // PEFT 0.21.2's adapter_config.json: new fields, unset, and qalora_group_size 16 with QA-LoRA off
    c = good;
    for (const char* k :
         {"alora_invocation_tokens", "arrow_config", "corda_config", "eva_config", "exclude_modules", "kasa_config", "lora_ga_config",
          "monteclora_config", "target_parameters", "trainable_token_indices", "use_bdlora", "velora_config"})
      c[k] = nullptr;
    c["ensure_weight_tying"] = c["lora_bias"] = c["use_qalora"] = false;
    c["qalora_group_size"] = 16;
    c["peft_version"] = "0.21.2";
    write_adapter(c, good_tensors());
    CHECK(nn::load_lora(*model(), tmp.str()).size() == 4);
    c["use_qalora"] = true;
    write_adapter(c, good_tensors());
    CHECK_THAT(error_of([&] { nn::load_lora(*model(), tmp.str()); }), Catch::Contains("'use_qalora' = true is not implemented"));
    c = good;
    c["peft_type"] = "IA3";
    write_adapter(c, good_tensors());
    CHECK_THAT(error_of([&] { nn::load_lora(*model(), tmp.str()); }), Catch::Contains("peft_type must be \"LORA\""));
  }
  CHECK_THAT(error_of([&] { nn::load_lora(*model(), tmp.str() + "/none"); }),
             Catch::Contains("cannot open") && Catch::Contains("/none/adapter_config.json"));
}

// An adapter saved by kiln loads into PEFT (PeftModel.from_pretrained) and gives kiln's logits. Needs
// the Hugging Face venv (scripts/hf_venv.sh; KILN_HF_PYTHON names another interpreter): skipped without.
TEST_CASE("lora: an adapter saved by kiln gives the same logits in PEFT cpu", "[lora]") {
  const char* env = std::getenv("KILN_HF_PYTHON");
  const std::string py = env && *env ? env : std::string(KILN_SOURCE_DIR) + "/.venv-hf/bin/python";
  if (!fs::exists(py)) {
    WARN("skipped: no Hugging Face venv at " << py << " (scripts/hf_venv.sh)");
    return;
  }
  for (const char* base : {"llama", "gpt2"}) {
    DYNAMIC_SECTION(base) {
      auto model = hf::load_causal_lm<Cpu>(kFixtures + base);
      nn::apply_lora(*model, {.r = 3,
                              .alpha = 5,
                              .target_modules = std::string(base) == "llama" ? std::vector<std::string>{"*_proj"}
                                                                             : std::vector<std::string>{"c_attn", "c_fc", "c_proj"}});
      for (auto& [path, a] : nn::lora_adapters(*model)) {
        Tensor<Cpu> bw = a->lora_B().weight().value();
        bw.copy_(Tensor<Cpu>::randn(bw.shape()).mul(0.3));
      }
      TempDir tmp(std::string("peft-") + base);
      nn::save_lora(*model, tmp.str());
      model->eval();
      const Tensor<Cpu> ids = Tensor<Cpu>::from_vector(std::vector<int64_t>{3, 14, 15, 9, 26, 5, 35, 8}, {1, 8});
      const auto ours = first_row_logits(*model, ids);
      const std::string out = tmp.str() + "/peft_logits.json";
      const auto r = kt::run_command(fmt::format("{} {}/tests/lora/peft_logits.py {} {} {} 3,14,15,9,26,5,35,8 2>&1", py, KILN_SOURCE_DIR,
                                                 kFixtures + base, tmp.str(), out));
      INFO(r.out);
      REQUIRE(r.status == 0);
      CHECK(max_abs_diff(ours, doubles(read_json(out))) < 1e-5);
    }
  }
}
