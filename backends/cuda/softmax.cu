// Fused softmax / log_softmax over the last axis of contiguous rows, forward and backward (contract:
// core/fused.hpp; the same formulas as backends/cpu/softmax.cpp):
//   forward   m = max x, s = Σ exp(x − m);  softmax y = exp(x − m) · (1/s)  (f64: / s),
//             log_softmax y = (x − m) − log s
//   backward  softmax dx = y (dy − Σ dy·y);  log_softmax dx = dy − exp(y) Σ dy
// bf16/f16 are read into f32, computed in f32 and rounded once on store. A NaN anywhere in a row makes
// the whole row NaN, and a row of all −inf gives NaN (−inf − (−inf)), as the Cpu backend and the
// composite do.
//
// Rows of up to 1024 elements: one warp per row (4 rows per 128-thread block), the row held in
// registers (VPT values per lane, lane l holding elements l, l + 32, ...: coalesced), so it is read
// from memory once and written once. Longer rows: one 256-thread block per row, three passes over the
// row (max, sum, write; the row stays in L2 between them). Both loop over rows grid-stride, so any row
// count fits the grid.
#include "kiln/backends/cuda/dense_common.cuh"

namespace kiln {

namespace {

using namespace cuda;
using namespace cuda::dense;

constexpr int kWarpsPerBlock = 4;   // warp kernels: rows per block
constexpr int kBlockThreads = 256;  // block kernels: threads per row
constexpr int kWarpMaxRow = 1024;   // longest row the warp kernels take (VPT <= 32)

// ------------------------------------------------------------------------------------------- forward
template <class T, int VPT> __global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    softmax_fwd_warp(T* __restrict__ y, const T* __restrict__ x, int64_t rows, int n, bool log) {
  using C = compute_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; row < rows; row += step) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    C v[VPT];
    C m = neg_inf<C>();
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int i = lane + kWarp * j;
      v[j] = i < n ? ld(xr + i) : neg_inf<C>();
      m = max_nan(m, v[j]);
    }
    m = warp_max(m);
    C s = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (lane + kWarp * j < n) {
        const C e = dexp(v[j] - m);
        s += e;
        if (!log) v[j] = e;
      }
    }
    s = warp_sum(s);
    if (log) {
      const C ls = dlog(s);
#pragma unroll
      for (int j = 0; j < VPT; ++j)
        if (lane + kWarp * j < n) st(yr + lane + kWarp * j, (v[j] - m) - ls);
    } else {
      if constexpr (std::is_same_v<C, double>) {
#pragma unroll
        for (int j = 0; j < VPT; ++j)
          if (lane + kWarp * j < n) st(yr + lane + kWarp * j, v[j] / s);
      } else {
        const C inv = C(1) / s;
#pragma unroll
        for (int j = 0; j < VPT; ++j)
          if (lane + kWarp * j < n) st(yr + lane + kWarp * j, v[j] * inv);
      }
    }
  }
}

template <class T> __global__ void __launch_bounds__(kBlockThreads)
    softmax_fwd_block(T* __restrict__ y, const T* __restrict__ x, int64_t rows, int64_t n, bool log) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarp];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    C m = neg_inf<C>();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = max_nan(m, ld(xr + i));
    m = block_max(m, scratch, neg_inf<C>());
    C s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += dexp(ld(xr + i) - m);
    s = block_sum(s, scratch);
    if (log) {
      const C ls = dlog(s);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st(yr + i, (ld(xr + i) - m) - ls);
    } else if constexpr (std::is_same_v<C, double>) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st(yr + i, dexp(ld(xr + i) - m) / s);
    } else {
      const C inv = C(1) / s;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) st(yr + i, dexp(ld(xr + i) - m) * inv);
    }
  }
}

// ------------------------------------------------------------------------------------------ backward
template <class T, int VPT> __global__ void __launch_bounds__(kWarpsPerBlock* kWarp)
    softmax_bwd_warp(T* __restrict__ dx, const T* __restrict__ y, const T* __restrict__ dy, int64_t rows, int n, bool log) {
  using C = compute_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; row < rows; row += step) {
    const T* yr = y + row * n;
    const T* gr = dy + row * n;
    T* dr = dx + row * n;
    C yv[VPT], gv[VPT];
    C s = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int i = lane + kWarp * j;
      yv[j] = i < n ? ld(yr + i) : C(0);
      gv[j] = i < n ? ld(gr + i) : C(0);
      if (i < n) s += log ? gv[j] : gv[j] * yv[j];
    }
    s = warp_sum(s);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int i = lane + kWarp * j;
      if (i < n) st(dr + i, log ? gv[j] - dexp(yv[j]) * s : yv[j] * (gv[j] - s));
    }
  }
}

