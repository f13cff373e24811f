#pragma once
// Member bodies of Tensor<B>. Include this only where a backend is instantiated:
//   #include "kiln/core/tensor_impl.hpp"
//   template class kiln::Tensor<MyBackend>;
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "kiln/core/fused.hpp"
#include "kiln/core/profile.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

namespace detail {
inline std::string dims_str(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
}  // namespace detail

// ====================================================================================== factories
template <Backend B> Tensor<B> Tensor<B>::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) KILN_CHECK(d >= 0, "empty: negative dimension in shape {}", shape_str(shape));
  const size_t bytes = static_cast<size_t>(kiln::numel(shape)) * dtype_size(dtype);
  return Tensor(B::allocate(bytes), Layout(shape), dtype);
}

template <Backend B> Tensor<B> Tensor<B>::empty_like_layout(const Shape& shape, DType dtype) const {
  KILN_CHECK(static_cast<int64_t>(shape.size()) == dim(), "empty_like_layout: shape {} for a tensor of shape {}", shape_str(shape),
             shape_str(this->shape()));
  std::vector<int64_t> order(shape.size());  // the axes from the outermost in memory to the innermost
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return layout_.strides[static_cast<size_t>(a)] > layout_.strides[static_cast<size_t>(b)]; });
  Shape ps(shape.size());
  std::vector<int64_t> inverse(shape.size());
  for (size_t i = 0; i < order.size(); ++i) {
    ps[i] = shape[static_cast<size_t>(order[i])];
    inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  }
  return empty(ps, dtype).permute(inverse);
}

template <Backend B> Tensor<B> Tensor<B>::full(const Shape& shape, Scalar value, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.numel()) KILN_PROFILED("fill", t) B::fill(t.mview(), value);
  return t;
}
template <Backend B> Tensor<B> Tensor<B>::zeros(const Shape& shape, DType dtype) { return full(shape, 0, dtype); }
template <Backend B> Tensor<B> Tensor<B>::ones(const Shape& shape, DType dtype) { return full(shape, 1, dtype); }
template <Backend B> Tensor<B> Tensor<B>::scalar(Scalar value, DType dtype) { return full({}, value, dtype); }

template <Backend B> Tensor<B> Tensor<B>::arange(double start, double end, double step, DType dtype) {
  KILN_CHECK(step != 0.0, "arange: step must be non-zero");
  KILN_CHECK((end - start) * step >= 0.0, "arange: range [{}, {}) is empty or wrong-signed for step {}", start, end, step);
  const auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i) * step;
  return from_vector(v).to(dtype);
}

template <Backend B> Tensor<B> Tensor<B>::uniform(const Shape& shape, double lo, double hi, DType dtype, Generator* gen) {
  Tensor t = empty(shape, dtype);
  return t.uniform_(lo, hi, gen);
}
template <Backend B> Tensor<B> Tensor<B>::normal(const Shape& shape, double mean, double std, DType dtype, Generator* gen) {
  Tensor t = empty(shape, dtype);
  return t.normal_(mean, std, gen);
}
template <Backend B> Tensor<B> Tensor<B>::rand(const Shape& shape, DType dtype, Generator* gen) {
  return uniform(shape, 0.0, 1.0, dtype, gen);
}
template <Backend B> Tensor<B> Tensor<B>::randn(const Shape& shape, DType dtype, Generator* gen) {
  return normal(shape, 0.0, 1.0, dtype, gen);
}

template <Backend B> Tensor<B>& Tensor<B>::uniform_(double lo, double hi, Generator* gen) {
  check_writable("uniform_");
  KILN_CHECK(is_floating(dtype_), "uniform_: needs a float dtype, got {}", dtype_);
  Generator& g = gen ? *gen : default_generator();
  const uint64_t off = g.advance(static_cast<uint64_t>(numel()));
  if (numel()) KILN_PROFILED("uniform_", *this) B::rand_uniform(mview(), g.seed(), off, lo, hi);
  return *this;
}
template <Backend B> Tensor<B>& Tensor<B>::normal_(double mean, double std, Generator* gen) {
  check_writable("normal_");
  KILN_CHECK(is_floating(dtype_), "normal_: needs a float dtype, got {}", dtype_);
  Generator& g = gen ? *gen : default_generator();
  const uint64_t off = g.advance(static_cast<uint64_t>(numel()));
  if (numel()) KILN_PROFILED("normal_", *this) B::rand_normal(mview(), g.seed(), off, mean, std);
  return *this;
}

template <Backend B> Tensor<B> Tensor<B>::from_blob(const void* data, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(dtype);
  if (bytes) KILN_PROFILED("copy_from_host", t) B::write(*t.storage_, 0, data, bytes);
  return t;
}

template <Backend B> void Tensor<B>::copy_to_host(void* dst, size_t bytes) const {
  KILN_CHECK(is_contiguous(), "copy_to_host: tensor of shape {} is not contiguous", shape_str(shape()));
  const size_t have = static_cast<size_t>(numel()) * dtype_size(dtype_);
  KILN_CHECK(bytes == have, "copy_to_host: asked for {} bytes, tensor {} {} holds {}", bytes, shape_str(shape()), dtype_, have);
  if (bytes) KILN_PROFILED("copy_to_host", *this) B::read(*storage_, static_cast<size_t>(layout_.offset) * dtype_size(dtype_), dst, bytes);
}

// ====================================================================================== metadata
template <Backend B> int64_t Tensor<B>::size(int64_t axis) const {
  const int a = normalize_axis(axis, dim(), "size", shape());
  return dim() == 0 ? 1 : shape()[static_cast<size_t>(a)];
}

