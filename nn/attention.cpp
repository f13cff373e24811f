#include "kiln/nn/attention.hpp"

#include "kiln/autograd/layer_ops.hpp"
#include "kiln/core/fused.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kiln::nn {

template <Backend B> std::pair<Tensor<B>, Tensor<B>> RopeTable<B>::at(int64_t pos0, int64_t T, int64_t d, double theta, DType dtype) const {
  KILN_CHECK(pos0 >= 0 && T >= 0 && d > 0 && d % 2 == 0, "rope: bad table request (positions {}..{}, width {})", pos0, pos0 + T, d);
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t have = cos_.defined() ? cos_.size(0) : 0;
  if (d != d_ || theta != theta_ || dtype != dtype_ || pos0 + T > have) {
    const int64_t P = (d == d_ && theta == theta_ && dtype == dtype_) ? std::max(pos0 + T, 2 * have) : pos0 + T;
    // Angles in double, rounded to the input's dtype (as the reference does), cos/sin of that.
    std::vector<double> c(static_cast<size_t>(P * d / 2)), s(c.size());
    for (int64_t t = 0; t < P; ++t)
      for (int64_t k = 0; k < d / 2; ++k) {
        const double inv = std::pow(theta, -static_cast<double>(2 * k) / static_cast<double>(d));
        double ang = static_cast<double>(t) * inv;
        if (dtype == DType::f32) ang = static_cast<double>(static_cast<float>(ang));
        c[static_cast<size_t>(t * d / 2 + k)] = std::cos(ang);
        s[static_cast<size_t>(t * d / 2 + k)] = std::sin(ang);
      }
    cos_ = Tensor<B>::from_vector(c, {P, d / 2}).to(dtype);
    sin_ = Tensor<B>::from_vector(s, {P, d / 2}).to(dtype);
    d_ = d;
    theta_ = theta;
    dtype_ = dtype;
  }
  return {cos_.narrow(0, pos0, T), sin_.narrow(0, pos0, T)};
}

template <Backend B> Var<B> rope(const Var<B>& x, int64_t pos0, double theta, const RopeTable<B>* table) {
  const int64_t d = x.shape().back(), T = x.size(-2);
  KILN_CHECK(d % 2 == 0, "rope: width {} must be even (input {})", d, shape_str(x.shape()));
  const RopeTable<B> own;
  const auto cs = (table ? table : &own)->at(pos0, T, d, theta, x.dtype());
  // One recorded op on the fused kernel (autograd/ops/rope.cpp); the backward needs only the tables.
  return autograd::RopeOps<B>::rope(x, cs.first, cs.second);
}

template <Backend B> Var<B> rope_rows(const Var<B>& x, const Tensor<B>& cos, const Tensor<B>& sin) {
  const int64_t n = x.dim();
  KILN_CHECK(n >= 3 && cos.dim() == 2 && cos.size(0) == x.size(0) * x.size(-2),
             "rope_rows: x {} must be [B, ..., T, d] and cos {} [B·T, d/2] (one row of angles per token of each row)", shape_str(x.shape()),
             shape_str(cos.shape()));
  // [B, A..., T, d] -> [A..., B, T, d] -> [A..., B·T, d]: the token axis the fused kernel turns by its own
  // row of the tables (a view when B's stride is T times T's, as for the transposed projections).
  std::vector<int64_t> perm, inv(static_cast<size_t>(n)), flat, back;
  for (int64_t i = 1; i < n - 2; ++i) perm.push_back(i);
  perm.insert(perm.end(), {0, n - 2, n - 1});
  for (int64_t i = 0; i < n; ++i) inv[static_cast<size_t>(perm[static_cast<size_t>(i)])] = i;
  for (int64_t i = 1; i < n - 2; ++i) flat.push_back(x.size(i));
  back = flat;
  flat.insert(flat.end(), {x.size(0) * x.size(-2), x.size(-1)});
  back.insert(back.end(), {x.size(0), x.size(-2), x.size(-1)});
  return autograd::RopeOps<B>::rope(x.permute(perm).reshape(flat), cos, sin).reshape(back).permute(inv);
}

template <Backend B> Var<B> rope_at(const Var<B>& x, int64_t pos0, const Tensor<B>& positions, double theta, const RopeTable<B>* table) {
  if (!positions.defined()) return rope(x, pos0, theta, table);
  const int64_t d = x.shape().back();
  KILN_CHECK(d % 2 == 0, "rope: width {} must be even (input {})", d, shape_str(x.shape()));
  const auto [lo, hi] =
      detail::row_positions_check("rope", RowInputs<B>{.positions = positions}, x.size(0), x.size(-2), std::numeric_limits<int64_t>::max());
  (void)lo;
  const RopeTable<B> own;
  const auto cs = (table ? table : &own)->at(0, hi + 1, d, theta, x.dtype());
  const Tensor<B> at = positions.reshape({-1}).to(DType::i64);
  return rope_rows(x, cs.first.index_select(0, at), cs.second.index_select(0, at));
}

