#include "kiln/nn/upsample.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::nn {

namespace {

void check_options(const InterpolateOptions& o, const char* op) {
  KILN_CHECK(o.size.has_value() != o.scale_factor.has_value(), "{}: give exactly one of size and scale_factor (got {})", op,
             o.size ? "both" : "neither");
  if (o.size) KILN_CHECK(o.size->h > 0 && o.size->w > 0, "{}: size must be positive, got ({}, {})", op, o.size->h, o.size->w);
  if (o.scale_factor)
    KILN_CHECK(o.scale_factor->h > 0 && o.scale_factor->w > 0 && std::isfinite(o.scale_factor->h) && std::isfinite(o.scale_factor->w),
               "{}: scale_factor must be positive and finite, got ({}, {})", op, o.scale_factor->h, o.scale_factor->w);
  KILN_CHECK(o.mode == InterpolateMode::bilinear || !o.align_corners.has_value(),
             "{}: align_corners can only be set with the interpolating modes (bilinear), not nearest", op);
  KILN_CHECK(o.mode == InterpolateMode::nearest || o.mode == InterpolateMode::bilinear, "{}: invalid mode {}", op,
             static_cast<int>(o.mode));
}

// PyTorch's compute_scales_value: 1/scale_factor when one was given, else in/out, in T.
template <class T> T scale_value(std::optional<double> scale, int64_t in, int64_t out) {
  return scale ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / static_cast<T>(out);
}

// nearest: PyTorch's nearest_idx (float arithmetic)
std::vector<int64_t> nearest_indices(int64_t in, int64_t out, std::optional<double> scale) {
  std::vector<int64_t> idx(static_cast<size_t>(out));
  const float s = scale_value<float>(scale, in, out);
  for (int64_t i = 0; i < out; ++i) {
    if (out == in)
      idx[static_cast<size_t>(i)] = i;
    else if (out == 2 * in)
      idx[static_cast<size_t>(i)] = i >> 1;
    else
      idx[static_cast<size_t>(i)] = std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * s)), in - 1);
  }
  return idx;
}

// bilinear along one axis: the two source indices and the weight of the second, in T (PyTorch's opmath
// type: double for f64, float otherwise)
struct Linear1d {
  std::vector<int64_t> i0, i1;
  std::vector<double> lambda1;
};
template <class T> Linear1d linear_indices(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  Linear1d r;
  const T s = align_corners ? (out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0)) : scale_value<T>(scale, in, out);
  for (int64_t i = 0; i < out; ++i) {
    T src;
    if (align_corners) {
      src = s * static_cast<T>(i);
    } else {
      src = s * (static_cast<T>(i) + T(0.5)) - T(0.5);
      if (src < T(0)) src = T(0);
    }
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const T l1 = std::min(std::max(src - static_cast<T>(i0), T(0)), T(1));
    r.i0.push_back(i0);
    r.i1.push_back(i0 + (i0 < in - 1 ? 1 : 0));
    r.lambda1.push_back(static_cast<double>(l1));
  }
  return r;
}

template <Backend B> Tensor<B> index(const std::vector<int64_t>& v) { return Tensor<B>::from_vector(v, {static_cast<int64_t>(v.size())}); }

// x resampled linearly along `axis`: x[i0]·(1 − λ) + x[i1]·λ, λ broadcast along the trailing axes
template <Backend B> Var<B> lerp_axis(const Var<B>& x, int64_t axis, const Linear1d& l) {
  const int64_t n = static_cast<int64_t>(l.i0.size());
  std::vector<double> l0(l.lambda1.size());
  for (size_t i = 0; i < l0.size(); ++i) l0[i] = 1.0 - l.lambda1[i];
  Shape ws{n};
  for (int64_t d = axis + 1; d < x.dim(); ++d) ws.push_back(1);
  const Tensor<B> w0 = Tensor<B>::from_vector(l0, ws).to(x.dtype()), w1 = Tensor<B>::from_vector(l.lambda1, ws).to(x.dtype());
  return x.index_select(axis, index<B>(l.i0)).mul(w0).add(x.index_select(axis, index<B>(l.i1)).mul(w1));
}

}  // namespace

namespace functional {

template <Backend B> Var<B> interpolate(const Var<B>& x, const InterpolateOptions& o) {
  static constexpr const char* op = "interpolate";
  check_options(o, op);
  KILN_CHECK(x.defined(), "{}: undefined input", op);
  KILN_CHECK(x.dim() == 4, "{}: 2-D interpolation takes x [N, C, H, W], got {}", op, shape_str(x.shape()));
  KILN_CHECK(is_floating(x.dtype()), "{}: input must be floating, got {}", op, x.dtype());
  const int64_t H = x.size(2), W = x.size(3);
  KILN_CHECK(H > 0 && W > 0, "{}: input {} has an empty spatial axis", op, shape_str(x.shape()));
  int64_t Ho, Wo;
  std::optional<double> sh, sw;
  if (o.size) {
    Ho = o.size->h;
    Wo = o.size->w;
  } else {
    sh = o.scale_factor->h;
    sw = o.scale_factor->w;
    Ho = static_cast<int64_t>(std::floor(static_cast<double>(H) * *sh));
    Wo = static_cast<int64_t>(std::floor(static_cast<double>(W) * *sw));
    KILN_CHECK(Ho > 0 && Wo > 0, "{}: input {} with scale_factor ({}, {}) gives an empty output {}x{}", op, shape_str(x.shape()), *sh, *sw,
               Ho, Wo);
  }
  if (o.mode == InterpolateMode::nearest)
    return x.index_select(3, index<B>(nearest_indices(W, Wo, sw))).index_select(2, index<B>(nearest_indices(H, Ho, sh)));
  const bool ac = o.align_corners.value_or(false);
  const bool f64 = x.dtype() == DType::f64;
  const Linear1d lw = f64 ? linear_indices<double>(W, Wo, ac, sw) : linear_indices<float>(W, Wo, ac, sw);
  const Linear1d lh = f64 ? linear_indices<double>(H, Ho, ac, sh) : linear_indices<float>(H, Ho, ac, sh);
  return lerp_axis(lerp_axis(x, 3, lw), 2, lh);  // W first, then H: PyTorch's order of the four products
}

}  // namespace functional

template <Backend B> Upsample<B>::Upsample(UpsampleOptions o) : o_(o) { check_options(o, "Upsample"); }

#define KILN_INST(B)                                                                    \
  template Var<B> functional::interpolate<B>(const Var<B>&, const InterpolateOptions&); \
  template class Upsample<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
