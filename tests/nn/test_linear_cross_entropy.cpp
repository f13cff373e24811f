// nn::linear_cross_entropy (the LM head and its loss fused in row chunks, autograd/ops/loss.cpp) against
// the composite cross_entropy(h·wᵀ) on every backend: values and gradients over chunk sizes, ignored
// rows, label smoothing and dtypes; float64 finite differences; the paths without gradients; its
// errors; bf16 autocast; and nn::GPT::loss against cross_entropy(forward) with tied, untied and
// LoRA-adapted heads.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <kiln/autograd/autocast.hpp>
#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/hf/causal_lm.hpp>
#include <kiln/nn/lora.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/train/trainer.hpp>

#include "common/run.hpp"

using namespace kiln;

namespace {

template <Backend B> double max_rel(const Tensor<B>& a, const Tensor<B>& b) {
  const std::vector<double> x = a.template to<Cpu>().template to_vector<double>(), y = b.template to<Cpu>().template to_vector<double>();
  REQUIRE(x.size() == y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (1.0 + std::abs(y[i])));
  return worst;
}

// Targets for `rows` rows over C classes, every third row ignored (-100).
template <Backend B> Tensor<B> targets(int64_t rows, int64_t C, const Shape& shape) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < rows; ++i) v.push_back(i % 3 == 2 ? -100 : (i * 7919 + 5) % C);
  return Tensor<B>::from_vector(v, shape);
}

}  // namespace

TEMPLATE_TEST_CASE("linear cross-entropy: equals cross_entropy(h·wᵀ) in value and gradients (chunks, ignore_index, smoothing)",
                   "[loss][fused]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(41);
  struct Case {
    Shape h;  // [..., D]
    int64_t C, chunk;
  };
  const std::vector<Case> cases{{{1, 3}, 5, 0},     {{7, 8}, 37, 3},  {{3, 11, 16}, 1000, 8},
                                {{12, 5}, 4099, 0}, {{16, 4}, 7, 16}, {{10, 6}, 9, 100}};
  for (DType d : {DType::f64, DType::f32})
    for (const Case& c : cases)
      for (double s : {0.0, 0.1}) {
        const int64_t D = c.h.back(), rows = Tensor<B>::zeros(c.h).numel() / D;
        INFO("h " << shape_str(c.h) << " C " << c.C << " chunk " << c.chunk << " smoothing " << s << " dtype " << dtype_name(d));
        const Tensor<B> h = Tensor<B>::randn(c.h, DType::f64, &gen).to(d), w = Tensor<B>::randn({c.C, D}, DType::f64, &gen).mul(0.5).to(d);
        const Shape tshape(c.h.begin(), c.h.end() - 1);
        const Tensor<B> t = targets<B>(rows, c.C, tshape);
        Var<B> ha(h, true), wa(w, true), hb(h, true), wb(w, true);
        const Var<B> la = nn::linear_cross_entropy(ha, wa, t, {.ignore_index = -100, .label_smoothing = s, .chunk_rows = c.chunk});
        const Var<B> lb = nn::cross_entropy(hb.matmul(wb.t()), t, {.ignore_index = -100, .label_smoothing = s});
        const double tol = d == DType::f64 ? 1e-12 : 2e-5;
        CHECK(la.shape() == Shape{});
        CHECK(la.dtype() == d);
        CHECK(max_rel(la.value(), lb.value()) < tol);
        // an upstream gradient other than 1 (what a scaled loss sends)
        la.mul(0.37).backward();
        lb.mul(0.37).backward();
        CHECK(max_rel(ha.grad(), hb.grad()) < tol);
        CHECK(max_rel(wa.grad(), wb.grad()) < tol);
      }
}

