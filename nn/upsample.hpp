#pragma once
// 2-D resampling: functional::interpolate and the Upsample module, torch.nn.functional.interpolate's
// "nearest" and "bilinear" modes (PyTorch 1.13) on x [N, C, H, W] -> [N, C, Ho, Wo].
//   * Output size: `size`, or ⌊H·scale_factor.h⌋ × ⌊W·scale_factor.w⌋; exactly one of the two.
//   * nearest: source index min(⌊dst·s⌋, in − 1) in float arithmetic as PyTorch, s = 1/scale_factor
//     when given, else in/out (so scale_factor 1.5 and size ⌊1.5·in⌋ may pick different pixels, as in
//     PyTorch).
//   * bilinear: src = s·(dst + ½) − ½ clamped at 0 (align_corners = false, PyTorch's default), or
//     src = dst·(in − 1)/(out − 1) (align_corners = true); the two neighbours ⌊src⌋ and ⌊src⌋ + 1
//     (the last pixel repeats at the edge) weighted 1 − λ and λ, first along W, then along H.
// Both are compositions of differentiable ops (index_select along W and H, times constant weights),
// so the gradient is the adjoint: each output's gradient added back to the pixels it read.
#include <optional>

#include "kiln/core/conv_params.hpp"
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// A scale factor per spatial axis: one number (2.0) or a pair ({2.0, 1.5}).
struct Scale2 {
  double h = 1, w = 1;
  constexpr Scale2() = default;
  constexpr Scale2(double v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor)
  constexpr Scale2(double h_, double w_) : h(h_), w(w_) {}
};

enum class InterpolateMode { nearest, bilinear };

struct InterpolateOptions {
  std::optional<Size2> size{};           // the output's (H, W)
  std::optional<Scale2> scale_factor{};  // or its scale
  InterpolateMode mode = InterpolateMode::nearest;
  std::optional<bool> align_corners{};  // bilinear only (unset: false); an Error with nearest, as PyTorch
};
using UpsampleOptions = InterpolateOptions;

namespace functional {
template <Backend B> KILN_API Var<B> interpolate(const Var<B>& x, const InterpolateOptions& o);
}  // namespace functional

// torch.nn.Upsample(size, scale_factor, mode, align_corners); no parameters or buffers.
template <Backend B> class Upsample : public Module<B> {
 public:
  explicit Upsample(UpsampleOptions o);
  Var<B> forward(const Var<B>& x) const { return functional::interpolate(x, o_); }
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

 private:
  UpsampleOptions o_;
};

#define KILN_UPSAMPLE_EXTERN(B)                                                                \
  extern template Var<B> functional::interpolate<B>(const Var<B>&, const InterpolateOptions&); \
  extern template class Upsample<B>;
KILN_FOR_EACH_BACKEND(KILN_UPSAMPLE_EXTERN)
#undef KILN_UPSAMPLE_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