template <class T> __global__ void __launch_bounds__(kBlockThreads)
    softmax_bwd_block(T* __restrict__ dx, const T* __restrict__ y, const T* __restrict__ dy, int64_t rows, int64_t n, bool log) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarp];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * n;
    const T* gr = dy + row * n;
    T* dr = dx + row * n;
    C s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += log ? ld(gr + i) : ld(gr + i) * ld(yr + i);
    s = block_sum(s, scratch);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C yv = ld(yr + i), gv = ld(gr + i);
      st(dr + i, log ? gv - dexp(yv) * s : yv * (gv - s));
    }
  }
}

// ------------------------------------------------------------------------------------------- launch
struct Rows {
  int64_t rows = 0, n = 0;
};
Rows rows_of(const Layout& l) {
  const int64_t n = l.rank() == 0 ? 1 : l.shape.back();
  return {n == 0 ? 0 : l.numel() / n, n};
}

void check_args(const char* op, Cuda::M out, Cuda::V x) {
  KILN_CHECK(out.layout.shape == x.layout.shape && out.dtype == x.dtype, "{}: out {} {} vs input {} {}", op, shape_str(out.layout.shape),
             out.dtype, shape_str(x.layout.shape), x.dtype);
  KILN_CHECK(x.layout.is_contiguous() && out.layout.is_contiguous(), "{}: needs contiguous tensors (shape {})", op,
             shape_str(x.layout.shape));
  KILN_CHECK(is_floating(x.dtype), "{}: needs a float dtype, got {} (shape {})", op, x.dtype, shape_str(x.layout.shape));
  cuda::check_device(out.storage, op);
  cuda::check_device(x.storage, op);
}

template <class T> void launch_fwd(const char* op, T* y, const T* x, Rows r, bool log) {
  const cudaStream_t s = cuda::stream();
  if (r.n <= kWarpMaxRow) {
    const unsigned grid = grid_for(r.rows, kWarpsPerBlock);
    const int n = static_cast<int>(r.n);
    if (n <= 64)
      softmax_fwd_warp<T, 2><<<grid, kWarpsPerBlock * kWarp, 0, s>>>(y, x, r.rows, n, log);
    else if (n <= 256)
      softmax_fwd_warp<T, 8><<<grid, kWarpsPerBlock * kWarp, 0, s>>>(y, x, r.rows, n, log);
    else
      softmax_fwd_warp<T, 32><<<grid, kWarpsPerBlock * kWarp, 0, s>>>(y, x, r.rows, n, log);
  } else {
    softmax_fwd_block<T><<<grid_for(r.rows, 1), kBlockThreads, 0, s>>>(y, x, r.rows, r.n, log);
  }
  KILN_CUDA_LAUNCHED(op);
}

template <class T> void launch_bwd(const char* op, T* dx, const T* y, const T* dy, Rows r, bool log) {
  const cudaStream_t s = cuda::stream();
  if (r.n <= kWarpMaxRow) {
    const unsigned grid = grid_for(r.rows, kWarpsPerBlock);
    const int n = static_cast<int>(r.n);
    if (n <= 64)
      softmax_bwd_warp<T, 2><<<grid, kWarpsPerBlock * kWarp, 0, s>>>(dx, y, dy, r.rows, n, log);
    else if (n <= 256)
      softmax_bwd_warp<T, 8><<<grid, kWarpsPerBlock * kWarp, 0, s>>>(dx, y, dy, r.rows, n, log);
    else
      softmax_bwd_warp<T, 32><<<grid, kWarpsPerBlock * kWarp, 0, s>>>(dx, y, dy, r.rows, n, log);
  } else {
    softmax_bwd_block<T><<<grid_for(r.rows, 1), kBlockThreads, 0, s>>>(dx, y, dy, r.rows, r.n, log);
  }
  KILN_CUDA_LAUNCHED(op);
}

}  // namespace

void Cuda::softmax_lastdim(M out, V x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_args(op, out, x);
  const Rows r = rows_of(x.layout);
  if (r.rows == 0) return;
  visit_float(x.dtype, op, x.layout.shape, [&]<class T>(type_tag<T>) {
    launch_fwd<T>(op, out.storage.as<T>() + out.layout.offset, x.storage.as<T>() + x.layout.offset, r, log);
  });
}

void Cuda::softmax_lastdim_backward(M dx, V y, V dy, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_args(op, dx, y);
  check_args(op, dx, dy);
  const Rows r = rows_of(y.layout);
  if (r.rows == 0) return;
  visit_float(y.dtype, op, y.layout.shape, [&]<class T>(type_tag<T>) {
    launch_bwd<T>(op, dx.storage.as<T>() + dx.layout.offset, y.storage.as<T>() + y.layout.offset, dy.storage.as<T>() + dy.layout.offset, r,
                  log);
  });
}

}  // namespace kiln
