// Views and combinators. Every view's backward needs only shapes and arguments, never data:
//   reshape-like (view, reshape, squeeze, unsqueeze, flatten): dx = dy.reshape(x.shape)
//   permute/transpose: dy permuted back;  expand: dy summed back (sum_to)
//   narrow/slice/select: dy written into a zero tensor of x's shape at the same place
//   cat/stack: each input gets its piece of dy; split/chunk: one narrow per piece
#include <numeric>

#include "kiln/autograd/record.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> using T = Tensor<B>;

// x [*] -> y [shape] (same elements)      dx = dy.reshape(x.shape)
template <Backend B> Var<B> reshaped(const char* op, const Var<B>& x, T<B> y) {
  return record<B>(op, std::move(y), {&x}, [shape = x.shape()](const T<B>& g) { return Grads<B>{g.reshape(shape)}; });
}

// dx = zeros(x.shape) with `place(dx) = dy`, where place() re-applies the forward view.
template <Backend B, class Place> Var<B> placed(const char* op, const Var<B>& x, T<B> y, Place place) {
  return record<B>(op, std::move(y), {&x}, [shape = x.shape(), dtype = x.dtype(), place](const T<B>& g) {
    T<B> dx = T<B>::zeros(shape, dtype);
    place(dx).copy_(g);
    return Grads<B>{dx};
  });
}
}  // namespace

template <Backend B> Var<B> Views<B>::view(const X& x, Shape shape) { return reshaped<B>("view", x, x.value().view(std::move(shape))); }
template <Backend B> Var<B> Views<B>::reshape(const X& x, Shape shape) {
  return reshaped<B>("reshape", x, x.value().reshape(std::move(shape)));
}
template <Backend B> Var<B> Views<B>::squeeze(const X& x) { return reshaped<B>("squeeze", x, x.value().squeeze()); }
template <Backend B> Var<B> Views<B>::squeeze_axis(const X& x, int64_t axis) { return reshaped<B>("squeeze", x, x.value().squeeze(axis)); }
template <Backend B> Var<B> Views<B>::unsqueeze(const X& x, int64_t axis) { return reshaped<B>("unsqueeze", x, x.value().unsqueeze(axis)); }
template <Backend B> Var<B> Views<B>::flatten(const X& x, int64_t start, int64_t end) {
  return reshaped<B>("flatten", x, x.value().flatten(start, end));
}

// y = x.permute(axes): y.shape[i] = x.shape[axes[i]]     dx = dy.permute(inverse(axes))
template <Backend B> Var<B> Views<B>::permute(const X& x, std::vector<int64_t> axes) {
  T<B> y = x.value().permute(axes);
  std::vector<int64_t> inv(axes.size());
  for (size_t i = 0; i < axes.size(); ++i)
    inv[static_cast<size_t>(normalize_axis(axes[i], x.dim(), "permute", x.shape()))] = static_cast<int64_t>(i);
  return record<B>("permute", y, {&x}, [inv](const T<B>& g) { return Grads<B>{g.permute(inv)}; });
}

// y = x with axes a and b swapped       dx = dy with them swapped back
template <Backend B> Var<B> Views<B>::transpose(const X& x, int64_t a, int64_t b) {
  return record<B>("transpose", x.value().transpose(a, b), {&x}, [a, b](const T<B>& g) { return Grads<B>{g.transpose(a, b)}; });
}
template <Backend B> Var<B> Views<B>::t(const X& x) {
  return record<B>("t", x.value().t(), {&x}, [](const T<B>& g) { return Grads<B>{g.t()}; });
}

// y = x[..., start:start+length, ...] along axis
template <Backend B> Var<B> Views<B>::narrow(const X& x, int64_t axis, int64_t start, int64_t length) {
  return placed<B>("narrow", x, x.value().narrow(axis, start, length),
                   [axis, start, length](const T<B>& dx) { return dx.narrow(axis, start, length); });
}

// y = x[..., start:end:step, ...] along axis
template <Backend B> Var<B> Views<B>::slice(const X& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  return placed<B>("slice", x, x.value().slice(axis, start, end, step),
                   [axis, start, end, step](const T<B>& dx) { return dx.slice(axis, start, end, step); });
}

