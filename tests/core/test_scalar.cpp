// kiln::Scalar's conversions at the edges of the integer range.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include <kiln/core/scalar.hpp>

using kiln::Scalar;

TEST_CASE("Scalar: a double beyond the integers saturates and NaN converts to 0", "[core]") {
  // A plain cast of these is undefined behaviour; -inf (the attention mask's fill) reached it on
  // every forward pass (found by fuzz/fuzz_resume under UBSan).
  // volatile: values the compiler cannot fold (GCC folds a constant's cast as saturating, the CPU does not).
  volatile double inf = std::numeric_limits<double>::infinity(), big = 1e300, nan = std::nan(""), two63 = 0x1p63;
  CHECK(Scalar(-inf).to_int() == INT64_MIN);
  CHECK(Scalar(inf).to_int() == INT64_MAX);
  CHECK(Scalar(big).to_int() == INT64_MAX);
  CHECK(Scalar(-big).to_int() == INT64_MIN);
  CHECK(Scalar(nan).to_int() == 0);
  CHECK(Scalar(two63).to_int() == INT64_MAX);
  CHECK(Scalar(-two63).to_int() == INT64_MIN);
  CHECK(Scalar(inf).to<int64_t>() == INT64_MAX);
  CHECK(Scalar(nan).to<int32_t>() == 0);
  // In range: truncation toward zero, as before; the double itself is untouched.
  CHECK(Scalar(-2.75).to_int() == -2);
  CHECK(Scalar(2.75).to<int32_t>() == 2);
  CHECK(Scalar(0x1p62).to_int() == (int64_t{1} << 62));
  CHECK(std::isinf(Scalar(-inf).to_double()));
  CHECK(Scalar(int64_t{-5}).to<double>() == -5.0);
}
