// Reductions over a set of axes (all when empty): x [*] -> y [* with the axes removed, or kept as 1].
// Backward views dy in the keepdim shape and broadcasts it back over the reduced axes.
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> using T = Tensor<B>;

// dy (shape of the reduction's output) -> dy in the keepdim shape of x.
template <Backend B> T<B> unreduce(const T<B>& g, const Shape& kshape) { return g.reshape(kshape); }

// max/min: y = extreme over the axes.  dx = dy * [x = y] / count([x = y])   (ties share equally)
template <Backend B> Var<B> extreme(const Var<B>& x, const std::vector<int64_t>& axes, bool keepdim, bool is_max) {
  const char* name = is_max ? "max" : "min";
  const std::vector<int64_t> ax = reduce_axes(axes, x.shape(), name);
  T<B> yk = is_max ? x.value().max(ax, true) : x.value().min(ax, true);  // keepdim
  T<B> y = yk;
  if (!keepdim)
    for (size_t i = ax.size(); i-- > 0;) y = y.squeeze(ax[i]);
  if (!needs_grad(x)) return Var<B>(y);
  return record<B>(name, y, {&x}, [ax, yk, xv = x.value()](const T<B>& g) {
    const T<B> hit = xv.eq(yk).to(xv.dtype());  // [*x], 1 at the extremes
    const T<B> count = hit.sum(ax, true);       // [keepdim]
    return Grads<B>{hit.mul(unreduce<B>(g, yk.shape()).div(count))};
  });
}
}  // namespace

// y = sum over axes              dx = broadcast(dy)
template <Backend B> Var<B> Reduce<B>::sum(const X& x_in, const std::vector<int64_t>& axes, bool keepdim) {
  const X x = autocast::cast(autocast::Op::sum, x_in);
  const std::vector<int64_t> ax = reduce_axes(axes, x.shape(), "sum");
  return record<B>("sum", x.value().sum(ax, keepdim), {&x},
                   [shape = x.shape(), ax](const T<B>& g) { return Grads<B>{unreduce<B>(g, keepdim_shape(shape, ax)).expand(shape)}; });
}

// y = mean over axes (n elements) dx = broadcast(dy) / n
template <Backend B> Var<B> Reduce<B>::mean(const X& x_in, const std::vector<int64_t>& axes, bool keepdim) {
  const X x = autocast::cast(autocast::Op::mean, x_in);
  const std::vector<int64_t> ax = reduce_axes(axes, x.shape(), "mean");
  int64_t n = 1;
  for (int64_t a : ax) n *= x.shape()[static_cast<size_t>(a)];
  return record<B>("mean", x.value().mean(ax, keepdim), {&x}, [shape = x.shape(), ax, n](const T<B>& g) {
    return Grads<B>{unreduce<B>(g, keepdim_shape(shape, ax)).div(Scalar(static_cast<double>(n))).expand(shape)};
  });
}

template <Backend B> Var<B> Reduce<B>::max(const X& x, const std::vector<int64_t>& axes, bool keepdim) {
  return extreme<B>(x, axes, keepdim, true);
}
template <Backend B> Var<B> Reduce<B>::min(const X& x, const std::vector<int64_t>& axes, bool keepdim) {
  return extreme<B>(x, axes, keepdim, false);
}

// y = x summed down to `shape` (the reverse of broadcasting)   dx = broadcast(dy)
template <Backend B> Var<B> Reduce<B>::sum_to(const X& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return record<B>("sum_to", x.value().sum_to(shape), {&x}, [from = x.shape(), shape](const T<B>& g) {
    Shape k(from.size() - shape.size(), 1);  // shape, padded with leading 1s to from's rank
    k.insert(k.end(), shape.begin(), shape.end());
    return Grads<B>{g.reshape(k).expand(from)};
  });
}

#define KILN_INST(B) template struct Reduce<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
