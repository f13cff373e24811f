// Pooling on the Cpu backend.
//  * max_pool2d: own loops, parallel over the N·C planes, f32 and f64. The autograd node needs
//    PyTorch's indices (h·W + w per plane, first maximum wins, NaN propagates) for backward and for
//    return_indices; oneDNN's max pooling keeps an opaque per-window workspace instead, and turning it
//    into those indices would cost another pass over the output, more than the loop itself.
//  * avg_pool2d: oneDNN's pooling primitives (avg_include_padding / avg_exclude_padding), plain nchw,
//    cached per thread and shape. oneDNN divides an include-padding window by kh·kw even where a
//    ceil_mode window overhangs the padding, PyTorch by the part inside input + padding: those
//    problems, and f64, are declined (core/fused_conv.hpp runs the composite).
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cpu/common.hpp"

#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln {
using namespace cpu;

namespace {

template <class T> const T* cptr(const Cpu::V& v) { return v.storage.as<T>() + v.layout.offset; }
template <class T> T* mptr(const Cpu::M& m) { return m.storage.as<T>() + m.layout.offset; }

template <class T> void max_pool_fwd(Cpu::M y, Cpu::M idx, Cpu::V x, const Pool2dParams& p) {
  const Shape& xs = x.layout.shape;
  const int64_t H = xs[2], W = xs[3], Ho = y.layout.shape[2], Wo = y.layout.shape[3], planes = xs[0] * xs[1];
  const T* xp = cptr<T>(x);
  T* yp = mptr<T>(y);
  int64_t* ip = mptr<int64_t>(idx);
  const int64_t work = std::max<int64_t>(1, Ho * Wo * p.kernel.h * p.kernel.w);
  parallel_for(planes, std::max<int64_t>(1, kGrainCheap / work), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl) {
      const T* xpl = xp + pl * H * W;
      for (int64_t oh = 0; oh < Ho; ++oh) {
        int64_t h0 = oh * p.stride.h - p.padding.h;
        const int64_t h1 = std::min(h0 + (p.kernel.h - 1) * p.dilation.h + 1, H);
        while (h0 < 0) h0 += p.dilation.h;
        for (int64_t ow = 0; ow < Wo; ++ow) {
          int64_t w0 = ow * p.stride.w - p.padding.w;
          const int64_t w1 = std::min(w0 + (p.kernel.w - 1) * p.dilation.w + 1, W);
          while (w0 < 0) w0 += p.dilation.w;
          int64_t arg = h0 * W + w0;
          T best = -std::numeric_limits<T>::infinity();
          for (int64_t ih = h0; ih < h1; ih += p.dilation.h)
            for (int64_t iw = w0; iw < w1; iw += p.dilation.w) {
              // PyTorch's rule (a NaN wins), branch-free: the comparisons are unpredictable
              const T v = xpl[ih * W + iw];
              const bool take = (v > best) | (v != v);  // NOLINT(misc-redundant-expression): v != v is isnan
              best = take ? v : best;
              arg = take ? ih * W + iw : arg;
            }
          yp[(pl * Ho + oh) * Wo + ow] = best;
          ip[(pl * Ho + oh) * Wo + ow] = arg;
        }
      }
    }
  });
}

template <class T> void max_pool_bwd(Cpu::M dx, Cpu::V dy, Cpu::V idx) {
  const Shape& xs = dx.layout.shape;
  const int64_t HW = xs[2] * xs[3], L = dy.layout.shape[2] * dy.layout.shape[3], planes = xs[0] * xs[1];
  const T* gp = cptr<T>(dy);
  const int64_t* ip = cptr<int64_t>(idx);
  T* dp = mptr<T>(dx);
  parallel_for(planes, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, L)), [&](int64_t lo, int64_t hi) {
    for (int64_t pl = lo; pl < hi; ++pl)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t k = ip[pl * L + l];
        KILN_CHECK(k >= 0 && k < HW, "max_pool2d_backward: index {} out of range [0, {})", k, HW);
        dp[pl * HW + k] += gp[pl * L + l];
      }
  });
}

#ifdef KILN_HAVE_ONEDNN
using dnnl::memory;
using Dims = memory::dims;

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};
struct PoolEntry {
  std::shared_ptr<dnnl::primitive> prim;  // null: declined
  memory src, dst;
};
struct PoolThread {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::unordered_map<std::vector<int64_t>, PoolEntry, VecHash> cache;
};

// The right padding that makes oneDNN's output size Ho (PyTorch pads ceil_mode's overhang implicitly).
int64_t pad_r(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p) { return std::max(p, (out - 1) * s + k - in - p); }

