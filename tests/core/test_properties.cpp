// Independent properties: checks that can fail even when Reference is wrong (hand loops in double,
// algebraic identities). Run on Reference and on every test backend.
#include "common/kiln_test.hpp"

using namespace kiln;
using namespace kt;

#define KILN_ALL_BACKENDS ::kiln::Reference, KILN_TEST_BACKENDS

TEMPLATE_TEST_CASE("property: matmul equals a hand loop in double", "[core][property]", KILN_ALL_BACKENDS) {
  using B = TestType;
  Gen g(2001);
  for (int it = 0; it < 40; ++it) {
    const int64_t bt = g.integer(1, 3), M = g.integer(1, 6), K = g.integer(1, 40), N = g.integer(1, 6);
    const auto av = g.values(bt * M * K, DType::f64), bv = g.values(K * N, DType::f64);
    // a: [bt, M, K]; b: [K, N] stored transposed ([N, K] in memory) and broadcast over the batch
    std::vector<double> btv(static_cast<size_t>(N * K));
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) btv[static_cast<size_t>(n * K + k)] = bv[static_cast<size_t>(k * N + n)];
    const auto a = Tensor<B>::from_vector(av, {bt, M, K});
    const auto b = Tensor<B>::from_vector(btv, {N, K}).t();
    const auto c = host(a.matmul(b));
    const double u = 0x1p-53;
    for (int64_t i = 0; i < bt; ++i)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            acc += av[static_cast<size_t>((i * M + m) * K + k)] * bv[static_cast<size_t>(k * N + n)];
            mag += std::abs(av[static_cast<size_t>((i * M + m) * K + k)] * bv[static_cast<size_t>(k * N + n)]);
          }
          const double got = c[static_cast<size_t>((i * M + m) * N + n)];
          INFO("batch " << i << " [" << m << ", " << n << "] K " << K);
          CHECK(std::abs(got - acc) <= 2.0 * static_cast<double>(K) * u * mag);  // both sides within K u mag
        }
  }
}

TEMPLATE_TEST_CASE("property: softmax rows sum to 1, log_softmax = log(softmax)", "[core][property]", KILN_ALL_BACKENDS) {
  using B = TestType;
  Gen g(2002);
  for (int it = 0; it < 40; ++it) {
    const Shape s = g.shape(1, 3, 9, 0.0);
    const int64_t r = static_cast<int64_t>(s.size()), a = g.integer(0, r - 1);
    const auto v = g.values(numel(s), DType::f64, -50, 50);
    const auto x = Tensor<B>::from_vector(v, s);
    const auto y = x.softmax(a);
    const auto sums = host(y.sum({a}));
    for (double t : sums) CHECK(std::abs(t - 1.0) <= 1e-14 * static_cast<double>(s[static_cast<size_t>(a)] + 4));
    for (double t : host(y)) CHECK((t >= 0 && t <= 1));
    const auto ls = host(x.log_softmax(a)), lsy = host(y.log());
    for (size_t i = 0; i < ls.size(); ++i) {
      // where softmax underflows toward 0, log(softmax) loses digits: compare relatively to |ls|
      if (ls[i] > -600) CHECK(std::abs(ls[i] - lsy[i]) <= 1e-12 * (1 + std::abs(ls[i])));
    }
    // shift invariance: softmax(x + c) == softmax(x)
    check_close(x.add(Scalar(123.0)).softmax(a), y, Tol{1e-12, 1e-300}, "softmax(x + 123) == softmax(x)");
    // f32 with huge inputs does not overflow
    const auto big = Tensor<B>::from_vector(std::vector<float>{1000.f, 999.f, -1000.f});
    const auto sb = host(big.softmax(0));
    CHECK(std::abs(sb[0] - 1.0 / (1.0 + std::exp(-1.0))) < 1e-6);
    CHECK(std::abs(host(big.log_softmax(0))[2] - (-2000.0 - std::log1p(std::exp(-1.0)))) < 1e-3);
  }
}