TEMPLATE_TEST_CASE("linear cross-entropy: float64 finite differences in h and w", "[loss][fused][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(43);
  const Tensor<B> h = Tensor<B>::randn({5, 3}, DType::f64, &gen), w = Tensor<B>::randn({7, 3}, DType::f64, &gen);
  const Tensor<B> t = Tensor<B>::from_vector(std::vector<int64_t>{3, -100, 6, 0, 3}, {5});
  for (int64_t chunk : {0, 2})
    for (double s : {0.0, 0.2}) {
      INFO("chunk " << chunk << " smoothing " << s);
      const auto r = gradcheck<B>(
          [&](const std::vector<Var<B>>& in) {
            return nn::linear_cross_entropy(in[0], in[1], t, {.ignore_index = -100, .label_smoothing = s, .chunk_rows = chunk});
          },
          {h, w});
      INFO(r.message);
      CHECK(r.ok);
    }
}

TEMPLATE_TEST_CASE("linear cross-entropy: gradients only where wanted, nan when every row is ignored, errors name the op", "[loss][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(47);
  const Tensor<B> h = Tensor<B>::randn({6, 4}, DType::f32, &gen), w = Tensor<B>::randn({9, 4}, DType::f32, &gen);
  const Tensor<B> t = targets<B>(6, 9, {6});
  const Tensor<B> ref = nn::cross_entropy(Var<B>(h.matmul(w.t())), t).value();
  {
    NoGrad ng;
    const Var<B> l = nn::linear_cross_entropy(Var<B>(h, true), Var<B>(w, true), t, {.chunk_rows = 4});
    CHECK_FALSE(l.requires_grad());
    CHECK(max_rel(l.value(), ref) < 2e-5);
  }
  {  // the weight frozen: h's gradient alone
    Var<B> hv(h, true), wv(w, false), hr(h, true);
    nn::linear_cross_entropy(hv, wv, t, {.chunk_rows = 4}).backward();
    nn::cross_entropy(hr.matmul(Var<B>(w).t()), t).backward();
    CHECK_FALSE(wv.grad().defined());
    CHECK(max_rel(hv.grad(), hr.grad()) < 2e-5);
  }
  const Tensor<B> none = Tensor<B>::full({6}, -100, DType::i64);
  CHECK(std::isnan(nn::linear_cross_entropy(Var<B>(h), Var<B>(w), none).template item<double>()));

  const auto throws = [&](const Var<B>& hh, const Var<B>& ww, const Tensor<B>& tt, nn::LinearCrossEntropyOptions o, const char* what) {
    INFO(what);
    CHECK_THROWS_WITH(nn::linear_cross_entropy(hh, ww, tt, o), Catch::Contains("linear_cross_entropy") && Catch::Contains(what));
  };
  throws(Var<B>(h), Var<B>(Tensor<B>::zeros({9, 5})), t, {}, "[9, 5]");
  throws(Var<B>(h), Var<B>(w), targets<B>(5, 9, {5}), {}, "[5]");
  throws(Var<B>(h), Var<B>(w), Tensor<B>::full({6}, 9, DType::i64), {}, "[0, 9)");
  throws(Var<B>(h), Var<B>(w), t, {.chunk_rows = -1}, "chunk_rows");
  throws(Var<B>(h), Var<B>(w), t, {.label_smoothing = 1.5}, "label_smoothing");
  throws(Var<B>(h), Var<B>(w), t.to(DType::f32), {}, "targets");
  throws(Var<B>(h), Var<B>(w.to(DType::f64)), t, {}, "f64");
}

TEST_CASE("linear cross-entropy: under bf16 autocast the loss is f32 and near the composite's, gradients in the inputs' dtypes",
          "[loss][fused][amp]") {
  using B = Cpu;
  Generator gen(53);
  const Tensor<B> h = Tensor<B>::randn({2, 24, 32}, DType::f32, &gen), w = Tensor<B>::randn({300, 32}, DType::f32, &gen).mul(0.2);
  const Tensor<B> t = targets<B>(48, 300, {2, 24});
  Var<B> ha(h, true), wa(w, true), hb(h, true), wb(w, true);
  Var<B> la, lb;
  {
    autocast::Scope ac(DType::bf16);
    la = nn::linear_cross_entropy(ha, wa, t, {.chunk_rows = 10});
    lb = nn::cross_entropy(hb.matmul(wb.t()), t);
  }
  CHECK(la.dtype() == DType::f32);
  CHECK(lb.dtype() == DType::f32);
  CHECK(max_rel(la.value(), lb.value()) < 1e-2);
  la.backward();
  lb.backward();
  CHECK(ha.grad().dtype() == DType::f32);
  CHECK(wa.grad().dtype() == DType::f32);
  // bf16 products either way; the fused weight gradient sums its chunks in f32
  CHECK(max_rel(ha.grad(), hb.grad()) < 2e-2);
  CHECK(max_rel(wa.grad(), wb.grad()) < 2e-2);
}

