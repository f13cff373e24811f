#pragma once
// PyTorch's values for tests/optim (make_cases.py), made once per test process.
#include <nlohmann/json.hpp>

#include <kiln/backends/backends.hpp>

#include "common/torch_cases.hpp"

namespace optim_test {

inline const nlohmann::json& cases() {
  static const nlohmann::json j = kiln::test::run_case_script("tests/optim/make_cases.py");
  return j;
}

template <kiln::Backend B> kiln::Tensor<B> tensor(const nlohmann::json& v, kiln::Shape shape, kiln::DType d = kiln::DType::f64) {
  return kiln::Tensor<kiln::Cpu>::from_vector(v.get<std::vector<double>>(), std::move(shape)).to(d).template to<B>();
}

// |a - b| <= rel·|b| + abs, element by element, reporting the first miss.
inline void check_close(const std::vector<double>& a, const std::vector<double>& b, double rel, double abs, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= rel * std::abs(b[i]) + abs)) {
      FAIL_CHECK(what << " [" << i << "]: " << a[i] << " vs " << b[i] << " (rel " << rel << ", abs " << abs << ")");
      return;
    }
}

}  // namespace optim_test
