// Fused softmax cross-entropy on the GPU (contract in core/fused_loss.hpp): one thread block per row
// of contiguous f32/f64/bf16/f16 logits [N, C] (X), computed in T (f64 for f64, else f32: a half
// value is widened as it is read, loss, lse and g are f32, and each dlogit is rounded once to X);
// block-wide max and sum by warp shuffles (device.cuh). The forward reads the row twice (max, then
// Σ exp), the backward once.
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "kiln/backends/cuda/dense_common.cuh"
#include "kiln/backends/cuda/device.cuh"
#include "kiln/core/error.hpp"

namespace kiln {
namespace {

constexpr int kThreads = 256;

template <class X, class T> __global__ void ce_forward_kernel(T* __restrict__ loss, T* __restrict__ lse, const X* __restrict__ x,
                                                              const int64_t* __restrict__ t, int64_t C, int64_t ignore_index, T s) {
  __shared__ T scratch[32];
  const int64_t i = blockIdx.x;
  const X* row = x + i * C;
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const T v = static_cast<T>(row[c]);
    m = (v > m || v != v) ? v : m;
  }
  m = cuda::block_max(m, scratch, -std::numeric_limits<T>::infinity());
  T sum = 0, xs = 0;
  if (m != -std::numeric_limits<T>::infinity())
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += exp(static_cast<T>(row[c]) - m);
  for (int64_t c = threadIdx.x; s != T(0) && c < C; c += blockDim.x) xs += static_cast<T>(row[c]);
  sum = cuda::block_sum(sum, scratch);
  xs = cuda::block_sum(xs, scratch);
  if (threadIdx.x == 0) {
    const T l = m == -std::numeric_limits<T>::infinity() ? m : m + log(sum);
    lse[i] = l;
    const int64_t ti = t[i];
    loss[i] = ti == ignore_index ? T(0) : l - (T(1) - s) * static_cast<T>(row[ti]) - s * xs / static_cast<T>(C);
  }
}

template <class X, class T> __global__ void ce_backward_kernel(X* __restrict__ dx, const X* __restrict__ x, const T* __restrict__ lse,
                                                               const int64_t* __restrict__ t, const T* __restrict__ g, int64_t C,
                                                               int64_t ignore_index, T s) {
  const int64_t i = blockIdx.x;
  const X* row = x + i * C;
  X* d = dx + i * C;
  const int64_t ti = t[i];
  if (ti == ignore_index) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = X(T(0));
    return;
  }
  const T gi = g[i], l = lse[i], sc = s / static_cast<T>(C), hit = (T(1) - s);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = X(gi * (exp(static_cast<T>(row[c]) - l) - sc - (c == ti ? hit : T(0))));
}

void ce_views(const char* op, const Layout& x, DType d) {
  KILN_CHECK(x.rank() == 2 && x.is_contiguous(), "{}: logits must be contiguous [N, C], got {}", op, shape_str(x.shape));
  KILN_CHECK(is_floating(d), "{}: float logits only, got {}", op, d);
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
  cuda::dense::visit_float(logits.dtype, op, logits.layout.shape, [&]<class X>(type_tag<X>) {
    using T = std::conditional_t<std::is_same_v<X, double>, double, float>;
    ce_forward_kernel<X, T><<<blocks, kThreads, 0, cuda::stream()>>>(
        dptr<T>(loss.storage, loss.layout), dptr<T>(lse.storage, lse.layout), dptr<X>(logits.storage, logits.layout),
        dptr<int64_t>(targets.storage, targets.layout), C, ignore_index, static_cast<T>(smoothing));
  });
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
  cuda::dense::visit_float(logits.dtype, op, logits.layout.shape, [&]<class X>(type_tag<X>) {
    using T = std::conditional_t<std::is_same_v<X, double>, double, float>;
    ce_backward_kernel<X, T><<<blocks, kThreads, 0, cuda::stream()>>>(
        dptr<X>(dlogits.storage, dlogits.layout), dptr<X>(logits.storage, logits.layout), dptr<T>(lse.storage, lse.layout),
        dptr<int64_t>(targets.storage, targets.layout), dptr<T>(g.storage, g.layout), C, ignore_index, static_cast<T>(smoothing));
  });
  KILN_CUDA_LAUNCHED(op);
}

}  // namespace kiln
