// Attention beyond causal self-attention (nn/attention.hpp AttentionInputs, nn/diff_attention.hpp) and
// the transformer layers and stacks (nn/transformer.hpp): properties that hold whatever the weights,
// KV caches (self and cross) against full forwards, finite-difference gradients, parameter names and
// errors. Values against PyTorch: test_transformer_torch.cpp.
#include <catch2/catch.hpp>

#include <kiln/nn/transformer.hpp>
#include "common/kiln_test.hpp"
#include "param_gradcheck.hpp"

using namespace kiln;
using namespace kiln::nn;

namespace {

template <Backend B> Tensor<B> rows_of(const Tensor<B>& x, int64_t b, const std::vector<int64_t>& idx) {
  std::vector<Tensor<B>> r;
  for (int64_t j : idx) r.push_back(x.narrow(0, b, 1).narrow(1, j, 1));
  return Tensor<B>::cat(r, 1);
}

// Both attention kinds as one callable over (x, inputs).
template <Backend B> struct Attn {
  std::shared_ptr<MultiHeadAttention<B>> mha;
  std::shared_ptr<DifferentialAttention<B>> diff;
  Var<B> operator()(const Var<B>& x, const AttentionInputs<B>& in) const { return mha ? mha->forward(x, in) : diff->forward(x, in); }
  std::vector<std::pair<std::string, Var<B>>> params() const { return mha ? mha->named_parameters() : diff->named_parameters(); }
};

template <Backend B> Attn<B> make(bool diff, int64_t D, int64_t h, int64_t hkv, bool causal, bool rope, DType dt = DType::f64) {
  Attn<B> a;
  if (diff)
    a.diff = std::make_shared<DifferentialAttention<B>>(
        DiffAttentionOptions{.d_model = D, .n_heads = h, .n_kv_heads = hkv, .depth = 2, .causal = causal, .rope = rope, .dtype = dt});
  else
    a.mha = std::make_shared<MultiHeadAttention<B>>(
        AttentionOptions{.d_model = D, .n_heads = h, .n_kv_heads = hkv, .causal = causal, .rope = rope, .dtype = dt});
  return a;
}

}  // namespace

TEMPLATE_TEST_CASE("nn: cross-attention with memory key padding equals attending to the unpadded memory (MHA, Diff, GQA)",
                   "[nn][attention]", KILN_BACKEND_TYPES) {
  using B = TestType;
  for (bool diff : {false, true}) {
    INFO((diff ? "Diff" : "MHA"));
    manual_seed(3);
    const Attn<B> a = make<B>(diff, 32, 4, 2, false, false);
    Generator g(4);
    const Tensor<B> x = Tensor<B>::randn({2, 5, 32}, DType::f64, &g), mem = Tensor<B>::randn({2, 7, 32}, DType::f64, &g);
    const std::vector<std::vector<int64_t>> kept{{1, 2, 4, 5, 6}, {0, 1, 2, 3}};
    std::vector<uint8_t> keep(14, 0);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j : kept[static_cast<size_t>(b)]) keep[static_cast<size_t>(b * 7 + j)] = 1;
    const Tensor<B> kp = Tensor<B>::from_vector(keep, {2, 7});
    NoGrad ng;
    const Tensor<B> y = a(Var<B>(x), {.memory = Var<B>(mem), .key_padding = kp}).value();
    CHECK(y.shape() == Shape({2, 5, 32}));
    for (int64_t b = 0; b < 2; ++b) {
      const Tensor<B> ref = a(Var<B>(x.narrow(0, b, 1)), {.memory = Var<B>(rows_of(mem, b, kept[static_cast<size_t>(b)]))}).value();
      kt::check_close(y.narrow(0, b, 1), ref, {1e-12, 1e-12}, "batch row");
    }
    // a bool mask [1, 1, 1, S] equal to the padding of batch 0 gives batch 0's rows
    std::vector<uint8_t> m0(keep.begin(), keep.begin() + 7);
    const Tensor<B> y0 = a(Var<B>(x), {.memory = Var<B>(mem), .mask = Tensor<B>::from_vector(m0, {1, 1, 1, 7})}).value();
    kt::check_close(y0.narrow(0, 0, 1), y.narrow(0, 0, 1), {1e-12, 1e-12}, "mask = padding");
  }
}

