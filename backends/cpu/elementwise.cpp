// fill, copy (strided, with dtype conversion) and where.
#include <cstring>

#include "backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

// Same-size bit copies: the element types by width.
template <size_t W> struct bits_of;
template <> struct bits_of<1> { using type = uint8_t; };
template <> struct bits_of<2> { using type = uint16_t; };
template <> struct bits_of<4> { using type = uint32_t; };
template <> struct bits_of<8> { using type = uint64_t; };

template <class T, class S> void copy_kernel(Cpu::M out, Cpu::V in) {
  const Plan<2> p = make_plan<2>(out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  T* o = out.storage.as<T>();
  const S* x = in.storage.as<S>();
  const int64_t so = p.inner(0), si = p.inner(1);
  for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 2>& off, int64_t n) {
    T* d = o + off[0];
    const S* s = x + off[1];
    if (so == 1 && si == 1) {
      if constexpr (std::is_same_v<T, S>) std::memmove(d, s, static_cast<size_t>(n) * sizeof(T));
      else for (int64_t i = 0; i < n; ++i) d[i] = convert_elem<T>(s[i]);
    } else if (si == 0) {
      const T v = convert_elem<T>(s[0]);
      for (int64_t i = 0; i < n; ++i) d[i * so] = v;
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * so] = convert_elem<T>(s[i * si]);
    }
  });
}

}  // namespace

void Cpu::fill(M out, Scalar value) {
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    const T v = value.to<T>();
    const Plan<1> p = make_plan<1>(out.layout.shape, {&out.layout.strides}, {out.layout.offset});
    T* o = out.storage.as<T>();
    const int64_t so = p.inner(0);
    for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 1>& off, int64_t n) {
      T* d = o + off[0];
      if (so == 1) std::fill_n(d, n, v);
      else for (int64_t i = 0; i < n; ++i) d[i * so] = v;
    });
  });
}

void Cpu::copy(M out, V in) {
  KILN_CHECK(out.layout.shape == in.layout.shape, "copy: shapes differ: out {} vs in {}", shape_str(out.layout.shape),
             shape_str(in.layout.shape));
  if (out.dtype == in.dtype) {
    // Same dtype: an exact bit copy (Reference's round trip through double would only disturb NaN
    // payloads and i64 values beyond 2^53).
    switch (dtype_size(in.dtype)) {
      case 1: return copy_kernel<uint8_t, uint8_t>(out, in);
      case 2: return copy_kernel<uint16_t, uint16_t>(out, in);
      case 4: return copy_kernel<uint32_t, uint32_t>(out, in);
      default: return copy_kernel<uint64_t, uint64_t>(out, in);
    }
  }
  visit_dtype(in.dtype, [&]<class S>(type_tag<S>) {
    visit_dtype(out.dtype, [&]<class T>(type_tag<T>) { copy_kernel<T, S>(out, in); });
  });
}

void Cpu::where(M out, V cond, V a, V b) {
  KILN_CHECK(cond.dtype == DType::boolean, "where: cond must be bool, got {} (shape {})", cond.dtype, shape_str(cond.layout.shape));
  KILN_CHECK(a.dtype == b.dtype && a.dtype == out.dtype, "where: dtypes differ: a {}, b {}, out {}", a.dtype, b.dtype, out.dtype);
  const auto go = [&]<class T>(type_tag<T>) {
    const Plan<4> p = make_plan<4>(out.layout.shape, {&out.layout.strides, &cond.layout.strides, &a.layout.strides, &b.layout.strides},
                                   {out.layout.offset, cond.layout.offset, a.layout.offset, b.layout.offset});
    T* o = out.storage.template as<T>();
    const bool* c = cond.storage.template as<bool>();
    const T* x = a.storage.template as<T>();
    const T* y = b.storage.template as<T>();
    const int64_t so = p.inner(0), sc = p.inner(1), sa = p.inner(2), sb = p.inner(3);
    for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 4>& off, int64_t n) {
      T* d = o + off[0];
      const bool* cc = c + off[1];
      const T* xa = x + off[2];
      const T* yb = y + off[3];
      if (so == 1 && sc == 1 && sa == 1 && sb == 1) {
        for (int64_t i = 0; i < n; ++i) d[i] = cc[i] ? xa[i] : yb[i];
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * so] = cc[i * sc] ? xa[i * sa] : yb[i * sb];
      }
    });
  };
  // where moves elements without arithmetic: dispatch on the element width only.
  switch (dtype_size(a.dtype)) {
    case 1: return go(type_tag<uint8_t>{});
    case 2: return go(type_tag<uint16_t>{});
    case 4: return go(type_tag<uint32_t>{});
    default: return go(type_tag<uint64_t>{});
  }
}

}  // namespace kiln
