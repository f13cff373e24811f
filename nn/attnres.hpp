#pragma once
// Attention Residuals (MoonshotAI/Kimi, arXiv 2603.15031), docs/specs.md §2: a sublayer's input is a
// softmax mixture, per token, over earlier representations ("sources"):
//   logit_i = w · RMSNorm(v_i)   (keys normalised, values raw, no 1/√D scale)
//   α = softmax_i(logit),  h = Σ_i α_i v_i
// # Shapes
//   sources: n tensors [B, T, D] -> h [B, T, D];  query w [D] (init 0: h starts as the mean),
//   key_norm.weight [D] (if attnres_key_norm_affine)
// forward() is one fused op (core/fused_depth.hpp) whose backward keeps α and the per-token rstd,
// [n, B, T] each, and references to the sources: no stacked or normalised copy per sublayer.
#include <memory>
#include <vector>

#include "kiln/autograd/checkpoint.hpp"
#include "kiln/nn/norm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
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
  // The same mixture from composite autograd ops (stack, RMSNorm, matmul, softmax): the test oracle
  // of the fused forward and backward.
  Var<B> forward_decomposed(const std::vector<Var<B>>& sources) const;
  // Per-source logits [n, B, T] (what forward softmaxes), for tests and two-phase inference.
  Var<B> logits(const std::vector<Var<B>>& sources) const;
  Var<B>& query() { return w_; }
  // w ⊙ g (g = the key-norm weight, or ones): logit_i = (w ⊙ g) · (v_i / rms(v_i)). Used by two-phase inference.
  Tensor<B> effective_query() const;
  double eps() const { return o_.eps; }

 private:
  void check_sources(const std::vector<Var<B>>& sources) const;
  Var<B> key_norm_weight() const;  // undefined when the key norm has no weight
  DepthAttentionOptions o_;
  Var<B> w_;
  std::shared_ptr<RMSNorm<B>> key_norm_;
};

// docs/specs.md §2's block state machine, shared by the GPT and the tests:
//   blocks = [embedding]; partial = none
//   each sublayer j: if j > 0 and j % S == 0: blocks.append(partial); partial = none
//                    h = depth_attention_j(blocks + [partial]); out = f_j(h); partial += out
//   x = final_res(blocks + [partial])
// Full AttnRes is S = 1. The embedding is a source of its own, never summed into a block.
//
// Two-phase inference (pass the depth attentions of every sublayer, in order, as `schedule`; use under
// NoGrad): when a block starts, Phase 1 scores all of its S queries against the completed blocks in one
// batched matmul and keeps, per query and token, the max logit m, l = Σ exp(logit − m) and the
// unnormalised sum acc = Σ exp(logit − m)·v; Phase 2, at each sublayer, merges the one running
// partial with an online-softmax step. Exactly the sequential result, with each completed block read
// once per block instead of once per sublayer.
template <Backend B> class AttnResStack {
 public:
  AttnResStack(Var<B> embedding, int64_t block_size, std::vector<const DepthAttention<B>*> schedule = {});
  // Runs sublayer j: returns h (the depth attention's mixture) and records out = f(h).
  template <class F> Var<B> step(const DepthAttention<B>& res, F&& f) {
    boundary();
    const Var<B> h = schedule_.empty() ? res.forward(sources()) : Var<B>(two_phase_read(res));
    add(f(h));
    return h;
  }
  // Runs sublayer j as one activation-checkpointing segment (autograd/checkpoint.hpp): out =
  // f(sources), f being the depth attention and the sublayer function, recorded as one tape entry whose
  // inputs are the sources and recomputed in backward, so that of the sublayer only its output stays
  // (not the mixture h nor what the function saves). f runs again in backward: capture what it reads
  // by value. Returns out. Not with two-phase inference (a NoGrad forward has nothing to checkpoint).
  template <class F> Var<B> checkpointed_step(F f) {
    KILN_CHECK(schedule_.empty(), "AttnRes: a checkpointed sublayer ({}) with two-phase inference", j_);
    boundary();
    const Var<B> out = kiln::checkpoint<B>([f](const std::vector<Var<B>>& s) { return std::vector<Var<B>>{f(s)}; }, sources())[0];
    add(out);
    return out;
  }
  Var<B> finish(const DepthAttention<B>& final_res) const { return final_res.forward(sources()); }
  std::vector<Var<B>> sources() const;  // completed blocks, then the partial if any
  int64_t sublayers() const { return j_; }

 private:
  void boundary();
  void add(const Var<B>& out);
  void phase1();
  Tensor<B> two_phase_read(const DepthAttention<B>& res) const;
  int64_t S_, j_ = 0;
  std::vector<Var<B>> blocks_;
  Var<B> partial_;
  std::vector<const DepthAttention<B>*> schedule_;
  Tensor<B> Q_, m_, l_, acc_;  // Phase 1 of the current block: queries [S', D], [S', B, T], [S', B, T], [S', B, T, D]
  int64_t block_start_ = 0;
};

#define KILN_EXTERN(B)                     \
  extern template class DepthAttention<B>; \
  extern template class AttnResStack<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