TEMPLATE_TEST_CASE("nn: attention masks — additive −inf equals bool false, a per-row constant changes nothing, all-true is no mask",
                   "[nn][attention]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (bool diff : {false, true}) {
    for (bool causal : {false, true}) {
      INFO((diff ? "Diff" : "MHA") << " causal " << causal);
      manual_seed(5);
      const Attn<B> a = make<B>(diff, 16, 2, 1, causal, true);
      Generator g(6);
      const T x = T::randn({2, 6, 16}, DType::f64, &g);
      NoGrad ng;
      const T plain = a(Var<B>(x), {}).value();
      kt::check_close(a(Var<B>(x), {.mask = T::ones({6, 6}, DType::boolean)}).value(), plain, {0, 0}, "all-true mask");
      // softmax is shift-invariant per row: an additive mask [B, 1, T, 1] (broadcast along keys) changes nothing
      const T shift = T::randn({2, 1, 6, 1}, DType::f64, &g);
      kt::check_close(a(Var<B>(x), {.mask = shift}).value(), plain, {1e-12, 1e-12}, "row shift");
      // a random bool [T, S] mask (diagonal kept) and its additive twin
      T keep = T::rand({6, 6}, DType::f64, &g).gt(0.4);
      keep = keep.logical_or(T::arange(6).unsqueeze(1).eq(T::arange(6).unsqueeze(0)));  // the diagonal
      const T add = T::where(keep, T::zeros({}, DType::f64), T::full({}, -INFINITY, DType::f64));
      const T yb = a(Var<B>(x), {.mask = keep}).value(), ya = a(Var<B>(x), {.mask = add}).value();
      kt::check_close(ya, yb, {0, 0}, "additive -inf vs bool false");
      CHECK(to_vector<double>(yb) != to_vector<double>(plain));
    }
  }
}

TEMPLATE_TEST_CASE("nn: causal=false self-attention is bidirectional, causal=true top-left (MHA, Diff)", "[nn][attention]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (bool diff : {false, true}) {
    INFO((diff ? "Diff" : "MHA"));
    manual_seed(7);
    Attn<B> bi = make<B>(diff, 16, 2, 2, false, false), ca = make<B>(diff, 16, 2, 2, true, false);
    std::map<std::string, T> sd;
    for (auto& [n, p] : bi.params()) sd[n] = p.value();
    if (diff)
      ca.diff->load_state_dict(sd);
    else
      ca.mha->load_state_dict(sd);
    Generator g(8);
    const T x = T::randn({1, 5, 16}, DType::f64, &g);
    NoGrad ng;
    // a lower-triangular bool mask makes the bidirectional module causal
    std::vector<uint8_t> tri(25, 0);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j <= i; ++j) tri[static_cast<size_t>(i * 5 + j)] = 1;
    kt::check_close(bi(Var<B>(x), {.mask = T::from_vector(tri, {5, 5})}).value(), ca(Var<B>(x), {}).value(), {1e-12, 1e-12}, "tri mask");
    // the last row sees every key either way; the first differs
    const T yb = bi(Var<B>(x), {}).value(), yc = ca(Var<B>(x), {}).value();
    kt::check_close(yb.narrow(1, 4, 1), yc.narrow(1, 4, 1), {1e-12, 1e-12}, "last row");
    CHECK(to_vector<double>(yb.narrow(1, 0, 1)) != to_vector<double>(yc.narrow(1, 0, 1)));
  }
}

