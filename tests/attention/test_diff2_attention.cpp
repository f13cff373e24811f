// Differential attention V2 (nn/diff2_attention.hpp, docs/specs.md §1b): the fused combine
// (core/fused_diff2.hpp) against its composite on Reference, its gradients by f64 finite differences,
// the module against an oracle written head pair by head pair from the definition (Reference, f64),
// the literal values of docs/specs.md, causality, KV-cache decoding, masks, and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/fused_diff2.hpp>
#include <kiln/nn/diff2_attention.hpp>
#include <kiln/nn/gpt.hpp>
#include <nlohmann/json.hpp>
#include "common/kiln_test.hpp"
#include "nn/param_gradcheck.hpp"

using namespace kiln;

namespace {

using RT = Tensor<Reference>;

// [B, T, H, hd] turned by interleaved RoPE at positions pos0.. (pair k of position t by t·θ^(−2k/hd)).
RT rope_oracle(const RT& x, int64_t pos0, double theta) {
  const int64_t T = x.size(1), hd = x.size(3);
  std::vector<double> c(static_cast<size_t>(T * hd / 2)), s(c.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hd / 2; ++k) {
      const double ang = static_cast<double>(pos0 + t) * std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(hd));
      c[static_cast<size_t>(t * hd / 2 + k)] = std::cos(ang);
      s[static_cast<size_t>(t * hd / 2 + k)] = std::sin(ang);
    }
  const RT cs = RT::from_vector(c, {T, 1, hd / 2}), sn = RT::from_vector(s, {T, 1, hd / 2});
  const RT x0 = x.slice(-1, 0, hd, 2), x1 = x.slice(-1, 1, hd, 2);
  return RT::stack({x0.mul(cs).sub(x1.mul(sn)), x0.mul(sn).add(x1.mul(cs))}, -1).flatten(-2);
}

// The module by its definition, one output head (and its two query heads) at a time: query head i
// uses kv head ⌊i / (2h/h_kv)⌋; output head j = attn(query head 2j) − σ(λ_j) attn(query head 2j+1).
RT diff2_oracle(const RT& x, std::map<std::string, RT> w, int64_t h, int64_t hkv, bool rope, bool causal, const RT& mask = {}) {
  const int64_t Bn = x.size(0), T = x.size(1), hd = w.at("o_proj.weight").size(1) / h;
  RT q = x.matmul(w.at("q_proj.weight").t()).reshape({Bn, T, 2 * h, hd});
  RT k = x.matmul(w.at("k_proj.weight").t()).reshape({Bn, T, hkv, hd});
  const RT v = x.matmul(w.at("v_proj.weight").t()).reshape({Bn, T, hkv, hd});
  if (rope) q = rope_oracle(q, 0, 10000.0), k = rope_oracle(k, 0, 10000.0);
  const RT lam = x.matmul(w.at("lambda_proj.weight").t()).sigmoid();  // [B, T, h]
  std::vector<double> cm(static_cast<size_t>(T * T), 0.0);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T && causal; ++j) cm[static_cast<size_t>(i * T + j)] = -INFINITY;
  const RT causal_mask = RT::from_vector(cm, {T, T});
  const int64_t rep = 2 * h / hkv;
  std::vector<RT> outs;
  for (int64_t j = 0; j < h; ++j) {
    RT a[2];
    for (int64_t br = 0; br < 2; ++br) {
      const int64_t qi = 2 * j + br, g = qi / rep;
      RT s = q.select(2, qi).matmul(k.select(2, g).transpose(1, 2)).mul(1.0 / std::sqrt(static_cast<double>(hd))).add(causal_mask);
      if (mask.defined()) s = s.add(RT::where(mask.select(1, j), RT::zeros({}, DType::f64), RT::full({}, -INFINITY, DType::f64)));
      a[br] = s.softmax(-1).matmul(v.select(2, g));  // [B, T, hd]
    }
    outs.push_back(a[0].sub(lam.select(2, j).unsqueeze(-1).mul(a[1])));
  }
  return RT::stack(outs, 2).reshape({Bn, T, h * hd}).matmul(w.at("o_proj.weight").t());
}

template <Backend B> std::map<std::string, RT> weights_of(const nn::DifferentialAttentionV2<B>& m) {
  std::map<std::string, RT> w;
  for (const auto& [name, p] : m.named_parameters()) w[name] = p.value().template to<Reference>();
  return w;
}

