// Fused depth attention of Attention Residuals on the GPU, and the two primitives of its two-phase
// inference (contract and formulas: core/fused_depth.hpp; the same arithmetic as
// backends/cpu/depth.cpp). f32/f64, contiguous rows [N, D]; up to kMaxSources sources, passed by value
// in the kernel's parameters.
//
//  * forward / Phase 1: a warp per (row, query): one pass over each source row for Σv² and q·v (warp
//    shuffles), the logits in shared memory, softmax statistics in every lane, then a pass that
//    accumulates h (or acc) with the weights recomputed per lane;
//  * merge: a warp per row;
//  * backward: a warp per row for a_i = dh·v_i, s_i = q·v_i and dv_i; c_i = dlogit_i·r_i goes to a
//    scratch [n, N], and dq = Σ_rows Σ_i c_i v_i comes from fixed row chunks (32 x 8 tiles) summed in
//    order by a second kernel: deterministic, no atomics (like RMSNorm's dw in norm.cu).
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <vector>

#include "kiln/backends/cuda/dense_common.cuh"

namespace kiln {

namespace {

using namespace cuda;
using namespace cuda::dense;

constexpr int kMaxSources = 128;
constexpr int kWarps = 4;  // rows (work items) per 128-thread block
constexpr int kColX = 32, kColY = 8;
constexpr int64_t kMinChunkRows = 64, kMaxChunks = 1024;

template <class T> struct Srcs { const T* p[kMaxSources]; };
template <class T> struct DstPtrs { T* p[kMaxSources]; };

// Σ a·b and Σ a·c over a row, strided over the warp's lanes, reduced to every lane.
template <class T> __device__ __forceinline__ void warp_dot2(const T* a, const T* b, const T* c, int64_t D, int lane, T& ab, T& ac) {
  T x = 0, y = 0;
  for (int64_t k = lane; k < D; k += kWarp) {
    x += a[k] * b[k];
    y += a[k] * c[k];
  }
  ab = warp_sum(x);
  ac = warp_sum(y);
}

template <class T> __device__ __forceinline__ T rstd_of(T ss, int64_t D, double eps) {
  return static_cast<T>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(D) + eps));
}

// Work item u = j * N + t (query j, row t). Forward (S = 1): out = h, st1 = alpha, st2 = rstd.
// Phase 1: out = acc [S, N, D], st1 = m [S, N], st2 = l [S, N].
template <class T, bool Phase1> __global__ void __launch_bounds__(kWarps* kWarp)
    depth_fwd(const Srcs<T> v, int n, const T* __restrict__ q, int64_t S, int64_t N, int64_t D, double eps, T* __restrict__ out,
              T* __restrict__ st1, T* __restrict__ st2) {
  __shared__ T sl[kWarps][kMaxSources];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, w = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t items = S * N, step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kWarps + w; u < items; u += step) {
    const int64_t j = u / N, t = u - j * N;
    const T* qj = q + j * D;
    for (int i = 0; i < n; ++i) {
      const T* x = v.p[i] + t * D;
      T ss, s;
      warp_dot2(x, x, qj, D, lane, ss, s);
      const T r = rstd_of<T>(ss, D, eps);
      if (lane == 0) {
        sl[w][i] = r * s;
        if constexpr (!Phase1) st2[i * N + t] = r;
      }
    }
    __syncwarp();
    T m = neg_inf<T>();
    for (int i = 0; i < n; ++i) m = max_nan(m, sl[w][i]);
    T z = 0;
    for (int i = 0; i < n; ++i) z += dexp(sl[w][i] - m);
    if constexpr (Phase1) {
      if (lane == 0) {
        st1[u] = m;
        st2[u] = z;
      }
    }
    T* o = out + u * D;
    for (int i = 0; i < n; ++i) {
      const T e = dexp(sl[w][i] - m);
      const T a = Phase1 ? e : e / z;
      if constexpr (!Phase1) {
        if (lane == 0) st1[i * N + t] = a;
      }
      const T* x = v.p[i] + t * D;
      for (int64_t k = lane; k < D; k += kWarp) o[k] = i == 0 ? a * x[k] : o[k] + a * x[k];
    }
    __syncwarp();  // sl is rewritten by the warp's next item
  }
}

