// nn layers (parameter names, shapes, PyTorch's default init bounds, forward shapes) and the errors
// bad shapes and options raise (naming the op and the values).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <kiln/autograd/ops.hpp>
#include <kiln/nn/conv.hpp>
#include <kiln/nn/pool.hpp>

#include "common/kiln_test.hpp"

using namespace kiln;
namespace F = kiln::nn::functional;
using Catch::Matchers::Contains;

namespace {

template <Backend B> std::map<std::string, Shape> param_shapes(const nn::Module<B>& m) {
  std::map<std::string, Shape> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.shape();
  return out;
}

// every value within ±bound, and the values spread over most of it (a uniform init, not a constant)
template <Backend B> void check_uniform(const Var<B>& p, double bound, const std::string& what) {
  INFO(what << " bound " << bound);
  const std::vector<double> v = p.value().template to_vector<double>();
  double lo = 1e300, hi = -1e300;
  for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x);
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  if (v.size() >= 50) {
    CHECK(lo < -0.8 * bound);
    CHECK(hi > 0.8 * bound);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("Conv1d, Conv2d, ConvTranspose2d: parameters, init, shapes", "[conv][nn]", KILN_BACKEND_TYPES) {
  using B = TestType;
  nn::Conv2d<B> c2({.in_channels = 6, .out_channels = 8, .kernel_size = {3, 5}, .stride = 2, .padding = {1, 2}, .groups = 2});
  CHECK(param_shapes(c2) == std::map<std::string, Shape>{{"weight", {8, 3, 3, 5}}, {"bias", {8}}});
  check_uniform(c2.weight(), 1.0 / std::sqrt(3.0 * 15), "Conv2d weight");  // fan_in = C/groups·kh·kw
  check_uniform(c2.bias(), 1.0 / std::sqrt(3.0 * 15), "Conv2d bias");
  CHECK(c2(Var<B>(Tensor<B>::randn({2, 6, 9, 10}))).shape() == Shape{2, 8, 5, 5});
  CHECK(c2(Var<B>(Tensor<B>::randn({6, 9, 10}))).shape() == Shape{8, 5, 5});

  nn::Conv2d<B> nb({.in_channels = 3, .out_channels = 4, .kernel_size = 1, .bias = false});
  CHECK(param_shapes(nb) == std::map<std::string, Shape>{{"weight", {4, 3, 1, 1}}});

  nn::Conv1d<B> c1({.in_channels = 4, .out_channels = 6, .kernel_size = 3, .stride = 2, .padding = 1, .dilation = 2, .groups = 2});
  CHECK(param_shapes(c1) == std::map<std::string, Shape>{{"weight", {6, 2, 3}}, {"bias", {6}}});
  check_uniform(c1.weight(), 1.0 / std::sqrt(6.0), "Conv1d weight");
  CHECK(c1(Var<B>(Tensor<B>::randn({2, 4, 11}))).shape() == Shape{2, 6, 5});
  CHECK(c1(Var<B>(Tensor<B>::randn({4, 11}))).shape() == Shape{6, 5});

  nn::ConvTranspose2d<B> ct(
      {.in_channels = 4, .out_channels = 6, .kernel_size = 3, .stride = 2, .padding = 1, .output_padding = 1, .groups = 2});
  CHECK(param_shapes(ct) == std::map<std::string, Shape>{{"weight", {4, 3, 3, 3}}, {"bias", {6}}});
  check_uniform(ct.weight(), 1.0 / std::sqrt(27.0), "ConvTranspose2d weight");  // PyTorch's fan_in: weight.size(1)·kh·kw
  CHECK(ct(Var<B>(Tensor<B>::randn({2, 4, 5, 7}))).shape() == Shape{2, 6, 10, 14});

  // One designated initialiser for both option structs: it compiles only while the fields they share
  // come in the same order (C++ requires the declaration order), as the options of torch's two layers
  // share keyword names.
  const auto opts = []<class O>(O) {
    return O{.in_channels = 4,
             .out_channels = 6,
             .kernel_size = 3,
             .stride = 2,
             .padding = 2,
             .dilation = 2,
             .groups = 2,
             .bias = false,
             .dtype = DType::f64};
  };
  const auto co = opts(nn::Conv2dOptions{});
  const auto cto = opts(nn::ConvTranspose2dOptions{});
  CHECK(cto.dilation == Size2{2});
  CHECK(cto.groups == 2);
  CHECK_FALSE(cto.bias);
  nn::Conv2d<B> same(co);
  nn::ConvTranspose2d<B> same_t(cto);
  CHECK(param_shapes(same_t) == std::map<std::string, Shape>{{"weight", {4, 3, 3, 3}}});
  // (5 − 1)·2 − 2·2 + 2·(3 − 1) + 1 = 9, and conv2d maps it back: ⌊(9 + 4 − 4 − 1)/2⌋ + 1 = 5
  const Var<B> up = same_t(Var<B>(Tensor<B>::randn({1, 4, 5, 5}, DType::f64)));
  CHECK(up.shape() == Shape{1, 6, 9, 9});
  CHECK(same(Var<B>(Tensor<B>::randn({1, 4, 9, 9}, DType::f64))).shape() == Shape{1, 6, 5, 5});
}

TEMPLATE_TEST_CASE("pooling modules and Flatten: shapes and defaults", "[pool][nn]", KILN_BACKEND_TYPES) {
  using B = TestType;
  const Var<B> x(Tensor<B>::randn({2, 3, 9, 8}));
  CHECK(nn::MaxPool2d<B>({.kernel_size = 2})(x).shape() == Shape{2, 3, 4, 4});  // stride defaults to kernel_size
  CHECK(nn::MaxPool2d<B>({.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true})(x).shape() == Shape{2, 3, 5, 5});
  CHECK(nn::MaxPool2d<B>({.kernel_size = 2, .stride = 1, .dilation = 2})(x).shape() == Shape{2, 3, 7, 6});
  CHECK(nn::AvgPool2d<B>({.kernel_size = {3, 2}})(x).shape() == Shape{2, 3, 3, 4});
  CHECK(nn::AvgPool2d<B>({.kernel_size = 2, .ceil_mode = true})(x).shape() == Shape{2, 3, 5, 4});
  CHECK(nn::AdaptiveAvgPool2d<B>({4, 3})(x).shape() == Shape{2, 3, 4, 3});
  CHECK(nn::AdaptiveAvgPool2d<B>(1)(x).shape() == Shape{2, 3, 1, 1});
  CHECK(nn::Flatten<B>()(x).shape() == Shape{2, 216});
  CHECK(nn::Flatten<B>({.start_dim = 0, .end_dim = 1})(x).shape() == Shape{6, 9, 8});
  CHECK(nn::MaxPool2d<B>({.kernel_size = 2}).named_parameters().empty());
  const auto [y, idx] = F::max_pool2d_with_indices(x, 2);
  CHECK(idx.dtype() == DType::i64);
  CHECK(idx.shape() == y.shape());
}

namespace {
template <class F> void throws_with(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL("no kiln::Error thrown");
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) CHECK_THAT(msg, Contains(p));
  }
}
}  // namespace

