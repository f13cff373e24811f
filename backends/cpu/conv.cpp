// conv2d forward / backward-data / backward-weights through oneDNN's convolution primitives (f32).
//
// The tensors go to oneDNN as they lie: plain nchw activations and oihw (goihw for groups > 1)
// weights, so no reorder runs around the primitive (oneDNN picks its implementation for plain
// layouts, gemm-based im2col on this machine). Primitives and their memory objects are cached per
// thread and problem signature, like the matmul (backends/cpu/matmul.cpp): a repeated call costs a
// few set_data_handle calls and an execute. f64 (oneDNN has none) and any problem oneDNN declines
// return false: core/fused_conv.hpp then runs the composite (im2col + OpenBLAS dgemm).
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cpu/common.hpp"

#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln {

#ifdef KILN_HAVE_ONEDNN
namespace {

using dnnl::memory;
using Dims = memory::dims;
enum Kind : int64_t { kForward, kBackwardData, kBackwardWeights };

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  std::shared_ptr<dnnl::primitive> prim;  // null: oneDNN declined
  memory src, wei, bias, dst;             // (diff_ variants for the backward kinds)
};

struct ConvThread {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::unordered_map<std::vector<int64_t>, Entry, VecHash> cache;
};
ConvThread& thread_state() {
  thread_local ConvThread t;
  return t;
}

void sync_omp_threads() {
  const int n = num_threads();
  if (!omp_in_parallel() && omp_get_max_threads() != n) omp_set_num_threads(n);
}

// The problem: x [N, C, H, W], w [O, C/g, kh, kw], y [N, O, Ho, Wo].
struct Problem {
  Shape x, w, y;
  const Conv2dParams* p;
  bool bias;
  std::vector<int64_t> key(Kind k) const {
    std::vector<int64_t> v{k, bias};
    v.insert(v.end(), x.begin(), x.end());
    v.insert(v.end(), w.begin(), w.end());
    v.insert(v.end(), y.begin(), y.end());
    v.insert(v.end(), {p->stride.h, p->stride.w, p->padding.h, p->padding.w, p->dilation.h, p->dilation.w, p->groups});
    return v;
  }
  memory::desc src() const { return {Dims(x.begin(), x.end()), memory::data_type::f32, memory::format_tag::nchw}; }
  memory::desc dst() const { return {Dims(y.begin(), y.end()), memory::data_type::f32, memory::format_tag::nchw}; }
  memory::desc wei() const {
    if (p->groups == 1) return {Dims(w.begin(), w.end()), memory::data_type::f32, memory::format_tag::oihw};
    return {Dims{p->groups, w[0] / p->groups, w[1], w[2], w[3]}, memory::data_type::f32, memory::format_tag::goihw};
  }
  memory::desc bia() const { return {Dims{w[0]}, memory::data_type::f32, memory::format_tag::x}; }
  Dims strides() const { return {p->stride.h, p->stride.w}; }
  Dims dilates() const { return {p->dilation.h - 1, p->dilation.w - 1}; }  // oneDNN counts the gaps
  Dims pad() const { return {p->padding.h, p->padding.w}; }
  dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::engine& eng) const {
    const auto prop = dnnl::prop_kind::forward_training;
    const auto alg = dnnl::algorithm::convolution_direct;
    if (bias)
      return {dnnl::convolution_forward::desc(prop, alg, src(), wei(), bia(), dst(), strides(), dilates(), pad(), pad()), eng};
    return {dnnl::convolution_forward::desc(prop, alg, src(), wei(), dst(), strides(), dilates(), pad(), pad()), eng};
  }
};

