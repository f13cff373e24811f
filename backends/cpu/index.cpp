// gather and scatter_add. Both walk the index's shape with three operands (out, index, src), the
// operand addressed through the index having its stride along `axis` zeroed; the index value times
// that stride is added per element. scatter_add runs in parallel over a non-axis dimension, so two
// threads never add into the same element.
#include <atomic>

#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

template <class I> inline int64_t idx_at(const I* p) { return static_cast<int64_t>(*p); }

template <class T, class I> void gather_kernel(Cpu::M out, Cpu::V src, int axis, Cpu::V index) {
  const auto ax = static_cast<size_t>(axis);
  const int64_t lim = src.layout.shape[ax], sax = src.layout.strides[ax];
  Strides ss = src.layout.strides;
  ss[ax] = 0;
  const Plan<3> p = make_plan<3>(index.layout.shape, {&out.layout.strides, &index.layout.strides, &ss},
                                 {out.layout.offset, index.layout.offset, src.layout.offset});
  T* o = out.storage.as<T>();
  const I* ix = index.storage.as<I>();
  const T* s = src.storage.as<T>();
  std::atomic<bool> bad{false};
  for_each_parallel(p, kGrainCheap, [&](const std::array<int64_t, 3>& off, int64_t n) {
    const int64_t so = p.inner(0), si = p.inner(1), ssr = p.inner(2);
    if (si == 0) {  // one index for the whole run (index_select, an embedding's rows): check it once, copy the run
      const int64_t k = idx_at(ix + off[1]);
      if (k < 0 || k >= lim) {
        bad = true;
        return;
      }
      T* d = o + off[0];
      const T* r = s + off[2] + k * sax;
      for (int64_t i = 0; i < n; ++i) d[i * so] = r[i * ssr];
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = idx_at(ix + off[1] + i * si);
      if (k < 0 || k >= lim) {
        bad = true;
        return;
      }
      o[off[0] + i * so] = s[off[2] + i * ssr + k * sax];
    }
  });
  KILN_CHECK(!bad, "gather: index out of range for dimension {} of size {} (input {})", axis, lim, shape_str(src.layout.shape));
}

template <class T, class I> void scatter_kernel(Cpu::M out, int axis, Cpu::V index, Cpu::V src) {
  const auto ax = static_cast<size_t>(axis);
  const int64_t lim = out.layout.shape[ax], oax = out.layout.strides[ax];
  Strides os = out.layout.strides;
  os[ax] = 0;
  const Shape& shape = index.layout.shape;
  // parallel over the largest non-axis dim
  size_t pd = shape.size();
  for (size_t d = 0; d < shape.size(); ++d)
    if (d != ax && shape[d] > 1 && (pd == shape.size() || shape[d] > shape[pd])) pd = d;
  T* o = out.storage.as<T>();
  const I* ix = index.storage.as<I>();
  const T* s = src.storage.as<T>();
  std::atomic<bool> bad{false};
  const auto run = [&](const Shape& sh, int64_t oo, int64_t io, int64_t so0) {
    const Plan<3> p = make_plan<3>(sh, {&os, &index.layout.strides, &src.layout.strides}, {oo, io, so0});
    for_range(p, 0, p.numel, [&](const std::array<int64_t, 3>& off, int64_t n) {
      const int64_t st0 = p.inner(0), si = p.inner(1), ss = p.inner(2);
      if (si == 0) {  // one index for the whole run (index_add, an embedding's gradient rows): one check, one row add
        const int64_t k = idx_at(ix + off[1]);
        if (k < 0 || k >= lim) {
          bad = true;
          return;
        }
        T* d = o + off[0] + k * oax;
        const T* r = s + off[2];
        for (int64_t i = 0; i < n; ++i) d[i * st0] = st<T>(ld(d[i * st0]) + ld(r[i * ss]));
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = idx_at(ix + off[1] + i * si);
        if (k < 0 || k >= lim) {
          bad = true;
          return;
        }
        T& d = o[off[0] + i * st0 + k * oax];
        d = st<T>(ld(d) + ld(s[off[2] + i * ss]));
      }
    });
  };
  if (pd == shape.size()) {
    run(shape, out.layout.offset, index.layout.offset, src.layout.offset);
  } else {
    const int64_t per = std::max<int64_t>(1, kiln::numel(shape) / shape[pd]);
    parallel_for(
        shape[pd], std::max<int64_t>(1, kGrainCheap / per),
        [&](int64_t lo, int64_t hi) {
          Shape sh = shape;
          sh[pd] = hi - lo;
          run(sh, out.layout.offset + lo * os[pd], index.layout.offset + lo * index.layout.strides[pd],
              src.layout.offset + lo * src.layout.strides[pd]);
        },
        1);
  }
  KILN_CHECK(!bad, "scatter_add: index out of range for dimension {} of size {} (output {})", axis, lim, shape_str(out.layout.shape));
}

}  // namespace

void Cpu::gather(M out, V src, int axis, V index) {
  KILN_CHECK(out.dtype == src.dtype, "gather: output dtype {} differs from input dtype {}", out.dtype, src.dtype);
  KILN_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, "gather: index must be i32 or i64, got {}", index.dtype);
  if (src.layout.rank() == 0) return Cpu::copy(out, src);
  visit_dtype(src.dtype, [&]<class T>(type_tag<T>) {
    if (index.dtype == DType::i64)
      gather_kernel<T, int64_t>(out, src, axis, index);
    else
      gather_kernel<T, int32_t>(out, src, axis, index);
  });
}

void Cpu::scatter_add(M out, int axis, V index, V src) {
  KILN_CHECK(out.dtype == src.dtype, "scatter_add: output dtype {} differs from src dtype {}", out.dtype, src.dtype);
  KILN_CHECK(index.dtype == DType::i64 || index.dtype == DType::i32, "scatter_add: index must be i32 or i64, got {}", index.dtype);
  visit_dtype(src.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, bool>) {
      fail("scatter_add: not supported for dtype bool (shape {})", shape_str(out.layout.shape));
    } else if (out.layout.rank() == 0) {  // every element of src (index's shape) adds into the one output, in order
      T& d = out.storage.as<T>()[out.layout.offset];
      const T* s = src.storage.as<T>();
      KILN_CHECK(src.layout.rank() == index.layout.rank(), "scatter_add: src {} and index {} differ in rank", shape_str(src.layout.shape),
                 shape_str(index.layout.shape));
      const Layout at(index.layout.shape, src.layout.strides, src.layout.offset);  // src read over index's shape
      for (int64_t i = 0, n = index.layout.numel(); i < n; ++i) d = st<T>(ld(d) + ld(s[at.offset_of(i)]));
    } else {
      if (index.dtype == DType::i64)
        scatter_kernel<T, int64_t>(out, axis, index, src);
      else
        scatter_kernel<T, int32_t>(out, axis, index, src);
    }
  });
}

}  // namespace kiln
