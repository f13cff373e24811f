// einsum (nn/einsum.hpp): values and gradients against torch.einsum (PyTorch 1.13) in float64 on every
// backend for the common forms (matmul, batched and attention-shaped products, transposes, sums, outer
// products, three-operand chains, implicit output), with non-contiguous operands too; a float64
// gradcheck; errors. Tolerance: sums of at most 64 products of N(0, 1) values in float64.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/nn/einsum.hpp>

#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"
#include "loss/cases.hpp"

using namespace kiln;
using json = nlohmann::json;
using Catch::Contains;

namespace {

const json& cases() {
  static const json j = kiln::test::run_case_script("tests/loss/make_einsum_cases.py", "torch");
  return j;
}

template <Backend B> Tensor<B> array(const json& a) { return kiln::test::json_array<B>(a); }

// the same values laid out non-contiguously: a reversed-axes base permuted back
template <Backend B> Tensor<B> strided(const Tensor<B>& t) {
  std::vector<int64_t> rev;
  for (int64_t i = t.dim() - 1; i >= 0; --i) rev.push_back(i);
  return t.permute(rev).contiguous().permute(rev);
}

}  // namespace

TEMPLATE_TEST_CASE("einsum matches torch.einsum (float64, values and gradients)", "[loss][einsum][torch]", KILN_BACKEND_TYPES) {
  using B = TestType;
  const json& cs = cases();
  REQUIRE(cs.size() >= 20);
  for (const json& c : cs) {
    for (bool non_contiguous : {false, true}) {
      const std::string eq = c.at("equation");
      INFO(eq << (non_contiguous ? " (non-contiguous operands)" : ""));
      std::vector<Var<B>> in;
      for (const json& a : c.at("inputs")) in.emplace_back(non_contiguous ? strided(array<B>(a)) : array<B>(a), true);
      const Var<B> y = einsum<B>(eq, in);
      y.backward(array<B>(c.at("g")));
      const kt::Tol tol{1e-12, 1e-12};
      kt::check_close(y.value(), array<B>(c.at("out")), tol, "output");
      for (size_t i = 0; i < in.size(); ++i) kt::check_close(in[i].grad(), array<B>(c.at("grads").at(i)), tol, fmt::format("grad {}", i));
    }
  }
}

TEMPLATE_TEST_CASE("einsum: gradcheck and errors", "[loss][einsum]", KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  Generator g(3);
  const auto r = gradcheck<B>([](const std::vector<Var<B>>& v) { return einsum<B>("bhqd,bhkd->bhqk", v); },
                              {T::randn({2, 2, 3, 4}, DType::f64, &g), T::randn({2, 2, 5, 4}, DType::f64, &g)});
  INFO(r.message);
  CHECK(r.ok);
  const T a = T::zeros({2, 3}), b = T::zeros({4, 5});
  CHECK_THROWS_WITH(einsum<B>("ij,jk->ik", {a, b}), Contains("einsum") && Contains("'j'") && Contains("size 4") && Contains("3 before"));
  CHECK_THROWS_WITH(einsum<B>("ij,jk->ik", {a}), Contains("einsum") && Contains("2 operand(s), got 1"));
  CHECK_THROWS_WITH(einsum<B>("ijk->i", {a}), Contains("einsum") && Contains("'ijk'") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(einsum<B>("ii->i", {T::zeros({3, 3})}), Contains("einsum") && Contains("repeated") && Contains("diagonal"));
  CHECK_THROWS_WITH(einsum<B>("...ij->ij", {a}), Contains("einsum") && Contains("ellipsis"));
  CHECK_THROWS_WITH(einsum<B>("ij->ik", {a}), Contains("einsum") && Contains("'k'") && Contains("no operand"));
  CHECK_THROWS_WITH(einsum<B>("ij->ii", {a}), Contains("einsum") && Contains("'i'") && Contains("repeated"));
  CHECK_THROWS_WITH(einsum<B>("i1->i", {a}), Contains("einsum") && Contains("'1'"));
  CHECK_THROWS_WITH(einsum<B>("ij,jk->ik", {a, T::zeros({3, 2}, DType::f64)}), Contains("einsum") && Contains("f32") && Contains("f64"));
}
