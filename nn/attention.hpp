#pragma once
// Multi-head attention with grouped-query attention, interleaved RoPE, causal or bidirectional
// self-attention, cross-attention to a memory, attention masks, key padding and a KV cache.
// # Shapes
//   x [B, T, D] -> [B, T, D];  q_proj D -> H·hd, k_proj/v_proj D -> Hkv·hd, out_proj H·hd -> D (no biases)
//   hd = D / H; query head i uses kv head ⌊i / (H/Hkv)⌋.
//   memory (cross-attention) [B, S, D]: q from x, k and v from the memory; S keys (self-attention:
//   S = T, or cached + T with a KV cache).
//   key_padding bool [B, S]; mask bool or additive, broadcastable to [B, H, T, S].
// RoPE (interleaved, GPT-J style): pair k = (2k, 2k+1) of a head at position t turns by t·θ^(−2k/hd).
// RoPE applies to self-attention only (queries and keys share one position axis); a module given a
// memory with rope = true throws: build cross-attention modules with rope = false.
// Causal masking hides key j from query i when j > pos0 + i: pos0 = 0 without a cache (top-left
// aligned when T != S, as torch's scaled_dot_product_attention(is_causal=True)), pos0 = the cached
// length with a KV cache (the new queries follow the cached positions).
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

// Applies interleaved RoPE to x [..., T, d] for positions pos0 .. pos0+T−1. Differentiable in x: one
// recorded op on the fused kernel (core/fused_rope.hpp) whose backward keeps only the cos/sin views.
// `table`: cached cos/sin tables (else built for this call).
template <Backend B> KILN_API Var<B> rope(const Var<B>& x, int64_t pos0, double theta, const RopeTable<B>* table = nullptr);

// Appends k, v [B, Hkv, T, w] to the cache (allocating `capacity` positions on first use) and returns
// the keys and values of all cached positions. Throws when the cache would overflow.
template <Backend B>
KILN_API std::pair<Tensor<B>, Tensor<B>> kv_cache_append(KVCache<B>& cache, const Tensor<B>& k, const Tensor<B>& v, int64_t capacity);

// RoPE with each row's own positions (a left-padded batch in generation): x [B, ..., T, d]; cos, sin
// [B·T, d/2], the angles of row b's token t at b·T + t. Differentiable in x (the fused kernel on a
// [..., B·T, d] view: no copy when x is the usual transposed [B, T, H, d] projection).
template <Backend B> KILN_API Var<B> rope_rows(const Var<B>& x, const Tensor<B>& cos, const Tensor<B>& sin);

// RoPE at pos0.. for every row, or at each row's own positions (i32/i64 [B, T], x [B, ..., T, d]), from
// `table` (nn::RopeTable). The attention modules' one way to turn q and k.
template <Backend B>
KILN_API Var<B> rope_at(const Var<B>& x, int64_t pos0, const Tensor<B>& positions, double theta, const RopeTable<B>* table);

// The rows of a batch with their own positions (a left-padded batch in generation, nn/generate.hpp):
//   positions  i32/i64 [B, T]: the position of each new token in its own row (RoPE, learned positions);
//   mask       bool, broadcastable to [B, H, T, S] over the cached and new keys (true = may attend),
//              applied together with the causal mask (which stays in the cache's coordinates).
template <Backend B> struct RowInputs {
  Tensor<B> positions{};
  Tensor<B> mask{};
};

namespace detail {
// Checks rows.positions against ids [B, T] (integer, [B, T], values in [0, limit)); returns the
// smallest and largest position.
template <Backend B>
KILN_API std::pair<int64_t, int64_t> row_positions_check(const char* op, const RowInputs<B>& rows, int64_t Bn, int64_t T, int64_t limit);
}  // namespace detail

// Softmax attention, causal with queries at positions pos0.. and keys at 0..: softmax(q kᵀ/√d + mask) v.
// q [B, H, T, d], k [B, Hkv, S, d], v [B, Hkv, S, dv]; H a multiple of Hkv. Differentiable in q, k, v.
// key_padding: optional bool [B, S], false = a padding key no query attends to (a row with no key
// left gives NaN, as in PyTorch).
// mask: optional, broadcastable to [B, H, T, S]: bool (true = may attend, as torch's
// scaled_dot_product_attention) or additive of q's dtype (added to the scaled scores; −inf hides a
// key). Not differentiable: no gradient flows into an additive mask.
// softcap > 0: the scaled scores become softcap · tanh(scores / softcap) before the masks (Gemma 2's
// attn_logit_softcapping; 0: none). The Cpu kernels apply it in the fused pass; on a backend whose
// kernels lack it (Cuda) the call takes fused::attention_forward's composite path, [T, S] scores included.
template <Backend B> KILN_API Var<B> attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0,
                                               const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}, double softcap = 0);