// Weights N(0, scale²), larger than the init, so attention is far from uniform and a wrong pairing shows.
template <Backend B> void randomize(nn::DifferentialAttentionV2<B>& m, Generator& gen, double scale) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor<B> v = p.value();
    v.copy_(Tensor<B>::randn(p.shape(), DType::f64, &gen).mul(scale));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("diff2: the fused combine equals the composite forward and backward on random shapes, layouts and dtypes",
                   "[attention][diff2]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  // Cpu and Cuda run their kernel here (bf16/f16 converted to f32 by the core): pin that down
  if constexpr (TestType::name == std::string_view("cpu") || TestType::name == std::string_view("cuda"))
    STATIC_REQUIRE(fused::HasDiff2Combine<TestType>);
  Generator gen(3);
  struct Shp {
    int64_t B, h, T, hd;
  };
  for (const Shp s : {Shp{2, 3, 7, 8}, Shp{1, 1, 1, 4}, Shp{3, 2, 33, 5}, Shp{1, 4, 130, 64}})
    for (const DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16})
      for (const bool transposed : {false, true}) {
        INFO("B " << s.B << " h " << s.h << " T " << s.T << " hd " << s.hd << " " << dtype_name(dt) << " transposed " << transposed);
        // a as the attention kernels hand it over: contiguous [B, 2h, T, hd], or the [B, 2h, T, hd] view of a [B, T, 2h, hd] block
        const RT ar =
            transposed ? RT::randn({s.B, s.T, 2 * s.h, s.hd}, dt, &gen).transpose(1, 2) : RT::randn({s.B, 2 * s.h, s.T, s.hd}, dt, &gen);
        const RT lr = RT::randn({s.B, s.T, s.h}, dt, &gen).mul(2.0), gr = RT::randn({s.B, s.T, s.h, s.hd}, dt, &gen);
        const T a = ar.template to<TestType>(), l = lr.template to<TestType>(), g = gr.template to<TestType>();
        const T a_in = transposed ? a.transpose(1, 2).contiguous().transpose(1, 2) : a;
        const RT y_want = fused::diff2_combine_forward(ar, lr);
        const auto [da_want, dl_want] = fused::diff2_combine_backward(ar, lr, gr);
        const T y = fused::diff2_combine_forward(a_in, l);
        const auto [da, dl] = fused::diff2_combine_backward(a_in, l, g);
        CHECK(y.is_contiguous());
        const double u = dt == DType::f64 ? 0x1p-52 : 0x1p-23, n = 4.0 * static_cast<double>(s.hd + 8) * u;
        // a few roundings per element (σ to a few ulp, one product, one difference); dl: a dot of hd terms;
        // bf16/f16: both compute in f32 and round once to dt, so at most one storage ulp apart besides
        const kt::Tol h = dt == DType::bf16 || dt == DType::f16 ? kt::elementwise_tol(dt) : kt::Tol{};
        kt::check_close(y, y_want, {16 * u + h.rtol, 16 * u + h.atol}, "y");
        kt::check_close(da, da_want, {16 * u + h.rtol, 16 * u + h.atol}, "da");
        kt::check_close(dl, dl_want, {n + h.rtol, n * 4 + h.atol}, "dl");
      }
}

TEMPLATE_TEST_CASE("diff2: the combine by hand, and its gradcheck in a and the lambda logits (f64)", "[attention][diff2]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  // B 1, h 2, T 1, hd 2: y_j = a_2j − σ(l_j) a_2j+1
  const T a = T::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 4, 1, 2});
  const T l = T::from_vector(std::vector<double>{0.0, std::log(3.0)}, {1, 1, 2});  // σ = 0.5, 0.75
  const std::vector<double> y = kt::host(fused::diff2_combine_forward(a, l));
  const std::vector<double> want{1 - 0.5 * 3, 2 - 0.5 * 4, 5 - 0.75 * 7, 6 - 0.75 * 8};
  for (size_t i = 0; i < want.size(); ++i) CHECK(y[i] == Approx(want[i]).epsilon(1e-14));
  Generator gen(7);
  const auto r = gradcheck<TestType>([](const std::vector<Var<TestType>>& x) { return nn::diff2_combine(x[0], x[1]); },
                                     {T::randn({2, 6, 4, 3}, DType::f64, &gen), T::randn({2, 4, 3}, DType::f64, &gen)});
  INFO(r.message);
  CHECK(r.ok);
  const auto rt = gradcheck<TestType>([](const std::vector<Var<TestType>>& x) { return nn::diff2_combine(x[0].transpose(1, 2), x[1]); },
                                      {T::randn({2, 4, 6, 3}, DType::f64, &gen), T::randn({2, 4, 3}, DType::f64, &gen)});
  INFO(rt.message);
  CHECK(rt.ok);
}