Entry make_entry(const Problem& pr, Kind k, const dnnl::engine& eng) {
  Entry e;
  try {
    const auto fwd = pr.forward_pd(eng);
    const auto alg = dnnl::algorithm::convolution_direct;
    if (k == kForward) {
      e.prim = std::make_shared<dnnl::convolution_forward>(fwd);
    } else if (k == kBackwardData) {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(alg, pr.src(), pr.wei(), pr.dst(), pr.strides(), pr.dilates(), pr.pad(), pr.pad()), eng,
          fwd);
      e.prim = std::make_shared<dnnl::convolution_backward_data>(pd);
    } else {
      using BW = dnnl::convolution_backward_weights;
      const BW::primitive_desc pd =
          pr.bias ? BW::primitive_desc(BW::desc(alg, pr.src(), pr.wei(), pr.bia(), pr.dst(), pr.strides(), pr.dilates(), pr.pad(), pr.pad()),
                                       eng, fwd)
                  : BW::primitive_desc(BW::desc(alg, pr.src(), pr.wei(), pr.dst(), pr.strides(), pr.dilates(), pr.pad(), pr.pad()), eng, fwd);
      e.prim = std::make_shared<BW>(pd);
    }
    e.src = memory(pr.src(), eng, DNNL_MEMORY_NONE);
    e.wei = memory(pr.wei(), eng, DNNL_MEMORY_NONE);
    e.dst = memory(pr.dst(), eng, DNNL_MEMORY_NONE);
    if (pr.bias) e.bias = memory(pr.bia(), eng, DNNL_MEMORY_NONE);
  } catch (const dnnl::error&) {
    e.prim = nullptr;
  }
  return e;
}

// Runs kind k on the given buffers (src/wei/bias/dst in the forward's naming); false when declined.
bool run(const Problem& pr, Kind k, const float* src, const float* wei, const float* bias, const float* dst) {
  ConvThread& t = thread_state();
  std::vector<int64_t> key = pr.key(k);
  auto it = t.cache.find(key);
  if (it == t.cache.end()) {
    if (t.cache.size() > 256) t.cache.clear();
    it = t.cache.emplace(std::move(key), make_entry(pr, k, t.eng)).first;
  }
  Entry& e = it->second;
  if (!e.prim) return false;
  e.src.set_data_handle(const_cast<float*>(src));
  e.wei.set_data_handle(const_cast<float*>(wei));
  e.dst.set_data_handle(const_cast<float*>(dst));
  if (pr.bias) e.bias.set_data_handle(const_cast<float*>(bias));
  std::unordered_map<int, memory> args;
  if (k == kForward) {
    args = {{DNNL_ARG_SRC, e.src}, {DNNL_ARG_WEIGHTS, e.wei}, {DNNL_ARG_DST, e.dst}};
    if (pr.bias) args.emplace(DNNL_ARG_BIAS, e.bias);
  } else if (k == kBackwardData) {
    args = {{DNNL_ARG_DIFF_SRC, e.src}, {DNNL_ARG_WEIGHTS, e.wei}, {DNNL_ARG_DIFF_DST, e.dst}};
  } else {
    args = {{DNNL_ARG_SRC, e.src}, {DNNL_ARG_DIFF_WEIGHTS, e.wei}, {DNNL_ARG_DIFF_DST, e.dst}};
    if (pr.bias) args.emplace(DNNL_ARG_DIFF_BIAS, e.bias);
  }
  sync_omp_threads();
  e.prim->execute(t.stream, args);
  t.stream.wait();
  return true;
}

template <class T> const float* fp(const T& v) { return v.storage.template as<float>() + v.layout.offset; }

}  // namespace

bool Cpu::conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p) {
  if (x.dtype != DType::f32) return false;
  const Problem pr{x.layout.shape, w.layout.shape, y.layout.shape, &p, bias != nullptr};
  return run(pr, kForward, fp(x), fp(w), bias ? fp(*bias) : nullptr, fp(y));
}

bool Cpu::conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p) {
  if (dy.dtype != DType::f32) return false;
  const Problem pr{dx.layout.shape, w.layout.shape, dy.layout.shape, &p, false};
  return run(pr, kBackwardData, fp(dx), fp(w), nullptr, fp(dy));
}

bool Cpu::conv2d_backward_weight(M dw, M* db, V dy, V x, const Conv2dParams& p) {
  if (dy.dtype != DType::f32) return false;
  const Problem pr{x.layout.shape, dw.layout.shape, dy.layout.shape, &p, db != nullptr};
  return run(pr, kBackwardWeights, fp(x), fp(dw), db ? fp(*db) : nullptr, fp(dy));
}

#else  // no oneDNN: the composite (im2col + BLAS) runs

bool Cpu::conv2d_forward(M, V, V, const V*, const Conv2dParams&) { return false; }
bool Cpu::conv2d_backward_input(M, V, V, const Conv2dParams&) { return false; }
bool Cpu::conv2d_backward_weight(M, M*, V, V, const Conv2dParams&) { return false; }

#endif

}  // namespace kiln
