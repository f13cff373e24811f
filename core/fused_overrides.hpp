#pragma once
// Every fused override a backend may declare, checked: a backend that declares a member with an
// override's name must satisfy that override's Has* concept, so a mistyped signature (a missing
// argument, a View for a MutView, void for bool) fails to compile instead of silently falling back to
// the composite. Each backend's instantiate.cpp asserts it next to `template class Tensor<B>;`:
//
//   static_assert(kiln::fused::overrides_checked<MyBackend>());
//
// The declaration is detected on the name alone (any signature, overloads and templates included):
// a class deriving from both B and a probe holding a member of that name finds the name ambiguous
// exactly when B declares it too.
#include "kiln/core/fused.hpp"
#include "kiln/core/fused_conv.hpp"
#include "kiln/core/fused_depth.hpp"
#include "kiln/core/fused_diff2.hpp"
#include "kiln/core/fused_diff_attention.hpp"
#include "kiln/core/fused_loss.hpp"
#include "kiln/core/fused_norm.hpp"
#include "kiln/core/fused_optim.hpp"
#include "kiln/core/fused_rope.hpp"
#include "kiln/core/fused_swiglu.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

namespace declares {
// declares::name<B>: B has a member called `name`, whatever its signature.
#define KILN_DECLARES(name)                                  \
  struct name##_probe {                                      \
    int name;                                                \
  };                                                         \
  template <class B> struct name##_mix : B, name##_probe {}; \
  template <class B>                                         \
  concept name = !requires {                                 \
    &name##_mix<B>::name;                                    \
  };
KILN_DECLARES(softmax_lastdim)
KILN_DECLARES(softmax_lastdim_backward)
KILN_DECLARES(attention_forward)
KILN_DECLARES(attention_backward)
KILN_DECLARES(cross_entropy_forward)
KILN_DECLARES(cross_entropy_backward)
KILN_DECLARES(adam_step)
KILN_DECLARES(sum_squares)
KILN_DECLARES(swiglu_forward)
KILN_DECLARES(swiglu_backward)
KILN_DECLARES(conv2d_forward)
KILN_DECLARES(conv2d_backward_input)
KILN_DECLARES(conv2d_backward_weight)
KILN_DECLARES(max_pool2d_forward)
KILN_DECLARES(max_pool2d_backward)
KILN_DECLARES(avg_pool2d_forward)
KILN_DECLARES(avg_pool2d_backward)
KILN_DECLARES(depth_attention_forward)
KILN_DECLARES(depth_attention_backward)
KILN_DECLARES(depth_attention_phase1)
KILN_DECLARES(depth_attention_merge)
KILN_DECLARES(rope)
KILN_DECLARES(rms_norm_forward)
KILN_DECLARES(rms_norm_backward)
KILN_DECLARES(diff2_combine_forward)
KILN_DECLARES(diff_attention_forward)
KILN_DECLARES(diff_attention_backward)
KILN_DECLARES(diff_attention_norm_forward)
KILN_DECLARES(diff_attention_norm_backward)
KILN_DECLARES(diff2_combine_backward)
#undef KILN_DECLARES
}  // namespace declares

// One static_assert per Has* concept: declaring any of its members commits the backend to all of
// them, with the signatures of the concept (and of the comment in the header that defines it).
template <class B> consteval bool overrides_checked() {
  namespace d = declares;
  static_assert(!d::softmax_lastdim<B> || HasSoftmax<B>, "softmax_lastdim does not match HasSoftmax (core/fused.hpp)");
  static_assert(!d::softmax_lastdim_backward<B> || HasSoftmaxBackward<B>,
                "softmax_lastdim_backward does not match HasSoftmaxBackward (core/fused.hpp)");
  static_assert(!d::attention_forward<B> || HasAttention<B>, "attention_forward does not match HasAttention (core/fused.hpp)");
  static_assert(!d::attention_backward<B> || HasAttentionBackward<B>,
                "attention_backward does not match HasAttentionBackward (core/fused.hpp)");
  static_assert(!(d::cross_entropy_forward<B> || d::cross_entropy_backward<B>) || HasCrossEntropy<B>,
                "cross_entropy_forward/backward do not match HasCrossEntropy (core/fused_loss.hpp)");
  static_assert(!d::adam_step<B> || HasAdam<B>, "adam_step does not match HasAdam (core/fused_optim.hpp)");
  static_assert(!d::sum_squares<B> || HasSumSquares<B>, "sum_squares does not match HasSumSquares (core/fused_optim.hpp)");
  static_assert(!(d::diff_attention_forward<B> || d::diff_attention_backward<B>) || HasDiffAttention<B>,
                "diff_attention_forward/backward do not match HasDiffAttention (core/fused_diff_attention.hpp)");
  static_assert(!(d::diff_attention_norm_forward<B> || d::diff_attention_norm_backward<B>) || HasDiffAttentionNorm<B>,
                "diff_attention_norm_forward/backward do not match HasDiffAttentionNorm (core/fused_diff_attention.hpp)");
  static_assert(!(d::diff2_combine_forward<B> || d::diff2_combine_backward<B>) || HasDiff2Combine<B>,
                "diff2_combine_forward/backward do not match HasDiff2Combine (core/fused_diff2.hpp)");
  static_assert(!(d::swiglu_forward<B> || d::swiglu_backward<B>) || HasSwiGLU<B>,
                "swiglu_forward/backward do not match HasSwiGLU (core/fused_swiglu.hpp)");
  static_assert(!(d::conv2d_forward<B> || d::conv2d_backward_input<B> || d::conv2d_backward_weight<B>) || HasConv2d<B>,
                "conv2d_forward/backward_input/backward_weight do not match HasConv2d (core/fused_conv.hpp)");
  static_assert(!(d::max_pool2d_forward<B> || d::max_pool2d_backward<B>) || HasMaxPool2d<B>,
                "max_pool2d_forward/backward do not match HasMaxPool2d (core/fused_conv.hpp)");
  static_assert(!(d::avg_pool2d_forward<B> || d::avg_pool2d_backward<B>) || HasAvgPool2d<B>,
                "avg_pool2d_forward/backward do not match HasAvgPool2d (core/fused_conv.hpp)");
  static_assert(!(d::depth_attention_forward<B> || d::depth_attention_backward<B>) || HasDepthAttention<B>,
                "depth_attention_forward/backward do not match HasDepthAttention (core/fused_depth.hpp)");
  static_assert(!(d::depth_attention_phase1<B> || d::depth_attention_merge<B>) || HasDepthTwoPhase<B>,
                "depth_attention_phase1/merge do not match HasDepthTwoPhase (core/fused_depth.hpp)");
  static_assert(!d::rope<B> || HasRope<B>, "rope does not match HasRope (core/fused_rope.hpp)");
  static_assert(!(d::rms_norm_forward<B> || d::rms_norm_backward<B>) || HasRmsNorm<B>,
                "rms_norm_forward/backward do not match HasRmsNorm (core/fused_norm.hpp)");
  return true;
}

}  // namespace kiln::fused
#pragma GCC visibility pop
