// BatchNorm1d/2d, F.batch_norm, GroupNorm and F.group_norm: values, gradients and running statistics
// against PyTorch 1.13 in float64 (tests/nn/make_norm_cases.py), every backend against Reference on
// random shapes and layouts, float64 finite differences, state dicts, train/eval behaviour, errors.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/nn/batch_norm.hpp>
#include <kiln/nn/group_norm.hpp>
#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"

using namespace kiln;
using namespace kiln::nn;
using json = nlohmann::json;

namespace {

const json& norm_cases() {
  static const json j = kiln::test::run_case_script("tests/nn/make_norm_cases.py", "torch");
  return j;
}

template <Backend B> Tensor<B> array(const json& a) {
  return Tensor<B>::from_vector(a.at("data").get<std::vector<double>>(), a.at("shape").get<Shape>());
}

// Both sides compute in float64 with different summation orders: a few hundred ulps of the O(1) values.
constexpr kt::Tol kParity{1e-10, 1e-11};

template <Backend B> void check_parity(const Tensor<B>& got, const json& t, const std::string& key, const std::string& what) {
  kt::check_close(got, array<Reference>(t.at(key)), kParity, what + ": " + key);
}

template <Backend B> void parity_batch_norm(const json& c, const std::string& what) {
  const json& t = c.at("tensors");
  const json& a = c.at("args");
  const bool affine = t.contains("weight");
  Var<B> x(array<B>(t.at("x")), true), w, b;
  if (affine) {
    w = Var<B>(array<B>(t.at("weight")), true);
    b = Var<B>(array<B>(t.at("bias")), true);
  }
  const Tensor<B> rm = array<B>(t.at("running_mean")), rv = array<B>(t.at("running_var"));
  const Var<B> y =
      functional::batch_norm<B>(x, rm, rv, w, b, a.at("training").get<bool>(), a.at("momentum").get<double>(), a.at("eps").get<double>());
  (y * Var<B>(array<B>(t.at("g")))).sum().backward();
  check_parity(y.value(), t, "y", what);
  check_parity(x.grad(), t, "dx", what);
  check_parity(rm, t, "running_mean_after", what);
  check_parity(rv, t, "running_var_after", what);
  if (affine) {
    check_parity(w.grad(), t, "dweight", what);
    check_parity(b.grad(), t, "dbias", what);
  }
}

template <Backend B> void parity_bn_module(const json& c, const std::string& what) {
  const json& t = c.at("tensors");
  const json& a = c.at("args");
  const int64_t rank = static_cast<int64_t>(t.at("x0").at("shape").size());
  const int64_t C = t.at("x0").at("shape")[1].get<int64_t>();
  BatchNormOptions o{.num_features = C,
                     .momentum = a.at("momentum").is_null() ? std::nullopt : std::optional<double>(a.at("momentum").get<double>()),
                     .affine = a.at("affine").get<bool>(),
                     .track_running_stats = a.at("track_running_stats").get<bool>(),
                     .dtype = DType::f64};
  std::shared_ptr<BatchNorm<B>> m;
  if (rank == 4)
    m = std::make_shared<BatchNorm2d<B>>(o);
  else
    m = std::make_shared<BatchNorm1d<B>>(o);
  if (o.affine) {
    Tensor<B> w = m->weight().value(), bb = m->bias().value();
    w.copy_(array<B>(t.at("weight")));
    bb.copy_(array<B>(t.at("bias")));
  }
  m->train();
  for (int i = 0; i < a.at("steps").get<int>(); ++i) {
    const std::string s = std::to_string(i);
    Var<B> x(array<B>(t.at("x" + s)), true);
    const Var<B> y = m->forward(x);
    (y * Var<B>(array<B>(t.at("g" + s)))).sum().backward();
    check_parity(y.value(), t, "y" + s, what);
    check_parity(x.grad(), t, "dx" + s, what);
  }
  if (o.affine) {
    check_parity(m->weight().grad(), t, "dweight", what);
    check_parity(m->bias().grad(), t, "dbias", what);
  }
  m->eval();
  check_parity(m->forward(Var<B>(array<B>(t.at("x_eval")))).value(), t, "y_eval", what);
  if (o.track_running_stats) {
    check_parity(m->running_mean(), t, "running_mean", what);
    check_parity(m->running_var(), t, "running_var", what);
    CHECK(m->num_batches_tracked().template item<int64_t>() ==
          static_cast<int64_t>(t.at("num_batches_tracked").at("data")[0].get<double>()));
  }
}

template <Backend B> void parity_group_norm(const json& c, const std::string& what) {
  const json& t = c.at("tensors");
  const bool affine = t.contains("weight");
  Var<B> x(array<B>(t.at("x")), true), w, b;
  if (affine) {
    w = Var<B>(array<B>(t.at("weight")), true);
    b = Var<B>(array<B>(t.at("bias")), true);
  }
  const Var<B> y = functional::group_norm<B>(x, c.at("args").at("num_groups").get<int64_t>(), w, b, c.at("args").at("eps").get<double>());
  (y * Var<B>(array<B>(t.at("g")))).sum().backward();
  check_parity(y.value(), t, "y", what);
  check_parity(x.grad(), t, "dx", what);
  if (affine) {
    check_parity(w.grad(), t, "dweight", what);
    check_parity(b.grad(), t, "dbias", what);
  }
}

template <Backend B> void parity_all() {
  const json& all = norm_cases();
  int n = 0;
  for (const json& c : all.at("cases")) {
    const std::string what =
        fmt::format("PyTorch {} case '{}' on {}", all.at("torch").get<std::string>(), c.at("name").get<std::string>(), B::name);
    INFO(what);
    const std::string kind = c.at("kind");
    if (kind == "batch_norm")
      parity_batch_norm<B>(c, what);
    else if (kind == "bn_module")
      parity_bn_module<B>(c, what);
    else if (kind == "group_norm")
      parity_group_norm<B>(c, what);
    else
      FAIL("make_norm_cases.py produced a kind this test does not know: " << kind);
    ++n;
  }
  CHECK(n >= 60);
}

}  // namespace

