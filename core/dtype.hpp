#pragma once
// Element types. f32 is the default; f64 serves tests and gradcheck; bf16/f16 are storage types whose
// arithmetic happens in f32 (compute_t); i32/i64 index; boolean is one byte holding 0 or 1.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, boolean };

// bfloat16: the upper half of an IEEE float; conversion rounds to nearest even, NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  KILN_HD explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  KILN_HD explicit bf16(double d) : bf16(static_cast<float>(d)) {}
  KILN_HD operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE binary16 with round-to-nearest-even conversion (subnormals, inf and NaN handled).
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  KILN_HD explicit f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or NaN
      bits = static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
      return;
    }
    if (ax >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
      bits = static_cast<uint16_t>(sign | 0x7c00u);
      return;
    }
    if (ax < 0x38800000u) {    // below the smallest normal half (2^-14): subnormal or zero
      if (ax < 0x33000000u) {  // < 2^-25 rounds to zero
        bits = static_cast<uint16_t>(sign);
        return;
      }
      uint32_t mant = (ax & 0x7fffffu) | 0x800000u;  // value = mant * 2^(e-150); unit 2^-24
      uint32_t drop = 126u - (ax >> 23);             // in [14, 24]
      uint32_t h = mant >> drop;
      uint32_t rem = mant & ((1u << drop) - 1u);
      uint32_t half = 1u << (drop - 1);
      if (rem > half || (rem == half && (h & 1u))) ++h;
      bits = static_cast<uint16_t>(sign | h);
      return;
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    bits = static_cast<uint16_t>(sign | h);
  }
  KILN_HD explicit f16(double d) : f16(static_cast<float>(d)) {}
  KILN_HD operator float() const {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu, u;
    if (e == 0) {
      if (m == 0) {
        u = sign;
      } else {  // subnormal: normalise
        int s = 0;
        while (!(m & 0x400u)) {
          m <<= 1;
          ++s;
        }
        m &= 0x3ffu;
        u = sign | (static_cast<uint32_t>(113 - s) << 23) | (m << 13);
      }
    } else if (e == 31) {
      u = sign | 0x7f800000u | (m << 13);
    } else {
      u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <class T> struct dtype_of_t;
template <> struct dtype_of_t<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of_t<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of_t<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of_t<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of_t<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of_t<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of_t<bool> { static constexpr DType value = DType::boolean; };
template <class T> inline constexpr DType dtype_of = dtype_of_t<T>::value;

// The type arithmetic on T happens in: f32 for the half types, T otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<bf16> { using type = float; };
template <> struct compute_type<f16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

template <class T> inline constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

constexpr size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::boolean:
      return 1;
  }
  return 0;
}
constexpr bool is_floating(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16; }
constexpr bool is_half(DType d) { return d == DType::bf16 || d == DType::f16; }  // the 16-bit floats
constexpr bool is_integral(DType d) { return d == DType::i32 || d == DType::i64; }
std::string_view dtype_name(DType d);
// Parses "f32", "float32", "bf16", ... ; throws kiln::Error naming the valid names.
DType parse_dtype(std::string_view name);

template <class T> struct type_tag { using type = T; };

// Calls f(type_tag<T>{}) with the C++ type of d.
template <class F> decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::f32:
      return f(type_tag<float>{});
    case DType::f64:
      return f(type_tag<double>{});
    case DType::bf16:
      return f(type_tag<bf16>{});
    case DType::f16:
      return f(type_tag<f16>{});
    case DType::i32:
      return f(type_tag<int32_t>{});
    case DType::i64:
      return f(type_tag<int64_t>{});
    case DType::boolean:
      return f(type_tag<bool>{});
  }
  return f(type_tag<float>{});
}

}  // namespace kiln

template <> struct fmt::formatter<kiln::DType> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(kiln::DType d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(kiln::dtype_name(d), ctx);
  }
};
#pragma GCC visibility pop
