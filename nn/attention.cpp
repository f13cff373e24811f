#include "kiln/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kiln::nn {

template <Backend B>
std::pair<Tensor<B>, Tensor<B>> RopeTable<B>::at(int64_t pos0, int64_t T, int64_t d, double theta, DType dtype) const {
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
  const auto [c, s] = (table ? table : &own)->at(pos0, T, d, theta, x.dtype());
  const Var<B> cs(c), sn(s);
  const Var<B> x0 = x.slice(-1, 0, d, 2), x1 = x.slice(-1, 1, d, 2);  // [..., T, d/2]
  const Var<B> y0 = x0 * cs - x1 * sn;
  const Var<B> y1 = x0 * sn + x1 * cs;
  return Var<B>::stack({y0, y1}, -1).flatten(-2);
}

template <Backend B>
std::pair<Tensor<B>, Tensor<B>> kv_cache_append(KVCache<B>& cache, const Tensor<B>& k, const Tensor<B>& v, int64_t capacity) {
  const int64_t T = k.size(2);
  if (!cache.k.defined()) {
    cache.k = Tensor<B>::zeros({k.size(0), k.size(1), capacity, k.size(3)}, k.dtype());
    cache.v = Tensor<B>::zeros({v.size(0), v.size(1), capacity, v.size(3)}, v.dtype());
    cache.len = 0;
  }
  KILN_CHECK(cache.len + T <= cache.k.size(2), "kv cache: {} cached + {} new positions exceed its capacity {} (max_seq_len)",
             cache.len, T, cache.k.size(2));
  KILN_CHECK(cache.k.size(0) == k.size(0), "kv cache: batch {} differs from the cached batch {}", k.size(0), cache.k.size(0));
  cache.k.narrow(2, cache.len, T).copy_(k);
  cache.v.narrow(2, cache.len, T).copy_(v);
  cache.len += T;
  return {cache.k.narrow(2, 0, cache.len), cache.v.narrow(2, 0, cache.len)};
}

template <Backend B>
Var<B> attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0, const Tensor<B>& key_padding) {
  KILN_CHECK(q.dim() == 4, "attention: q {} must be [B, H, T, d]", shape_str(q.shape()));
  return autograd::AttentionOps<B>::attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(q.size(3))), causal, pos0, key_padding);
}

template <Backend B>
Var<B> attention_decomposed(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal, int64_t pos0, const Tensor<B>& key_padding) {
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q {}, k {}, v {} must be [B, H, T, d]", shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()));
  const int64_t Bn = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), dv = v.size(3);
  KILN_CHECK(k.size(0) == Bn && v.size(0) == Bn && k.size(3) == d && v.size(1) == Hkv && v.size(2) == S && Hkv >= 1 && H % Hkv == 0,
             "attention: q {}, k {}, v {} do not fit (H must be a multiple of Hkv, widths and lengths must agree)",
             shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  Var<B> kk = k, vv = v;
  if (Hkv != H) {  // each kv head serves H/Hkv consecutive query heads
    const int64_t rep = H / Hkv;
    kk = k.unsqueeze(2).expand({Bn, Hkv, rep, S, d}).reshape({Bn, H, S, d});
    vv = v.unsqueeze(2).expand({Bn, Hkv, rep, S, dv}).reshape({Bn, H, S, dv});
  }
  Var<B> s = q.matmul(kk.transpose(-1, -2)).div(std::sqrt(static_cast<double>(d)));  // [B, H, T, S]
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
  return s.softmax(-1).matmul(vv);  // [B, H, T, dv]
}

template <Backend B> MultiHeadAttention<B>::MultiHeadAttention(AttentionOptions o) : o_(o) {
  if (o_.n_kv_heads == 0) o_.n_kv_heads = o_.n_heads;
  KILN_CHECK(o_.n_heads >= 1 && o_.d_model % o_.n_heads == 0, "MultiHeadAttention: d_model {} must be divisible by n_heads {}",
             o_.d_model, o_.n_heads);
  KILN_CHECK(o_.n_kv_heads >= 1 && o_.n_heads % o_.n_kv_heads == 0,
             "MultiHeadAttention: n_heads {} must be a multiple of n_kv_heads {}", o_.n_heads, o_.n_kv_heads);
  hd_ = o_.d_model / o_.n_heads;
  KILN_CHECK(!o_.rope || hd_ % 2 == 0, "MultiHeadAttention: RoPE needs an even head width, got d_model/n_heads = {}", hd_);
  const int64_t D = o_.d_model;
  auto lin = [&](int64_t in, int64_t out) { return std::make_shared<Linear<B>>(LinearOptions{.in = in, .out = out, .dtype = o_.dtype}); };
  q_ = this->register_module("q_proj", lin(D, o_.n_heads * hd_));
  k_ = this->register_module("k_proj", lin(D, o_.n_kv_heads * hd_));
  v_ = this->register_module("v_proj", lin(D, o_.n_kv_heads * hd_));
  out_ = this->register_module("out_proj", lin(o_.n_heads * hd_, D));
}

template <Backend B> Var<B> MultiHeadAttention<B>::forward(const Var<B>& x, KVCache<B>* cache) const {
  KILN_CHECK(x.dim() == 3 && x.size(2) == o_.d_model, "MultiHeadAttention: input {} must be [B, T, {}]", shape_str(x.shape()),
             o_.d_model);
  const int64_t Bn = x.size(0), T = x.size(1), H = o_.n_heads, Hkv = o_.n_kv_heads;
  const int64_t pos0 = cache ? cache->len : 0;
  KILN_CHECK(pos0 + T <= o_.max_seq_len, "MultiHeadAttention: sequence of {} positions exceeds max_seq_len {}", pos0 + T,
             o_.max_seq_len);
  Var<B> q = q_->forward(x).view({Bn, T, H, hd_}).transpose(1, 2);  // [B, H, T, hd]
  Var<B> k = k_->forward(x).view({Bn, T, Hkv, hd_}).transpose(1, 2);
  Var<B> v = v_->forward(x).view({Bn, T, Hkv, hd_}).transpose(1, 2);
  if (o_.rope) {
    q = rope(q, pos0, o_.rope_theta, rope_.get());
    k = rope(k, pos0, o_.rope_theta, rope_.get());
  }
  if (cache) {
    auto [kc, vc] = kv_cache_append(*cache, k.value(), v.value(), o_.max_seq_len);
    k = Var<B>(kc);
    v = Var<B>(vc);
  }
  const Var<B> y = attention(q, k, v, true, pos0);  // [B, H, T, hd]
  return out_->forward(y.transpose(1, 2).reshape({Bn, T, H * hd_}));
}

#define KILN_INST(B)                                                                                                 \
  template class RopeTable<B>;                                                                                       \
  template Var<B> rope<B>(const Var<B>&, int64_t, double, const RopeTable<B>*);                                     \
  template std::pair<Tensor<B>, Tensor<B>> kv_cache_append<B>(KVCache<B>&, const Tensor<B>&, const Tensor<B>&, int64_t); \
  template Var<B> attention<B>(const Var<B>&, const Var<B>&, const Var<B>&, bool, int64_t, const Tensor<B>&);                         \
  template Var<B> attention_decomposed<B>(const Var<B>&, const Var<B>&, const Var<B>&, bool, int64_t, const Tensor<B>&);              \
  template class MultiHeadAttention<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
