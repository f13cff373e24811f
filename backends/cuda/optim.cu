// Multi-tensor Adam/AdamW on the GPU (contract in core/fused_optim.hpp). The parameters of a group
// are packed, up to kMaxTensors at a time, into one kernel argument block: each thread block updates
// one tile of kTile elements of one tensor, so a model's hundreds of parameters take a handful of
// launches instead of eight per parameter. Elementwise math in the tensor's dtype (f32 or f64), like
// the Cpu backend's fused loop.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/backends/cuda/device.cuh"
#include "kiln/core/error.hpp"

namespace kiln {
namespace {

constexpr int kMaxTensors = 48;  // keeps the argument block under the 4 KiB kernel-parameter limit
constexpr int64_t kTile = 4096;
constexpr int kThreads = 256;

template <class T> struct AdamPack {
  T* w[kMaxTensors];
  T* m[kMaxTensors];
  T* v[kMaxTensors];
  const T* g[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first_tile[kMaxTensors + 1];  // tile prefix sums: tensor i owns tiles [first_tile[i], first_tile[i+1])
  int count;
};

template <class T> struct AdamScalars {
  T b1, b2, ob1, ob2, decay, wd, step, inv_bc2, eps;
  bool l2, dec;
};

template <class T> __global__ void adam_kernel(const AdamPack<T> p, const AdamScalars<T> s) {
  const int64_t tile = blockIdx.x;
  int i = 0;
  while (i + 1 < p.count && p.first_tile[i + 1] <= tile) ++i;
  const int64_t lo = (tile - p.first_tile[i]) * kTile, hi = p.n[i] < lo + kTile ? p.n[i] : lo + kTile;
  T* w = p.w[i];
  T* m = p.m[i];
  T* v = p.v[i];
  const T* g = p.g[i];
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    T wi = w[k], gi = g[k];
    if (s.dec) wi *= s.decay;
    if (s.l2) gi += s.wd * wi;
    const T mi = s.b1 * m[k] + s.ob1 * gi;
    const T vi = s.b2 * v[k] + s.ob2 * (gi * gi);
    m[k] = mi;
    v[k] = vi;
    w[k] = wi - s.step * (mi / (sqrt(vi) * s.inv_bc2 + s.eps));
  }
}

template <class T> void launch_adam(const std::vector<size_t>& idx, const std::vector<Cuda::M>& w, const std::vector<Cuda::M>& m,
                                    const std::vector<Cuda::M>& v, const std::vector<Cuda::V>& g, const fused::AdamHyper& h) {
  AdamScalars<T> s{};
  s.b1 = static_cast<T>(h.beta1);
  s.b2 = static_cast<T>(h.beta2);
  s.ob1 = static_cast<T>(1.0 - h.beta1);
  s.ob2 = static_cast<T>(1.0 - h.beta2);
  s.decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
  s.wd = static_cast<T>(h.weight_decay);
  s.step = static_cast<T>(h.lr / h.bc1);
  s.inv_bc2 = static_cast<T>(1.0 / h.bc2_sqrt);
  s.eps = static_cast<T>(h.eps);
  s.l2 = !h.decoupled && h.weight_decay != 0;
  s.dec = h.decoupled && h.weight_decay != 0;
  for (size_t at = 0; at < idx.size();) {
    AdamPack<T> p{};
    p.count = 0;
    int64_t tiles = 0;
    for (; at < idx.size() && p.count < kMaxTensors; ++at) {
      const size_t i = idx[at];
      const int64_t n = w[i].layout.numel();
      if (n == 0) continue;
      p.w[p.count] = w[i].storage.template as<T>() + w[i].layout.offset;
      p.m[p.count] = m[i].storage.template as<T>() + m[i].layout.offset;
      p.v[p.count] = v[i].storage.template as<T>() + v[i].layout.offset;
      p.g[p.count] = g[i].storage.template as<T>() + g[i].layout.offset;
      p.n[p.count] = n;
      p.first_tile[p.count] = tiles;
      tiles += cuda::ceil_div(n, kTile);
      ++p.count;
    }
    if (p.count == 0) continue;
    p.first_tile[p.count] = tiles;
    KILN_CHECK(tiles <= 0x7fffffffLL, "adam_step: {} tiles exceed the grid limit", tiles);
    adam_kernel<T><<<static_cast<unsigned>(tiles), kThreads, 0, cuda::stream()>>>(p, s);
    KILN_CUDA_LAUNCHED("adam_step");
  }
}

}  // namespace

void Cuda::adam_step(const std::vector<M>& w, const std::vector<M>& m, const std::vector<M>& v, const std::vector<V>& g,
                     const fused::AdamHyper& h) {
  std::vector<size_t> f32, f64;
  for (size_t i = 0; i < w.size(); ++i) {
    for (const CudaStorage* st : {&w[i].storage, &m[i].storage, &v[i].storage}) cuda::check_device(*st, "adam_step");
    cuda::check_device(g[i].storage, "adam_step");
    if (w[i].dtype == DType::f32)
      f32.push_back(i);
    else if (w[i].dtype == DType::f64)
      f64.push_back(i);
    else
      fail("adam_step: f32/f64 only, got {} (parameter {})", w[i].dtype, i);
  }
  launch_adam<float>(f32, w, m, v, g, h);
  launch_adam<double>(f64, w, m, v, g, h);
}

}  // namespace kiln
