// DifferentialAttention and Attention Residuals: every literal check and property of docs/specs.md §1–2,
// and finite-difference gradients of every parameter. Each test would catch one of the known ways
// other implementations got these layers wrong (named in the comments).
#include <catch2/catch.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/core/fused_depth.hpp>
#include <kiln/nn/attnres.hpp>
#include <kiln/nn/diff_attention.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/init.hpp>
#include "common/kiln_test.hpp"
#include "param_gradcheck.hpp"

using namespace kiln;
using namespace kiln::nn;

namespace {

template <Backend B> void set(Var<B> p, const std::vector<double>& v) {
  Tensor<B> t = p.value();
  t.copy_(Tensor<B>::from_vector(v, t.shape()));
}

}  // namespace

TEST_CASE("diff attention: lambda_init by depth (SPECS literal)", "[diff]") {
  const double want[] = {0.2, 0.355509, 0.470713, 0.556058, 0.619283, 0.666122, 0.700821, 0.726526};
  for (int d = 0; d < 8; ++d) CHECK(diff_lambda_init(d) == Approx(want[d]).margin(1e-6));
}

TEMPLATE_TEST_CASE("diff attention: the SPECS literal example (identity weights, D=4, h=1)", "[diff]", KILN_BACKEND_TYPES) {
  using B = TestType;
  DifferentialAttention<B> a({.d_model = 4, .n_heads = 1, .depth = 0, .rope = false, .dtype = DType::f64});
  for (auto& [name, p] : a.named_parameters()) {
    if (name.find("_proj.weight") != std::string::npos) {
      std::vector<double> eye(16, 0.0);
      for (int i = 0; i < 4; ++i) eye[static_cast<size_t>(i * 5)] = 1.0;
      set(p, eye);
    }
  }
  set(a.parameter("lambda_q1"), {0.1, 0.2});
  set(a.parameter("lambda_k1"), {0.3, 0.1});
  set(a.parameter("lambda_q2"), {0.2, 0.1});
  set(a.parameter("lambda_k2"), {0.1, 0.1});
  CHECK(item<double>(a.lambda().value()) == Approx(0.2208166).margin(1e-6));  // λ_init 0.2 included
  const Tensor<B> x = Tensor<B>::from_vector(std::vector<double>{1, 2, 3, 4, -1, 0.5, 2, -3, 0.5, -0.5, 1, 1}, {1, 3, 4});
  const std::vector<double> y = to_vector<double>(a.forward(Var<B>(x)).value());
  const std::vector<double> want{0.292118, 0.584237,  0.876355, 1.168474,  -0.151198, 0.643987,
                                 1.439171, -0.226238, 0.129024, -0.090221, 1.590544,  0.072788};
  // Catches: no per-head subln or no (1 − λ_init) factor, a causal mask ignored, λ computed wrongly.
  for (size_t i = 0; i < want.size(); ++i) CHECK(y[i] == Approx(want[i]).margin(1e-5));
}

TEMPLATE_TEST_CASE("diff attention: causal — later tokens never change earlier outputs (bit-identical)", "[diff]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(3);
  DifferentialAttention<B> a({.d_model = 16, .n_heads = 2, .n_kv_heads = 1, .depth = 2, .rope = true});
  Generator g(9);
  const Tensor<B> x = Tensor<B>::randn({2, 7, 16}, DType::f32, &g);
  Tensor<B> x2 = x.clone();
  x2.narrow(1, 5, 2).copy_(Tensor<B>::randn({2, 2, 16}, DType::f32, &g));
  const Tensor<B> y = a.forward(Var<B>(x)).value(), y2 = a.forward(Var<B>(x2)).value();
  CHECK(to_vector<float>(y.narrow(1, 0, 5)) == to_vector<float>(y2.narrow(1, 0, 5)));
  CHECK(to_vector<float>(y.narrow(1, 5, 2)) != to_vector<float>(y2.narrow(1, 5, 2)));
}