template <Backend B> void Tensor<B>::check_writable(const char* op) const {
  KILN_CHECK(defined(), "{}: undefined tensor", op);
  for (int64_t i = 0; i < dim(); ++i) {
    const auto u = static_cast<size_t>(i);
    KILN_CHECK(!(layout_.strides[u] == 0 && layout_.shape[u] > 1),
               "{}: cannot write in place into an expanded (broadcast) tensor of shape {} (strides {})", op, shape_str(shape()),
               detail::dims_str(strides()));
  }
}

// ====================================================================================== views
namespace detail {
inline Shape infer_shape(Shape s, int64_t n, const Shape& from, const char* op) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      KILN_CHECK(infer < 0, "{}: more than one -1 in {}", op, shape_str(s));
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(s[i] >= 0, "{}: invalid dimension {} in {}", op, s[i], shape_str(s));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && n % known == 0, "{}: cannot reshape {} ({} elements) into {}", op, shape_str(from), n, shape_str(s));
    s[static_cast<size_t>(infer)] = n / known;
  }
  KILN_CHECK(kiln::numel(s) == n, "{}: cannot reshape {} ({} elements) into {} ({} elements)", op, shape_str(from), n, shape_str(s),
             kiln::numel(s));
  return s;
}

// Strides for viewing `l` as `shape` without a copy; false if impossible (PyTorch's computeStride:
// walk the old dims in chunks that are contiguous among themselves, match view dims to each chunk).
inline bool view_strides(const Layout& l, const Shape& shape, Strides& out) {
  out.assign(shape.size(), 0);
  if (l.numel() == 0 || l.rank() == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_stride = l.strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = l.rank() - 1; d >= 0; --d) {
    const auto ud = static_cast<size_t>(d);
    tensor_numel *= l.shape[ud];
    if (d == 0 || (l.shape[ud - 1] != 1 && l.strides[ud - 1] != tensor_numel * chunk_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[static_cast<size_t>(view_d)] == 1)) {
        out[static_cast<size_t>(view_d)] = view_numel * chunk_stride;
        view_numel *= shape[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_stride = l.strides[ud - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace detail

template <Backend B> Tensor<B> Tensor<B>::view(Shape s) const {
  KILN_CHECK(defined(), "view: undefined tensor");
  s = detail::infer_shape(std::move(s), numel(), shape(), "view");
  Strides st;
  KILN_CHECK(detail::view_strides(layout_, s, st), "view: tensor of shape {} with strides {} cannot be viewed as {}; use reshape",
             shape_str(shape()), detail::dims_str(strides()), shape_str(s));
  return Tensor(storage_, Layout(s, st, layout_.offset), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::reshape(Shape s) const {
  KILN_CHECK(defined(), "reshape: undefined tensor");
  s = detail::infer_shape(std::move(s), numel(), shape(), "reshape");
  Strides st;
  if (detail::view_strides(layout_, s, st)) return Tensor(storage_, Layout(s, st, layout_.offset), dtype_);
  return clone().view(s);
}

template <Backend B> Tensor<B> Tensor<B>::permute(std::vector<int64_t> axes) const {
  KILN_CHECK(static_cast<int64_t>(axes.size()) == dim(), "permute: {} axes {} for shape {}", axes.size(), detail::dims_str(axes),
             shape_str(shape()));
  std::vector<bool> seen(axes.size(), false);
  Shape s(axes.size());
  Strides st(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    const auto a = static_cast<size_t>(normalize_axis(axes[i], dim(), "permute", shape()));
    KILN_CHECK(!seen[a], "permute: axis {} repeated in {}", a, detail::dims_str(axes));
    seen[a] = true;
    s[i] = layout_.shape[a];
    st[i] = layout_.strides[a];
  }
  return Tensor(storage_, Layout(s, st, layout_.offset), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::transpose(int64_t a, int64_t b) const {
  const auto ua = static_cast<size_t>(normalize_axis(a, dim(), "transpose", shape()));
  const auto ub = static_cast<size_t>(normalize_axis(b, dim(), "transpose", shape()));
  if (dim() == 0) return *this;
  Layout l = layout_;
  std::swap(l.shape[ua], l.shape[ub]);
  std::swap(l.strides[ua], l.strides[ub]);
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::t() const {
  KILN_CHECK(dim() <= 2, "t: expects a tensor of rank <= 2, got shape {}", shape_str(shape()));
  return dim() < 2 ? *this : transpose(0, 1);
}

template <Backend B> Tensor<B> Tensor<B>::narrow(int64_t axis, int64_t start, int64_t length) const {
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "narrow", shape()));
  KILN_CHECK(dim() > 0, "narrow: cannot narrow a 0-dim tensor");
  const int64_t n = layout_.shape[a];
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start {} length {} out of range for axis {} of shape {}", start,
             length, axis, shape_str(shape()));
  Layout l = layout_;
  l.shape[a] = length;
  l.offset += start * l.strides[a];
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::slice(int64_t axis, int64_t start, int64_t end, int64_t step) const {
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "slice", shape()));
  KILN_CHECK(dim() > 0, "slice: cannot slice a 0-dim tensor");
  KILN_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t n = layout_.shape[a];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Layout l = layout_;
  l.shape[a] = (end - start + step - 1) / step;
  l.offset += start * l.strides[a];
  l.strides[a] *= step;
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::select(int64_t axis, int64_t index) const {
  KILN_CHECK(dim() > 0, "select: cannot select from a 0-dim tensor");
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "select", shape()));
  const int64_t n = layout_.shape[a];
  KILN_CHECK(index >= -n && index < n, "select: index {} out of range for axis {} of shape {}", index, axis, shape_str(shape()));
  if (index < 0) index += n;
  Layout l = layout_;
  l.offset += index * l.strides[a];
  l.shape.erase(l.shape.begin() + static_cast<std::ptrdiff_t>(a));
  l.strides.erase(l.strides.begin() + static_cast<std::ptrdiff_t>(a));
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::expand(const Shape& target) const {
  KILN_CHECK(target.size() >= shape().size(), "expand: cannot expand {} to fewer dims {}", shape_str(shape()), shape_str(target));
  const size_t lead = target.size() - shape().size();
  Layout l;
  l.offset = layout_.offset;
  l.shape.resize(target.size());
  l.strides.resize(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(target[i] >= 0, "expand: cannot use -1 for a new leading dim in {}", shape_str(target));
      l.shape[i] = target[i];
      l.strides[i] = 0;
      continue;
    }
    const int64_t have = layout_.shape[i - lead];
    const int64_t want = target[i] == -1 ? have : target[i];
    KILN_CHECK(want >= 0, "expand: invalid size {} in {} (sizes are >= 0, or -1 to keep)", target[i], shape_str(target));
    KILN_CHECK(have == want || have == 1, "expand: cannot expand {} to {} (dim {}: {} -> {})", shape_str(shape()), shape_str(target), i,
               have, want);
    l.shape[i] = want;
    l.strides[i] = have == want ? layout_.strides[i - lead] : 0;
  }
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::squeeze() const {
  Layout l;
  l.offset = layout_.offset;
  for (size_t i = 0; i < shape().size(); ++i)
    if (layout_.shape[i] != 1) {
      l.shape.push_back(layout_.shape[i]);
      l.strides.push_back(layout_.strides[i]);
    }
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::squeeze(int64_t axis) const {
  if (dim() == 0) {
    normalize_axis(axis, 0, "squeeze", shape());
    return *this;
  }
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "squeeze", shape()));
  if (layout_.shape[a] != 1) return *this;  // PyTorch: no-op on a non-1 dim
  Layout l = layout_;
  l.shape.erase(l.shape.begin() + static_cast<std::ptrdiff_t>(a));
  l.strides.erase(l.strides.begin() + static_cast<std::ptrdiff_t>(a));
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::unsqueeze(int64_t axis) const {
  const auto a = static_cast<size_t>(normalize_axis(axis, dim() + 1, "unsqueeze", shape()));
  Layout l = layout_;
  const int64_t st = a < l.shape.size() ? l.strides[a] * l.shape[a] : 1;
  l.shape.insert(l.shape.begin() + static_cast<std::ptrdiff_t>(a), 1);
  l.strides.insert(l.strides.begin() + static_cast<std::ptrdiff_t>(a), st);
  return Tensor(storage_, std::move(l), dtype_);
}

template <Backend B> Tensor<B> Tensor<B>::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  const auto s = static_cast<size_t>(normalize_axis(start, dim(), "flatten", shape()));
  const auto e = static_cast<size_t>(normalize_axis(end, dim(), "flatten", shape()));
  KILN_CHECK(s <= e, "flatten: start axis {} after end axis {} for shape {}", start, end, shape_str(shape()));
  Shape out(shape().begin(), shape().begin() + static_cast<std::ptrdiff_t>(s));
  int64_t n = 1;
  for (size_t i = s; i <= e; ++i) n *= shape()[i];
  out.push_back(n);
  out.insert(out.end(), shape().begin() + static_cast<std::ptrdiff_t>(e) + 1, shape().end());
  return reshape(out);
}

template <Backend B> Tensor<B> Tensor<B>::contiguous() const {
  KILN_CHECK(defined(), "contiguous: undefined tensor");
  return is_contiguous() ? *this : clone();
}

template <Backend B> Tensor<B> Tensor<B>::clone() const {
  KILN_CHECK(defined(), "clone: undefined tensor");
  Tensor out = empty(shape(), dtype_);
  if (numel()) KILN_PROFILED("copy", out, *this) B::copy(out.mview(), cview());
  return out;
}

template <Backend B> Tensor<B> Tensor<B>::to(DType dtype) const {
  KILN_CHECK(defined(), "to: undefined tensor");
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape(), dtype);
  if (numel()) KILN_PROFILED("to", out, *this) B::copy(out.mview(), cview());
  return out;
}

// ====================================================================================== elementwise
// map<Op>, zip<Op> and binary_op<Op> live in core/tensor.hpp: member templates are not emitted by the
// explicit instantiation of the class, so user code must be able to instantiate them itself.

template <Backend B> Tensor<B> Tensor<B>::neg() const { return map<op::Neg>(); }
template <Backend B> Tensor<B> Tensor<B>::abs() const { return map<op::Abs>(); }
template <Backend B> Tensor<B> Tensor<B>::square() const { return map<op::Square>(); }
template <Backend B> Tensor<B> Tensor<B>::sign() const { return map<op::Sign>(); }
template <Backend B> Tensor<B> Tensor<B>::exp() const { return map<op::Exp>(); }
template <Backend B> Tensor<B> Tensor<B>::log() const { return map<op::Log>(); }
template <Backend B> Tensor<B> Tensor<B>::log1p() const { return map<op::Log1p>(); }
template <Backend B> Tensor<B> Tensor<B>::expm1() const { return map<op::Expm1>(); }
template <Backend B> Tensor<B> Tensor<B>::sqrt() const { return map<op::Sqrt>(); }
template <Backend B> Tensor<B> Tensor<B>::rsqrt() const { return map<op::Rsqrt>(); }
template <Backend B> Tensor<B> Tensor<B>::reciprocal() const { return map<op::Recip>(); }
template <Backend B> Tensor<B> Tensor<B>::sin() const { return map<op::Sin>(); }
template <Backend B> Tensor<B> Tensor<B>::cos() const { return map<op::Cos>(); }
template <Backend B> Tensor<B> Tensor<B>::tanh() const { return map<op::Tanh>(); }
template <Backend B> Tensor<B> Tensor<B>::sigmoid() const { return map<op::Sigmoid>(); }
template <Backend B> Tensor<B> Tensor<B>::relu() const { return map<op::Relu>(); }
template <Backend B> Tensor<B> Tensor<B>::silu() const { return map<op::Silu>(); }
template <Backend B> Tensor<B> Tensor<B>::gelu(bool tanh_approx) const { return tanh_approx ? map<op::GeluTanh>() : map<op::Gelu>(); }

template <Backend B> template <class Op> Tensor<B> Tensor<B>::scalar_op(Scalar s) const {
  KILN_CHECK(defined(), "{}: undefined tensor", Op::name);
  return binary_op<Op>(full({}, s, dtype_));
}

template <Backend B> Tensor<B> Tensor<B>::add(const Tensor& o) const { return binary_op<op::Add>(o); }
template <Backend B> Tensor<B> Tensor<B>::sub(const Tensor& o) const { return binary_op<op::Sub>(o); }
template <Backend B> Tensor<B> Tensor<B>::mul(const Tensor& o) const { return binary_op<op::Mul>(o); }
template <Backend B> Tensor<B> Tensor<B>::div(const Tensor& o) const { return binary_op<op::Div>(o); }
template <Backend B> Tensor<B> Tensor<B>::pow(const Tensor& o) const { return binary_op<op::Pow>(o); }
template <Backend B> Tensor<B> Tensor<B>::maximum(const Tensor& o) const { return binary_op<op::Maximum>(o); }
template <Backend B> Tensor<B> Tensor<B>::minimum(const Tensor& o) const { return binary_op<op::Minimum>(o); }
template <Backend B> Tensor<B> Tensor<B>::add(Scalar s) const { return scalar_op<op::Add>(s); }
template <Backend B> Tensor<B> Tensor<B>::sub(Scalar s) const { return scalar_op<op::Sub>(s); }
template <Backend B> Tensor<B> Tensor<B>::mul(Scalar s) const { return scalar_op<op::Mul>(s); }
template <Backend B> Tensor<B> Tensor<B>::div(Scalar s) const { return scalar_op<op::Div>(s); }
template <Backend B> Tensor<B> Tensor<B>::pow(Scalar s) const { return scalar_op<op::Pow>(s); }
template <Backend B> Tensor<B> Tensor<B>::maximum(Scalar s) const { return scalar_op<op::Maximum>(s); }
template <Backend B> Tensor<B> Tensor<B>::minimum(Scalar s) const { return scalar_op<op::Minimum>(s); }
template <Backend B> Tensor<B> Tensor<B>::clamp(Scalar lo, Scalar hi) const { return maximum(lo).minimum(hi); }
template <Backend B> Tensor<B> Tensor<B>::eq(const Tensor& o) const { return binary_op<op::Eq>(o); }
template <Backend B> Tensor<B> Tensor<B>::ne(const Tensor& o) const { return binary_op<op::Ne>(o); }
template <Backend B> Tensor<B> Tensor<B>::lt(const Tensor& o) const { return binary_op<op::Lt>(o); }
template <Backend B> Tensor<B> Tensor<B>::le(const Tensor& o) const { return binary_op<op::Le>(o); }
template <Backend B> Tensor<B> Tensor<B>::gt(const Tensor& o) const { return binary_op<op::Gt>(o); }
template <Backend B> Tensor<B> Tensor<B>::ge(const Tensor& o) const { return binary_op<op::Ge>(o); }
template <Backend B> Tensor<B> Tensor<B>::eq(Scalar s) const { return scalar_op<op::Eq>(s); }
template <Backend B> Tensor<B> Tensor<B>::ne(Scalar s) const { return scalar_op<op::Ne>(s); }
template <Backend B> Tensor<B> Tensor<B>::lt(Scalar s) const { return scalar_op<op::Lt>(s); }
template <Backend B> Tensor<B> Tensor<B>::le(Scalar s) const { return scalar_op<op::Le>(s); }
template <Backend B> Tensor<B> Tensor<B>::gt(Scalar s) const { return scalar_op<op::Gt>(s); }
template <Backend B> Tensor<B> Tensor<B>::ge(Scalar s) const { return scalar_op<op::Ge>(s); }
template <Backend B> Tensor<B> Tensor<B>::logical_and(const Tensor& o) const { return binary_op<op::LogicalAnd>(o); }
template <Backend B> Tensor<B> Tensor<B>::logical_or(const Tensor& o) const { return binary_op<op::LogicalOr>(o); }
template <Backend B> Tensor<B> Tensor<B>::logical_not() const { return scalar_op<op::Eq>(0); }

template <Backend B> Tensor<B> Tensor<B>::where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  KILN_CHECK(cond.defined() && a.defined() && b.defined(), "where: undefined tensor");
  KILN_CHECK(cond.dtype() == DType::boolean, "where: condition must be bool, got {} (shape {})", cond.dtype(), shape_str(cond.shape()));
  KILN_CHECK(a.dtype() == b.dtype(), "where: dtype mismatch {} vs {} (shapes {} and {})", a.dtype(), b.dtype(), shape_str(a.shape()),
             shape_str(b.shape()));
  const Shape s = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  const Tensor c2 = cond.expand(s), a2 = a.expand(s), b2 = b.expand(s);
  Tensor out = empty(s, a.dtype());
  if (out.numel()) KILN_PROFILED("where", out, c2, a2, b2) B::where(out.mview(), c2.cview(), a2.cview(), b2.cview());
  return out;
}

// ====================================================================================== in place
template <Backend B> Tensor<B>& Tensor<B>::fill_(Scalar value) {
  check_writable("fill_");
  if (numel()) KILN_PROFILED("fill", *this) B::fill(mview(), value);
  return *this;
}

template <Backend B> Tensor<B>& Tensor<B>::copy_(const Tensor& src) {
  check_writable("copy_");
  KILN_CHECK(src.defined(), "copy_: undefined source");
  const Tensor s = src.shape() == shape() ? src : src.expand(shape());
  if (numel()) KILN_PROFILED("copy", *this, s) B::copy(mview(), s.cview());
  return *this;
}

template <Backend B> template <class Op> Tensor<B>& Tensor<B>::inplace_op(const Tensor& o) {
  check_writable(Op::name);
  KILN_CHECK(o.defined(), "{}_: undefined tensor", Op::name);
  KILN_CHECK(dtype_ == o.dtype_, "{}_: dtype mismatch {} vs {} (shapes {} and {})", Op::name, dtype_, o.dtype_, shape_str(shape()),
             shape_str(o.shape()));
  KILN_CHECK(dtype_ != DType::boolean, "{}_: not defined for bool tensors", Op::name);
  const Shape s = broadcast_shapes(shape(), o.shape(), Op::name);
  KILN_CHECK(s == shape(), "{}_: result shape {} of broadcasting {} with {} differs from the in-place target", Op::name, shape_str(s),
             shape_str(shape()), shape_str(o.shape()));
  const Tensor b = o.shape() == s ? o : o.expand(s);
  if (numel()) KILN_PROFILED(Op::name, *this, *this, b) B::template binary<Op>(mview(), cview(), b.cview());
  return *this;
}
template <Backend B> Tensor<B>& Tensor<B>::add_(const Tensor& o) { return inplace_op<op::Add>(o); }
template <Backend B> Tensor<B>& Tensor<B>::sub_(const Tensor& o) { return inplace_op<op::Sub>(o); }
template <Backend B> Tensor<B>& Tensor<B>::mul_(const Tensor& o) { return inplace_op<op::Mul>(o); }
template <Backend B> Tensor<B>& Tensor<B>::div_(const Tensor& o) { return inplace_op<op::Div>(o); }
template <Backend B> Tensor<B>& Tensor<B>::add_(Scalar s) { return inplace_op<op::Add>(full({}, s, dtype_)); }
template <Backend B> Tensor<B>& Tensor<B>::mul_(Scalar s) { return inplace_op<op::Mul>(full({}, s, dtype_)); }

// ====================================================================================== reductions
namespace detail {
// Sorted, unique, normalised axes; all axes when empty.
inline std::vector<int> reduce_axes(const std::vector<int64_t>& axes, const Shape& shape, const char* op) {
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) {
    const int n = normalize_axis(a, rank, op, shape);
    KILN_CHECK(std::find(out.begin(), out.end(), n) == out.end(), "{}: axis {} repeated in {}", op, a, dims_str(axes));
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  if (rank == 0) out.clear();
  return out;
}
}  // namespace detail

template <Backend B> template <class Op> Tensor<B> Tensor<B>::reduce_op(const std::vector<int64_t>& axes, bool keepdim) const {
  KILN_CHECK(defined(), "{}: undefined tensor", Op::name);
  const std::vector<int> ax = detail::reduce_axes(axes, shape(), Op::name);
  Tensor x = *this;
  if constexpr (std::is_same_v<Op, op::Sum> || std::is_same_v<Op, op::Prod>) {
    if (!is_floating(dtype_)) x = x.to(DType::i64);
  } else {
    KILN_CHECK(dtype_ != DType::boolean, "{}: not defined for bool tensors", Op::name);
    for (int a : ax)
      KILN_CHECK(shape()[static_cast<size_t>(a)] > 0, "{}: cannot reduce over the empty axis {} of shape {}", Op::name, a,
                 shape_str(shape()));
  }
  for (int a : ax) {
    Shape s = x.shape();
    s[static_cast<size_t>(a)] = 1;
    Tensor out = empty(s, x.dtype());
    if (out.numel()) {
      if (x.numel())
        KILN_PROFILED(Op::name, out, x) B::template reduce<Op>(out.mview(), x.cview(), a);
      else
        KILN_PROFILED("fill", out) B::fill(out.mview(), std::is_same_v<Op, op::Prod> ? 1 : 0);
    }
    x = out;
  }
  if (!keepdim) {
    for (size_t i = ax.size(); i-- > 0;) x = x.squeeze(ax[i]);
  }
  return x;
}

template <Backend B> Tensor<B> Tensor<B>::sum(const std::vector<int64_t>& axes, bool keepdim) const {
  return reduce_op<op::Sum>(axes, keepdim);
}
template <Backend B> Tensor<B> Tensor<B>::prod(const std::vector<int64_t>& axes, bool keepdim) const {
  return reduce_op<op::Prod>(axes, keepdim);
}
template <Backend B> Tensor<B> Tensor<B>::max(const std::vector<int64_t>& axes, bool keepdim) const {
  return reduce_op<op::Max>(axes, keepdim);
}
template <Backend B> Tensor<B> Tensor<B>::min(const std::vector<int64_t>& axes, bool keepdim) const {
  return reduce_op<op::Min>(axes, keepdim);
}
template <Backend B> Tensor<B> Tensor<B>::mean(const std::vector<int64_t>& axes, bool keepdim) const {
  KILN_CHECK(defined(), "mean: undefined tensor");
  KILN_CHECK(is_floating(dtype_), "mean: needs a float dtype, got {} (shape {})", dtype_, shape_str(shape()));
  int64_t n = 1;
  for (int a : detail::reduce_axes(axes, shape(), "mean")) n *= shape()[static_cast<size_t>(a)];
  return sum(axes, keepdim).div(Scalar(static_cast<double>(n)));  // empty: 0/0 = nan, like PyTorch
}

template <Backend B> template <class Op> Tensor<B> Tensor<B>::index_reduce_op(int64_t axis, bool keepdim) const {
  KILN_CHECK(defined(), "{}: undefined tensor", Op::name);
  KILN_CHECK(dtype_ != DType::boolean, "{}: not defined for bool tensors", Op::name);
  if (dim() == 0) return zeros({}, DType::i64);
  const int a = normalize_axis(axis, dim(), Op::name, shape());
  KILN_CHECK(shape()[static_cast<size_t>(a)] > 0, "{}: cannot reduce over the empty axis {} of shape {}", Op::name, a, shape_str(shape()));
  Shape s = shape();
  s[static_cast<size_t>(a)] = 1;
  Tensor out = empty(s, DType::i64);
  if (out.numel()) KILN_PROFILED(Op::name, out, *this) B::template reduce<Op>(out.mview(), cview(), a);
  return keepdim ? out : out.squeeze(a);
}
template <Backend B> Tensor<B> Tensor<B>::argmax(int64_t axis, bool keepdim) const { return index_reduce_op<op::ArgMax>(axis, keepdim); }
template <Backend B> Tensor<B> Tensor<B>::argmin(int64_t axis, bool keepdim) const { return index_reduce_op<op::ArgMin>(axis, keepdim); }
template <Backend B> Tensor<B> Tensor<B>::argmax() const { return reshape({-1}).argmax(0, false); }

template <Backend B> Tensor<B> Tensor<B>::sum_to(const Shape& target) const {
  if (shape() == target) return *this;
  KILN_CHECK(target.size() <= shape().size(), "sum_to: cannot sum {} to the larger rank {}", shape_str(shape()), shape_str(target));
  const size_t lead = shape().size() - target.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < shape().size(); ++i) {
    if (i < lead) {
      axes.push_back(static_cast<int64_t>(i));
    } else if (target[i - lead] == 1 && shape()[i] != 1) {
      axes.push_back(static_cast<int64_t>(i));
    } else {
      KILN_CHECK(target[i - lead] == shape()[i], "sum_to: {} is not broadcastable to {}", shape_str(target), shape_str(shape()));
    }
  }
  Tensor r = sum(axes, true);
  return r.reshape(target);
}

// ====================================================================================== matmul
template <Backend B> Tensor<B> Tensor<B>::matmul(const Tensor& o) const {
  KILN_CHECK(defined() && o.defined(), "matmul: undefined tensor");
  KILN_CHECK(dim() >= 1 && o.dim() >= 1, "matmul: both operands need rank >= 1, got {} @ {}", shape_str(shape()), shape_str(o.shape()));
  KILN_CHECK(dtype_ == o.dtype_, "matmul: dtype mismatch {} vs {} ({} @ {})", dtype_, o.dtype_, shape_str(shape()), shape_str(o.shape()));
  KILN_CHECK(is_floating(dtype_), "matmul: needs a float dtype, got {} ({} @ {})", dtype_, shape_str(shape()), shape_str(o.shape()));
  Tensor a = dim() == 1 ? unsqueeze(0) : *this;
  Tensor b = o.dim() == 1 ? o.unsqueeze(1) : o;
  const int64_t M = a.size(-2), K = a.size(-1), K2 = b.size(-2), N = b.size(-1);
  KILN_CHECK(K == K2, "matmul: {} @ {}: inner dims {} != {}", shape_str(shape()), shape_str(o.shape()), K, K2);
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(ab, bb, "matmul");
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  so.insert(so.end(), {M, N});
  a = a.expand(sa);
  b = b.expand(sb);
  Tensor out = empty(so, dtype_);
  if (out.numel()) {
    if (K == 0)
      KILN_PROFILED("fill", out) B::fill(out.mview(), 0);
    else
      KILN_PROFILED_FLOPS("matmul", 2.0 * static_cast<double>(out.numel()) * static_cast<double>(K), out, a, b)
    B::matmul(out.mview(), a.cview(), b.cview());
  }
  if (o.dim() == 1) out = out.squeeze(-1);
  if (dim() == 1) out = out.squeeze(o.dim() == 1 ? -1 : -2);
  return out;
}

// ====================================================================================== softmax
template <Backend B> Tensor<B> Tensor<B>::softmax(int64_t axis) const { return fused::softmax(*this, axis, false); }
template <Backend B> Tensor<B> Tensor<B>::log_softmax(int64_t axis) const { return fused::softmax(*this, axis, true); }

// ====================================================================================== indexing
template <Backend B> void Tensor<B>::check_index(const char* op, const Tensor& index, int64_t limit) const {
  KILN_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32, "{}: index must be i32 or i64, got {} (shape {})", op,
             index.dtype(), shape_str(index.shape()));
  if (index.numel() == 0) return;
  // min and max read back together: one wait for a device
  const std::vector<int64_t> mm = stack({index.min().to(DType::i64), index.max().to(DType::i64)}).template to_vector<int64_t>();
  const int64_t lo = mm[0], hi = mm[1];
  KILN_CHECK(lo >= 0 && hi < limit, "{}: index out of range: values in [{}, {}] for a dimension of size {} (input shape {})", op, lo, hi,
             limit, shape_str(shape()));
}

template <Backend B> Tensor<B> Tensor<B>::gather(int64_t axis, const Tensor& index) const {
  KILN_CHECK(defined() && index.defined(), "gather: undefined tensor");
  const int a = normalize_axis(axis, dim(), "gather", shape());
  KILN_CHECK(index.dim() == dim(), "gather: index rank {} != input rank {} (index {}, input {})", index.dim(), dim(),
             shape_str(index.shape()), shape_str(shape()));
  for (int64_t d = 0; d < dim(); ++d)
    KILN_CHECK(d == a || index.shape()[static_cast<size_t>(d)] <= shape()[static_cast<size_t>(d)],
               "gather: index shape {} larger than input shape {} at dim {}", shape_str(index.shape()), shape_str(shape()), d);
  check_index("gather", index, dim() == 0 ? 1 : shape()[static_cast<size_t>(a)]);
  Tensor out = empty(index.shape(), dtype_);
  if (out.numel()) KILN_PROFILED("gather", out, *this, index) B::gather(out.mview(), cview(), a, index.cview());
  return out;
}

template <Backend B> Tensor<B> Tensor<B>::index_select(int64_t axis, const Tensor& index) const {
  KILN_CHECK(defined() && index.defined(), "index_select: undefined tensor");
  KILN_CHECK(dim() >= 1, "index_select: input must have rank >= 1, got shape {}", shape_str(shape()));
  KILN_CHECK(index.dim() == 1, "index_select: index must be 1-D, got shape {}", shape_str(index.shape()));
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "index_select", shape()));
  check_index("index_select", index, shape()[a]);
  Shape s = shape();
  s[a] = index.numel();
  // The index seen as a gather index: stride 0 everywhere but along the axis.
  Strides st(s.size(), 0);
  st[a] = index.strides()[0];
  const Tensor idx(index.storage(), Layout(s, st, index.offset()), index.dtype());
  Tensor out = empty(s, dtype_);
  if (out.numel()) KILN_PROFILED("gather", out, *this, idx) B::gather(out.mview(), cview(), static_cast<int>(a), idx.cview());
  return out;
}

