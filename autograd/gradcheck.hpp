#pragma once
// gradcheck: compares the analytic gradients of f (backward) with central differences, in float64.
//
//   auto r = gradcheck<B>([](const std::vector<Var<B>>& v) { return v[0].matmul(v[1]).tanh(); },
//                         {Tensor<B>::randn({3, 4}, DType::f64), Tensor<B>::randn({4, 2}, DType::f64)});
//   REQUIRE(r.ok);  // else r.message names the input, the element, analytic vs numeric
//
// Every floating input must be f64 (kiln::Error otherwise); integer/bool inputs (indices, masks) are
// passed through as constants. Floating inputs become leaf Vars that require grad, keeping their
// layout (so transposed or sliced inputs exercise strided paths). f's output is reduced to a scalar
// with a fixed random projection, L = sum(f(x) * r) with r from a seeded generator, so every output
// element matters. For each floating input and each element, the numeric derivative
// (L(x + eps) - L(x - eps)) / (2 eps) must match the analytic one within atol + rtol * |numeric|.
// An input that backward never reached (undefined grad) counts as a zero gradient, which the numeric
// derivative must then confirm; a defined gradient must have the input's shape and dtype.
#include <functional>
#include <string>
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

template <Backend B> struct GradcheckResult {
  bool ok = true;
  std::string message;  // empty when ok; else the first mismatch (and the number of mismatches)
  double max_abs_err = 0;
  double max_rel_err = 0;
};

template <Backend B> KILN_API GradcheckResult<B> gradcheck(const std::function<Var<B>(const std::vector<Var<B>>&)>& f,
                                                           const std::vector<Tensor<B>>& inputs, double eps = 1e-6, double atol = 1e-5,
                                                           double rtol = 1e-3);

#define KILN_GRADCHECK_EXTERN(B)                                                                                                           \
  extern template GradcheckResult<B> gradcheck<B>(const std::function<Var<B>(const std::vector<Var<B>>&)>&, const std::vector<Tensor<B>>&, \
                                                  double, double, double);
KILN_FOR_EACH_BACKEND(KILN_GRADCHECK_EXTERN)
#undef KILN_GRADCHECK_EXTERN

}  // namespace kiln
#pragma GCC visibility pop
