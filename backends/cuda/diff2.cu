// Fused combine of Differential Transformer V2 on the GPU (contract in core/fused_diff2.hpp; the same
// formulas as backends/cpu/diff2.cpp): f32/f64 (the core converts bf16/f16 inputs), one warp per output
// row (b, t, j) of hd, grid-stride over the B·T·h rows.
//   forward   y[b, t, j, :] = a[b, 2j, t, :] − σ(l[b, t, j]) · a[b, 2j+1, t, :]
//   backward  da[b, 2j, t, :] = dy[b, t, j, :],  da[b, 2j+1, t, :] = −σ · dy[b, t, j, :],
//             dl[b, t, j] = −σ (1 − σ) Σ_c dy[b, t, j, c] · a[b, 2j+1, t, c]   (a warp sum, no atomics)
// a is read through its strides over (b, head, t) with unit-stride rows (e.g. the [B, 2h, T, hd] view of
// a [B, T, 2h, hd] block); da is written through its own strides in the same way; l, dl, y and dy are
// contiguous. Lanes walk a row's columns, so a warp's loads and stores are coalesced.
#include <initializer_list>

#include "kiln/backends/cuda/dense_common.cuh"

namespace kiln {

namespace {

using namespace cuda;
using namespace cuda::dense;

constexpr int kWarps = 8;  // rows per 256-thread block

// a's (or da's) strides over (b, head, t) and the sizes that split a row index r = (b·T + t)·h + j.
struct Diff2Geom {
  int64_t T, h, hd, s0, s1, s2;
  // offset of head 2j's row at token t for row r
  __device__ __forceinline__ int64_t even(int64_t r) const { return (r / (T * h)) * s0 + 2 * (r % h) * s1 + ((r / h) % T) * s2; }
};

template <class T> __device__ __forceinline__ T sigmoid_of(T x) { return T(1) / (T(1) + dexp(-x)); }

template <class T> __global__ void __launch_bounds__(kWarps* kWarp)
    diff2_fwd(T* __restrict__ y, const T* __restrict__ a, const T* __restrict__ l, Diff2Geom g, int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp; r < rows; r += step) {
    const T s = sigmoid_of(l[r]);
    const T* e = a + g.even(r);
    const T* o = e + g.s1;
    T* yr = y + r * g.hd;
    for (int64_t c = lane; c < g.hd; c += kWarp) yr[c] = e[c] - s * o[c];
  }
}

// ga: a's geometry (strides of a), gd: da's strides (same sizes).
template <class T> __global__ void __launch_bounds__(kWarps* kWarp)
    diff2_bwd(T* __restrict__ da, T* __restrict__ dl, const T* __restrict__ a, const T* __restrict__ l, const T* __restrict__ dy,
              Diff2Geom ga, Diff2Geom gd, int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp; r < rows; r += step) {
    const T s = sigmoid_of(l[r]);
    const T* o = a + ga.even(r) + ga.s1;
    const T* gr = dy + r * ga.hd;
    T* de = da + gd.even(r);
    T* dodd = de + gd.s1;
    T dot = 0;
    for (int64_t c = lane; c < ga.hd; c += kWarp) {
      const T gc = gr[c];
      de[c] = gc;
      dodd[c] = -s * gc;
      dot += gc * o[c];
    }
    dot = warp_sum(dot);
    if (lane == 0) dl[r] = -s * (T(1) - s) * dot;
  }
}

// ------------------------------------------------------------------------------------------ host side
Diff2Geom geom_of(const Layout& a, const Layout& strides) {
  return {a.shape[2], a.shape[1] / 2, a.shape[3], strides.strides[0], strides.strides[1], strides.strides[2]};
}