template <Backend B> Tensor<B> Tensor<B>::scatter_add(int64_t axis, const Tensor& index, const Tensor& src) const {
  KILN_CHECK(defined() && index.defined() && src.defined(), "scatter_add: undefined tensor");
  const int a = normalize_axis(axis, dim(), "scatter_add", shape());
  KILN_CHECK(src.dtype() == dtype_, "scatter_add: dtype mismatch {} vs src {}", dtype_, src.dtype());
  KILN_CHECK(index.dim() == dim() && src.dim() == dim(), "scatter_add: ranks differ: input {}, index {}, src {}", shape_str(shape()),
             shape_str(index.shape()), shape_str(src.shape()));
  for (int64_t d = 0; d < dim(); ++d) {
    const auto u = static_cast<size_t>(d);
    KILN_CHECK(index.shape()[u] <= src.shape()[u] && (d == a || index.shape()[u] <= shape()[u]),
               "scatter_add: index shape {} does not fit src {} / input {} at dim {}", shape_str(index.shape()), shape_str(src.shape()),
               shape_str(shape()), d);
  }
  check_index("scatter_add", index, dim() == 0 ? 1 : shape()[static_cast<size_t>(a)]);
  return scatter_add_checked(a, index, src);
}

template <Backend B> Tensor<B> Tensor<B>::scatter_add_checked(int a, const Tensor& index, const Tensor& src) const {
  Tensor out = clone();
  if (index.numel()) KILN_PROFILED("scatter_add", out, index, src) B::scatter_add(out.mview(), a, index.cview(), src.cview());
  return out;
}

