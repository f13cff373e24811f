// Fused RMSNorm forward/backward over contiguous f32/f64 rows [N, D] (contract: core/fused_norm.hpp;
// the same formulas and operation order as backends/cpu/norm.cpp):
//   forward   ss = Σ x²,  r = 1/√(ss/D + eps) (in double, rounded to T),  y = x·r·w
//   backward  g = dy·w,  dot = Σ g·x,  c = r³·dot/D,  dx = r·g − x·c,  dw = Σ_rows dy·x·r
// Rows of up to 1024 elements: one warp per row (4 rows per block); longer rows: one 256-thread block
// per row. Both loop over rows grid-stride.
//
// dw is deterministic (no atomics): the rows are cut into P fixed chunks (P depends on N only, never
// on the device), a [P, D] partial-sum buffer gets one block per (32 columns, chunk) that sums its
// rows in a fixed order, then a second kernel sums the P partials of each column in order 0..P−1.
#include "kiln/backends/cuda/dense_common.cuh"

namespace kiln {

namespace {

using namespace cuda;
using namespace cuda::dense;

constexpr int kWarpsPerBlock = 4;      // warp-per-row kernels
constexpr int kBlockThreads = 256;     // block-per-row kernels
constexpr int64_t kWarpMaxRow = 1024;  // longest row the warp kernels take
constexpr int kDwCols = 32;            // dw partials: columns per block (threadIdx.x)
constexpr int kDwRows = 8;             // dw partials: row lanes per block (threadIdx.y)
constexpr int64_t kDwMaxChunks = 256;  // P <= this
constexpr int64_t kDwMinRows = 32;     // rows per chunk >= this

// Sum over the threads that share a row: the warp (WARP) or the block.
template <bool WARP, class T> __device__ __forceinline__ T row_sum(T v, T* scratch) {
  if constexpr (WARP)
    return warp_sum(v);
  else
    return block_sum(v, scratch);
}

// Row of this warp/block, the lane within the row, the threads per row and the grid's row step.
template <bool WARP> struct RowMap {
  int64_t first, step;
  int lane, width;
  __device__ RowMap() {
    if constexpr (WARP) {
      first = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
      step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
      lane = static_cast<int>(threadIdx.x) % kWarp;
      width = kWarp;
    } else {
      first = blockIdx.x;
      step = gridDim.x;
      lane = static_cast<int>(threadIdx.x);
      width = static_cast<int>(blockDim.x);
    }
  }
};

template <class T, bool WARP> __global__ void __launch_bounds__(kBlockThreads)
    rms_fwd(T* __restrict__ y, T* __restrict__ rstd, const T* __restrict__ x, const T* __restrict__ w, int64_t N, int64_t D, double eps) {
  __shared__ T scratch[kWarp];
  const RowMap<WARP> rm;
  for (int64_t row = rm.first; row < N; row += rm.step) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    T ss = 0;
    for (int64_t i = rm.lane; i < D; i += rm.width) ss += xr[i] * xr[i];
    ss = row_sum<WARP>(ss, scratch);
    const T rs = static_cast<T>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps));
    if (rm.lane == 0) rstd[row] = rs;
    if (w) {
      for (int64_t i = rm.lane; i < D; i += rm.width) yr[i] = xr[i] * rs * w[i];
    } else {
      for (int64_t i = rm.lane; i < D; i += rm.width) yr[i] = xr[i] * rs;
    }
  }
}

