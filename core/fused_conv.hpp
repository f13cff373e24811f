#pragma once
// Convolution and pooling: one fused backend op each, with a composite default built from Tensor<B>
// ops that every backend gets (see core/fused.hpp for the override pattern). PyTorch semantics:
// NCHW input [N, C, H, W], conv weight [O, C/groups, kh, kw], zero padding, output sizes
//   conv:  Ho = ⌊(H + 2p − d(k−1) − 1) / s⌋ + 1
//   pool:  Ho = ⌊ or ⌈(H + 2p − d(k−1) − 1) / s⌉ + 1, and with ceil_mode the last window must start
//          inside the input or the left padding ((Ho−1)s < H + p, else Ho − 1)
//   conv_transpose: Ho = (H − 1)s − 2p + d(k−1) + output_padding + 1
//
// The composite: im2col by copying the kh·kw strided windows of the padded input into a column buffer
// [N, C, kh, kw, Ho, Wo], then one batched matmul per group; backward col2im as kh·kw strided add_
// into a zero-padded gradient. Pooling: the same windows, reduced with max/argmax or summed.
//
// A backend overrides with static members returning bool (false: declined, the composite runs), e.g.
// for a dtype it does not handle:
//   conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p)
//   conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p)
//   conv2d_backward_weight(M dw, M* db /* or nullptr */, V dy, V x, const Conv2dParams& p)
//   max_pool2d_forward(M y, M idx, V x, const Pool2dParams& p)       idx i64, PyTorch's h·W + w
//   max_pool2d_backward(M dx, V dy, V idx, const Pool2dParams& p)     dx arrives zero-filled
//   avg_pool2d_forward(M y, V x, const Pool2dParams& p)
//   avg_pool2d_backward(M dx, V dy, const Pool2dParams& p)
// Every tensor it receives is contiguous, f32 or f64 (bf16/f16 are computed in f32 here and rounded
// once), 4-D and non-empty (empty problems never reach the override); shapes have been checked.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kiln/core/conv_params.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

