// Module mechanics (names, state dicts, modes) and the small layers, each against an independent answer.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <tuple>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/attention.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/init.hpp>
#include <kiln/nn/layers.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/norm.hpp>
#include "param_gradcheck.hpp"

using namespace kiln;
using namespace kiln::nn;

namespace {
template <Backend B> class Two : public Module<B> {
 public:
  Two() {
    a = this->register_module("a", std::make_shared<Linear<B>>(LinearOptions{.in = 3, .out = 4, .bias = true}));
    s = this->register_parameter("scale", Tensor<B>::ones({4}));
    this->register_buffer("steps", Tensor<B>::zeros({1}, DType::i64));
    b = this->register_module("b", std::make_shared<Linear<B>>(LinearOptions{.in = 4, .out = 2, .bias = false}));
  }
  void bad_names() { this->register_parameter("scale", Tensor<B>::ones({1})); }
  void dotted() { this->register_parameter("x.y", Tensor<B>::ones({1})); }
  std::shared_ptr<Linear<B>> a, b;
  Var<B> s;
};
}  // namespace

TEMPLATE_TEST_CASE("module: PyTorch names and order, counting, strict state dicts listing every problem", "[module]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Two<B> m;
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"scale", "a.weight", "a.bias", "b.weight"});  // own first, then children
  CHECK(m.num_parameters() == 4 + 12 + 4 + 8);
  CHECK(m.state_dict().size() == 5);  // + the persistent buffer
  CHECK_THROWS_WITH(m.bad_names(), Catch::Contains("'scale' is already registered"));
  CHECK_THROWS_WITH(m.dotted(), Catch::Contains("invalid name 'x.y'"));
  CHECK_THROWS_WITH(m.parameter("a.wieght"), Catch::Contains("no parameter 'a.wieght'") && Catch::Contains("a.weight"));

  std::map<std::string, Tensor<B>> sd;
  for (auto& [n, t] : m.state_dict()) sd[n] = t.clone();
  sd.erase("b.weight");
  sd["a.weight"] = Tensor<B>::zeros({4, 4});
  sd["c.weight"] = Tensor<B>::zeros({1});
  const auto before = to_vector<float>(m.parameter("scale").value());
  CHECK_THROWS_WITH(m.load_state_dict(sd), Catch::Contains("missing 1 [b.weight]") && Catch::Contains("unexpected 1 [c.weight]") &&
                                               Catch::Contains("a.weight: [4, 4] in the state, [4, 3] in the model"));
  CHECK(to_vector<float>(m.parameter("scale").value()) == before);  // nothing half-loaded

  // A good state dict (f64 values into f32 parameters) loads into the existing tensors.
  Var<B> scale = m.parameter("scale");
  std::map<std::string, Tensor<B>> good;
  for (auto& [n, t] : m.state_dict()) good[n] = t.to(is_floating(t.dtype()) ? DType::f64 : t.dtype()).add(0);
  good["scale"] = Tensor<B>::full({4}, 2.5, DType::f64);
  m.load_state_dict(good);
  CHECK(to_vector<float>(scale.value()) == std::vector<float>(4, 2.5f));
  m.eval();
  CHECK_FALSE(m.a->is_training());
  m.train();
  CHECK(m.b->is_training());
}

// The option defaults a PyTorch user relies on without writing them (docs/layers.md, "Porting from
// PyTorch"): Linear has a bias, as torch.nn.Linear(in, out); the transformer layers, whose torch
// counterparts do too, ask for none themselves (a GPT has no bias anywhere).
TEMPLATE_TEST_CASE("porting: Linear has a bias by default as torch.nn.Linear, and the GPT layers still have none", "[module]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Linear<B> lin(LinearOptions{.in = 4, .out = 3});
  CHECK(lin.named_parameters().size() == 2);
  CHECK(lin.bias().defined());
  CHECK(lin.bias().shape() == Shape{3});
  Linear<B> nob(LinearOptions{.in = 4, .out = 3, .bias = false});
  CHECK(nob.named_parameters().size() == 1);
  ModelConfig c;
  c.vocab_size = 16, c.d_model = 16, c.n_layers = 2, c.n_heads = 2, c.max_seq_len = 8;
  for (const std::string attention : {"mha", "diff"}) {
    INFO(attention);
    c.attention = attention;
    c.tie_embeddings = attention == "diff";  // mha: the untied LM head is checked too
    GPT<B> gpt(c.resolved());
    for (const auto& [name, p] : gpt.named_parameters()) {
      INFO(name);
      CHECK(name.find("bias") == std::string::npos);
    }
  }
}

