// GPT forward and backward against the PyTorch reference (kiln_ref.py grads), in float64 so that any
// disagreement beyond rounding is a bug: logits, loss and the gradient of every parameter.
#include <catch2/catch.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/train/data.hpp>
#include "ref.hpp"

using namespace kiln;
using json = nlohmann::json;

namespace {

double rel_l2(const Tensor<Cpu>& a, const Tensor<Cpu>& b) {
  const Tensor<Cpu> x = a.to(DType::f64), y = b.to(DType::f64);
  const double num = std::sqrt(item<double>(x.sub(y).square().sum()));
  const double den = std::sqrt(item<double>(y.square().sum()));
  return den == 0 ? num : num / den;
}

void check_config(const json& model_json) {
  test::require_torch();
  INFO("model.json: " << model_json.dump());
  const auto dir = test::temp_dir("grads");
  test::write_json(dir / "model.json", model_json);
  const std::string m = (dir / "model.json").string(), init = (dir / "init.safetensors").string(),
                    tok = (dir / "tokens.safetensors").string(), grads = (dir / "grads.safetensors").string();
  const ModelConfig cfg = ModelConfig::from_json(model_json).resolved();
  const int64_t Bn = 2, T = std::min<int64_t>(16, cfg.max_seq_len);
  // one reference process for the three commands (PyTorch imported once)
  test::run_ref(
      fmt::format("init --model {} --seed 3 --out {} + tokens --vocab {} --n 3000 --seed 1 --out {} + grads --model {} --data {} "
                  "--init-from {} --batch {} --seq-len {} --dtype float64 --out {}",
                  m, init, cfg.vocab_size, tok, m, tok, init, Bn, T, grads));

  nn::GPT<Cpu> model(cfg, DType::f64);
  model.load(init);
  const auto [x, y] = TokenData::load(tok).batch<Cpu>(0, Bn, T);
  const Var<Cpu> logits = model.forward(x);
  const Var<Cpu> loss = nn::cross_entropy(logits.reshape({-1, cfg.vocab_size}), y.reshape({-1}));
  loss.backward();

  const auto ref = safetensors::load<Cpu>(grads);
  CHECK(item<double>(loss.value()) == Approx(item<double>(ref.at("loss"))).epsilon(1e-10));
  CHECK(rel_l2(logits.value(), ref.at("logits")) < 1e-10);
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(ref.count("grad." + name));
    REQUIRE(p.grad().defined());
    CHECK(rel_l2(p.grad(), ref.at("grad." + name)) < 1e-9);
  }
  CHECK(model.named_parameters().size() + 2 == ref.size());
}

}  // namespace

TEST_CASE("parity: GPT with differential attention and attention residuals equals the reference in float64", "[parity]") {
  const json base = {{"vocab_size", 53}, {"d_model", 32}, {"n_layers", 3}, {"n_heads", 2}, {"max_seq_len", 32}};
  SECTION("diff, RoPE, standard residual") {
    json j = base;
    j["attention"] = "diff";
    check_config(j);
  }
  SECTION("diff, GQA 4:2 (K1 != K2 pairing), subln affine, tied") {
    json j = base;
    j["attention"] = "diff";
    j["d_model"] = 64;
    j["n_heads"] = 4;
    j["n_kv_heads"] = 2;
    j["diff_subln_affine"] = true;
    j["tie_embeddings"] = true;
    check_config(j);
  }
  SECTION("diff2, GQA 3:2 (a head pair across two kv heads), tied, attnres_block S=3") {
    json j = base;
    j["attention"] = "diff2";
    j["d_model"] = 48;
    j["n_heads"] = 3;
    j["n_kv_heads"] = 2;
    j["tie_embeddings"] = true;
    j["residual"] = "attnres_block";
    j["attnres_block_size"] = 3;
    check_config(j);
  }
  SECTION("diff2, MQA, no RoPE, attnres_full") {
    json j = base;
    j["attention"] = "diff2";
    j["n_heads"] = 4;
    j["n_kv_heads"] = 1;
    j["rope"] = false;
    j["residual"] = "attnres_full";
    check_config(j);
  }
  SECTION("mha + attnres_full") {
    json j = base;
    j["residual"] = "attnres_full";
    check_config(j);
  }
  SECTION("mha + attnres_block S=4 with a remainder block, GQA") {
    json j = base;
    j["residual"] = "attnres_block";
    j["attnres_block_size"] = 4;
    j["n_heads"] = 4;
    j["n_kv_heads"] = 2;
    check_config(j);
  }
  SECTION("diff + attnres_block S=3, no RoPE, key norm without weight") {
    json j = base;
    j["attention"] = "diff";
    j["residual"] = "attnres_block";
    j["attnres_block_size"] = 3;
    j["rope"] = false;
    j["attnres_key_norm_affine"] = false;
    check_config(j);
  }
  SECTION("diff + attnres_full, MQA 4:1, no RoPE") {
    json j = base;
    j["attention"] = "diff";
    j["residual"] = "attnres_full";
    j["d_model"] = 48;
    j["n_heads"] = 4;
    j["n_kv_heads"] = 1;
    j["rope"] = false;
    check_config(j);
  }
}

TEST_CASE("parity: GPT (mha) logits, loss and every gradient equal the reference in float64", "[parity]") {
  const json base = {{"vocab_size", 61}, {"d_model", 32}, {"n_layers", 2}, {"n_heads", 4}, {"max_seq_len", 32}};
  SECTION("defaults: RoPE, untied, MHA") { check_config(base); }
  SECTION("GQA 4:2, tied embeddings") {
    json j = base;
    j["n_kv_heads"] = 2;
    j["tie_embeddings"] = true;
    check_config(j);
  }
  SECTION("GQA 6:1 (MQA), no RoPE, odd ffn width") {
    json j = base;
    j["d_model"] = 48;
    j["n_heads"] = 6;
    j["n_kv_heads"] = 1;
    j["rope"] = false;
    j["ffn_hidden"] = 37;
    check_config(j);
  }
  SECTION("three layers, theta and eps changed") {
    json j = base;
    j["n_layers"] = 3;
    j["rope_theta"] = 500.0;
    j["norm_eps"] = 1e-3;
    check_config(j);
  }
}
