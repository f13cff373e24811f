// Conformance: reductions (single and multiple axes, keepdim, NaN, ties), matmul, softmax/log_softmax
// against Reference with error bounds derived per element (see tests/common/kiln_test.hpp).
#include "common/kiln_test.hpp"

using namespace kiln;
using namespace kt;

namespace {

// A random subset of axes (maybe empty = all, maybe negative) of a rank-r shape.
std::vector<int64_t> random_axes(Gen& g, int64_t r) {
  std::vector<int64_t> ax;
  for (int64_t a = 0; a < r; ++a)
    if (g.coin(0.4)) ax.push_back(g.coin() ? a : a - r);
  std::shuffle(ax.begin(), ax.end(), g.rng);
  return ax;
}
int64_t reduced_count(const Shape& s, const std::vector<int64_t>& ax) {
  if (ax.empty()) return numel(s);
  int64_t n = 1;
  for (int64_t a : ax) n *= s[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(s.size()) : a)];
  return n;
}

}  // namespace

TEMPLATE_TEST_CASE("conformance: sum/mean/prod over axes with keepdim", "[core][conformance][reduce]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(707);
  for (int it = 0; it < 120; ++it) {
    const DType d = g.pick(std::vector<DType>{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean});
    const Shape s = g.shape(0, 4, it % 10 == 0 ? 40 : 7);
    const Lay l = g.pick(kLayouts);
    const bool keep = g.coin();
    const auto ax = random_axes(g, static_cast<int64_t>(s.size()));
    const int64_t n = reduced_count(s, ax);
    const double naxes = ax.empty() ? static_cast<double>(s.size()) : static_cast<double>(ax.size());
    RT rx;
    Tensor<B> bx;
    g.make_pair(s, d, l, rx, bx, -3, 3);
    const std::string w = fmt::format("{} axes [{}] keepdim {}", describe(s, d, l), fmt::join(ax, ", "), keep);
    // Higham: |err| <= (n-1) u_acc sum|x| for any summation order, plus storage rounding of each
    // intermediate (one per reduced axis, core reduces axis by axis)
    const double c = (static_cast<double>(std::max<int64_t>(n - 1, 0))) * u_acc(d) + naxes * 2 * u_store(d);
    std::vector<double> bound;
    if (kiln::is_floating(d)) {
      bound = host(rx.abs().to(DType::f64).sum(ax, keep));
      for (auto& b : bound) b *= c;
    } else {
      bound.assign(static_cast<size_t>(numel(RT::zeros(s).sum(ax, keep).shape())), 0.0);
    }
    check_close(bx.sum(ax, keep), rx.sum(ax, keep), Tol{2 * u_store(d), 0}, "sum " + w, &bound);
    if (kiln::is_floating(d)) {
      for (auto& b : bound) b /= static_cast<double>(std::max<int64_t>(n, 1));
      check_close(bx.mean(ax, keep), rx.mean(ax, keep), Tol{4 * u_store(d), 0}, "mean " + w, &bound);
    }
    // prod: values near 1 so it neither overflows nor underflows; relative error (n-1) u + roundings
    RT rp;
    Tensor<B> bp;
    g.make_pair(s, d, l, rp, bp, kiln::is_floating(d) ? 0.5 : -2, kiln::is_floating(d) ? 1.5 : 2);
    const double pr = static_cast<double>(std::max<int64_t>(n - 1, 0)) * u_acc(d) + (naxes + 1) * 2 * u_store(d);
    check_close(bp.prod(ax, keep), rp.prod(ax, keep), Tol{pr, 0}, "prod " + w);
  }
}

