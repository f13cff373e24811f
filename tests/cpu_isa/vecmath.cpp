// The AVX-512 variants of the vector math (backends/cpu/vecmath.hpp) against their AVX2 twins: the
// same formulas on 16 lanes instead of 8, so the same floats, bit for bit, over the whole float range
// (every 127th bit pattern, both signs, and the special values: ±0, ±inf, NaNs, subnormals, exp's range
// limits), at every length 0..80 (the masked tails, vectors that mix in- and out-of-range lanes), from
// unaligned addresses, writing nothing past n; and the AVX2 variants against their scalar twins (libm inside)
// within a few ulp, on every CPU with AVX2 (a CPU without AVX-512 runs only that case, and says so).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <kiln/backends/cpu/vecmath.hpp>

namespace {

using namespace kiln::cpu;

#if KILN_CPU_X86
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}
#else
bool has_avx2() { return false; }
bool has_avx512() { return false; }
#endif

// The AVX-512 cases need the CPU to have it; where it does not, they say so and the AVX2 variants (the
// kernels such a CPU runs) are checked against their scalar twins instead (the last test case).
#define KILN_NEED_AVX512()                                                                                             \
  if (!has_avx512()) {                                                                                                 \
    WARN(                                                                                                              \
        "this CPU has no AVX-512 F/BW/DQ/VL: the AVX-512 variants cannot run here; the AVX2 ones are checked against " \
        "their scalar twins (\"cpu_isa: the AVX2 vector math ...\")");                                                 \
    return;                                                                                                            \
  }

constexpr float kInf = std::numeric_limits<float>::infinity();

// The inputs: every 127th bit pattern (both signs, all exponents, subnormals) and the special values,
// each special also inside vectors of ordinary values.
std::vector<float> inputs() {
  std::vector<float> v;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 127) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  const float specials[] = {0.0f,
                            -0.0f,
                            kInf,
                            -kInf,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7fa00001u),
                            std::bit_cast<float>(0xffc12345u),  // a signalling NaN, a payload
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::bit_cast<float>(0x007fffffu),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            -87.3f,
                            88.0f,
                            88.7228394f,
                            88.73f,
                            -104.0f,
                            -104.1f,
                            -87.4f,
                            0.625f,
                            -0.625f,
                            1.0f,
                            -1.0f,
                            0.70710678f,
                            1e-30f,
                            -1e-30f,
                            9.0f,
                            -9.0f,
                            44.4f,
                            -44.4f};
  for (float s : specials) {
    v.push_back(s);
    for (int k = 0; k < 19; ++k) v.push_back(0.37f * static_cast<float>(k - 9));
  }
  return v;
}

// The same bits, or both NaN: which NaN an operation on two NaNs returns (sign, payload) depends on
// its operand order, which the compiler may swap for the commutative ones (x * sigmoid(x)).
bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b)); }

using ArrayFn = void (*)(const float*, float*, int64_t);

template <class I> struct Fns {
  static void exp(const float* x, float* y, int64_t n) { vm::exp_n(I{}, x, y, n); }
  static void log(const float* x, float* y, int64_t n) { vm::log_n(I{}, x, y, n); }
  static void tanh(const float* x, float* y, int64_t n) { vm::tanh_n(I{}, x, y, n); }
  static void sigmoid(const float* x, float* y, int64_t n) { vm::sigmoid_n(I{}, x, y, n); }
  static void silu(const float* x, float* y, int64_t n) { vm::silu_n(I{}, x, y, n); }
  static void gelu_tanh(const float* x, float* y, int64_t n) { vm::gelu_tanh_n(I{}, x, y, n); }
};

struct Case {
  const char* name;
  ArrayFn avx2, avx512, base;
  int max_ulp;  // the AVX2 variant against the scalar twin (measured on a Zen 4: exp 1, log 1, tanh 2, sigmoid 2, silu 3)
  // The ulp a result may lose to its exp's argument being rounded: gelu_tanh computes 2u(x) =
  // 2·0.79788·(x + 0.044715·x³) in float with five roundings (x·x·x, two products, a sum, the last
  // product), up to ~3 ulp relative on each side, vector and scalar rounding differently; exp multiplies
  // a relative error of its argument t by |t| (its condition number): 6·|2u| ulp. 0 where the argument is
  // exact (|x|, 2|x|).
  double (*amplification)(float x);
};