namespace fused {

template <class B>
concept HasConv2d = requires(MutView<typename B::Storage> o, MutView<typename B::Storage>* po, View<typename B::Storage> i,
                             const View<typename B::Storage>* pi, const Conv2dParams& p) {
  { B::conv2d_forward(o, i, i, pi, p) } -> std::same_as<bool>;
  { B::conv2d_backward_input(o, i, i, p) } -> std::same_as<bool>;
  { B::conv2d_backward_weight(o, po, i, i, p) } -> std::same_as<bool>;
};
template <class B>
concept HasMaxPool2d = requires(MutView<typename B::Storage> o, View<typename B::Storage> i, const Pool2dParams& p) {
  { B::max_pool2d_forward(o, o, i, p) } -> std::same_as<bool>;
  { B::max_pool2d_backward(o, i, i, p) } -> std::same_as<bool>;
};
template <class B>
concept HasAvgPool2d = requires(MutView<typename B::Storage> o, View<typename B::Storage> i, const Pool2dParams& p) {
  { B::avg_pool2d_forward(o, i, p) } -> std::same_as<bool>;
  { B::avg_pool2d_backward(o, i, p) } -> std::same_as<bool>;
};

namespace detail {

inline int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

inline int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil) {
  const int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;  // floor division
  if (ceil && (o - 1) * s >= in + p) --o;
  return o;
}

inline void check_params(const char* op, const Shape& x, const Conv2dParams& p) {
  KILN_CHECK(p.stride.h >= 1 && p.stride.w >= 1, "{}: stride must be >= 1, got ({}, {}) (input {})", op, p.stride.h, p.stride.w,
             shape_str(x));
  KILN_CHECK(p.padding.h >= 0 && p.padding.w >= 0, "{}: padding must be >= 0, got ({}, {}) (input {})", op, p.padding.h, p.padding.w,
             shape_str(x));
  KILN_CHECK(p.dilation.h >= 1 && p.dilation.w >= 1, "{}: dilation must be >= 1, got ({}, {}) (input {})", op, p.dilation.h, p.dilation.w,
             shape_str(x));
  KILN_CHECK(p.groups >= 1, "{}: groups must be >= 1, got {} (input {})", op, p.groups, shape_str(x));
}

// Checks conv2d(x [N, C, H, W], w [O, C/groups, kh, kw], bias [O]) and returns the output shape.
inline Shape conv2d_shape(const char* op, const Shape& x, const Shape& w, const Shape* bias, const Conv2dParams& p) {
  KILN_CHECK(x.size() == 4, "{}: input must be [N, C, H, W], got {}", op, shape_str(x));
  KILN_CHECK(w.size() == 4, "{}: weight must be [O, C/groups, kh, kw], got {}", op, shape_str(w));
  check_params(op, x, p);
  KILN_CHECK(w[0] % p.groups == 0 && w[0] >= 1, "{}: groups {} must divide the {} output channels (weight {})", op, p.groups, w[0],
             shape_str(w));
  KILN_CHECK(x[1] == w[1] * p.groups, "{}: input {} has {} channels, weight {} expects {} (groups {})", op, shape_str(x), x[1],
             shape_str(w), w[1] * p.groups, p.groups);
  KILN_CHECK(w[2] >= 1 && w[3] >= 1, "{}: empty kernel in weight {}", op, shape_str(w));
  if (bias) KILN_CHECK(*bias == Shape{w[0]}, "{}: bias {} must be [{}] (weight {})", op, shape_str(*bias), w[0], shape_str(w));
  const int64_t eh = p.dilation.h * (w[2] - 1) + 1, ew = p.dilation.w * (w[3] - 1) + 1;
  const int64_t hp = x[2] + 2 * p.padding.h, wp = x[3] + 2 * p.padding.w;
  KILN_CHECK(eh <= hp && ew <= wp, "{}: kernel {}x{} (dilated {}x{}) is larger than the padded input {}x{} (input {}, padding ({}, {}))",
             op, w[2], w[3], eh, ew, hp, wp, shape_str(x), p.padding.h, p.padding.w);
  return {x[0], w[0], conv_out(x[2], w[2], p.stride.h, p.padding.h, p.dilation.h),
          conv_out(x[3], w[3], p.stride.w, p.padding.w, p.dilation.w)};
}

// Checks conv_transpose2d(x [N, Cin, H, W], w [Cin, O/groups, kh, kw]) and returns the output shape.
inline Shape conv_transpose2d_shape(const char* op, const Shape& x, const Shape& w, const Shape* bias, const Conv2dParams& p,
                                    Size2 output_padding) {
  KILN_CHECK(x.size() == 4, "{}: input must be [N, C, H, W], got {}", op, shape_str(x));
  KILN_CHECK(w.size() == 4, "{}: weight must be [C_in, O/groups, kh, kw], got {}", op, shape_str(w));
  check_params(op, x, p);
  KILN_CHECK(w[0] % p.groups == 0 && w[0] >= 1, "{}: groups {} must divide the {} input channels (weight {})", op, p.groups, w[0],
             shape_str(w));
  KILN_CHECK(x[1] == w[0], "{}: input {} has {} channels, weight {} expects {} (groups {})", op, shape_str(x), x[1], shape_str(w), w[0],
             p.groups);
  KILN_CHECK(w[1] >= 1 && w[2] >= 1 && w[3] >= 1, "{}: empty weight {}", op, shape_str(w));
  const int64_t O = w[1] * p.groups;
  if (bias)
    KILN_CHECK(*bias == Shape{O}, "{}: bias {} must be [{}] (weight {}, groups {})", op, shape_str(*bias), O, shape_str(w), p.groups);
  KILN_CHECK(output_padding.h >= 0 && output_padding.w >= 0 && (output_padding.h < p.stride.h || output_padding.h < p.dilation.h) &&
                 (output_padding.w < p.stride.w || output_padding.w < p.dilation.w),
             "{}: output_padding ({}, {}) must be >= 0 and smaller than either stride ({}, {}) or dilation ({}, {})", op, output_padding.h,
             output_padding.w, p.stride.h, p.stride.w, p.dilation.h, p.dilation.w);
  const int64_t ho = (x[2] - 1) * p.stride.h - 2 * p.padding.h + p.dilation.h * (w[2] - 1) + output_padding.h + 1;
  const int64_t wo = (x[3] - 1) * p.stride.w - 2 * p.padding.w + p.dilation.w * (w[3] - 1) + output_padding.w + 1;
  KILN_CHECK(ho >= 1 && wo >= 1, "{}: output size {}x{} is too small (input {}, weight {}, stride ({}, {}), padding ({}, {}))", op, ho, wo,
             shape_str(x), shape_str(w), p.stride.h, p.stride.w, p.padding.h, p.padding.w);
  return {x[0], O, ho, wo};
}

// Checks a pooling of x [N, C, H, W] and returns the output shape.
inline Shape pool2d_shape(const char* op, const Shape& x, const Pool2dParams& p, bool dilation_allowed) {
  KILN_CHECK(x.size() == 4, "{}: input must be [N, C, H, W], got {}", op, shape_str(x));
  KILN_CHECK(p.kernel.h >= 1 && p.kernel.w >= 1, "{}: kernel_size must be >= 1, got ({}, {}) (input {})", op, p.kernel.h, p.kernel.w,
             shape_str(x));
  KILN_CHECK(p.stride.h >= 1 && p.stride.w >= 1, "{}: stride must be >= 1, got ({}, {}) (input {})", op, p.stride.h, p.stride.w,
             shape_str(x));
  KILN_CHECK(p.dilation.h >= 1 && p.dilation.w >= 1, "{}: dilation must be >= 1, got ({}, {})", op, p.dilation.h, p.dilation.w);
  KILN_CHECK(dilation_allowed || (p.dilation.h == 1 && p.dilation.w == 1), "{}: takes no dilation, got ({}, {})", op, p.dilation.h,
             p.dilation.w);
  // PyTorch's rule: at most half the kernel_size itself, whatever the dilation.
  KILN_CHECK(p.padding.h >= 0 && p.padding.w >= 0 && p.padding.h <= p.kernel.h / 2 && p.padding.w <= p.kernel.w / 2,
             "{}: padding ({}, {}) must be >= 0 and at most half of kernel_size ({}, {}) (input {})", op, p.padding.h, p.padding.w,
             p.kernel.h, p.kernel.w, shape_str(x));
  KILN_CHECK(x[1] >= 1 && x[2] >= 1 && x[3] >= 1, "{}: input {} has an empty channel or spatial dim", op, shape_str(x));
  const int64_t ho = pool_out(x[2], p.kernel.h, p.stride.h, p.padding.h, p.dilation.h, p.ceil_mode);
  const int64_t wo = pool_out(x[3], p.kernel.w, p.stride.w, p.padding.w, p.dilation.w, p.ceil_mode);
  KILN_CHECK(ho >= 1 && wo >= 1, "{}: output size {}x{} is too small (input {}, kernel ({}, {}), stride ({}, {}), padding ({}, {}))", op,
             ho, wo, shape_str(x), p.kernel.h, p.kernel.w, p.stride.h, p.stride.w, p.padding.h, p.padding.w);
  return {x[0], x[1], ho, wo};
}

// x [N, C, H, W] placed at (ph, pw) in a [N, C, hp, wp] tensor filled with `fill`.
template <Backend B> Tensor<B> padded(const Tensor<B>& x, int64_t ph, int64_t pw, int64_t hp, int64_t wp, double fill) {
  if (ph == 0 && pw == 0 && hp == x.size(2) && wp == x.size(3)) return x;
  Tensor<B> xp = Tensor<B>::full({x.size(0), x.size(1), hp, wp}, fill, x.dtype());
  xp.narrow(2, ph, x.size(2)).narrow(3, pw, x.size(3)).copy_(x);
  return xp;
}

// The [N, C, Ho, Wo] view of the padded xp that window element (i, j) sees.
template <Backend B> Tensor<B> window(const Tensor<B>& xp, int64_t i, int64_t j, int64_t ho, int64_t wo, Size2 s, Size2 d) {
  return xp.slice(2, i * d.h, i * d.h + (ho - 1) * s.h + 1, s.h).slice(3, j * d.w, j * d.w + (wo - 1) * s.w + 1, s.w);
}

// im2col: [N, C·kh·kw, Ho·Wo] ordered (c, i, j) as the weight's [C/groups, kh, kw].
template <Backend B> Tensor<B> im2col(const Tensor<B>& x, int64_t kh, int64_t kw, int64_t ho, int64_t wo, const Conv2dParams& p) {
  const int64_t N = x.size(0), C = x.size(1);
  const Tensor<B> xp = padded(x, p.padding.h, p.padding.w, x.size(2) + 2 * p.padding.h, x.size(3) + 2 * p.padding.w, 0.0);
  Tensor<B> col = Tensor<B>::empty({N, C, kh, kw, ho, wo}, x.dtype());
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) col.select(2, i).select(2, j).copy_(window(xp, i, j, ho, wo, p.stride, p.dilation));
  return col.reshape({N, C * kh * kw, ho * wo});
}

