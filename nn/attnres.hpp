#pragma once
// Attention Residuals (MoonshotAI/Kimi, arXiv 2603.15031), SPECS.md §2: a sublayer's input is a
// softmax mixture, per token, over earlier representations ("sources"):
//   logit_i = w · RMSNorm(v_i)   (keys normalised, values raw, no 1/√D scale)
//   α = softmax_i(logit),  h = Σ_i α_i v_i
// # Shapes
//   sources: n tensors [B, T, D] -> h [B, T, D];  query w [D] (init 0: h starts as the mean),
//   key_norm.weight [D] (if attnres_key_norm_affine)
#include <memory>
#include <vector>

#include "nn/norm.hpp"

namespace kiln::nn {

struct DepthAttentionOptions {
  int64_t d_model = 0;
  double eps = 1e-5;
  bool key_norm_affine = true;
  DType dtype = DType::f32;
};

template <Backend B> class DepthAttention : public Module<B> {
 public:
  explicit DepthAttention(DepthAttentionOptions o);
  Var<B> forward(const std::vector<Var<B>>& sources) const;
  Var<B> operator()(const std::vector<Var<B>>& sources) const { return forward(sources); }
  // Per-source logits [n, B, T] (what forward softmaxes), for tests and two-phase inference.
  Var<B> logits(const std::vector<Var<B>>& sources) const;
  Var<B>& query() { return w_; }

 private:
  DepthAttentionOptions o_;
  Var<B> w_;
  std::shared_ptr<RMSNorm<B>> key_norm_;
};

#define KILN_EXTERN(B) extern template class DepthAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
