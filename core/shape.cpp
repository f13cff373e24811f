#include "kiln/core/shape.hpp"

#include <algorithm>

namespace kiln {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int normalize_axis(int64_t axis, int64_t rank, std::string_view op, const Shape& shape) {
  const int64_t lo = rank == 0 ? -1 : -rank, hi = rank == 0 ? 0 : rank - 1;
  KILN_CHECK(axis >= lo && axis <= hi, "{}: axis {} out of range [{}, {}] for shape {}", op, axis, lo, hi, shape_str(shape));
  return static_cast<int>(axis < 0 ? axis + std::max<int64_t>(rank, 1) : axis);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, "{}: cannot broadcast {} with {}", op, shape_str(a), shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool Layout::is_contiguous() const {
  if (numel() == 0) return true;  // no elements: any strides describe the same (empty) memory
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

}  // namespace kiln
