// LSTM, GRU, LSTMCell, GRUCell (nn/rnn.hpp): outputs and every gradient (input, initial state, each
// parameter) against PyTorch 1.13 in float64 on every backend (committed fixture from
// tests/nn/make_rnn_cases.py: 1-2 layers, bidirectional, batch_first, no bias, unbatched, padded batches
// by lengths, proj_size, the cells), the state dict's names loaded one to one from torch's; float64
// finite differences; f32 Cpu/Cuda against Reference; dropout between layers; init range; errors.
//
// Tolerance against PyTorch: float64 with at most a few dozen steps of products of size ≤ 6; summation
// order and libm differ by ~1e-15 relative, 1e-10 leaves room without hiding a wrong formula (a mutant in
// any gate moves values by > 1e-2).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/nn/rnn.hpp>

#include "common/kiln_test.hpp"
#include "loss/cases.hpp"
#include "nn/param_gradcheck.hpp"

using namespace kiln;
using json = nlohmann::json;
using Catch::Contains;

namespace {

const json& cases() {
  static const json j = [] {
    std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/nn/fixtures/rnn_torch.json");
    return json::parse(f);
  }();
  return j.at("cases");
}

template <Backend B> Tensor<B> array(const json& a) { return kiln::test::json_array<B>(a); }

template <Backend B> std::map<std::string, Tensor<B>> torch_params(const json& c) {
  std::map<std::string, Tensor<B>> sd;
  for (const auto& [name, a] : c.at("params").items()) sd.emplace(name, array<B>(a));
  return sd;
}

nn::LSTMOptions lstm_options(const json& o, DType dtype) {
  return {.input_size = o.at("input_size"),
          .hidden_size = o.at("hidden_size"),
          .num_layers = o.at("num_layers"),
          .bias = o.at("bias"),
          .batch_first = o.at("batch_first"),
          .bidirectional = o.at("bidirectional"),
          .proj_size = o.value("proj_size", int64_t{0}),
          .dtype = dtype};
}
nn::GRUOptions gru_options(const json& o, DType dtype) {
  return {.input_size = o.at("input_size"),
          .hidden_size = o.at("hidden_size"),
          .num_layers = o.at("num_layers"),
          .bias = o.at("bias"),
          .batch_first = o.at("batch_first"),
          .bidirectional = o.at("bidirectional"),
          .dtype = dtype};
}

template <Backend B> Var<B> weighted(const Var<B>& v, const json& g) { return (v * Var<B>(array<B>(g))).sum(); }

// Runs one fixture case on backend B and checks outputs and gradients.
template <Backend B> void check_case(const json& c) {
  const std::string kind = c.at("module");
  const kt::Tol tol{1e-10, 1e-12};
  Var<B> x(array<B>(c.at("x")), true);
  Var<B> h0, c0;
  if (!c.at("h0").is_null()) h0 = Var<B>(array<B>(c.at("h0")), true);
  if (!c.at("c0").is_null()) c0 = Var<B>(array<B>(c.at("c0")), true);
  const std::vector<int64_t> lengths = c.at("lengths").is_null() ? std::vector<int64_t>{} : c.at("lengths").get<std::vector<int64_t>>();
  Var<B> out, h, cn;
  std::shared_ptr<nn::Module<B>> m;
  if (kind == "LSTM") {
    auto l = std::make_shared<nn::LSTM<B>>(lstm_options(c.at("options"), DType::f64));
    l->load_state_dict(torch_params<B>(c));  // strict: the names match torch's one to one
    std::optional<nn::LSTMState<B>> st;
    if (h0.defined()) st = nn::LSTMState<B>{h0, c0};
    auto r = (*l)(x, st, lengths);
    out = r.output, h = r.h_n, cn = r.c_n;
    m = l;
  } else if (kind == "GRU") {
    auto g = std::make_shared<nn::GRU<B>>(gru_options(c.at("options"), DType::f64));
    g->load_state_dict(torch_params<B>(c));
    auto r = (*g)(x, h0.defined() ? std::optional<Var<B>>(h0) : std::nullopt, lengths);
    out = r.output, h = r.h_n;
    m = g;
  } else {
    const nn::RNNCellOptions o{.input_size = c.at("options").at("input_size"),
                               .hidden_size = c.at("options").at("hidden_size"),
                               .bias = c.at("options").at("bias"),
                               .dtype = DType::f64};
    if (kind == "LSTMCell") {
      auto l = std::make_shared<nn::LSTMCell<B>>(o);
      l->load_state_dict(torch_params<B>(c));
      auto r = (*l)(x, nn::LSTMState<B>{h0, c0});
      h = r.h, cn = r.c;
      m = l;
    } else {
      auto g = std::make_shared<nn::GRUCell<B>>(o);
      g->load_state_dict(torch_params<B>(c));
      h = (*g)(x, h0);
      m = g;
    }
  }
  Var<B> loss = weighted(h, c.at("g_h"));
  if (out.defined()) loss = loss + weighted(out, c.at("g_out"));
  if (cn.defined()) loss = loss + weighted(cn, c.at("g_c"));
  loss.backward();
  if (out.defined()) kt::check_close(out.value(), array<B>(c.at("out")), tol, "output");
  kt::check_close(h.value(), array<B>(c.at("h_n")), tol, "h_n");
  if (cn.defined()) kt::check_close(cn.value(), array<B>(c.at("c_n")), tol, "c_n");
  kt::check_close(x.grad(), array<B>(c.at("gx")), tol, "grad x");
  if (h0.defined()) kt::check_close(h0.grad(), array<B>(c.at("gh0")), tol, "grad h0");
  if (c0.defined()) kt::check_close(c0.grad(), array<B>(c.at("gc0")), tol, "grad c0");
  size_t n = 0;
  for (const auto& [name, p] : m->named_parameters()) {
    kt::check_close(p.grad(), array<B>(c.at("grads").at(name)), tol, "grad " + name);
    ++n;
  }
  CHECK(n == c.at("grads").size());
}

}  // namespace