TEMPLATE_TEST_CASE("conformance: max/min/argmax/argmin with NaN and ties", "[core][conformance][reduce]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(808);
  for (int it = 0; it < 150; ++it) {
    const DType d = g.pick(std::vector<DType>{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64});
    Shape s = g.shape(1, 4, 7, 0.0);
    const Lay l = g.pick(kLayouts);
    g.ties = g.coin(0.5);
    g.p_nan = g.coin(0.3) ? 0.1 : 0.0;
    RT rx;
    Tensor<B> bx;
    g.make_pair(s, d, l, rx, bx, -3, 3);
    g.ties = false;
    g.p_nan = 0;
    const bool keep = g.coin();
    const auto ax = random_axes(g, static_cast<int64_t>(s.size()));
    const std::string w = fmt::format("{} axes [{}] keepdim {}", describe(s, d, l), fmt::join(ax, ", "), keep);
    // exact: max/min pick an element, NaN propagates
    check_equal(bx.max(ax, keep), rx.max(ax, keep), "max " + w);
    check_equal(bx.min(ax, keep), rx.min(ax, keep), "min " + w);
    const int64_t a = g.integer(-static_cast<int64_t>(s.size()), static_cast<int64_t>(s.size()) - 1);
    check_equal(bx.argmax(a, keep), rx.argmax(a, keep), fmt::format("argmax axis {} of {}", a, w));
    check_equal(bx.argmin(a, keep), rx.argmin(a, keep), fmt::format("argmin axis {} of {}", a, w));
    check_equal(bx.argmax(), rx.argmax(), "argmax (flat) " + w);
    // independent: gathering at argmax gives max (NaN rows give NaN on both sides)
    const auto am = rx.argmax(a, true);
    check_equal(rx.gather(a, am), rx.max({a}, true), "gather(argmax) == max, " + w);
  }
}

TEST_CASE("reductions: literal NaN, tie and empty semantics (PyTorch)", "[core][reduce]") {
  const double nan = std::nan("");
  const RT x = RT::from_vector(std::vector<double>{1, nan, 3, nan, 3, 0}, {2, 3});
  // max/min propagate NaN; argmax/argmin return the first NaN
  CHECK(std::isnan(host(x.max())[0]));
  const auto m1 = host(x.max({1}));
  CHECK((std::isnan(m1[0]) && std::isnan(m1[1])));
  const auto m0 = host(x.max({0}));
  CHECK((std::isnan(m0[0]) && std::isnan(m0[1]) && m0[2] == 3));
  CHECK(host(x.argmax(1)) == std::vector<double>{1, 0});
  CHECK(host(x.argmin(0)) == std::vector<double>{1, 0, 1});
  // ties: first index
  const RT t = RT::from_vector(std::vector<float>{2, 5, 5, 1, 1, 2}, {6});
  CHECK(t.argmax().template item<int64_t>() == 1);
  CHECK(t.argmin(0).template item<int64_t>() == 3);
  // empty: sum 0, prod 1, mean nan, max throws
  const RT e = RT::zeros({2, 0});
  CHECK(host(e.sum({1})) == std::vector<double>{0, 0});
  CHECK(host(e.prod({1})) == std::vector<double>{1, 1});
  CHECK(std::isnan(e.mean().template item<double>()));
  CHECK_THROWS_AS(e.max({1}), kiln::Error);
  // integer sums are i64 and exact beyond 2^31
  const RT big = RT::full({3}, 2000000000, DType::i32);
  CHECK(big.sum().dtype() == DType::i64);
  CHECK(big.sum().template item<int64_t>() == 6000000000LL);
  CHECK(RT::from_vector(std::vector<uint8_t>{1, 0, 1, 1}).sum().template item<int64_t>() == 3);
}

TEMPLATE_TEST_CASE("conformance: matmul shapes, broadcast batches and transposed operands", "[core][conformance][matmul]",
                   KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(909);
  for (int it = 0; it < 150; ++it) {
    const DType d = g.pick(kFloatDTypes);
    const int64_t M = g.integer(0, 1) ? g.integer(1, 9) : g.integer(0, 2);
    const int64_t K = it % 15 == 0 ? g.integer(60, 200) : g.integer(0, 9);
    const int64_t N = g.integer(1, 9);
    const int kind = static_cast<int>(g.integer(0, 5));  // 0: 1-D@1-D, 1: 1-D@N-D, 2: N-D@1-D, else N-D@N-D
    auto [ba, bb] = broadcast_pair(g, 2);
    Shape sa = ba, sb = bb;
    if (kind == 0 || kind == 1)
      sa = {K};
    else
      sa.insert(sa.end(), {M, K});
    if (kind == 0 || kind == 2)
      sb = {K};
    else
      sb.insert(sb.end(), {K, N});
    const Lay la = g.pick(kLayouts), lb = g.pick(kLayouts);
    RT ra, rb;
    Tensor<B> xa, xb;
    g.make_pair(sa, d, la, ra, xa, -2, 2);
    g.make_pair(sb, d, lb, rb, xb, -2, 2);
    // and a transpose of the last two dims folded into the operand
    if (sa.size() >= 2 && g.coin(0.3)) {
      const RT t = RT::from_vector(g.values(numel(sa), d),
                                   [&] {
                                     Shape x = sa;
                                     std::swap(x[x.size() - 1], x[x.size() - 2]);
                                     return x;
                                   }())
                       .to(d);
      ra = t.transpose(-1, -2);
      xa = t.template to<B>().transpose(-1, -2);
    }
    const std::string w = fmt::format("{} @ {}", describe(sa, d, la), describe(sb, d, lb));
    const RT want = ra.matmul(rb);
    std::vector<double> bound = host(ra.abs().to(DType::f64).matmul(rb.abs().to(DType::f64)));
    for (auto& b : bound) b *= static_cast<double>(K) * u_acc(d);
    check_close(xa.matmul(xb), want, Tol{2 * u_store(d), 0}, "matmul " + w, &bound);
  }
}