TEMPLATE_TEST_CASE("diff attention: λ = 0, no subln, λ_init = 0 is plain attention on (Q1, K1, V)", "[diff]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(4);
  DifferentialAttention<B> a({.d_model = 16, .n_heads = 2, .rope = true, .subln = false, .lambda_init = 0.0, .dtype = DType::f64});
  for (const char* n : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}) set(a.parameter(n), std::vector<double>(4, 0.0));
  CHECK(item<double>(a.lambda().value()) == 0.0);
  Generator g(5);
  const Tensor<B> x = Tensor<B>::randn({2, 5, 16}, DType::f64, &g);
  const Var<B> y = a.forward(Var<B>(x));
  // By hand: Q1/K1 are the first d=4 columns of each head's 8 (stripes), V the whole 8.
  const Tensor<B> q = x.matmul(a.parameter("q_proj.weight").value().t()).view({2, 5, 2, 2, 4});
  const Tensor<B> k = x.matmul(a.parameter("k_proj.weight").value().t()).view({2, 5, 2, 2, 4});
  const Tensor<B> v = x.matmul(a.parameter("v_proj.weight").value().t()).view({2, 5, 2, 8}).transpose(1, 2);
  const Var<B> q1 = rope(Var<B>(q.select(3, 0).transpose(1, 2)), 0, 10000.0);
  const Var<B> k1 = rope(Var<B>(k.select(3, 0).transpose(1, 2)), 0, 10000.0);
  const Var<B> o = attention(q1, k1, Var<B>(v), true, 0);
  const Tensor<B> want = o.value().transpose(1, 2).reshape({2, 5, 16}).matmul(a.parameter("out_proj.weight").value().t());
  const auto a1 = to_vector<double>(y.value()), a2 = to_vector<double>(want);
  for (size_t i = 0; i < a1.size(); ++i) CHECK(a1[i] == Approx(a2[i]).margin(1e-12));
}

TEMPLATE_TEST_CASE("diff attention: GQA equals MHA-shaped weights with each group's K/V duplicated", "[diff]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(6);
  const int64_t D = 32, h = 4, hkv = 2, d = D / h / 2;
  DifferentialAttention<B> g({.d_model = D, .n_heads = h, .n_kv_heads = hkv, .depth = 1, .dtype = DType::f64});
  DifferentialAttention<B> m({.d_model = D, .n_heads = h, .n_kv_heads = h, .depth = 1, .dtype = DType::f64});
  // Head i of the MHA-shaped layer gets kv group i / (h/hkv): rows [g·2d, (g+1)·2d) of k_proj and v_proj.
  std::map<std::string, Tensor<B>> sd;
  for (auto& [n, t] : g.state_dict()) sd[n] = t;
  for (const char* proj : {"k_proj.weight", "v_proj.weight"}) {
    std::vector<Tensor<B>> rows;
    for (int64_t i = 0; i < h; ++i) rows.push_back(sd[proj].narrow(0, (i / (h / hkv)) * 2 * d, 2 * d));
    sd[proj] = Tensor<B>::cat(rows, 0);
  }
  m.load_state_dict(sd);
  // K1 != K2 inside each group, so pairing a head's branch 1 with the wrong branch of K would fail.
  CHECK(to_vector<double>(sd["k_proj.weight"].narrow(0, 0, d)) != to_vector<double>(sd["k_proj.weight"].narrow(0, d, d)));
  Generator gen(7);
  const Tensor<B> x = Tensor<B>::randn({2, 6, D}, DType::f64, &gen);
  const auto a = to_vector<double>(g.forward(Var<B>(x)).value()), b = to_vector<double>(m.forward(Var<B>(x)).value());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-12));
}

TEMPLATE_TEST_CASE("diff attention: every parameter (all four λ vectors) has FD-correct, non-zero gradients", "[diff]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(8);
  DifferentialAttention<B> a({.d_model = 16, .n_heads = 2, .n_kv_heads = 1, .depth = 3, .subln_affine = true, .dtype = DType::f64});
  Generator g(10);
  const Tensor<B> x = Tensor<B>::randn({2, 5, 16}, DType::f64, &g), r = Tensor<B>::randn({2, 5, 16}, DType::f64, &g);
  // Catches λ frozen by copying its value into a constant: its vectors would get no gradient.
  test::check_param_grads<B>(a.named_parameters(), [&] { return (a.forward(Var<B>(x)) * Var<B>(r)).sum(); });
}