TEMPLATE_TEST_CASE("LSTM, GRU and their cells match PyTorch 1.13 (float64, outputs and all gradients)", "[nn][rnn][torch]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  REQUIRE(cases().size() >= 17);
  for (const json& c : cases()) {
    INFO(c.at("name").get<std::string>());
    check_case<B>(c);
  }
}

TEST_CASE("LSTM and GRU parameter names and shapes are PyTorch's", "[nn][rnn]") {
  nn::LSTM<Cpu> lstm({.input_size = 3, .hidden_size = 5, .num_layers = 2, .bidirectional = true, .proj_size = 2});
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const auto& [n, p] : lstm.named_parameters()) names.push_back(n), shapes.push_back(p.shape());
  const std::vector<std::string> want{"weight_ih_l0",         "weight_hh_l0",         "bias_ih_l0",           "bias_hh_l0",
                                      "weight_hr_l0",         "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse",
                                      "bias_hh_l0_reverse",   "weight_hr_l0_reverse", "weight_ih_l1",         "weight_hh_l1",
                                      "bias_ih_l1",           "bias_hh_l1",           "weight_hr_l1",         "weight_ih_l1_reverse",
                                      "weight_hh_l1_reverse", "bias_ih_l1_reverse",   "bias_hh_l1_reverse",   "weight_hr_l1_reverse"};
  CHECK(names == want);
  CHECK(shapes[0] == Shape{20, 3});
  CHECK(shapes[1] == Shape{20, 2});
  CHECK(shapes[4] == Shape{2, 5});
  CHECK(shapes[10] == Shape{20, 4});  // layer 1 reads both directions' projected outputs
  nn::GRU<Cpu> gru({.input_size = 3, .hidden_size = 4, .bias = false});
  names.clear();
  for (const auto& [n, p] : gru.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight_ih_l0", "weight_hh_l0"});
  CHECK(gru.parameter("weight_ih_l0").shape() == Shape{12, 3});
}