void check_views(const char* op, const Cuda::V& a, const Cuda::V& l, const Layout& y, DType ydt, const char* yname) {
  const Layout& al = a.layout;
  KILN_CHECK(al.rank() == 4 && al.shape[1] % 2 == 0 && (al.shape[3] <= 1 || al.strides[3] == 1),
             "{}: the Cuda kernel takes a [B, 2h, T, hd] with unit-stride rows, got a {} (strides {})", op, shape_str(al.shape),
             shape_str(al.strides));
  const int64_t Bn = al.shape[0], h = al.shape[1] / 2, T = al.shape[2], hd = al.shape[3];
  KILN_CHECK(l.layout.is_contiguous() && l.layout.shape == Shape({Bn, T, h}) && l.dtype == a.dtype,
             "{}: the Cuda kernel takes contiguous lambda logits [B, T, h] = [{}, {}, {}] of {}, got {} {} (a {})", op, Bn, T, h, a.dtype,
             shape_str(l.layout.shape), l.dtype, shape_str(al.shape));
  KILN_CHECK(y.is_contiguous() && y.shape == Shape({Bn, T, h, hd}) && ydt == a.dtype,
             "{}: the Cuda kernel takes a contiguous {} [B, T, h, hd] = {} of {}, got {} {} (a {})", op, yname,
             shape_str(Shape({Bn, T, h, hd})), a.dtype, shape_str(y.shape), ydt, shape_str(al.shape));
}

}  // namespace

void Cuda::diff2_combine_forward(M y, V a, V l) {
  const char* op = "diff2_combine";
  check_views(op, a, l, y.layout, y.dtype, "y");
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&y.storage, &a.storage, &l.storage}) check_device(*s, op);
  const Diff2Geom g = geom_of(a.layout, a.layout);
  const int64_t rows = a.layout.shape[0] * g.T * g.h;
  if (rows == 0 || g.hd == 0) return;
  visit_f32_f64(a.dtype, op, a.layout.shape, [&]<class T>(type_tag<T>) {
    diff2_fwd<T><<<grid_for(rows, kWarps), kWarps * kWarp, 0, stream()>>>(
        y.storage.as<T>() + y.layout.offset, a.storage.as<T>() + a.layout.offset, l.storage.as<T>() + l.layout.offset, g, rows);
    KILN_CUDA_LAUNCHED(op);
  });
}

void Cuda::diff2_combine_backward(M da, M dl, V a, V l, V dy) {
  const char* op = "diff2_combine_backward";
  check_views(op, a, l, dy.layout, dy.dtype, "dy");
  KILN_CHECK(da.layout.shape == a.layout.shape && da.dtype == a.dtype && (a.layout.shape[3] <= 1 || da.layout.strides[3] == 1) &&
                 dl.layout.is_contiguous() && dl.layout.shape == l.layout.shape && dl.dtype == a.dtype,
             "diff2_combine_backward: the Cuda kernel takes da of a's shape {} and dtype {} with unit-stride rows and a contiguous dl {} "
             "(da {} {}, dl {} {})",
             shape_str(a.layout.shape), a.dtype, shape_str(l.layout.shape), shape_str(da.layout.shape), da.dtype,
             shape_str(dl.layout.shape), dl.dtype);
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&da.storage, &dl.storage, &a.storage, &l.storage, &dy.storage})
    check_device(*s, op);
  const Diff2Geom ga = geom_of(a.layout, a.layout), gd = geom_of(a.layout, da.layout);
  const int64_t rows = a.layout.shape[0] * ga.T * ga.h;
  if (rows == 0) return;
  visit_f32_f64(a.dtype, op, a.layout.shape, [&]<class T>(type_tag<T>) {
    diff2_bwd<T><<<grid_for(rows, kWarps), kWarps * kWarp, 0, stream()>>>(
        da.storage.as<T>() + da.layout.offset, dl.storage.as<T>() + dl.layout.offset, a.storage.as<T>() + a.layout.offset,
        l.storage.as<T>() + l.layout.offset, dy.storage.as<T>() + dy.layout.offset, ga, gd, rows);
    KILN_CUDA_LAUNCHED(op);
  });
}

}  // namespace kiln