TEMPLATE_TEST_CASE("nn: cross-attention KV cache projects the memory once and equals the uncached forward", "[nn][attention]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (bool diff : {false, true}) {
    INFO((diff ? "Diff" : "MHA"));
    manual_seed(9);
    const Attn<B> a = make<B>(diff, 32, 4, 2, false, false);
    Generator g(10);
    const T x = T::randn({2, 4, 32}, DType::f64, &g), mem = T::randn({2, 9, 32}, DType::f64, &g);
    const T kp = T::rand({2, 9}, DType::f64, &g).gt(0.3).logical_or(T::arange(0, 9, 1, DType::f64).eq(0.0).unsqueeze(0));
    NoGrad ng;
    const T full = a(Var<B>(x), {.memory = Var<B>(mem), .key_padding = kp}).value();
    KVCache<B> cache;
    std::vector<T> parts;
    for (int64_t t = 0; t < 4; ++t)
      parts.push_back(a(Var<B>(x.narrow(1, t, 1)), {.memory = Var<B>(mem), .key_padding = kp, .cache = &cache}).value());
    CHECK(cache.len == 9);
    kt::check_close(T::cat(parts, 1), full, {1e-12, 1e-12}, "cached cross-attention");
    // the cached keys are reused: a memory of another length is refused until reset
    CHECK_THROWS_WITH(a(Var<B>(x), {.memory = Var<B>(mem.narrow(1, 0, 5)), .cache = &cache}), Catch::Contains("reset"));
    cache.reset();
    const T shorter = a(Var<B>(x), {.memory = Var<B>(mem.narrow(1, 0, 5)), .cache = &cache}).value();
    kt::check_close(shorter, a(Var<B>(x), {.memory = Var<B>(mem.narrow(1, 0, 5))}).value(), {1e-12, 1e-12}, "after reset");
  }
}

TEMPLATE_TEST_CASE("nn: attention modules' gradients with memory, masks and padding (f64 finite differences)", "[nn][attention]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (bool diff : {false, true}) {
    INFO((diff ? "Diff" : "MHA"));
    manual_seed(11);
    const Attn<B> a = make<B>(diff, 16, 2, 1, false, false);
    Generator g(12);
    const T x = T::randn({2, 3, 16}, DType::f64, &g), r = T::randn({2, 3, 16}, DType::f64, &g);
    Var<B> mem(T::randn({2, 5, 16}, DType::f64, &g), true);
    T kp = T::ones({2, 5}, DType::boolean);
    kp.narrow(1, 1, 1).fill_(0);
    const T mask = T::randn({1, 2, 3, 5}, DType::f64, &g);  // additive, per head
    auto params = a.params();
    params.emplace_back("memory", mem);
    test::check_param_grads<B>(params, [&] { return (a(Var<B>(x), {.memory = mem, .key_padding = kp, .mask = mask}) * Var<B>(r)).sum(); });
  }
}

TEMPLATE_TEST_CASE("nn: attention modules' errors name the op and shapes", "[nn][attention][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (bool diff : {false, true}) {
    const char* op = diff ? "DifferentialAttention" : "MultiHeadAttention";
    INFO(op);
    const Attn<B> roped = make<B>(diff, 16, 2, 1, false, true, DType::f32), plain = make<B>(diff, 16, 2, 1, true, false, DType::f32);
    const Var<B> x(T::randn({2, 3, 16}));
    CHECK_THROWS_WITH(roped(x, {.memory = Var<B>(T::randn({2, 5, 16}))}), Catch::Contains(op) && Catch::Contains("rope = false"));
    CHECK_THROWS_WITH(plain(x, {.memory = Var<B>(T::randn({3, 5, 16}))}), Catch::Contains(op) && Catch::Contains("[3, 5, 16]"));
    CHECK_THROWS_WITH(plain(x, {.memory = Var<B>(T::randn({2, 5, 8}))}), Catch::Contains(op) && Catch::Contains("[2, 5, 8]"));
    KVCache<B> c;
    CHECK_THROWS_WITH(plain(x, {.memory = Var<B>(T::randn({2, 5, 16})), .cache = &c}), Catch::Contains("causal cross-attention"));
    // the fused op that runs the module names itself: attention_forward, or diff_attention_norm_forward
    // (differential attention with its head-wise norm in the op's epilogue)
    CHECK_THROWS_WITH(plain(x, {.mask = T::ones({4, 3}, DType::boolean)}),
                      Catch::Contains(diff ? "diff_attention_norm_forward" : "attention_forward") && Catch::Contains("mask [4, 3]") &&
                          Catch::Contains("[2, 2, 3, 3]"));
    CHECK_THROWS_WITH(plain(x, {.mask = T::ones({3, 3}, DType::i32)}), Catch::Contains("mask") && Catch::Contains("i32"));
    CHECK_THROWS_WITH(plain(x, {.mask = T::zeros({3, 3}, DType::f64)}), Catch::Contains("mask") && Catch::Contains("f64"));
    CHECK_THROWS_WITH(plain(x, {.key_padding = T::ones({2, 4}, DType::boolean)}), Catch::Contains("key_padding"));
  }
}

