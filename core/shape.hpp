#pragma once
// Shape and stride arithmetic. Strides and offsets are in elements, never bytes.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
// "[2, 3]"
std::string shape_str(const Shape& s);
// Normalises a possibly negative axis into [0, rank); throws naming the op and the shape.
int normalize_axis(int64_t axis, int64_t rank, std::string_view op, const Shape& shape);
// NumPy broadcasting; throws "op: cannot broadcast [..] with [..]".
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

// Where a tensor's elements live inside its storage.
struct Layout {
  Shape shape;
  Strides strides;
  int64_t offset = 0;

  Layout() = default;
  explicit Layout(Shape s) : shape(std::move(s)), strides(contiguous_strides(shape)) {}
  Layout(Shape s, Strides st, int64_t off) : shape(std::move(s)), strides(std::move(st)), offset(off) {}

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return kiln::numel(shape); }
  bool is_contiguous() const;
  // Offset of the element at a row-major linear index.
  int64_t offset_of(int64_t linear) const {
    int64_t off = offset;
    for (int64_t d = rank() - 1; d >= 0; --d) {
      const int64_t n = shape[static_cast<size_t>(d)];
      off += (linear % n) * strides[static_cast<size_t>(d)];
      linear /= n;
    }
    return off;
  }
};

}  // namespace kiln
#pragma GCC visibility pop
