#pragma once
// Internal: how an op pushes its record on the (implicit) tape. Included by autograd/ops/*.cpp only.
//
//   Var<B> exp(const Var<B>& x) {
//     Tensor<B> y = x.value().exp();
//     return record<B>("exp", y, {&x}, [y](const Tensor<B>& g) { return Grads<B>{g.mul(y)}; });
//   }
//
// record() looks at grad mode and the inputs first: when nothing needs a gradient it returns a plain
// Var and the closure is dropped without ever being wrapped in a std::function.
#include <initializer_list>
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::autograd {

// Does a gradient need to flow into v from an op recorded now?
template <Backend B> inline bool needs_grad(const Var<B>& v) { return grad_enabled() && v.requires_grad(); }

template <Backend B, class F> Var<B> record_impl(const char* op, Tensor<B> out, const Var<B>* const* ins, size_t n, F&& backward) {
  bool any = false;
  if (grad_enabled() && is_floating(out.dtype()))
    for (size_t i = 0; i < n; ++i) any = any || ins[i]->requires_grad();
  Var<B> v(std::move(out));
  if (!any) return v;
  Node<B>& node = *v.node();
  node.requires_grad = true;
  node.op = op;
  node.seq = next_seq();
  if (SegmentCollector<B>* c = active_collector<B>()) {  // a checkpointed forward: note the boundary, keep nothing
    for (size_t i = 0; i < n; ++i)
      if (ins[i]->requires_grad()) c->note(ins[i]->node());
    return v;
  }
  node.inputs.reserve(n);
  for (size_t i = 0; i < n; ++i) node.inputs.push_back(ins[i]->requires_grad() ? ins[i]->node() : nullptr);
  node.backward = std::forward<F>(backward);
  return v;
}

template <Backend B, class F> Var<B> record(const char* op, Tensor<B> out, std::initializer_list<const Var<B>*> ins, F&& backward) {
  return record_impl<B>(op, std::move(out), ins.begin(), ins.size(), std::forward<F>(backward));
}

template <Backend B, class F> Var<B> record(const char* op, Tensor<B> out, const std::vector<const Var<B>*>& ins, F&& backward) {
  return record_impl<B>(op, std::move(out), ins.data(), ins.size(), std::forward<F>(backward));
}

// A Tensor that is defined only when `keep` holds: what closures save, so nothing is kept alive for
// an input that needs no gradient.
template <Backend B> inline Tensor<B> keep_if(bool keep, const Tensor<B>& t) { return keep ? t : Tensor<B>(); }

// The zero-dim scalar `s` in t's dtype.
template <Backend B> inline Tensor<B> scalar_like(Scalar s, const Tensor<B>& t) { return Tensor<B>::scalar(s, t.dtype()); }

// Normalised, sorted, unique reduction axes (all when empty), as Tensor::sum sees them.
std::vector<int64_t> reduce_axes(const std::vector<int64_t>& axes, const Shape& shape, const char* op);
// `shape` with the reduced axes set to 1 (the keepdim shape).
Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& axes);

}  // namespace kiln::autograd
#pragma GCC visibility pop