TEST_CASE("norm parity: F.batch_norm, BatchNorm1d/2d over steps, F.group_norm against PyTorch on Reference and Cpu", "[norm][torch]") {
  parity_all<Reference>();
  parity_all<Cpu>();
}

#if defined(KILN_HAVE_CUDA_BACKEND)
TEST_CASE("norm parity: F.batch_norm, BatchNorm1d/2d over steps, F.group_norm against PyTorch on Cuda", "[norm][torch][cuda]") {
  parity_all<Cuda>();
}
#endif

// ------------------------------------------------------------------------------------ conformance
// Every backend against Reference on random [N, C, *] shapes and layouts, f32 and f64: the output, the
// running statistics and the three gradients. Tolerance: each statistic is a sum of n terms of size
// <= 3 (Higham: n u · 3), and an error δ in the mean or variance moves y by at most δ / sqrt(eps) (eps =
// 0.1 here, so 1/std <= 3.2); the backward's per-channel sums add the same again. Hence
// 8 (n + 2) u · 3 · 3.2 absolute and relative, with u the accumulation roundoff.
TEMPLATE_TEST_CASE("norm conformance: batch_norm and group_norm on every backend match Reference", "[norm]", KILN_TEST_BACKENDS) {
  using B = TestType;
  kt::Gen gen(2024);
  const double eps = 0.1;
  for (int trial = 0; trial < 24; ++trial) {
    const DType d = trial % 2 ? DType::f64 : DType::f32;
    Shape s{gen.integer(2, 5), gen.integer(1, 5)};
    for (int64_t r = gen.integer(0, 2); r > 0; --r) s.push_back(gen.integer(1, 5));
    const kt::Lay lay =
        gen.pick(std::vector<kt::Lay>{kt::Lay::contiguous, kt::Lay::transposed, kt::Lay::stepped, kt::Lay::narrowed, kt::Lay::permuted});
    const int64_t C = s[1], n = kiln::numel(s) / C;
    const double u = kt::u_acc(d);
    const double tol = 8.0 * static_cast<double>(n + 2) * u * 3 * 3.2 + 2 * kt::u_store(d);
    const kt::Tol T{tol, tol};
    kt::RT rx, rg, rw, rb;
    Tensor<B> bx, bg, bw, bb;
    gen.make_pair(s, d, lay, rx, bx);
    gen.make_pair(s, d, kt::Lay::contiguous, rg, bg);
    gen.make_pair({C}, d, kt::Lay::contiguous, rw, bw, 0.5, 1.5);
    gen.make_pair({C}, d, kt::Lay::contiguous, rb, bb);
    const bool training = trial % 4 < 2;
    const std::string what = fmt::format("{} training={}", kt::describe(s, d, lay), training);
    INFO(what);

    auto run_bn = [&]<Backend X>(const Tensor<X>& x, const Tensor<X>& g, const Tensor<X>& w, const Tensor<X>& b) {
      Var<X> vx(x, true), vw(w, true), vb(b, true);
      const Tensor<X> rm = Tensor<X>::full({C}, 0.25, d), rv = Tensor<X>::full({C}, 1.5, d);
      const Var<X> y = functional::batch_norm<X>(vx, rm, rv, vw, vb, training, 0.2, eps);
      (y * Var<X>(g)).sum().backward();
      return std::vector<Tensor<X>>{y.value(), rm, rv, vx.grad(), vw.grad(), vb.grad()};
    };
    const auto want = run_bn(rx, rg, rw, rb);
    const auto got = run_bn(bx, bg, bw, bb);
    const char* names[] = {"y", "running_mean", "running_var", "dx", "dweight", "dbias"};
    for (size_t i = 0; i < want.size(); ++i) kt::check_close(got[i], want[i], T, std::string("batch_norm ") + names[i]);

    // group_norm with a group count that divides C.
    int64_t G = gen.integer(1, C);
    while (C % G) --G;
    auto run_gn = [&]<Backend X>(const Tensor<X>& x, const Tensor<X>& g, const Tensor<X>& w, const Tensor<X>& b) {
      Var<X> vx(x, true), vw(w, true), vb(b, true);
      const Var<X> y = functional::group_norm<X>(vx, G, vw, vb, eps);
      (y * Var<X>(g)).sum().backward();
      return std::vector<Tensor<X>>{y.value(), vx.grad(), vw.grad(), vb.grad()};
    };
    const int64_t m = kiln::numel(s) / (s[0] * G);  // values per group
    const double gtol = 8.0 * static_cast<double>(std::max(m, n) + 2) * u * 3 * 3.2 + 2 * kt::u_store(d);
    const auto gwant = run_gn(rx, rg, rw, rb);
    const auto ggot = run_gn(bx, bg, bw, bb);
    const char* gnames[] = {"y", "dx", "dweight", "dbias"};
    for (size_t i = 0; i < gwant.size(); ++i)
      kt::check_close(ggot[i], gwant[i], kt::Tol{gtol, gtol}, std::string("group_norm ") + gnames[i]);
  }
}