// The padded extent a pooling reads: the input plus padding, or more where ceil_mode's last window overhangs.
inline int64_t pool_extent(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d) {
  return std::max(in + 2 * p, (out - 1) * s + d * (k - 1) + 1);
}

// The first input row (column) of window o: its start moved past the left padding by whole dilations.
inline int64_t first_tap(int64_t o, int64_t s, int64_t p, int64_t d) {
  int64_t start = o * s - p;
  while (start < 0) start += d;
  return start;
}

// PyTorch's avg_pool2d divisor per output position [Ho, Wo].
inline std::vector<double> avg_divisors(int64_t H, int64_t W, int64_t ho, int64_t wo, const Pool2dParams& p) {
  std::vector<double> div(static_cast<size_t>(ho * wo));
  for (int64_t oh = 0; oh < ho; ++oh)
    for (int64_t ow = 0; ow < wo; ++ow) {
      int64_t hs = oh * p.stride.h - p.padding.h, ws = ow * p.stride.w - p.padding.w;
      int64_t he = std::min(hs + p.kernel.h, H + p.padding.h), we = std::min(ws + p.kernel.w, W + p.padding.w);
      const int64_t pool = (he - hs) * (we - ws);
      hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0), he = std::min(he, H), we = std::min(we, W);
      div[static_cast<size_t>(oh * wo + ow)] = static_cast<double>(p.count_include_pad ? pool : (he - hs) * (we - ws));
    }
  return div;
}

}  // namespace detail

// ------------------------------------------------------------------------------------------ composites
// Composite conv2d forward: y [N, O, Ho, Wo] (bias optional: an undefined tensor).
template <Backend B> Tensor<B> conv2d_composite(const Tensor<B>& x, const Tensor<B>& w, const Tensor<B>& bias, const Conv2dParams& p) {
  const Shape ys = detail::conv2d_shape("conv2d", x.shape(), w.shape(), bias.defined() ? &bias.shape() : nullptr, p);
  if (is_half(x.dtype()))
    return conv2d_composite(x.to(DType::f32), w.to(DType::f32), bias.defined() ? bias.to(DType::f32) : bias, p).to(x.dtype());
  const int64_t N = x.size(0), O = w.size(0), g = p.groups, K = w.size(1) * w.size(2) * w.size(3), L = ys[2] * ys[3];
  if (kiln::numel(ys) == 0) return Tensor<B>::zeros(ys, x.dtype());
  const Tensor<B> col = detail::im2col(x, w.size(2), w.size(3), ys[2], ys[3], p).reshape({N, g, K, L});
  Tensor<B> y = w.reshape({1, g, O / g, K}).matmul(col).reshape(ys);
  if (bias.defined()) y = y.add(bias.reshape({1, O, 1, 1}));
  return y;
}