TEST_CASE("diff2: the literal values of docs/specs.md", "[attention][diff2]") {
  // D = 4, h = 1, hd = 4, no RoPE, causal; q_proj = [I; I reversed], k, v, o = I, lambda_proj = [0.5, −0.25, 0.1, 0.2]
  nn::DifferentialAttentionV2<Reference> m({.d_model = 4, .n_heads = 1, .rope = false, .dtype = DType::f64});
  std::vector<double> wq(32, 0.0), eye(16, 0.0);
  for (int i = 0; i < 4; ++i)
    wq[static_cast<size_t>(i * 4 + i)] = 1, wq[static_cast<size_t>((4 + i) * 4 + (3 - i))] = 1, eye[static_cast<size_t>(i * 5)] = 1;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor<Reference> v = p.value();
    if (name == "q_proj.weight")
      v.copy_(RT::from_vector(wq, {8, 4}));
    else if (name == "lambda_proj.weight")
      v.copy_(RT::from_vector(std::vector<double>{0.5, -0.25, 0.1, 0.2}, {1, 4}));
    else
      v.copy_(RT::from_vector(eye, {4, 4}));
  }
  const RT x = RT::from_vector(std::vector<double>{1, 2, 3, 4, -1, 0.5, 2, -3, 0.5, -0.5, 1, 1}, {1, 3, 4});
  const std::vector<double> y = kt::host(m.forward(Var<Reference>(x)).value());
  const std::vector<double> want{0.2497399, 0.4994798,  0.7492197, 0.9989596, -0.7403951, 0.3646354,
                                 1.4696659, -2.2234102, 0.3403986, 0.6290660, 0.9741519,  1.3318749};
  for (size_t i = 0; i < want.size(); ++i) CHECK(y[i] == Approx(want[i]).margin(1e-6));
}

TEMPLATE_TEST_CASE("diff2: the module equals the head-pair oracle (GQA, pairs across kv heads, RoPE, bidirectional)", "[attention][diff2]",
                   KILN_BACKEND_TYPES) {
  struct Cfg {
    int64_t D, h, hkv;
    bool rope, causal;
  };
  Generator gen(11);
  for (const Cfg c : {Cfg{16, 2, 2, true, true}, Cfg{24, 3, 2, true, true}, Cfg{24, 3, 1, false, true}, Cfg{16, 4, 8, true, true},
                      Cfg{16, 2, 4, false, false}, Cfg{12, 3, 6, true, false}}) {
    INFO("D " << c.D << " h " << c.h << " hkv " << c.hkv << " rope " << c.rope << " causal " << c.causal);
    nn::DifferentialAttentionV2<TestType> m(
        {.d_model = c.D, .n_heads = c.h, .n_kv_heads = c.hkv, .causal = c.causal, .rope = c.rope, .dtype = DType::f64});
    randomize(m, gen, 0.5);
    const RT x = RT::randn({2, 9, c.D}, DType::f64, &gen);
    const Tensor<TestType> y = m.forward(Var<TestType>(x.template to<TestType>())).value();
    kt::check_close(y, diff2_oracle(x, weights_of(m), c.h, c.hkv, c.rope, c.causal), {1e-10, 1e-10}, "y");
  }
}

