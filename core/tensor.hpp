#pragma once
// Tensor<B>: a value-semantic handle (shared storage + layout + dtype) over a Backend B. Copies share
// storage; views (reshape, permute, transpose, narrow, slice, expand, squeeze, unsqueeze) change only
// the layout. Every op checks its arguments and throws kiln::Error naming the op and the shapes.
//
// Member bodies live in core/tensor_impl.hpp and are compiled once per backend (explicit
// instantiation in backends/*/instantiate.cpp); user code sees `extern template` and compiles fast.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/backend.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/profile.hpp"
#include "kiln/core/rng.hpp"
#include "kiln/core/scalar.hpp"
#include "kiln/core/shape.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

template <Backend B> class Tensor {
 public:
  using backend = B;
  using Storage = typename B::Storage;

  Tensor() = default;  // undefined: defined() is false
  Tensor(std::shared_ptr<Storage> s, Layout l, DType d) : storage_(std::move(s)), layout_(std::move(l)), dtype_(d) {}

  // ------------------------------------------------------------------------------ factories
  static Tensor empty(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32);
  static Tensor full(const Shape& shape, Scalar value, DType dtype = DType::f32);
  static Tensor scalar(Scalar value, DType dtype = DType::f32);  // 0-dim
  // [start, end) by step, like torch.arange; throws on step 0 or a wrong-signed range.
  static Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::i64);
  static Tensor arange(int64_t end, DType dtype = DType::i64) { return arange(0.0, static_cast<double>(end), 1.0, dtype); }
  // Uniform [lo, hi) and normal(mean, std) from a Philox generator (the thread's default if null).
  static Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr);
  static Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr);
  static Tensor uniform(const Shape& shape, double lo, double hi, DType dtype = DType::f32, Generator* gen = nullptr);
  static Tensor normal(const Shape& shape, double mean, double std, DType dtype = DType::f32, Generator* gen = nullptr);
  // Host data in; the dtype is T's (float -> f32, int64_t -> i64, ...).
  template <class T> static Tensor from_vector(const std::vector<T>& data, const Shape& shape);
  template <class T> static Tensor from_vector(const std::vector<T>& data) {
    return from_vector(data, Shape{static_cast<int64_t>(data.size())});
  }
  static Tensor from_blob(const void* data, const Shape& shape, DType dtype);  // copies
  template <class T> static Tensor from(std::initializer_list<T> v) { return from_vector(std::vector<T>(v)); }
  template <class T> static Tensor from(std::initializer_list<std::initializer_list<T>> rows);

  Tensor empty_like() const { return empty(shape(), dtype_); }
  // A new dense tensor of `shape` (this tensor's rank) whose axes lie in memory in the order of this
  // tensor's strides, largest first (ties: axis order), as torch's preserve_format: empty_like_layout of a
  // transposed [B, H, T, d] view of [B, T, H, d] is a [B, T, H, d'] block seen as [B, H, T, d'].
  Tensor empty_like_layout(const Shape& shape, DType dtype) const;
  Tensor zeros_like() const { return zeros(shape(), dtype_); }
  Tensor ones_like() const { return ones(shape(), dtype_); }

  // ------------------------------------------------------------------------------ metadata
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return layout_.shape; }
  const Strides& strides() const { return layout_.strides; }
  int64_t offset() const { return layout_.offset; }
  int64_t dim() const { return layout_.rank(); }
  int64_t size(int64_t axis) const;
  int64_t numel() const { return layout_.numel(); }
  DType dtype() const { return dtype_; }
  bool is_contiguous() const { return layout_.is_contiguous(); }
  const Layout& layout() const { return layout_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Whether this handle is the only one on its storage: no other tensor, view or closure can read or
  // write the memory, so an op may write over it. The autograd pass hands a backward the gradient it
  // owns this way and drops its own handle first (autograd/var.cpp).
  bool sole_owner() const { return storage_ && storage_.use_count() == 1; }
  View<Storage> cview() const { return {*storage_, layout_, dtype_}; }
  MutView<Storage> mview() const { return {*storage_, layout_, dtype_}; }
  std::string str() const;  // what fmt prints

  // ------------------------------------------------------------------------------ views (no copy)
  Tensor view(Shape shape) const;     // throws if the strides cannot express it; one -1 is inferred
  Tensor reshape(Shape shape) const;  // a view when possible, else a contiguous copy
  Tensor permute(std::vector<int64_t> axes) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const;  // 2-D transpose (and identity on rank < 2)
  Tensor narrow(int64_t axis, int64_t start, int64_t length) const;
  Tensor slice(int64_t axis, int64_t start, int64_t end, int64_t step = 1) const;  // python-style clamping
  Tensor select(int64_t axis, int64_t index) const;                                // drops the axis
  Tensor expand(const Shape& shape) const;                                         // size-1 dims to any size (stride 0); -1 keeps
  Tensor broadcast_to(const Shape& shape) const { return expand(shape); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t axis) const;
  Tensor unsqueeze(int64_t axis) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor contiguous() const;  // this when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy

  // ------------------------------------------------------------------------------ elementwise
  template <class Op> Tensor map() const;                     // unary op tag
  template <class Op> Tensor zip(const Tensor& other) const;  // binary op tag, broadcasting
  Tensor neg() const;
  Tensor abs() const;
  Tensor square() const;
  Tensor sign() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor log1p() const;
  Tensor expm1() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor reciprocal() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor silu() const;
  Tensor gelu(bool tanh_approx = false) const;

  Tensor add(const Tensor& o) const;
  Tensor sub(const Tensor& o) const;
  Tensor mul(const Tensor& o) const;
  Tensor div(const Tensor& o) const;
  Tensor pow(const Tensor& o) const;
  Tensor maximum(const Tensor& o) const;
  Tensor minimum(const Tensor& o) const;
  Tensor add(Scalar s) const;
  Tensor sub(Scalar s) const;
  Tensor mul(Scalar s) const;
  Tensor div(Scalar s) const;
  Tensor pow(Scalar s) const;
  Tensor maximum(Scalar s) const;
  Tensor minimum(Scalar s) const;
  Tensor clamp(Scalar lo, Scalar hi) const;
  // comparisons -> bool
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  Tensor eq(Scalar s) const;
  Tensor ne(Scalar s) const;
  Tensor lt(Scalar s) const;
  Tensor le(Scalar s) const;
  Tensor gt(Scalar s) const;
  Tensor ge(Scalar s) const;
  Tensor logical_and(const Tensor& o) const;
  Tensor logical_or(const Tensor& o) const;
  Tensor logical_not() const;

  // ------------------------------------------------------------------------------ reductions
  // Over the given axes (all when empty). sum of integers/bool gives i64; mean needs a float dtype.
  Tensor sum(const std::vector<int64_t>& axes = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& axes = {}, bool keepdim = false) const;
  Tensor prod(const std::vector<int64_t>& axes = {}, bool keepdim = false) const;
  Tensor max(const std::vector<int64_t>& axes = {}, bool keepdim = false) const;
  Tensor min(const std::vector<int64_t>& axes = {}, bool keepdim = false) const;
  Tensor argmax(int64_t axis, bool keepdim = false) const;  // i64
  Tensor argmin(int64_t axis, bool keepdim = false) const;
  Tensor argmax() const;  // over the flattened tensor, 0-dim
  // Sums broadcast dimensions away so the result has `shape` (the reverse of expand).
  Tensor sum_to(const Shape& shape) const;

  // ------------------------------------------------------------------------------ linear algebra & nn
  Tensor matmul(const Tensor& o) const;  // torch.matmul semantics (1-D, batched, broadcast batch)
  Tensor softmax(int64_t axis) const;
  Tensor log_softmax(int64_t axis) const;

  // ------------------------------------------------------------------------------ indexing
  Tensor gather(int64_t axis, const Tensor& index) const;
  Tensor index_select(int64_t axis, const Tensor& index) const;                    // index: 1-D integer
  Tensor scatter_add(int64_t axis, const Tensor& index, const Tensor& src) const;  // out-of-place
  Tensor index_add(int64_t axis, const Tensor& index, const Tensor& src) const;    // index: 1-D

  // ------------------------------------------------------------------------------ conversion
  Tensor to(DType dtype) const;  // this when already that dtype
  template <Backend B2> Tensor<B2> to() const;
  template <class T> T item() const;  // 1-element tensors
  template <class T> T at(const std::vector<int64_t>& index) const;
  template <class T> std::vector<T> to_vector() const;  // row-major, converted to T
  void copy_to_host(void* dst, size_t bytes) const;     // contiguous bytes of this dtype

  // ------------------------------------------------------------------------------ in place
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }
  Tensor& copy_(const Tensor& src);  // broadcasts src to this shape, converts dtype
  Tensor& add_(const Tensor& o);
  Tensor& sub_(const Tensor& o);
  Tensor& mul_(const Tensor& o);
  Tensor& div_(const Tensor& o);
  Tensor& add_(Scalar s);
  Tensor& mul_(Scalar s);
  Tensor& uniform_(double lo, double hi, Generator* gen = nullptr);
  Tensor& normal_(double mean, double std, Generator* gen = nullptr);

  // ------------------------------------------------------------------------------ combinators
  static Tensor cat(const std::vector<Tensor>& xs, int64_t axis = 0);
  static Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0);
  static Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
  std::vector<Tensor> split(int64_t size, int64_t axis = 0) const;  // chunks of `size` (last smaller)
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t axis = 0) const;
  std::vector<Tensor> chunk(int64_t n, int64_t axis = 0) const;

 private:
  template <class Op> Tensor binary_op(const Tensor& o) const;
  template <class Op> Tensor scalar_op(Scalar s) const;
  template <class Op> Tensor& inplace_op(const Tensor& o);
  template <class Op> Tensor reduce_op(const std::vector<int64_t>& axes, bool keepdim) const;
  template <class Op> Tensor index_reduce_op(int64_t axis, bool keepdim) const;
  void check_writable(const char* op) const;
  void check_index(const char* op, const Tensor& index, int64_t limit) const;
  Tensor scatter_add_checked(int a, const Tensor& index, const Tensor& src) const;  // index values already checked

  std::shared_ptr<Storage> storage_;
  Layout layout_;
  DType dtype_ = DType::f32;
};