// Composite gradient of conv2d with respect to its input (of shape xs): col2im of wᵀ dy.
template <Backend B>
Tensor<B> conv2d_backward_input_composite(const Tensor<B>& dy, const Tensor<B>& w, const Shape& xs, const Conv2dParams& p) {
  if (is_half(dy.dtype())) return conv2d_backward_input_composite(dy.to(DType::f32), w.to(DType::f32), xs, p).to(dy.dtype());
  const int64_t N = xs[0], C = xs[1], O = w.size(0), g = p.groups, kh = w.size(2), kw = w.size(3), K = w.size(1) * kh * kw;
  const int64_t ho = dy.size(2), wo = dy.size(3);
  if (kiln::numel(xs) == 0 || dy.numel() == 0) return Tensor<B>::zeros(xs, dy.dtype());
  const Tensor<B> dcol =
      w.reshape({1, g, O / g, K}).transpose(-1, -2).matmul(dy.reshape({N, g, O / g, ho * wo})).reshape({N, C, kh, kw, ho, wo});
  Tensor<B> dxp = Tensor<B>::zeros({N, C, xs[2] + 2 * p.padding.h, xs[3] + 2 * p.padding.w}, dy.dtype());
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) {
      Tensor<B> win = detail::window(dxp, i, j, ho, wo, p.stride, p.dilation);
      win.add_(dcol.select(2, i).select(2, j));
    }
  return dxp.narrow(2, p.padding.h, xs[2]).narrow(3, p.padding.w, xs[3]).contiguous();
}

// Composite gradients of conv2d with respect to its weight (of shape ws) and bias: {dw, db}.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> conv2d_backward_weight_composite(const Tensor<B>& dy, const Tensor<B>& x,
                                                                                      const Shape& ws, const Conv2dParams& p, bool bias) {
  if (is_half(dy.dtype())) {
    auto [dw, db] = conv2d_backward_weight_composite(dy.to(DType::f32), x.to(DType::f32), ws, p, bias);
    return {dw.to(dy.dtype()), bias ? db.to(dy.dtype()) : db};
  }
  const int64_t N = x.size(0), O = ws[0], g = p.groups, K = ws[1] * ws[2] * ws[3], L = dy.size(2) * dy.size(3);
  const Tensor<B> db = bias ? (dy.numel() ? dy.sum({0, 2, 3}) : Tensor<B>::zeros({O}, dy.dtype())) : Tensor<B>();
  if (dy.numel() == 0) return {Tensor<B>::zeros(ws, dy.dtype()), db};
  const Tensor<B> col = detail::im2col(x, ws[2], ws[3], dy.size(2), dy.size(3), p).reshape({N, g, K, L});
  const Tensor<B> dw = dy.reshape({N, g, O / g, L}).matmul(col.transpose(-1, -2)).sum({0}).reshape(ws);
  return {dw, db};
}

// Composite max pooling: {y [N, C, Ho, Wo], indices i64 (h·W + w of the first maximum)}.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> max_pool2d_composite(const Tensor<B>& x, const Pool2dParams& p) {
  const Shape ys = detail::pool2d_shape("max_pool2d", x.shape(), p, true);
  const int64_t N = ys[0], C = ys[1], H = x.size(2), W = x.size(3), ho = ys[2], wo = ys[3], kk = p.kernel.h * p.kernel.w;
  if (N == 0) return {Tensor<B>::empty(ys, x.dtype()), Tensor<B>::empty(ys, DType::i64)};
  const int64_t hp = detail::pool_extent(H, ho, p.kernel.h, p.stride.h, p.padding.h, p.dilation.h);
  const int64_t wp = detail::pool_extent(W, wo, p.kernel.w, p.stride.w, p.padding.w, p.dilation.w);
  const Tensor<B> xp = detail::padded(x, p.padding.h, p.padding.w, hp, wp, -std::numeric_limits<double>::infinity());
  std::vector<Tensor<B>> wins;
  std::vector<int64_t> pos(static_cast<size_t>(ho * wo * kk));
  for (int64_t i = 0; i < p.kernel.h; ++i)
    for (int64_t j = 0; j < p.kernel.w; ++j) {
      wins.push_back(detail::window(xp, i, j, ho, wo, p.stride, p.dilation));
      for (int64_t oh = 0; oh < ho; ++oh)
        for (int64_t ow = 0; ow < wo; ++ow) {
          const int64_t h = oh * p.stride.h - p.padding.h + i * p.dilation.h, w = ow * p.stride.w - p.padding.w + j * p.dilation.w;
          // a padding tap wins only where every tap is −inf: PyTorch then reports the window's first tap
          // in the input (its start moved past the padding by whole dilations)
          const bool in = h >= 0 && h < H && w >= 0 && w < W;
          pos[static_cast<size_t>((oh * wo + ow) * kk + i * p.kernel.w + j)] =
              in ? h * W + w
                 : detail::first_tap(oh, p.stride.h, p.padding.h, p.dilation.h) * W +
                       detail::first_tap(ow, p.stride.w, p.padding.w, p.dilation.w);
        }
    }
  const Tensor<B> vals = Tensor<B>::stack(wins, 4);  // [N, C, Ho, Wo, kh·kw]
  const Tensor<B> arg = vals.argmax(4, true);
  const Tensor<B> idx = Tensor<B>::from_vector(pos, {1, 1, ho, wo, kk}).expand({N, C, ho, wo, kk}).gather(4, arg).squeeze(4);
  return {vals.gather(4, arg).squeeze(4), idx};
}

