#pragma once
// The preconditions of the Backend primitives (core/backend.hpp) that every fast backend checks the
// same way, with the same messages, and the dtype support rules of the op families:
//   unary<Op>:  every dtype but bool; Op::float_only ops only on the float types
//   binary<Op>: compare ops on every dtype (bool output); arithmetic on every dtype but bool;
//               Op::float_only ops only on the float types
//   reduce<Op>: every dtype but bool; argmax/argmin write i64
// A backend calls check_*() first, then dispatches with visit_dtype and skips the unsupported
// instantiations with the *_supported_v traits (the call has already failed for them).
#include <type_traits>

#include "kiln/core/backend.hpp"
#include "kiln/core/error.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::checks {

template <class Op, class T> inline constexpr bool unary_supported_v = !std::is_same_v<T, bool> && (!Op::float_only || is_float_v<T>);
template <class Op, class T>
inline constexpr bool binary_supported_v = (!Op::float_only || is_float_v<T>)&&(Op::compare || !std::is_same_v<T, bool>);
template <class T> inline constexpr bool reduce_supported_v = !std::is_same_v<T, bool>;

// Throws unless d has a T with unary_supported_v<Op, T> (and likewise below).
template <class Op> bool unary_ok(DType d) {
  return visit_dtype(d, []<class T>(type_tag<T>) { return unary_supported_v<Op, T>; });
}
template <class Op> bool binary_ok(DType d) {
  return visit_dtype(d, []<class T>(type_tag<T>) { return binary_supported_v<Op, T>; });
}

template <class Op, class S> void unary(const MutView<S>& out, const View<S>& in) {
  KILN_CHECK(out.dtype == in.dtype, "{}: output dtype {} differs from input dtype {}", Op::name, out.dtype, in.dtype);
  KILN_CHECK(unary_ok<Op>(in.dtype), "{}: not supported for dtype {} (shape {})", Op::name, in.dtype, shape_str(in.layout.shape));
}

template <class Op, class S> void binary(const MutView<S>& out, const View<S>& a, const View<S>& b) {
  KILN_CHECK(a.dtype == b.dtype, "{}: dtype mismatch {} vs {} (shapes {} and {})", Op::name, a.dtype, b.dtype, shape_str(a.layout.shape),
             shape_str(b.layout.shape));
  KILN_CHECK(out.dtype == (Op::compare ? DType::boolean : a.dtype), "{}: output dtype {} does not fit input dtype {}", Op::name, out.dtype,
             a.dtype);
  KILN_CHECK(binary_ok<Op>(a.dtype), "{}: not supported for dtype {} (shapes {} and {})", Op::name, a.dtype, shape_str(a.layout.shape),
             shape_str(b.layout.shape));
}

template <class Op, class S> void reduce(const MutView<S>& out, const View<S>& in, int axis) {
  KILN_CHECK(axis >= 0 && axis < in.layout.rank(), "{}: axis {} out of range for shape {}", Op::name, axis, shape_str(in.layout.shape));
  KILN_CHECK(in.layout.shape[static_cast<size_t>(axis)] > 0, "{}: cannot reduce the empty axis {} of shape {}", Op::name, axis,
             shape_str(in.layout.shape));
  if constexpr (Op::index) {
    KILN_CHECK(out.dtype == DType::i64, "{}: output must be i64, got {}", Op::name, out.dtype);
  } else {
    KILN_CHECK(out.dtype == in.dtype, "{}: output dtype {} differs from input dtype {}", Op::name, out.dtype, in.dtype);
  }
  KILN_CHECK(in.dtype != DType::boolean, "{}: not supported for dtype bool (shape {})", Op::name, shape_str(in.layout.shape));
}

}  // namespace kiln::checks
#pragma GCC visibility pop
