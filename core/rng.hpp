#pragma once
// Counter-based random numbers (Philox-4x32-10, Salmon et al. 2011). Element i of a random fill with
// (seed, offset) depends only on (seed, offset + i/4, i%4), never on the backend, the thread count or
// the order of evaluation: a model initialised on CPU and on CUDA is the same model.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kiln/core/dtype.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct Philox4x32 {
  uint32_t v[4];
};

KILN_HD inline Philox4x32 philox4x32_10(uint64_t counter, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 (f32) resolution from one 32-bit word: identical on every backend.
KILN_HD inline double philox_uniform(uint32_t u) { return static_cast<double>(u >> 8) * (1.0 / 16777216.0); }

// lo + scale * x rounded once (a fused multiply-add) on every backend and build: compilers contract
// a + b * c into an FMA or not depending on the target and the context, which would change the last
// bit of a draw between backends.
KILN_HD inline double philox_affine(double lo, double scale, double x) { return std::fma(scale, x, lo); }

// Element i of a uniform fill.
KILN_HD inline double philox_uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox_uniform(philox4x32_10(offset + i / 4, seed).v[i % 4]);
}

// Box-Muller's log, sin and cos, computed the same way on every backend: libm's double log/sin/cos
// differ by an ulp or two between glibc and CUDA, which would make a normal draw differ between the
// CPU and the GPU. These use only +, −, ×, ÷, sqrt and explicit fma, each correctly rounded on every
// host and GPU, and leave no a·b + c for a compiler to contract: the same bits everywhere. They are
// within a few ulp of libm (tests/core/test_rng.cpp).
namespace rng_math {

// log(x) for x in (0, 1] (a normal double): x = 2^e·f, f in [√½, √2), log f = 2·atanh(s) with
// s = (f − 1)/(f + 1), |s| < 0.172, by its series to s^21.
KILN_HD inline double log_unit(double x) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  int e = static_cast<int>((b >> 52) & 0x7ffu) - 1023;
  b = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
  double f;
  std::memcpy(&f, &b, 8);  // [1, 2)
  if (f > 1.4142135623730951) {
    f *= 0.5;
    e += 1;
  }
  const double s = (f - 1.0) / (f + 1.0), z = s * s;
  double p = 1.0 / 21;
  for (int k = 19; k >= 3; k -= 2) p = std::fma(p, z, 1.0 / k);
  p = std::fma(p, z, 1.0);
  const double ed = static_cast<double>(e);
  // ln 2 = hi + lo with hi's low bits zero, so ed·hi is exact
  return std::fma(ed, 0x1.62e42fefa3800p-1, std::fma(ed, 0x1.ef35793c76730p-45, (2.0 * s) * p));
}

// sin and cos of 2π·u for u in [0, 1) with u·8 exact (u = k / 2^32): octant o = ⌊8u⌋ and r = 8u − o
// are exact, θ = r·π/4 (or (1 − r)·π/4 in odd octants) lies in [0, π/4], where Taylor series to θ^19
// and θ^18 are below half an ulp.
KILN_HD inline void sincos_turn(double u, double& sn, double& cs) {
  const double y = u * 8.0;
  const int o = static_cast<int>(y);
  const double r = y - static_cast<double>(o);
  const double t = ((o & 1) ? 1.0 - r : r) * 0.78539816339744830962, t2 = t * t;
  constexpr double kSin[] = {-1.0 / 121645100408832000.0,
                             1.0 / 355687428096000.0,
                             -1.0 / 1307674368000.0,
                             1.0 / 6227020800.0,
                             -1.0 / 39916800.0,
                             1.0 / 362880.0,
                             -1.0 / 5040.0,
                             1.0 / 120.0,
                             -1.0 / 6.0};  // 1/19!, ..., 1/3! with signs
  constexpr double kCos[] = {-1.0 / 6402373705728000.0,
                             1.0 / 20922789888000.0,
                             -1.0 / 87178291200.0,
                             1.0 / 479001600.0,
                             -1.0 / 3628800.0,
                             1.0 / 40320.0,
                             -1.0 / 720.0,
                             1.0 / 24.0,
                             -0.5};  // 1/18!, ..., 1/2! with signs
  double ps = kSin[0], pc = kCos[0];
  for (int k = 1; k < 9; ++k) {
    ps = std::fma(ps, t2, kSin[k]);
    pc = std::fma(pc, t2, kCos[k]);
  }
  const double st = t * std::fma(ps, t2, 1.0), ct = std::fma(pc, t2, 1.0);
  const double a = (o & 1) ? ct : st, c = (o & 1) ? st : ct;  // sin, cos of the angle within its quadrant
  switch (o >> 1) {
    case 0:
      sn = a;
      cs = c;
      break;
    case 1:
      sn = c;
      cs = -a;
      break;
    case 2:
      sn = -a;
      cs = -c;
      break;
    default:
      sn = -c;
      cs = a;
      break;
  }
}

}  // namespace rng_math

// Element i of a standard-normal fill: Box-Muller on the pairs (v0,v1) and (v2,v3) of block i/4,
// computed in double (with rng_math's functions) so every backend rounds to the same float.
KILN_HD inline double philox_normal_from(const Philox4x32& r, unsigned lane) {
  const unsigned pair = lane / 2;
  const double u1 = (static_cast<double>(r.v[2 * pair]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = static_cast<double>(r.v[2 * pair + 1]) * (1.0 / 4294967296.0);      // [0, 1)
  const double rad = std::sqrt(-2.0 * rng_math::log_unit(u1));
  double sn, cs;
  rng_math::sincos_turn(u2, sn, cs);
  return (lane % 2 == 0) ? rad * cs : rad * sn;
}
KILN_HD inline double philox_normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox_normal_from(philox4x32_10(offset + i / 4, seed), static_cast<unsigned>(i % 4));
}

// A uniform draw x in [lo, hi) stored as T: x rounded to nearest, except that a value rounding up to
// hi (bf16/f16 have 8/11 significand bits, so lo + (hi-lo)*u with u = 1 - 2^-24 often does) becomes
// the largest T below hi. Every backend stores uniform draws through this so [lo, hi) holds and the
// bits agree. T is float, double, bf16 or f16.
template <class T> KILN_HD inline T round_uniform(double x, double hi) {
  const T y = T(static_cast<float>(x));
  if constexpr (sizeof(T) == 8) {
    return x < hi ? static_cast<T>(x) : static_cast<T>(std::nextafter(hi, -INFINITY));
  } else if constexpr (sizeof(T) == 4) {
    if (static_cast<double>(y) < hi) return y;
    float h = static_cast<float>(hi);
    while (static_cast<double>(h) >= hi) h = std::nextafter(h, -INFINITY);
    return h;
  } else {
    if (static_cast<double>(static_cast<float>(y)) < hi) return y;
    T h = T(static_cast<float>(hi));
    while (static_cast<double>(static_cast<float>(h)) >= hi) {
      // one step toward -inf on the 16-bit sign-magnitude encoding
      if (h.bits == 0x0000u)
        h.bits = 0x8001u;
      else if (h.bits & 0x8000u)
        ++h.bits;
      else
        --h.bits;
    }
    return h;
  }
}

// A generator is a seed and a counter. Each fill of n elements consumes ceil(n/4) counter blocks, so
// consecutive fills never overlap. Its state (seed, offset) is what checkpoints save.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  // Reserves counter blocks for n elements and returns the first block.
  uint64_t advance(uint64_t n) {
    const uint64_t first = offset_;
    offset_ += (n + 3) / 4;
    return first;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// The thread's default generator (used when a factory gets none).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace kiln
#pragma GCC visibility pop