namespace detail {
template <Backend B>
std::pair<int64_t, int64_t> row_positions_check(const char* op, const RowInputs<B>& rows, int64_t Bn, int64_t T, int64_t limit) {
  const Tensor<B>& p = rows.positions;
  KILN_CHECK((p.dtype() == DType::i64 || p.dtype() == DType::i32) && p.shape() == Shape({Bn, T}),
             "{}: positions must be i32/i64 [B, T] = [{}, {}], got {} {}", op, Bn, T, p.dtype(), shape_str(p.shape()));
  const std::vector<int64_t> v = p.template to_vector<int64_t>();
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  KILN_CHECK(v.empty() || (*lo >= 0 && *hi < limit), "{}: positions {}..{} must lie in [0, {})", op, v.empty() ? 0 : *lo,
             v.empty() ? 0 : *hi, limit);
  return {v.empty() ? 0 : *lo, v.empty() ? 0 : *hi};
}
}  // namespace detail

template <Backend B>
std::pair<Tensor<B>, Tensor<B>> kv_cache_append(KVCache<B>& cache, const Tensor<B>& k, const Tensor<B>& v, int64_t capacity) {
  const int64_t T = k.size(2);
  if (!cache.k.defined()) {
    cache.k = Tensor<B>::zeros({k.size(0), k.size(1), capacity, k.size(3)}, k.dtype());
    cache.v = Tensor<B>::zeros({v.size(0), v.size(1), capacity, v.size(3)}, v.dtype());
    cache.len = 0;
  }
  KILN_CHECK(cache.len + T <= cache.k.size(2), "kv cache: {} cached + {} new positions exceed its capacity {} (max_seq_len)", cache.len, T,
             cache.k.size(2));
  KILN_CHECK(cache.k.size(0) == k.size(0), "kv cache: batch {} differs from the cached batch {}", k.size(0), cache.k.size(0));
  cache.k.narrow(2, cache.len, T).copy_(k);
  cache.v.narrow(2, cache.len, T).copy_(v);
  cache.len += T;
  return {cache.k.narrow(2, 0, cache.len), cache.v.narrow(2, 0, cache.len)};
}

template <Backend B> Var<B> attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0,
                                      const Tensor<B>& key_padding, const Tensor<B>& mask, double softcap) {
  KILN_CHECK(q.dim() == 4, "attention: q {} must be [B, H, T, d]", shape_str(q.shape()));
  return autograd::AttentionOps<B>::attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(q.size(3))), causal, pos0, key_padding, mask,
                                              softcap);
}

template <Backend B> Var<B> attention_decomposed(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0,
                                                 const Tensor<B>& key_padding, const Tensor<B>& mask, double softcap) {
  fused::detail::softcap_check("attention", softcap);
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q {}, k {}, v {} must be [B, H, T, d]", shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()));
  const int64_t Bn = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), dv = v.size(3);
  KILN_CHECK(k.size(0) == Bn && v.size(0) == Bn && k.size(3) == d && v.size(1) == Hkv && v.size(2) == S && Hkv >= 1 && H % Hkv == 0,
             "attention: q {}, k {}, v {} do not fit (H must be a multiple of Hkv, widths and lengths must agree)", shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()));
  Var<B> kk = k, vv = v;
  if (Hkv != H) {  // each kv head serves H/Hkv consecutive query heads
    const int64_t rep = H / Hkv;
    kk = k.unsqueeze(2).expand({Bn, Hkv, rep, S, d}).reshape({Bn, H, S, d});
    vv = v.unsqueeze(2).expand({Bn, Hkv, rep, S, dv}).reshape({Bn, H, S, dv});
  }
  Var<B> s = q.matmul(kk.transpose(-1, -2)).div(std::sqrt(static_cast<double>(d)));  // [B, H, T, S]
  if (softcap > 0) s = s.div(softcap).tanh().mul(softcap);
  if (causal) {
    std::vector<float> m(static_cast<size_t>(T * S), 0.0f);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = pos0 + i + 1; j < S; ++j) m[static_cast<size_t>(i * S + j)] = -std::numeric_limits<float>::infinity();
    s = s + Var<B>(Tensor<B>::from_vector(m, {T, S}).to(q.dtype()));
  }
  if (key_padding.defined()) {
    KILN_CHECK(key_padding.dtype() == DType::boolean && key_padding.shape() == Shape({Bn, S}),
               "attention: key_padding must be bool [{}, {}], got {} {}", Bn, S, key_padding.dtype(), shape_str(key_padding.shape()));
    const Tensor<B> zero = Tensor<B>::zeros({}, q.dtype()), ninf = Tensor<B>::full({}, -INFINITY, q.dtype());
    s = s + Var<B>(Tensor<B>::where(key_padding, zero, ninf).reshape({Bn, 1, 1, S}));
  }
  if (mask.defined()) {  // broadcast by the addition (an error names both shapes when it does not fit)
    KILN_CHECK(mask.dtype() == DType::boolean || mask.dtype() == q.dtype(), "attention: mask must be bool or of q's dtype {}, got {} {}",
               q.dtype(), mask.dtype(), shape_str(mask.shape()));
    const Tensor<B> zero = Tensor<B>::zeros({}, q.dtype()), ninf = Tensor<B>::full({}, -INFINITY, q.dtype());
    s = s + Var<B>(mask.dtype() == DType::boolean ? Tensor<B>::where(mask, zero, ninf) : mask);
  }
  return s.softmax(-1).matmul(vv);  // [B, H, T, dv]
}