// Composite gradient of max pooling: dy scattered to the saved indices of each plane.
template <Backend B> Tensor<B> max_pool2d_backward_composite(const Tensor<B>& dy, const Tensor<B>& idx, const Shape& xs) {
  if (is_half(dy.dtype())) return max_pool2d_backward_composite(dy.to(DType::f32), idx, xs).to(dy.dtype());
  const int64_t N = xs[0], C = xs[1], L = dy.size(2) * dy.size(3);
  const Tensor<B> z = Tensor<B>::zeros({N, C, xs[2] * xs[3]}, dy.dtype());
  if (dy.numel() == 0) return z.reshape(xs);
  return z.scatter_add(2, idx.reshape({N, C, L}), dy.reshape({N, C, L})).reshape(xs);
}

// Composite average pooling.
template <Backend B> Tensor<B> avg_pool2d_composite(const Tensor<B>& x, const Pool2dParams& p) {
  const Shape ys = detail::pool2d_shape("avg_pool2d", x.shape(), p, false);
  if (is_half(x.dtype())) return avg_pool2d_composite(x.to(DType::f32), p).to(x.dtype());
  const int64_t H = x.size(2), W = x.size(3), ho = ys[2], wo = ys[3];
  if (ys[0] == 0) return Tensor<B>::empty(ys, x.dtype());
  const Tensor<B> xp = detail::padded(x, p.padding.h, p.padding.w, detail::pool_extent(H, ho, p.kernel.h, p.stride.h, p.padding.h, 1),
                                      detail::pool_extent(W, wo, p.kernel.w, p.stride.w, p.padding.w, 1), 0.0);
  Tensor<B> s = Tensor<B>::zeros(ys, x.dtype());
  for (int64_t i = 0; i < p.kernel.h; ++i)
    for (int64_t j = 0; j < p.kernel.w; ++j) s.add_(detail::window(xp, i, j, ho, wo, p.stride, p.dilation));
  return s.div(Tensor<B>::from_vector(detail::avg_divisors(H, W, ho, wo, p), {ho, wo}).to(x.dtype()));
}

// Composite gradient of average pooling (input shape xs).
template <Backend B> Tensor<B> avg_pool2d_backward_composite(const Tensor<B>& dy, const Shape& xs, const Pool2dParams& p) {
  if (is_half(dy.dtype())) return avg_pool2d_backward_composite(dy.to(DType::f32), xs, p).to(dy.dtype());
  const int64_t H = xs[2], W = xs[3], ho = dy.size(2), wo = dy.size(3);
  if (xs[0] == 0) return Tensor<B>::zeros(xs, dy.dtype());
  const Tensor<B> g = dy.div(Tensor<B>::from_vector(detail::avg_divisors(H, W, ho, wo, p), {ho, wo}).to(dy.dtype()));
  Tensor<B> dxp = Tensor<B>::zeros({xs[0], xs[1], detail::pool_extent(H, ho, p.kernel.h, p.stride.h, p.padding.h, 1),
                                    detail::pool_extent(W, wo, p.kernel.w, p.stride.w, p.padding.w, 1)},
                                   dy.dtype());
  for (int64_t i = 0; i < p.kernel.h; ++i)
    for (int64_t j = 0; j < p.kernel.w; ++j) {
      Tensor<B> win = detail::window(dxp, i, j, ho, wo, p.stride, p.dilation);
      win.add_(g);
    }
  return dxp.narrow(2, p.padding.h, H).narrow(3, p.padding.w, W).contiguous();
}

// ------------------------------------------------------------------------------------------ dispatch
// conv2d: x [N, C, H, W], w [O, C/groups, kh, kw], bias [O] or undefined -> [N, O, Ho, Wo].
template <Backend B> Tensor<B> conv2d(const Tensor<B>& x, const Tensor<B>& w, const Tensor<B>& bias, const Conv2dParams& p) {
  KILN_CHECK(x.defined() && w.defined(), "conv2d: undefined input or weight");
  KILN_CHECK(is_floating(x.dtype()) && w.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
             "conv2d: input {} {}, weight {} {}{} need one float dtype (mixed: under an autocast::Scope)", shape_str(x.shape()), x.dtype(),
             shape_str(w.shape()), w.dtype(), bias.defined() ? fmt::format(", bias {}", bias.dtype()) : std::string());
  const Shape ys = detail::conv2d_shape("conv2d", x.shape(), w.shape(), bias.defined() ? &bias.shape() : nullptr, p);
  if constexpr (HasConv2d<B>) {
    if (is_half(x.dtype())) return conv2d(x.to(DType::f32), w.to(DType::f32), bias.defined() ? bias.to(DType::f32) : bias, p).to(x.dtype());
    if (kiln::numel(ys) > 0 && x.numel() > 0) {
      const Tensor<B> xc = x.contiguous(), wc = w.contiguous(), bc = bias.defined() ? bias.contiguous() : Tensor<B>();
      Tensor<B> y = Tensor<B>::empty(ys, x.dtype());
      const View<typename B::Storage> bv = bc.defined() ? bc.cview() : wc.cview();
      KILN_PROFILED_FLOPS("conv2d_forward",
                          2.0 * static_cast<double>(y.numel()) * static_cast<double>(wc.shape()[1] * wc.shape()[2] * wc.shape()[3]), y, xc,
                          wc, bc)
      if (B::conv2d_forward(y.mview(), xc.cview(), wc.cview(), bc.defined() ? &bv : nullptr, p)) return y;
    }
  }
  return conv2d_composite(x, w, bias, p);
}

