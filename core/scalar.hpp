#pragma once
// A runtime number: what fill, full and tensor-scalar arithmetic take. Holds a double, an integer or
// a bool and converts to any element type on request.
#include <cstdint>
#include <type_traits>

#include "kiln/core/dtype.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class Scalar {
 public:
  enum class Kind : uint8_t { floating, integral, boolean };

  Scalar() = default;
  template <class T>
  requires std::is_arithmetic_v<T> Scalar(T v) {  // NOLINT(google-explicit-constructor): numbers convert implicitly, like PyTorch
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = Kind::boolean;
      i_ = v ? 1 : 0;
      d_ = v ? 1.0 : 0.0;
    } else if constexpr (std::is_integral_v<T>) {
      kind_ = Kind::integral;
      i_ = static_cast<int64_t>(v);
      d_ = static_cast<double>(v);
    } else {
      kind_ = Kind::floating;
      d_ = static_cast<double>(v);
      i_ = saturate(d_);
    }
  }

  // A double as an int64, truncated toward zero; NaN gives 0 and what is beyond the range its end (a
  // plain cast of those is undefined behaviour: -inf, the attention mask's fill, reached it on every
  // forward; found by fuzz/fuzz_resume under UBSan).
  static int64_t saturate(double d) {
    if (d != d) return 0;
    if (d >= 0x1p63) return INT64_MAX;
    if (d < -0x1p63) return INT64_MIN;
    return static_cast<int64_t>(d);
  }

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::floating; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }

  template <class T> T to() const {
    if constexpr (std::is_same_v<T, bool>)
      return kind_ == Kind::floating ? d_ != 0.0 : i_ != 0;
    else if constexpr (std::is_integral_v<T>)
      return static_cast<T>(i_);
    else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      return T(static_cast<float>(d_));
    else
      return kind_ == Kind::floating ? static_cast<T>(d_) : static_cast<T>(i_);
  }

 private:
  Kind kind_ = Kind::floating;
  double d_ = 0.0;
  int64_t i_ = 0;
};

}  // namespace kiln

template <> struct fmt::formatter<kiln::Scalar> : fmt::formatter<double> {
  template <class Ctx> auto format(const kiln::Scalar& s, Ctx& ctx) const {
    if (s.kind() != kiln::Scalar::Kind::floating) return fmt::format_to(ctx.out(), "{}", s.to_int());
    return fmt::formatter<double>::format(s.to_double(), ctx);
  }
};
#pragma GCC visibility pop