// y = x[..., index, ...] (axis dropped)
template <Backend B> Var<B> Views<B>::select(const X& x, int64_t axis, int64_t index) {
  return placed<B>("select", x, x.value().select(axis, index), [axis, index](const T<B>& dx) { return dx.select(axis, index); });
}

// y = x broadcast to shape (size-1 and new leading dims)     dx = dy summed back to x.shape
template <Backend B> Var<B> Views<B>::expand(const X& x, const Shape& shape) {
  return record<B>("expand", x.value().expand(shape), {&x}, [from = x.shape()](const T<B>& g) { return Grads<B>{g.sum_to(from)}; });
}

// identity on the values                 dx = dy
template <Backend B> Var<B> Views<B>::contiguous(const X& x) {
  if (x.is_contiguous()) return x;
  return record<B>("contiguous", x.value().contiguous(), {&x}, [](const T<B>& g) { return Grads<B>{g}; });
}
template <Backend B> Var<B> Views<B>::clone(const X& x) {
  return record<B>("clone", x.value().clone(), {&x}, [](const T<B>& g) { return Grads<B>{g}; });
}

// split/chunk: one narrow per piece (each piece's gradient lands in its own region of dx)
template <Backend B> std::vector<Var<B>> Views<B>::split_sizes(const X& x, const std::vector<int64_t>& sizes, int64_t axis) {
  const std::vector<T<B>> parts = x.value().split(sizes, axis);  // validates
  std::vector<X> out;
  out.reserve(parts.size());
  int64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    out.push_back(narrow(x, axis, at, sizes[i]));
    at += sizes[i];
  }
  return out;
}
template <Backend B> std::vector<Var<B>> Views<B>::split(const X& x, int64_t size, int64_t axis) {
  std::vector<int64_t> sizes;
  for (const T<B>& p : x.value().split(size, axis)) sizes.push_back(p.size(axis));
  return split_sizes(x, sizes, axis);
}
template <Backend B> std::vector<Var<B>> Views<B>::chunk(const X& x, int64_t n, int64_t axis) {
  std::vector<int64_t> sizes;
  for (const T<B>& p : x.value().chunk(n, axis)) sizes.push_back(p.size(axis));
  return split_sizes(x, sizes, axis);
}

// y = cat(xs, axis): xs[i] [.., n_i, ..] -> y [.., sum n_i, ..]     dxs[i] = dy.narrow(axis, offset_i, n_i)
template <Backend B> Var<B> Views<B>::cat(const std::vector<X>& xs, int64_t axis) {
  std::vector<T<B>> values;
  std::vector<const X*> ins;
  values.reserve(xs.size());
  for (const X& x : xs) {
    KILN_CHECK(x.defined(), "cat: undefined Var");
    values.push_back(x.value());
    ins.push_back(&x);
  }
  T<B> y = T<B>::cat(values, axis);
  std::vector<int64_t> sizes;
  for (const T<B>& v : values) sizes.push_back(v.size(axis));
  return record<B>("cat", y, ins, [sizes, axis](const T<B>& g) {
    Grads<B> out;
    int64_t at = 0;
    for (int64_t n : sizes) {
      out.push_back(g.narrow(axis, at, n));
      at += n;
    }
    return out;
  });
}

// y = stack(xs, axis): n tensors [*] -> y [.., n, ..]                dxs[i] = dy.select(axis, i)
template <Backend B> Var<B> Views<B>::stack(const std::vector<X>& xs, int64_t axis) {
  std::vector<T<B>> values;
  std::vector<const X*> ins;
  for (const X& x : xs) {
    KILN_CHECK(x.defined(), "stack: undefined Var");
    values.push_back(x.value());
    ins.push_back(&x);
  }
  T<B> y = T<B>::stack(values, axis);
  const int64_t a = normalize_axis(axis, y.dim(), "stack", y.shape());
  return record<B>("stack", y, ins, [a, n = xs.size()](const T<B>& g) {
    Grads<B> out;
    for (size_t i = 0; i < n; ++i) out.push_back(g.select(a, static_cast<int64_t>(i)));
    return out;
  });
}

#define KILN_INST(B) template struct Views<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
