// Indexing ops, differentiable with respect to the float inputs (the index is data). Each backward is
// the "transpose" op: gather <-> scatter_add, index_select <-> index_add. Repeated indices accumulate.
#include "kiln/autograd/record.hpp"

namespace kiln::autograd {

namespace {
template <Backend B> using T = Tensor<B>;
}  // namespace

// y[i][j] = x[index[i][j]][j] (axis 0)      x [*], index [*'] (same rank) -> y [*']
// dx = zeros(x.shape).scatter_add(axis, index, dy)
template <Backend B> Var<B> Indexing<B>::gather(const X& x, int64_t axis, const Tensor<B>& index) {
  return record<B>("gather", x.value().gather(axis, index), {&x}, [shape = x.shape(), axis, index](const T<B>& g) {
    return Grads<B>{T<B>::zeros(shape, g.dtype()).scatter_add(axis, index, g)};
  });
}

// y = x with axis `axis` indexed by a 1-D index   x [.., n, ..], index [k] -> y [.., k, ..]
// dx = zeros(x.shape).index_add(axis, index, dy)
template <Backend B> Var<B> Indexing<B>::index_select(const X& x, int64_t axis, const Tensor<B>& index) {
  return record<B>("index_select", x.value().index_select(axis, index), {&x}, [shape = x.shape(), axis, index](const T<B>& g) {
    return Grads<B>{T<B>::zeros(shape, g.dtype()).index_add(axis, index, g)};
  });
}

// y = x + scatter(src at index along axis)  x [*], index [*i] <= src [*s] -> y [*]
// dx = dy;  dsrc = dy.gather(axis, index) in the leading [*i] block of src's shape, 0 elsewhere
template <Backend B> Var<B> Indexing<B>::scatter_add(const X& x, int64_t axis, const Tensor<B>& index, const X& src) {
  const bool nx = needs_grad(x), ns = needs_grad(src);
  return record<B>("scatter_add", x.value().scatter_add(axis, index, src.value()), {&x, &src},
                   [nx, ns, axis, index = keep_if(ns, index), ss = src.shape()](const T<B>& g) {
                     T<B> gs;
                     if (ns) {
                       gs = g.gather(axis, index);
                       if (gs.shape() != ss) {  // index smaller than src: src's other elements were unused
                         T<B> full = T<B>::zeros(ss, g.dtype());
                         T<B> block = full;
                         for (int64_t d = 0; d < static_cast<int64_t>(ss.size()); ++d) block = block.narrow(d, 0, index.size(d));
                         block.copy_(gs);
                         gs = full;
                       }
                     }
                     return Grads<B>{nx ? g : T<B>(), gs};
                   });
}

// y = x; y.index(axis, index[i]) += src.index(axis, i)     x [.., n, ..], index [k], src [.., k, ..] -> y [x]
// dx = dy;  dsrc = dy.index_select(axis, index)
template <Backend B> Var<B> Indexing<B>::index_add(const X& x, int64_t axis, const Tensor<B>& index, const X& src) {
  const bool nx = needs_grad(x), ns = needs_grad(src);
  return record<B>("index_add", x.value().index_add(axis, index, src.value()), {&x, &src},
                   [nx, ns, axis, index = keep_if(ns, index)](const T<B>& g) {
                     return Grads<B>{nx ? g : T<B>(), ns ? g.index_select(axis, index) : T<B>()};
                   });
}

#define KILN_INST(B) template struct Indexing<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
