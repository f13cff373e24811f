#pragma once
// Differentiable ops on Var<B>: the per-family structs whose bodies live in autograd/ops/<family>.cpp
// (explicitly instantiated for the built-in backends), and the free functions and operators.
// Include autograd/var.hpp (which includes this file).
#include <utility>
#include <vector>

#include "kiln/autograd/var.hpp"
#include "kiln/backends/backends.hpp"
#include "kiln/core/conv_params.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {
namespace autograd {

// autograd/ops/elementwise.cpp
template <Backend B> struct Elementwise {
  using X = Var<B>;
  static X neg(const X& x);
  static X abs(const X& x);
  static X square(const X& x);
  static X exp(const X& x);
  static X log(const X& x);
  static X log1p(const X& x);
  static X expm1(const X& x);
  static X sqrt(const X& x);
  static X rsqrt(const X& x);
  static X reciprocal(const X& x);
  static X sin(const X& x);
  static X cos(const X& x);
  static X tanh(const X& x);
  static X sigmoid(const X& x);
  static X relu(const X& x);
  static X silu(const X& x);
  static X gelu(const X& x, bool tanh_approx);
  static X add(const X& a, const X& b);
  static X sub(const X& a, const X& b);
  static X mul(const X& a, const X& b);
  static X div(const X& a, const X& b);
  static X pow(const X& a, const X& b);
  static X maximum(const X& a, const X& b);
  static X minimum(const X& a, const X& b);
  static X add_scalar(const X& x, Scalar s);
  static X mul_scalar(const X& x, Scalar s);
  static X div_scalar(const X& x, Scalar s);
  static X pow_scalar(const X& x, Scalar s);
  static X rsub_scalar(Scalar s, const X& x);  // s - x
  static X rdiv_scalar(Scalar s, const X& x);  // s / x
  static X maximum_scalar(const X& x, Scalar s);
  static X minimum_scalar(const X& x, Scalar s);
  static X clamp(const X& x, Scalar lo, Scalar hi);
  static X where(const Tensor<B>& cond, const X& a, const X& b);
  static X to(const X& x, DType dtype);
};

// autograd/ops/reduce.cpp
template <Backend B> struct Reduce {
  using X = Var<B>;
  static X sum(const X& x, const std::vector<int64_t>& axes, bool keepdim);
  static X mean(const X& x, const std::vector<int64_t>& axes, bool keepdim);
  static X max(const X& x, const std::vector<int64_t>& axes, bool keepdim);
  static X min(const X& x, const std::vector<int64_t>& axes, bool keepdim);
  static X sum_to(const X& x, const Shape& shape);
};

// autograd/ops/matmul.cpp
template <Backend B> struct Linalg {
  static Var<B> matmul(const Var<B>& a, const Var<B>& b);
  static Var<B> linear(const Var<B>& x, const Var<B>& w, const Var<B>& bias);  // x @ wᵀ + bias (nn::Linear)
};

// autograd/ops/softmax.cpp
template <Backend B> struct SoftmaxOps { static Var<B> softmax(const Var<B>& x, int64_t axis, bool log); };

// autograd/ops/views.cpp
template <Backend B> struct Views {
  using X = Var<B>;
  static X view(const X& x, Shape shape);
  static X reshape(const X& x, Shape shape);
  static X permute(const X& x, std::vector<int64_t> axes);
  static X transpose(const X& x, int64_t a, int64_t b);
  static X t(const X& x);
  static X narrow(const X& x, int64_t axis, int64_t start, int64_t length);
  static X slice(const X& x, int64_t axis, int64_t start, int64_t end, int64_t step);
  static X select(const X& x, int64_t axis, int64_t index);
  static X expand(const X& x, const Shape& shape);
  static X squeeze(const X& x);
  static X squeeze_axis(const X& x, int64_t axis);
  static X unsqueeze(const X& x, int64_t axis);
  static X flatten(const X& x, int64_t start, int64_t end);
  static X contiguous(const X& x);
  static X clone(const X& x);
  static std::vector<X> split(const X& x, int64_t size, int64_t axis);
  static std::vector<X> split_sizes(const X& x, const std::vector<int64_t>& sizes, int64_t axis);
  static std::vector<X> chunk(const X& x, int64_t n, int64_t axis);
  static X cat(const std::vector<X>& xs, int64_t axis);
  static X stack(const std::vector<X>& xs, int64_t axis);
};

// autograd/ops/indexing.cpp
template <Backend B> struct Indexing {
  using X = Var<B>;
  static X gather(const X& x, int64_t axis, const Tensor<B>& index);
  static X index_select(const X& x, int64_t axis, const Tensor<B>& index);
  static X scatter_add(const X& x, int64_t axis, const Tensor<B>& index, const X& src);
  static X index_add(const X& x, int64_t axis, const Tensor<B>& index, const X& src);
};

// autograd/ops/attention.cpp
// Fused softmax attention (core/fused.hpp attention_forward/attention_backward): q [B, H, T, d],
// k [B, Hkv, S, d], v [B, Hkv, S, dv] -> O [B, H, T, dv]. The node saves q, k, v, O and the row
// log-sum-exp (plus the bool key padding and the user's attention mask, as given: broadcastable to
// [B, H, T, S], never expanded), never a [T, S] tensor of its own; backward recomputes the
// probabilities. The mask is not differentiable. AttentionBackward is the node's closure, a named
// type so tests can inspect what is saved (node()->backward.target<AttentionBackward<B>>()).
template <Backend B> struct AttentionBackward {
  Tensor<B> q, k, v, o, lse, key_padding, mask;
  double scale = 1;
  bool causal = false;
  int64_t pos0 = 0;
  double softcap = 0;
  Grads<B> operator()(const Tensor<B>& grad_out) const;
  std::vector<Tensor<B>> saved() const { return {q, k, v, o, lse, key_padding, mask}; }
};
template <Backend B> struct AttentionOps {
  static Var<B> attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, double scale, bool causal, int64_t pos0,
                          const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {}, double softcap = 0);
};

