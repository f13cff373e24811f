// Fused softmax cross-entropy on the GPU (contract in core/fused_loss.hpp): one thread block per row
// of contiguous f32/f64 logits [N, C]; block-wide max and sum by warp shuffles (device.cuh). The
// forward reads the row twice (max, then Σ exp), the backward once.
#include <initializer_list>
#include <limits>

#include "kiln/backends/cuda/device.cuh"
#include "kiln/core/error.hpp"

namespace kiln {
namespace {

constexpr int kThreads = 256;

template <class T> __global__ void ce_forward_kernel(T* __restrict__ loss, T* __restrict__ lse, const T* __restrict__ x,
                                                     const int64_t* __restrict__ t, int64_t C, int64_t ignore_index, T s) {
  __shared__ T scratch[32];
  const int64_t i = blockIdx.x;
  const T* row = x + i * C;
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T v = row[c];
    m = (v > m || v != v) ? v : m;
  }
  m = cuda::block_max(m, scratch, -std::numeric_limits<T>::infinity());
  T sum = 0, xs = 0;
  if (m != -std::numeric_limits<T>::infinity())
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += exp(row[c] - m);
  for (int64_t c = threadIdx.x; s != T(0) && c < C; c += blockDim.x) xs += row[c];
  sum = cuda::block_sum(sum, scratch);
  xs = cuda::block_sum(xs, scratch);
  if (threadIdx.x == 0) {
    const T l = m == -std::numeric_limits<T>::infinity() ? m : m + log(sum);
    lse[i] = l;
    const int64_t ti = t[i];
    loss[i] = ti == ignore_index ? T(0) : l - (T(1) - s) * row[ti] - s * xs / static_cast<T>(C);
  }
}

template <class T> __global__ void ce_backward_kernel(T* __restrict__ dx, const T* __restrict__ x, const T* __restrict__ lse,
                                                      const int64_t* __restrict__ t, const T* __restrict__ g, int64_t C,
                                                      int64_t ignore_index, T s) {
  const int64_t i = blockIdx.x;
  const T* row = x + i * C;
  T* d = dx + i * C;
  const int64_t ti = t[i];
  if (ti == ignore_index) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = T(0);
    return;
  }
  const T gi = g[i], l = lse[i], sc = s / static_cast<T>(C), hit = (T(1) - s);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = gi * (exp(row[c] - l) - sc - (c == ti ? hit : T(0)));
}

void ce_views(const char* op, const Layout& x, DType d) {
  KILN_CHECK(x.rank() == 2 && x.is_contiguous(), "{}: logits must be contiguous [N, C], got {}", op, shape_str(x.shape));
  KILN_CHECK(d == DType::f32 || d == DType::f64, "{}: f32/f64 logits only, got {}", op, d);
  KILN_CHECK(x.shape[0] <= 0x7fffffffLL, "{}: {} rows exceed the grid limit", op, x.shape[0]);
}

template <class T> T* dptr(CudaStorage& s, const Layout& l) { return s.as<T>() + l.offset; }
template <class T> const T* dptr(const CudaStorage& s, const Layout& l) { return s.as<T>() + l.offset; }

}  // namespace

void Cuda::cross_entropy_forward(M loss, M lse, V logits, V targets, int64_t ignore_index, double smoothing) {
  const char* op = "cross_entropy";
  ce_views(op, logits.layout, logits.dtype);
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&loss.storage, &lse.storage, &logits.storage, &targets.storage})
    cuda::check_device(*s, op);
  const int64_t N = logits.layout.shape[0], C = logits.layout.shape[1];
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(N);
  if (logits.dtype == DType::f32)
    ce_forward_kernel<float><<<blocks, kThreads, 0, cuda::stream()>>>(
        dptr<float>(loss.storage, loss.layout), dptr<float>(lse.storage, lse.layout), dptr<float>(logits.storage, logits.layout),
        dptr<int64_t>(targets.storage, targets.layout), C, ignore_index, static_cast<float>(smoothing));
  else
    ce_forward_kernel<double><<<blocks, kThreads, 0, cuda::stream()>>>(
        dptr<double>(loss.storage, loss.layout), dptr<double>(lse.storage, lse.layout), dptr<double>(logits.storage, logits.layout),
        dptr<int64_t>(targets.storage, targets.layout), C, ignore_index, smoothing);
  KILN_CUDA_LAUNCHED(op);
}

void Cuda::cross_entropy_backward(M dlogits, V logits, V lse, V targets, V g, int64_t ignore_index, double smoothing) {
  const char* op = "cross_entropy_backward";
  ce_views(op, logits.layout, logits.dtype);
  for (const CudaStorage* s :
       std::initializer_list<const CudaStorage*>{&dlogits.storage, &lse.storage, &logits.storage, &targets.storage, &g.storage})
    cuda::check_device(*s, op);
  const int64_t N = logits.layout.shape[0], C = logits.layout.shape[1];
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(N);
  if (logits.dtype == DType::f32)
    ce_backward_kernel<float><<<blocks, kThreads, 0, cuda::stream()>>>(
        dptr<float>(dlogits.storage, dlogits.layout), dptr<float>(logits.storage, logits.layout), dptr<float>(lse.storage, lse.layout),
        dptr<int64_t>(targets.storage, targets.layout), dptr<float>(g.storage, g.layout), C, ignore_index, static_cast<float>(smoothing));
  else
    ce_backward_kernel<double><<<blocks, kThreads, 0, cuda::stream()>>>(
        dptr<double>(dlogits.storage, dlogits.layout), dptr<double>(logits.storage, logits.layout), dptr<double>(lse.storage, lse.layout),
        dptr<int64_t>(targets.storage, targets.layout), dptr<double>(g.storage, g.layout), C, ignore_index, smoothing);
  KILN_CUDA_LAUNCHED(op);
}

}  // namespace kiln
