// PyTorch parity in float64: runs tests/conv/make_cases.py (PyTorch 1.13) at test time and checks
// the outputs, max-pool indices and gradients of kiln's conv1d, conv2d, conv_transpose2d,
// max_pool2d, avg_pool2d and adaptive_avg_pool2d on every backend, with the input passed contiguous
// and as a non-contiguous view. Without Python + torch the test FAILS (it never skips silently).
//
// Tolerance: every value is a sum of at most a few hundred products of N(0, 1) inputs (|terms| summing
// to < 500 here), so two float64 summation orders differ by < 500 · 500 · 2^-53 ≈ 3e-11 (Higham):
// atol 1e-10, plus a relative 1e-12.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <kiln/autograd/ops.hpp>
#include <kiln/nn/conv.hpp>
#include <kiln/nn/pool.hpp>

#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"

using namespace kiln;
using json = nlohmann::json;
namespace F = kiln::nn::functional;

namespace {

const json& cases() {
  static const json j = kiln::test::run_case_script("tests/conv/make_cases.py", "torch");
  return j;
}

template <Backend B> Tensor<B> array(const json& a, DType d = DType::f64) {
  return Tensor<B>::from_vector(a.at("data").get<std::vector<double>>(), a.at("shape").get<Shape>()).to(d);
}

// The same values laid out non-contiguously: a reversed-axes base permuted back.
template <Backend B> Tensor<B> strided(const Tensor<B>& t) {
  const int64_t r = t.dim();
  std::vector<int64_t> rev(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) rev[static_cast<size_t>(i)] = r - 1 - i;
  return t.permute(rev).contiguous().permute(rev);
}

Size2 size2(const json& a) { return {a.at(0).get<int64_t>(), a.at(1).get<int64_t>()}; }

template <Backend B> void run_case(const json& c, bool noncontig) {
  const std::string op = c.at("op");
  const json& args = c.at("args");
  const json& in = c.at("inputs");
  const json& out = c.at("outputs");
  INFO(c.at("name").get<std::string>() << (noncontig ? " (non-contiguous input)" : ""));
  Tensor<B> xt = array<B>(in.at("x"));
  if (noncontig) xt = strided(xt);
  Var<B> x(xt, true), w, b;
  if (in.contains("w")) w = Var<B>(array<B>(in.at("w")), true);
  if (in.contains("b")) b = Var<B>(array<B>(in.at("b")), true);
  Var<B> y;
  Tensor<B> indices;
  if (op == "conv2d") {
    y = F::conv2d(x, w, b, size2(args["stride"]), size2(args["padding"]), size2(args["dilation"]), args["groups"].get<int64_t>());
  } else if (op == "conv1d") {
    y = F::conv1d(x, w, b, args["stride"].get<int64_t>(), args["padding"].get<int64_t>(), args["dilation"].get<int64_t>(),
                  args["groups"].get<int64_t>());
  } else if (op == "conv_transpose2d") {
    y = F::conv_transpose2d(x, w, b, size2(args["stride"]), size2(args["padding"]), size2(args["output_padding"]),
                            args["groups"].get<int64_t>(), size2(args["dilation"]));
  } else if (op == "max_pool2d") {
    std::tie(y, indices) = F::max_pool2d_with_indices(x, size2(args["kernel"]), size2(args["stride"]), size2(args["padding"]),
                                                      size2(args["dilation"]), args["ceil_mode"].get<bool>());
  } else if (op == "avg_pool2d") {
    y = F::avg_pool2d(x, size2(args["kernel"]), size2(args["stride"]), size2(args["padding"]), args["ceil_mode"].get<bool>(),
                      args["count_include_pad"].get<bool>());
  } else if (op == "adaptive_avg_pool2d") {
    y = F::adaptive_avg_pool2d(x, size2(args["output_size"]));
  } else {
    FAIL("unknown op " << op);
  }
  y.backward(array<B>(in.at("g")));
  const kt::Tol tol{1e-12, 1e-10};
  kt::check_close(y.value(), array<B>(out.at("y")), tol, "output");
  if (indices.defined()) kt::check_equal(indices, array<B>(out.at("indices"), DType::i64), "indices");
  kt::check_close(x.grad(), array<B>(out.at("gx")), tol, "grad x");
  if (w.defined()) kt::check_close(w.grad(), array<B>(out.at("gw")), tol, "grad w");
  if (b.defined()) kt::check_close(b.grad(), array<B>(out.at("gb")), tol, "grad b");
}

}  // namespace

TEMPLATE_TEST_CASE("conv and pool parity with PyTorch 1.13 (float64, values and gradients)", "[conv][torch]", KILN_BACKEND_TYPES) {
  const json& cs = cases();
  REQUIRE(cs.size() >= 25);
  for (const json& c : cs) {
    run_case<TestType>(c, false);
    run_case<TestType>(c, true);
  }
}