TEMPLATE_TEST_CASE("property: sum over all axes equals the sum of to_vector, mean*n == sum", "[core][property]", KILN_ALL_BACKENDS) {
  using B = TestType;
  Gen g(2003);
  for (int it = 0; it < 40; ++it) {
    const Shape s = g.shape(0, 4, 6);
    RT dummy;
    Tensor<B> x;
    const Lay l = g.pick(kLayouts);
    g.make_pair(s, DType::f64, l, dummy, x);
    const auto v = host(x);
    double acc = 0, mag = 0;
    for (double t : v) {
      acc += t;
      mag += std::abs(t);
    }
    const double tot = x.sum().template item<double>();
    INFO(describe(s, DType::f64, l));
    CHECK(std::abs(tot - acc) <= 2 * static_cast<double>(v.size()) * 0x1p-53 * mag);
    // sum over all axes in any order and grouping is the same number
    std::vector<int64_t> ax(s.size());
    std::iota(ax.begin(), ax.end(), 0);
    std::shuffle(ax.begin(), ax.end(), g.rng);
    auto partial = x;
    for (int64_t a : ax) partial = partial.sum({a}, true);
    CHECK(std::abs(partial.reshape({-1}).sum().template item<double>() - acc) <= 2 * static_cast<double>(v.size()) * 0x1p-53 * mag);
    if (!v.empty())
      CHECK(std::abs(x.mean().template item<double>() * static_cast<double>(v.size()) - acc) <=
            4 * static_cast<double>(v.size()) * 0x1p-53 * mag);
    // integer sums are exact
    const auto xi = x.mul(Scalar(10.0)).to(DType::i64);
    int64_t isum = 0;
    for (int64_t t : xi.template to_vector<int64_t>()) isum += t;
    CHECK(xi.sum().template item<int64_t>() == isum);
  }
}

TEMPLATE_TEST_CASE("property: reshape round-trips, permute then inverse is the identity", "[core][property]", KILN_ALL_BACKENDS) {
  using B = TestType;
  Gen g(2004);
  for (int it = 0; it < 60; ++it) {
    const Shape s = g.shape(1, 5, 5);
    RT dummy;
    Tensor<B> x;
    g.make_pair(s, DType::f32, g.pick(kLayouts), dummy, x);
    const auto v = host(x);
    CHECK(host(x.reshape({-1}).reshape(s)) == v);
    CHECK(x.reshape({-1}).reshape(s).shape() == s);
    const int64_t r = static_cast<int64_t>(s.size());
    std::vector<int64_t> p(static_cast<size_t>(r)), inv(static_cast<size_t>(r));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), g.rng);
    for (int64_t i = 0; i < r; ++i) inv[static_cast<size_t>(p[static_cast<size_t>(i)])] = i;
    const auto y = x.permute(p).contiguous().permute(inv);
    CHECK(y.shape() == s);
    CHECK(host(y) == v);
    CHECK(host(x.transpose(0, r - 1).transpose(r - 1, 0)) == v);
  }
}

