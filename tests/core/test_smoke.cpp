#include <catch2/catch.hpp>

#include <kiln/backends/backends.hpp>
#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/backends/reference/reference.hpp>

using namespace kiln;

TEMPLATE_TEST_CASE("smoke: matmul of a transposed view", "[core]", KILN_BACKEND_TYPES) {
  const auto a = tensor<TestType>({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  const auto c = a.matmul(a.t());
  CHECK(c.shape() == Shape{2, 2});
  CHECK(to_vector<float>(c) == std::vector<float>{14, 32, 32, 77});
}