TEMPLATE_TEST_CASE("LSTM and GRU init is U(-1/sqrt(hidden), 1/sqrt(hidden))", "[nn][rnn]", KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(5);
  nn::LSTM<B> lstm({.input_size = 30, .hidden_size = 25, .num_layers = 2});
  nn::GRUCell<B> cell({.input_size = 30, .hidden_size = 16});
  auto check = [](const auto& params, double k) {
    for (const auto& [n, p] : params) {
      INFO(n);
      const double mx = item<double>(p.value().abs().max()), mean = item<double>(p.value().mean());
      CHECK(mx <= k);
      CHECK(mx > 0.9 * k);
      CHECK(std::abs(mean) < 4 * k / std::sqrt(3.0 * static_cast<double>(p.numel())));  // 4 standard errors of the mean
    }
  };
  check(lstm.named_parameters(), 1.0 / 5);
  check(cell.named_parameters(), 1.0 / 4);
}

TEMPLATE_TEST_CASE("gradcheck: LSTM and GRU parameters, input and state (float64 finite differences)", "[nn][rnn][gradcheck]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  manual_seed(11);
  Generator g(3);
  for (bool bidir : {false, true}) {
    INFO("bidirectional " << bidir);
    nn::LSTM<B> lstm({.input_size = 2, .hidden_size = 3, .num_layers = 2, .bidirectional = bidir, .proj_size = 2, .dtype = DType::f64});
    nn::GRU<B> gru({.input_size = 2, .hidden_size = 3, .num_layers = 2, .batch_first = true, .bidirectional = bidir, .dtype = DType::f64});
    const int64_t D = bidir ? 2 : 1;
    Var<B> x(Tensor<B>::randn({3, 2, 2}, DType::f64, &g), true);
    Var<B> h0(Tensor<B>::randn({2 * D, 2, 2}, DType::f64, &g), true), c0(Tensor<B>::randn({2 * D, 2, 3}, DType::f64, &g), true);
    Var<B> hg(Tensor<B>::randn({2 * D, 2, 3}, DType::f64, &g), true);
    const Tensor<B> w1 = Tensor<B>::randn({3, 2, 2 * D}, DType::f64, &g), w2 = Tensor<B>::randn({2 * D, 2, 3}, DType::f64, &g);
    const Tensor<B> w3 = Tensor<B>::randn({2, 3, 3 * D}, DType::f64, &g);
    const std::vector<int64_t> lengths{3, 2};
    auto lstm_loss = [&] {
      auto [y, h, c] = lstm(x, nn::LSTMState<B>{h0, c0}, lengths);
      return (y * Var<B>(w1)).sum() + (c * Var<B>(w2)).sum() + h.square().sum();
    };
    auto params = lstm.named_parameters();
    params.emplace_back("x", x);
    params.emplace_back("h0", h0);
    params.emplace_back("c0", c0);
    kiln::test::check_param_grads<B>(params, lstm_loss);
    auto gru_loss = [&] {
      auto [y, h] = gru(x.transpose(0, 1), hg);
      return (y * Var<B>(w3)).sum() + h.square().sum();
    };
    auto gparams = gru.named_parameters();
    gparams.emplace_back("x", x);
    gparams.emplace_back("h0", hg);
    kiln::test::check_param_grads<B>(gparams, gru_loss);
  }
}

