#pragma once
// Normalisation over the last axis.
// # Shapes
//   x [..., dim] -> [..., dim]; weight [dim] (if affine), bias [dim] (LayerNorm with bias)
// RMSNorm:   y = x · rsqrt(mean(x²) + eps) · (offset + w)   (offset 0, or 1 as Gemma's norms, whose
//            weights start at 0)
// LayerNorm: y = (x − mean) · rsqrt(var + eps) · w + b   (biased variance, like PyTorch)
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

namespace functional {
// weight may be undefined (no affine). Differentiable in x and weight.
template <Backend B> KILN_API Var<B> rms_norm(const Var<B>& x, const Var<B>& weight, double eps);
template <Backend B> KILN_API Var<B> layer_norm(const Var<B>& x, const Var<B>& weight, const Var<B>& bias, double eps);
}  // namespace functional

struct RMSNormOptions {
  int64_t dim = 0;
  double eps = 1e-5;
  bool affine = true;
  DType dtype = DType::f32;
  // The scale is offset + weight, the weight initialised to 1 − offset (Gemma: offset 1, the weight an
  // offset from 1 that starts at 0; it decays towards a scale of 1). Needs affine.
  double offset = 0;
};

template <Backend B> class RMSNorm : public Module<B> {
 public:
  explicit RMSNorm(RMSNormOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }
  const RMSNormOptions& options() const { return o_; }

 private:
  RMSNormOptions o_;
  Var<B> w_;
};

struct LayerNormOptions {
  int64_t dim = 0;
  double eps = 1e-5;
  bool affine = true;
  bool bias = true;
  DType dtype = DType::f32;
};

template <Backend B> class LayerNorm : public Module<B> {
 public:
  explicit LayerNorm(LayerNormOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

 private:
  LayerNormOptions o_;
  Var<B> w_, b_;
};

#define KILN_EXTERN(B)              \
  extern template class RMSNorm<B>; \
  extern template class LayerNorm<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