// Gradient of conv2d with respect to its input of shape xs.
template <Backend B> Tensor<B> conv2d_backward_input(const Tensor<B>& dy, const Tensor<B>& w, const Shape& xs, const Conv2dParams& p) {
  const Shape ys = detail::conv2d_shape("conv2d_backward_input", xs, w.shape(), nullptr, p);
  KILN_CHECK(dy.shape() == ys && dy.dtype() == w.dtype(), "conv2d_backward_input: dy {} {} does not fit output {} {}",
             shape_str(dy.shape()), dy.dtype(), shape_str(ys), w.dtype());
  if constexpr (HasConv2d<B>) {
    if (is_half(dy.dtype())) return conv2d_backward_input(dy.to(DType::f32), w.to(DType::f32), xs, p).to(dy.dtype());
    if (dy.numel() > 0 && kiln::numel(xs) > 0) {
      const Tensor<B> dyc = dy.contiguous(), wc = w.contiguous();
      Tensor<B> dx = Tensor<B>::empty(xs, dy.dtype());
      KILN_PROFILED_FLOPS("conv2d_backward_input",
                          2.0 * static_cast<double>(dyc.numel()) * static_cast<double>(wc.shape()[1] * wc.shape()[2] * wc.shape()[3]), dx,
                          dyc, wc)
      if (B::conv2d_backward_input(dx.mview(), dyc.cview(), wc.cview(), p)) return dx;
    }
  }
  return conv2d_backward_input_composite(dy, w, xs, p);
}

// Gradients of conv2d with respect to its weight (shape ws) and, when `bias`, its bias: {dw, db}.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> conv2d_backward_weight(const Tensor<B>& dy, const Tensor<B>& x, const Shape& ws,
                                                                            const Conv2dParams& p, bool bias) {
  const Shape ys = detail::conv2d_shape("conv2d_backward_weight", x.shape(), ws, nullptr, p);
  KILN_CHECK(dy.shape() == ys && dy.dtype() == x.dtype(), "conv2d_backward_weight: dy {} {} does not fit output {} {}",
             shape_str(dy.shape()), dy.dtype(), shape_str(ys), x.dtype());
  if constexpr (HasConv2d<B>) {
    if (is_half(dy.dtype())) {
      auto [dw, db] = conv2d_backward_weight(dy.to(DType::f32), x.to(DType::f32), ws, p, bias);
      return {dw.to(dy.dtype()), bias ? db.to(dy.dtype()) : db};
    }
    if (dy.numel() > 0 && x.numel() > 0) {
      const Tensor<B> dyc = dy.contiguous(), xc = x.contiguous();
      Tensor<B> dw = Tensor<B>::empty(ws, dy.dtype()), db = bias ? Tensor<B>::empty({ws[0]}, dy.dtype()) : Tensor<B>();
      MutView<typename B::Storage> dbv = bias ? db.mview() : dw.mview();
      KILN_PROFILED_FLOPS("conv2d_backward_weight", 2.0 * static_cast<double>(dyc.numel()) * static_cast<double>(ws[1] * ws[2] * ws[3]), dw,
                          db, dyc, xc)
      if (B::conv2d_backward_weight(dw.mview(), bias ? &dbv : nullptr, dyc.cview(), xc.cview(), p)) return {dw, db};
    }
  }
  return conv2d_backward_weight_composite(dy, x, ws, p, bias);
}