// ---------------------------------------------------------------------------------- free functions
template <Backend B> Tensor<B> operator+(const Tensor<B>& a, const Tensor<B>& b) { return a.add(b); }
template <Backend B> Tensor<B> operator-(const Tensor<B>& a, const Tensor<B>& b) { return a.sub(b); }
template <Backend B> Tensor<B> operator*(const Tensor<B>& a, const Tensor<B>& b) { return a.mul(b); }
template <Backend B> Tensor<B> operator/(const Tensor<B>& a, const Tensor<B>& b) { return a.div(b); }
template <Backend B> Tensor<B> operator+(const Tensor<B>& a, Scalar s) { return a.add(s); }
template <Backend B> Tensor<B> operator-(const Tensor<B>& a, Scalar s) { return a.sub(s); }
template <Backend B> Tensor<B> operator*(const Tensor<B>& a, Scalar s) { return a.mul(s); }
template <Backend B> Tensor<B> operator/(const Tensor<B>& a, Scalar s) { return a.div(s); }
template <Backend B> Tensor<B> operator+(Scalar s, const Tensor<B>& a) { return a.add(s); }
template <Backend B> Tensor<B> operator-(Scalar s, const Tensor<B>& a) { return a.neg().add(s); }
template <Backend B> Tensor<B> operator*(Scalar s, const Tensor<B>& a) { return a.mul(s); }
template <Backend B> Tensor<B> operator/(Scalar s, const Tensor<B>& a) { return Tensor<B>::full({}, s, a.dtype()).div(a); }
template <Backend B> Tensor<B> operator-(const Tensor<B>& a) { return a.neg(); }