double exact_argument(float) { return 0; }
double gelu_tanh_argument(float x) {
  const double v = static_cast<double>(x);
  return 6 * 1.5957691216057308 * std::abs(v + 0.044715 * v * v * v);
}

const Case kCases[] = {
    {"exp", Fns<Avx2>::exp, Fns<Avx512>::exp, Fns<Baseline>::exp, 2, exact_argument},
    {"log", Fns<Avx2>::log, Fns<Avx512>::log, Fns<Baseline>::log, 2, exact_argument},
    {"tanh", Fns<Avx2>::tanh, Fns<Avx512>::tanh, Fns<Baseline>::tanh, 3, exact_argument},
    {"sigmoid", Fns<Avx2>::sigmoid, Fns<Avx512>::sigmoid, Fns<Baseline>::sigmoid, 3, exact_argument},
    {"silu", Fns<Avx2>::silu, Fns<Avx512>::silu, Fns<Baseline>::silu, 4, exact_argument},
    {"gelu_tanh", Fns<Avx2>::gelu_tanh, Fns<Avx512>::gelu_tanh, Fns<Baseline>::gelu_tanh, 4, gelu_tanh_argument},
};

// The first index where a and b differ in bits, or -1.
int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace

TEST_CASE("cpu_isa: the AVX-512 vector math returns the AVX2 floats over the whole float range", "[cpu_isa]") {
  KILN_NEED_AVX512();
  const std::vector<float> x = inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  for (const Case& c : kCases) {
    INFO(c.name);
    std::vector<float> y2(x.size()), y5(x.size());
    c.avx2(x.data(), y2.data(), n);
    c.avx512(x.data(), y5.data(), n);
    const int64_t i = first_diff(y2, y5);
    INFO("x = " << (i >= 0 ? x[i] : 0.0f) << " (bits " << std::hex << (i >= 0 ? std::bit_cast<uint32_t>(x[i]) : 0u) << std::dec
                << "): avx2 " << (i >= 0 ? y2[i] : 0.0f) << ", avx512 " << (i >= 0 ? y5[i] : 0.0f));
    CHECK(i == -1);
    // in place (x and y the same array), as unary's buffers use it
    std::vector<float> z = x;
    c.avx512(z.data(), z.data(), n);
    CHECK(first_diff(z, y5) == -1);
  }
}

TEST_CASE("cpu_isa: the AVX-512 vector math at every tail length, unaligned, writes only its n floats", "[cpu_isa]") {
  KILN_NEED_AVX512();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-120.0f, 120.0f);
  for (const Case& c : kCases) {
    INFO(c.name);
    for (int64_t n = 0; n <= 80; ++n) {
      INFO("n = " << n);
      for (int64_t off = 0; off < 3; ++off) {
        std::vector<float> x(static_cast<size_t>(n + off + 16));
        for (float& v : x) v = u(rng);
        if (n > 5) x[off + n / 2] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> y2(x.size(), 12345.0f), y5(x.size(), 12345.0f);
        c.avx2(x.data() + off, y2.data() + off, n);
        c.avx512(x.data() + off, y5.data() + off, n);
        CHECK(first_diff(y2, y5) == -1);
        bool untouched = true;
        for (size_t i = 0; i < x.size(); ++i)
          if ((static_cast<int64_t>(i) < off || static_cast<int64_t>(i) >= off + n) && y5[i] != 12345.0f) untouched = false;
        CHECK(untouched);
      }
    }
  }
}