TEMPLATE_TEST_CASE("property: gather and scatter_add are adjoint", "[core][property]", KILN_ALL_BACKENDS) {
  using B = TestType;
  // <gather(x, i), y> = <x, scatter_add(zeros, i, y)> for any x, y, i; in f64 both sides are sums
  // of the same products, so they agree to rounding.
  Gen g(2005);
  for (int it = 0; it < 60; ++it) {
    const Shape s = g.shape(1, 4, 5, 0.0);
    const int64_t r = static_cast<int64_t>(s.size()), a = g.integer(0, r - 1);
    Shape is = s;
    for (int64_t d = 0; d < r; ++d) is[static_cast<size_t>(d)] = d == a ? g.integer(1, 8) : g.integer(1, s[static_cast<size_t>(d)]);
    const auto x = Tensor<B>::from_vector(g.values(numel(s), DType::f64), s);
    const auto y = Tensor<B>::from_vector(g.values(numel(is), DType::f64), is);
    const auto i =
        Tensor<B>::from_vector(g.values(numel(is), DType::i64, 0, static_cast<double>(s[static_cast<size_t>(a)] - 1)), is).to(DType::i64);
    const double lhs = x.gather(a, i).mul(y).sum().template item<double>();
    const double rhs = x.mul(Tensor<B>::zeros(s, DType::f64).scatter_add(a, i, y)).sum().template item<double>();
    const double mag = x.abs().gather(a, i).mul(y.abs()).sum().template item<double>();
    INFO(shape_str(s) << " axis " << a << " index " << shape_str(is));
    CHECK(std::abs(lhs - rhs) <= 4 * static_cast<double>(numel(is) + numel(s)) * 0x1p-53 * mag);
    // index_select / index_add are the same pair
    const auto i1 =
        Tensor<B>::from_vector(g.values(is[static_cast<size_t>(a)], DType::i64, 0, static_cast<double>(s[static_cast<size_t>(a)] - 1)))
            .to(DType::i64);
    Shape ys = s;
    ys[static_cast<size_t>(a)] = i1.numel();
    const auto y1 = Tensor<B>::from_vector(g.values(numel(ys), DType::f64), ys);
    const double l1 = x.index_select(a, i1).mul(y1).sum().template item<double>();
    const double r1 = x.mul(Tensor<B>::zeros(s, DType::f64).index_add(a, i1, y1)).sum().template item<double>();
    const double m1 = x.abs().index_select(a, i1).mul(y1.abs()).sum().template item<double>();
    CHECK(std::abs(l1 - r1) <= 4 * static_cast<double>(numel(ys) + numel(s)) * 0x1p-53 * m1);
  }
}

TEMPLATE_TEST_CASE("property: elementwise identities against libm in double", "[core][property]", KILN_ALL_BACKENDS) {
  using B = TestType;
  Gen g(2006);
  const auto v = g.values(200, DType::f64, -6, 6);
  const auto x = Tensor<B>::from_vector(v);
  const auto ex = host(x.exp()), th = host(x.tanh()), sg = host(x.sigmoid()), ge = host(x.gelu()), gt = host(x.gelu(true)),
             si = host(x.silu()), ab = host(x.abs()), sq = host(x.abs().add(Scalar(0.01)).sqrt());
  for (size_t i = 0; i < v.size(); ++i) {
    const double t = v[i];
    INFO("x = " << t);
    CHECK(std::abs(ex[i] - std::exp(t)) <= 4e-16 * std::exp(t));
    CHECK(std::abs(th[i] - std::tanh(t)) <= 4e-16);
    CHECK(std::abs(sg[i] - 1 / (1 + std::exp(-t))) <= 4e-16);
    CHECK(std::abs(ge[i] - 0.5 * t * std::erfc(-t / std::sqrt(2.0))) <= 1e-15 * (1 + std::abs(t)));
    CHECK(std::abs(gt[i] - 0.5 * t * (1 + std::tanh(std::sqrt(2 / M_PI) * (t + 0.044715 * t * t * t)))) <= 1e-15 * (1 + std::abs(t)));
    CHECK(std::abs(si[i] - t / (1 + std::exp(-t))) <= 1e-15 * (1 + std::abs(t)));
    CHECK(ab[i] == std::abs(t));
    CHECK(std::abs(sq[i] * sq[i] - (std::abs(t) + 0.01)) <= 1e-14 * (std::abs(t) + 0.01));
  }
  // (a - b) + b == a, a * b / b == a for exactly representable operands
  const auto a = Tensor<B>::from_vector(std::vector<double>{1.5, -2.25, 8, 0.125});
  const auto b = Tensor<B>::from_vector(std::vector<double>{0.5, 4, -0.25, 2});
  CHECK(host(a.sub(b).add(b)) == host(a));
  CHECK(host(a.mul(b).div(b)) == host(a));
  CHECK(host(a.pow(Scalar(2.0))) == host(a.square()));
}