// ------------------------------------------------------------------------------------ gradients
TEMPLATE_TEST_CASE("norm gradcheck: batch_norm (train and eval) and group_norm pass float64 finite differences", "[norm][gradcheck]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(17);
  // A non-contiguous [4, 3, 5] input (a transposed [5, 3, 4]), weight and bias [3].
  const Tensor<B> x = Tensor<B>::randn({5, 3, 4}, DType::f64, &gen).transpose(0, 2);
  const Tensor<B> w = Tensor<B>::uniform({3}, 0.5, 1.5, DType::f64, &gen), b = Tensor<B>::randn({3}, DType::f64, &gen);
  const Tensor<B> rm = Tensor<B>::randn({3}, DType::f64, &gen), rv = Tensor<B>::uniform({3}, 0.5, 2, DType::f64, &gen);
  for (bool training : {true, false}) {
    INFO("batch_norm training=" << training);
    const auto r = gradcheck<B>(
        [&](const std::vector<Var<B>>& v) {
          // In training the running stats would move on every evaluation: normalise without them.
          return training ? functional::batch_norm<B>(v[0], {}, {}, v[1], v[2], true, 0.1, 1e-5)
                          : functional::batch_norm<B>(v[0], rm, rv, v[1], v[2], false, 0.1, 1e-5);
        },
        {x, w, b});
    INFO(r.message);
    CHECK(r.ok);
  }
  {
    INFO("batch_norm without affine, 4-D");
    const auto r =
        gradcheck<B>([&](const std::vector<Var<B>>& v) { return functional::batch_norm<B>(v[0], {}, {}, {}, {}, true, 0.1, 1e-5); },
                     {Tensor<B>::randn({3, 2, 3, 2}, DType::f64, &gen)});
    INFO(r.message);
    CHECK(r.ok);
  }
  const Tensor<B> xg = Tensor<B>::randn({2, 6, 3, 2}, DType::f64, &gen).permute({0, 1, 3, 2});
  const Tensor<B> wg = Tensor<B>::uniform({6}, 0.5, 1.5, DType::f64, &gen), bg = Tensor<B>::randn({6}, DType::f64, &gen);
  for (int64_t G : {1, 2, 3, 6}) {
    INFO("group_norm groups=" << G);
    const auto r =
        gradcheck<B>([&](const std::vector<Var<B>>& v) { return functional::group_norm<B>(v[0], G, v[1], v[2], 1e-5); }, {xg, wg, bg});
    INFO(r.message);
    CHECK(r.ok);
  }
}