TEMPLATE_TEST_CASE("layers: LayerNorm/RMSNorm against the formula and FD, Dropout, MSE, init bounds", "[layers]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator g(1);
  const Tensor<B> x = Tensor<B>::randn({3, 5, 8}, DType::f64, &g).mul(3).add(1);
  LayerNorm<B> ln({.dim = 8, .eps = 1e-5, .dtype = DType::f64});
  Var<B> lw = ln.parameter("weight");
  init::normal_(lw, 1.0, 0.3, &g);
  const auto y = to_vector<double>(ln.forward(Var<B>(x)).value());
  const auto xv = to_vector<double>(x), w = to_vector<double>(ln.parameter("weight").value());
  for (int r = 0; r < 15; ++r) {
    double mu = 0, var = 0;
    for (int k = 0; k < 8; ++k) mu += xv[static_cast<size_t>(r * 8 + k)] / 8;
    for (int k = 0; k < 8; ++k) var += std::pow(xv[static_cast<size_t>(r * 8 + k)] - mu, 2) / 8;
    for (int k = 0; k < 8; ++k)
      CHECK(y[static_cast<size_t>(r * 8 + k)] ==
            Approx((xv[static_cast<size_t>(r * 8 + k)] - mu) / std::sqrt(var + 1e-5) * w[static_cast<size_t>(k)]).margin(1e-12));
  }
  const Tensor<B> r = Tensor<B>::randn({3, 5, 8}, DType::f64, &g);
  test::check_param_grads<B>(ln.named_parameters(), [&] { return (ln.forward(Var<B>(x)) * Var<B>(r)).sum(); });
  RMSNorm<B> rms({.dim = 8, .dtype = DType::f64});
  test::check_param_grads<B>(rms.named_parameters(), [&] { return (rms.forward(Var<B>(x)) * Var<B>(r)).sum(); });
  // Gemma's norm: the scale is 1 + weight, the weight starting at 0 (the same output as a plain norm
  // then), and equal to a plain norm whose weight is 1 + w.
  RMSNorm<B> gemma({.dim = 8, .dtype = DType::f64, .offset = 1});
  CHECK(to_vector<double>(gemma.parameter("weight").value()) == std::vector<double>(8, 0.0));
  CHECK(to_vector<double>(gemma.forward(Var<B>(x)).value()) == to_vector<double>(rms.forward(Var<B>(x)).value()));
  Var<B> gw = gemma.parameter("weight");
  init::normal_(gw, 0.0, 0.3, &g);
  {
    NoGrad ng;
    Tensor<B> plain_w = rms.parameter("weight").value();
    plain_w.copy_(gw.value().add(1.0));
  }
  const auto with_offset = to_vector<double>(gemma.forward(Var<B>(x)).value()), plain = to_vector<double>(rms.forward(Var<B>(x)).value());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(with_offset[i] == Approx(plain[i]).epsilon(1e-14));
  test::check_param_grads<B>(gemma.named_parameters(), [&] { return (gemma.forward(Var<B>(x)) * Var<B>(r)).sum(); });
  CHECK_THROWS_WITH(RMSNorm<B>({.dim = 8, .affine = false, .offset = 1}), Catch::Contains("offset 1 needs affine"));

  Dropout<B> d(0.25);
  const Tensor<B> ones = Tensor<B>::ones({20000});
  const auto kept = to_vector<float>(d.forward(Var<B>(ones)).value());
  int zeros = 0;
  for (float v : kept) {
    zeros += v == 0.0f;
    CHECK((v == 0.0f || v == Approx(1.0f / 0.75f)));
  }
  CHECK(zeros == Approx(5000).margin(300));  // 0.25 · 20000 ± 4.9σ
  d.eval();
  CHECK(to_vector<float>(d.forward(Var<B>(ones)).value()) == to_vector<float>(ones));
  CHECK_THROWS_WITH(Dropout<B>(1.0), Catch::Contains("Dropout: p must be in [0, 1)"));

  const Var<B> a(Tensor<B>::from_vector(std::vector<double>{1, 2, 3}), true);
  const Var<B> mse = mse_loss(a, Var<B>(Tensor<B>::from_vector(std::vector<double>{1, 0, 0})));
  CHECK(item<double>(mse.value()) == Approx((0 + 4 + 9) / 3.0));

  Var<B> w2(Tensor<B>::zeros({64, 100}), true);
  init::kaiming_uniform_(w2, 0.0, &g);
  const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 100.0);
  CHECK(item<double>(w2.value().abs().max()) <= bound);
  CHECK(item<double>(w2.value().abs().max()) > 0.9 * bound);
  init::xavier_normal_(w2, 1.0, &g);
  CHECK(std::sqrt(item<double>(w2.value().square().mean())) == Approx(std::sqrt(2.0 / 164.0)).epsilon(0.05));
  Var<B> v1(Tensor<B>::zeros({5}), true);
  CHECK_THROWS_WITH(init::kaiming_uniform_(v1), Catch::Contains("rank >= 2"));
}