TEST_CASE("GPT::loss equals cross_entropy of forward: tied and untied heads, and a LoRA adapter on lm_head", "[loss][fused][gpt]") {
  using B = Cpu;
  for (const bool tied : {true, false})
    for (const bool lora : {false, true}) {
      if (tied && lora) continue;  // a tied head is the embedding: no lm_head to adapt
      INFO("tied " << tied << " lora " << lora);
      const ModelConfig cfg{.vocab_size = 97, .d_model = 32, .n_layers = 2, .n_heads = 4, .max_seq_len = 16, .tie_embeddings = tied};
      nn::GPT<B> a(cfg, DType::f64), b(cfg, DType::f64);
      a.init_weights(3);
      b.init_weights(3);
      if (lora) {
        for (nn::GPT<B>* m : {&a, &b}) {
          nn::apply_lora(*m, {.r = 2, .alpha = 4, .target_modules = {"lm_head"}});
          Tensor<B> lb = m->parameter("lm_head.lora_B.weight").value();
          Generator g(7);
          lb.copy_(Tensor<B>::randn(lb.shape(), DType::f64, &g).mul(0.1));  // lora_B starts at 0: make the adapter count
        }
      }
      for (const auto& [n, p] : a.named_parameters()) {  // one set of weights (LoRA's lora_A draws its own)
        Tensor<B> dst = b.parameter(n).value();
        dst.copy_(p.value());
      }
      std::vector<int64_t> iv, tv;
      for (int64_t i = 0; i < 48; ++i) {
        iv.push_back((i * 31 + 7) % 97);
        tv.push_back(i == 5 ? -100 : (i * 53 + 11) % 97);
      }
      const Tensor<B> ids = Tensor<B>::from_vector(iv, {3, 16});
      const Tensor<B> y = Tensor<B>::from_vector(tv, {3, 16});
      const Var<B> la = a.loss(ids, y, {.chunk_rows = 7}), lb = nn::cross_entropy(b.forward(ids), y);
      CHECK(max_rel(la.value(), lb.value()) < 1e-12);
      la.backward();
      lb.backward();
      const auto pa = a.named_parameters(), pb = b.named_parameters();
      REQUIRE(pa.size() == pb.size());
      for (size_t i = 0; i < pa.size(); ++i) {
        INFO(pa[i].first);
        REQUIRE(pa[i].second.grad().defined() == pb[i].second.grad().defined());
        if (pa[i].second.grad().defined()) CHECK(max_rel(pa[i].second.grad(), pb[i].second.grad()) < 1e-10);
      }
    }
}