TEMPLATE_TEST_CASE("conformance: softmax and log_softmax on any axis", "[core][conformance][softmax]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(1010);
  for (int it = 0; it < 100; ++it) {
    const DType d = g.pick(kFloatDTypes);
    const Shape s = g.shape(0, 4, it % 10 == 0 ? 50 : 7);
    const Lay l = g.pick(kLayouts);
    const double mag = g.pick(std::vector<double>{1, 10, 80, 1000});
    RT rx;
    Tensor<B> bx;
    g.make_pair(s, d, l, rx, bx, -mag, mag);
    const int64_t r = static_cast<int64_t>(s.size());
    const int64_t a = r ? g.integer(-r, r - 1) : 0;
    const int64_t n = r ? s[static_cast<size_t>(a < 0 ? a + r : a)] : 1;
    const std::string w = fmt::format("{} axis {} magnitude {}", describe(s, d, l), a, mag);
    // y_i = exp(x_i - m) / sum: exp within a few ulp, the sum within (n-1) u, one division; the
    // result is stored once. Elements below the smallest normal lose relative precision: atol.
    const double c = (static_cast<double>(n) + 8) * u_acc(d);
    const double tiny = d == DType::f64 ? 1e-300 : d == DType::f16 ? 1e-7 : 1e-37;
    check_close(bx.softmax(a), rx.softmax(a), Tol{c + 2 * u_store(d), tiny}, "softmax " + w);
    // log_softmax: y = (x - m) - log(sum); x - m is exact or rounded once (relative), log(sum) has
    // absolute error ~ (n+8) u
    check_close(bx.log_softmax(a), rx.log_softmax(a), Tol{4 * u_acc(d) + 2 * u_store(d), c}, "log_softmax " + w);
  }
}

// i64 arithmetic is exact: values beyond 2^53 (where a trip through double would round) survive
// sums, max, negation, addition and same-dtype copies on every backend.
TEMPLATE_TEST_CASE("conformance: i64 beyond 2^53 stays exact through reductions and arithmetic", "[core][conformance][reduce]",
                   ::kiln::Reference, KILN_TEST_BACKENDS) {
  using B = TestType;
  using T = Tensor<B>;
  const int64_t big = (int64_t{1} << 53) + 1;
  const T x = T::from_vector(std::vector<int64_t>{big, 2, big + 2, -3}, {2, 2});
  CHECK(x.sum().template item<int64_t>() == 2 * big + 1);
  CHECK(x.sum({0}).template to_vector<int64_t>() == std::vector<int64_t>{2 * big + 2, -1});
  CHECK(x.sum({1}).template to_vector<int64_t>() == std::vector<int64_t>{big + 2, big - 1});
  CHECK(x.max().template item<int64_t>() == big + 2);
  CHECK(x.neg().template to_vector<int64_t>() == std::vector<int64_t>{-big, -2, -big - 2, 3});
  CHECK(x.add(x).template to_vector<int64_t>() == std::vector<int64_t>{2 * big, 4, 2 * big + 4, -6});
  CHECK(x.t().contiguous().template to_vector<int64_t>() == std::vector<int64_t>{big, big + 2, 2, -3});
}
