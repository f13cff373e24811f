#pragma once
// The JSON arrays of tests/loss/make_*cases.py as tensors: {"shape", "data"} row-major float64 ("inf",
// "-inf", "nan" as strings), i64 when "dtype" says so.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kiln/core/tensor.hpp>

namespace kiln::test {

template <Backend B> Tensor<B> json_array(const nlohmann::json& a) {
  std::vector<double> data;
  for (const nlohmann::json& v : a.at("data")) data.push_back(v.is_string() ? std::stod(v.get<std::string>()) : v.get<double>());
  const Tensor<B> t = Tensor<B>::from_vector(data, a.at("shape").get<Shape>());
  return a.value("dtype", std::string("f64")) == "i64" ? t.to(DType::i64) : t;
}

}  // namespace kiln::test
