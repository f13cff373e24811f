#pragma once
// Op tags. An op is a type: one backend entry (unary<Op>, binary<Op>, reduce<Op>) covers a family, and
// the same tag's scalar function runs in every backend (KILN_HD makes it callable from CUDA kernels).
// Arithmetic happens in compute_t<T> (f32 for the half types).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/core/dtype.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::op {

// ------------------------------------------------------------------------------------------ unary
// The op tables below keep one row per op (clang-format would reflow them).
// clang-format off
#define KILN_UNARY(NAME, STR, FLOAT_ONLY, EXPR)                  \
  struct NAME {                                                  \
    static constexpr const char* name = STR;                     \
    static constexpr bool float_only = FLOAT_ONLY;               \
    template <class T> KILN_HD static T f(T x) { return EXPR; } \
  };

KILN_UNARY(Neg, "neg", false, static_cast<T>(-x))
KILN_UNARY(Abs, "abs", false, static_cast<T>(x < T(0) ? -x : x))
KILN_UNARY(Square, "square", false, static_cast<T>(x * x))
KILN_UNARY(Sign, "sign", false, static_cast<T>((x > T(0)) - (x < T(0))))
KILN_UNARY(Exp, "exp", true, std::exp(x))
KILN_UNARY(Log, "log", true, std::log(x))
KILN_UNARY(Log1p, "log1p", true, std::log1p(x))
KILN_UNARY(Expm1, "expm1", true, std::expm1(x))
KILN_UNARY(Sqrt, "sqrt", true, std::sqrt(x))
KILN_UNARY(Rsqrt, "rsqrt", true, T(1) / std::sqrt(x))
KILN_UNARY(Recip, "reciprocal", true, T(1) / x)
KILN_UNARY(Sin, "sin", true, std::sin(x))
KILN_UNARY(Cos, "cos", true, std::cos(x))
KILN_UNARY(Tanh, "tanh", true, std::tanh(x))
KILN_UNARY(Sigmoid, "sigmoid", true, T(1) / (T(1) + std::exp(-x)))
// relu propagates NaN like PyTorch (x > 0 is false for NaN).
KILN_UNARY(Relu, "relu", false, static_cast<T>((x > T(0) || x != x) ? x : T(0)))
KILN_UNARY(Silu, "silu", true, x / (T(1) + std::exp(-x)))
// GELU, exact (erf) form: PyTorch's default.
KILN_UNARY(Gelu, "gelu", true, T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440))))
// GELU, tanh approximation (PyTorch approximate="tanh").
KILN_UNARY(GeluTanh, "gelu_tanh", true,
           T(0.5) * x * (T(1) + std::tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x))))
#undef KILN_UNARY

// Every unary op, for explicit instantiation in backends: X(Neg) X(Abs) ...
#define KILN_UNARY_OPS(X) \
  X(Neg) X(Abs) X(Square) X(Sign) X(Exp) X(Log) X(Log1p) X(Expm1) X(Sqrt) X(Rsqrt) X(Recip) X(Sin) \
  X(Cos) X(Tanh) X(Sigmoid) X(Relu) X(Silu) X(Gelu) X(GeluTanh)

// ------------------------------------------------------------------------------------------ binary
// compare = true: the output is bool, the inputs share any dtype.
#define KILN_BINARY(NAME, STR, FLOAT_ONLY, COMPARE, EXPR)                  \
  struct NAME {                                                            \
    static constexpr const char* name = STR;                               \
    static constexpr bool float_only = FLOAT_ONLY;                         \
    static constexpr bool compare = COMPARE;                               \
    template <class T> KILN_HD static auto f(T a, T b) { return EXPR; }   \
  };