TEMPLATE_TEST_CASE("diff attention: the KV cache equals the full forward (h_kv = 1 and GQA h_kv = 2, batch 2)", "[diff]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  for (int64_t hkv : {1, 2, 4}) {
    INFO("n_kv_heads " << hkv);
    manual_seed(11);
    DifferentialAttention<B> a({.d_model = 32, .n_heads = 4, .n_kv_heads = hkv, .depth = 1, .max_seq_len = 16});
    Generator g(12);
    const Tensor<B> x = Tensor<B>::randn({2, 7, 32}, DType::f32, &g);
    NoGrad ng;
    const Tensor<B> full = a.forward(Var<B>(x)).value();
    KVCache<B> cache;
    std::vector<Tensor<B>> parts{a.forward(Var<B>(x.narrow(1, 0, 4)), &cache).value()};
    for (int64_t t = 4; t < 7; ++t) parts.push_back(a.forward(Var<B>(x.narrow(1, t, 1)), &cache).value());
    CHECK(cache.len == 7);
    CHECK(cache.k.size(1) == 2 * hkv);  // both branches of every kv group
    kt::check_close(Tensor<B>::cat(parts, 1), full, {1e-5, 1e-5}, "cached vs full");
  }
}

// (The old version padded only keys the causal mask already hid, so it passed with padding ignored.)
// Padding keys in the middle and at the start of a sequence must give, on the other positions, what
// the same layer gives on the sequence with the padded tokens removed (rope = false: no positions, so
// removing a token is exactly hiding its key). Ignoring the padding would change rows 2.. here.
TEMPLATE_TEST_CASE("diff attention: key padding hides keys (equals removing the padded tokens)", "[diff]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(13);
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    DifferentialAttention<B> a(
        {.d_model = 16, .n_heads = 2, .n_kv_heads = 1, .depth = 1, .causal = causal, .rope = false, .dtype = DType::f64});
    Generator g(14);
    const Tensor<B> x = Tensor<B>::randn({2, 6, 16}, DType::f64, &g);
    // batch 0 pads keys 1 and 2, batch 1 pads key 3 (key 0 stays, so every causal row sees a key)
    const std::vector<std::vector<int64_t>> kept{{0, 3, 4, 5}, {0, 1, 2, 4, 5}};
    std::vector<uint8_t> keep(12, 0);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j : kept[static_cast<size_t>(b)]) keep[static_cast<size_t>(b * 6 + j)] = 1;
    const Tensor<B> pad = Tensor<B>::from_vector(keep, {2, 6});
    NoGrad ng;
    const Tensor<B> padded = a.forward(Var<B>(x), nullptr, pad).value();
    const Tensor<B> unpadded = a.forward(Var<B>(x)).value();
    for (int64_t b = 0; b < 2; ++b) {
      const auto& ks = kept[static_cast<size_t>(b)];
      std::vector<Tensor<B>> rows;
      for (int64_t j : ks) rows.push_back(x.narrow(0, b, 1).narrow(1, j, 1));
      const Tensor<B> ref = a.forward(Var<B>(Tensor<B>::cat(rows, 1))).value();
      for (size_t r = 0; r < ks.size(); ++r) {
        INFO("batch " << b << " position " << ks[r]);
        kt::check_close(padded.narrow(0, b, 1).narrow(1, ks[r], 1), ref.narrow(1, static_cast<int64_t>(r), 1), {1e-12, 1e-12}, "row");
      }
    }
    // the padding matters: position 3 of batch 0 (and, bidirectional, position 0) differ from unpadded
    CHECK(to_vector<double>(padded.narrow(0, 0, 1).narrow(1, 3, 1)) != to_vector<double>(unpadded.narrow(0, 0, 1).narrow(1, 3, 1)));
    CHECK_THROWS_WITH(a.forward(Var<B>(x), nullptr, Tensor<B>::ones({2, 5}, DType::boolean)), Catch::Contains("key_padding"));
  }
}