// h = (acc·e^{m−M} + p·e^{lp−M}) / (l·e^{m−M} + e^{lp−M}), lp = r_p (q·p); without p: acc / l.
template <class T> __global__ void __launch_bounds__(kWarps* kWarp)
    depth_merge(T* __restrict__ h, const T* __restrict__ m, const T* __restrict__ l, const T* __restrict__ acc, const T* __restrict__ p,
                const T* __restrict__ q, int64_t N, int64_t D, double eps) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp, w = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + w; t < N; t += step) {
    const T* a = acc + t * D;
    T* hr = h + t * D;
    if (!p) {
      const T lt = l[t];
      for (int64_t k = lane; k < D; k += kWarp) hr[k] = a[k] / lt;
      continue;
    }
    const T* x = p + t * D;
    T ss, s;
    warp_dot2(x, x, q, D, lane, ss, s);
    const T lp = rstd_of<T>(ss, D, eps) * s;
    const T mt = m[t], mx = max_nan(mt, lp);
    const T wa = dexp(mt - mx), wb = dexp(lp - mx);
    const T zt = l[t] * wa + wb;
    for (int64_t k = lane; k < D; k += kWarp) hr[k] = (a[k] * wa + x[k] * wb) / zt;
  }
}

// dv_i = α_i dh + c_i (q − s_i r_i² v_i / D), c_i = α_i (a_i − Σ_j α_j a_j) r_i (also written to c).
template <class T> __global__ void __launch_bounds__(kWarps* kWarp)
    depth_bwd_dv(const DstPtrs<T> dv, T* __restrict__ c, const Srcs<T> v, int n, const T* __restrict__ q, const T* __restrict__ alpha,
                 const T* __restrict__ rstd, const T* __restrict__ dh, int64_t N, int64_t D) {
  __shared__ T sa[kWarps][kMaxSources], ssh[kWarps][kMaxSources];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, w = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + w; t < N; t += step) {
    const T* g = dh + t * D;
    T dot = 0;
    for (int i = 0; i < n; ++i) {
      const T* x = v.p[i] + t * D;
      T ai, si;
      warp_dot2(x, g, q, D, lane, ai, si);
      if (lane == 0) {
        sa[w][i] = ai;
        ssh[w][i] = si;
      }
      dot += alpha[i * N + t] * ai;
    }
    __syncwarp();
    for (int i = 0; i < n; ++i) {
      const T al = alpha[i * N + t], r = rstd[i * N + t];
      const T ci = al * (sa[w][i] - dot) * r;
      const T ce = ci * ssh[w][i] * r * r / static_cast<T>(D);
      if (lane == 0) c[i * N + t] = ci;
      const T* x = v.p[i] + t * D;
      T* d = dv.p[i] + t * D;
      for (int64_t k = lane; k < D; k += kWarp) d[k] = al * g[k] + ci * q[k] - ce * x[k];
    }
    __syncwarp();
  }
}

// partial[p, k] = Σ over rows t of chunk p of Σ_i c[i, t] v_i[t, k]; block (kColX, kColY), grid
// (ceil(D / kColX), P); thread (tx, ty) takes rows r0 + ty, r0 + ty + kColY, ..., then ty = 0 adds the
// kColY sums in order.
template <class T> __global__ void __launch_bounds__(kColX* kColY)
    depth_bwd_dq_partial(T* __restrict__ partial, const T* __restrict__ c, const Srcs<T> v, int n, int64_t N, int64_t D,
                         int64_t rows_per_chunk) {
  __shared__ T sh[kColY][kColX];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kColX + tx, p = blockIdx.y;
  const int64_t r0 = p * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  T acc = 0;
  if (k < D)
    for (int64_t t = r0 + ty; t < r1; t += kColY)
      for (int i = 0; i < n; ++i) acc += c[i * N + t] * v.p[i][t * D + k];
  sh[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && k < D) {
    T s = sh[0][tx];
#pragma unroll
    for (int y = 1; y < kColY; ++y) s += sh[y][tx];
    partial[p * D + k] = s;
  }
}

// ------------------------------------------------------------------------------------------ host side
void check_rows(const char* op, const char* what, const Layout& l, DType dt, DType want, int64_t numel) {
  KILN_CHECK(l.is_contiguous() && l.numel() == numel && dt == want, "{}: {} {} {} must be contiguous with {} elements of {}", op, what,
             shape_str(l.shape), dt, numel, want);
}

