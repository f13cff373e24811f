// fill, copy (strided, with dtype conversion), unary<Op>, binary<Op> and where on the GPU.
//
// Every op is one grid-stride walk (indexing.cuh) over the output's shape with its operands' strides,
// so broadcast (zero-stride) and non-contiguous inputs need no staging; when every operand is
// contiguous and aligned the same functors run on 16-byte packs (vec_kernel, indexing.cuh). The element functions are the
// op tags of core/ops.hpp, evaluated in compute_t<T> like the Cpu backend (the half types in f32,
// rounded once on store). Contiguous fills of zero bytes and contiguous same-dtype copies go to
// cudaMemsetAsync / cudaMemcpyAsync.
#include <cstring>

#include "kiln/backends/checks.hpp"
#include "kiln/backends/cuda/indexing.cuh"

namespace kiln {

namespace {

using namespace cuda;

// ------------------------------------------------------------------------------------ functors
// Each is called with the element offsets of its operands (the strided walk) and, for contiguous
// aligned operands, vec<V>(i) on V elements at once (VectorFunctor, indexing.cuh).
template <class U> struct FillF {
  static constexpr size_t kWidest = sizeof(U);
  U* o;
  U v;
  __device__ void operator()(const int64_t (&off)[1]) const { o[off[0]] = v; }
  FillF shifted(const int64_t (&b)[1]) const { return {o + b[0], v}; }
  template <int V> bool aligned() const { return aligned_for<V>(o); }
  template <int V> __device__ void vec(int64_t i) const {
    Pack<U, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = v;
    stv<V>(o + i, r);
  }
};

template <class T, class S> struct CopyF {
  static constexpr size_t kWidest = sizeof(T) > sizeof(S) ? sizeof(T) : sizeof(S);
  T* o;
  const S* x;
  __device__ void operator()(const int64_t (&off)[2]) const { o[off[0]] = convert_elem<T>(x[off[1]]); }
  CopyF shifted(const int64_t (&b)[2]) const { return {o + b[0], x + b[1]}; }
  template <int V> bool aligned() const { return aligned_for<V>(o) && aligned_for<V>(x); }
  template <int V> __device__ void vec(int64_t i) const {
    const Pack<S, V> a = ldv<V>(x + i);
    Pack<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = convert_elem<T>(a.v[j]);
    stv<V>(o + i, r);
  }
};

template <class Op, class T> struct UnaryF {
  static constexpr size_t kWidest = sizeof(T);
  T* o;
  const T* x;
  __device__ void operator()(const int64_t (&off)[2]) const { st(o + off[0], Op::template f<compute_t<T>>(ld(x + off[1]))); }
  UnaryF shifted(const int64_t (&b)[2]) const { return {o + b[0], x + b[1]}; }
  template <int V> bool aligned() const { return aligned_for<V>(o) && aligned_for<V>(x); }
  template <int V> __device__ void vec(int64_t i) const {
    const Pack<T, V> a = ldv<V>(x + i);
    Pack<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) st(&r.v[j], Op::template f<compute_t<T>>(ld(&a.v[j])));
    stv<V>(o + i, r);
  }
};

template <class Op, class T> struct BinaryF {
  using O = std::conditional_t<Op::compare, bool, T>;
  static constexpr size_t kWidest = sizeof(T);
  O* o;
  const T* a;
  const T* b;
  __device__ void put(O* p, compute_t<T> x, compute_t<T> y) const {
    const auto r = Op::template f<compute_t<T>>(x, y);
    if constexpr (Op::compare)
      *p = r;
    else
      st(p, r);
  }
  __device__ void operator()(const int64_t (&off)[3]) const { put(o + off[0], ld(a + off[1]), ld(b + off[2])); }
  BinaryF shifted(const int64_t (&s)[3]) const { return {o + s[0], a + s[1], b + s[2]}; }
  template <int V> bool aligned() const { return aligned_for<V>(o) && aligned_for<V>(a) && aligned_for<V>(b); }
  template <int V> __device__ void vec(int64_t i) const {
    const Pack<T, V> x = ldv<V>(a + i), y = ldv<V>(b + i);
    Pack<O, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) put(&r.v[j], ld(&x.v[j]), ld(&y.v[j]));
    stv<V>(o + i, r);
  }
};

template <class U> struct WhereF {
  static constexpr size_t kWidest = sizeof(U);
  U* o;
  const bool* c;
  const U* a;
  const U* b;
  __device__ void operator()(const int64_t (&off)[4]) const { o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]]; }
  WhereF shifted(const int64_t (&s)[4]) const { return {o + s[0], c + s[1], a + s[2], b + s[3]}; }
  template <int V> bool aligned() const { return aligned_for<V>(o) && aligned_for<V>(c) && aligned_for<V>(a) && aligned_for<V>(b); }
  template <int V> __device__ void vec(int64_t i) const {
    const Pack<bool, V> m = ldv<V>(c + i);
    const Pack<U, V> x = ldv<V>(a + i), y = ldv<V>(b + i);
    Pack<U, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = m.v[j] ? x.v[j] : y.v[j];
    stv<V>(o + i, r);
  }
};

template <class T> T* dptr(CudaStorage& s) { return s.as<T>(); }
template <class T> const T* dptr(const CudaStorage& s) { return s.as<T>(); }