template <Backend B> Tensor<B> matmul(const Tensor<B>& a, const Tensor<B>& b) { return a.matmul(b); }
template <Backend B> Tensor<B> where(const Tensor<B>& c, const Tensor<B>& a, const Tensor<B>& b) { return Tensor<B>::where(c, a, b); }
template <Backend B> Tensor<B> cat(const std::vector<Tensor<B>>& xs, int64_t axis = 0) { return Tensor<B>::cat(xs, axis); }
template <Backend B> Tensor<B> stack(const std::vector<Tensor<B>>& xs, int64_t axis = 0) { return Tensor<B>::stack(xs, axis); }

// Free forms of the member templates, so generic code (templated on B) needs no `.template`:
//   auto x = tensor<B>({{1.f, 2.f}, {3.f, 4.f}});  auto v = to_vector<float>(x);  float s = item<float>(x.sum());
template <Backend B, class T> Tensor<B> tensor(std::initializer_list<T> v) { return Tensor<B>::template from<T>(v); }
template <Backend B, class T> Tensor<B> tensor(std::initializer_list<std::initializer_list<T>> v) { return Tensor<B>::template from<T>(v); }
template <Backend B, class T> Tensor<B> tensor(const std::vector<T>& v, const Shape& shape) {
  return Tensor<B>::template from_vector<T>(v, shape);
}
template <class T, Backend B> std::vector<T> to_vector(const Tensor<B>& t) { return t.template to_vector<T>(); }
template <class T, Backend B> T item(const Tensor<B>& t) { return t.template item<T>(); }

// ---------------------------------------------------------------------------------- templates
template <Backend B> template <class T> Tensor<B> Tensor<B>::from_vector(const std::vector<T>& data, const Shape& shape) {
  static_assert(!std::is_same_v<T, bool>, "from_vector<bool>: std::vector<bool> is packed; use uint8_t data and .to(DType::boolean)");
  if constexpr (std::is_same_v<T, uint8_t>) {
    KILN_CHECK(static_cast<int64_t>(data.size()) == kiln::numel(shape), "from_vector: {} values for shape {} ({} elements)", data.size(),
               shape_str(shape), kiln::numel(shape));
    return from_blob(data.data(), shape, DType::boolean);
  } else {
    KILN_CHECK(static_cast<int64_t>(data.size()) == kiln::numel(shape), "from_vector: {} values for shape {} ({} elements)", data.size(),
               shape_str(shape), kiln::numel(shape));
    return from_blob(data.data(), shape, dtype_of<T>);
  }
}