// ------------------------------------------------------------------------------------ modules
TEMPLATE_TEST_CASE("BatchNorm: PyTorch names, buffers in the state dict, safetensors round trip", "[norm][module]", KILN_BACKEND_TYPES) {
  using B = TestType;
  BatchNorm2d<B> bn({.num_features = 3});
  std::vector<std::string> names;
  for (auto& [n, t] : bn.state_dict()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.named_parameters().size() == 2);
  CHECK(bn.num_batches_tracked().dtype() == DType::i64);
  CHECK(bn.num_batches_tracked().shape() == Shape{});
  CHECK(to_vector<double>(bn.running_var()) == std::vector<double>{1, 1, 1});

  Generator gen(3);
  bn.train();
  for (int i = 0; i < 2; ++i) bn.forward(Var<B>(Tensor<B>::randn({4, 3, 2, 2}, DType::f32, &gen)));
  const auto path = (std::filesystem::temp_directory_path() / fmt::format("kiln-bn-{}.safetensors", ::getpid())).string();
  bn.save(path);
  BatchNorm2d<B> back({.num_features = 3});
  back.load(path);
  std::filesystem::remove(path);
  CHECK(back.num_batches_tracked().template item<int64_t>() == 2);
  CHECK(to_vector<double>(back.running_mean()) == to_vector<double>(bn.running_mean()));
  CHECK(to_vector<double>(back.running_var()) == to_vector<double>(bn.running_var()));

  // affine = false: no parameters; track_running_stats = false: no buffers.
  BatchNorm1d<B> plain({.num_features = 4, .affine = false, .track_running_stats = false});
  CHECK(plain.state_dict().empty());
  CHECK(!plain.weight().defined());
  CHECK(!plain.running_mean().defined());
}