KILN_BINARY(Add, "add", false, false, static_cast<T>(a + b))
KILN_BINARY(Sub, "sub", false, false, static_cast<T>(a - b))
KILN_BINARY(Mul, "mul", false, false, static_cast<T>(a * b))
KILN_BINARY(Div, "div", true, false, static_cast<T>(a / b))
// maximum/minimum propagate NaN like PyTorch.
KILN_BINARY(Maximum, "maximum", false, false, static_cast<T>((a != a || a > b) ? a : b))
KILN_BINARY(Minimum, "minimum", false, false, static_cast<T>((a != a || a < b) ? a : b))
KILN_BINARY(Pow, "pow", true, false, static_cast<T>(std::pow(a, b)))
KILN_BINARY(Eq, "eq", false, true, a == b)
KILN_BINARY(Ne, "ne", false, true, a != b)
KILN_BINARY(Lt, "lt", false, true, a < b)
KILN_BINARY(Le, "le", false, true, a <= b)
KILN_BINARY(Gt, "gt", false, true, a > b)
KILN_BINARY(Ge, "ge", false, true, a >= b)
KILN_BINARY(LogicalAnd, "logical_and", false, true, (a != T(0)) && (b != T(0)))
KILN_BINARY(LogicalOr, "logical_or", false, true, (a != T(0)) || (b != T(0)))
#undef KILN_BINARY

#define KILN_BINARY_OPS(X) \
  X(Add) X(Sub) X(Mul) X(Div) X(Maximum) X(Minimum) X(Pow) X(Eq) X(Ne) X(Lt) X(Le) X(Gt) X(Ge) \
  X(LogicalAnd) X(LogicalOr)
// clang-format on

// ------------------------------------------------------------------------------------------ reduce
template <class A> KILN_HD constexpr A lowest() {
  if constexpr (std::numeric_limits<A>::has_infinity)
    return -std::numeric_limits<A>::infinity();
  else
    return std::numeric_limits<A>::lowest();
}
template <class A> KILN_HD constexpr A highest() {
  if constexpr (std::numeric_limits<A>::has_infinity)
    return std::numeric_limits<A>::infinity();
  else
    return std::numeric_limits<A>::max();
}
// A reduction folds values of type A (the accumulator) with init() and step(); index ops also track
// the position. Backends choose A (float64 in Reference, compute_t<T> elsewhere).
struct Sum {
  static constexpr const char* name = "sum";
  static constexpr bool index = false;
  template <class A> KILN_HD static A init() { return A(0); }
  template <class A> KILN_HD static A step(A acc, A x) { return acc + x; }
};
struct Prod {
  static constexpr const char* name = "prod";
  static constexpr bool index = false;
  template <class A> KILN_HD static A init() { return A(1); }
  template <class A> KILN_HD static A step(A acc, A x) { return acc * x; }
};
// max/min propagate NaN.
struct Max {
  static constexpr const char* name = "max";
  static constexpr bool index = false;
  template <class A> KILN_HD static A init() { return lowest<A>(); }
  template <class A> KILN_HD static A step(A acc, A x) { return (x > acc || x != x) ? x : acc; }
};
struct Min {
  static constexpr const char* name = "min";
  static constexpr bool index = false;
  template <class A> KILN_HD static A init() { return highest<A>(); }
  template <class A> KILN_HD static A step(A acc, A x) { return (x < acc || x != x) ? x : acc; }
};
// argmax/argmin: the first index of the extreme value (a NaN counts as the extreme), output i64.
struct ArgMax {
  static constexpr const char* name = "argmax";
  static constexpr bool index = true;
  template <class A> KILN_HD static A init() { return lowest<A>(); }
  template <class A> KILN_HD static bool better(A x, A best) { return (x > best || x != x) && best == best; }
};
struct ArgMin {
  static constexpr const char* name = "argmin";
  static constexpr bool index = true;
  template <class A> KILN_HD static A init() { return highest<A>(); }
  template <class A> KILN_HD static bool better(A x, A best) { return (x < best || x != x) && best == best; }
};

#define KILN_REDUCE_OPS(X) X(Sum) X(Prod) X(Max) X(Min)
#define KILN_INDEX_REDUCE_OPS(X) X(ArgMax) X(ArgMin)

}  // namespace kiln::op
#pragma GCC visibility pop