template <class T, class Vs> Srcs<T> sources_of(const char* op, const Vs& v, DType dt, int64_t N, int64_t D) {
  KILN_CHECK(!v.empty() && v.size() <= static_cast<size_t>(kMaxSources), "{}: {} sources; the Cuda kernel takes 1 to {}", op, v.size(),
             kMaxSources);
  Srcs<T> s{};
  for (size_t i = 0; i < v.size(); ++i) {
    check_rows(op, "source", v[i].layout, v[i].dtype, dt, N * D);
    check_device(v[i].storage, op);
    s.p[i] = v[i].storage.template as<T>() + v[i].layout.offset;
  }
  return s;
}

}  // namespace

void Cuda::depth_attention_forward(M h, M alpha, M rstd, const std::vector<V>& v, V q, double eps) {
  const char* op = "depth_attention";
  const int64_t D = h.layout.shape.back(), N = D > 0 ? h.layout.numel() / D : 0;
  const auto n = static_cast<int64_t>(v.size());
  check_rows(op, "h", h.layout, h.dtype, h.dtype, N * D);
  check_rows(op, "alpha", alpha.layout, alpha.dtype, h.dtype, n * N);
  check_rows(op, "rstd", rstd.layout, rstd.dtype, h.dtype, n * N);
  check_rows(op, "query", q.layout, q.dtype, h.dtype, D);
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&h.storage, &alpha.storage, &rstd.storage, &q.storage})
    check_device(*s, op);
  if (N == 0 || D == 0) return;
  visit_f32_f64(h.dtype, op, h.layout.shape, [&]<class T>(type_tag<T>) {
    const Srcs<T> s = sources_of<T>(op, v, h.dtype, N, D);
    depth_fwd<T, false><<<grid_for(N, kWarps), kWarps * kWarp, 0, stream()>>>(
        s, static_cast<int>(n), q.storage.as<T>() + q.layout.offset, 1, N, D, eps, h.storage.as<T>() + h.layout.offset,
        alpha.storage.as<T>() + alpha.layout.offset, rstd.storage.as<T>() + rstd.layout.offset);
    KILN_CUDA_LAUNCHED(op);
  });
}

void Cuda::depth_attention_backward(const std::vector<M>& dv, M dq, const std::vector<V>& v, V q, V alpha, V rstd, V dh) {
  const char* op = "depth_attention_backward";
  const int64_t D = dh.layout.shape.back(), N = D > 0 ? dh.layout.numel() / D : 0;
  const auto n = static_cast<int64_t>(v.size());
  KILN_CHECK(dv.size() == v.size(), "{}: {} gradients for {} sources", op, dv.size(), v.size());
  check_rows(op, "dq", dq.layout, dq.dtype, dh.dtype, D);
  check_rows(op, "query", q.layout, q.dtype, dh.dtype, D);
  check_rows(op, "alpha", alpha.layout, alpha.dtype, dh.dtype, n * N);
  check_rows(op, "rstd", rstd.layout, rstd.dtype, dh.dtype, n * N);
  for (const CudaStorage* s :
       std::initializer_list<const CudaStorage*>{&dq.storage, &q.storage, &alpha.storage, &rstd.storage, &dh.storage})
    check_device(*s, op);
  if (D == 0) return;
  if (N == 0) return Cuda::fill(dq, Scalar(0.0));
  visit_f32_f64(dh.dtype, op, dh.layout.shape, [&]<class T>(type_tag<T>) {
    const Srcs<T> s = sources_of<T>(op, v, dh.dtype, N, D);
    DstPtrs<T> d{};
    for (size_t i = 0; i < dv.size(); ++i) {
      check_rows(op, "dv", dv[i].layout, dv[i].dtype, dh.dtype, N * D);
      check_device(dv[i].storage, op);
      d.p[i] = dv[i].storage.template as<T>() + dv[i].layout.offset;
    }
    const cudaStream_t st = stream();
    const std::shared_ptr<CudaStorage> cbuf = Cuda::allocate(static_cast<size_t>(n * N) * sizeof(T));
    T* cp = cbuf->as<T>();
    const T* qp = q.storage.as<T>() + q.layout.offset;
    depth_bwd_dv<T><<<grid_for(N, kWarps), kWarps * kWarp, 0, st>>>(
        d, cp, s, static_cast<int>(n), qp, alpha.storage.as<T>() + alpha.layout.offset, rstd.storage.as<T>() + rstd.layout.offset,
        dh.storage.as<T>() + dh.layout.offset, N, D);
    KILN_CUDA_LAUNCHED(op);
    const int64_t rows_per_chunk = std::max(kMinChunkRows, ceil_div(N, kMaxChunks));
    const int64_t P = ceil_div(N, rows_per_chunk);
    const int64_t col_blocks = ceil_div(D, kColX);
    KILN_CHECK(col_blocks <= 0x7fffffff, "{}: rows of {} elements are too wide", op, D);
    const std::shared_ptr<CudaStorage> partial = Cuda::allocate(static_cast<size_t>(P * D) * sizeof(T));
    T* pp = partial->as<T>();
    depth_bwd_dq_partial<T><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(P)), dim3(kColX, kColY), 0, st>>>(
        pp, cp, s, static_cast<int>(n), N, D, rows_per_chunk);
    KILN_CUDA_LAUNCHED(op);
    sum_partials_in_order<T><<<grid_for(D, 256), 256, 0, st>>>(dq.storage.as<T>() + dq.layout.offset, pp, P, D);
    KILN_CUDA_LAUNCHED(op);
  });
}

