// PyTorch parity in float64: runs tests/loss/make_cases.py (PyTorch 1.13) at test time and checks the
// values and the gradients (of sum(out * g), g drawn by the script) of every loss in nn/loss.hpp on
// every backend, random shapes, every reduction, weights, pos_weight, ignore_index, the clamped
// extremes (bce at p = 0 and 1, logits of ±800). Without Python + torch the test FAILS.
//
// Tolerance: each value is at most a sum of a few hundred terms of magnitude <= 100 (the clamped logs),
// so two float64 summation orders differ by < 1e-10; gradients of 1/max(p(1 − p), 1e-12) reach 1e12,
// hence the relative part.
#include <nlohmann/json.hpp>

#include <kiln/nn/loss.hpp>

#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"
#include "loss/cases.hpp"

using namespace kiln;
using json = nlohmann::json;

namespace {

const json& cases() {
  static const json j = kiln::test::run_case_script("tests/loss/make_cases.py", "torch");
  return j;
}

template <Backend B> Tensor<B> array(const json& a) { return kiln::test::json_array<B>(a); }

template <Backend B> void run_case(const json& c) {
  const std::string op = c.at("op");
  const json& args = c.at("args");
  const json& in = c.at("inputs");
  const json& out = c.at("outputs");
  INFO(c.at("name").get<std::string>());
  std::map<std::string, Var<B>> v;
  for (const json& name : c.at("grad")) v[name] = Var<B>(array<B>(in.at(name.get<std::string>())), true);
  auto cst = [&](const char* name) { return in.contains(name) ? array<B>(in.at(name)) : Tensor<B>(); };
  const nn::Reduction red = nn::reduction_from_string(args.value("reduction", std::string("mean")));
  Var<B> y;
  if (op == "binary_cross_entropy") {
    y = nn::binary_cross_entropy(v["x"], v["y"], {.weight = cst("weight"), .reduction = red});
  } else if (op == "binary_cross_entropy_with_logits") {
    y = nn::binary_cross_entropy_with_logits(v["x"], v["y"], {.weight = cst("weight"), .reduction = red, .pos_weight = cst("pos_weight")});
  } else if (op == "nll_loss") {
    y = nn::nll_loss(v["x"], cst("target"),
                     {.weight = cst("weight"), .ignore_index = args.at("ignore_index").get<int64_t>(), .reduction = red});
  } else if (op == "l1_loss") {
    y = nn::l1_loss(v["x"], v["y"], red);
  } else if (op == "smooth_l1_loss") {
    y = nn::smooth_l1_loss(v["x"], v["y"], {.reduction = red, .beta = args.at("beta").get<double>()});
  } else if (op == "huber_loss") {
    y = nn::huber_loss(v["x"], v["y"], {.reduction = red, .delta = args.at("delta").get<double>()});
  } else if (op == "kl_div") {
    const Var<B> target = v.count("y") ? v["y"] : Var<B>(cst("target"));
    y = nn::kl_div(v["x"], target, {.reduction = red, .log_target = args.at("log_target").get<bool>()});
  } else if (op == "cosine_similarity") {
    y = nn::cosine_similarity(v["x1"], v["x2"], args.at("dim").get<int64_t>(), args.at("eps").get<double>());
  } else if (op == "cosine_embedding_loss") {
    y = nn::cosine_embedding_loss(v["x1"], v["x2"], cst("target"), {.margin = args.at("margin").get<double>(), .reduction = red});
  } else {
    FAIL("unknown op " << op);
  }
  y.backward(array<B>(in.at("g")));
  const kt::Tol tol{1e-12, 1e-10};
  kt::check_close(y.value(), array<B>(out.at("out")), tol, "output");
  const json skip = c.value("skip", json::array());
  for (const auto& [name, var] : v)
    if (std::find(skip.begin(), skip.end(), "g" + name) == skip.end())
      kt::check_close(var.grad(), array<B>(out.at("g" + name)), tol, "grad " + name);
}

}  // namespace

TEMPLATE_TEST_CASE("losses match PyTorch 1.13 (float64, values and gradients)", "[loss][torch]", KILN_BACKEND_TYPES) {
  const json& cs = cases();
  REQUIRE(cs.size() >= 50);
  for (const json& c : cs) run_case<TestType>(c);
}
