// The AVX-512 variants of the vector math (backends/cpu/vecmath.hpp) against their AVX2 twins: the
// same formulas on 16 lanes instead of 8, so the same floats, bit for bit, over the whole float range
// (every 127th bit pattern, both signs, and the special values: ±0, ±inf, NaNs, subnormals, exp's range
// limits), at every length 0..80 (the masked tails, vectors that mix in- and out-of-range lanes), from
// unaligned addresses, writing nothing past n. Exits 77 (skipped) on a CPU without AVX-512.
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
void need_avx512() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return;
  std::printf("this CPU has no AVX-512 F/BW/DQ/VL: skipped\n");
  std::exit(77);
}
#else
void need_avx512() {
  std::printf("not x86: skipped\n");
  std::exit(77);
}
#endif

constexpr float kInf = std::numeric_limits<float>::infinity();

// The inputs: every 127th bit pattern (both signs, all exponents, subnormals) and the special values,
// each special also inside vectors of ordinary values.
std::vector<float> inputs() {
  std::vector<float> v;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 127) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7fa00001u), std::bit_cast<float>(0xffc12345u),  // a signalling NaN, a payload
                            std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                            std::bit_cast<float>(0x007fffffu), std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(), -87.3f, 88.0f, 88.7228394f, 88.73f, -104.0f, -104.1f, -87.4f,
                            0.625f, -0.625f, 1.0f, -1.0f, 0.70710678f, 1e-30f, -1e-30f, 9.0f, -9.0f, 44.4f, -44.4f};
  for (float s : specials) {
    v.push_back(s);
    for (int k = 0; k < 19; ++k) v.push_back(0.37f * static_cast<float>(k - 9));
  }
  return v;
}

// The same bits, or both NaN: which NaN an operation on two NaNs returns (sign, payload) depends on
// its operand order, which the compiler may swap for the commutative ones (x * sigmoid(x)).
bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

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
  ArrayFn avx2, avx512;
};

const Case kCases[] = {
    {"exp", Fns<Avx2>::exp, Fns<Avx512>::exp},
    {"log", Fns<Avx2>::log, Fns<Avx512>::log},
    {"tanh", Fns<Avx2>::tanh, Fns<Avx512>::tanh},
    {"sigmoid", Fns<Avx2>::sigmoid, Fns<Avx512>::sigmoid},
    {"silu", Fns<Avx2>::silu, Fns<Avx512>::silu},
    {"gelu_tanh", Fns<Avx2>::gelu_tanh, Fns<Avx512>::gelu_tanh},
};

// The first index where a and b differ in bits, or -1.
int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace

TEST_CASE("cpu_isa: the AVX-512 vector math returns the AVX2 floats over the whole float range", "[cpu_isa]") {
  need_avx512();
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
  need_avx512();
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
  need_avx512();
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