template <Backend B> Tensor<B> Tensor<B>::index_add(int64_t axis, const Tensor& index, const Tensor& src) const {
  KILN_CHECK(defined() && index.defined() && src.defined(), "index_add: undefined tensor");
  KILN_CHECK(dim() >= 1, "index_add: input must have rank >= 1, got shape {}", shape_str(shape()));
  KILN_CHECK(index.dim() == 1, "index_add: index must be 1-D, got shape {}", shape_str(index.shape()));
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "index_add", shape()));
  check_index("index_add", index, shape()[a]);
  Shape want = shape();
  want[a] = index.numel();
  KILN_CHECK(src.shape() == want, "index_add: src shape {} != expected {} (input {}, {} indices on axis {})", shape_str(src.shape()),
             shape_str(want), shape_str(shape()), index.numel(), axis);
  Strides st(want.size(), 0);
  st[a] = index.strides()[0];
  const Tensor idx(index.storage(), Layout(want, st, index.offset()), index.dtype());
  KILN_CHECK(src.dtype() == dtype_, "index_add: dtype mismatch {} vs src {}", dtype_, src.dtype());
  return scatter_add_checked(static_cast<int>(a), idx, src);  // the index is checked above, the shapes fit by construction
}

// ====================================================================================== combinators
template <Backend B> Tensor<B> Tensor<B>::cat(const std::vector<Tensor>& xs, int64_t axis) {
  KILN_CHECK(!xs.empty(), "cat: no tensors");
  const Tensor& f = xs.front();
  KILN_CHECK(f.defined() && f.dim() > 0, "cat: tensors must have rank >= 1");
  const auto a = static_cast<size_t>(normalize_axis(axis, f.dim(), "cat", f.shape()));
  Shape s = f.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    KILN_CHECK(x.defined(), "cat: tensor {} is undefined", i);
    KILN_CHECK(x.dtype() == f.dtype(), "cat: tensor {} has dtype {}, tensor 0 has {}", i, x.dtype(), f.dtype());
    KILN_CHECK(x.dim() == f.dim(), "cat: tensor {} has shape {}, tensor 0 has {}", i, shape_str(x.shape()), shape_str(f.shape()));
    for (size_t d = 0; d < s.size(); ++d)
      KILN_CHECK(d == a || x.shape()[d] == s[d], "cat: tensor {} has shape {}, tensor 0 has {} (only axis {} may differ)", i,
                 shape_str(x.shape()), shape_str(f.shape()), a);
    total += x.shape()[a];
  }
  s[a] = total;
  Tensor out = empty(s, f.dtype());
  int64_t at = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.shape()[a];
    if (n && x.numel()) out.narrow(static_cast<int64_t>(a), at, n).copy_(x);
    at += n;
  }
  return out;
}