// Runs the fused kernel (fused::attention_forward/backward through autograd::AttentionOps): memory O(T)
// beyond q, k, v, O — the autograd node saves q, k, v, O and the row log-sum-exp only (plus the key
// padding and the mask as given; a [T, S] mask is the user's own tensor, never expanded or copied).
// A row with no visible key gets a zero gradient (it contributes nothing to dq, dk, dv).

// The same attention built from autograd ops (scores [B, H, T, S], softmax, matmul): the test oracle
// of the fused path, soft cap included.
template <Backend B> KILN_API Var<B> attention_decomposed(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0,
                                                          const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {},
                                                          double softcap = 0);

// What an attention module attends to, beyond its input x [B, T, D] (MultiHeadAttention,
// DifferentialAttention). Every field is optional; {} is causal (per the module's options)
// self-attention over x.
template <Backend B> struct AttentionInputs {
  Var<B> memory{};          // [B, S, D]: cross-attention (k, v from the memory); undefined: self-attention
  Tensor<B> key_padding{};  // bool [B, S]: true = a real key, false = padding (the inverse of
                            // nn.MultiheadAttention's key_padding_mask, where true means "ignore")
  Tensor<B> mask{};         // bool (true = may attend) or additive, broadcastable to [B, H, T, S]
  // i32/i64 [B, T]: each row's own positions for RoPE (a left-padded batch in generation, nn::RowInputs);
  // undefined: pos0.. for every row. Self-attention only.
  Tensor<B> positions{};
  // Self-attention: x holds the positions after the cached ones (generation; use under NoGrad).
  // Cross-attention: the memory's k, v are projected on the first call (cache empty) and reused from
  // the cache by later calls (the memory must still be given; reset the cache for a new sequence).
  KVCache<B>* cache = nullptr;
};

namespace detail {
// The keys and values a self- or cross-attention module attends to ([B, heads, S, hd] each): those of
// the memory from the cache when an earlier call projected them; else k_proj/v_proj of x (self) or of
// the memory, k turned by RoPE (rope_on, at pos0 or in.positions), appended to in.cache when given.
template <Backend B> KILN_API std::pair<Var<B>, Var<B>> attention_kv(const Var<B>& x, const AttentionInputs<B>& in, const Linear<B>& k_proj,
                                                                     const Linear<B>& v_proj, int64_t heads, int64_t hd, bool rope_on,
                                                                     double theta, const RopeTable<B>* table, int64_t pos0,
                                                                     int64_t max_seq_len);
// The attention modules' shared checks of x, the memory and the cache; returns the queries' pos0.
template <Backend B> KILN_API int64_t attention_inputs_check(const char* op, const Var<B>& x, const AttentionInputs<B>& in, int64_t D,
                                                             bool rope, bool causal, int64_t max_seq_len);
}  // namespace detail

// The defaults make a decoder's (GPT, Llama) self-attention: causal, with RoPE, no biases. This module
// is not torch.nn.MultiheadAttention (which has biases, no RoPE, and no mask unless given one): for
// an encoder or cross-attention say causal = false (and rope = false). docs/layers.md, "Porting from
// PyTorch", lists where kiln's options differ from torch.nn.
struct AttentionOptions {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: = n_heads
  bool causal = true;      // false: bidirectional (an encoder's self-attention, cross-attention)
  bool rope = true;        // self-attention only (see above)
  double rope_theta = 10000.0;
  int64_t max_seq_len = 256;  // RoPE positions and KV-cache capacity (self-attention)
  DType dtype = DType::f32;
};

template <Backend B> class MultiHeadAttention : public Module<B> {
 public:
  explicit MultiHeadAttention(AttentionOptions o);
  // cache: when given, x holds the positions after the cached ones (generation; use under NoGrad).
  Var<B> forward(const Var<B>& x, KVCache<B>* cache = nullptr) const;
  Var<B> operator()(const Var<B>& x, KVCache<B>* cache = nullptr) const { return forward(x, cache); }
  // Self- or cross-attention with masks (AttentionInputs above).
  Var<B> forward(const Var<B>& x, const AttentionInputs<B>& in) const;
  Var<B> operator()(const Var<B>& x, const AttentionInputs<B>& in) const { return forward(x, in); }
  const AttentionOptions& options() const { return o_; }

 private:
  AttentionOptions o_;
  int64_t hd_;
  std::shared_ptr<Linear<B>> q_, k_, v_, out_;
  std::shared_ptr<RopeTable<B>> rope_ = std::make_shared<RopeTable<B>>();
};

#define KILN_EXTERN(B)                \
  extern template class RopeTable<B>; \
  extern template class MultiHeadAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