TEMPLATE_TEST_CASE("rope: cached tables give the bits of freshly built ones (growth, positions, width, theta, dtype)", "[attention]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator g(8);
  const RopeTable<B> table;
  // requests that grow the table, reuse it, start past its end, and change every key
  const std::vector<std::tuple<int64_t, int64_t, int64_t, double, DType>> asks{
      {0, 5, 8, 1e4, DType::f32},  {0, 3, 8, 1e4, DType::f32},    {4, 9, 8, 1e4, DType::f32},    {30, 1, 8, 1e4, DType::f32},
      {2, 6, 12, 1e4, DType::f32}, {2, 6, 12, 500.0, DType::f32}, {2, 6, 12, 500.0, DType::f64}, {0, 40, 12, 500.0, DType::f64}};
  for (const auto& [pos0, T, d, theta, dt] : asks) {
    INFO("positions " << pos0 << ".." << pos0 + T << " width " << d << " theta " << theta << " " << dtype_name(dt));
    const Var<B> x(Tensor<B>::randn({2, T, d}, DType::f32, &g).to(dt));
    const Tensor<B> cached = rope(x, pos0, theta, &table).value(), fresh = rope(x, pos0, theta).value();
    CHECK(to_vector<double>(cached.to(DType::f64)) == to_vector<double>(fresh.to(DType::f64)));
    const auto [c, s] = table.at(pos0, T, d, theta, dt);
    CHECK(c.shape() == Shape{T, d / 2});
    // position t, pair k: cos/sin of t θ^(−2k/d) (angle rounded to f32 for f32 tables)
    const int64_t t = pos0 + T - 1, k = d / 2 - 1;
    double ang = static_cast<double>(t) * std::pow(theta, -static_cast<double>(2 * k) / static_cast<double>(d));
    if (dt == DType::f32) ang = static_cast<double>(static_cast<float>(ang));
    CHECK(item<double>(c.select(0, T - 1).select(0, k).to(DType::f64)) == Approx(std::cos(ang)).epsilon(1e-6));
    CHECK(item<double>(s.select(0, T - 1).select(0, k).to(DType::f64)) == Approx(std::sin(ang)).epsilon(1e-6));
  }
  CHECK_THROWS_WITH(table.at(0, 4, 7, 1e4, DType::f32), Catch::Contains("rope"));
}

