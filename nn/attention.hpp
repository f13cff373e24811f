#pragma once
// Multi-head attention with grouped-query attention, interleaved RoPE, causal masking and a KV cache.
// # Shapes
//   x [B, T, D] -> [B, T, D];  q_proj D -> H·hd, k_proj/v_proj D -> Hkv·hd, out_proj H·hd -> D (no biases)
//   hd = D / H; query head i uses kv head ⌊i / (H/Hkv)⌋.
// RoPE (interleaved, GPT-J style): pair k = (2k, 2k+1) of a head at position t turns by t·θ^(−2k/hd).
#include <memory>
#include <mutex>
#include <utility>

#include "kiln/nn/linear.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// Keys and values of earlier positions, for generation. One per attention layer; filled under NoGrad.
template <Backend B> struct KVCache {
  Tensor<B> k, v;   // [B, Hkv, capacity, width]
  int64_t len = 0;  // positions filled
  void reset() { len = 0; }
};

// RoPE's cos and sin tables [positions, d/2] on the backend, built on first use and rebuilt (with room
// for twice the positions) when a call needs more positions, another width, θ or dtype. An attention
// module keeps one, so a step uploads no tables (on a GPU an upload waits for the device) and computes
// no trigonometry. Thread-safe.
template <Backend B> class RopeTable {
 public:
  // cos, sin [T, d/2] in `dtype` for positions pos0 .. pos0+T−1 (views of the tables).
  std::pair<Tensor<B>, Tensor<B>> at(int64_t pos0, int64_t T, int64_t d, double theta, DType dtype) const;

 private:
  mutable std::mutex mu_;
  mutable Tensor<B> cos_, sin_;
  mutable int64_t d_ = -1;
  mutable double theta_ = 0;
  mutable DType dtype_ = DType::f32;
};

// Applies interleaved RoPE to x [..., T, d] for positions pos0 .. pos0+T−1. Differentiable in x.
// `table`: cached cos/sin tables (else built for this call).
template <Backend B> KILN_API Var<B> rope(const Var<B>& x, int64_t pos0, double theta, const RopeTable<B>* table = nullptr);

// Appends k, v [B, Hkv, T, w] to the cache (allocating `capacity` positions on first use) and returns
// the keys and values of all cached positions. Throws when the cache would overflow.
template <Backend B>
KILN_API std::pair<Tensor<B>, Tensor<B>> kv_cache_append(KVCache<B>& cache, const Tensor<B>& k, const Tensor<B>& v, int64_t capacity);

// Softmax attention, causal with queries at positions pos0.. and keys at 0..: softmax(q kᵀ/√d + mask) v.
// q [B, H, T, d], k [B, Hkv, S, d], v [B, Hkv, S, dv]; H a multiple of Hkv. Differentiable in q, k, v.
// key_padding: optional bool [B, S], false = a padding key no query attends to (a row with no key
// left gives NaN, as in PyTorch).
template <Backend B>
KILN_API Var<B> attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0, const Tensor<B>& key_padding = {});
// Runs the fused kernel (fused::attention_forward/backward through autograd::AttentionOps): memory O(T)
// beyond q, k, v, O — the autograd node saves q, k, v, O and the row log-sum-exp only. A row with no
// visible key gets a zero gradient (it contributes nothing to dq, dk, dv).

// The same attention built from autograd ops (scores [B, H, T, S], softmax, matmul): the test oracle
// of the fused path.
template <Backend B>
KILN_API Var<B> attention_decomposed(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0,
                            const Tensor<B>& key_padding = {});

struct AttentionOptions {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: = n_heads
  bool rope = true;
  double rope_theta = 10000.0;
  int64_t max_seq_len = 256;
  DType dtype = DType::f32;
};

template <Backend B> class MultiHeadAttention : public Module<B> {
 public:
  explicit MultiHeadAttention(AttentionOptions o);
  // cache: when given, x holds the positions after the cached ones (generation; use under NoGrad).
  Var<B> forward(const Var<B>& x, KVCache<B>* cache = nullptr) const;
  Var<B> operator()(const Var<B>& x, KVCache<B>* cache = nullptr) const { return forward(x, cache); }
  const AttentionOptions& options() const { return o_; }

 private:
  AttentionOptions o_;
  int64_t hd_;
  std::shared_ptr<Linear<B>> q_, k_, v_, out_;
  std::shared_ptr<RopeTable<B>> rope_ = std::make_shared<RopeTable<B>>();
};

#define KILN_EXTERN(B) extern template class RopeTable<B>; extern template class MultiHeadAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
