#pragma once
// Shared helpers for the autograd tests: seeded f64 inputs and a gradcheck assertion.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>

namespace kiln::test {

template <Backend B> Tensor<B> randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return Tensor<B>::randn(s, DType::f64, &g);
}
template <Backend B> Tensor<B> uniform(const Shape& s, double lo, double hi, uint64_t seed) {
  Generator g(seed);
  return Tensor<B>::uniform(s, lo, hi, DType::f64, &g);
}
template <Backend B> Tensor<B> f64(const std::vector<double>& v, const Shape& s) { return Tensor<B>::from_vector(v, s); }
template <Backend B> Tensor<B> i64(const std::vector<int64_t>& v, const Shape& s) { return Tensor<B>::from_vector(v, s); }

template <Backend B> using Fn = std::function<Var<B>(const std::vector<Var<B>>&)>;

// One gradcheck, reported with a label; returns ok so callers can count.
template <Backend B> bool check_grad(const std::string& what, const Fn<B>& f, const std::vector<Tensor<B>>& inputs) {
  const GradcheckResult<B> r = gradcheck<B>(f, inputs);
  INFO(what << ": " << r.message << " (max abs err " << r.max_abs_err << ")");
  CHECK(r.ok);
  return r.ok;
}

// Element-wise comparison of a tensor with expected values.
template <Backend B> void check_values(const Tensor<B>& t, const std::vector<double>& want, double tol = 1e-12) {
  REQUIRE(t.defined());
  const std::vector<double> got = t.template to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).margin(tol));
  }
}

}  // namespace kiln::test