TEMPLATE_TEST_CASE("diff2: masks per output head, key padding and cross-attention equal the oracle", "[attention][diff2][mask]",
                   KILN_BACKEND_TYPES) {
  Generator gen(12);
  const int64_t D = 16, h = 2, Tn = 6;
  nn::DifferentialAttentionV2<TestType> m(
      {.d_model = D, .n_heads = h, .n_kv_heads = 1, .causal = false, .rope = false, .dtype = DType::f64});
  randomize(m, gen, 0.5);
  const RT x = RT::randn({2, Tn, D}, DType::f64, &gen);
  const Var<TestType> xv(x.template to<TestType>());
  // a bool mask that differs between the two output heads (each row keeps a key)
  std::vector<uint8_t> diag(static_cast<size_t>(Tn * Tn), 0);
  for (int64_t i = 0; i < Tn; ++i) diag[static_cast<size_t>(i * (Tn + 1))] = 1;
  const RT mask = RT::rand({2, h, Tn, Tn}, DType::f64, &gen).lt(0.6).logical_or(RT::from_vector(diag, {Tn, Tn}).to(DType::boolean));
  const RT want = diff2_oracle(x, weights_of(m), h, 1, false, false, mask);
  kt::check_close(m.forward(xv, {.mask = mask.template to<TestType>()}).value(), want, {1e-10, 1e-10}, "mask [B, h, T, S]");
  // key padding [B, S] = the same keys hidden by a mask
  std::vector<uint8_t> kp(2 * Tn, 1);
  kp[3] = kp[Tn + 5] = kp[Tn + 0] = 0;
  const RT kpr = RT::from_vector(kp, {2, Tn}).to(DType::boolean);
  const RT kmask = kpr.reshape({2, 1, 1, Tn}).expand({2, h, Tn, Tn});
  kt::check_close(m.forward(xv, {.key_padding = kpr.template to<TestType>()}).value(),
                  diff2_oracle(x, weights_of(m), h, 1, false, false, kmask), {1e-10, 1e-10}, "key padding");
  // cross-attention: a memory of the same tokens gives self-attention's result
  kt::check_close(m.forward(xv, {.memory = xv}).value(), diff2_oracle(x, weights_of(m), h, 1, false, false), {1e-10, 1e-10}, "memory");
}

TEMPLATE_TEST_CASE("diff2: causal outputs ignore later tokens bit for bit", "[attention][diff2]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(13);
  nn::DifferentialAttentionV2<TestType> m({.d_model = 16, .n_heads = 2, .n_kv_heads = 1, .dtype = DType::f64});
  const T x = T::randn({1, 8, 16}, DType::f64, &gen);
  T x2 = x.clone();
  x2.narrow(1, 5, 3).copy_(T::randn({1, 3, 16}, DType::f64, &gen));
  const std::vector<double> a = kt::host(m.forward(Var<TestType>(x)).value().narrow(1, 0, 5));
  const std::vector<double> b = kt::host(m.forward(Var<TestType>(x2)).value().narrow(1, 0, 5));
  CHECK(a == b);
  const std::vector<double> c = kt::host(m.forward(Var<TestType>(x)).value().narrow(1, 5, 3));
  const std::vector<double> d = kt::host(m.forward(Var<TestType>(x2)).value().narrow(1, 5, 3));
  CHECK(c != d);
}

TEMPLATE_TEST_CASE("diff2: KV-cache decoding equals the full forward", "[attention][diff2]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(14);
  for (const int64_t hkv : {int64_t{1}, int64_t{3}, int64_t{6}}) {
    INFO("n_kv_heads " << hkv);
    nn::DifferentialAttentionV2<TestType> m({.d_model = 24, .n_heads = 3, .n_kv_heads = hkv, .max_seq_len = 16, .dtype = DType::f64});
    randomize(m, gen, 0.3);
    const T x = T::randn({2, 9, 24}, DType::f64, &gen);
    NoGrad ng;
    const T full = m.forward(Var<TestType>(x)).value();
    nn::KVCache<TestType> cache;
    std::vector<T> parts{m.forward(Var<TestType>(x.narrow(1, 0, 4)), &cache).value()};  // prefill 4, then one token at a time
    for (int64_t t = 4; t < 9; ++t) parts.push_back(m.forward(Var<TestType>(x.narrow(1, t, 1)), &cache).value());
    CHECK(cache.len == 9);
    kt::check_close(T::cat(parts, 1), full, {1e-12, 1e-12}, "decoded");
  }
}

TEMPLATE_TEST_CASE("diff2: gradients of x and every parameter by f64 finite differences", "[attention][diff2]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(15);
  nn::DifferentialAttentionV2<TestType> m({.d_model = 12, .n_heads = 3, .n_kv_heads = 2, .dtype = DType::f64});
  randomize(m, gen, 0.4);
  const T w = T::randn({2, 5, 12}, DType::f64, &gen);
  Var<TestType> x(T::randn({2, 5, 12}, DType::f64, &gen), true);
  auto params = m.named_parameters();
  params.emplace_back("x", x);
  test::check_param_grads<TestType>(
      params, [&] { return (m.forward(x) * Var<TestType>(w)).sum(); }, 1e-6, 1e-6, 24);
}