TEMPLATE_TEST_CASE("diff attention: bad configurations name the values", "[diff]", KILN_BACKEND_TYPES) {
  using B = TestType;
  CHECK_THROWS_WITH(DifferentialAttention<B>({.d_model = 20, .n_heads = 3}), Catch::Contains("20") && Catch::Contains("2·n_heads = 6"));
  CHECK_THROWS_WITH(DifferentialAttention<B>({.d_model = 24, .n_heads = 4, .n_kv_heads = 3}), Catch::Contains("n_kv_heads 3"));
  CHECK_THROWS_WITH(DifferentialAttention<B>({.d_model = 24, .n_heads = 4, .rope = true}), Catch::Contains("even sub-head width"));
  DifferentialAttention<B> a({.d_model = 16, .n_heads = 2, .max_seq_len = 4});
  CHECK_THROWS_WITH(a.forward(Var<B>(Tensor<B>::zeros({1, 5, 16}))), Catch::Contains("max_seq_len 4"));
}

// ------------------------------------------------------------------------------------ AttnRes
TEMPLATE_TEST_CASE("attnres: the SPECS literal checks (single read and the S=2 block sequence)", "[attnres]", KILN_BACKEND_TYPES) {
  using B = TestType;
  DepthAttention<B> res({.d_model = 4, .eps = 1e-6, .dtype = DType::f64});
  set(res.query(), {2, 0, 0, 0});
  auto vec = [](std::vector<double> v) { return Var<B>(Tensor<B>::from_vector(v, {1, 1, 4})); };
  {
    const Var<B> a = vec({1, 0, 0, 0}), b = vec({0, 1, 0, 0});
    const auto alpha = to_vector<double>(res.logits({a, b}).softmax(0).value());
    CHECK(alpha[0] == Approx(0.9820136).margin(1e-6));
    const auto h = to_vector<double>(res.forward({a, b}).value());
    const std::vector<double> want{0.9820136, 0.0179864, 0, 0};
    for (size_t i = 0; i < 4; ++i) CHECK(h[i] == Approx(want[i]).margin(1e-6));  // values raw, not normalised
  }
  // Catches: the embedding summed into the first block, a 1/√D scale, normalised values.
  AttnResStack<B> stack(vec({3, 0, 0, 0}), 2);
  const std::vector<std::vector<double>> outs{{0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}, {0, 1, 1, 1}, {0, 0, 0, 0}};
  const std::vector<std::vector<double>> want{{3, 0, 0, 0},
                                              {2.9460413, 0.0179862, 0, 0},
                                              {2.9460413, 0.0179862, 0.0179862, 0},
                                              {2.8939894, 0.0176684, 0.0176684, 0.0176684},
                                              {2.8939894, 0.0353369, 0.0353369, 0.0353369}};
  for (size_t j = 0; j < want.size(); ++j) {
    const Var<B> h = stack.step(res, [&](const Var<B>&) { return vec(outs[j]); });
    const auto got = to_vector<double>(h.value());
    INFO("sublayer " << j + 1);
    for (size_t i = 0; i < 4; ++i) CHECK(got[i] == Approx(want[j][i]).margin(1e-6));
  }
}

TEMPLATE_TEST_CASE("attnres: zero query gives the mean of the sources, the final read sees every block", "[attnres]", KILN_BACKEND_TYPES) {
  using B = TestType;
  DepthAttention<B> res({.d_model = 8, .dtype = DType::f64});
  Generator g(2);
  std::vector<Var<B>> src;
  for (int i = 0; i < 3; ++i) src.emplace_back(Tensor<B>::randn({2, 3, 8}, DType::f64, &g));
  const auto h = to_vector<double>(res.forward(src).value());
  const auto mean = to_vector<double>(Tensor<B>::stack({src[0].value(), src[1].value(), src[2].value()}).mean({0}));
  for (size_t i = 0; i < h.size(); ++i) CHECK(h[i] == Approx(mean[i]).margin(1e-12));
  // Catches a final output that reads only the last block: with S=1 the final read has 1 + n sources.
  AttnResStack<B> stack(src[0], 1);
  for (int j = 0; j < 4; ++j) stack.step(res, [&](const Var<B>& x) { return x.mul(2.0); });
  CHECK(stack.sources().size() == 5);
  AttnResStack<B> blocks(src[0], 3);
  for (int j = 0; j < 7; ++j) blocks.step(res, [&](const Var<B>& x) { return x.mul(0.5); });
  CHECK(blocks.sources().size() == 4);  // embedding, two full blocks, the partial of the remainder
  CHECK_THROWS_WITH(AttnResStack<B>(src[0], 0), Catch::Contains("block size") && Catch::Contains("0"));
}

