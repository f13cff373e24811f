// RNG: Philox-4x32-10 known answers, bit-identical random fills across backends (any dtype, any
// layout), stream semantics of Generator (same seed, consecutive draws), and statistical sanity.
#include <array>
#include <set>

#include "common/kiln_test.hpp"

using namespace kiln;
using namespace kt;

namespace {

// An independent Philox-4x32-10 with a full 128-bit counter, written from Salmon et al. 2011 /
// Random123's philox.h (round: hi/lo products with M0 on ctr[0] and M1 on ctr[2], key bumped by the
// Weyl constants before every round but the first).
std::array<uint32_t, 4> philox_ref(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1), static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1],
         static_cast<uint32_t>(p0)};
  }
  return c;
}

}  // namespace

TEST_CASE("philox4x32-10: Random123 known-answer vectors", "[core][rng]") {
  // Random123 kat_vectors, philox4x32 10 rounds: counter (4 words), key (2 words) -> output.
  CHECK(philox_ref({0, 0, 0, 0}, {0, 0}) == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox_ref({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
        std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(philox_ref({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
        std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  // kiln's philox4x32_10(counter, seed) is counter words (lo, hi, 0, 0) and key (lo, hi)
  const Philox4x32 z = philox4x32_10(0, 0);
  CHECK(std::array<uint32_t, 4>{z.v[0], z.v[1], z.v[2], z.v[3]} ==
        std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  // ... and agrees with the KAT-verified implementation on all rounds for arbitrary counters and keys
  std::mt19937_64 rng(77);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t ctr = rng(), key = rng();
    const Philox4x32 p = philox4x32_10(ctr, key);
    const auto q = philox_ref({static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0, 0},
                              {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)});
    INFO("counter " << ctr << " key " << key);
    REQUIRE(std::array<uint32_t, 4>{p.v[0], p.v[1], p.v[2], p.v[3]} == q);
  }
}

TEST_CASE("philox element functions: uniform is 24-bit and in 0 <= u < 1, normal is Box-Muller", "[core][rng]") {
  CHECK(philox_uniform(0) == 0.0);
  CHECK(philox_uniform(0xffffffffu) == 1.0 - 0x1p-24);
  CHECK(philox_uniform(0xffffffffu) < 1.0);
  // element i uses block offset + i/4, lane i%4
  const Philox4x32 b = philox4x32_10(5 + 2, 9);
  CHECK(philox_uniform_at(9, 5, 9) == philox_uniform(b.v[1]));
  // normal: lanes 0/1 from (v0, v1), lanes 2/3 from (v2, v3)
  const double u1 = (static_cast<double>(b.v[2]) + 1.0) / 4294967296.0, u2 = static_cast<double>(b.v[3]) / 4294967296.0;
  const double z0 = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2), z1 = std::sqrt(-2.0 * std::log(u1)) * std::sin(2 * M_PI * u2);
  CHECK(philox_normal_at(9, 5, 10) == Approx(z0).epsilon(1e-14).margin(1e-15));
  CHECK(philox_normal_at(9, 5, 11) == Approx(z1).epsilon(1e-14).margin(1e-15));
}

// Box-Muller's own log/sin/cos (core/rng.hpp): same bits on every backend, and within a few ulp of
// glibc over the whole input range the generator produces (u1 = k/2^32 in (0, 1], u2 = k/2^32 in [0, 1)).
TEST_CASE("rng_math: log, sin and cos agree with libm to a few ulp over every input the generator makes", "[core][rng]") {
  const auto ulps = [](double got, double want) {
    const double scale = std::max(std::abs(want), 0x1p-1022);
    return std::abs(got - want) / (std::nextafter(scale, INFINITY) - scale);
  };
  double worst_log = 0, worst_trig = 0;
  std::mt19937_64 rng(5);
  std::vector<uint64_t> ks{0, 1, 2, 3, 0x7fffffffu, 0x80000000u, 0xb504f333u, 0xfffffffeu, 0xffffffffu};
  for (uint64_t k = 0; k < 32; ++k) ks.push_back(uint64_t{1} << k);  // every binade of u1
  for (int i = 0; i < 200000; ++i) ks.push_back(rng() & 0xffffffffu);
  for (uint64_t k : ks) {
    const double u1 = (static_cast<double>(k) + 1.0) * (1.0 / 4294967296.0), u2 = static_cast<double>(k) * (1.0 / 4294967296.0);
    const double l = rng_math::log_unit(u1);
    if (u1 == 1.0)
      CHECK(l == 0.0);
    else
      worst_log = std::max(worst_log, ulps(l, std::log(u1)));
    double s, c;
    rng_math::sincos_turn(u2, s, c);
    // compare with libm on the same angle in long double (2π·u2 rounded to double would cost up to
    // an ulp of the angle, i.e. many ulp of sin near its zeros); scale-relative: |sin|, |cos| <= 1
    const long double ang = 2.0L * 3.141592653589793238462643383279502884L * static_cast<long double>(u2);
    worst_trig = std::max({worst_trig, std::abs(s - static_cast<double>(std::sin(ang))) / 0x1p-52,
                           std::abs(c - static_cast<double>(std::cos(ang))) / 0x1p-52});
  }
  INFO("worst log error " << worst_log << " ulp, worst sin/cos error " << worst_trig << " ulp of 1");
  CHECK(worst_log <= 4);
  CHECK(worst_trig <= 4);
}

TEST_CASE("round_uniform: a draw that rounds up to hi becomes the largest value below hi", "[core][rng]") {
  CHECK(static_cast<float>(round_uniform<bf16>(0.9999, 1.0)) == 0.99609375f);
  CHECK(static_cast<float>(round_uniform<f16>(5.9999, 6.0)) == 5.99609375f);
  CHECK(static_cast<float>(round_uniform<bf16>(0.5, 1.0)) == 0.5f);
  CHECK(static_cast<float>(round_uniform<bf16>(-1e-9, 0.0)) < 0.0f);
  CHECK(static_cast<float>(round_uniform<f16>(-0.50001, -0.5)) == -0.50048828125f);  // f16 spacing in [0.5, 1) is 2^-11
  CHECK(round_uniform<float>(1.0 - 1e-12, 1.0) == std::nextafter(1.0f, 0.0f));
  CHECK(round_uniform<double>(0.25, 1.0) == 0.25);
}

TEMPLATE_TEST_CASE("rng: fills are bit-identical to Reference for any seed, dtype and layout", "[core][rng][conformance]",
                   KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(3001);
  for (int it = 0; it < 60; ++it) {
    const uint64_t seed = g.coin() ? static_cast<uint64_t>(g.integer(0, 10)) : g.rng();
    const DType d = g.pick(kFloatDTypes);
    const Shape s = g.shape(0, 4, 9);
    const int kind = static_cast<int>(g.integer(0, 3));
    Generator gr(seed), gb(seed);
    // advance both generators by the same odd amount first so offsets are not always 0
    const uint64_t skip = static_cast<uint64_t>(g.integer(0, 9));
    gr.advance(skip);
    gb.advance(skip);
    const std::string w = fmt::format("seed {} skip {} kind {} {} {}", seed, skip, kind, shape_str(s), dtype_name(d));
    switch (kind) {
      case 0:
        check_bits(Tensor<B>::rand(s, d, &gb), RT::rand(s, d, &gr), "rand " + w);
        break;
      case 1:
        check_bits(Tensor<B>::randn(s, d, &gb), RT::randn(s, d, &gr), "randn " + w);
        break;
      case 2:
        check_bits(Tensor<B>::uniform(s, -2.5, 7, d, &gb), RT::uniform(s, -2.5, 7, d, &gr), "uniform " + w);
        break;
      default:
        check_bits(Tensor<B>::normal(s, 3, 0.5, d, &gb), RT::normal(s, 3, 0.5, d, &gr), "normal " + w);
        break;
    }
    CHECK(gr.offset() == gb.offset());
    // in place into a non-contiguous view: the view's logical elements get the stream in row-major
    // order, the rest of the base is untouched
    if (s.size() >= 1) {
      Shape bs = s;
      for (auto& x : bs) x = 2 * x + 1;
      auto rb = RT::zeros(bs, d);
      auto bb = Tensor<B>::zeros(bs, d);
      auto view = [&](auto t) {
        for (int64_t a = 0; a < static_cast<int64_t>(s.size()); ++a) t = t.slice(a, 1, t.size(a), 2);
        return s.size() >= 2 ? t.transpose(0, -1) : t;
      };
      auto rv = view(rb);
      auto bv = view(bb);
      if (g.coin()) {
        rv.normal_(0.5, 2, &gr);
        bv.normal_(0.5, 2, &gb);
      } else {
        rv.uniform_(-1, 1, &gr);
        bv.uniform_(-1, 1, &gb);
      }
      check_bits(bb, rb, "in-place fill of a strided view, " + w);
      // outside the view the base is untouched (zeros)
      const auto all = host(rb), inside = host(rv);
      const double nz = static_cast<double>(std::count_if(all.begin(), all.end(), [](double t) { return t != 0; }));
      CHECK(nz <= static_cast<double>(inside.size()));
    }
  }
}

TEMPLATE_TEST_CASE("rng: values follow the documented formula exactly (f64)", "[core][rng]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using B = TestType;
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefcafef00dull}) {
    Generator gen(seed);
    gen.advance(13);  // starts at block 4
    const auto u = host(Tensor<B>::uniform({3, 7}, -1, 3, DType::f64, &gen));
    const auto n = host(Tensor<B>::normal({21}, 2, 3, DType::f64, &gen));  // starts at block 4 + 6
    for (uint64_t i = 0; i < 21; ++i) {
      CHECK(u[i] == philox_affine(-1, 4, philox_uniform_at(seed, 4, i)));
      CHECK(n[i] == philox_affine(2, 3, philox_normal_at(seed, 10, i)));
    }
    // f32/bf16/f16 are the f64 value rounded once
    Generator g2(seed);
    const auto x32 = Tensor<B>::randn({9}, DType::f32, &g2);
    Generator g3(seed);
    check_bits(x32, Tensor<B>::randn({9}, DType::f64, &g3).to(DType::f32), "randn f32 == randn f64 rounded");
  }
}

TEMPLATE_TEST_CASE("rng: generator streams", "[core][rng]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using B = TestType;
  // same seed, same numbers; a different seed, different numbers
  Generator a(42), b(42), c(43);
  const auto xa = Tensor<B>::rand({1000}, DType::f32, &a);
  check_bits(Tensor<B>::rand({1000}, DType::f32, &b), xa, "same seed");
  CHECK(host(Tensor<B>::rand({1000}, DType::f32, &c)) != host(xa));
  // consecutive draws differ, do not overlap, and continue the stream at the next block
  Generator s(7);
  const auto d1 = host(Tensor<B>::rand({10}, DType::f64, &s));
  CHECK(s.offset() == 3);  // ceil(10 / 4) blocks
  const auto d2 = host(Tensor<B>::rand({10}, DType::f64, &s));
  CHECK(s.offset() == 6);
  Generator f(7);
  const auto all = host(Tensor<B>::rand({24}, DType::f64, &f));
  for (size_t i = 0; i < 10; ++i) {
    CHECK(d1[i] == all[i]);
    CHECK(d2[i] == all[12 + i]);
  }
  std::set<double> s1(d1.begin(), d1.end());
  for (double x : d2) CHECK(s1.count(x) == 0);
  // the thread's default generator: manual_seed resets it
  manual_seed(99);
  const auto m1 = host(Tensor<B>::randn({17}));
  const auto m2 = host(Tensor<B>::randn({17}));
  CHECK(m1 != m2);
  manual_seed(99);
  CHECK(host(Tensor<B>::randn({17})) == m1);
  Generator g99(99);
  CHECK(host(Tensor<B>::randn({17}, DType::f32, &g99)) == m1);
  // set_state resumes mid-stream (checkpoints)
  Generator r(5);
  (void)Tensor<B>::rand({8}, DType::f32, &r);
  Generator r2;
  r2.set_state(r.seed(), r.offset());
  check_bits(Tensor<B>::rand({5}, DType::f32, &r2), Tensor<B>::rand({5}, DType::f32, &r), "set_state resumes");
  // an empty fill consumes nothing
  Generator e(1);
  (void)Tensor<B>::rand({0, 4}, DType::f32, &e);
  CHECK(e.offset() == 0);
}

TEMPLATE_TEST_CASE("rng: statistics of 1e5 draws", "[core][rng]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using B = TestType;
  const double n = 1e5;
  for (DType d : kFloatDTypes) {
    INFO(dtype_name(d));
    Generator gen(1234);
    const auto x = host(Tensor<B>::normal({100000}, 1.5, 2.0, d, &gen));
    double m = 0, v = 0;
    for (double t : x) m += t;
    m /= n;
    for (double t : x) v += (t - m) * (t - m);
    const double sd = std::sqrt(v / (n - 1));
    // standard errors: mean 2/sqrt(n) = 0.0063, std 2/sqrt(2n) = 0.0045; 5 of them, plus the bf16/f16
    // storage rounding (relative 2^-9 at most, on average far less)
    CHECK(std::abs(m - 1.5) < 5 * 2.0 / std::sqrt(n) + 1.5 * 2 * u_store(d));
    CHECK(std::abs(sd - 2.0) < 5 * 2.0 / std::sqrt(2 * n) + 2.0 * 2 * u_store(d));
    // uniform [lo, hi): range, mean and variance (hi-lo)^2/12
    const auto u = host(Tensor<B>::uniform({100000}, -2, 6, d, &gen));
    const auto [mn, mx] = std::minmax_element(u.begin(), u.end());
    CHECK(*mn >= -2);
    CHECK(*mx < 6);
    double um = 0, uv = 0;
    for (double t : u) um += t;
    um /= n;
    for (double t : u) uv += (t - um) * (t - um);
    uv /= n - 1;
    CHECK(std::abs(um - 2) < 5 * 8 / std::sqrt(12 * n) + 6 * 2 * u_store(d));
    CHECK(std::abs(uv - 64.0 / 12) < 5 * 64.0 / 12 * std::sqrt(0.8 / n) + 64.0 / 12 * 4 * u_store(d));
    // rand stays below 1 after rounding to the dtype
    const auto r = host(Tensor<B>::rand({100000}, d, &gen));
    CHECK(*std::max_element(r.begin(), r.end()) < 1.0);
    CHECK(*std::min_element(r.begin(), r.end()) >= 0.0);
  }
}
