// Bad input: every op family given wrong shapes, dtypes, axes or indices throws kiln::Error whose
// message names the op and the offending shape/dtype/value. Nothing may crash (run under ASan too).
#include <kiln/core/fused.hpp>
#include "common/kiln_test.hpp"

using namespace kiln;
using Catch::Contains;

// Backends never mix: Tensor<Reference> and Tensor<Cpu> share no operator (a compile-time error).
template <class A, class B>
concept CanAdd = requires(A a, B b) {
  a + b;
};
template <class A, class B>
concept CanMatmul = requires(A a, B b) {
  a.matmul(b);
};
template <class A, class B>
concept CanCat = requires(A a, B b) {
  Tensor<Reference>::cat({a, b});
};
static_assert(CanAdd<Tensor<Reference>, Tensor<Reference>>);
static_assert(!CanAdd<Tensor<Reference>, Tensor<Cpu>>);
static_assert(!CanAdd<Tensor<Cpu>, Tensor<Reference>>);
static_assert(!CanMatmul<Tensor<Reference>, Tensor<Cpu>>);
static_assert(!CanCat<Tensor<Reference>, Tensor<Cpu>>);
static_assert(!std::is_convertible_v<Tensor<Cpu>, Tensor<Reference>>);

TEMPLATE_TEST_CASE("errors: elementwise shapes and dtypes", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  const T a = T::zeros({2, 3}), b = T::zeros({4, 5}), i = T::zeros({2, 3}, DType::i32), bl = T::zeros({2, 3}, DType::boolean);
  CHECK_THROWS_WITH(a.add(b), Contains("add") && Contains("[2, 3]") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(a + b, Contains("add") && Contains("[2, 3]") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(a.mul(T::zeros({3, 2})), Contains("mul") && Contains("cannot broadcast") && Contains("[3, 2]"));
  CHECK_THROWS_WITH(a.lt(T::zeros({2})), Contains("lt") && Contains("[2, 3]") && Contains("[2]"));
  CHECK_THROWS_WITH(a.sub(i), Contains("sub") && Contains("f32") && Contains("i32"));
  CHECK_THROWS_WITH(a.eq(T::zeros({2, 3}, DType::f64)), Contains("eq") && Contains("f32") && Contains("f64"));
  CHECK_THROWS_WITH(T::where(bl, a, i), Contains("where") && Contains("f32") && Contains("i32"));
  CHECK_THROWS_WITH(T::where(a, a, a), Contains("where") && Contains("bool") && Contains("f32"));
  CHECK_THROWS_WITH(T::where(bl, a, b), Contains("where") && Contains("[4, 5]"));
  // int dtype to float-only ops
  CHECK_THROWS_WITH(i.exp(), Contains("exp") && Contains("i32") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(i.sqrt(), Contains("sqrt") && Contains("i32"));
  CHECK_THROWS_WITH(i.gelu(), Contains("gelu") && Contains("i32"));
  CHECK_THROWS_WITH(i.div(i), Contains("div") && Contains("i32"));
  CHECK_THROWS_WITH(i.pow(Scalar(2)), Contains("pow") && Contains("i32"));
  CHECK_THROWS_WITH(i.mean(), Contains("mean") && Contains("i32"));
  CHECK_THROWS_WITH(i.softmax(0), Contains("softmax") && Contains("i32"));
  CHECK_THROWS_WITH(i.log_softmax(1), Contains("log_softmax") && Contains("i32"));
  // bool arithmetic
  CHECK_THROWS_WITH(bl.neg(), Contains("neg") && Contains("bool"));
  CHECK_THROWS_WITH(bl.add(bl), Contains("add") && Contains("bool"));
  CHECK_THROWS_WITH(bl.max(), Contains("max") && Contains("bool"));
  CHECK_THROWS_WITH(bl.argmax(0), Contains("argmax") && Contains("bool"));
  // float-only rng
  T ii = T::zeros({3}, DType::i64);
  CHECK_THROWS_WITH(ii.uniform_(0, 1), Contains("uniform_") && Contains("i64"));
  CHECK_THROWS_WITH(ii.normal_(0, 1), Contains("normal_") && Contains("i64"));
  CHECK_THROWS_WITH(T::rand({2}, DType::i32), Contains("uniform_") && Contains("i32"));
}

TEMPLATE_TEST_CASE("errors: in-place ops", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  T e = T::zeros({1, 3}).expand({4, 3});
  CHECK_THROWS_WITH(e.fill_(1), Contains("fill_") && Contains("expanded") && Contains("[4, 3]"));
  CHECK_THROWS_WITH(e.add_(T::ones({4, 3})), Contains("add") && Contains("expanded") && Contains("[4, 3]"));
  CHECK_THROWS_WITH(e.mul_(Scalar(2)), Contains("mul") && Contains("expanded"));
  CHECK_THROWS_WITH(e.copy_(T::ones({3})), Contains("copy_") && Contains("expanded"));
  CHECK_THROWS_WITH(e.uniform_(0, 1), Contains("uniform_") && Contains("expanded"));
  T x = T::zeros({2, 3});
  CHECK_THROWS_WITH(x.add_(T::ones({3, 3})), Contains("add") && Contains("[2, 3]") && Contains("[3, 3]"));
  CHECK_THROWS_WITH(x.add_(T::ones({2, 2, 3})), Contains("add_") && Contains("[2, 2, 3]"));
  CHECK_THROWS_WITH(x.sub_(T::ones({2, 3}, DType::f64)), Contains("sub_") && Contains("f32") && Contains("f64"));
  CHECK_THROWS_WITH(x.copy_(T::ones({4})), Contains("expand") && Contains("[4]") && Contains("[2, 3]"));
  T ib = T::zeros({2}, DType::boolean);
  CHECK_THROWS_WITH(ib.add_(ib), Contains("add_") && Contains("bool"));
  // nothing was written by the failed ops
  CHECK(to_vector<float>(x) == std::vector<float>(6, 0.f));
}

TEMPLATE_TEST_CASE("errors: views", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  const T x = T::zeros({2, 3, 4});
  CHECK_THROWS_WITH(x.view({5, 5}), Contains("view") && Contains("[2, 3, 4]") && Contains("[5, 5]"));
  CHECK_THROWS_WITH(x.reshape({7, -1}), Contains("reshape") && Contains("[2, 3, 4]") && Contains("[7, -1]"));
  CHECK_THROWS_WITH(x.view({-1, -1}), Contains("view") && Contains("more than one -1"));
  CHECK_THROWS_WITH(x.reshape({-2, 12}), Contains("reshape") && Contains("-2"));
  CHECK_THROWS_WITH(x.transpose(0, 1).view({-1}), Contains("view") && Contains("[3, 2, 4]") && Contains("reshape"));
  CHECK_THROWS_WITH(T::zeros({0, 3}).reshape({0, -1}), Contains("reshape") && Contains("[0, 3]"));
  CHECK_THROWS_WITH(x.permute({0, 1}), Contains("permute") && Contains("[0, 1]") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.permute({0, 1, 1}), Contains("permute") && Contains("repeated") && Contains("[0, 1, 1]"));
  CHECK_THROWS_WITH(x.permute({0, 1, 3}), Contains("permute") && Contains("axis 3") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.transpose(0, 3), Contains("transpose") && Contains("axis 3") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.transpose(-4, 0), Contains("transpose") && Contains("-4"));
  CHECK_THROWS_WITH(x.t(), Contains("t:") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.narrow(1, 2, 2), Contains("narrow") && Contains("start 2 length 2") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.narrow(1, -4, 1), Contains("narrow") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.narrow(1, 0, -1), Contains("narrow") && Contains("length -1"));
  CHECK_THROWS_WITH(x.narrow(5, 0, 1), Contains("narrow") && Contains("axis 5"));
  CHECK_THROWS_WITH(x.select(2, 4), Contains("select") && Contains("index 4") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.select(2, -5), Contains("select") && Contains("index -5"));
  CHECK_THROWS_WITH(T::scalar(1).select(0, 0), Contains("select") && Contains("0-dim"));
  CHECK_THROWS_WITH(x.slice(0, 0, 2, 0), Contains("slice") && Contains("step") && Contains("0"));
  CHECK_THROWS_WITH(x.slice(0, 0, 2, -1), Contains("slice") && Contains("-1"));
  CHECK_THROWS_WITH(x.slice(3, 0, 1), Contains("slice") && Contains("axis 3"));
  CHECK_THROWS_WITH(x.expand({2, 5, 4}), Contains("expand") && Contains("[2, 3, 4]") && Contains("[2, 5, 4]"));
  CHECK_THROWS_WITH(x.expand({3, 4}), Contains("expand") && Contains("[2, 3, 4]") && Contains("[3, 4]"));
  CHECK_THROWS_WITH(T::zeros({1, 3}).expand({-1, 3, 3}), Contains("expand") && Contains("-1"));
  CHECK_THROWS_WITH(T::zeros({1, 3}).expand({-2, 3}), Contains("expand") && Contains("-2"));
  CHECK_THROWS_WITH(x.squeeze(3), Contains("squeeze") && Contains("axis 3"));
  CHECK_THROWS_WITH(x.unsqueeze(4), Contains("unsqueeze") && Contains("axis 4"));
  CHECK_THROWS_WITH(x.unsqueeze(-5), Contains("unsqueeze") && Contains("axis -5"));
  CHECK_THROWS_WITH(x.flatten(2, 1), Contains("flatten") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(x.size(3), Contains("size") && Contains("axis 3") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(T::zeros({2, -1}), Contains("empty") && Contains("[2, -1]"));
  CHECK_THROWS_WITH(T::from_vector(std::vector<float>{1, 2, 3}, {2, 2}),
                    Contains("from_vector") && Contains("[2, 2]") && Contains("3 values"));
  CHECK_THROWS_WITH(T::arange(0.0, 5.0, 0.0), Contains("arange") && Contains("step"));
  CHECK_THROWS_WITH(T::arange(5.0, 0.0, 1.0), Contains("arange") && Contains("[5, 0)"));
  CHECK_THROWS_WITH((T::template from<float>({{1.f, 2.f}, {3.f}})), Contains("ragged"));
}

TEMPLATE_TEST_CASE("errors: reductions, matmul, softmax", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  const T x = T::zeros({2, 3});
  CHECK_THROWS_WITH(x.sum({2}), Contains("sum") && Contains("axis 2") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.mean({-3}), Contains("mean") && Contains("axis -3") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.max({0, 0}), Contains("max") && Contains("repeated") && Contains("[0, 0]"));
  CHECK_THROWS_WITH(x.prod({1, -1}), Contains("prod") && Contains("repeated"));
  CHECK_THROWS_WITH(x.argmax(2), Contains("argmax") && Contains("axis 2") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.argmin(-3), Contains("argmin") && Contains("axis -3"));
  CHECK_THROWS_WITH(T::zeros({2, 0}).max({1}), Contains("max") && Contains("empty axis") && Contains("[2, 0]"));
  CHECK_THROWS_WITH(T::zeros({0}).min(), Contains("min") && Contains("[0]"));
  CHECK_THROWS_WITH(T::zeros({0, 2}).argmax(0), Contains("argmax") && Contains("[0, 2]"));
  CHECK_THROWS_WITH(T::zeros({0}).argmax(), Contains("argmax") && Contains("[0]"));
  CHECK_THROWS_WITH(x.sum_to({3, 3}), Contains("sum_to") && Contains("[3, 3]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.sum_to({1, 2, 3}), Contains("sum_to") && Contains("[1, 2, 3]"));
  // matmul
  CHECK_THROWS_WITH(x.matmul(T::zeros({4, 5})), Contains("matmul") && Contains("[2, 3]") && Contains("[4, 5]") && Contains("3 != 4"));
  CHECK_THROWS_WITH(T::zeros({3}).matmul(T::zeros({4})), Contains("matmul") && Contains("[3]") && Contains("[4]"));
  CHECK_THROWS_WITH(T::zeros({2, 2, 3}).matmul(T::zeros({3, 3, 1})), Contains("matmul") && Contains("[2]") && Contains("[3]"));
  CHECK_THROWS_WITH(T::scalar(1).matmul(x), Contains("matmul") && Contains("rank") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.matmul(T::zeros({3, 2}, DType::f64)), Contains("matmul") && Contains("f32") && Contains("f64"));
  CHECK_THROWS_WITH(T::zeros({2, 3}, DType::i64).matmul(T::zeros({3, 2}, DType::i64)), Contains("matmul") && Contains("i64"));
  CHECK_THROWS_WITH(x.matmul(T()), Contains("matmul") && Contains("undefined"));
  // softmax
  CHECK_THROWS_WITH(x.softmax(2), Contains("softmax") && Contains("axis 2") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.log_softmax(-3), Contains("log_softmax") && Contains("axis -3"));
  CHECK_THROWS_WITH(fused::softmax_backward(x, T::zeros({3, 2}), 0, false), Contains("softmax_backward") && Contains("[3, 2]"));
}

TEMPLATE_TEST_CASE("errors: indexing out of range and wrong index dtypes", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  const T x = T::zeros({2, 3});
  const T i2 = T::from_vector(std::vector<int64_t>{0, 3, 1, 0}, {2, 2});
  CHECK_THROWS_WITH(x.gather(1, i2), Contains("gather") && Contains("[0, 3]") && Contains("size 3") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.gather(1, T::from_vector(std::vector<int64_t>{-1, 0}, {2, 1})), Contains("gather") && Contains("-1"));
  CHECK_THROWS_WITH(x.gather(1, T::zeros({2, 2}, DType::f32)), Contains("gather") && Contains("i32 or i64") && Contains("f32"));
  CHECK_THROWS_WITH(x.gather(1, T::zeros({2}, DType::i64)), Contains("gather") && Contains("rank") && Contains("[2]"));
  CHECK_THROWS_WITH(x.gather(1, T::zeros({3, 1}, DType::i64)), Contains("gather") && Contains("[3, 1]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.gather(2, T::zeros({2, 1}, DType::i64)), Contains("gather") && Contains("axis 2"));
  CHECK_THROWS_WITH(x.index_select(0, T::from_vector(std::vector<int32_t>{0, 2})),
                    Contains("index_select") && Contains("[0, 2]") && Contains("size 2"));
  CHECK_THROWS_WITH(x.index_select(0, T::zeros({1, 1}, DType::i64)), Contains("index_select") && Contains("1-D") && Contains("[1, 1]"));
  CHECK_THROWS_WITH(x.index_select(0, T::zeros({1}, DType::f64)), Contains("index_select") && Contains("f64"));
  CHECK_THROWS_WITH(x.index_select(2, T::zeros({1}, DType::i64)), Contains("index_select") && Contains("axis 2"));
  CHECK_THROWS_WITH(T::scalar(1).index_select(0, T::zeros({1}, DType::i64)), Contains("index_select") && Contains("rank"));
  CHECK_THROWS_WITH(x.scatter_add(1, i2, T::ones({2, 2})), Contains("scatter_add") && Contains("[0, 3]") && Contains("size 3"));
  CHECK_THROWS_WITH(x.scatter_add(1, T::zeros({2, 2}, DType::i64), T::ones({2, 2}, DType::f64)),
                    Contains("scatter_add") && Contains("f64"));
  CHECK_THROWS_WITH(x.scatter_add(1, T::zeros({2, 2}, DType::i64), T::ones({2, 1})),
                    Contains("scatter_add") && Contains("[2, 2]") && Contains("[2, 1]"));
  CHECK_THROWS_WITH(x.scatter_add(1, T::zeros({2}, DType::i64), T::ones({2})), Contains("scatter_add") && Contains("[2]"));
  CHECK_THROWS_WITH(x.index_add(1, T::from_vector(std::vector<int64_t>{0, 5}), T::ones({2, 2})),
                    Contains("index_add") && Contains("[0, 5]"));
  CHECK_THROWS_WITH(x.index_add(1, T::from_vector(std::vector<int64_t>{0, 1}), T::ones({2, 3})),
                    Contains("index_add") && Contains("[2, 3]") && Contains("[2, 2]"));
  CHECK_THROWS_WITH(x.index_add(0, T::zeros({2, 1}, DType::i64), T::ones({2, 3})), Contains("index_add") && Contains("1-D"));
  CHECK_THROWS_WITH(T::scalar(1).index_add(0, T::zeros({1}, DType::i64), T::ones({1})), Contains("index_add") && Contains("rank"));
  CHECK_THROWS_WITH(x.index_add(1, T::from_vector(std::vector<int64_t>{0, 1}), T::ones({2, 2}, DType::f64)),
                    Contains("index_add") && Contains("dtype") && Contains("f64"));
  CHECK_THROWS_WITH(x.index_add(1, T::ones({2}, DType::f32), T::ones({2, 2})), Contains("index_add") && Contains("i32 or i64"));
  CHECK_THROWS_WITH(x.template at<float>({2, 0}), Contains("select") && Contains("index 2"));
  CHECK_THROWS_WITH(x.template at<float>({0}), Contains("at") && Contains("1 indices") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(x.template item<float>(), Contains("item") && Contains("[2, 3]") && Contains("6 elements"));
  CHECK_THROWS_WITH(T::zeros({0}).template item<float>(), Contains("item") && Contains("[0]"));
}

TEMPLATE_TEST_CASE("errors: cat, stack, split, chunk", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  const T a = T::zeros({2, 3}), b = T::zeros({2, 4});
  CHECK_THROWS_WITH(T::cat({a, b}, 0), Contains("cat") && Contains("[2, 4]") && Contains("[2, 3]") && Contains("axis 0"));
  CHECK_THROWS_WITH(T::cat({a, T::zeros({2, 3, 1})}, 0), Contains("cat") && Contains("[2, 3, 1]"));
  CHECK_THROWS_WITH(T::cat({a, T::zeros({2, 3}, DType::i64)}, 0), Contains("cat") && Contains("i64") && Contains("f32"));
  CHECK_THROWS_WITH(T::cat({}, 0), Contains("cat") && Contains("no tensors"));
  CHECK_THROWS_WITH(T::cat({a, a}, 2), Contains("cat") && Contains("axis 2"));
  CHECK_THROWS_WITH(T::cat({T::scalar(1), T::scalar(2)}, 0), Contains("cat") && Contains("rank"));
  CHECK_THROWS_WITH(T::cat({a, T()}, 0), Contains("cat") && Contains("undefined"));
  CHECK_THROWS_WITH(T::stack({a, b}, 0), Contains("stack") && Contains("[2, 4]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(T::stack({a, a}, 3), Contains("stack") && Contains("axis 3"));
  CHECK_THROWS_WITH(T::stack({}, 0), Contains("stack") && Contains("no tensors"));
  CHECK_THROWS_WITH(a.split(std::vector<int64_t>{1, 1}, 1), Contains("split") && Contains("[1, 1]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(a.split(std::vector<int64_t>{4, -1}, 1), Contains("split") && Contains("negative"));
  CHECK_THROWS_WITH(a.split(int64_t{0}, 1), Contains("split") && Contains("0"));
  CHECK_THROWS_WITH(a.split(int64_t{1}, 2), Contains("split") && Contains("axis 2"));
  CHECK_THROWS_WITH(a.chunk(0, 0), Contains("chunk") && Contains("0"));
  CHECK_THROWS_WITH(a.chunk(2, -3), Contains("chunk") && Contains("axis -3"));
}

TEMPLATE_TEST_CASE("errors: undefined tensors", "[errors]", ::kiln::Reference, KILN_TEST_BACKENDS) {
  using T = Tensor<TestType>;
  const T u;
  CHECK_FALSE(u.defined());
  const T x = T::zeros({2});
  CHECK_THROWS_WITH(u.exp(), Contains("exp") && Contains("undefined"));
  CHECK_THROWS_WITH(x.add(u), Contains("add") && Contains("undefined"));
  CHECK_THROWS_WITH(u.sum(), Contains("sum") && Contains("undefined"));
  CHECK_THROWS_WITH(u.mean(), Contains("mean") && Contains("undefined"));
  CHECK_THROWS_WITH(u.argmax(0), Contains("argmax") && Contains("undefined"));
  CHECK_THROWS_WITH(u.clone(), Contains("clone") && Contains("undefined"));
  CHECK_THROWS_WITH(u.contiguous(), Contains("contiguous") && Contains("undefined"));
  CHECK_THROWS_WITH(u.to(DType::f64), Contains("to") && Contains("undefined"));
  CHECK_THROWS_WITH(u.template to<Reference>(), Contains("to<reference>") && Contains("undefined"));
  CHECK_THROWS_WITH(u.template to_vector<float>(), Contains("to_vector") && Contains("undefined"));
  CHECK_THROWS_WITH(u.softmax(0), Contains("softmax") && Contains("undefined"));
  CHECK_THROWS_WITH(u.gather(0, x), Contains("gather") && Contains("undefined"));
  CHECK_THROWS_WITH(x.index_select(0, u), Contains("index_select") && Contains("undefined"));
  CHECK_THROWS_WITH(T::where(u, x, x), Contains("where") && Contains("undefined"));
  T v;
  CHECK_THROWS_WITH(v.fill_(1), Contains("fill_") && Contains("undefined"));
  CHECK_THROWS_WITH(v.uniform_(0, 1), Contains("uniform_") && Contains("undefined"));
  T y = T::zeros({2});
  CHECK_THROWS_WITH(y.copy_(u), Contains("copy_") && Contains("undefined"));
  CHECK_THROWS_WITH(y.add_(u), Contains("add") && Contains("undefined"));
  CHECK_THROWS_WITH(u.matmul(x), Contains("matmul") && Contains("undefined"));
  CHECK_THROWS_WITH(u.view({1}), Contains("view"));
  CHECK_THROWS_WITH(u.reshape({1}), Contains("reshape"));
  CHECK(u.str() == "tensor(undefined)");
}

TEST_CASE("errors: parse_dtype names the valid dtypes", "[errors]") {
  CHECK_THROWS_WITH(parse_dtype("float128"), Contains("parse_dtype") && Contains("float128") && Contains("bf16"));
  CHECK(parse_dtype("bfloat16") == DType::bf16);
}