template <Backend B> Tensor<B> Tensor<B>::stack(const std::vector<Tensor>& xs, int64_t axis) {
  KILN_CHECK(!xs.empty(), "stack: no tensors");
  const int a = normalize_axis(axis, xs.front().dim() + 1, "stack", xs.front().shape());
  std::vector<Tensor> u;
  u.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    KILN_CHECK(xs[i].defined() && xs[i].shape() == xs.front().shape(), "stack: tensor {} has shape {}, tensor 0 has {}", i,
               shape_str(xs[i].shape()), shape_str(xs.front().shape()));
    u.push_back(xs[i].unsqueeze(a));
  }
  return cat(u, a);
}

template <Backend B> std::vector<Tensor<B>> Tensor<B>::split(const std::vector<int64_t>& sizes, int64_t axis) const {
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "split", shape()));
  KILN_CHECK(dim() > 0, "split: cannot split a 0-dim tensor");
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split: negative size in {}", detail::dims_str(sizes));
    total += s;
  }
  KILN_CHECK(total == shape()[a], "split: sizes {} sum to {}, axis {} of shape {} has {}", detail::dims_str(sizes), total, axis,
             shape_str(shape()), shape()[a]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(static_cast<int64_t>(a), at, s));
    at += s;
  }
  return out;
}