template <class T, class S> void copy_convert(Cuda::M out, Cuda::V in) {
  const Walk<2> w =
      make_walk<2>("copy", out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  launch_elementwise("copy", w, CopyF<T, S>{dptr<T>(out.storage), dptr<S>(in.storage)});
}

}  // namespace

void Cuda::fill(M out, Scalar value) {
  if (out.layout.numel() == 0) return;
  check_device(out.storage, "fill");
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    using U = typename bits_of<sizeof(T)>::type;
    const T v = value.to<T>();
    U bits;
    std::memcpy(&bits, &v, sizeof(T));
    if (bits == 0 && out.layout.is_contiguous()) {
      KILN_CUDA_CHECK_OP("fill", cudaMemsetAsync(dptr<U>(out.storage) + out.layout.offset, 0,
                                                 static_cast<size_t>(out.layout.numel()) * sizeof(T), stream()));
      return;
    }
    const Walk<1> w = make_walk<1>("fill", out.layout.shape, {&out.layout.strides}, {out.layout.offset});
    launch_elementwise("fill", w, FillF<U>{dptr<U>(out.storage), bits});
  });
}

void Cuda::copy(M out, V in) {
  KILN_CHECK(out.layout.shape == in.layout.shape, "copy: shapes differ: out {} vs in {}", shape_str(out.layout.shape),
             shape_str(in.layout.shape));
  if (out.layout.numel() == 0) return;
  check_device(out.storage, "copy");
  check_device(in.storage, "copy");
  if (out.dtype == in.dtype) {
    // Same dtype: an exact bit copy.
    const size_t es = dtype_size(in.dtype);
    if (out.layout.is_contiguous() && in.layout.is_contiguous()) {
      char* d = static_cast<char*>(out.storage.data()) + out.layout.offset * static_cast<int64_t>(es);
      const char* s = static_cast<const char*>(in.storage.data()) + in.layout.offset * static_cast<int64_t>(es);
      if (d != s)
        KILN_CUDA_CHECK_OP("copy", cudaMemcpyAsync(d, s, static_cast<size_t>(out.layout.numel()) * es, cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    return visit_width(in.dtype, [&]<class U>(type_tag<U>) { copy_convert<U, U>(out, in); });
  }
  visit_dtype(in.dtype, [&]<class S>(type_tag<S>) { visit_dtype(out.dtype, [&]<class T>(type_tag<T>) { copy_convert<T, S>(out, in); }); });
}

template <class Op> void Cuda::unary(M out, V in) {
  checks::unary<Op>(out, in);
  if (out.layout.numel() == 0) return;
  check_device(out.storage, Op::name);
  check_device(in.storage, Op::name);
  const Walk<2> w =
      make_walk<2>(Op::name, out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::unary_supported_v<Op, T>)
      launch_elementwise(Op::name, w, UnaryF<Op, T>{dptr<T>(out.storage), dptr<T>(in.storage)});
  });
}

template <class Op> void Cuda::binary(M out, V a, V b) {
  checks::binary<Op>(out, a, b);
  if (out.layout.numel() == 0) return;
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&out.storage, &a.storage, &b.storage}) check_device(*s, Op::name);
  const Walk<3> w = make_walk<3>(Op::name, out.layout.shape, {&out.layout.strides, &a.layout.strides, &b.layout.strides},
                                 {out.layout.offset, a.layout.offset, b.layout.offset});
  visit_dtype(a.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::binary_supported_v<Op, T>) {
      using O = typename BinaryF<Op, T>::O;
      launch_elementwise(Op::name, w, BinaryF<Op, T>{dptr<O>(out.storage), dptr<T>(a.storage), dptr<T>(b.storage)});
    }
  });
}

void Cuda::where(M out, V cond, V a, V b) {
  KILN_CHECK(cond.dtype == DType::boolean, "where: cond must be bool, got {} (shape {})", cond.dtype, shape_str(cond.layout.shape));
  KILN_CHECK(a.dtype == b.dtype && a.dtype == out.dtype, "where: dtypes differ: a {}, b {}, out {}", a.dtype, b.dtype, out.dtype);
  if (out.layout.numel() == 0) return;
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&out.storage, &cond.storage, &a.storage, &b.storage})
    check_device(*s, "where");
  const Walk<4> w =
      make_walk<4>("where", out.layout.shape, {&out.layout.strides, &cond.layout.strides, &a.layout.strides, &b.layout.strides},
                   {out.layout.offset, cond.layout.offset, a.layout.offset, b.layout.offset});
  // where moves elements without arithmetic: dispatch on the element width only.
  visit_width(a.dtype, [&]<class U>(type_tag<U>) {
    launch_elementwise("where", w, WhereF<U>{dptr<U>(out.storage), dptr<bool>(cond.storage), dptr<U>(a.storage), dptr<U>(b.storage)});
  });
}

#define KILN_INST_UNARY(OP) template void Cuda::unary<op::OP>(M, V);
KILN_UNARY_OPS(KILN_INST_UNARY)
#undef KILN_INST_UNARY
#define KILN_INST_BINARY(OP) template void Cuda::binary<op::OP>(M, V, V);
KILN_BINARY_OPS(KILN_INST_BINARY)
#undef KILN_INST_BINARY

}  // namespace kiln