TEMPLATE_TEST_CASE("attention: KV-cached decoding equals the full forward, generate is seeded", "[attention]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(2);
  MultiHeadAttention<B> a({.d_model = 16, .n_heads = 4, .n_kv_heads = 2, .max_seq_len = 12});
  Generator g(3);
  const Tensor<B> x = Tensor<B>::randn({2, 7, 16}, DType::f32, &g);
  NoGrad ng;
  const auto full = to_vector<float>(a.forward(Var<B>(x)).value());
  KVCache<B> c;
  std::vector<Tensor<B>> parts{a.forward(Var<B>(x.narrow(1, 0, 3)), &c).value()};
  for (int64_t t = 3; t < 7; ++t) parts.push_back(a.forward(Var<B>(x.narrow(1, t, 1)), &c).value());
  const auto inc = to_vector<float>(Tensor<B>::cat(parts, 1));
  for (size_t i = 0; i < full.size(); ++i) CHECK(inc[i] == Approx(full[i]).margin(1e-5));
  CHECK_THROWS_WITH(a.forward(Var<B>(Tensor<B>::zeros({2, 6, 16})), &c), Catch::Contains("max_seq_len 12"));

  ModelConfig cfg;
  cfg.vocab_size = 30;
  cfg.d_model = 16;
  cfg.n_layers = 2;
  cfg.n_heads = 2;
  cfg.max_seq_len = 8;
  GPT<B> m(cfg);
  const SampleOptions so{.max_new_tokens = 20, .temperature = 0.9, .top_k = 5, .seed = 4};
  const auto s1 = m.generate({1, 2, 3}, so), s2 = m.generate({1, 2, 3}, so);  // longer than the context: re-reads
  CHECK(s1 == s2);
  CHECK(s1.size() == 20);
  for (int64_t t : s1) CHECK((t >= 0 && t < 30));
  // Greedy decoding with the cache equals argmax of a full forward, token by token.
  const auto greedy = m.generate({4, 5}, {.max_new_tokens = 4, .temperature = 0});
  std::vector<int64_t> ctx{4, 5};
  for (int64_t t : greedy) {
    const Tensor<B> logits = m.forward(Tensor<B>::from_vector(ctx, {1, static_cast<int64_t>(ctx.size())})).value();
    CHECK(item<int64_t>(logits.select(1, -1).argmax()) == t);
    ctx.push_back(t);
  }
  CHECK_THROWS_WITH(m.generate({31}, so), Catch::Contains("prompt token 31"));
  // vocab_limit: only ids below it are drawn (a tokenizer smaller than the vocabulary), greedy included
  SampleOptions lim{.max_new_tokens = 40, .temperature = 5.0, .top_k = 0, .seed = 9, .vocab_limit = 3};
  for (int64_t t : m.generate({1}, lim)) CHECK((t >= 0 && t < 3));
  lim.temperature = 0;
  lim.max_new_tokens = 4;  // the full forwards below stay within max_seq_len
  const auto gl = m.generate({4, 5}, lim);
  std::vector<int64_t> ctx2{4, 5};
  for (int64_t t : gl) {
    const Tensor<B> logits = m.forward(Tensor<B>::from_vector(ctx2, {1, static_cast<int64_t>(ctx2.size())})).value();
    CHECK(item<int64_t>(logits.select(1, -1).narrow(-1, 0, 3).argmax()) == t);
    ctx2.push_back(t);
  }
}

TEST_CASE("init: SkipInit leaves values alone and advances the generators as the draws would", "[layers]") {
  using B = Cpu;
  const ModelConfig cfg{.vocab_size = 50, .d_model = 32, .n_layers = 2, .n_heads = 2, .max_seq_len = 16};
  manual_seed(7);
  const GPT<B> drawn(cfg);
  const Generator after_draw = default_generator();
  manual_seed(7);
  std::optional<GPT<B>> skipped;
  {
    init::SkipInit a;
    init::SkipInit nested;
    skipped.emplace(cfg);
  }
  CHECK(!init::SkipInit::active());
  // Same generator state: what is drawn next (adapters, dropout masks, samples) does not depend on it.
  CHECK(default_generator().seed() == after_draw.seed());
  CHECK(default_generator().offset() == after_draw.offset());
  CHECK(default_generator().offset() > 0);
  // The values were not drawn: the tied embedding is N(0, 0.02) in `drawn`, untouched in `skipped`.
  const auto d = to_vector<float>(drawn.parameter("tok_emb.weight").value());
  const auto s = to_vector<float>(skipped->parameter("tok_emb.weight").value());
  CHECK(d != s);
  // Outside the guard the initialisers draw again.
  Var<B> w(Tensor<B>::zeros({4, 4}));
  init::normal_(w, 0.0, 1.0);
  CHECK(to_vector<float>(w.value()) != std::vector<float>(16, 0.0f));
}