TEMPLATE_TEST_CASE("attnres: query and key-norm weight get FD-correct gradients through a block stack", "[attnres]", KILN_BACKEND_TYPES) {
  using B = TestType;
  DepthAttention<B> r1({.d_model = 6, .dtype = DType::f64}), r2({.d_model = 6, .dtype = DType::f64}),
      fin({.d_model = 6, .dtype = DType::f64});
  Generator g(3);
  for (auto* r : {&r1, &r2, &fin})
    for (auto& [n, p] : r->named_parameters()) {
      Tensor<B> t = p.value();
      t.copy_(Tensor<B>::randn(t.shape(), DType::f64, &g).mul(0.5).add(n == "query" ? 0.0 : 1.0));
    }
  const Tensor<B> emb = Tensor<B>::randn({2, 3, 6}, DType::f64, &g), w = Tensor<B>::randn({6, 6}, DType::f64, &g);
  std::vector<std::pair<std::string, Var<B>>> params;
  for (auto& [n, p] : r1.named_parameters()) params.emplace_back("r1." + n, p);
  for (auto& [n, p] : r2.named_parameters()) params.emplace_back("r2." + n, p);
  for (auto& [n, p] : fin.named_parameters()) params.emplace_back("final." + n, p);
  test::check_param_grads<B>(params, [&] {
    AttnResStack<B> s(Var<B>(emb), 2);
    for (int j = 0; j < 5; ++j) s.step(j % 2 ? r2 : r1, [&](const Var<B>& h) { return h.matmul(Var<B>(w)).tanh(); });
    return s.finish(fin).square().sum();
  });
}

TEMPLATE_TEST_CASE("attnres: two-phase inference equals the sequential form at every sublayer", "[attnres]", KILN_BACKEND_TYPES) {
  using B = TestType;
  const int64_t D = 16, n_sub = 7;
  Generator g(21);
  std::vector<std::unique_ptr<DepthAttention<B>>> res;
  for (int64_t j = 0; j < n_sub; ++j) {
    res.push_back(std::make_unique<DepthAttention<B>>(DepthAttentionOptions{.d_model = D, .key_norm_affine = j % 3 != 2}));
    for (auto& [n, p] : res.back()->named_parameters()) {
      Tensor<B> t = p.value();
      t.copy_(Tensor<B>::randn(t.shape(), DType::f32, &g).mul(n == "query" ? 1.0 : 0.3).add(n == "query" ? 0.0 : 1.0));
    }
  }
  std::vector<const DepthAttention<B>*> schedule;
  for (auto& r : res) schedule.push_back(r.get());
  const Tensor<B> emb = Tensor<B>::randn({2, 3, D}, DType::f32, &g).mul(2.0);
  const Tensor<B> w = Tensor<B>::randn({D, D}, DType::f32, &g).mul(0.5);
  NoGrad ng;
  for (int64_t S : {1, 2, 3, 4, 7, 9}) {  // full, even, odd, several blocks, one block, larger than the depth
    INFO("S = " << S);
    AttnResStack<B> seq(Var<B>(emb), S), two(Var<B>(emb), S, schedule);
    for (int64_t j = 0; j < n_sub; ++j) {
      auto f = [&](const Var<B>& h) { return h.matmul(Var<B>(w)).tanh().mul(3.0); };
      const auto a = to_vector<float>(seq.step(*res[static_cast<size_t>(j)], f).value());
      const auto b = to_vector<float>(two.step(*res[static_cast<size_t>(j)], f).value());
      INFO("sublayer " << j);
      // The two forms sum in different orders, in f32, and f amplifies the rounding from sublayer to
      // sublayer: measured up to 8e-6 apart on Reference, 2.5e-5 on the Cpu AVX2 kernels, 1.0e-5 on the
      // baseline ones (KILN_CPU_ISA=baseline), while another block size moves the outputs by more than 1.
      for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == Approx(a[i]).margin(1e-4));
    }
  }
}

