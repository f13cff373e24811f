#include "kiln/core/dtype.hpp"

#include "kiln/core/error.hpp"

namespace kiln {

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "float32" || n == "float") return DType::f32;
  if (n == "f64" || n == "float64" || n == "double") return DType::f64;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "f16" || n == "float16" || n == "half") return DType::f16;
  if (n == "i32" || n == "int32") return DType::i32;
  if (n == "i64" || n == "int64") return DType::i64;
  if (n == "bool" || n == "boolean") return DType::boolean;
  fail("parse_dtype: unknown dtype '{}' (valid: f32, f64, bf16, f16, i32, i64, bool)", n);
}

}  // namespace kiln