TEMPLATE_TEST_CASE("conv and pool errors name the op and the values", "[conv][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  const Var<B> x(T::randn({2, 3, 5, 5}));
  throws_with(
      [&] {
        F::conv2d(x, Var<B>(T::randn({8, 4, 3, 3})));
      },
      {"conv2d", "input [2, 3, 5, 5] has 3 channels", "weight [8, 4, 3, 3] expects 4 (groups 1)"});
  throws_with([&] { F::conv2d(x, Var<B>(T::randn({8, 1, 3, 3})), {}, 1, 0, 1, 3); }, {"conv2d", "groups 3", "8 output channels"});
  throws_with([&] { F::conv2d(x, Var<B>(T::randn({4, 3, 7, 3}))); }, {"conv2d", "kernel 7x3", "padded input 5x5"});
  throws_with([&] { F::conv2d(x, Var<B>(T::randn({4, 3, 3, 3})), {}, 0); }, {"conv2d", "stride must be >= 1", "(0, 0)"});
  throws_with([&] { F::conv2d(x, Var<B>(T::randn({4, 3, 3, 3})), Var<B>(T::randn({5}))); }, {"conv2d", "bias [5] must be [4]"});
  throws_with([&] { F::conv2d(Var<B>(T::randn({3, 5})), Var<B>(T::randn({4, 3, 3, 3}))); }, {"conv2d", "[N, C, H, W]", "[3, 5]"});
  throws_with(
      [&] {
        F::conv1d(Var<B>(T::randn({2, 3, 5})), Var<B>(T::randn({4, 3, 3, 3})));
      },
      {"conv1d", "weight must be [O, C/groups, k]"});
  throws_with([&] { F::conv_transpose2d(x, Var<B>(T::randn({3, 2, 3, 3})), {}, 1, 0, 1); }, {"conv_transpose2d", "output_padding (1, 1)"});
  throws_with([&] { F::conv_transpose2d(x, Var<B>(T::randn({4, 2, 3, 3}))); }, {"conv_transpose2d", "has 3 channels"});
  throws_with(
      [&] {
        F::conv_transpose2d(Var<B>(T::randn({1, 2, 1, 1})), Var<B>(T::randn({2, 1, 1, 1})), {}, 1, 1);
      },
      {"conv_transpose2d", "output size -1x-1 is too small"});
  throws_with([&] { F::max_pool2d(x, 3, 1, 2); }, {"max_pool2d", "padding (2, 2)", "at most half"});
  // PyTorch's limit is half the kernel_size itself: dilation does not raise it.
  throws_with([&] { F::max_pool2d(x, 3, 1, 2, 2); }, {"max_pool2d", "padding (2, 2)", "at most half of kernel_size (3, 3)"});
  throws_with([&] { F::max_pool2d(x, Size2{2, 3}, 1, Size2{0, 2}, Size2{1, 3}); }, {"max_pool2d", "padding (0, 2)", "kernel_size (2, 3)"});
  CHECK(F::max_pool2d(x, 3, 1, 1, 2).shape() == Shape{2, 3, 3, 3});  // padding 1 = ⌊3/2⌋ is fine
  throws_with([&] { nn::MaxPool2d<B>({.kernel_size = 3, .padding = 2, .dilation = 2}); },
              {"MaxPool2d", "padding (2, 2)", "kernel_size (3, 3)"});
  throws_with([&] { nn::AvgPool2d<B>({.kernel_size = {4, 2}, .padding = {2, 2}}); }, {"AvgPool2d", "padding (2, 2)", "kernel_size (4, 2)"});
  throws_with([&] { nn::MaxPool2d<B>({.kernel_size = 2, .dilation = 0}); }, {"MaxPool2d", "dilation must be >= 1"});
  throws_with([&] { F::max_pool2d(x, 0); }, {"max_pool2d", "kernel_size must be >= 1"});
  throws_with([&] { F::avg_pool2d(x, 2, Size2{0}); }, {"avg_pool2d", "stride must be >= 1"});
  throws_with([&] { F::max_pool2d(Var<B>(T::randn({1, 1, 2, 2})), 5, 1, 1); }, {"max_pool2d", "output size", "too small"});
  throws_with([&] { F::adaptive_avg_pool2d(x, {0, 2}); }, {"adaptive_avg_pool2d", "output_size must be >= 1"});
  throws_with([&] { nn::Conv2d<B>({.in_channels = 6, .out_channels = 4, .kernel_size = 3, .groups = 4}); },
              {"Conv2d", "in_channels 6 must be divisible by groups 4"});
  throws_with([&] { nn::ConvTranspose2d<B>({.in_channels = 2, .out_channels = 2, .kernel_size = 3, .stride = 2, .output_padding = 2}); },
              {"ConvTranspose2d", "output_padding (2, 2)"});
}