TEMPLATE_TEST_CASE("attnres: GPT logits with two-phase inference equal the sequential ones", "[attnres]", KILN_BACKEND_TYPES) {
  using B = TestType;
  for (const char* residual : {"attnres_full", "attnres_block"}) {
    ModelConfig c;
    c.vocab_size = 40;
    c.d_model = 32;
    c.n_layers = 3;
    c.n_heads = 2;
    c.attention = "diff";
    c.residual = residual;
    c.attnres_block_size = 4;
    GPT<B> m(c);
    m.init_weights(5);
    for (auto& [n, p] : m.named_parameters())  // non-zero queries, so the mixtures are not plain means
      if (n.find("query") != std::string::npos) init::normal_(p, 0.0, 0.5);
    Generator g(1);
    const Tensor<B> ids = Tensor<B>::rand({2, 9}, DType::f32, &g).mul(40).to(DType::i64);
    NoGrad ng;
    const auto two = to_vector<float>(m.forward(ids).value());
    m.set_two_phase(false);
    const auto seq = to_vector<float>(m.forward(ids).value());
    for (size_t i = 0; i < seq.size(); ++i) REQUIRE(two[i] == Approx(seq[i]).margin(1e-5));
  }
}

// f64: fused and decomposed agree to 1e-11. f32: both are compared with the f64 oracle on the same
// inputs, and the fused result may be at most 4x as far from it as the decomposed f32 path is, plus
// 8 f32 ulps of the result's largest magnitude (the composite path is sometimes luckier than its
// error bound): as accurate as the composite ops, whatever the conditioning (one source is scaled
// by 40, so some logits are large; D = 1 makes the query's gradient a sum of cancelling terms).
TEMPLATE_TEST_CASE("attnres: the fused depth attention equals its decomposed oracle, values and every gradient", "[attnres]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using Results = std::vector<std::vector<double>>;
  Generator g(31);
  for (const int64_t D : {1, 7, 33})
    for (const int n : {1, 2, 5})
      for (const bool affine : {true, false}) {
        INFO("D " << D << " sources " << n << " affine " << affine);
        // f64 master values; each dtype's module and inputs are converted from them
        std::vector<Tensor<B>> params, base;
        DepthAttention<B> shape_of({.d_model = D, .key_norm_affine = affine});
        for (auto& [name, p] : shape_of.named_parameters())
          params.push_back(Tensor<B>::randn(p.shape(), DType::f64, &g).mul(0.7).add(name == "query" ? 0.0 : 1.0));
        for (int i = 0; i < n; ++i) {
          Tensor<B> t = i == 1 ? Tensor<B>::randn({3, 2, D}, DType::f64, &g) : Tensor<B>::randn({2, 3, D}, DType::f64, &g);
          base.push_back(i == 2 ? t.mul(40.0) : t);
        }
        const Tensor<B> dh64 = Tensor<B>::randn({2, 3, D}, DType::f64, &g);
        auto run = [&](DType dt, bool fused) {
          DepthAttention<B> res({.d_model = D, .eps = 1e-5, .key_norm_affine = affine, .dtype = dt});
          size_t k = 0;
          for (auto& [name, p] : res.named_parameters()) {
            Tensor<B> t = p.value();
            t.copy_(params[k++].to(dt));
          }
          std::vector<Var<B>> src;
          for (int i = 0; i < n; ++i) {
            const Tensor<B> t = base[static_cast<size_t>(i)].to(dt);
            src.emplace_back(i == 1 ? t.transpose(0, 1) : t, true);  // one source a non-contiguous view
          }
          const Var<B> h = fused ? res.forward(src) : res.forward_decomposed(src);
          (h * Var<B>(dh64.to(dt))).sum().backward();
          Results out{to_vector<double>(h.value().to(DType::f64))};
          for (auto& s : src) out.push_back(to_vector<double>(s.grad().to(DType::f64)));
          for (auto& [name, p] : res.named_parameters()) out.push_back(to_vector<double>(p.grad().to(DType::f64)));
          return out;
        };
        const Results oracle = run(DType::f64, false), fused64 = run(DType::f64, true), fused32 = run(DType::f32, true),
                      dec32 = run(DType::f32, false);
        for (size_t k = 0; k < oracle.size(); ++k) {
          INFO("result " << k << " (0: h, then each source's gradient, then the parameters')");
          REQUIRE(fused64[k].size() == oracle[k].size());
          double err_fused = 0, err_dec = 0, scale = 0;
          for (size_t i = 0; i < oracle[k].size(); ++i) {
            CHECK(fused64[k][i] == Approx(oracle[k][i]).margin(1e-11).epsilon(1e-11));
            err_fused = std::max(err_fused, std::abs(fused32[k][i] - oracle[k][i]));
            err_dec = std::max(err_dec, std::abs(dec32[k][i] - oracle[k][i]));
            scale = std::max(scale, std::abs(oracle[k][i]));
          }
          INFO("f32 max error: fused " << err_fused << ", decomposed " << err_dec << ", scale " << scale);
          CHECK(err_fused <= 4 * err_dec + 0x1p-20 * scale);
        }
      }
}

