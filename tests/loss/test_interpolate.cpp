// interpolate / Upsample (nn/upsample.hpp): values and gradients against PyTorch 1.13 in float64
// (tests/loss/make_interp_cases.py) on every backend, contiguous and non-contiguous input; float64
// gradchecks; the f32 Cpu result against Reference; the module; errors.
//
// Tolerance: each output is a sum of at most four products (weights in [0, 1]) and each gradient a sum
// of at most a few dozen: float64 summation orders differ by far less than 1e-12.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/nn/upsample.hpp>

#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"
#include "loss/cases.hpp"

using namespace kiln;
using json = nlohmann::json;
using Catch::Contains;
namespace F = kiln::nn::functional;
using nn::InterpolateMode;

namespace {

const json& cases() {
  static const json j = kiln::test::run_case_script("tests/loss/make_interp_cases.py", "torch");
  return j;
}

template <Backend B> Tensor<B> array(const json& a) { return kiln::test::json_array<B>(a); }

nn::InterpolateOptions options(const json& args) {
  nn::InterpolateOptions o;
  o.mode = args.at("mode") == "nearest" ? InterpolateMode::nearest : InterpolateMode::bilinear;
  if (!args.at("align_corners").is_null()) o.align_corners = args.at("align_corners").get<bool>();
  if (!args.at("size").is_null()) o.size = Size2{args["size"][0].get<int64_t>(), args["size"][1].get<int64_t>()};
  if (!args.at("scale_factor").is_null())
    o.scale_factor = nn::Scale2{args["scale_factor"][0].get<double>(), args["scale_factor"][1].get<double>()};
  return o;
}

}  // namespace

TEMPLATE_TEST_CASE("interpolate matches PyTorch 1.13 (float64, values and gradients)", "[loss][interpolate][torch]", KILN_BACKEND_TYPES) {
  using B = TestType;
  const json& cs = cases();
  REQUIRE(cs.size() >= 30);
  const kt::Tol tol{1e-12, 1e-12};
  for (const json& c : cs) {
    for (bool strided : {false, true}) {
      INFO(c.at("name").get<std::string>() << (strided ? " (non-contiguous input)" : ""));
      Tensor<B> xt = array<B>(c.at("x"));
      if (strided) xt = xt.permute({3, 2, 1, 0}).contiguous().permute({3, 2, 1, 0});
      Var<B> x(xt, true);
      const Var<B> y = F::interpolate(x, options(c.at("args")));
      y.backward(array<B>(c.at("g")));
      kt::check_close(y.value(), array<B>(c.at("out")), tol, "output");
      kt::check_close(x.grad(), array<B>(c.at("gx")), tol, "grad x");
    }
  }
}

TEMPLATE_TEST_CASE("gradcheck: interpolate nearest and bilinear", "[loss][interpolate][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using VV = std::vector<Var<B>>;
  Generator g(4);
  const Tensor<B> x = Tensor<B>::randn({2, 2, 4, 5}, DType::f64, &g);
  const std::vector<nn::InterpolateOptions> opts{{.size = Size2{7, 3}, .mode = InterpolateMode::nearest},
                                                 {.scale_factor = nn::Scale2{1.7, 0.6}, .mode = InterpolateMode::nearest},
                                                 {.size = Size2{7, 9}, .mode = InterpolateMode::bilinear},
                                                 {.scale_factor = nn::Scale2{0.5, 1.5}, .mode = InterpolateMode::bilinear},
                                                 {.size = Size2{6, 3}, .mode = InterpolateMode::bilinear, .align_corners = true}};
  for (size_t i = 0; i < opts.size(); ++i) {
    const auto r = gradcheck<B>([&](const VV& v) { return F::interpolate(v[0], opts[i]); }, {x});
    INFO("options " << i << ": " << r.message);
    CHECK(r.ok);
  }
}

TEMPLATE_TEST_CASE("interpolate in f32 agrees with Reference, Upsample, errors", "[loss][interpolate]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Generator g(6);
  const kt::RT x = kt::RT::randn({2, 3, 5, 6}, DType::f32, &g);
  for (const nn::InterpolateOptions& o :
       {nn::InterpolateOptions{.scale_factor = 2.0, .mode = InterpolateMode::bilinear},
        nn::InterpolateOptions{.size = Size2{4, 9}, .mode = InterpolateMode::bilinear, .align_corners = true},
        nn::InterpolateOptions{.scale_factor = 1.5}}) {
    const kt::RT want = F::interpolate(Var<Reference>(x), o).value();
    const Tensor<B> got = F::interpolate(Var<B>(x.template to<B>()), o).value();
    kt::check_close(got, want, {4 * 0x1p-24, 1e-6}, "f32 interpolate");  // at most four products and three sums
  }
  nn::Upsample<B> up({.scale_factor = 2.0});
  CHECK(up.named_parameters().empty());
  const Tensor<B> xb = x.template to<B>();
  const Tensor<B> y = up(xb).value();
  REQUIRE(y.shape() == Shape{2, 3, 10, 12});
  // nearest at scale 2 repeats every pixel twice along each axis
  CHECK(item<double>(y.slice(2, 0, 10, 2).slice(3, 1, 12, 2).sub(xb).abs().max()) == 0.0);
  // bilinear with align_corners keeps the corners
  const Tensor<B> yb = F::interpolate<B>(xb, {.size = Size2{9, 11}, .mode = InterpolateMode::bilinear, .align_corners = true}).value();
  CHECK(item<double>(yb.select(2, 8).select(2, 10).sub(xb.select(2, 4).select(2, 5)).abs().max()) == 0.0);

  using O = nn::InterpolateOptions;
  CHECK_THROWS_WITH(F::interpolate<B>(xb, O{}),
                    Contains("interpolate") && Contains("exactly one of size and scale_factor") && Contains("neither"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb, O{.size = Size2{2, 2}, .scale_factor = 2.0}), Contains("interpolate") && Contains("both"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb, O{.size = Size2{0, 2}}), Contains("interpolate") && Contains("(0, 2)"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb, O{.scale_factor = -1.0}), Contains("interpolate") && Contains("scale_factor") && Contains("-1"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb, O{.scale_factor = 0.1}), Contains("interpolate") && Contains("empty output") && Contains("0x0"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb, O{.scale_factor = 2.0, .align_corners = true}),
                    Contains("interpolate") && Contains("align_corners") && Contains("nearest"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb.select(0, 0), O{.scale_factor = 2.0}), Contains("interpolate") && Contains("[3, 5, 6]"));
  CHECK_THROWS_WITH(F::interpolate<B>(xb.to(DType::i64), O{.scale_factor = 2.0}), Contains("interpolate") && Contains("i64"));
  CHECK_THROWS_WITH(nn::Upsample<B>(O{.size = Size2{3, 3}, .mode = InterpolateMode::nearest, .align_corners = false}),
                    Contains("Upsample") && Contains("align_corners"));
}