namespace detail {
template <Backend B> std::pair<Var<B>, Var<B>> attention_kv(const Var<B>& x, const AttentionInputs<B>& in, const Linear<B>& k_proj,
                                                            const Linear<B>& v_proj, int64_t heads, int64_t hd, bool rope_on, double theta,
                                                            const RopeTable<B>* table, int64_t pos0, int64_t max_seq_len) {
  const bool cross = in.memory.defined();
  if (cross && in.cache && in.cache->len > 0)  // the memory's keys and values, projected by an earlier call
    return {Var<B>(in.cache->k.narrow(2, 0, in.cache->len)), Var<B>(in.cache->v.narrow(2, 0, in.cache->len))};
  const Var<B>& src = cross ? in.memory : x;
  const int64_t Bn = src.size(0), S = src.size(1);
  Var<B> k = k_proj.forward(src).view({Bn, S, heads, hd}).transpose(1, 2);  // [B, heads, S, hd]
  Var<B> v = v_proj.forward(src).view({Bn, S, heads, hd}).transpose(1, 2);
  if (rope_on) k = rope_at(k, pos0, in.positions, theta, table);
  if (in.cache) {
    if (cross) *in.cache = KVCache<B>{};  // sized for this memory
    auto [kc, vc] = kv_cache_append(*in.cache, k.value(), v.value(), cross ? S : max_seq_len);
    k = Var<B>(kc);
    v = Var<B>(vc);
  }
  return {k, v};
}
}  // namespace detail

template <Backend B> MultiHeadAttention<B>::MultiHeadAttention(AttentionOptions o) : o_(o) {
  if (o_.n_kv_heads == 0) o_.n_kv_heads = o_.n_heads;
  KILN_CHECK(o_.n_heads >= 1 && o_.d_model % o_.n_heads == 0, "MultiHeadAttention: d_model {} must be divisible by n_heads {}", o_.d_model,
             o_.n_heads);
  KILN_CHECK(o_.n_kv_heads >= 1 && o_.n_heads % o_.n_kv_heads == 0, "MultiHeadAttention: n_heads {} must be a multiple of n_kv_heads {}",
             o_.n_heads, o_.n_kv_heads);
  hd_ = o_.d_model / o_.n_heads;
  KILN_CHECK(!o_.rope || hd_ % 2 == 0, "MultiHeadAttention: RoPE needs an even head width, got d_model/n_heads = {}", hd_);
  const int64_t D = o_.d_model;
  auto lin = [&](int64_t in, int64_t out) {
    return std::make_shared<Linear<B>>(LinearOptions{.in = in, .out = out, .bias = false, .dtype = o_.dtype});
  };
  q_ = this->register_module("q_proj", lin(D, o_.n_heads * hd_));
  k_ = this->register_module("k_proj", lin(D, o_.n_kv_heads * hd_));
  v_ = this->register_module("v_proj", lin(D, o_.n_kv_heads * hd_));
  out_ = this->register_module("out_proj", lin(o_.n_heads * hd_, D));
}

