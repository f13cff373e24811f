#pragma once
// Shared helpers of the convolution and pooling tests: random problem geometries and inputs laid out
// contiguous or as views (permuted from NHWC, stepped slices), the same values on Reference and B.
#include <string>
#include <vector>

#include <kiln/autograd/var.hpp>
#include <kiln/core/fused_conv.hpp>

#include "common/kiln_test.hpp"

namespace kt {

struct ConvCase {
  int64_t N, C, H, W, O, kh, kw;
  kiln::Conv2dParams p;
  bool bias;
  std::string str() const {
    return fmt::format("x [{}, {}, {}, {}] w [{}, {}, {}, {}] stride ({}, {}) pad ({}, {}) dil ({}, {}) groups {} bias {}", N, C, H, W, O,
                       C / p.groups, kh, kw, p.stride.h, p.stride.w, p.padding.h, p.padding.w, p.dilation.h, p.dilation.w, p.groups, bias);
  }
};

// A random valid conv2d problem: odd sizes, strides, padding, dilation, groups (depthwise included).
inline ConvCase random_conv(Gen& g) {
  ConvCase c{};
  const int64_t groups = g.pick(std::vector<int64_t>{1, 1, 2, 3, -1});  // -1: depthwise
  const int64_t cg = groups == -1 ? 1 : g.integer(1, 3);
  c.p.groups = groups == -1 ? g.integer(2, 5) : groups;
  c.C = cg * c.p.groups;
  c.O = c.p.groups * (groups == -1 ? g.integer(1, 2) : g.integer(1, 3));
  c.N = g.integer(1, 3);
  c.kh = g.integer(1, 4);
  c.kw = g.integer(1, 4);
  c.p.stride = {g.integer(1, 3), g.integer(1, 3)};
  c.p.padding = {g.integer(0, 2), g.integer(0, 2)};
  c.p.dilation = {g.integer(1, 2), g.integer(1, 2)};
  const int64_t eh = c.p.dilation.h * (c.kh - 1) + 1, ew = c.p.dilation.w * (c.kw - 1) + 1;
  c.H = std::max<int64_t>(1, eh - 2 * c.p.padding.h) + g.integer(0, 7);
  c.W = std::max<int64_t>(1, ew - 2 * c.p.padding.w) + g.integer(0, 7);
  c.bias = g.coin(0.7);
  return c;
}

// A tensor of `shape` [N, C, H, W] (or any 4-D shape) laid out as layout 0 contiguous, 1 a permuted
// NHWC base, 2 a stepped slice of a larger base; the same values on Reference and B.
template <kiln::Backend B>
void make4(Gen& g, const Shape& s, kiln::DType d, int layout, RT& ref, kiln::Tensor<B>& out, double lo = -2, double hi = 2) {
  if (layout == 1) {
    const Shape base{s[0], s[2], s[3], s[1]};
    const std::vector<double> v = g.values(kiln::numel(base), d, lo, hi);
    ref = g.tensor_from<Ref>(v, base, d).permute({0, 3, 1, 2});
    out = g.tensor_from<B>(v, base, d).permute({0, 3, 1, 2});
  } else if (layout == 2) {
    const Shape base{s[0], 2 * s[1], s[2] + 1, 2 * s[3]};
    const std::vector<double> v = g.values(kiln::numel(base), d, lo, hi);
    auto view = [&](auto t) { return t.slice(1, 1, 2 * s[1], 2).narrow(2, 1, s[2]).slice(3, 0, 2 * s[3], 2); };
    ref = view(g.tensor_from<Ref>(v, base, d));
    out = view(g.tensor_from<B>(v, base, d));
  } else {
    const std::vector<double> v = g.values(kiln::numel(s), d, lo, hi);
    ref = g.tensor_from<Ref>(v, s, d);
    out = g.tensor_from<B>(v, s, d);
  }
}

// Accumulation bound of a sum of n products whose absolute values sum to `mag`, in compute type u,
// plus the rounding of the stored result: (n + 2) u mag + 2 u_store |want| (in check_close's rtol).
inline std::vector<double> sum_bound(const std::vector<double>& mag, int64_t n, kiln::DType d) {
  std::vector<double> b(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) b[i] = static_cast<double>(n + 2) * u_acc(d) * mag[i];
  return b;
}
inline Tol store_tol(kiln::DType d) { return {2 * u_store(d), 0.0}; }

}  // namespace kt