TEMPLATE_TEST_CASE("BatchNorm: train normalises with the batch and moves the running stats, eval uses them", "[norm][module]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(5);
  BatchNorm1d<B> bn({.num_features = 2, .momentum = 0.5, .dtype = DType::f64});
  const Tensor<B> x = Tensor<B>::from_vector(std::vector<double>{1, 10, 3, 20, 5, 60}, {3, 2});  // channel means 3, 30
  const Var<B> y = bn.forward(Var<B>(x));
  const auto yv = to_vector<double>(y.value());
  // channel 0: values 1, 3, 5, biased var 8/3 -> (x - 3) / sqrt(8/3 + 1e-5)
  CHECK(yv[0] == Approx(-2 / std::sqrt(8.0 / 3 + 1e-5)).epsilon(1e-12));
  CHECK(yv[4] == Approx(2 / std::sqrt(8.0 / 3 + 1e-5)).epsilon(1e-12));
  // running: 0.5 · 0 + 0.5 · mean; 0.5 · 1 + 0.5 · unbiased var (4 and 700)
  CHECK(to_vector<double>(bn.running_mean()) == std::vector<double>{1.5, 15});
  CHECK(to_vector<double>(bn.running_var()) == std::vector<double>{2.5, 350.5});
  CHECK(bn.num_batches_tracked().template item<int64_t>() == 1);

  bn.eval();
  const auto ye = to_vector<double>(bn.forward(Var<B>(x)).value());
  CHECK(ye[0] == Approx((1 - 1.5) / std::sqrt(2.5 + 1e-5)).epsilon(1e-12));
  CHECK(ye[1] == Approx((10 - 15) / std::sqrt(350.5 + 1e-5)).epsilon(1e-12));
  CHECK(bn.num_batches_tracked().template item<int64_t>() == 1);  // eval moves nothing
  CHECK(to_vector<double>(bn.running_mean()) == std::vector<double>{1.5, 15});
  // A single sample is fine in eval.
  CHECK(bn.forward(Var<B>(x.narrow(0, 0, 1))).shape() == Shape{1, 2});

  // Training under NoGrad still updates the statistics (as PyTorch), and records nothing.
  bn.train();
  {
    NoGrad ng;
    const Var<B> y2 = bn.forward(Var<B>(x));
    CHECK(!y2.requires_grad());
  }
  CHECK(bn.num_batches_tracked().template item<int64_t>() == 2);
  CHECK(to_vector<double>(bn.running_mean()) == std::vector<double>{2.25, 22.5});
  bn.reset_running_stats();
  CHECK(to_vector<double>(bn.running_mean()) == std::vector<double>{0, 0});
  CHECK(bn.num_batches_tracked().template item<int64_t>() == 0);

  // momentum = nullopt: the running mean is the plain average of the batch means.
  BatchNorm1d<B> cum({.num_features = 3, .momentum = std::nullopt, .dtype = DType::f64});
  std::vector<double> sum(3, 0.0);
  for (int i = 0; i < 4; ++i) {
    const Tensor<B> xi = Tensor<B>::randn({5, 3, 2}, DType::f64, &gen).add(static_cast<double>(i));
    const auto mi = to_vector<double>(xi.mean({0, 2}));
    for (size_t c = 0; c < 3; ++c) sum[c] += mi[c];
    cum.forward(Var<B>(xi));
  }
  const auto rm = to_vector<double>(cum.running_mean());
  for (size_t c = 0; c < 3; ++c) CHECK(rm[c] == Approx(sum[c] / 4).epsilon(1e-12));

  // track_running_stats = false: eval normalises with the batch, as train does.
  BatchNorm2d<B> nostats({.num_features = 2, .track_running_stats = false, .dtype = DType::f64});
  const Tensor<B> x4 = Tensor<B>::randn({2, 2, 3, 3}, DType::f64, &gen);
  const auto yt = to_vector<double>(nostats.forward(Var<B>(x4)).value());
  nostats.eval();
  CHECK(to_vector<double>(nostats.forward(Var<B>(x4)).value()) == yt);

  // Module::to(f64) converts the parameters and the floating buffers, as torch's module.to(float64):
  // the converted layer then computes bit for bit what a layer made in f64 computes, in train (the
  // running statistics updated in f64) and in eval (normalised by them); num_batches_tracked stays i64.
  BatchNorm2d<B> conv({.num_features = 2, .momentum = 0.1});
  BatchNorm2d<B> made({.num_features = 2, .momentum = 0.1, .dtype = DType::f64});
  conv.to(DType::f64);
  for (const auto& [name, t] : conv.state_dict()) {
    INFO(name);
    CHECK(t.dtype() == (name == "num_batches_tracked" ? DType::i64 : DType::f64));
  }
  CHECK(conv.running_mean().dtype() == DType::f64);
  CHECK(conv.running_var().dtype() == DType::f64);
  const Tensor<B> xc = Tensor<B>::randn({3, 2, 2, 2}, DType::f64, &gen).mul(3.0).add(0.7);
  for (int step = 0; step < 2; ++step) {
    const Var<B> yc = conv.forward(Var<B>(xc)), ym = made.forward(Var<B>(xc));
    CHECK(yc.dtype() == DType::f64);
    kt::check_bits(yc.value(), ym.value(), "train forward after to(f64)");
  }
  kt::check_bits(conv.running_mean(), made.running_mean(), "running_mean after to(f64)");
  kt::check_bits(conv.running_var(), made.running_var(), "running_var after to(f64)");
  CHECK(conv.num_batches_tracked().dtype() == DType::i64);
  CHECK(conv.num_batches_tracked().template item<int64_t>() == 2);
  conv.eval();
  made.eval();
  kt::check_bits(conv.forward(Var<B>(xc)).value(), made.forward(Var<B>(xc)).value(), "eval forward after to(f64)");
  // And back to f32: the statistics follow (rounded once).
  conv.to(DType::f32);
  CHECK(conv.running_var().dtype() == DType::f32);
  kt::check_bits(conv.running_var(), made.running_var().to(DType::f32), "running_var after to(f32)");
  CHECK(conv.forward(Var<B>(xc.to(DType::f32))).dtype() == DType::f32);
}