namespace detail {
// The checks shared by the attention modules: x [B, T, D], the memory [B, S, D] (cross-attention: no
// RoPE, no causal mask with a cache) and a cross-attention cache that already holds the memory's
// keys. Returns pos0 (the cached length for self-attention with a cache, else 0).
template <Backend B> int64_t attention_inputs_check(const char* op, const Var<B>& x, const AttentionInputs<B>& in, int64_t D, bool rope,
                                                    bool causal, int64_t max_seq_len) {
  KILN_CHECK(x.dim() == 3 && x.size(2) == D, "{}: input {} must be [B, T, {}]", op, shape_str(x.shape()), D);
  const int64_t T = x.size(1);
  if (in.memory.defined()) {
    KILN_CHECK(in.memory.dim() == 3 && in.memory.size(0) == x.size(0) && in.memory.size(2) == D,
               "{}: memory {} must be [B = {}, S, D = {}] (x {})", op, shape_str(in.memory.shape()), x.size(0), D, shape_str(x.shape()));
    KILN_CHECK(in.memory.dtype() == x.dtype(), "{}: memory dtype {} differs from x's {}", op, in.memory.dtype(), x.dtype());
    KILN_CHECK(!rope, "{}: RoPE applies to self-attention only; build a cross-attention module with rope = false (memory {})", op,
               shape_str(in.memory.shape()));
    KILN_CHECK(!in.positions.defined(), "{}: positions apply to self-attention only (memory {})", op, shape_str(in.memory.shape()));
    KILN_CHECK(!(causal && in.cache), "{}: causal cross-attention with a KV cache is not supported (the queries' positions are unknown)",
               op);
    if (in.cache && in.cache->len > 0)
      KILN_CHECK(in.cache->len == in.memory.size(1) && in.cache->k.size(0) == x.size(0),
                 "{}: the cross-attention cache holds {} keys of batch {}, the memory is {}: reset the cache for a new memory", op,
                 in.cache->len, in.cache->k.size(0), shape_str(in.memory.shape()));
    return 0;
  }
  if (in.positions.defined())
    KILN_CHECK((in.positions.dtype() == DType::i64 || in.positions.dtype() == DType::i32) && in.positions.shape() == Shape({x.size(0), T}),
               "{}: positions must be i32/i64 [B, T] = [{}, {}], got {} {}", op, x.size(0), T, in.positions.dtype(),
               shape_str(in.positions.shape()));
  const int64_t pos0 = in.cache ? in.cache->len : 0;
  if (rope || in.cache)
    KILN_CHECK(pos0 + T <= max_seq_len, "{}: sequence of {} positions exceeds max_seq_len {}", op, pos0 + T, max_seq_len);
  return pos0;
}
}  // namespace detail

template <Backend B> Var<B> MultiHeadAttention<B>::forward(const Var<B>& x, KVCache<B>* cache) const {
  return forward(x, AttentionInputs<B>{.cache = cache});
}

template <Backend B> Var<B> MultiHeadAttention<B>::forward(const Var<B>& x, const AttentionInputs<B>& in) const {
  const int64_t pos0 = detail::attention_inputs_check("MultiHeadAttention", x, in, o_.d_model, o_.rope, o_.causal, o_.max_seq_len);
  const int64_t Bn = x.size(0), T = x.size(1), H = o_.n_heads, Hkv = o_.n_kv_heads;
  Var<B> q = q_->forward(x).view({Bn, T, H, hd_}).transpose(1, 2);  // [B, H, T, hd]
  if (o_.rope) q = rope_at(q, pos0, in.positions, o_.rope_theta, rope_.get());
  const auto [k, v] = detail::attention_kv(x, in, *k_, *v_, Hkv, hd_, o_.rope, o_.rope_theta, rope_.get(), pos0, o_.max_seq_len);
  const Var<B> y = attention(q, k, v, o_.causal, pos0, in.key_padding, in.mask);  // [B, H, T, hd]
  return out_->forward(y.transpose(1, 2).reshape({Bn, T, H * hd_}));
}

#define KILN_INST(B)                                                                                                                       \
  template class RopeTable<B>;                                                                                                             \
  template Var<B> rope<B>(const Var<B>&, int64_t, double, const RopeTable<B>*);                                                            \
  template std::pair<Tensor<B>, Tensor<B>> kv_cache_append<B>(KVCache<B>&, const Tensor<B>&, const Tensor<B>&, int64_t);                   \
  template Var<B> attention<B>(const Var<B>&, const Var<B>&, const Var<B>&, bool, int64_t, const Tensor<B>&, const Tensor<B>&, double);    \
  template Var<B> attention_decomposed<B>(const Var<B>&, const Var<B>&, const Var<B>&, bool, int64_t, const Tensor<B>&, const Tensor<B>&,  \
                                          double);                                                                                         \
  template Var<B> rope_rows<B>(const Var<B>&, const Tensor<B>&, const Tensor<B>&);                                                         \
  template Var<B> rope_at<B>(const Var<B>&, int64_t, const Tensor<B>&, double, const RopeTable<B>*);                                       \
  template std::pair<Var<B>, Var<B>> detail::attention_kv<B>(const Var<B>&, const AttentionInputs<B>&, const Linear<B>&, const Linear<B>&, \
                                                             int64_t, int64_t, bool, double, const RopeTable<B>*, int64_t, int64_t);       \
  template std::pair<int64_t, int64_t> detail::row_positions_check<B>(const char*, const RowInputs<B>&, int64_t, int64_t, int64_t);        \
  template int64_t detail::attention_inputs_check<B>(const char*, const Var<B>&, const AttentionInputs<B>&, int64_t, bool, bool, int64_t); \
  template class MultiHeadAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
