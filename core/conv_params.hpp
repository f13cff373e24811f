#pragma once
// The geometry of 2-D convolution and pooling (core/fused_conv.hpp): plain structs that backends
// receive, so a backend header needs no more than this.
#include <cstdint>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// A (height, width) pair: from one int (both) or {h, w}, as PyTorch's int-or-tuple arguments.
struct Size2 {
  int64_t h = 0, w = 0;
  constexpr Size2() = default;
  constexpr Size2(int64_t v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor)
  constexpr Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  constexpr bool operator==(const Size2&) const = default;
};

// stride, padding (zeros, both sides), dilation, groups of a convolution.
struct Conv2dParams {
  Size2 stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
};

// kernel, stride, padding, dilation of a pooling (avg: dilation 1).
struct Pool2dParams {
  Size2 kernel = 1, stride = 1, padding = 0, dilation = 1;
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg pooling only
};

}  // namespace kiln
#pragma GCC visibility pop