TEST_CASE("cpu_isa: AVX-512 row_max and exp_shift_sum give the AVX2 values and sums, bit for bit", "[cpu_isa]") {
  KILN_NEED_AVX512();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  const std::vector<int64_t> lengths = {0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 63, 64, 65, 127, 128, 129, 1000, 4099};
  for (int64_t n : lengths) {
    for (int variant = 0; variant < 4; ++variant) {
      INFO("n = " << n << ", variant " << variant);
      std::vector<float> x(static_cast<size_t>(n + 1));
      for (float& v : x) v = u(rng);
      const float* xp = x.data() + 1;  // unaligned
      if (n > 3 && variant == 1) x[1 + n / 3] = -kInf;
      if (n > 3 && variant == 2) x[1 + n - 1] = std::numeric_limits<float>::quiet_NaN();
      if (variant == 3)
        for (float& v : x) v = -kInf;  // a fully masked row: c = -inf
      const float m2 = vm::row_max(Avx2{}, xp, n), m5 = vm::row_max(Avx512{}, xp, n);
      CHECK(same_bits(m2, m5));
      const float c = variant == 3 ? -kInf : m2;
      std::vector<float> y2(x.size(), 7.0f), y5(x.size(), 7.0f);
      const float s2 = vm::exp_shift_sum(Avx2{}, xp, y2.data() + 1, n, c);
      const float s5 = vm::exp_shift_sum(Avx512{}, xp, y5.data() + 1, n, c);
      CHECK(same_bits(s2, s5));
      CHECK(first_diff(y2, y5) == -1);
      CHECK(y5[0] == 7.0f);
    }
  }
}

// The distance in ulp between two floats: 0 for the same bits or both NaN, "infinite" when one is NaN or
// infinite and the other not (or the signs differ, past zero), else the count of floats between them.
int64_t ulp_distance(float a, float b) {
  if (same_bits(a, b) || (a == 0.0f && b == 0.0f)) return 0;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) return std::numeric_limits<int64_t>::max();
  const auto ordered = [](float f) {
    const auto u = static_cast<int64_t>(std::bit_cast<uint32_t>(f));
    return u & 0x80000000 ? -(u & 0x7fffffff) : u;
  };
  return std::abs(ordered(a) - ordered(b));
}

TEST_CASE("cpu_isa: the AVX2 vector math is within a few ulp of its scalar twin over the whole float range", "[cpu_isa]") {
  if (!has_avx2()) {
    WARN("this CPU has no AVX2 + FMA: the Cpu backend runs only the scalar twins (libm), nothing vectorised to check");
    return;
  }
  const std::vector<float> x = inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  for (const Case& c : kCases) {
    INFO(c.name);
    std::vector<float> y2(x.size()), yb(x.size());
    c.avx2(x.data(), y2.data(), n);
    c.base(x.data(), yb.data(), n);
    // Results of magnitude >= 2^-100·max(1, |x|): within max_ulp + the amplified argument error. Below
    // that (the tails of exp, sigmoid, silu = x·sigmoid(x), gelu_tanh = x·sigmoid(2u), where a subnormal
    // factor keeps only a few bits): both below 2^-99·max(1, |x|), i.e. negligible, with the same sign.
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      double r = 0;
      const double tiny = 0x1p-100 * std::max(1.0, std::abs(static_cast<double>(x[i])));
      if (std::isfinite(yb[i]) && std::abs(yb[i]) < tiny)
        r = std::abs(y2[i]) < 2 * tiny && (y2[i] == 0.0f || yb[i] == 0.0f || std::signbit(y2[i]) == std::signbit(yb[i])) ? 0.0 : 2.0;
      else
        r = static_cast<double>(ulp_distance(y2[i], yb[i])) / (c.max_ulp + c.amplification(x[i]));
      if (r > worst) {
        worst = r;
        at = i;
      }
    }
    INFO("worst at x = " << x[at] << ": avx2 " << y2[at] << ", scalar " << yb[at] << " (" << ulp_distance(y2[at], yb[at]) << " ulp, "
                         << worst << " of the bound)");
    CHECK(worst <= 1.0);
    // every tail length, unaligned: the same floats as the whole array, nothing written past n
    for (int64_t len = 0; len <= 40; ++len) {
      std::vector<float> z(static_cast<size_t>(len + 9), 12345.0f);
      c.avx2(x.data() + 1001, z.data() + 1, len);
      bool same = z[0] == 12345.0f && z[static_cast<size_t>(len + 1)] == 12345.0f;
      for (int64_t i = 0; i < len; ++i) same = same && same_bits(z[static_cast<size_t>(i + 1)], y2[static_cast<size_t>(1001 + i)]);
      CHECK(same);
    }
  }
}