template <Backend B> template <class T> Tensor<B> Tensor<B>::from(std::initializer_list<std::initializer_list<T>> rows) {
  std::vector<T> flat;
  const int64_t r = static_cast<int64_t>(rows.size());
  const int64_t c = r ? static_cast<int64_t>(rows.begin()->size()) : 0;
  for (const auto& row : rows) {
    KILN_CHECK(static_cast<int64_t>(row.size()) == c, "Tensor::from: ragged rows ({} vs {} values)", row.size(), c);
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return from_vector(flat, Shape{r, c});
}

template <Backend B> template <class T> std::vector<T> Tensor<B>::to_vector() const {
  KILN_CHECK(defined(), "to_vector: undefined tensor");
  const Tensor c = to(dtype_of<T>).contiguous();
  std::vector<T> out(static_cast<size_t>(c.numel()));
  c.copy_to_host(out.data(), out.size() * sizeof(T));
  return out;
}

template <Backend B> template <class T> T Tensor<B>::item() const {
  KILN_CHECK(numel() == 1, "item: tensor of shape {} has {} elements, not 1", shape_str(shape()), numel());
  return to_vector<T>()[0];
}

template <Backend B> template <class T> T Tensor<B>::at(const std::vector<int64_t>& index) const {
  KILN_CHECK(static_cast<int64_t>(index.size()) == dim(), "at: {} indices for shape {}", index.size(), shape_str(shape()));
  Tensor v = *this;
  for (size_t i = index.size(); i-- > 0;) v = v.select(static_cast<int64_t>(i), index[i]);
  return v.template item<T>();
}

// Public member templates (any op tag) are defined here, not in tensor_impl.hpp: an explicit
// instantiation of Tensor<B> does not emit member templates, so callers must instantiate them.
template <Backend B> template <class Op> Tensor<B> Tensor<B>::map() const {
  KILN_CHECK(defined(), "{}: undefined tensor", Op::name);
  KILN_CHECK(dtype_ != DType::boolean, "{}: not defined for bool tensors (shape {})", Op::name, shape_str(shape()));
  if constexpr (Op::float_only)
    KILN_CHECK(is_floating(dtype_), "{}: needs a float dtype, got {} (shape {})", Op::name, dtype_, shape_str(shape()));
  Tensor out = empty(shape(), dtype_);
  if (numel()) KILN_PROFILED(Op::name, out, *this) B::template unary<Op>(out.mview(), cview());
  return out;
}

template <Backend B> template <class Op> Tensor<B> Tensor<B>::binary_op(const Tensor& o) const {
  KILN_CHECK(defined() && o.defined(), "{}: undefined tensor", Op::name);
  KILN_CHECK(dtype_ == o.dtype_, "{}: dtype mismatch {} vs {} (shapes {} and {})", Op::name, dtype_, o.dtype_, shape_str(shape()),
             shape_str(o.shape()));
  if constexpr (Op::float_only)
    KILN_CHECK(is_floating(dtype_), "{}: needs a float dtype, got {} (shapes {} and {})", Op::name, dtype_, shape_str(shape()),
               shape_str(o.shape()));
  if constexpr (!Op::compare)
    KILN_CHECK(dtype_ != DType::boolean, "{}: not defined for bool tensors (shapes {} and {})", Op::name, shape_str(shape()),
               shape_str(o.shape()));
  const Shape s = broadcast_shapes(shape(), o.shape(), Op::name);
  const Tensor a = shape() == s ? *this : expand(s);
  const Tensor b = o.shape() == s ? o : o.expand(s);
  Tensor out = empty(s, Op::compare ? DType::boolean : dtype_);
  if (out.numel()) KILN_PROFILED(Op::name, out, a, b) B::template binary<Op>(out.mview(), a.cview(), b.cview());
  return out;
}
template <Backend B> template <class Op> Tensor<B> Tensor<B>::zip(const Tensor& o) const { return binary_op<Op>(o); }

template <Backend B> template <Backend B2> Tensor<B2> Tensor<B>::to() const {
  KILN_CHECK(defined(), "to<{}>: undefined tensor", B2::name);
  const Tensor c = contiguous();
  const size_t bytes = static_cast<size_t>(c.numel()) * dtype_size(dtype_);
  std::vector<unsigned char> host(bytes);
  if (bytes) c.copy_to_host(host.data(), bytes);
  return Tensor<B2>::from_blob(host.data(), shape(), dtype_);
}

}  // namespace kiln

template <kiln::Backend B> struct fmt::formatter<kiln::Tensor<B>> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(const kiln::Tensor<B>& t, Ctx& ctx) const { return fmt::format_to(ctx.out(), "{}", t.str()); }
};
#pragma GCC visibility pop