TEMPLATE_TEST_CASE("diff2: bad options and inputs throw kiln::Error naming the module and the sizes", "[attention][diff2][errors]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  using M = nn::DifferentialAttentionV2<TestType>;
  CHECK_THROWS_WITH(M({.d_model = 16, .n_heads = 3}), Catch::Contains("DifferentialAttentionV2") && Catch::Contains("16"));
  CHECK_THROWS_WITH(M({.d_model = 16, .n_heads = 2, .n_kv_heads = 3}), Catch::Contains("2·n_heads = 4") && Catch::Contains("n_kv_heads 3"));
  CHECK_THROWS_WITH(M({.d_model = 12, .n_heads = 4}), Catch::Contains("RoPE") && Catch::Contains("head_dim = 3"));
  M m({.d_model = 16, .n_heads = 2, .rope = false, .dtype = DType::f64});
  CHECK_THROWS_WITH(m.forward(Var<TestType>(T::zeros({2, 3, 8}, DType::f64))), Catch::Contains("[2, 3, 8]"));
  CHECK_THROWS_WITH(m.forward(Var<TestType>(T::zeros({1, 3, 16}, DType::f64)), {.mask = T::ones({1, 3, 3, 3}, DType::boolean)}),
                    Catch::Contains("mask [1, 3, 3, 3]") && Catch::Contains("h = 2"));
  CHECK_THROWS_WITH(fused::diff2_combine_forward(T::zeros({1, 3, 2, 4}, DType::f64), T::zeros({1, 2, 1}, DType::f64)),
                    Catch::Contains("diff2_combine") && Catch::Contains("[1, 3, 2, 4]"));
  CHECK_THROWS_WITH(fused::diff2_combine_forward(T::zeros({1, 4, 2, 4}, DType::f64), T::zeros({1, 2, 3}, DType::f64)),
                    Catch::Contains("[1, 2, 3]") && Catch::Contains("[1, 2, 2]"));
  CHECK_THROWS_WITH(fused::diff2_combine_forward(T::zeros({1, 4, 2, 4}, DType::f64), T::zeros({1, 2, 2}, DType::f32)),
                    Catch::Contains("f64") && Catch::Contains("f32"));
}

TEMPLATE_TEST_CASE("diff2: a GPT with attention diff2 decodes with its KV caches as the full forward", "[attention][diff2]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  ModelConfig c;
  c.vocab_size = 29, c.d_model = 24, c.n_layers = 2, c.n_heads = 3, c.n_kv_heads = 2, c.max_seq_len = 16, c.attention = "diff2";
  nn::GPT<TestType> m(c, DType::f64);
  CHECK(m.parameter("layers.1.attn.lambda_proj.weight").shape() == Shape({3, 24}));
  CHECK(m.parameter("layers.0.attn.q_proj.weight").shape() == Shape({48, 24}));
  CHECK(m.parameter("layers.0.attn.o_proj.weight").shape() == Shape({24, 24}));
  Generator gen(16);
  const T ids = T::rand({2, 10}, DType::f32, &gen).mul(29).to(DType::i64);
  NoGrad ng;
  const T full = m.forward(ids).value();
  std::vector<nn::KVCache<TestType>> caches;
  std::vector<T> parts{m.forward(ids.narrow(1, 0, 6), caches).value()};
  for (int64_t t = 6; t < 10; ++t) parts.push_back(m.forward(ids.narrow(1, t, 1), caches).value());
  kt::check_close(T::cat(parts, 1), full, {1e-11, 1e-11}, "logits");
  CHECK(m.generate({1, 2, 3}, {.max_new_tokens = 20, .temperature = 0}).size() == 20);  // past max_seq_len: re-reads
}

TEST_CASE("diff2: model.json takes attention diff2 with n_kv_heads dividing 2·n_heads", "[attention][diff2][errors]") {
  using json = nlohmann::json;
  CHECK(ModelConfig::from_json(json{{"attention", "diff2"}, {"n_heads", 4}, {"n_kv_heads", 8}}).resolved().n_kv_heads == 8);
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attention", "diff2"}, {"n_heads", 4}, {"n_kv_heads", 3}}),
                    Catch::Contains("diff2") && Catch::Contains("2·n_heads (8)") && Catch::Contains("n_kv_heads (3)"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"n_heads", 4}, {"n_kv_heads", 8}}), Catch::Contains("n_kv_heads (8)"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attention", "diff2"}, {"d_model", 12}, {"n_heads", 4}}), Catch::Contains("odd"));
  CHECK_THROWS_WITH(ModelConfig::from_json(json{{"attention", "diff3"}}), Catch::Contains("mha, diff, diff2"));
}