template <Backend B> std::vector<Tensor<B>> Tensor<B>::split(int64_t size, int64_t axis) const {
  KILN_CHECK(size > 0, "split: size must be positive, got {}", size);
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "split", shape()));
  KILN_CHECK(dim() > 0, "split: cannot split a 0-dim tensor");
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < shape()[a]; at += size) sizes.push_back(std::min(size, shape()[a] - at));
  if (sizes.empty()) sizes.push_back(0);
  return split(sizes, static_cast<int64_t>(a));
}

template <Backend B> std::vector<Tensor<B>> Tensor<B>::chunk(int64_t n, int64_t axis) const {
  KILN_CHECK(n > 0, "chunk: number of chunks must be positive, got {}", n);
  const auto a = static_cast<size_t>(normalize_axis(axis, dim(), "chunk", shape()));
  KILN_CHECK(dim() > 0, "chunk: cannot chunk a 0-dim tensor");
  return split(std::max<int64_t>(1, (shape()[a] + n - 1) / n), static_cast<int64_t>(a));
}

// ====================================================================================== printing
namespace detail {
template <Backend B> std::string format_tensor(const Tensor<B>& t) {
  if (!t.defined()) return "tensor(undefined)";
  const Shape& s = t.shape();
  const int64_t n = t.numel();
  const bool summarize = n > 1000;
  const std::vector<double> v = t.template to_vector<double>();
  const bool fl = is_floating(t.dtype());
  const bool ints = !fl || std::all_of(v.begin(), v.end(), [](double x) { return !std::isfinite(x) || x == std::floor(x); });
  // PyTorch's rule (torch/_tensor_str.py): scientific when the nonzero finite magnitudes span more
  // than 1000x or exceed 1e8, or (non-integral values) when the smallest is below 1e-4.
  double amax = 0, amin = std::numeric_limits<double>::infinity();
  for (double x : v)
    if (std::isfinite(x) && x != 0) {
      amax = std::max(amax, std::abs(x));
      amin = std::min(amin, std::abs(x));
    }
  const bool sci = fl && amax > 0 && (amax / amin > 1000 || amax > 1e8 || (!ints && amin < 1e-4));
  auto fmt1 = [&](double x) -> std::string {
    if (t.dtype() == DType::boolean) return x != 0 ? "True" : "False";
    if (!fl) return fmt::format("{}", static_cast<int64_t>(x));
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (sci) return fmt::format("{:.4e}", x);
    if (ints) return fmt::format("{:.0f}.", x);
    return fmt::format("{:.4f}", x);
  };
  size_t width = 0;
  for (double x : v) width = std::max(width, fmt1(x).size());
  const Strides st = contiguous_strides(s);
  std::string out = "tensor(";
  const size_t indent = out.size();
  // Recursive printer over dims.
  auto rec = [&](auto&& self, size_t d, int64_t base) -> void {
    if (d == s.size()) {
      const std::string e = fmt1(v[static_cast<size_t>(base)]);
      out += std::string(width - e.size(), ' ') + e;
      return;
    }
    out += '[';
    const int64_t m = s[d];
    for (int64_t i = 0; i < m; ++i) {
      if (summarize && m > 6 && i == 3) {
        out += d + 1 == s.size() ? "..., " : "...,\n" + std::string(indent + d + 1, ' ');
        i = m - 3;
      }
      self(self, d + 1, base + i * st[d]);
      if (i + 1 < m) {
        if (d + 1 == s.size())
          out += ", ";
        else
          out += "," + std::string(s.size() - d - 1, '\n') + std::string(indent + d + 1, ' ');
      }
    }
    out += ']';
  };
  if (s.empty())
    out += fmt1(v[0]);
  else
    rec(rec, 0, 0);
  out += fmt::format(", shape={}, dtype={}, backend={})", shape_str(s), t.dtype(), B::name);
  return out;
}
}  // namespace detail

template <Backend B> std::string Tensor<B>::str() const { return detail::format_tensor(*this); }

}  // namespace kiln
#pragma GCC visibility pop
