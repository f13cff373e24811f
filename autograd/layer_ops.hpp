#pragma once
// Differentiable ops that nn's layers are built on, each one recorded op with its closed-form backward;
// bodies (forward and backward side by side) in autograd/ops/<family>.cpp, explicitly instantiated for
// the built-in backends. nn/ holds the parameters and composes these (nn/norm.cpp, batch_norm.cpp,
// group_norm.cpp, layers.cpp, attention.cpp, attnres.cpp, diff2_attention.cpp, hf/causal_lm.cpp); the loss ops are in
// autograd/loss_ops.hpp.
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::autograd {

// autograd/ops/norm.cpp
template <Backend B> struct NormOps {
  using X = Var<B>;
  // x [..., D], weight [D] or undefined: y = x / sqrt(mean(x², -1) + eps) · w on the fused kernel
  // (core/fused_norm.hpp); the node saves x, w and rstd [rows].
  static X rms_norm(const X& x, const X& weight, double eps);
  // x [N, C, *]; weight, bias [C] or undefined; running_mean, running_var [C] (both or neither) are
  // updated in place with `momentum` when training. bf16/f16 are normalised in f32. The node saves x,
  // the per-channel mean, 1/std and scale; dx = scale·(g − Σg/n − x̂·Σ(g·x̂)/n) when training (the
  // batch statistics depend on x), scale·g in eval.
  static X batch_norm(const X& x, const Tensor<B>& running_mean, const Tensor<B>& running_var, const X& weight, const X& bias,
                      bool training, double momentum, double eps);
  // x [N, C, *] normalised over each of num_groups groups of C/num_groups channels (and all positions);
  // weight, bias [C] or undefined. bf16/f16 are normalised in f32.
  static X group_norm(const X& x, int64_t num_groups, const X& weight, const X& bias, double eps);
};

// autograd/ops/rope.cpp
template <Backend B> struct RopeOps {
  // x [..., T, d] rotated by the tables cos, sin [T, d/2] (interleaved pairs, core/fused_rope.hpp); the
  // backward is the inverse rotation and saves only the tables.
  static Var<B> rope(const Var<B>& x, const Tensor<B>& cos, const Tensor<B>& sin);
};

// autograd/ops/swiglu.cpp
template <Backend B> struct SwiGLUOps {
  // silu(gate) · up on the fused kernel (core/fused_swiglu.hpp); the node saves gate and up.
  static Var<B> swiglu(const Var<B>& gate, const Var<B>& up);
};

// autograd/ops/depth_attention.cpp
template <Backend B> struct DepthAttentionOps {
  // h = Σ_i α_i·v_i with α = softmax_i(rms_norm(v_i) · (w ⊙ g)) per token (core/fused_depth.hpp):
  // sources v_i [..., D] (all one shape), w [D] the query, g [D] the key norm's weight or undefined.
  // The node keeps α and the per-token rstd [n, B, T] and the sources themselves, never a stacked or
  // normalised copy.
  static Var<B> depth_attention(const std::vector<Var<B>>& sources, const Var<B>& w, const Var<B>& g, double eps);
};

// autograd/ops/diff2.cpp
template <Backend B> struct Diff2Ops {
  // Differential attention V2's head pairing (core/fused_diff2.hpp): a [B, 2h, T, hd], lambda_logits
  // [B, T, h] -> y [B, T, h, hd], y_j = a_2j − σ(λ_j)·a_2j+1; the node saves a and the logits.
  static Var<B> combine(const Var<B>& a, const Var<B>& lambda_logits);
};

#define KILN_LAYER_OPS_EXTERN(B)               \
  extern template struct NormOps<B>;           \
  extern template struct RopeOps<B>;           \
  extern template struct SwiGLUOps<B>;         \
  extern template struct DepthAttentionOps<B>; \
  extern template struct Diff2Ops<B>;
KILN_FOR_EACH_BACKEND(KILN_LAYER_OPS_EXTERN)
#undef KILN_LAYER_OPS_EXTERN

}  // namespace kiln::autograd
#pragma GCC visibility pop