// autograd/ops/diff_attention.cpp
// Fused differential attention (core/fused_diff_attention.hpp): q [B, H, 2, T, d], k [B, Hkv, 2, S, d]
// (axis 2: the two branches), v [B, Hkv, S, dv], lambda one element -> O = FA(q1, k1, v) − λ·FA(q2, k2, v)
// [B, H, T, dv]. The node saves q, k, v, λ, O, O2 = FA(q2, k2, v) and both row log-sum-exps (plus the key
// padding and mask as given); its backward gives q, k, v and λ their gradients in one pass.
template <Backend B> struct DiffAttentionBackward {
  Tensor<B> q, k, v, lam, o, o2, lse1, lse2, key_padding, mask;
  double scale = 1;
  bool causal = false;
  int64_t pos0 = 0;
  Grads<B> operator()(const Tensor<B>& grad_out) const;
  std::vector<Tensor<B>> saved() const { return {q, k, v, lam, o, o2, lse1, lse2, key_padding, mask}; }
};
// With the head-wise norm and output scale in its epilogue: Y = RMSNorm(O)·c·weight per head (weight
// [dv] or undefined), Y [B, H, T, dv] (on Cpu a [B, T, H, dv] block). The node saves what
// DiffAttentionBackward does plus the weight and the rows' rstd [B, H, T]; its backward runs the norm's
// backward and the attention's in one op (fused::diff_attention_norm_backward).
template <Backend B> struct DiffAttentionNormBackward {
  Tensor<B> q, k, v, lam, w, o, o2, lse1, lse2, rstd, key_padding, mask;
  double c = 1, scale = 1;
  bool causal = false;
  int64_t pos0 = 0;
  Grads<B> operator()(const Tensor<B>& grad_out) const;
  std::vector<Tensor<B>> saved() const { return {q, k, v, lam, w, o, o2, lse1, lse2, rstd, key_padding, mask}; }
};
template <Backend B> struct DiffAttentionOps {
  static Var<B> diff_attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, const Var<B>& lambda, double scale, bool causal,
                               int64_t pos0, const Tensor<B>& key_padding = {}, const Tensor<B>& mask = {});
  static Var<B> diff_attention_norm(const Var<B>& q, const Var<B>& k, const Var<B>& v, const Var<B>& lambda, const Var<B>& weight,
                                    double eps, double c, double scale, bool causal, int64_t pos0, const Tensor<B>& key_padding = {},
                                    const Tensor<B>& mask = {});
};

// autograd/ops/conv.cpp
// Convolutions through core/fused_conv.hpp (x [N, C, H, W] or unbatched [C, H, W]); bias may be an
// undefined Var. The node saves x only when w needs a gradient and w only when x does.
template <Backend B> struct ConvOps {
  using X = Var<B>;
  static X conv2d(const X& x, const X& w, const X& bias, const Conv2dParams& p);
  // w [C_in, O/groups, kh, kw]
  static X conv_transpose2d(const X& x, const X& w, const X& bias, const Conv2dParams& p, Size2 output_padding);
};

// autograd/ops/pool.cpp
// Pooling through core/fused_conv.hpp. Max pooling saves the i64 indices (and the input's shape),
// never the input; MaxPool2dBackward is the node's closure, named so tests can inspect it.
template <Backend B> struct MaxPool2dBackward {
  Tensor<B> indices;
  Shape input_shape;
  Pool2dParams p;
  Grads<B> operator()(const Tensor<B>& grad_out) const;
  std::vector<Tensor<B>> saved() const { return {indices}; }
};
template <Backend B> struct PoolOps {
  using X = Var<B>;
  static X max_pool2d(const X& x, const Pool2dParams& p);
  // {y, indices}: indices i64 into each H·W plane (PyTorch's return_indices)
  static std::pair<X, Tensor<B>> max_pool2d_with_indices(const X& x, const Pool2dParams& p);
  static X avg_pool2d(const X& x, const Pool2dParams& p);
  static X adaptive_avg_pool2d(const X& x, Size2 output_size);
};

}  // namespace autograd

