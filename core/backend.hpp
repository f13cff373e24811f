#pragma once
// The Backend contract: the small, closed set of primitives every backend implements once. Tensor<B>
// builds everything else (views, broadcasting, multi-axis reductions, cat, softmax, ...) from these.
//
// Conventions every primitive follows:
//  * Outputs are MutViews, inputs Views: storage + Layout (shape, strides, offset in elements) + dtype.
//    Any input may be strided or have zero strides (broadcast, expanded); Tensor<B> has already made the
//    input shapes equal to the output shape (binary, where) or checked them (matmul, gather, reduce).
//  * An output may alias an input with the identical layout (in-place elementwise ops); outputs never
//    have zero strides over a dimension larger than 1.
//  * Inputs of binary/where/matmul have one dtype (where's cond is bool); Tensor<B> checks that.
//  * Primitives may throw kiln::Error for what they cannot do (e.g. an unsupported dtype).
#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kiln/core/dtype.hpp"
#include "kiln/core/ops.hpp"
#include "kiln/core/scalar.hpp"
#include "kiln/core/shape.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

template <class S> struct View {
  const S& storage;
  const Layout& layout;
  DType dtype;
};
template <class S> struct MutView {
  S& storage;
  const Layout& layout;
  DType dtype;
  operator View<S>() const { return {storage, layout, dtype}; }  // NOLINT: an output can be read
};

template <class B>
concept Backend = requires(typename B::Storage& s, const typename B::Storage& cs, MutView<typename B::Storage> out,
                           View<typename B::Storage> in, Scalar sc, size_t n, void* host, const void* chost, int axis, uint64_t u,
                           double d) {
  { B::name } -> std::convertible_to<std::string_view>;
  // memory: bytes, owned by shared handles; write/read copy host memory in and out at a byte offset
  { B::allocate(n) } -> std::same_as<std::shared_ptr<typename B::Storage>>;
  B::write(s, n, chost, n);
  B::read(cs, n, host, n);
  // elementwise
  B::fill(out, sc);
  B::copy(out, in);  // strided copy with dtype conversion: contiguous(), cast, copy_
  B::template unary<op::Exp>(out, in);
  B::template binary<op::Add>(out, in, in);
  B::where(out, in, in, in);  // out = cond ? a : b
  // out has in's shape with out.shape[axis] == 1
  B::template reduce<op::Sum>(out, in, axis);
  B::template reduce<op::ArgMax>(out, in, axis);  // i64 output
  // [..., M, K] @ [..., K, N] -> [..., M, N], batch dims equal (possibly zero-strided)
  B::matmul(out, in, in);
  // PyTorch gather: out[..i..] = src[..index[..i..] at axis..]; out.shape == index.shape
  B::gather(out, in, axis, in);
  // dst[..index[..i..] at axis..] += src[..i..] over index's shape (accumulates into out)
  B::scatter_add(out, axis, in, in);
  // element i (row-major) = f(seed, offset, i): see core/rng.hpp
  B::rand_uniform(out, u, u, d, d);
  B::rand_normal(out, u, u, d, d);
};

}  // namespace kiln
#pragma GCC visibility pop