TEMPLATE_TEST_CASE("BatchNorm and GroupNorm: bad shapes and options raise errors naming the values", "[norm][errors]", KILN_BACKEND_TYPES) {
  using B = TestType;
  BatchNorm1d<B> bn1({.num_features = 3});
  BatchNorm2d<B> bn2({.num_features = 3});
  const auto x = [](Shape s) { return Var<B>(Tensor<B>::ones(s)); };
  CHECK_THROWS_WITH(bn1.forward(x({4, 5})),
                    Catch::Contains("BatchNorm1d") && Catch::Contains("5 channels") && Catch::Contains("num_features=3"));
  CHECK_THROWS_WITH(bn1.forward(x({1, 3})),
                    Catch::Contains("Expected more than 1 value per channel when training") && Catch::Contains("[1, 3]"));
  CHECK_THROWS_WITH(bn2.forward(x({1, 3, 1, 1})), Catch::Contains("Expected more than 1 value per channel when training"));
  CHECK_THROWS_WITH(bn1.forward(x({2, 3, 4, 5})), Catch::Contains("expected 2D or 3D input (got 4D input"));
  CHECK_THROWS_WITH(bn2.forward(x({2, 3, 4})), Catch::Contains("BatchNorm2d: expected 4D input (got 3D input"));
  CHECK_THROWS_WITH(BatchNorm1d<B>({.num_features = 0}), Catch::Contains("num_features must be >= 1"));
  CHECK_THROWS_WITH(functional::batch_norm<B>(x({2, 3}), {}, {}, {}, {}, false), Catch::Contains("must be given when not training"));
  CHECK_THROWS_WITH(functional::batch_norm<B>(x({2, 3}), Tensor<B>::zeros({4}), Tensor<B>::ones({4}), {}, {}, true),
                    Catch::Contains("running_mean should have shape [3]") && Catch::Contains("got [4]"));
  CHECK_THROWS_WITH(functional::batch_norm<B>(x({2, 3}), {}, {}, x({2}), {}, true), Catch::Contains("weight should have shape [3]"));
  CHECK_THROWS_WITH(functional::batch_norm<B>(x({6}), {}, {}, {}, {}, true),
                    Catch::Contains("batch_norm: input must have shape [N, C, *], got [6]"));

  CHECK_THROWS_WITH(GroupNorm<B>({.num_groups = 4, .num_channels = 6}),
                    Catch::Contains("num_channels must be divisible by num_groups, got 6 and 4"));
  GroupNorm<B> gn({.num_groups = 2, .num_channels = 4});
  CHECK_THROWS_WITH(gn.forward(x({2, 6, 3})), Catch::Contains("GroupNorm: input [2, 6, 3] should have shape [N, 4, *]"));
  CHECK_THROWS_WITH(functional::group_norm<B>(x({2, 6, 3}), 4),
                    Catch::Contains("divisible by num_groups") && Catch::Contains("[2, 6, 3]") && Catch::Contains("num_groups=4"));
  CHECK_THROWS_WITH(functional::group_norm<B>(x({2, 6, 3}), 3, x({3})), Catch::Contains("weight should have shape [6]"));
}

TEMPLATE_TEST_CASE("GroupNorm: names, eval equals train, per-group statistics", "[norm][module]", KILN_BACKEND_TYPES) {
  using B = TestType;
  GroupNorm<B> gn({.num_groups = 2, .num_channels = 4, .dtype = DType::f64});
  std::vector<std::string> names;
  for (auto& [n, t] : gn.state_dict()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight", "bias"});
  CHECK(GroupNorm<B>({.num_groups = 2, .num_channels = 4, .affine = false}).state_dict().empty());
  Generator gen(8);
  const Tensor<B> x = Tensor<B>::randn({3, 4, 5}, DType::f64, &gen);
  const Tensor<B> y = gn.forward(Var<B>(x)).value();
  gn.eval();
  CHECK(to_vector<double>(gn.forward(Var<B>(x)).value()) == to_vector<double>(y));
  // Each (sample, group) of 2 channels × 5 positions has mean 0 and biased variance 1/(1 + eps/var).
  const Tensor<B> yg = y.reshape({3, 2, 10});
  for (double m : to_vector<double>(yg.mean({2}))) CHECK(std::abs(m) < 1e-12);
  for (double v : to_vector<double>(yg.square().mean({2}))) CHECK(v == Approx(1).epsilon(1e-4));
}