TEST_CASE("hf::CausalLM::loss equals cross_entropy of forward (Llama, GPT-2's tied head, Gemma 2's soft cap, f32 and bf16 autocast)",
          "[loss][fused][hf]") {
  using B = Cpu;
  const std::string fixtures = std::string(KILN_SOURCE_DIR) + "/tests/hf/fixtures/";
  for (const std::string name : {"llama", "gpt2", "gemma2"})
    for (DType ac : {DType::f32, DType::bf16}) {
      INFO(name << " autocast " << dtype_name(ac));
      const auto a = hf::load_causal_lm<B>(fixtures + name, hf::LoadOptions{.autocast = ac});
      const auto b = hf::load_causal_lm<B>(fixtures + name, hf::LoadOptions{.autocast = ac});
      const int64_t V = a->spec().vocab;
      std::vector<int64_t> iv, tv;
      for (int64_t i = 0; i < 14; ++i) {
        iv.push_back((i * 31 + 7) % V);
        tv.push_back(i == 3 ? -100 : (i * 53 + 11) % V);
      }
      const Tensor<B> ids = Tensor<B>::from_vector(iv, {2, 7}), y = Tensor<B>::from_vector(tv, {2, 7});
      const Var<B> la = a->loss(ids, y, {.chunk_rows = 3}), lb = nn::cross_entropy(b->forward(ids), y);
      CHECK(la.dtype() == DType::f32);
      const double tol = ac == DType::f32 ? 2e-5 : 2e-2;
      CHECK(max_rel(la.value(), lb.value()) < tol);
      la.backward();
      lb.backward();
      const auto pa = a->named_parameters(), pb = b->named_parameters();
      REQUIRE(pa.size() == pb.size());
      for (size_t i = 0; i < pa.size(); ++i) {
        INFO(pa[i].first);
        REQUIRE(pa[i].second.grad().defined() == pb[i].second.grad().defined());
        if (pa[i].second.grad().defined()) CHECK(max_rel(pa[i].second.grad(), pb[i].second.grad()) < tol);
      }
    }
}

// train.json's loss_chunk_rows: -1 the logits whole, N > 0 the fused op in chunks of N rows, 0 (default)
// the fused op only where the logits would exceed 2^25 elements (so here, as -1).
TEST_CASE("linear cross-entropy: kiln train with loss_chunk_rows: the unfused run's losses", "[loss][fused][cli]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-lce-{}", ::getpid());
  fs::create_directories(dir);
  std::vector<int64_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * i * 7 + i * 3) % 61);
  safetensors::save<Cpu>((dir / "tokens.safetensors").string(),
                         {{"tokens", Tensor<Cpu>::from_vector(tokens, {static_cast<int64_t>(tokens.size())})}});
  std::ofstream(dir / "model.json") << R"({"vocab_size": 61, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 16,
                                           "attention": "diff", "tie_embeddings": true})";
  auto train = [&](int64_t chunk) {
    const fs::path t = dir / fmt::format("train_{}.json", chunk);
    std::ofstream(t) << nlohmann::json{{"batch_size", 3}, {"seq_len", 16}, {"steps", 5}, {"loss_chunk_rows", chunk}}.dump();
    TrainOptions o;
    o.model_path = (dir / "model.json").string();
    o.train_path = t.string();
    o.data_path = (dir / "tokens.safetensors").string();
    o.quiet = true;
    return train_gpt(o).losses;
  };
  const std::vector<double> whole = train(-1);
  REQUIRE(whole.size() == 5);
  CHECK(train(0) == whole);
  for (int64_t chunk : {5, 48}) {
    const std::vector<double> fused = train(chunk);
    REQUIRE(fused.size() == whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      INFO("chunk " << chunk << " step " << i);
      CHECK(fused[i] == Approx(whole[i]).epsilon(1e-5));
    }
  }
  // The banner says which: the fused op in chunks of 5 of the step's 48 rows, nothing for -1 and 0.
  const auto banner = [&](int64_t chunk) {
    return kt::run_command(fmt::format("{} train --model {} --train {} --data {} --progress off 2>&1", KILN_CLI,
                                       (dir / "model.json").string(), (dir / fmt::format("train_{}.json", chunk)).string(),
                                       (dir / "tokens.safetensors").string()));
  };
  const auto five = banner(5), auto_ = banner(0);
  CHECK(five.status == 0);
  CHECK_THAT(five.out, Catch::Contains("LM head and cross-entropy fused, 5 of the step's 48 token rows per chunk"));
  CHECK(auto_.status == 0);
  CHECK_THAT(auto_.out, !Catch::Contains("fused"));
  std::ofstream(dir / "bad.json") << R"({"loss_chunk_rows": -2})";
  TrainOptions bad;
  bad.model_path = (dir / "model.json").string();
  bad.train_path = (dir / "bad.json").string();
  bad.data_path = (dir / "tokens.safetensors").string();
  bad.quiet = true;
  CHECK_THROWS_WITH(train_gpt(bad), Catch::Contains("loss_chunk_rows"));
  fs::remove_all(dir);
}