template <class T, bool WARP> __global__ void __launch_bounds__(kBlockThreads)
    rms_bwd_dx(T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ rstd, const T* __restrict__ dy,
               int64_t N, int64_t D) {
  __shared__ T scratch[kWarp];
  const RowMap<WARP> rm;
  for (int64_t row = rm.first; row < N; row += rm.step) {
    const T* xr = x + row * D;
    const T* gr = dy + row * D;
    T* dxr = dx + row * D;
    const T rs = rstd[row];
    T dot = 0;
    if (w) {
      for (int64_t i = rm.lane; i < D; i += rm.width) dot += gr[i] * w[i] * xr[i];
    } else {
      for (int64_t i = rm.lane; i < D; i += rm.width) dot += gr[i] * xr[i];
    }
    dot = row_sum<WARP>(dot, scratch);
    const T c = rs * rs * rs * dot / static_cast<T>(D);
    if (w) {
      for (int64_t i = rm.lane; i < D; i += rm.width) dxr[i] = rs * gr[i] * w[i] - xr[i] * c;
    } else {
      for (int64_t i = rm.lane; i < D; i += rm.width) dxr[i] = rs * gr[i] - xr[i] * c;
    }
  }
}

// partial[p, c] = Σ over rows r of chunk p of dy[r, c]·x[r, c]·rstd[r]; block (kDwCols, kDwRows),
// grid (ceil(D / kDwCols), P). Thread (tx, ty) sums rows r0 + ty, r0 + ty + kDwRows, ... of its
// column, then thread ty = 0 adds the kDwRows sums in order.
template <class T> __global__ void __launch_bounds__(kDwCols* kDwRows)
    rms_bwd_dw_partial(T* __restrict__ partial, const T* __restrict__ x, const T* __restrict__ rstd, const T* __restrict__ dy, int64_t N,
                       int64_t D, int64_t rows_per_chunk) {
  __shared__ T sh[kDwRows][kDwCols];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kDwCols + tx;
  const int64_t p = blockIdx.y;
  const int64_t r0 = p * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  T acc = 0;
  if (c < D)
    for (int64_t r = r0 + ty; r < r1; r += kDwRows) acc += dy[r * D + c] * x[r * D + c] * rstd[r];
  sh[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < D) {
    T s = sh[0][tx];
#pragma unroll
    for (int k = 1; k < kDwRows; ++k) s += sh[k][tx];
    partial[p * D + c] = s;
  }
}

// ------------------------------------------------------------------------------------------ host side
struct Dims {
  int64_t N = 0, D = 0;
};
Dims dims_of(const char* op, Cuda::V x) {
  KILN_CHECK(x.layout.rank() >= 1, "{}: input must have rank >= 1, got {}", op, shape_str(x.layout.shape));
  const int64_t D = x.layout.shape.back();
  return {D > 0 ? x.layout.numel() / D : 0, D};
}

void check_rows(const char* op, const char* what, const Layout& l, DType dt, const Cuda::V& x, int64_t numel) {
  KILN_CHECK(l.is_contiguous() && l.numel() == numel && dt == x.dtype, "{}: {} {} {} must be contiguous with {} elements of {} (x {})", op,
             what, shape_str(l.shape), dt, numel, x.dtype, shape_str(x.layout.shape));
}

template <class T, class Launch> void by_row_width(int64_t N, int64_t D, Launch&& launch) {
  if (D <= kWarpMaxRow)
    launch(std::true_type{}, grid_for(N, kWarpsPerBlock), kWarpsPerBlock * kWarp);
  else
    launch(std::false_type{}, grid_for(N, 1), kBlockThreads);
}

}  // namespace

