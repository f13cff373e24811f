#pragma once
// Finite-difference check of a module's parameter gradients (float64): for every parameter (and the
// inputs given), perturb sampled elements by ±eps in place, recompute the loss, compare with backward.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include <kiln/autograd/var.hpp>

namespace kiln::test {

template <Backend B> void check_param_grads(const std::vector<std::pair<std::string, Var<B>>>& params,
                                            const std::function<Var<B>()>& loss_fn, double eps = 1e-6, double tol = 1e-6,
                                            int max_elems = 24, bool require_nonzero = true) {
  for (auto [n, p] : params) p.zero_grad();
  loss_fn().backward();
  for (auto& [name, p] : params) {
    INFO("parameter " << name);
    REQUIRE(p.dtype() == DType::f64);
    REQUIRE(p.grad().defined());
    const std::vector<double> g = to_vector<double>(p.grad());
    if (require_nonzero) {
      double s = 0;
      for (double x : g) s += std::abs(x);
      CHECK(s > 0);
    }
    Tensor<B> flat = p.value().reshape({-1});
    const int64_t n = flat.numel();
    const int64_t stride = std::max<int64_t>(1, n / max_elems);
    for (int64_t i = 0; i < n; i += stride) {
      NoGrad ng;
      const double x0 = flat.template at<double>({i});
      Tensor<B> e = flat.narrow(0, i, 1);
      e.fill_(x0 + eps);
      const double lp = item<double>(loss_fn().value());
      e.fill_(x0 - eps);
      const double lm = item<double>(loss_fn().value());
      e.fill_(x0);
      const double num = (lp - lm) / (2 * eps);
      INFO("element " << i << " analytic " << g[static_cast<size_t>(i)] << " numeric " << num);
      CHECK(std::abs(num - g[static_cast<size_t>(i)]) <= tol * (1 + std::abs(num)));
    }
  }
}

}  // namespace kiln::test
