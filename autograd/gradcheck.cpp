// gradcheck: analytic (backward) vs central-difference gradients in float64. See gradcheck.hpp.
#include "kiln/autograd/gradcheck.hpp"

#include <cmath>

namespace kiln {

namespace {
std::string index_str(int64_t linear, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = linear % shape[d];
    linear /= shape[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}
}  // namespace

template <Backend B> GradcheckResult<B> gradcheck(const std::function<Var<B>(const std::vector<Var<B>>&)>& f,
                                                  const std::vector<Tensor<B>>& inputs, double eps, double atol, double rtol) {
  using T = Tensor<B>;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].defined(), "gradcheck: input {} is undefined", i);
    KILN_CHECK(!is_floating(inputs[i].dtype()) || inputs[i].dtype() == DType::f64,
               "gradcheck: input {} (shape {}) is {}; floating inputs must be f64", i, shape_str(inputs[i].shape()), inputs[i].dtype());
  }
  auto is_diff = [&](size_t i) { return is_floating(inputs[i].dtype()); };

  // ---- analytic: out.backward(r) is the gradient of L = sum(out * r)
  std::vector<Var<B>> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) leaves.emplace_back(inputs[i], is_diff(i));
  const Var<B> out = f(leaves);
  KILN_CHECK(out.defined() && out.dtype() == DType::f64, "gradcheck: f must return an f64 Var, got {}",
             out.defined() ? fmt::format("{}", out.dtype()) : std::string("an undefined Var"));
  Generator gen(0x6b696c6e);  // "kiln"
  const T r = T::uniform(out.shape(), -1.0, 1.0, DType::f64, &gen);
  if (out.requires_grad()) out.backward(r);

  GradcheckResult<B> res;
  int failures = 0;
  auto fail_with = [&](std::string msg) {
    if (failures++ == 0) res.message = std::move(msg);
    res.ok = false;
  };
  auto loss = [&](std::vector<Var<B>>& xs) {
    NoGrad ng;
    const Var<B> o = f(xs);
    KILN_CHECK(o.shape() == out.shape(), "gradcheck: f's output shape changed from {} to {}", shape_str(out.shape()), shape_str(o.shape()));
    return o.value().mul(r).sum().template item<double>();
  };

  // ---- numeric, element by element
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_diff(i)) {
      if (leaves[i].grad().defined()) fail_with(fmt::format("gradcheck: input {} is not floating but got a gradient", i));
      continue;
    }
    const Shape& shape = inputs[i].shape();
    const T g = leaves[i].grad();
    if (g.defined() && (g.shape() != shape || g.dtype() != DType::f64)) {
      fail_with(fmt::format("gradcheck: input {} of shape {} got a gradient of shape {} {}", i, shape_str(shape), shape_str(g.shape()),
                            g.dtype()));
      continue;
    }
    const std::vector<double> analytic =
        g.defined() ? g.template to_vector<double>() : std::vector<double>(static_cast<size_t>(inputs[i].numel()), 0.0);
    std::vector<double> x = inputs[i].template to_vector<double>();
    std::vector<Var<B>> xs = leaves;
    for (size_t e = 0; e < x.size(); ++e) {
      const double x0 = x[e];
      x[e] = x0 + eps;
      xs[i] = Var<B>(T::from_vector(x, shape));
      const double lp = loss(xs);
      x[e] = x0 - eps;
      xs[i] = Var<B>(T::from_vector(x, shape));
      const double lm = loss(xs);
      x[e] = x0;
      const double numeric = (lp - lm) / (2 * eps);
      const double a = analytic[e];
      const double err = std::abs(a - numeric);
      const double rel = err / std::max(std::abs(numeric), 1e-12);
      res.max_abs_err = std::max(res.max_abs_err, err);
      if (err > atol) res.max_rel_err = std::max(res.max_rel_err, rel);
      if (!(err <= atol + rtol * std::abs(numeric)))  // also catches NaN
        fail_with(fmt::format("gradcheck: input {} (shape {}) element {}: analytic {:.10g} vs numeric {:.10g} (abs err {:.3g}){}", i,
                              shape_str(shape), index_str(static_cast<int64_t>(e), shape), a, numeric, err,
                              g.defined() ? "" : " [backward gave no gradient]"));
    }
  }
  if (failures > 1) res.message += fmt::format(" (and {} more mismatches)", failures - 1);
  return res;
}

#define KILN_GRADCHECK_INST(B)                                                                                                      \
  template GradcheckResult<B> gradcheck<B>(const std::function<Var<B>(const std::vector<Var<B>>&)>&, const std::vector<Tensor<B>>&, \
                                           double, double, double);
KILN_FOR_EACH_BACKEND(KILN_GRADCHECK_INST)
#undef KILN_GRADCHECK_INST

}  // namespace kiln