void Cuda::rms_norm_forward(M y, M rstd, V x, const V* w, double eps) {
  const char* op = "rms_norm";
  const auto [N, D] = dims_of(op, x);
  check_rows(op, "x", x.layout, x.dtype, x, N * D);
  check_rows(op, "y", y.layout, y.dtype, x, N * D);
  check_rows(op, "rstd", rstd.layout, rstd.dtype, x, N);
  if (w) check_rows(op, "weight", w->layout, w->dtype, x, D);
  cuda::check_device(y.storage, op);
  cuda::check_device(rstd.storage, op);
  cuda::check_device(x.storage, op);
  if (w) cuda::check_device(w->storage, op);
  if (N == 0) return;
  visit_f32_f64(x.dtype, op, x.layout.shape, [&]<class T>(type_tag<T>) {
    T* yp = y.storage.as<T>() + y.layout.offset;
    T* rp = rstd.storage.as<T>() + rstd.layout.offset;
    const T* xp = x.storage.as<T>() + x.layout.offset;
    const T* wp = w ? w->storage.as<T>() + w->layout.offset : nullptr;
    by_row_width<T>(N, D, [&](auto warp, unsigned grid, int threads) {
      rms_fwd<T, decltype(warp)::value><<<grid, threads, 0, cuda::stream()>>>(yp, rp, xp, wp, N, D, eps);
      KILN_CUDA_LAUNCHED(op);
    });
  });
}

void Cuda::rms_norm_backward(M dx, M* dw, V x, const V* w, V rstd, V dy) {
  const char* op = "rms_norm_backward";
  const auto [N, D] = dims_of(op, x);
  check_rows(op, "x", x.layout, x.dtype, x, N * D);
  check_rows(op, "dx", dx.layout, dx.dtype, x, N * D);
  check_rows(op, "dy", dy.layout, dy.dtype, x, N * D);
  check_rows(op, "rstd", rstd.layout, rstd.dtype, x, N);
  if (w) check_rows(op, "weight", w->layout, w->dtype, x, D);
  if (dw) check_rows(op, "dw", dw->layout, dw->dtype, x, D);
  cuda::check_device(dx.storage, op);
  cuda::check_device(x.storage, op);
  cuda::check_device(rstd.storage, op);
  cuda::check_device(dy.storage, op);
  if (w) cuda::check_device(w->storage, op);
  if (dw) cuda::check_device(dw->storage, op);
  if (D == 0) return;
  if (N == 0) {
    if (dw) Cuda::fill(*dw, Scalar(0.0));
    return;
  }
  visit_f32_f64(x.dtype, op, x.layout.shape, [&]<class T>(type_tag<T>) {
    T* dxp = dx.storage.as<T>() + dx.layout.offset;
    const T* xp = x.storage.as<T>() + x.layout.offset;
    const T* wp = w ? w->storage.as<T>() + w->layout.offset : nullptr;
    const T* rp = rstd.storage.as<T>() + rstd.layout.offset;
    const T* gp = dy.storage.as<T>() + dy.layout.offset;
    const cudaStream_t s = cuda::stream();
    by_row_width<T>(N, D, [&](auto warp, unsigned grid, int threads) {
      rms_bwd_dx<T, decltype(warp)::value><<<grid, threads, 0, s>>>(dxp, xp, wp, rp, gp, N, D);
      KILN_CUDA_LAUNCHED(op);
    });
    if (!dw) return;
    T* dwp = dw->storage.as<T>() + dw->layout.offset;
    const int64_t rows_per_chunk = std::max(kDwMinRows, ceil_div(N, kDwMaxChunks));
    const int64_t P = ceil_div(N, rows_per_chunk);  // <= kDwMaxChunks
    const int64_t col_blocks = ceil_div(D, kDwCols);
    KILN_CHECK(col_blocks <= 0x7fffffff, "{}: rows of {} elements are too wide (x {})", op, D, shape_str(x.layout.shape));
    const std::shared_ptr<CudaStorage> partial = Cuda::allocate(static_cast<size_t>(P * D) * sizeof(T));
    T* pp = partial->as<T>();
    rms_bwd_dw_partial<T><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(P)), dim3(kDwCols, kDwRows), 0, s>>>(
        pp, xp, rp, gp, N, D, rows_per_chunk);
    KILN_CUDA_LAUNCHED(op);
    sum_partials_in_order<T><<<grid_for(D, 256), 256, 0, s>>>(dwp, pp, P, D);
    KILN_CUDA_LAUNCHED(op);
  });
}

}  // namespace kiln