// ------------------------------------------------------------------------------------------ layers
TEMPLATE_TEST_CASE("nn: transformer layers and stacks name their parameters as PyTorch (and by attention kind)", "[nn][transformer]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  auto names = [](const auto& m) {
    std::vector<std::string> n;
    for (const auto& [k, v] : m.named_parameters()) n.push_back(k);
    return n;
  };
  const TransformerLayerOptions o{.d_model = 16, .n_heads = 2, .dim_feedforward = 8};
  const std::vector<std::string> dec = names(TransformerDecoderLayer<B>(o));
  CHECK(dec == std::vector<std::string>{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                        "self_attn.out_proj.weight", "multihead_attn.q_proj.weight", "multihead_attn.k_proj.weight",
                                        "multihead_attn.v_proj.weight", "multihead_attn.out_proj.weight", "linear1.weight", "linear1.bias",
                                        "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                                        "norm3.weight", "norm3.bias"});
  TransformerLayerOptions d = o;
  d.attention = AttentionKind::diff;
  d.norm = NormKind::rms_norm;
  d.bias = false;
  const std::vector<std::string> enc = names(TransformerEncoder<B>({.layer = d, .num_layers = 2, .final_norm = true}));
  CHECK(enc.front() == "layers.0.self_attn.lambda_q1");
  CHECK(std::count(enc.begin(), enc.end(), "layers.1.norm2.weight") == 1);
  CHECK(enc.back() == "norm.weight");
  CHECK(std::count(enc.begin(), enc.end(), "layers.0.linear1.bias") == 0);
  // layer i of a stack has depth i: Diff's λ_init differs
  TransformerEncoder<B> s({.layer = d, .num_layers = 2});
  CHECK(s.layers()[1]->options().depth == 1);
}

TEMPLATE_TEST_CASE("nn: encoder layer with source key padding equals the layer on the unpadded source (MHA, Diff)", "[nn][transformer]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (auto kind : {AttentionKind::mha, AttentionKind::diff}) {
    for (bool norm_first : {false, true}) {
      INFO("diff " << (kind == AttentionKind::diff) << " norm_first " << norm_first);
      manual_seed(21);
      TransformerEncoderLayer<B> l({.d_model = 16,
                                    .n_heads = 2,
                                    .dim_feedforward = 24,
                                    .dropout = 0.0,
                                    .norm_first = norm_first,
                                    .attention = kind,
                                    .dtype = DType::f64});
      Generator g(22);
      const T x = T::randn({2, 6, 16}, DType::f64, &g);
      const std::vector<std::vector<int64_t>> kept{{0, 1, 2, 3}, {0, 2, 3, 4, 5}};
      std::vector<uint8_t> keep(12, 0);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t j : kept[static_cast<size_t>(b)]) keep[static_cast<size_t>(b * 6 + j)] = 1;
      NoGrad ng;
      const T y = l.forward(Var<B>(x), T::from_vector(keep, {2, 6})).value();
      for (int64_t b = 0; b < 2; ++b) {
        const auto& ks = kept[static_cast<size_t>(b)];
        kt::check_close(rows_of(y, b, ks), l.forward(Var<B>(rows_of(x, b, ks))).value(), {1e-12, 1e-12}, "kept rows");
      }
    }
  }
}