// conv_transpose2d: x [N, Cin, H, W], w [Cin, O/groups, kh, kw] -> [N, O, Ho, Wo]: the gradient of
// conv2d(·, w) with respect to its input, plus the bias.
template <Backend B>
Tensor<B> conv_transpose2d(const Tensor<B>& x, const Tensor<B>& w, const Tensor<B>& bias, const Conv2dParams& p, Size2 output_padding) {
  KILN_CHECK(x.defined() && w.defined(), "conv_transpose2d: undefined input or weight");
  KILN_CHECK(is_floating(x.dtype()) && w.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
             "conv_transpose2d: input {} {}, weight {} {}{} need one float dtype (mixed: under an autocast::Scope)", shape_str(x.shape()),
             x.dtype(), shape_str(w.shape()), w.dtype(), bias.defined() ? fmt::format(", bias {}", bias.dtype()) : std::string());
  const Shape ys =
      detail::conv_transpose2d_shape("conv_transpose2d", x.shape(), w.shape(), bias.defined() ? &bias.shape() : nullptr, p, output_padding);
  // bf16/f16: computed in f32 with the bias and rounded once (as conv2d), not rounded before the bias.
  if (is_half(x.dtype()))
    return conv_transpose2d(x.to(DType::f32), w.to(DType::f32), bias.defined() ? bias.to(DType::f32) : bias, p, output_padding)
        .to(x.dtype());
  // conv2d(y, w) has x's size, or one more row/column where output_padding >= stride (allowed when it
  // is < dilation): x is then zero-extended, the extra rows reaching nothing.
  const Shape cs = detail::conv2d_shape("conv_transpose2d", ys, w.shape(), nullptr, p);
  Tensor<B> xe = x;
  if (cs != x.shape()) {
    xe = Tensor<B>::zeros(cs, x.dtype());
    xe.narrow(2, 0, x.size(2)).narrow(3, 0, x.size(3)).copy_(x);
  }
  Tensor<B> y = conv2d_backward_input(xe, w, ys, p);
  if (bias.defined()) y = y.add(bias.reshape({1, ys[1], 1, 1}));
  return y;
}

// max_pool2d: {y [N, C, Ho, Wo], indices i64 into each H·W plane}.
template <Backend B> std::pair<Tensor<B>, Tensor<B>> max_pool2d(const Tensor<B>& x, const Pool2dParams& p) {
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "max_pool2d: needs a float tensor, got {} {}", shape_str(x.shape()), x.dtype());
  const Shape ys = detail::pool2d_shape("max_pool2d", x.shape(), p, true);
  if constexpr (HasMaxPool2d<B>) {
    if (is_half(x.dtype())) {
      auto [y, idx] = max_pool2d(x.to(DType::f32), p);
      return {y.to(x.dtype()), idx};
    }
    if (ys[0] > 0) {
      const Tensor<B> xc = x.contiguous();
      Tensor<B> y = Tensor<B>::empty(ys, x.dtype()), idx = Tensor<B>::empty(ys, DType::i64);
      KILN_PROFILED("max_pool2d_forward", y, idx, xc) if (B::max_pool2d_forward(y.mview(), idx.mview(), xc.cview(), p)) return {y, idx};
    }
  }
  return max_pool2d_composite(x, p);
}

// Gradient of max_pool2d from the saved indices; xs is the input's shape.
template <Backend B> Tensor<B> max_pool2d_backward(const Tensor<B>& dy, const Tensor<B>& idx, const Shape& xs, const Pool2dParams& p) {
  const Shape ys = detail::pool2d_shape("max_pool2d_backward", xs, p, true);
  KILN_CHECK(dy.shape() == ys && idx.shape() == ys && idx.dtype() == DType::i64 && is_floating(dy.dtype()),
             "max_pool2d_backward: dy {} {} and indices {} {} must be float and i64 {}", shape_str(dy.shape()), dy.dtype(),
             shape_str(idx.shape()), idx.dtype(), shape_str(ys));
  if constexpr (HasMaxPool2d<B>) {
    if (is_half(dy.dtype())) return max_pool2d_backward(dy.to(DType::f32), idx, xs, p).to(dy.dtype());
    if (dy.numel() > 0) {
      const Tensor<B> dyc = dy.contiguous(), ic = idx.contiguous();
      Tensor<B> dx = Tensor<B>::zeros(xs, dy.dtype());
      KILN_PROFILED("max_pool2d_backward", dx, dyc, ic) if (B::max_pool2d_backward(dx.mview(), dyc.cview(), ic.cview(), p)) return dx;
    }
  }
  return max_pool2d_backward_composite(dy, idx, xs);
}

// avg_pool2d (no dilation, as PyTorch's).
template <Backend B> Tensor<B> avg_pool2d(const Tensor<B>& x, const Pool2dParams& p) {
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "avg_pool2d: needs a float tensor, got {} {}", shape_str(x.shape()), x.dtype());
  const Shape ys = detail::pool2d_shape("avg_pool2d", x.shape(), p, false);
  if constexpr (HasAvgPool2d<B>) {
    if (is_half(x.dtype())) return avg_pool2d(x.to(DType::f32), p).to(x.dtype());
    if (ys[0] > 0) {
      const Tensor<B> xc = x.contiguous();
      Tensor<B> y = Tensor<B>::empty(ys, x.dtype());
      KILN_PROFILED("avg_pool2d_forward", y, xc) if (B::avg_pool2d_forward(y.mview(), xc.cview(), p)) return y;
    }
  }
  return avg_pool2d_composite(x, p);
}

// Gradient of avg_pool2d; xs is the input's shape.
template <Backend B> Tensor<B> avg_pool2d_backward(const Tensor<B>& dy, const Shape& xs, const Pool2dParams& p) {
  const Shape ys = detail::pool2d_shape("avg_pool2d_backward", xs, p, false);
  KILN_CHECK(dy.shape() == ys && is_floating(dy.dtype()), "avg_pool2d_backward: dy {} {} must be float {}", shape_str(dy.shape()),
             dy.dtype(), shape_str(ys));
  if constexpr (HasAvgPool2d<B>) {
    if (is_half(dy.dtype())) return avg_pool2d_backward(dy.to(DType::f32), xs, p).to(dy.dtype());
    if (dy.numel() > 0) {
      const Tensor<B> dyc = dy.contiguous();
      Tensor<B> dx = Tensor<B>::empty(xs, dy.dtype());
      KILN_PROFILED("avg_pool2d_backward", dx, dyc) if (B::avg_pool2d_backward(dx.mview(), dyc.cview(), p)) return dx;
    }
  }
  return avg_pool2d_backward_composite(dy, xs, p);
}