TEMPLATE_TEST_CASE("LSTM and GRU in f32 agree with Reference", "[nn][rnn]", KILN_TEST_BACKENDS) {
  using B = TestType;
  manual_seed(21);
  nn::LSTM<kt::Ref> ref_lstm({.input_size = 7, .hidden_size = 9, .num_layers = 2, .bidirectional = true});
  nn::LSTM<B> lstm({.input_size = 7, .hidden_size = 9, .num_layers = 2, .bidirectional = true});
  nn::GRU<kt::Ref> ref_gru({.input_size = 7, .hidden_size = 9, .batch_first = true});
  nn::GRU<B> gru({.input_size = 7, .hidden_size = 9, .batch_first = true});
  auto copy = [](auto& dst, const auto& src) {
    std::map<std::string, Tensor<B>> sd;
    for (const auto& [n, t] : src.state_dict()) sd.emplace(n, Tensor<B>::from_vector(to_vector<float>(t), t.shape()));
    dst.load_state_dict(sd);
  };
  copy(lstm, ref_lstm);
  copy(gru, ref_gru);
  const kt::RT xr = kt::RT::randn({6, 4, 7});
  const Tensor<B> x = Tensor<B>::from_vector(to_vector<float>(xr), xr.shape());
  const kt::Tol tol{1e-5, 1e-6};
  Var<kt::Ref> xrv(xr, true);
  Var<B> xv(x, true);
  auto [yr, hr, cr] = ref_lstm(xrv, std::nullopt, {6, 3, 1, 5});
  auto [y, h, c] = lstm(xv, std::nullopt, {6, 3, 1, 5});
  kt::check_close(y.value(), yr.value(), tol, "LSTM output");
  kt::check_close(c.value(), cr.value(), tol, "LSTM c_n");
  auto [gyr, ghr] = ref_gru(xrv);
  auto [gy, gh] = gru(xv);
  kt::check_close(gy.value(), gyr.value(), tol, "GRU output");
  (yr.sum() + hr.sum() + gyr.square().sum()).backward();
  (y.sum() + h.sum() + gy.square().sum()).backward();
  kt::check_close(xv.grad(), xrv.grad(), tol, "grad x");
  for (const auto& [n, p] : lstm.named_parameters()) kt::check_close(p.grad(), ref_lstm.parameter(n).grad(), tol, "LSTM grad " + n);
}

TEST_CASE("LSTM dropout acts between layers in training only", "[nn][rnn]") {
  manual_seed(31);
  nn::LSTM<Cpu> drop({.input_size = 4, .hidden_size = 8, .num_layers = 2, .dropout = 0.5});
  nn::LSTM<Cpu> plain({.input_size = 4, .hidden_size = 8, .num_layers = 2});
  std::map<std::string, Tensor<Cpu>> sd;
  for (const auto& [n, t] : drop.state_dict()) sd.emplace(n, t);
  plain.load_state_dict(sd);
  const Tensor<Cpu> x = Tensor<Cpu>::randn({5, 3, 4});
  const double diff_train = item<double>(drop(x).output.value().sub(plain(x).output.value()).abs().max());
  CHECK(diff_train > 1e-3);
  // the first layer's h_n is computed before any dropout
  CHECK(item<double>(drop(x).h_n.value().select(0, 0).sub(plain(x).h_n.value().select(0, 0)).abs().max()) == 0.0);
  drop.eval();
  CHECK(item<double>(drop(x).output.value().sub(plain(x).output.value()).abs().max()) == 0.0);
}