// ---------------------------------------------------------------------------------- free functions
template <Backend B> Var<B> operator+(const Var<B>& a, const Var<B>& b) { return a.add(b); }
template <Backend B> Var<B> operator-(const Var<B>& a, const Var<B>& b) { return a.sub(b); }
template <Backend B> Var<B> operator*(const Var<B>& a, const Var<B>& b) { return a.mul(b); }
template <Backend B> Var<B> operator/(const Var<B>& a, const Var<B>& b) { return a.div(b); }
// Var with a constant Tensor (no gradient flows into the Tensor).
template <Backend B> Var<B> operator+(const Var<B>& a, const Tensor<B>& b) { return a.add(Var<B>(b)); }
template <Backend B> Var<B> operator-(const Var<B>& a, const Tensor<B>& b) { return a.sub(Var<B>(b)); }
template <Backend B> Var<B> operator*(const Var<B>& a, const Tensor<B>& b) { return a.mul(Var<B>(b)); }
template <Backend B> Var<B> operator/(const Var<B>& a, const Tensor<B>& b) { return a.div(Var<B>(b)); }
template <Backend B> Var<B> operator+(const Tensor<B>& a, const Var<B>& b) { return Var<B>(a).add(b); }
template <Backend B> Var<B> operator-(const Tensor<B>& a, const Var<B>& b) { return Var<B>(a).sub(b); }
template <Backend B> Var<B> operator*(const Tensor<B>& a, const Var<B>& b) { return Var<B>(a).mul(b); }
template <Backend B> Var<B> operator/(const Tensor<B>& a, const Var<B>& b) { return Var<B>(a).div(b); }
template <Backend B> Var<B> operator+(const Var<B>& a, Scalar s) { return a.add(s); }
template <Backend B> Var<B> operator-(const Var<B>& a, Scalar s) { return a.sub(s); }
template <Backend B> Var<B> operator*(const Var<B>& a, Scalar s) { return a.mul(s); }
template <Backend B> Var<B> operator/(const Var<B>& a, Scalar s) { return a.div(s); }
template <Backend B> Var<B> operator+(Scalar s, const Var<B>& a) { return a.add(s); }
template <Backend B> Var<B> operator-(Scalar s, const Var<B>& a) { return autograd::Elementwise<B>::rsub_scalar(s, a); }
template <Backend B> Var<B> operator*(Scalar s, const Var<B>& a) { return a.mul(s); }
template <Backend B> Var<B> operator/(Scalar s, const Var<B>& a) { return autograd::Elementwise<B>::rdiv_scalar(s, a); }
template <Backend B> Var<B> operator-(const Var<B>& a) { return a.neg(); }

template <Backend B> Var<B> matmul(const Var<B>& a, const Var<B>& b) { return a.matmul(b); }
template <Backend B> Var<B> where(const Tensor<B>& cond, const Var<B>& a, const Var<B>& b) { return Var<B>::where(cond, a, b); }
template <Backend B> Var<B> where(const Tensor<B>& cond, const Var<B>& a, Scalar b) {
  return Var<B>::where(cond, a, Var<B>(Tensor<B>::scalar(b, a.dtype())));
}
template <Backend B> Var<B> where(const Tensor<B>& cond, Scalar a, const Var<B>& b) {
  return Var<B>::where(cond, Var<B>(Tensor<B>::scalar(a, b.dtype())), b);
}
template <Backend B> Var<B> cat(const std::vector<Var<B>>& xs, int64_t axis = 0) { return Var<B>::cat(xs, axis); }
template <Backend B> Var<B> stack(const std::vector<Var<B>>& xs, int64_t axis = 0) { return Var<B>::stack(xs, axis); }

// ---------------------------------------------------------------------------------- instantiation
#define KILN_AUTOGRAD_EXTERN(B)                    \
  extern template class Var<B>;                    \
  extern template struct autograd::Node<B>;        \
  extern template struct autograd::Elementwise<B>; \
  extern template struct autograd::Reduce<B>;      \
  extern template struct autograd::Linalg<B>;      \
  extern template struct autograd::SoftmaxOps<B>;  \
  extern template struct autograd::Views<B>;       \
  extern template struct autograd::Indexing<B>;
KILN_FOR_EACH_BACKEND(KILN_AUTOGRAD_EXTERN)
#undef KILN_AUTOGRAD_EXTERN
#define KILN_AUTOGRAD_ATTN_EXTERN(B)                     \
  extern template struct autograd::AttentionBackward<B>; \
  extern template struct autograd::AttentionOps<B>;
KILN_FOR_EACH_BACKEND(KILN_AUTOGRAD_ATTN_EXTERN)
#undef KILN_AUTOGRAD_ATTN_EXTERN
#define KILN_AUTOGRAD_CONV_EXTERN(B)                     \
  extern template struct autograd::ConvOps<B>;           \
  extern template struct autograd::MaxPool2dBackward<B>; \
  extern template struct autograd::PoolOps<B>;
KILN_FOR_EACH_BACKEND(KILN_AUTOGRAD_CONV_EXTERN)
#undef KILN_AUTOGRAD_CONV_EXTERN

}  // namespace kiln
#pragma GCC visibility pop