// ------------------------------------------------------------------------------------------ adaptive
// adaptive_avg_pool2d: output cell (i, j) averages rows [⌊iH/Ho⌋, ⌈(i+1)H/Ho⌉) and the same for
// columns (PyTorch's windows). Separable: columns first, then rows. When Ho divides H and Wo divides
// W it is avg_pool2d with kernel = stride = H/Ho (the backend's fused pooling).
namespace detail {
inline std::pair<int64_t, int64_t> adaptive_window(int64_t i, int64_t in, int64_t out) {
  return {(i * in) / out, ((i + 1) * in + out - 1) / out};
}
inline void adaptive_check(const char* op, const Shape& x, Size2 out) {
  KILN_CHECK(x.size() == 4, "{}: input must be [N, C, H, W], got {}", op, shape_str(x));
  KILN_CHECK(x[1] >= 1 && x[2] >= 1 && x[3] >= 1, "{}: input {} has an empty channel or spatial dim", op, shape_str(x));
  KILN_CHECK(out.h >= 1 && out.w >= 1, "{}: output_size must be >= 1, got ({}, {})", op, out.h, out.w);
}
// Mean over `axis` of each adaptive window, concatenated.
template <Backend B> Tensor<B> adaptive_mean(const Tensor<B>& x, int axis, int64_t out) {
  const int64_t in = x.size(axis);
  std::vector<Tensor<B>> parts;
  for (int64_t i = 0; i < out; ++i) {
    const auto [s, e] = adaptive_window(i, in, out);
    parts.push_back(x.narrow(axis, s, e - s).mean({axis}, true));
  }
  return Tensor<B>::cat(parts, axis);
}
template <Backend B> Tensor<B> adaptive_mean_backward(const Tensor<B>& dy, int axis, int64_t in) {
  Shape s = dy.shape();
  const int64_t out = s[static_cast<size_t>(axis)];
  s[static_cast<size_t>(axis)] = in;
  Tensor<B> dx = Tensor<B>::zeros(s, dy.dtype());
  for (int64_t i = 0; i < out; ++i) {
    const auto [a, e] = adaptive_window(i, in, out);
    Tensor<B> part = dx.narrow(axis, a, e - a);
    part.add_(dy.narrow(axis, i, 1).div(static_cast<double>(e - a)));
  }
  return dx;
}
}  // namespace detail

template <Backend B> Tensor<B> adaptive_avg_pool2d(const Tensor<B>& x, Size2 out) {
  KILN_CHECK(x.defined() && is_floating(x.dtype()), "adaptive_avg_pool2d: needs a float tensor, got {} {}", shape_str(x.shape()),
             x.dtype());
  detail::adaptive_check("adaptive_avg_pool2d", x.shape(), out);
  if (x.size(2) % out.h == 0 && x.size(3) % out.w == 0) {
    const Size2 k{x.size(2) / out.h, x.size(3) / out.w};
    return avg_pool2d(x, Pool2dParams{.kernel = k, .stride = k});
  }
  if (is_half(x.dtype())) return adaptive_avg_pool2d(x.to(DType::f32), out).to(x.dtype());
  if (x.size(0) == 0) return Tensor<B>::empty({0, x.size(1), out.h, out.w}, x.dtype());
  return detail::adaptive_mean(detail::adaptive_mean(x, 3, out.w), 2, out.h);
}

template <Backend B> Tensor<B> adaptive_avg_pool2d_backward(const Tensor<B>& dy, const Shape& xs) {
  KILN_CHECK(dy.defined() && dy.dim() == 4, "adaptive_avg_pool2d_backward: dy must be [N, C, Ho, Wo]");
  detail::adaptive_check("adaptive_avg_pool2d_backward", xs, Size2{dy.size(2), dy.size(3)});
  KILN_CHECK(dy.size(0) == xs[0] && dy.size(1) == xs[1] && is_floating(dy.dtype()),
             "adaptive_avg_pool2d_backward: dy {} {} does not fit input {}", shape_str(dy.shape()), dy.dtype(), shape_str(xs));
  const Size2 out{dy.size(2), dy.size(3)};
  if (xs[2] % out.h == 0 && xs[3] % out.w == 0) {
    const Size2 k{xs[2] / out.h, xs[3] / out.w};
    return avg_pool2d_backward(dy, xs, Pool2dParams{.kernel = k, .stride = k});
  }
  if (is_half(dy.dtype())) return adaptive_avg_pool2d_backward(dy.to(DType::f32), xs).to(dy.dtype());
  if (xs[0] == 0) return Tensor<B>::zeros(xs, dy.dtype());
  return detail::adaptive_mean_backward(detail::adaptive_mean_backward(dy, 2, xs[2]), 3, xs[3]);
}

}  // namespace fused
}  // namespace kiln
#pragma GCC visibility pop