TEMPLATE_TEST_CASE("nn: decoder stack greedy decoding with a DecoderCache equals the full forward (MHA, Diff, GQA, rope)",
                   "[nn][transformer]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  for (auto kind : {AttentionKind::mha, AttentionKind::diff}) {
    for (bool rope : {false, true}) {
      INFO("diff " << (kind == AttentionKind::diff) << " rope " << rope);
      manual_seed(31);
      TransformerDecoder<B> dec({.layer = {.d_model = 32,
                                           .n_heads = 4,
                                           .n_kv_heads = 2,
                                           .dim_feedforward = 48,
                                           .dropout = 0.0,
                                           .norm_first = true,
                                           .attention = kind,
                                           .rope = rope,
                                           .max_seq_len = 16,
                                           .dtype = DType::f64},
                                 .num_layers = 2,
                                 .final_norm = true});
      Generator g(32);
      const T tgt = T::randn({2, 5, 32}, DType::f64, &g), mem = T::randn({2, 7, 32}, DType::f64, &g);
      T mkp = T::ones({2, 7}, DType::boolean);
      mkp.narrow(0, 1, 1).narrow(1, 5, 2).fill_(0);
      NoGrad ng;
      const T full = dec.forward(Var<B>(tgt), Var<B>(mem), {.memory_key_padding = mkp}).value();
      DecoderCache<B> cache;
      std::vector<T> steps{dec.forward(Var<B>(tgt.narrow(1, 0, 2)), Var<B>(mem), {.memory_key_padding = mkp, .cache = &cache}).value()};
      for (int64_t t = 2; t < 5; ++t)
        steps.push_back(dec.forward(Var<B>(tgt.narrow(1, t, 1)), Var<B>(mem), {.memory_key_padding = mkp, .cache = &cache}).value());
      CHECK(cache.self.size() == 2);
      CHECK(cache.self[1].len == 5);
      CHECK(cache.cross[0].len == 7);
      kt::check_close(T::cat(steps, 1), full, {1e-12, 1e-12}, "cached decoding");
      // a new batch after reset
      cache.reset();
      const T one = dec.forward(Var<B>(tgt.narrow(0, 0, 1).narrow(1, 0, 1)), Var<B>(mem.narrow(0, 0, 1)), {.cache = &cache}).value();
      kt::check_close(one, dec.forward(Var<B>(tgt.narrow(0, 0, 1).narrow(1, 0, 1)), Var<B>(mem.narrow(0, 0, 1))).value(), {1e-12, 1e-12},
                      "after reset");
    }
  }
}

TEMPLATE_TEST_CASE("nn: encoder and decoder layers' gradients (f64 finite differences, Diff + RMSNorm + GQA)", "[nn][transformer]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  manual_seed(41);
  const TransformerLayerOptions o{.d_model = 16,
                                  .n_heads = 2,
                                  .n_kv_heads = 1,
                                  .dim_feedforward = 12,
                                  .dropout = 0.0,
                                  .activation = Activation::gelu,
                                  .norm = NormKind::rms_norm,
                                  .attention = AttentionKind::diff,
                                  .depth = 1,
                                  .dtype = DType::f64};
  TransformerEncoderLayer<B> enc(o);
  TransformerDecoderLayer<B> dec(o);
  Generator g(42);
  const T src = T::randn({2, 4, 16}, DType::f64, &g), tgt = T::randn({2, 3, 16}, DType::f64, &g), r = T::randn({2, 3, 16}, DType::f64, &g);
  T skp = T::ones({2, 4}, DType::boolean);
  skp.narrow(0, 1, 1).narrow(1, 0, 1).fill_(0);
  auto params = enc.named_parameters();
  for (auto& [n, p] : dec.named_parameters()) params.emplace_back("dec." + n, p);
  test::check_param_grads<B>(params, [&] {
    const Var<B> mem = enc.forward(Var<B>(src), skp);
    return (dec.forward(Var<B>(tgt), mem, {.memory_key_padding = skp}) * Var<B>(r)).sum();
  });
}

TEMPLATE_TEST_CASE("nn: transformer layers check their inputs", "[nn][transformer][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  CHECK_THROWS_WITH(TransformerEncoderLayer<B>({.d_model = 16, .n_heads = 0}), Catch::Contains("TransformerEncoderLayer"));
  CHECK_THROWS_WITH(TransformerEncoder<B>({.layer = {.d_model = 16, .n_heads = 2}, .num_layers = 0}), Catch::Contains("num_layers"));
  TransformerDecoderLayer<B> dec({.d_model = 16, .n_heads = 2, .dim_feedforward = 8});
  CHECK_THROWS_WITH(dec.forward(Var<B>(T::randn({2, 3, 16})), Var<B>()), Catch::Contains("memory"));
  CHECK_THROWS_WITH(dec.forward(Var<B>(T::randn({2, 3, 16})), Var<B>(T::randn({1, 4, 16}))), Catch::Contains("memory [1, 4, 16]"));
  CHECK_THROWS_WITH(
      dec.forward(Var<B>(T::randn({2, 3, 16})), Var<B>(T::randn({2, 4, 16})), {.memory_key_padding = T::ones({2, 3}, DType::boolean)}),
      Catch::Contains("key_padding"));
}
