// Masked attention modules against PyTorch 1.13 in float64: tests/nn/make_attention_cases.py (run at
// test time) builds nn.MultiheadAttention(bias=False, batch_first=True), nn.TransformerEncoderLayer
// and nn.TransformerDecoderLayer (attention biases zeroed, dropout 0) with key padding and attention
// masks (bool, additive, per head), and records the output and every gradient of sum(y · r); kiln's
// MultiHeadAttention (rope = false, causal = false, self and cross) and TransformerEncoderLayer /
// TransformerDecoderLayer (post- and pre-norm, relu and gelu) must reproduce them on every backend.
// Without Python + torch the test FAILS (never skips silently).
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <kiln/nn/transformer.hpp>
#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"

using namespace kiln;
using namespace kiln::nn;
using json = nlohmann::json;

namespace {

const json& cases() {
  static const json j = kiln::test::run_case_script("tests/nn/make_attention_cases.py", "torch");
  return j;
}

double num(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    return std::nan("");
  }
  return v.get<double>();
}

int64_t geti(const json& c, const char* k) { return c.at(k).get<int64_t>(); }
bool getb(const json& c, const char* k) { return c.at(k).get<bool>(); }

template <Backend B> Tensor<B> array(const json& a) {
  std::vector<double> v;
  for (const auto& x : a.at("data")) v.push_back(num(x));
  const Tensor<B> t = Tensor<B>::from_vector(v, a.at("shape").template get<Shape>());
  return a.at("dtype") == "bool" ? t.ne(0.0) : t;
}

template <Backend B> Tensor<B> input(const json& c, const char* name) {
  const json& in = c.at("inputs");
  return in.contains(name) ? array<B>(in.at(name)) : Tensor<B>();
}

// Loads the case's parameters into m, runs `run` (which returns y from the inputs), and compares y
// and the gradients of sum(y · r) with PyTorch's.
template <Backend B, class M, class F> void check(const std::string& name, const json& c, M& m, F run) {
  INFO("case " << name);
  std::map<std::string, Tensor<B>> state;
  for (const auto& [k, v] : c.at("params").items()) state[k] = array<B>(v);
  m.load_state_dict(state);
  Var<B> x(input<B>(c, "x"), true);
  Var<B> mem;
  if (c.at("inputs").contains("memory")) mem = Var<B>(input<B>(c, "memory"), true);
  m.zero_grad();
  const Var<B> y = run(x, mem);
  const kt::Tol tol{1e-11, 1e-10};
  kt::check_close(y.value(), array<B>(c.at("y")), tol, "y");
  (y * Var<B>(input<B>(c, "r"))).sum().backward();
  for (const auto& [k, g] : c.at("grads").items()) {
    const Tensor<B> got = k == "x" ? x.grad() : k == "memory" ? mem.grad() : m.parameter(k).grad();
    REQUIRE(got.defined());
    kt::check_close(got, array<B>(g), tol, "grad " + k);
  }
  // and every kiln parameter has a PyTorch gradient to meet
  for (const auto& [k, p] : m.named_parameters()) CHECK(c.at("grads").contains(k));
}

}  // namespace

TEMPLATE_TEST_CASE("nn: MultiHeadAttention with key padding and attention masks equals torch's MultiheadAttention (f64)", "[nn][torch]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  int n = 0;
  for (const auto& [name, c] : cases().items()) {
    if (c.at("kind") != "mha") continue;
    ++n;
    MultiHeadAttention<B> m({.d_model = geti(c, "E"), .n_heads = geti(c, "H"), .causal = false, .rope = false, .dtype = DType::f64});
    check<B>(name, c, m, [&](const Var<B>& x, const Var<B>& mem) {
      return m.forward(x, {.memory = mem, .key_padding = input<B>(c, "key_padding"), .mask = input<B>(c, "mask")});
    });
  }
  CHECK(n == 5);
}

TEMPLATE_TEST_CASE("nn: TransformerEncoderLayer and TransformerDecoderLayer equal torch's (f64, post- and pre-norm)", "[nn][torch]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  int n = 0;
  for (const auto& [name, c] : cases().items()) {
    const std::string kind = c.at("kind");
    if (kind == "mha") continue;
    ++n;
    const TransformerLayerOptions o{.d_model = geti(c, "E"),
                                    .n_heads = geti(c, "H"),
                                    .dim_feedforward = geti(c, "F"),
                                    .dropout = 0.0,
                                    .activation = c.at("activation") == "gelu" ? Activation::gelu : Activation::relu,
                                    .norm_first = getb(c, "norm_first"),
                                    .dtype = DType::f64};
    if (kind == "enc") {
      TransformerEncoderLayer<B> l(o);
      check<B>(name, c, l,
               [&](const Var<B>& x, const Var<B>&) { return l.forward(x, input<B>(c, "src_key_padding"), input<B>(c, "src_mask")); });
    } else {
      TransformerDecoderLayer<B> l(o);
      check<B>(name, c, l, [&](const Var<B>& x, const Var<B>& mem) {
        return l.forward(x, mem,
                         {.tgt_key_padding = input<B>(c, "tgt_key_padding"),
                          .tgt_mask = input<B>(c, "tgt_mask"),
                          .memory_key_padding = input<B>(c, "memory_key_padding"),
                          .memory_mask = input<B>(c, "memory_mask")});
      });
    }
  }
  CHECK(n == 4);
}