// avg pooling forward (backward = false) or backward on f32 nchw; false when declined.
bool avg_pool_dnnl(const Shape& xs, const Shape& ys, const Pool2dParams& p, bool backward, const float* src, const float* dst) {
  const int64_t rh = pad_r(xs[2], ys[2], p.kernel.h, p.stride.h, p.padding.h),
                rw = pad_r(xs[3], ys[3], p.kernel.w, p.stride.w, p.padding.w);
  if (p.count_include_pad && (rh > p.padding.h || rw > p.padding.w)) return false;
  thread_local PoolThread t;
  std::vector<int64_t> key{backward, p.count_include_pad, p.kernel.h, p.kernel.w, p.stride.h, p.stride.w, p.padding.h, p.padding.w, rh, rw};
  key.insert(key.end(), xs.begin(), xs.end());
  key.insert(key.end(), ys.begin(), ys.end());
  auto it = t.cache.find(key);
  if (it == t.cache.end()) {
    PoolEntry e;
    const memory::desc sd(Dims(xs.begin(), xs.end()), memory::data_type::f32, memory::format_tag::nchw);
    const memory::desc dd(Dims(ys.begin(), ys.end()), memory::data_type::f32, memory::format_tag::nchw);
    const auto alg = p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding : dnnl::algorithm::pooling_avg_exclude_padding;
    const Dims st{p.stride.h, p.stride.w}, k{p.kernel.h, p.kernel.w}, pl{p.padding.h, p.padding.w}, pr{rh, rw};
    try {
      const dnnl::pooling_forward::primitive_desc fwd(
          dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, sd, dd, st, k, pl, pr), t.eng);
      if (backward)
        e.prim = std::make_shared<dnnl::pooling_backward>(
            dnnl::pooling_backward::primitive_desc(dnnl::pooling_backward::desc(alg, sd, dd, st, k, pl, pr), t.eng, fwd));
      else
        e.prim = std::make_shared<dnnl::pooling_forward>(fwd);
      e.src = memory(sd, t.eng, DNNL_MEMORY_NONE);
      e.dst = memory(dd, t.eng, DNNL_MEMORY_NONE);
    } catch (const dnnl::error&) {
      e.prim = nullptr;
    }
    if (t.cache.size() > 256) t.cache.clear();
    it = t.cache.emplace(std::move(key), std::move(e)).first;
  }
  PoolEntry& e = it->second;
  if (!e.prim) return false;
  e.src.set_data_handle(const_cast<float*>(src));
  e.dst.set_data_handle(const_cast<float*>(dst));
  const int n = num_threads();
  if (!omp_in_parallel() && omp_get_max_threads() != n) omp_set_num_threads(n);
  if (backward)
    e.prim->execute(t.stream, {{DNNL_ARG_DIFF_SRC, e.src}, {DNNL_ARG_DIFF_DST, e.dst}});
  else
    e.prim->execute(t.stream, {{DNNL_ARG_SRC, e.src}, {DNNL_ARG_DST, e.dst}});
  t.stream.wait();
  return true;
}
#endif

}  // namespace

bool Cpu::max_pool2d_forward(M y, M idx, V x, const Pool2dParams& p) {
  if (x.dtype == DType::f32)
    max_pool_fwd<float>(y, idx, x, p);
  else if (x.dtype == DType::f64)
    max_pool_fwd<double>(y, idx, x, p);
  else
    return false;
  return true;
}

bool Cpu::max_pool2d_backward(M dx, V dy, V idx, const Pool2dParams&) {
  if (dy.dtype == DType::f32)
    max_pool_bwd<float>(dx, dy, idx);
  else if (dy.dtype == DType::f64)
    max_pool_bwd<double>(dx, dy, idx);
  else
    return false;
  return true;
}

bool Cpu::avg_pool2d_forward(M y, V x, const Pool2dParams& p) {
#ifdef KILN_HAVE_ONEDNN
  if (x.dtype == DType::f32) return avg_pool_dnnl(x.layout.shape, y.layout.shape, p, false, cptr<float>(x), mptr<float>(y));
#endif
  (void)y, (void)x, (void)p;
  return false;
}

bool Cpu::avg_pool2d_backward(M dx, V dy, const Pool2dParams& p) {
#ifdef KILN_HAVE_ONEDNN
  if (dy.dtype == DType::f32) return avg_pool_dnnl(dx.layout.shape, dy.layout.shape, p, true, mptr<float>(dx), cptr<float>(dy));
#endif
  (void)dx, (void)dy, (void)p;
  return false;
}

}  // namespace kiln