TEST_CASE("LSTM and GRU errors name the layer and the shapes", "[nn][rnn][errors]") {
  nn::LSTM<Cpu> lstm({.input_size = 3, .hidden_size = 4, .num_layers = 2});
  nn::GRU<Cpu> gru({.input_size = 3, .hidden_size = 4, .batch_first = true});
  const Tensor<Cpu> x = Tensor<Cpu>::randn({5, 2, 3});
  CHECK_THROWS_WITH(lstm(Tensor<Cpu>::randn({5, 2, 4})), Contains("LSTM: input [5, 2, 4] is not [T, N, input_size=3]"));
  CHECK_THROWS_WITH(gru(Tensor<Cpu>::randn({5, 2, 2, 3})), Contains("GRU: input [5, 2, 2, 3]") && Contains("batch_first"));
  CHECK_THROWS_WITH(lstm(x, nn::LSTMState<Cpu>{Tensor<Cpu>::zeros({1, 2, 4}), Tensor<Cpu>::zeros({2, 2, 4})}),
                    Contains("LSTM: h0 is [1, 2, 4]") && Contains("expected [2, 2, 4]"));
  CHECK_THROWS_WITH(lstm(x, nn::LSTMState<Cpu>{Tensor<Cpu>::zeros({2, 2, 4}), Tensor<Cpu>::zeros({2, 3, 4})}),
                    Contains("LSTM: c0 is [2, 3, 4]"));
  CHECK_THROWS_WITH(lstm(x, std::nullopt, {5, 6}), Contains("LSTM: length 6 outside [1, T = 5]"));
  CHECK_THROWS_WITH(lstm(x, std::nullopt, {5}), Contains("LSTM: 1 lengths for a batch of 2"));
  CHECK_THROWS_WITH(lstm(x.to(DType::f64)), Contains("LSTM: input dtype f64 differs from the parameters' f32"));
  CHECK_THROWS_WITH(nn::LSTM<Cpu>({.input_size = 3, .hidden_size = 4, .proj_size = 4}),
                    Contains("LSTM: proj_size must be in [0, hidden_size = 4)"));
  CHECK_THROWS_WITH(nn::GRU<Cpu>({.input_size = 3, .hidden_size = 0}), Contains("GRU: input_size (3), hidden_size (0)"));
  CHECK_THROWS_WITH(nn::GRU<Cpu>({.input_size = 3, .hidden_size = 2, .dropout = 1.0}), Contains("GRU: dropout must be in [0, 1)"));
  nn::LSTMCell<Cpu> cell({.input_size = 3, .hidden_size = 4});
  CHECK_THROWS_WITH(cell(Tensor<Cpu>::randn({2, 5})), Contains("LSTMCell: input [2, 5] is not [N, input_size=3]"));
  CHECK_THROWS_WITH(cell(Tensor<Cpu>::randn({2, 3}), nn::LSTMState<Cpu>{Tensor<Cpu>::zeros({2, 4}), Tensor<Cpu>::zeros({3, 4})}),
                    Contains("LSTMCell: c is [3, 4], expected [2, 4]"));
  nn::GRUCell<Cpu> gcell({.input_size = 3, .hidden_size = 4});
  CHECK_THROWS_WITH(gcell(Tensor<Cpu>::randn({2, 3}), Var<Cpu>(Tensor<Cpu>::zeros({2, 5}))), Contains("GRUCell: h is [2, 5]"));
}

TEMPLATE_TEST_CASE("gradcheck: functional lstm_cell and gru_cell (float64)", "[nn][rnn][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  Generator g(7);
  const auto rl = gradcheck<B>(
      [](const VV& v) {
        auto [h, c] = nn::functional::lstm_cell(v[0], v[1]);
        return h * 2.0 + c.square();
      },
      {Tensor<B>::randn({3, 8}, DType::f64, &g), Tensor<B>::randn({3, 2}, DType::f64, &g)});
  INFO(rl.message);
  CHECK(rl.ok);
  const auto rg = gradcheck<B>(
      [](const VV& v) { return nn::functional::gru_cell(v[0], v[1], v[2]); },
      {Tensor<B>::randn({3, 6}, DType::f64, &g), Tensor<B>::randn({3, 6}, DType::f64, &g), Tensor<B>::randn({3, 2}, DType::f64, &g)});
  INFO(rg.message);
  CHECK(rg.ok);
  CHECK_THROWS_WITH(nn::functional::lstm_cell(Var<B>(Tensor<B>::zeros({3, 7})), Var<B>(Tensor<B>::zeros({3, 2}))),
                    Contains("lstm_cell: gates [3, 7] and c [3, 2] are not [N, 4H] and [N, H]"));
}