TEMPLATE_TEST_CASE("attnres: the sources get FD-correct gradients through the fused op", "[attnres]", KILN_BACKEND_TYPES) {
  using B = TestType;
  DepthAttention<B> res({.d_model = 5, .dtype = DType::f64});
  Generator g(32);
  for (auto& [name, p] : res.named_parameters()) {
    Tensor<B> t = p.value();
    t.copy_(Tensor<B>::randn(t.shape(), DType::f64, &g).add(name == "query" ? 0.0 : 1.0));
  }
  std::vector<std::pair<std::string, Var<B>>> params;
  std::vector<Var<B>> src;
  for (int i = 0; i < 3; ++i) {
    src.emplace_back(Tensor<B>::randn({2, 2, 5}, DType::f64, &g), true);
    params.emplace_back("source " + std::to_string(i), src.back());
  }
  const Tensor<B> w = Tensor<B>::randn({2, 2, 5}, DType::f64, &g);
  test::check_param_grads<B>(params, [&] { return (res.forward(src) * Var<B>(w)).sum(); });
}

TEMPLATE_TEST_CASE("attnres: the fused primitives reject bad shapes and dtypes, naming them", "[attnres][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  const T a = T::zeros({2, 3, 4}), b = T::zeros({2, 3, 5}), q = T::zeros({4});
  CHECK_THROWS_WITH(fused::depth_attention_forward<B>({a, b}, q, 1e-5), Catch::Contains("depth_attention") && Catch::Contains("[2, 3, 5]"));
  CHECK_THROWS_WITH(fused::depth_attention_forward<B>({a, a.to(DType::f64)}, q, 1e-5), Catch::Contains("f64"));
  CHECK_THROWS_WITH(fused::depth_attention_forward<B>({a}, T::zeros({5}), 1e-5), Catch::Contains("query") && Catch::Contains("[5]"));
  CHECK_THROWS_WITH(fused::depth_attention_forward<B>({T::zeros({2, 3}, DType::i64)}, T::zeros({3}), 1e-5), Catch::Contains("float"));
  CHECK_THROWS_WITH(fused::depth_attention_forward<B>({}, q, 1e-5), Catch::Contains("no sources"));
  CHECK_THROWS_WITH(fused::depth_attention_phase1<B>({a}, T::zeros({2, 5}), 1e-5),
                    Catch::Contains("depth_attention_phase1") && Catch::Contains("[2, 5]"));
  CHECK_THROWS_WITH(fused::depth_attention_merge<B>(T::zeros({2, 4}), T::zeros({2, 3}), a, T(), q, 1e-5),
                    Catch::Contains("depth_attention_merge") && Catch::Contains("[2, 4]"));
  CHECK_THROWS_WITH(fused::depth_attention_merge<B>(T::zeros({2, 3}), T::zeros({2, 3}), a, b, q, 1e-5),
                    Catch::Contains("partial") && Catch::Contains("[2, 3, 5]"));
  CHECK_THROWS_WITH(fused::depth_attention_backward<B>({a}, q, T::zeros({1, 2, 3}), T::zeros({1, 2, 3}), b), Catch::Contains("dh"));
}