void Cuda::depth_attention_phase1(M m, M l, M acc, const std::vector<V>& v, V Q, double eps) {
  const char* op = "depth_attention_phase1";
  KILN_CHECK(Q.layout.rank() == 2, "{}: queries must be [S, D], got {}", op, shape_str(Q.layout.shape));
  const int64_t S = Q.layout.shape[0], D = Q.layout.shape[1], N = S > 0 ? m.layout.numel() / S : 0;
  check_rows(op, "queries", Q.layout, Q.dtype, Q.dtype, S * D);
  check_rows(op, "m", m.layout, m.dtype, Q.dtype, S * N);
  check_rows(op, "l", l.layout, l.dtype, Q.dtype, S * N);
  check_rows(op, "acc", acc.layout, acc.dtype, Q.dtype, S * N * D);
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&m.storage, &l.storage, &acc.storage, &Q.storage})
    check_device(*s, op);
  if (S == 0 || N == 0 || D == 0) return;
  visit_f32_f64(Q.dtype, op, Q.layout.shape, [&]<class T>(type_tag<T>) {
    const Srcs<T> s = sources_of<T>(op, v, Q.dtype, N, D);
    depth_fwd<T, true><<<grid_for(S * N, kWarps), kWarps * kWarp, 0, stream()>>>(
        s, static_cast<int>(v.size()), Q.storage.as<T>() + Q.layout.offset, S, N, D, eps, acc.storage.as<T>() + acc.layout.offset,
        m.storage.as<T>() + m.layout.offset, l.storage.as<T>() + l.layout.offset);
    KILN_CUDA_LAUNCHED(op);
  });
}

void Cuda::depth_attention_merge(M h, V m, V l, V acc, const V* p, V q, double eps) {
  const char* op = "depth_attention_merge";
  const int64_t D = h.layout.shape.back(), N = D > 0 ? h.layout.numel() / D : 0;
  check_rows(op, "h", h.layout, h.dtype, h.dtype, N * D);
  check_rows(op, "m", m.layout, m.dtype, h.dtype, N);
  check_rows(op, "l", l.layout, l.dtype, h.dtype, N);
  check_rows(op, "acc", acc.layout, acc.dtype, h.dtype, N * D);
  check_rows(op, "query", q.layout, q.dtype, h.dtype, D);
  if (p) check_rows(op, "partial", p->layout, p->dtype, h.dtype, N * D);
  for (const CudaStorage* s : std::initializer_list<const CudaStorage*>{&h.storage, &m.storage, &l.storage, &acc.storage, &q.storage})
    check_device(*s, op);
  if (p) check_device(p->storage, op);
  if (N == 0 || D == 0) return;
  visit_f32_f64(h.dtype, op, h.layout.shape, [&]<class T>(type_tag<T>) {
    depth_merge<T><<<grid_for(N, kWarps), kWarps * kWarp, 0, stream()>>>(
        h.storage.as<T>() + h.layout.offset, m.storage.as<T>() + m.layout.offset, l.storage.as<T>() + l.layout.offset,
        acc.storage.as<T>() + acc.layout.offset, p ? p->storage.as<T>() + p->layout.offset : nullptr, q.storage.as<T>() + q.layout.offset,
        N, D, eps);
    KILN_CUDA_LAUNCHED(op);
  });
}

}  // namespace kiln
