// PyTorch parity: runs tests/torch/make_cases.py (PyTorch 1.13 + NumPy, fixed seed) at test time,
// then checks kiln's Reference and every test backend against PyTorch's outputs case by case.
// Without Python + torch (common/torch_cases.hpp) the test FAILS (it never skips silently).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "common/kiln_test.hpp"
#include "common/torch_cases.hpp"

using namespace kiln;
using namespace kt;
using json = nlohmann::json;

namespace {

const json& cases() {
  static const json j = kiln::test::run_case_script("tests/torch/make_cases.py", "torch, numpy");
  return j;
}

double num(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    FAIL("bad number " << s);
  }
  return v.get<double>();
}

Shape shape_of(const json& a) { return a.at("shape").get<Shape>(); }

// An array from the JSON on backend B: the values are exact in their dtype, so building them in f64
// and casting is lossless.
template <Backend B> Tensor<B> array(const json& a) {
  std::vector<double> v;
  for (const auto& x : a.at("data")) v.push_back(num(x));
  return Tensor<B>::from_vector(v, shape_of(a)).to(parse_dtype(a.at("dtype").get<std::string>()));
}

template <Backend B> Tensor<B> unary(const std::string& op, const Tensor<B>& x) {
  static const std::map<std::string, std::function<Tensor<B>(const Tensor<B>&)>> m{
      {"neg", [](const Tensor<B>& t) { return t.neg(); }},
      {"abs", [](const Tensor<B>& t) { return t.abs(); }},
      {"square", [](const Tensor<B>& t) { return t.square(); }},
      {"sign", [](const Tensor<B>& t) { return t.sign(); }},
      {"exp", [](const Tensor<B>& t) { return t.exp(); }},
      {"log", [](const Tensor<B>& t) { return t.log(); }},
      {"log1p", [](const Tensor<B>& t) { return t.log1p(); }},
      {"expm1", [](const Tensor<B>& t) { return t.expm1(); }},
      {"sqrt", [](const Tensor<B>& t) { return t.sqrt(); }},
      {"rsqrt", [](const Tensor<B>& t) { return t.rsqrt(); }},
      {"reciprocal", [](const Tensor<B>& t) { return t.reciprocal(); }},
      {"sin", [](const Tensor<B>& t) { return t.sin(); }},
      {"cos", [](const Tensor<B>& t) { return t.cos(); }},
      {"tanh", [](const Tensor<B>& t) { return t.tanh(); }},
      {"sigmoid", [](const Tensor<B>& t) { return t.sigmoid(); }},
      {"relu", [](const Tensor<B>& t) { return t.relu(); }},
      {"silu", [](const Tensor<B>& t) { return t.silu(); }},
      {"gelu", [](const Tensor<B>& t) { return t.gelu(false); }},
      {"gelu_tanh", [](const Tensor<B>& t) { return t.gelu(true); }},
  };
  const auto it = m.find(op);
  return it == m.end() ? Tensor<B>() : it->second(x);
}

template <Backend B> Tensor<B> binary(const std::string& op, const Tensor<B>& a, const Tensor<B>& b) {
  if (op == "add") return a.add(b);
  if (op == "sub") return a.sub(b);
  if (op == "mul") return a.mul(b);
  if (op == "div") return a.div(b);
  if (op == "maximum") return a.maximum(b);
  if (op == "minimum") return a.minimum(b);
  if (op == "pow") return a.pow(b);
  if (op == "eq") return a.eq(b);
  if (op == "ne") return a.ne(b);
  if (op == "lt") return a.lt(b);
  if (op == "le") return a.le(b);
  if (op == "gt") return a.gt(b);
  if (op == "ge") return a.ge(b);
  if (op == "logical_and") return a.logical_and(b);
  if (op == "logical_or") return a.logical_or(b);
  return {};
}

template <Backend B> Tensor<B> run_case(const json& c) {
  const std::string op = c.at("op");
  const json& args = c.at("args");
  std::vector<Tensor<B>> in;
  for (const auto& a : c.at("inputs")) in.push_back(array<B>(a));
  if (auto u = unary<B>(op, in[0]); u.defined()) return u;
  if (in.size() == 2 && op != "matmul" && op != "matmul_tt") return binary<B>(op, in[0], in[1]);
  if (op == "sum") return in[0].sum(args.at("axes").get<std::vector<int64_t>>(), args.at("keepdim").get<bool>());
  if (op == "mean") return in[0].mean(args.at("axes").get<std::vector<int64_t>>(), args.at("keepdim").get<bool>());
  if (op == "prod") return in[0].prod(args.at("axes").get<std::vector<int64_t>>(), args.at("keepdim").get<bool>());
  if (op == "max") return in[0].max(args.at("axes").get<std::vector<int64_t>>(), args.at("keepdim").get<bool>());
  if (op == "min") return in[0].min(args.at("axes").get<std::vector<int64_t>>(), args.at("keepdim").get<bool>());
  if (op == "argmax") return in[0].argmax(args.at("axis").get<int64_t>(), args.at("keepdim").get<bool>());
  if (op == "argmin") return in[0].argmin(args.at("axis").get<int64_t>(), args.at("keepdim").get<bool>());
  if (op == "matmul") return in[0].matmul(in[1]);
  if (op == "matmul_tt") return in[0].t().matmul(in[1].t());
  if (op == "softmax") return in[0].softmax(args.at("axis").get<int64_t>());
  if (op == "log_softmax") return in[0].log_softmax(args.at("axis").get<int64_t>());
  if (op == "cast") return in[0].to(parse_dtype(args.at("dtype").get<std::string>()));
  FAIL("make_cases.py produced an op this test does not know: " << op);
  return {};
}

template <Backend B> void check_all(const char* family_prefix) {
  const json& all = cases();
  int n = 0;
  for (const auto& c : all.at("cases")) {
    const std::string name = c.at("name");
    if (name.rfind(family_prefix, 0) != 0 && std::string(family_prefix) != "*") continue;
    ++n;
    const RT want = array<Ref>(c.at("output"));
    const Tensor<B> got = run_case<B>(c);
    check_close(got, want, Tol{c.at("rtol").get<double>(), c.at("atol").get<double>()},
                fmt::format("PyTorch {} case '{}' on {}", all.at("torch").get<std::string>(), name, B::name));
  }
  CHECK(n > 0);
}

}  // namespace

// One test case for all backends, so the script (about 2 s, mostly `import torch`) runs once.
template <Backend... Bs> void check_backends() { (check_all<Bs>("*"), ...); }

TEST_CASE("torch parity: every case from make_cases.py on Reference and Cpu", "[torch]") {
  check_backends<::kiln::Reference, ::kiln::Cpu>();
}

#if defined(KILN_HAVE_CUDA_BACKEND)
// Named for Cuda: skipped where no GPU is usable (tests/catch_main.cpp).
TEST_CASE("torch parity: every case from make_cases.py on Cuda", "[torch][cuda]") { check_backends<::kiln::Cuda>(); }
#endif
